// lmdb_backend.h: the "lmdb" backend (backend.h): one LMDB environment per
// directory per process, and its group-commit writer.
//
// Thread safety: as backend.h. A snapshot may move between threads (MDB_NOTLS).
//
// Where each job lives: one class, LmdbBackend, implemented across
//   lmdb_store.cc     opening and closing: the registry of open stores,
//                     LMDB's environment and its set-up transaction (tables,
//                     format, upgrade), map growth, statistics
//   lmdb_files.cc     the store's files beside LMDB's work: path checks, the
//                     meta page check before LMDB maps data.mdb, the durable
//                     mark
//   lmdb_damage.cc    damage: failing the handle, damage marks, the free-list
//                     check before the first commit, VerifyStructure
//   lmdb_snapshot.cc  snapshots and the short reads (observed columns,
//                     notifications)
//   lmdb_commit.cc    group commit: the queue, its leader and the writer
//                     thread, one batch's write transaction, tombstones
//   lmdb_watch.cc     how workers hear of work: the sink in this process, the
//                     work watch and the signal file across processes
// and the headers beside it:
//   lmdb_internal.h   what those files share: the meta table's keys, the
//                     store's file names, fault containment (Contain) and
//                     short read transactions (WithReadTxn)
//   lmdb_map_lock.h   the map lock
//   lmdb_util.h       LMDB calls under the fault guard; records, ordered scans
//   page_walk.h       walking LMDB's pages, as the free-list check does
//   fault_guard.h     a fault inside the map becomes an exception
//
// How it meets the contract of backend.h
// - LmdbBackend::Acquire returns the one backend of a path in this process (a
//   registry keyed by the real path) and counts one more handle on it;
//   acquiring it again with a different sync mode throws kInvalidArgument
//   naming it. ReleaseHandle drops one; the last one closes it.
// - A snapshot is an LMDB read transaction held for its whole life; its
//   start_ts is the timestamp counter as stored in that snapshot.
// - Group commit: one leader at a time drains every pending request into one
//   LMDB write transaction, validating members in arrival order, and commits
//   LMDB once. A committer that finds no leader leads itself, on its own
//   thread, until its commit is done (a lone commit costs no hand-off and no
//   context switch); then the writer thread takes over whatever is still
//   queued, as it does for every CommitAsync. With SyncMode::kFull a batch is
//   durable before any reader in any process can see it: LMDB syncs its data
//   pages, writes its meta page through an O_DSYNC descriptor, and only then
//   publishes it (two syncs per batch, however many commits it holds).
// - A failed write or sync of a batch makes the backend refuse every later
//   call (kStorage, naming the cause) until the store is opened again: what
//   reached the disk is unknown, and nothing of it was shown to readers.
// - Damage never kills the process: every LMDB call runs under the fault
//   guard (fault_guard.h), and every record is verified against its checksum
//   before it is used (encoding.h). A bad checksum is kCorruption naming the
//   cell; a fault or an LMDB assertion is kCorruption too, and makes the
//   backend refuse every later call until the store is opened again.
// - Tombstones carry their commit_ts and are collected once every reader in
//   every process began after the write that made them.
// - Damage found is remembered: a read that meets a bad checksum or faults
//   writes the file "damaged" in the store directory, and from then on every
//   handle in every process refuses commits to the store (kCorruption:
//   writing over damaged pages can make it worse, or corrupt the writer's
//   memory inside LMDB before anything faults) until options.restored.
// - No silent rollback: with SyncMode::kFull each group commit, once durable,
//   records the timestamp counter in the store's durable mark (the file
//   "durable-txn"); opening a store whose counter, in the snapshot LMDB
//   serves, is below the mark (a damaged meta page let the older one take
//   over, or an old copy was put in its place) is kCorruption, unless
//   options.restored.
// - The memory map grows by itself; users never see MDB_MAP_FULL, nor
//   MDB_MAP_RESIZED: every LMDB transaction, opening's set-up one included,
//   adopts the larger size another process set and begins again.
// - WatchForWork: inotify on the data file (every commit of every process
//   writes it) and on the signal file "waiting" in the store directory, which
//   SignalWaiting touches.
//
// Locks, in the order a thread may take them: registry_mu_ (the registry of
// open stores), free_list_mu_, the map lock (lmdb_map_lock.h), damage_mu_.
// No other lock is taken while queue_mu_ is held.
//
// Caveats
// - Not usable in a child created by fork(): every call there throws
//   kWrongState, and nothing of the parent's LMDB state is touched.
// - Close() drains queued commits, then closes LMDB. Snapshots still open are
//   released first by their owners, never by another thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "commit_rules.h"
#include "fault_guard.h"
#include "handle_state.h"
#include "lmdb_map_lock.h"
#include "page_walk.h"
#include "percolite/backend.h"
#include "percolite/mutex.h"
#include "percolite/status.h"
#include "sink_slot.h"

