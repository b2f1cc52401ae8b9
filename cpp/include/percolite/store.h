// percolite/store.h: one LMDB environment per path per process, and its
// group-commit writer.
//
// Thread safety: every public method of Store may be called from any thread at
// any time. A Snapshot is used by one thread at a time (its owner serialises
// access); it may move between threads (LMDB's MDB_NOTLS).
//
// Contract
// - Store::Acquire returns the one Store of a path in this process (a registry
//   keyed by the real path) and counts one more handle on it; acquiring it
//   again with a different sync mode throws kInvalidArgument naming it.
//   ReleaseHandle drops one; the last one closes the Store.
// - A Snapshot sees every transaction committed before it began and nothing
//   after; its start_ts is the timestamp counter as stored in that snapshot.
// - Commit(start_ts, mutations) applies all of `mutations` atomically with a
//   fresh commit_ts, or none of them. It fails with kConflict when a mutated
//   cell carries a commit_ts greater than start_ts (written by a transaction
//   that committed after the snapshot), including writes of earlier members of
//   the same group-commit batch. commit_ts values are unique and increasing.
// - Group commit: one leader at a time drains every pending request into one
//   LMDB write transaction, validating members in arrival order, and commits
//   LMDB once. A committer that finds no leader leads itself, on its own
//   thread, until its commit is done (a lone commit costs no hand-off and no
//   context switch); then the writer thread takes over whatever is still
//   queued. With SyncMode::kFull, Commit returns only once the batch is
//   durable; under load, about one sync per batch achieves that (see
//   LeadOnce).
// - Deletes leave tombstones carrying their commit_ts, so a concurrent
//   writer of the deleted cell still conflicts. A tombstone is collected once
//   every reader in every process began after the write that made it.
// - The memory map grows by itself; users never see MDB_MAP_FULL.
// - Notifications (notifications.h): a commit that sets a strongly observed
//   column, or carries weak notifications, writes them to the notify table in
//   the same LMDB write; an observer run's commit validates and writes the
//   trigger's ack cell and removes the notification unless it was set again
//   after the run's start_ts. After each batch the writer hands the
//   notifications it wrote to the listener registered by this process's
//   workers.
//
// Caveats
// - A Store must not be used in a child created by fork(): every call there
//   throws kWrongState, and nothing of the parent's LMDB state is touched.
// - Close() drains queued commits, then closes LMDB. Snapshots still open are
//   released first by their owners (see env.h), never by another thread.
#pragma once

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "percolite/notifications.h"
#include "percolite/status.h"

struct MDB_env;
struct MDB_txn;

namespace percolite {

enum class SyncMode { kFull, kMeta, kNone };

struct StoreOptions {
  SyncMode sync = SyncMode::kFull;
  bool create = true;
  unsigned file_mode = 0600;                  // for the data and lock files
  size_t initial_map_size = size_t{1} << 30;  // grows by doubling when full
  unsigned max_readers = 2046;                // one slot per open transaction
  size_t max_batch = 4096;                    // most commits in one LMDB write
};

// One write of a transaction. `key` is an encoded cell key (encoding.h).
// A stamped write gets the transaction's commit_ts (8 bytes, big-endian) and
// stamp_seq (4 bytes) put in front of its qualifier by the writer: a key
// unique to the transaction, so stamped writes are never validated and never
// conflict (queue entries use them). Stamp first, a transaction's stamped
// writes to one row are adjacent and sort after every earlier commit's: a
// commit appends them to the end of the row, touching a page or two instead
// of one page per entry.
//
// A purge removes a cell that a stamped write created (a consumed queue
// entry): such keys are unique and never written again, so the purge is not
// validated and leaves no tombstone (readers of older snapshots still see the
// cell: they read LMDB snapshots). Queues serialize their consumers by other
// writes (the bucket's cursor cell).
//
// A range purge (purge with a non-empty purge_end) removes every stored cell,
// tombstones included, whose encoded key k has key <= k < purge_end: a run
// of consumed queue entries, deleted by one cursor walk instead of one B-tree
// descent each. Like a purge it is not validated. It is applied before the
// other writes of its transaction. Stamps are increasing, so a range that ends at
// the last entry a snapshot saw can never hold an entry committed after it.
struct Mutation {
  std::string key;
  bool is_delete = false;
  std::string value;
  bool stamped = false;
  uint32_t stamp_seq = 0;
  bool purge = false;
  std::string purge_end;
};

// The stamp put in front of a stamped write's qualifier: commit_ts (8 bytes)
// and stamp_seq (4 bytes), both big-endian.
constexpr size_t kStampSize = 12;

// The encoded key a stamped write lands on.
std::string StampedKey(std::string_view encoded_key, uint64_t commit_ts, uint32_t seq);

struct CommitResult {
  Status status;
  uint64_t commit_ts = 0;
};

struct StoreStats {
  uint64_t commits = 0;         // transactions committed by this process
  uint64_t conflicts = 0;       // commits refused with kConflict
  uint64_t batches = 0;         // LMDB write transactions of group commits
  uint64_t inline_batches = 0;  // of those, run by a committing thread itself
  uint64_t tombstones_collected = 0;
  uint64_t map_size = 0;  // current size of the memory map in bytes
  uint64_t map_growths = 0;
};

class Store;
class Workers;

// A consistent read view: an LMDB read transaction held for its whole life.
class Snapshot {
 public:
  ~Snapshot();
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  uint64_t start_ts() const { return start_ts_; }

