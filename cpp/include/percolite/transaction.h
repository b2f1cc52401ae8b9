// percolite/transaction.h: snapshot-isolation transactions over a backend.
//
// Thread safety: a Transaction may be used from any thread; calls on one
// Transaction are serialised by its own mutex. Commit() blocks the calling
// thread until the backend reports the commit (durable, with sync="full");
// callers from Python release the GIL first. TransactionSource's methods may
// be called from any thread.
//
// Contract
// - The snapshot is taken at Begin: every transaction committed before it is
//   visible, nothing committed after. start_ts names that snapshot.
// - Reads (Get, Scan) see the snapshot plus this transaction's own writes.
// - Set and Delete are buffered and applied atomically at Commit.
// - Commit fails with kConflict when any cell this transaction set or deleted
//   was written by another transaction that committed after start_ts; nothing
//   of the failed transaction is applied. Reads never conflict, so write skew
//   is possible (plain snapshot isolation, as in Fluo without read locks).
// - A committed transaction that wrote something gets a unique, increasing
//   commit_ts. A transaction that wrote nothing commits without touching the
//   store and has no commit_ts.
// - Rows must be non-empty; families must be non-empty; qualifiers and values
//   may be empty; all are byte strings of any length.
// - After Commit or Abort, every call except Abort throws kWrongState; once
//   the TransactionSource that began it is closed, they throw kClosed.
// - TransactionSource::Close aborts every transaction it began that is still
//   active (waiting for a commit already in flight on it to finish), and
//   refuses new ones with kClosed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "percolite/backend.h"
#include "percolite/encoding.h"
#include "percolite/mutex.h"

namespace percolite {

class TransactionSource;

// Which cells a scan visits: encoded keys in [from, end) (end empty = no bound)
// and, when `columns` is not empty, only those (family, qualifier) pairs.
struct ScanRange {
  std::string from;
  std::string end;
  std::vector<std::pair<std::string, std::string>> columns;

  static ScanRange RowPrefix(std::string_view prefix);
  static ScanRange Rows(std::string_view start_row, std::optional<std::string_view> end_row);
};

struct ScanItem {
  Cell cell;
  std::string value;
};

struct ScanChunk {
  std::vector<ScanItem> items;
  std::string resume_after;  // pass back to continue after this chunk
  bool done = false;         // the range is exhausted
};

// Scan's cells packed for a caller that makes its own objects of them (the
// Python bindings): each cell's row, family, qualifier and value, decoded,
// back to back in `bytes`, their lengths in `sizes`, four per cell.
struct PackedCells {
  std::string bytes;
  std::vector<size_t> sizes;
  std::string resume_after;  // pass back to continue after this chunk
  bool done = false;         // the range is exhausted
  size_t size() const { return sizes.size() / 4; }
};

class Transaction : public std::enable_shared_from_this<Transaction> {
 public:
  // kClosed: aborted because its Env was closed (Commit then throws kClosed).
  // kCommitting: submitted by CommitAsync, its result not reported yet.
  enum class State { kActive, kCommitting, kCommitted, kAborted, kClosed };

  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  uint64_t start_ts() const { return start_ts_; }
  State state() const EXCLUDES(mu_);
  std::optional<uint64_t> commit_ts() const EXCLUDES(mu_);

  std::optional<std::string> Get(const CellRef& cell) EXCLUDES(mu_);
  // Get for a caller that must not wait (one holding the Python GIL), without
  // copying the value: see Snapshot::TryGet. kWouldBlock, having read
  // nothing, also when another thread is inside this transaction.
  Snapshot::TryRead TryGet(const CellRef& cell, Snapshot::ValueView found, void* context)
      EXCLUDES(mu_);
  void Set(const CellRef& cell, std::string_view value) EXCLUDES(mu_);
  void Delete(const CellRef& cell) EXCLUDES(mu_);

