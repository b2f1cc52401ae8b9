// pg_commit.cc: the writer thread of a postgresql handle (pg_backend.h).
// It takes the commits waiting into one batch, validates and writes them in
// one server transaction under the counter row's lock, and, when the
// connection drops during a batch, settles whether it committed before
// anyone is told.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "commit_rules.h"
#include "pg_backend.h"

namespace percolite {
namespace {

using Request = PgBackend::Request;

// The tables as commit_rules.h uses them: what the batch read before
// validating, overlaid with what its earlier commits wrote; writes are
// buffered and sent once the batch is decided.
class PgTables {
 public:
  std::optional<uint64_t> CellWrittenTs(std::string_view key) {
    auto it = written_.find(std::string(key));
    if (it != written_.end()) return it->second;
    return std::nullopt;
  }
  std::optional<uint64_t> AckTs(std::string_view cell_key) {
    auto it = acks_.find(std::string(cell_key));
    if (it == acks_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<uint64_t> NotificationStampAt(std::string_view key) {
    auto it = notify_.find(std::string(key));
    if (it == notify_.end()) return std::nullopt;
    return it->second;
  }
  void PutCell(std::string_view key, uint64_t commit_ts, bool is_delete, std::string_view value) {
    std::string k(key);
    // A version that supersedes another, or a tombstone: collectable later.
    auto [it, fresh] = written_.try_emplace(k, commit_ts);
    if (!fresh || is_delete) {
      garbage_keys.push_back(k);
      garbage_ts.push_back(commit_ts);
    }
    it->second = commit_ts;
    cell_keys.push_back(std::move(k));
    cell_ts.push_back(commit_ts);
    cell_states.push_back(is_delete ? kPgDeleted : kPgLive);
    cell_values.emplace_back(is_delete ? std::string_view() : value);
  }
  // A joinable write joins the open record of `key` in this batch when it
  // fits: the batch is one server transaction, so one row for its commits.
  void PutStamped(std::string_view key, std::string_view stamped_key, uint64_t commit_ts,
                  std::string_view value, bool join) {
    auto open = open_records_.find(key);
    if (open != open_records_.end()) {
      if (join && JoinPacked(&cell_values[open->second], value)) return;
      open_records_.erase(open);
    }
    if (join) open_records_.emplace(key, cell_values.size());
    PutCell(stamped_key, commit_ts, false, value);
  }
  void PurgeCell(std::string_view key) {
    written_.erase(std::string(key));
    purge_keys.emplace_back(key);
    purge_ts.push_back(ts_);
  }
  void PurgeRange(std::string_view from, std::string_view end) {
    for (auto it = written_.lower_bound(std::string(from));
         it != written_.end() && it->first < end;) {
      it = written_.erase(it);
    }
    ranges.push_back({std::string(from), std::string(end), ts_});
  }
  void PutNotification(std::string_view key, uint64_t stamp) { notify_[std::string(key)] = stamp; }
  void RemoveNotification(std::string_view key) { notify_[std::string(key)] = std::nullopt; }
  void PutAck(std::string_view cell_key, uint64_t commit_ts) {
    acks_[std::string(cell_key)] = commit_ts;
    acks_changed_.insert(std::string(cell_key));
  }

  // What the batch read: a cell's newest ts, an ack, a notification's stamp.
  void LoadCell(std::string key, uint64_t ts) { written_[std::move(key)] = ts; }
  void LoadAck(std::string key, uint64_t ts) { acks_[std::move(key)] = ts; }
  void LoadNotification(std::string key, uint64_t stamp) { notify_[std::move(key)] = stamp; }
  // Notification keys read or written, and their final state.
  const std::map<std::string, std::optional<uint64_t>>& notifications() const { return notify_; }
  std::vector<std::string> changed_acks() const {
    return {acks_changed_.begin(), acks_changed_.end()};
  }
  uint64_t ack(const std::string& key) const { return acks_.at(key); }

  void set_ts(uint64_t ts) { ts_ = ts; }

  // Buffered writes.
  std::vector<std::string> garbage_keys;
  std::vector<uint64_t> garbage_ts;
  std::vector<std::string> cell_keys;
  std::vector<uint64_t> cell_ts;
  std::vector<uint64_t> cell_states;
  std::vector<std::string> cell_values;
  std::vector<std::string> purge_keys;
  std::vector<uint64_t> purge_ts;
  struct Range {
    std::string from, end;
    uint64_t ts;
  };
  std::vector<Range> ranges;

 private:
  uint64_t ts_ = 0;
  std::map<std::string, uint64_t, std::less<>> written_;
  std::map<std::string, uint64_t> acks_;
  std::set<std::string> acks_changed_;
  std::map<std::string, std::optional<uint64_t>> notify_;
  // Joinable key -> index in cell_values of the record later commits join.
  std::map<std::string, size_t, std::less<>> open_records_;
};

// The statements of one batch's server transaction, on the writer's
// connection, sent in two round trips: the lock and what validating needs,
// then every write and COMMIT.
class BatchPipeline {
 public:
  BatchPipeline(PGconn* conn, const PgStatements& sql, const PgTarget& target)
      : sql(sql), pipe_(conn, target) {}
  void Send(const std::string& statement, const PgParams& params = PgParams()) {
    pipe_.Send(statement, params, "committing");
  }
  std::vector<PgResult> Run() { return pipe_.Run(); }

  const PgStatements& sql;

 private:
  PgPipeline pipe_;
};

// The counter, from the result of lock_clock_and_observed (which locks the
// counter row, so the writers of every process take turns, and commit order
// and timestamp order agree across machines), and the observed columns in
// *strong.
uint64_t LockedClock(const PgResult& head, const std::string& schema, StrongColumns* strong) {
  if (head.rows() != 1) {
    throw Error(ErrorCode::kCorruption,
                "the store in schema " + schema + " has no counter or no observed-columns record");
  }
  if (!strong->Load(head.bytes(0, 1))) {
    throw Error(ErrorCode::kCorruption, "the store's observed columns cannot be read");
  }
  return head.int8(0, 0);
}

// Where the results of the reads validation needs are among the first
// round trip's (-1: not sent).
struct ValidationReads {
  int versions = -1, acks = -1, notifications = -1;
};

// Queues what validating the batch needs, in up to three statements: the
// newest version of each key it writes, and the acks and notifications of
// the notifications its commits process. `sent`: statements queued before.
ValidationReads SendReads(BatchPipeline& tx, const std::vector<Request>& batch, int sent) {
  std::vector<std::string> keys, triggers, trigger_notes;
  std::string row;
  for (const Request& r : batch) {
    for (const Mutation& m : r.mutations) {
      if (!m.stamped && !m.purge) keys.push_back(m.key);
    }
    if (r.extras.trigger) {
      triggers.push_back(*r.extras.trigger);
      if (RowOfCellKey(*r.extras.trigger, &row)) {
        trigger_notes.push_back(NotificationKey(RowHash(row), *r.extras.trigger));
      }
    }
  }
  ValidationReads at;
  if (!keys.empty()) {
    PgParams p;
    p.ByteaArray(keys);
    tx.Send(tx.sql.newest_versions, p);
    at.versions = sent++;
  }
  if (triggers.empty()) return at;
  PgParams p;
  p.ByteaArray(triggers);
  tx.Send(tx.sql.read_acks, p);
  at.acks = sent++;
  PgParams q;
  q.ByteaArray(trigger_notes);
  tx.Send(tx.sql.read_notifications, q);
  at.notifications = sent++;
  return at;
}

void LoadReads(const std::vector<PgResult>& results, const ValidationReads& at, PgTables* tables) {
  if (at.versions >= 0) {
    const PgResult& found = results[at.versions];
    for (int i = 0; i < found.rows(); ++i) {
      tables->LoadCell(std::string(found.bytes(i, 0)), found.int8(i, 1));
    }
  }
  if (at.acks >= 0) {
    const PgResult& acks = results[at.acks];
    for (int i = 0; i < acks.rows(); ++i) {
      tables->LoadAck(std::string(acks.bytes(i, 0)), acks.int8(i, 1));
    }
  }
  if (at.notifications >= 0) {
    const PgResult& notes = results[at.notifications];
    for (int i = 0; i < notes.rows(); ++i) {
      tables->LoadNotification(std::string(notes.bytes(i, 0)), notes.int8(i, 1));
    }
  }
}

// Validates and applies each commit of the batch in order (commit_rules.h),
// numbering those that pass from `ts` + 1; returns the last number given.
uint64_t ValidateAndApply(const std::vector<Request>& batch, const StrongColumns& strong,
                          uint64_t ts, PgTables* tables, std::vector<CommitResult>* results,
                          std::vector<Notification>* notes) {
  for (const Request& r : batch) {
    const bool has_extras = r.extras.trigger || !r.extras.weak_notifications.empty();
    const CommitExtras* extras = has_extras ? &r.extras : nullptr;
    tables->set_ts(ts + 1);
    CommitResult result;
    result.status = ValidateCommit(*tables, r.start_ts, r.mutations, extras);
    if (result.status.ok()) {
      result.commit_ts = ++ts;
      ApplyCommit(*tables, strong, r.start_ts, ts, r.mutations, extras, notes);
    }
    results->push_back(result);
  }
  return ts;
}

// Writes the batch's versions, then its purges, each over the versions
// written before it (earlier batches, and earlier commits of this one;
// never its own commit's or a later one's writes).
void WriteVersions(BatchPipeline& tx, const PgTables& tables) {
  if (!tables.cell_keys.empty()) {
    PgParams p;
    p.ByteaArray(tables.cell_keys)
        .Int8Array(tables.cell_ts)
        .Int8Array(tables.cell_states)
        .ByteaArray(tables.cell_values);
    tx.Send(tx.sql.insert_cells, p);
  }
  if (!tables.purge_keys.empty()) {
    PgParams p;
    p.ByteaArray(tables.purge_keys).Int8Array(tables.purge_ts);
    tx.Send(tx.sql.purge_keys, p);
  }
  for (const PgTables::Range& range : tables.ranges) {
    PgParams p;
    p.Bytes(range.from).Bytes(range.end).Int8(range.ts);
    tx.Send(tx.sql.purge_range, p);
  }
}

// Writes the notifications the batch removed or wrote, its acks, and the
// versions it made collectable.
void WriteBookkeeping(BatchPipeline& tx, const PgTables& tables) {
  std::vector<std::string> put_keys, removed;
  std::vector<uint64_t> put_stamps;
  for (const auto& [key, stamp] : tables.notifications()) {
    if (stamp) {
      put_keys.push_back(key);
      put_stamps.push_back(*stamp);
    } else {
      removed.push_back(key);
    }
  }
  if (!removed.empty()) {
    PgParams p;
    p.ByteaArray(removed);
    tx.Send(tx.sql.delete_notifications, p);
  }
  if (!put_keys.empty()) {
    // Loaded ones the batch left alone are written back as they were.
    PgParams p;
    p.ByteaArray(put_keys).Int8Array(put_stamps);
    tx.Send(tx.sql.upsert_notifications, p);
  }
  const std::vector<std::string> acks = tables.changed_acks();
  if (!acks.empty()) {
    std::vector<uint64_t> ack_ts;
    for (const std::string& key : acks) ack_ts.push_back(tables.ack(key));
    PgParams p;
    p.ByteaArray(acks).Int8Array(ack_ts);
    tx.Send(tx.sql.upsert_acks, p);
  }
  if (!tables.garbage_keys.empty()) {
    PgParams p;
    p.ByteaArray(tables.garbage_keys).Int8Array(tables.garbage_ts);
    tx.Send(tx.sql.insert_garbage, p);
  }
}

// A random token that names one try of one batch.
std::string NewToken() {
  std::string token;
  std::random_device random;
  for (int i = 0; i < 2; ++i) AppendUint64BE(&token, (uint64_t{random()} << 32) | random());
  return token;
}

}  // namespace

void PgBackend::CommitAsync(uint64_t start_ts, std::vector<Mutation> mutations, CommitExtras extras,
                            CommitCallback done) {
  CheckUsable();
  {
    // Its start_ts holds back collection until it is decided, as an open
    // snapshot would: a tombstone its validation needs stays.
    MutexLock lock(&snapshots_mu_);
    pending_starts_.insert(start_ts);
  }
  bool queued = false;
  {
    MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(Request{start_ts, std::move(mutations), std::move(extras), std::move(done)});
      queued = true;
    }
  }
  if (!queued) {
    ForgetPending(start_ts);
    throw Error(ErrorCode::kClosed, "committing: the postgresql store is closed");
  }
  queued_.Signal();
}

bool PgBackend::NextBatch(std::vector<Request>* batch) {
  batch->clear();
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!stopping_ && queue_.empty()) {
    if (!queued_.WaitUntil(&mu_, deadline)) break;
  }
  if (queue_.empty()) return !stopping_;
  while (!queue_.empty() && batch->size() < std::max<size_t>(options_.max_batch, 1)) {
    batch->push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return true;
}

void PgBackend::WriterLoop() {
  std::vector<Request> batch;
  while (NextBatch(&batch)) {
    if (std::chrono::steady_clock::now() - last_clock_ >
        std::chrono::duration<double>(kClockEverySeconds)) {
      try {
        MeasureClock();
      } catch (const Error&) {
        // Measured again next time round.
      }
    }
    if (batch.empty()) {
      // Idle: tell the other handles this one lives, with its oldest snapshot.
      Heartbeat();
      continue;
    }
    std::vector<CommitResult> results;
    std::vector<Notification> written;
    batch_since_.store(Backend::NowUnix());
    const bool ok = CommitOrSplit(batch, &results, &written);
    batch_since_.store(0);
    sink_.Offer(written);
    if (ok && CollectDue()) {
      try {
        Collect(writer_conn_);
      } catch (const Error&) {
        // Collecting waits for the next batch; the commits stand.
      }
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      if (results[i].status.ok()) commits_.fetch_add(1);
      if (results[i].status.code() == ErrorCode::kConflict) conflicts_.fetch_add(1);
      batch[i].done(results[i]);
      ForgetPending(batch[i].start_ts);
    }
  }
}

bool PgBackend::CommitOrSplit(std::vector<Request>& batch, std::vector<CommitResult>* results,
                              std::vector<Notification>* written) {
  std::string error = state_.failure();
  bool ok = false;
  if (error.empty()) {
    ok = CommitSettled(batch, results, written, &error);
    if (!ok && batch.size() > 1 && PQstatus(writer_conn_) == CONNECTION_OK) {
      // One commit may have made the server refuse the batch: try each alone.
      for (Request& request : batch) {
        std::vector<Request> one;
        one.push_back(std::move(request));
        std::vector<CommitResult> result;
        std::vector<Notification> notes;
        std::string why;
        if (CommitSettled(one, &result, &notes, &why)) {
          written->insert(written->end(), notes.begin(), notes.end());
          results->push_back(result[0]);
        } else {
          results->push_back(CommitResult{Status::Make(ErrorCode::kStorage, why), 0});
        }
        request = std::move(one[0]);
      }
      ok = true;
    }
  }
  if (!ok) results->assign(batch.size(), CommitResult{Status::Make(ErrorCode::kStorage, error), 0});
  return ok;
}

bool PgBackend::CommitSettled(std::vector<Request>& batch, std::vector<CommitResult>* results,
                              std::vector<Notification>* written, std::string* error) {
  // A batch that the server drops the connection over every time (too large
  // a message, say) is given up after a few tries: its callers are told it
  // did not commit (it did not: each try was settled), and a batch of
  // several is then tried one commit at a time.
  constexpr int kMaxDrops = 3;
  for (int drops = 0;; ++drops) {
    if (drops == kMaxDrops) {
      *error = "postgresql (" + target_.display + "): the connection dropped " +
               std::to_string(kMaxDrops) + " times during this commit's batch (last: " + *error +
               "); it was not applied";
      break;
    }
    if (state_.failed()) {
      *error = state_.failure();
      break;
    }
    const std::string token = NewToken();
    const Session old = writer_session_;
    if (CommitBatch(writer_conn_, batch, token, results, written, error)) return true;
    // Refused by the server: nothing of it applied.
    if (PQstatus(writer_conn_) == CONNECTION_OK) break;
    const Settled settled = SettleLostBatch(token, old, *error);
    if (settled == Settled::kCommitted) {
      batches_.fetch_add(1);
      return true;  // the results computed for it stand
    }
    if (settled == Settled::kUnknown) break;
    // Not committed: run the batch again, validated anew.
  }
  results->clear();
  written->clear();
  return false;
}

PgBackend::Settled PgBackend::SettleLostBatch(const std::string& token, const Session& old,
                                              const std::string& error) {
  // The connection dropped somewhere in the batch, perhaps during COMMIT.
  // Settle what happened before anyone is told: reconnect, and read this
  // handle's token. The old session may still be alive on the server,
  // holding the counter row's lock (it takes it first); it is ended, and
  // the token read under that lock, so its commit is over either way. Only
  // that session is ended: after a failover the server reached is another
  // one, where the old pid may be an unrelated session's.
  constexpr const char* kSettling = "settling a commit cut off by a lost connection";
  for (;;) {
    if (!ReconnectWriter(error)) {
      char within[32];
      std::snprintf(within, sizeof within, "%g s", target_.reconnect_timeout);
      Fail("postgresql (" + target_.display + "): the connection was lost (" + error +
           ") and the server did not come back within " + within +
           " (reconnect_timeout); whether the last commits were applied is unknown: open the store "
           "again");
      return Settled::kUnknown;
    }
    try {
      PgParams session;
      session.Int8(static_cast<uint64_t>(old.pid)).Bytes(old.started);
      PgExec(writer_conn_, sql_.end_session, session, "ending the session a lost connection left",
             target_);
      PgExec(writer_conn_, "BEGIN", kSettling, target_);
      PgExec(writer_conn_, sql_.lock_clock, kSettling, target_);
      PgParams id;
      id.Bytes(handle_id_);
      PgResult r = PgExec(writer_conn_, sql_.read_token, id, kSettling, target_);
      PgExec(writer_conn_, "COMMIT", kSettling, target_);
      const bool committed = r.rows() > 0 && !r.null(0, 0) && r.bytes(0, 0) == token;
      return committed ? Settled::kCommitted : Settled::kNotCommitted;
    } catch (const Error&) {
      if (PQstatus(writer_conn_) == CONNECTION_OK) PgRollback(writer_conn_);
      // Lost again, or refused: reconnect and read the same token again.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

bool PgBackend::ReconnectWriter(const std::string& cause) {
  const auto deadline = target_.ReconnectDeadline();
  std::chrono::milliseconds pause(10);
  for (;;) {
    try {
      AdoptWriter(Connect(), cause);
      return true;
    } catch (const Error&) {
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
}

namespace {

// `message` as one line, for status: without the "postgresql (<target>): "
// every error begins with (status shows the store already), libpq's
// newlines and tabs as single spaces.
std::string OneLine(const std::string& message, const std::string& display) {
  const std::string prefix = "postgresql (" + display + "): ";
  const size_t from = message.rfind(prefix, 0) == 0 ? prefix.size() : 0;
  std::string line;
  for (size_t i = from; i < message.size(); ++i) {
    const bool space = message[i] == ' ' || message[i] == '\n' || message[i] == '\t';
    if (!space) {
      line += message[i];
    } else if (!line.empty() && line.back() != ' ') {
      line += ' ';
    }
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

}  // namespace

void PgBackend::AdoptWriter(PGconn* conn, const std::string& cause) {
  Session session;
  session.pid = PQbackendPID(conn);
  try {
    PgResult r = PgExec(conn, sql_.session_started, "learning the writer's session", target_);
    // No row (the view hides it): a session never matched, so never ended.
    if (r.rows() > 0 && !r.null(0, 0)) session.started = std::string(r.bytes(0, 0));
  } catch (...) {
    PQfinish(conn);
    throw;
  }
  PQfinish(writer_conn_);
  writer_conn_ = conn;
  writer_session_ = std::move(session);
  const std::string server = std::string(PQhost(conn)) + ":" + PQport(conn);
  MutexLock lock(&link_mu_);
  if (!cause.empty()) {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    ++link_.reconnections;
    link_.last_reconnection_cause = OneLine(target_.Hide(cause), target_.display);
    link_.last_reconnection_unix = now;
    if (server != link_.server) {
      ++link_.failovers;
      link_.last_failover = link_.server + " -> " + server;
      link_.last_failover_unix = now;
    }
  }
  link_.server = server;
  lock.Unlock();
  try {
    MeasureClock();
    ReadReplication();
  } catch (const Error&) {
    // The clock is measured again within kClockEverySeconds; replication is
    // read again at the next connection.
  }
}

void PgBackend::ReadReplication() {
  const PgResult r =
      PgExec(writer_conn_, sql_.replication, "reading the server's replication", target_);
  const std::string names(r.bytes(0, 0));
  const uint64_t standbys = r.int8(0, 1);
  MutexLock lock(&link_mu_);
  link_.synchronous_standby_names = names;
  link_.standbys = standbys;
  link_.replication = !names.empty() ? "synchronous" : standbys > 0 ? "asynchronous" : "none";
}

void PgBackend::MeasureClock() {
  const double before = Backend::NowUnix();
  const PgResult r = PgExec(writer_conn_, sql_.server_clock, "reading the server's clock", target_);
  const double after = Backend::NowUnix();
  const double server = static_cast<double>(static_cast<int64_t>(r.int8(0, 0))) / 1e6;
  clock_offset_.store(server - (before + after) / 2);
  last_clock_ = std::chrono::steady_clock::now();
}

bool PgBackend::CommitBatch(PGconn* conn, std::vector<Request>& batch, const std::string& token,
                            std::vector<CommitResult>* results, std::vector<Notification>* written,
                            std::string* error) {
  results->clear();
  written->clear();
  try {
    {
      BatchPipeline tx(conn, sql_, target_);
      tx.Send("BEGIN");
      tx.Send(sql_.lock_clock_and_observed);
      const ValidationReads reads = SendReads(tx, batch, 2);
      const std::vector<PgResult> read = tx.Run();
      StrongColumns strong;
      const uint64_t clock = LockedClock(read[1], target_.schema, &strong);
      PgTables tables;
      LoadReads(read, reads, &tables);
      std::vector<Notification> notes;
      const uint64_t ts = ValidateAndApply(batch, strong, clock, &tables, results, &notes);
      WriteVersions(tx, tables);
      WriteBookkeeping(tx, tables);
      // The batch's token, in its own transaction: if the connection drops
      // during COMMIT, the writer reconnects and reads it back to learn
      // whether the batch committed.
      tx.Send(sql_.publish_with_token, PublishParams(clock, &token));
      PgParams last;
      last.Int8(ts);
      tx.Send(sql_.advance_clock, last);
      if (target_.poll_interval == 0) tx.Send(sql_.notify_commit);
      *written = std::move(notes);  // kept on failure too: the token may show it committed
      tx.Send("COMMIT");
      tx.Run();
    }
    batches_.fetch_add(1);
    return true;
  } catch (const Error& e) {
    *error = e.what();
    if (PQstatus(conn) == CONNECTION_OK) PgRollback(conn);
    return false;
  }
}

}  // namespace percolite