  // The value of the cell with this encoded key; nullopt if absent or deleted.
  std::optional<std::string> Get(std::string_view encoded_key);

  // Appends to `out` the live cells (key, value) with from <= key (from < key
  // when `exclusive`) and key < end (no bound when `end` is empty), in key
  // order, at most `limit` of them. Returns true when the range is exhausted.
  bool Scan(std::string_view from, bool exclusive, std::string_view end, size_t limit,
            std::vector<std::pair<std::string, std::string>>* out);
  // Calls visit(key, value) for the live cells Scan would return, in key
  // order, with views valid only during the call, until it returns false.
  // Returns true when the range is exhausted. The visitor must not use this
  // snapshot (the store's map lock is held while it runs, for a few thousand
  // cells at a time).
  using CellVisitor = std::function<bool(std::string_view key, std::string_view value)>;
  bool Visit(std::string_view from, bool exclusive, std::string_view end, const CellVisitor& visit);
  // How many live cells Scan would visit in that range, at most `limit`;
  // nothing is copied.
  size_t Count(std::string_view from, bool exclusive, std::string_view end, size_t limit);

  // The stamp of the pending notification of this cell, if there is one.
  std::optional<uint64_t> NotificationStamp(std::string_view cell_key);

  // Releases the LMDB read transaction; later calls throw kClosed.
  void Release();

 private:
  friend class Store;
  Snapshot(std::shared_ptr<Store> store, MDB_txn* txn, uint64_t start_ts)
      : store_(std::move(store)), txn_(txn), start_ts_(start_ts) {}
  std::shared_ptr<Store> store_;
  MDB_txn* txn_;
  uint64_t start_ts_;
};

class Store : public std::enable_shared_from_this<Store> {
 public:
  static std::shared_ptr<Store> Acquire(const std::string& path, const StoreOptions& options);
  void ReleaseHandle();
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& path() const { return path_; }
  const StoreOptions& options() const { return options_; }

  // Throws kClosed after Close(), kWrongState in a forked child.
  void CheckUsable() const;

  std::unique_ptr<Snapshot> BeginSnapshot();

  // Blocks until the group commit carrying these mutations has finished.
  // `mutations` must be sorted by key without duplicates.
  CommitResult Commit(uint64_t start_ts, const std::vector<Mutation>& mutations,
                      const CommitExtras* extras = nullptr);

  // The observed columns stored in the store, and replacing them.
  std::vector<ObservedColumn> ObservedColumns();
  void SetObservedColumns(const std::vector<ObservedColumn>& columns);

  // Pending notifications: how many, a chunk in table order starting after
  // `after` (a notification table key; empty = from the start), and counts
  // per column. ScanNotifications returns true when it reached the end.
  uint64_t PendingNotifications();
  // The signal file of the store directory ("waiting"): a process waiting
  // for other processes' workers (Env::WaitIdle) touches it (SignalWaiting);
  // their scanners watch it with inotify and hurry their lingering runs.
  // Best effort: both return false when the file cannot be created or touched.
  std::string SignalFilePath() const;
  bool CreateSignalFile() const;
  bool SignalWaiting() const;
  bool ScanNotifications(std::string_view after, size_t limit, std::vector<Notification>* out);
  std::map<std::pair<std::string, std::string>, uint64_t> CountPendingByColumn();

  // The workers of this process that receive notifications as they are
  // committed; at most one per store. Throws kInvalidArgument if another is set.
  void SetNotificationListener(Workers* workers);
  void ClearNotificationListener(Workers* workers);

  StoreStats Stats() const;

  // Tests only: validates and applies these commits as one group-commit batch,
  // in order, on the calling thread (as the writer thread would).
  std::vector<CommitResult> CommitBatchForTesting(
      const std::vector<std::pair<uint64_t, std::vector<Mutation>>>& commits);

  // Drains pending commits, stops the writer and closes LMDB. Idempotent.
  // Called by the last ReleaseHandle; tests may call it directly.
  void Close();