  // Buffers a stamped write (backend.h): the qualifier gets the commit_ts and a
  // sequence number appended, so adders of queue entries never collide. Not
  // visible to this transaction's own reads. `joinable`: `value` is a packed
  // record that the backend may join with other commits' (backend.h).
  void AddStamped(const CellRef& cell, std::string_view value, bool joinable = false) EXCLUDES(mu_);
  // Removes a cell a stamped write created, without a tombstone (backend.h,
  // Mutation::purge). Only for consumed queue entries.
  void Purge(const CellRef& cell) EXCLUDES(mu_);
  // Purges every cell of `row`/`family` whose qualifier sorts from
  // `first_stamp` (kStampSize bytes, backend.h) to anything that begins with
  // `last_stamp`, as one range (Mutation::purge_end), without tombstones and
  // without conflict checks: a run of consumed queue entries, in a queue row
  // that holds nothing but stamped entries. Only for stamps this transaction's
  // snapshot saw committed (later commits have larger stamps, so their entries
  // are never in the range). This transaction's reads stop seeing the purged
  // cells; its own writes are applied after the purge.
  void PurgeStamps(std::string_view row, std::string_view family, std::string_view first_stamp,
                   std::string_view last_stamp) EXCLUDES(mu_);
  // How many stamped writes are buffered (the index the next one gets).
  size_t StampedCount() const EXCLUDES(mu_);

  // Asks for a weak notification of this cell when the transaction commits
  // (notifications.h). Never causes a conflict.
  void SetWeakNotification(const CellRef& cell) EXCLUDES(mu_);

  // Workers only: makes this transaction an observer run for the notification
  // of `cell_key`, and tells whether that notification is pending in its snapshot.
  void SetTrigger(std::string cell_key) EXCLUDES(mu_);
  bool NotificationPending(const std::string& cell_key) EXCLUDES(mu_);
  // Observer runs only: asks the workers to abort this run and run the
  // notification again after `seconds` (workers.h, "Deferring"). The largest
  // request wins; DeferredSeconds() is 0 when none was made.
  void DeferTrigger(double seconds) EXCLUDES(mu_);
  double DeferredSeconds() const EXCLUDES(mu_);
  // Observer runs only: whether the workers brought this run forward because
  // a thread waits for them to go idle (workers.h, "Hurrying"). A run that
  // would defer itself only to gather more work (a lingering queue) goes on.
  void SetHurried() EXCLUDES(mu_);
  bool Hurried() const EXCLUDES(mu_);

  // What this observer run wrote, by target, for the app's dataflow graph
  // (the workers add a committed run's counts to its observer's):
  // "family:F", cells of column family F the app's own code set or deleted
  // (counted by the bindings, so a queue's internal rows never show), and
  // "queue:ID", entries added to queue ID (counted where queue entries are
  // written). Only in observer runs (SetTrigger); elsewhere nothing is kept.
  void CountWrite(std::string_view kind, std::string_view name, uint64_t n = 1) EXCLUDES(mu_);
  std::vector<std::pair<std::string, uint64_t>> WriteCounts() const EXCLUDES(mu_);

  // One chunk of at most `limit` cells; start with resume_after == nullptr.
  ScanChunk Scan(const ScanRange& range, const std::string* resume_after, size_t limit)
      EXCLUDES(mu_);
  // Scan into one buffer: the same cells, with no allocation per cell. The
  // chunk ends after `limit` stored cells have been looked at (columns not
  // asked for count too), so a filtered scan of a large range holds the
  // transaction for a bounded time.
  void ScanPacked(const ScanRange& range, const std::string* resume_after, size_t limit,
                  PackedCells* out) EXCLUDES(mu_);
  // Calls visit(encoded key, value) for the cells Scan would return (this
  // transaction's own writes and purges included), in key order, with views
  // valid only during the call, until it returns false; nothing is copied.
  // Returns true when the range was exhausted. range.columns must be empty,
  // and the visitor must not use this transaction.
  bool Visit(const ScanRange& range, const std::string* resume_after,
             const Snapshot::CellVisitor& visit) EXCLUDES(mu_);
  // How many cells Scan would visit from resume_after (nullptr: from the
  // start), at most `limit`, without copying them. range.columns must be empty.
  size_t Count(const ScanRange& range, const std::string* resume_after, size_t limit) EXCLUDES(mu_);

  // What the transaction has buffered so far (writes, stamped writes,
  // purges, weak notifications), to go back to: RollbackTo drops everything
  // buffered after Save. A queue run uses it to try a batch and, when the
  // batch fails, its halves (queue_rows.h). Costs a copy of the buffer.
  class Savepoint {
   private:
    friend class Transaction;
    struct State;
    std::shared_ptr<const State> state_;
  };
  Savepoint Save() const EXCLUDES(mu_);
  void RollbackTo(const Savepoint& savepoint) EXCLUDES(mu_);

  // Runs `fn` once this transaction has committed, on the thread that learns
  // it (Commit's caller, or before CommitAsync's `done`); never when it
  // aborts or fails. For reports that must not claim what did not commit.
  void AfterCommit(std::function<void()> fn) EXCLUDES(mu_);