struct MDB_env;
struct MDB_txn;

namespace percolite {

class LmdbSnapshot;

class LmdbBackend final : public Backend, public std::enable_shared_from_this<LmdbBackend> {
 public:
  static std::shared_ptr<LmdbBackend> Acquire(const std::string& path,
                                              const BackendOptions& options) EXCLUDES(registry_mu_);
  ~LmdbBackend() override;
  LmdbBackend(const LmdbBackend&) = delete;
  LmdbBackend& operator=(const LmdbBackend&) = delete;

  const BackendCapabilities& capabilities() const override;
  const std::string& location() const override { return path_; }
  const BackendOptions& options() const override { return options_; }
  const std::string& path() const { return path_; }

  void CheckUsable() const override;
  bool ForkedAway() const override;

  std::unique_ptr<Snapshot> BeginSnapshot() override EXCLUDES(*map_lock_);

  void CommitAsync(uint64_t start_ts, std::vector<Mutation> mutations, CommitExtras extras,
                   CommitCallback done) override EXCLUDES(queue_mu_);
  // Leads the group commit on the calling thread when no one else does.
  CommitResult Commit(uint64_t start_ts, std::vector<Mutation> mutations,
                      CommitExtras extras) override EXCLUDES(queue_mu_);

  std::vector<ObservedColumn> ObservedColumns() override;
  void SetObservedColumns(const std::vector<ObservedColumn>& columns) override EXCLUDES(*map_lock_);

  uint64_t PendingNotifications() override;
  bool ScanNotifications(std::string_view after, size_t limit,
                         std::vector<Notification>* out) override;
  std::map<std::pair<std::string, std::string>, uint64_t> CountPendingByColumn() override;
  std::vector<std::string> VerifyStructure() override;
  std::optional<std::string> DamagedMark() override EXCLUDES(damage_mu_);

  void SetNotificationSink(NotificationSink* sink) override;
  void ClearNotificationSink(NotificationSink* sink) override;

  // The signal file of the store directory ("waiting"): a process waiting
  // for other processes' workers touches it (SignalWaiting); their watches
  // see it with inotify. Best effort: false when it cannot be created or touched.
  std::unique_ptr<WorkWatch> WatchForWork() override;
  bool SignalWaiting() override;
  std::string SignalFilePath() const;
  bool CreateSignalFile() const;

  BackendStats Stats() const override;

  // Tests only: validates and applies these commits as one group-commit batch,
  // in order, on the calling thread (as the writer thread would).
  std::vector<CommitResult> CommitBatchForTesting(
      const std::vector<std::pair<uint64_t, std::vector<Mutation>>>& commits);

  void ReleaseHandle() override EXCLUDES(registry_mu_);
  // Drains pending commits, stops the writer and closes LMDB. Idempotent.
  // Called by the last ReleaseHandle; tests may call it directly.
  void Close() override EXCLUDES(queue_mu_);

