// pg_backend.h: the "postgresql" backend (backend.h): a store in a schema of a
// PostgreSQL database, shared by every process on every machine that opens it,
// reached through libpq.
//
// Thread safety: as backend.h.
//
// Where each job is done:
// - percolite/pg_target.h, pg_target.cc: reading a postgresql:// target
//   (ParsePgTarget), and HidePasswords, the one rule that keeps a password
//   out of everything shown.
// - pg_connection.h/.cc: libpq: connecting, statements with binary
//   parameters and results (PgExec), and the pool of connections reads
//   borrow, with their retries when the server goes away (PgPool).
// - pg_statements.h/.cc: the SQL: every statement, written once, built once
//   per handle for its schema (PgStatements).
// - pg_schema.cc: finding, checking and creating the store's tables.
// - pg_backend.cc: the handle: opening and closing, snapshots and their
//   reads, the observed columns and notifications outside snapshots.
// - pg_commit.cc: the writer thread: batches of commits, validated and
//   written in one server transaction, and settled when the connection
//   drops during one.
// - pg_collect.cc: collection of old versions: this handle's horizon in the
//   handles table, and the deletions after each batch.
// - pg_watch.cc: WatchForWork and SignalWaiting (LISTEN/NOTIFY, or polling).
//
// How it meets the contract of backend.h (Percolator's model: versions in
// the table, timestamps from one counter, no server transaction held open)
// - Tables, in the store's schema (`schema` in the target, default
//   "percolite"): cells(key, ts, state, value, purged_ts) with one row per
//   version of a cell, notify(nkey, stamp), acks(key, ts), clock(ts) holding
//   the timestamp counter, and meta(name, value) holding the store's format
//   and the observed columns. Keys of any length (see pg_statements.h for
//   how they are indexed). They are created on the first open (create
//   true) and checked on every open: a schema whose tables are not a
//   percolite store of this format is refused, never reinterpreted.
// - A snapshot is its start_ts (the counter, read once): every read is one
//   statement that picks, per key, the newest version with ts <= start_ts
//   not purged by then. It holds no connection and no server transaction,
//   so open snapshots cost the server nothing; reads borrow a connection of
//   a small pool (kPoolSize) for one statement. Gets in ascending key order
//   read ahead (pg_backend.cc, PgSnapshot::ReadAhead).
// - Commits go to one writer thread per backend, which takes every commit
//   waiting (up to options.max_batch) into one server transaction: it locks
//   the counter row (so the writers of every process take turns, and commit
//   order and timestamp order agree across machines), reads what the batch's
//   validation needs in three statements, validates and applies each commit
//   in order with the rules of commit_rules.h, writes the batch in a few
//   statements, advances the counter and commits: two round trips in all
//   (libpq's pipeline mode), one up to the reads, one from the writes on. With SyncMode::kFull the
//   server's synchronous_commit is on: a commit is reported, and visible to
//   any reader, only once the server has flushed it. kMeta and kNone turn it
//   off (the server may lose the last commits in a crash, never half of one).
//   When a batch fails on the server, its commits are tried again one by one,
//   so one bad commit fails alone.
// - A purge marks the versions it removes with its commit_ts (purged_ts):
//   snapshots from before it still read them.
// - Collection: a commit that supersedes a version, or writes a tombstone,
//   lists it in the garbage table. Each handle publishes, in the handles
//   table, the oldest start_ts its snapshots have or may get (with every
//   batch, and each second while idle); after a batch when no commit waits
//   (at least every kCollectInterval under load) the writer deletes
//   the versions superseded at or before the least horizon of the handles
//   seen in the last kHandleLeaseSeconds, and tombstones and purged versions
//   from before it. A process stopped for longer than that with a snapshot
//   open could find versions it needs gone.
// - WatchForWork: LISTEN on the store's channel; every batch NOTIFYs it when
//   it commits, and SignalWaiting sends a waiter signal on it. With
//   poll_interval in the target (servers that speak PostgreSQL's protocol
//   without LISTEN/NOTIFY), nothing is sent or listened to: the watch says
//   "committed" every poll_interval seconds, and SignalWaiting returns false.
//
// - A dropped connection or a server restart: reads retry on a new
//   connection for up to the target's reconnect_timeout. Each batch writes a random
//   commit token into this handle's row of the handles table, in its own
//   transaction; when the connection drops during a batch, the writer
//   reconnects and reads the token back: the batch committed (its callers
//   are told so) or it did not (it runs again, validated anew). No caller
//   is told a guess; a server gone for longer makes the backend refuse
//   every call (kStorage). The token is read under the counter row's lock,
//   after ending the old session, so a COMMIT still in flight on the server
//   is over before it is read. A batch the connection drops over three
//   times is reported not committed (each try was settled).
// - Collection never removes what a commit still waiting in the queue needs:
//   its start_ts holds back this handle's horizon until it is decided.
//
// Not yet: a notification's pending state is read as
// of now, not as of the snapshot (NotificationStamp reports a notification
// only when its stamp is <= start_ts).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "handle_state.h"
#include "percolite/backend.h"
#include "percolite/mutex.h"
#include "percolite/pg_target.h"
#include "percolite/status.h"
#include "pg_connection.h"
#include "pg_statements.h"
#include "sink_slot.h"