  // Commits; throws kConflict (and the transaction is aborted) on a write-write conflict.
  void Commit() EXCLUDES(mu_);
  // Submits the commit without waiting for it (Backend::CommitAsync): the
  // transaction leaves kActive at once (kCommitting; every later call but
  // Abort throws kWrongState) and `done` gets the result once the backend
  // reports it (with sync="full": once it is durable), on a backend thread or
  // on this one before CommitAsync returns; state() and commit_ts() show the
  // outcome from then on. A transaction that wrote nothing commits at once
  // (a result with commit_ts 0). Throws, without calling `done`, what Commit
  // throws for a transaction that cannot be submitted (finished, closed).
  // `done` must not block; it may begin and submit other transactions.
  void CommitAsync(CommitCallback done) EXCLUDES(mu_);
  // Discards the buffered writes and releases the snapshot. Idempotent.
  void Abort() EXCLUDES(mu_);

 private:
  friend class TransactionSource;
  struct BufferedWrite {
    bool is_delete = false;
    std::string value;
    bool purge = false;
  };

  Transaction(std::shared_ptr<TransactionSource> source, std::unique_ptr<Snapshot> snapshot);
  void CheckActive() const REQUIRES(mu_);
  void CommitLocked() REQUIRES(mu_);
  void ReleaseLocked(State s) REQUIRES(mu_);
  bool HasWritesLocked() const REQUIRES(mu_);
  std::vector<Mutation> TakeMutationsLocked() REQUIRES(mu_);
  std::shared_ptr<Backend> BackendLocked() const REQUIRES(mu_);
  void AbortFromClose() EXCLUDES(mu_);
  static void ValidateCell(const CellRef& cell);

  mutable Mutex mu_;
  std::weak_ptr<TransactionSource> source_;
  std::unique_ptr<Snapshot> snapshot_ GUARDED_BY(mu_);
  const uint64_t start_ts_;
  State state_ GUARDED_BY(mu_) = State::kActive;
  bool source_closed_ GUARDED_BY(mu_) = false;
  std::optional<uint64_t> commit_ts_ GUARDED_BY(mu_);
  std::map<std::string, BufferedWrite> writes_ GUARDED_BY(mu_);  // by encoded key
  CommitExtras extras_ GUARDED_BY(mu_);
  std::vector<Mutation> stamped_ GUARDED_BY(mu_);
  // Purged ranges of encoded keys, [from, end); hidden from this transaction's reads.
  std::vector<std::pair<std::string, std::string>> purged_ GUARDED_BY(mu_);
  bool Purged(std::string_view key) const REQUIRES(mu_);
  double deferred_seconds_ GUARDED_BY(mu_) = 0;
  std::vector<std::function<void()>> after_commit_ GUARDED_BY(mu_);
  bool hurried_ GUARDED_BY(mu_) = false;
  std::vector<std::pair<std::string, uint64_t>> write_counts_ GUARDED_BY(mu_);
  std::atomic<bool> observer_run_{false};  // set with the trigger: CountWrite keeps counts
};

// Begins transactions on a backend and keeps track of the active ones, so
// that closing it aborts them: one per Env handle.
class TransactionSource : public std::enable_shared_from_this<TransactionSource> {
 public:
  explicit TransactionSource(std::shared_ptr<Backend> backend);
  TransactionSource(const TransactionSource&) = delete;
  TransactionSource& operator=(const TransactionSource&) = delete;

  // A new transaction on a fresh snapshot; throws kClosed after Close.
  std::shared_ptr<Transaction> Begin() EXCLUDES(mu_);
  // The backend; throws kClosed after Close (and kWrongState in a forked child).
  std::shared_ptr<Backend> backend() const EXCLUDES(mu_);
  bool closed() const EXCLUDES(mu_);
  // Aborts the active transactions and refuses new ones; returns the backend
  // (null when already closed), for its owner to release. Idempotent.
  std::shared_ptr<Backend> Close() EXCLUDES(mu_);

 private:
  friend class Transaction;
  void Forget(Transaction* transaction) EXCLUDES(mu_);
  Error ClosedError() const;

  const std::string location_;  // for messages
  mutable Mutex mu_;
  std::shared_ptr<Backend> backend_ GUARDED_BY(mu_);  // null once closed
  std::map<Transaction*, std::weak_ptr<Transaction>> active_ GUARDED_BY(mu_);
};

}  // namespace percolite