 private:
  friend class LmdbSnapshot;
  struct Opening;
  struct PendingCommit;

  LmdbBackend(std::string path, const BackendOptions& options);

  // lmdb_store.cc: opening and closing.
  static void InstallForkHandlers();
  // Every open store of this process, by real path.
  static std::map<std::string, std::shared_ptr<LmdbBackend>>& Registry() REQUIRES(registry_mu_);
  void OpenEnvironment();
  // Opening's steps (OpenEnvironment): LMDB's own opening, which adopts the
  // map size another process set; the tables; the store format.
  void StartEnvironment(Opening& opening);
  void OpenTables(Opening& opening);
  void CheckFormat(Opening& opening);
  // Opening a store of the format before checksums: adds them to every record.
  void AddChecksums(MDB_txn* txn);
  void CloseEnvironment() EXCLUDES(*map_lock_);
  // Grows the map (or adopts another process's larger size); takes the map lock exclusively.
  void GrowMap(bool adopt_only) EXCLUDES(*map_lock_);
  // Begins an LMDB transaction under `lock` (held shared). Returns nullptr when
  // another process had grown the map: the lock was dropped to adopt the new
  // size, and the caller retries with a fresh lock. Not analysed: the
  // analysis cannot follow a scoped lock passed in, then released.
  MDB_txn* TryBeginTxn(LmdbMapLock::Shared& lock, unsigned flags,
                       const char* what) NO_THREAD_SAFETY_ANALYSIS;

  // lmdb_files.cc: the durable mark.
  // Refuses a store whose timestamp counter is below its durable mark
  // (kDurableMarkFile) unless options_.restored, which resets the mark to the
  // counter; then keeps the mark mapped, with sync="full", for WriteBatch.
  void OpenDurableMark() EXCLUDES(damage_mu_);
  void CloseDurableMark();

  // lmdb_damage.cc: failures and damage.
  // Marks the backend unusable after a failed write or sync (CheckUsable).
  void Fail(const std::string& cause);
  // Marks it unusable after reading damaged pages faulted (fault_guard.h).
  void FailDamaged(const FaultError& fault) EXCLUDES(damage_mu_);
  // Every later call throws Error(code, message) until the store is opened again.
  void Poison(ErrorCode code, const std::string& message);
  // Records that a read found the store damaged (kDamagedFile): commits are
  // refused from then on (CheckWritable).
  void MarkDamaged(const std::string& problem) EXCLUDES(damage_mu_);
  // Throws when the store was found damaged; first proves the free list
  // sound (CheckFreeList).
  void CheckWritable() EXCLUDES(damage_mu_, free_list_mu_);
  // Walks the pages the free list's soundness rests on, once per handle
  // (page_walk.h); a problem marks the store damaged.
  void CheckFreeList() EXCLUDES(free_list_mu_);
  // Loads the damage another handle or process recorded (kDamagedFile), if any.
  void LookForDamagedMark() EXCLUDES(damage_mu_);
  // The problems WalkPages finds in a current snapshot.
  std::vector<std::string> WalkStorePages(WalkScope scope);
  // WalkPages over snapshot `txnid`, which the caller keeps readable.
  std::optional<std::vector<std::string>> WalkSnapshot(uint64_t txnid, WalkScope scope);
  // Runs fn(); a FaultError it throws marks the backend unusable on its way
  // out, a kCorruption Error marks the store damaged (lmdb_internal.h).
  template <typename Fn>
  auto Contain(Fn&& fn) -> decltype(fn());

  // lmdb_snapshot.cc: reads.
  // Runs `fn(txn)` in a short read transaction under the map lock (lmdb_internal.h).
  template <typename Fn>
  auto WithReadTxn(Fn&& fn) EXCLUDES(*map_lock_);