namespace percolite {

class PgBackend final : public Backend, public std::enable_shared_from_this<PgBackend> {
 public:
  // Connections for reads (each borrowed for one statement).
  static constexpr size_t kPoolSize = 4;
  // A handle not seen for this long (its process died, or is stopped) no
  // longer holds back the collection of old versions.
  static constexpr int kHandleLeaseSeconds = 60;
  static_assert(kHandleLeaseSeconds >= PgTarget::kMaxReconnectTimeout,
                "a handle reconnecting must still hold back the collection");
  // While commits keep coming, the writer collects old versions at most this often.
  static constexpr std::chrono::milliseconds kCollectInterval{500};

  static std::shared_ptr<PgBackend> Open(const std::string& target, const BackendOptions& options);
  ~PgBackend() override;
  PgBackend(const PgBackend&) = delete;
  PgBackend& operator=(const PgBackend&) = delete;

  const BackendCapabilities& capabilities() const override;
  const std::string& location() const override { return target_.display; }
  const BackendOptions& options() const override { return options_; }

  void CheckUsable() const override;
  bool ForkedAway() const override;

  std::unique_ptr<Snapshot> BeginSnapshot() override EXCLUDES(snapshots_mu_);
  void CommitAsync(uint64_t start_ts, std::vector<Mutation> mutations, CommitExtras extras,
                   CommitCallback done) override EXCLUDES(mu_, snapshots_mu_);

  std::vector<ObservedColumn> ObservedColumns() override;
  void SetObservedColumns(const std::vector<ObservedColumn>& columns) override;

  uint64_t PendingNotifications() override;
  bool ScanNotifications(std::string_view after, size_t limit,
                         std::vector<Notification>* out) override;
  std::map<std::pair<std::string, std::string>, uint64_t> CountPendingByColumn() override;

  void SetNotificationSink(NotificationSink* sink) override;
  void ClearNotificationSink(NotificationSink* sink) override;
  std::unique_ptr<WorkWatch> WatchForWork() override;
  bool SignalWaiting() override;

  BackendStats Stats() const override;
  StandbyWaits WaitingForStandbys() override;
  double NowUnix() const override { return Backend::NowUnix() + clock_offset_.load(); }
  std::vector<std::string> VerifyStructure() override;
  std::optional<std::string> DamagedMark() override { return std::nullopt; }

  void ReleaseHandle() override EXCLUDES(mu_) { Close(); }
  void Close() override EXCLUDES(mu_);

  // For this handle's snapshots and watches.
  const PgTarget& target() const { return target_; }
  const PgStatements& sql() const { return sql_; }
  // One statement on a connection of the pool (PgPool::Query).
  PgResult Query(const std::string& sql, const PgParams& params, const char* what) {
    return pool_.Query(sql, params, what);
  }
  // A new connection of its own (kStorage naming the server on failure).
  PGconn* Connect() const { return PgConnect(target_, options_.sync); }
  // Called by a snapshot when it is released.
  void ForgetSnapshot(uint64_t start_ts) EXCLUDES(snapshots_mu_);

  // A commit waiting for the writer thread.
  struct Request {
    uint64_t start_ts;
    std::vector<Mutation> mutations;
    CommitExtras extras;
    CommitCallback done;
  };

 private:
  // What settling a batch cut off by a lost connection found.
  enum class Settled { kCommitted, kNotCommitted, kUnknown };

  PgBackend(PgTarget target, const BackendOptions& options);
  void Fail(const std::string& why);

  // pg_schema.cc: checks that the schema holds a store of this format;
  // creates it when there is none and `create`. Throws kInvalidArgument
  // naming the problem.
  void CreateOrCheckSchema(PGconn* conn, bool create);