 private:
  friend class Snapshot;
  struct PendingCommit;
  // Readers hold the map lock shared for the length of one LMDB call sequence;
  // growing the map takes it exclusively, so no thread is inside the map while
  // it moves. Writer-preferring so a resize is not starved by a stream of reads.
  class MapLock {
   public:
    MapLock() {
      pthread_rwlockattr_t attr;
      pthread_rwlockattr_init(&attr);
      pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
      pthread_rwlock_init(&lock_, &attr);
      pthread_rwlockattr_destroy(&attr);
    }
    ~MapLock() { pthread_rwlock_destroy(&lock_); }

    class Shared {
     public:
      explicit Shared(MapLock& l) : l_(&l) { pthread_rwlock_rdlock(&l_->lock_); }
      ~Shared() { unlock(); }
      void unlock() {
        if (l_) pthread_rwlock_unlock(&l_->lock_);
        l_ = nullptr;
      }

     private:
      MapLock* l_;
    };
    class Exclusive {
     public:
      explicit Exclusive(MapLock& l) : l_(l) { pthread_rwlock_wrlock(&l_.lock_); }
      ~Exclusive() { pthread_rwlock_unlock(&l_.lock_); }

     private:
      MapLock& l_;
    };

   private:
    pthread_rwlock_t lock_;
  };

  Store(std::string path, const StoreOptions& options);
  void OpenEnvironment();
  void CloseEnvironment();
  void WriterLoop();
  // One step of the group-commit leader (the caller holds leadership, not
  // queue_mu_): commits the queued requests as one batch, or syncs when only
  // unconfirmed ones remain, and wakes the committers it finished. `batch` is
  // scratch space. Returns true when it ran an LMDB write transaction.
  bool LeadOnce(std::vector<PendingCommit*>& batch);
  // Wakes these committers (their results are set) and clears `done`.
  void Wake(std::vector<PendingCommit*>& done);
  // Returns true when it committed an LMDB write (which synced the data file).
  bool ProcessBatch(std::vector<PendingCommit*>& batch);
  // Syncs the data file (making the last meta page durable).
  Status SyncMeta();
  void RefreshObserved(MDB_txn* txn);
  // Begins an LMDB transaction under `lock` (held shared). Returns nullptr when
  // another process had grown the map: the lock was dropped to adopt the new
  // size, and the caller retries with a fresh lock.
  MDB_txn* TryBeginTxn(MapLock::Shared& lock, unsigned flags, const char* what);
  // Runs `fn(txn)` in a short read transaction under the map lock.
  template <typename Fn>
  auto WithReadTxn(Fn&& fn);
  // Removes tombstones no reader can need any more; returns how many.
  uint64_t CollectTombstones(MDB_txn* txn, uint64_t current_txnid);
  // Grows the map (or adopts another process's larger size); takes the map lock exclusively.
  void GrowMap(bool adopt_only);
  friend class Env;
  bool ForkedAway() const;

  std::string path_;
  StoreOptions options_;
  uint64_t fork_generation_;
  MDB_env* env_ = nullptr;
  unsigned data_dbi_ = 0, meta_dbi_ = 0, tombstone_dbi_ = 0, notify_dbi_ = 0, ack_dbi_ = 0;

  // The writer's cache of the strongly observed columns (from the meta table).
  std::string observed_raw_;  // group-commit leader only
  // Strongly observed columns as encoded key tails (family and qualifier
  // parts, encoding.h), so a write's key is matched without decoding it.
  std::set<std::string, std::less<>> strong_;  // group-commit leader only

  std::mutex listener_mu_;
  Workers* listener_ = nullptr;  // GUARDED_BY(listener_mu_)
  std::unique_ptr<MapLock> map_lock_;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;  // wakes the writer
  std::deque<PendingCommit*> queue_;  // GUARDED_BY(queue_mu_)
  bool stopping_ = false;             // GUARDED_BY(queue_mu_)
  // Whether some thread (the writer or a committer) is the group-commit
  // leader; only the leader runs LMDB write transactions.
  bool leading_ = false;  // GUARDED_BY(queue_mu_)
  // Committed, not yet durable (sync="full"): woken after the next sync.
  // Touched by the leader, or under queue_mu_ while no one leads.
  std::vector<PendingCommit*> unconfirmed_;
  std::unique_ptr<std::thread> writer_;
  std::atomic<bool> closed_{false};
  int handles_ = 0;  // GUARDED_BY(registry mutex)
  std::atomic<int> live_snapshots_{0};

  std::atomic<uint64_t> commits_{0}, conflicts_{0}, batches_{0}, inline_batches_{0},
      tombstones_collected_{0}, map_growths_{0};
  std::atomic<uint64_t> map_size_{0};
};

}  // namespace percolite