  // lmdb_commit.cc: group commit.
  void WriterLoop() EXCLUDES(queue_mu_);
  // Leads the group commit (the caller holds leadership) until `pending` is
  // done, then gives leadership back.
  void LeadUntilDone(const PendingCommit& pending) EXCLUDES(queue_mu_);
  // Gives leadership back; wakes the writer when there is work for it.
  void ResignLocked() REQUIRES(queue_mu_);
  // One step of the group-commit leader (the caller holds leadership, not
  // queue_mu_): commits the queued requests as one batch and wakes their
  // committers. `batch` is scratch space. Returns false when nothing was queued.
  bool LeadOnce(std::vector<PendingCommit*>& batch) EXCLUDES(queue_mu_);
  // Wakes these committers (their results are set) and clears `done`.
  void Wake(std::vector<PendingCommit*>& done) EXCLUDES(queue_mu_);
  // Returns true when it committed an LMDB write (which synced the data file).
  bool ProcessBatch(std::vector<PendingCommit*>& batch) EXCLUDES(*map_lock_);
  // Validates and applies the batch in one LMDB write transaction and commits
  // it; throws on a storage failure. The notifications it wrote go to *written.
  // Returns false when another process had grown the map: call it again.
  bool WriteBatch(std::vector<PendingCommit*>& batch, std::vector<Notification>* written)
      EXCLUDES(*map_lock_);
  // Syncs the data file (making the last meta page durable).
  Status SyncMeta() EXCLUDES(*map_lock_);
  void RefreshObserved(MDB_txn* txn) REQUIRES_SHARED(*map_lock_);
  // Removes tombstones no reader can need any more; returns how many.
  uint64_t CollectTombstones(MDB_txn* txn, uint64_t current_txnid) REQUIRES_SHARED(*map_lock_);
  // Hands notifications a batch wrote to this process's sink.
  void Deliver(const std::vector<Notification>& written);

  std::string path_;
  BackendOptions options_;
  HandleState state_;  // forked away, closed, failed (CheckUsable)
  MDB_env* env_ = nullptr;
  void* durable_mark_ = nullptr;  // the durable mark's bytes, mapped shared (OpenDurableMark)
  unsigned data_dbi_ = 0, meta_dbi_ = 0, tombstone_dbi_ = 0, notify_dbi_ = 0, ack_dbi_ = 0;

  // The writer's cache of the strongly observed columns (from the meta table).
  StrongColumns strong_;  // group-commit leader only

  SinkSlot sink_;
  // Owned; a pointer so that a forked child can leave the parent's lock alone.
  std::unique_ptr<LmdbMapLock> map_lock_;

  Mutex queue_mu_;
  CondVar queue_cv_;  // wakes the writer
  std::deque<PendingCommit*> queue_ GUARDED_BY(queue_mu_);
  bool stopping_ GUARDED_BY(queue_mu_) = false;
  // Whether some thread (the writer or a committer) is the group-commit
  // leader; only the leader runs LMDB write transactions.
  bool leading_ GUARDED_BY(queue_mu_) = false;
  std::unique_ptr<std::thread> writer_;

  mutable Mutex damage_mu_;
  std::optional<std::string> damaged_ GUARDED_BY(damage_mu_);
  std::atomic<bool> is_damaged_{false};  // damaged_ is set: the fast check
  Mutex free_list_mu_;                   // held while CheckFreeList walks
  std::atomic<bool> free_list_checked_{false};
  std::atomic<int64_t> last_damage_look_ms_{0};  // CheckWritable's last LookForDamagedMark

  // Guards the registry of open stores (lmdb_store.cc) and their handle counts.
  static Mutex registry_mu_;
  int handles_ GUARDED_BY(registry_mu_) = 0;
  std::atomic<int> live_snapshots_{0};

  std::atomic<uint64_t> commits_{0}, conflicts_{0}, batches_{0}, inline_batches_{0},
      tombstones_collected_{0}, map_growths_{0};
  std::atomic<uint64_t> map_size_{0};
};

}  // namespace percolite