  // pg_commit.cc.
  void WriterLoop() EXCLUDES(mu_, snapshots_mu_);
  // Waits up to a second for commits, and moves up to options.max_batch of
  // them into *batch (empty when none came). False once Close stopped the
  // writer and every commit was taken.
  bool NextBatch(std::vector<Request>* batch) EXCLUDES(mu_);
  // Commits `batch`, or each of its commits alone when the server refused
  // it whole; fills results (one per request). False when nothing of it
  // could be committed (the results then say why).
  bool CommitOrSplit(std::vector<Request>& batch, std::vector<CommitResult>* results,
                     std::vector<Notification>* written) EXCLUDES(snapshots_mu_);
  // Commits `batch` in one server transaction; fills results (one per request)
  // and the notifications written. False when the server refused the batch
  // (*error says why): nothing of it was applied.
  bool CommitBatch(PGconn* conn, std::vector<Request>& batch, const std::string& token,
                   std::vector<CommitResult>* results, std::vector<Notification>* written,
                   std::string* error) EXCLUDES(snapshots_mu_);
  // CommitBatch on the writer's connection, settled: when the connection
  // drops, reconnects and reads back the batch's token to learn whether it
  // committed, and runs it again when it did not. False when the server
  // refused it, or did not come back (the backend then refuses every call).
  bool CommitSettled(std::vector<Request>& batch, std::vector<CommitResult>* results,
                     std::vector<Notification>* written, std::string* error)
      EXCLUDES(snapshots_mu_);
  // A server session, told apart from any other session of any server: its
  // process id, and when that process started (a pid is reused after a
  // restart, and a promoted standby has pids of its own).
  struct Session {
    int pid = 0;
    std::string started;
  };
  // After the writer's connection dropped during the batch of `token` (sent
  // by the server session `old`): whether that batch committed. kUnknown
  // when the server did not come back (the handle then failed).
  Settled SettleLostBatch(const std::string& token, const Session& old, const std::string& error);
  // Connects the writer again (the old connection was lost to `cause`),
  // trying for the target's reconnect_timeout. False when it could not.
  bool ReconnectWriter(const std::string& cause);
  // Reads the server's clock on the writer's connection: its offset from
  // this machine's (NowUnix), from the midpoint of the round trip. Every
  // connection of the writer, and every kClockEverySeconds after.
  void MeasureClock();
  // Reads how the server replicates (BackendStats::replication) on the
  // writer's connection.
  void ReadReplication();
  static constexpr double kClockEverySeconds = 10;
  // Makes `conn` the writer's connection, and learns its session; a
  // non-empty `cause` counts it as a reconnection (Stats).
  void AdoptWriter(PGconn* conn, const std::string& cause = "");

  // pg_collect.cc (see the header comment).
  // The oldest start_ts a snapshot of this handle has or may get, given the
  // counter read at `clock`; never moves back.
  uint64_t Horizon(uint64_t clock) EXCLUDES(snapshots_mu_);
  // Records this handle's horizon in the handles table (on `conn`).
  // `token`: the batch's commit token (nullptr outside a batch: kept as it is).
  void Publish(PGconn* conn, uint64_t clock, const std::string* token) EXCLUDES(snapshots_mu_);
  // The parameters of publish (publish_with_token with a token).
  PgParams PublishParams(uint64_t clock, const std::string* token) EXCLUDES(snapshots_mu_);
  // Publish on the writer's connection, outside a batch.
  void Heartbeat() EXCLUDES(snapshots_mu_);
  // Whether to collect after this batch: when no commit waits, else at
  // most every kCollectInterval.
  bool CollectDue() EXCLUDES(mu_);
  void Collect(PGconn* conn);
  void ForgetPending(uint64_t start_ts) EXCLUDES(snapshots_mu_);

  const PgTarget target_;
  const BackendOptions options_;
  HandleState state_;       // forked away, closed, failed (CheckUsable)
  const PgStatements sql_;  // built once, in the constructor
  PgPool pool_;

  Mutex mu_;
  CondVar queued_;  // a commit was queued, or Close began
  std::deque<Request> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread writer_;
  // The writer thread's own connection: only that thread uses it, and Open
  // and Close before it starts and after it ends.
  PGconn* writer_conn_ = nullptr;
  Session writer_session_;                              // of writer_conn_
  std::chrono::steady_clock::time_point last_collect_;  // the writer thread's

  SinkSlot sink_;

  std::atomic<uint64_t> commits_{0}, conflicts_{0}, batches_{0}, tombstones_collected_{0};
  // The writer's connection as Stats shows it (server, reconnections,
  // failovers); written by the writer thread, read by any.
  mutable Mutex link_mu_;
  BackendStats link_ GUARDED_BY(link_mu_);
  std::atomic<double> clock_offset_{0};  // the server's clock minus this machine's
  std::atomic<double> batch_since_{0};   // when the writer's batch began (unix; 0: none)
  std::chrono::steady_clock::time_point last_clock_;  // the writer thread's

  std::string handle_id_;  // random: this handle's row in the handles table
  Mutex snapshots_mu_;
  std::multiset<uint64_t> snapshots_ GUARDED_BY(snapshots_mu_);  // open snapshots' start_ts
  int beginning_ GUARDED_BY(snapshots_mu_) = 0;                  // snapshots being begun
  // start_ts of commits submitted and not yet decided (their snapshots are
  // released by then, and their validation still needs what they saw).
  std::multiset<uint64_t> pending_starts_ GUARDED_BY(snapshots_mu_);
  uint64_t horizon_ GUARDED_BY(snapshots_mu_) = 0;  // the last one published
};

}  // namespace percolite
