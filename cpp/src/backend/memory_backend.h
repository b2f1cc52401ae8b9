// memory_backend.h: the "memory" backend (backend.h): a multi-version store
// in this process's memory, private to the handle that opened it.
//
// Thread safety: as backend.h.
//
// How it meets the contract of backend.h
// - Every table (cells, notifications) keeps, per key, the versions written
//   by commits: (commit_ts, live / deleted / purged, value). A snapshot at
//   start_ts reads, per key, the newest version with commit_ts <= start_ts, so
//   it sees exactly the commits up to its start_ts while others go on.
// - Commits run one at a time under the store's lock, on the committer's own
//   thread: validate and apply (commit_rules.h, the rules every backend
//   shares), then hand new notifications to the sink, then report. CommitAsync
//   calls `done` before it returns.
// - Versions no open snapshot can read any more are collected at each commit:
//   a superseded version at once when no open snapshot began between it and
//   its successor, else once the oldest open snapshot began after its
//   successor; a tombstone or purge once the oldest began after it.
// - Nothing is durable and nothing is shared with other processes
//   (capabilities: persistent, cross_process and durable all false); sync
//   modes are accepted and change nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "commit_rules.h"
#include "handle_state.h"
#include "percolite/backend.h"
#include "percolite/mutex.h"
#include "sink_slot.h"

namespace percolite {

class MemoryBackend final : public Backend, public std::enable_shared_from_this<MemoryBackend> {
 public:
  static std::shared_ptr<MemoryBackend> Open(const BackendOptions& options);
  ~MemoryBackend() override = default;
  MemoryBackend(const MemoryBackend&) = delete;
  MemoryBackend& operator=(const MemoryBackend&) = delete;

  const BackendCapabilities& capabilities() const override;
  const std::string& location() const override;
  const BackendOptions& options() const override { return options_; }

  void CheckUsable() const override;
  bool ForkedAway() const override;

  std::unique_ptr<Snapshot> BeginSnapshot() override EXCLUDES(mu_, snapshots_mu_);
  void CommitAsync(uint64_t start_ts, std::vector<Mutation> mutations, CommitExtras extras,
                   CommitCallback done) override EXCLUDES(mu_);
  CommitResult Commit(uint64_t start_ts, std::vector<Mutation> mutations,
                      CommitExtras extras) override EXCLUDES(mu_);

  std::vector<ObservedColumn> ObservedColumns() override EXCLUDES(mu_);
  void SetObservedColumns(const std::vector<ObservedColumn>& columns) override EXCLUDES(mu_);

  uint64_t PendingNotifications() override EXCLUDES(mu_);
  bool ScanNotifications(std::string_view after, size_t limit,
                         std::vector<Notification>* out) override EXCLUDES(mu_);
  std::map<std::pair<std::string, std::string>, uint64_t> CountPendingByColumn() override
      EXCLUDES(mu_);
  std::vector<std::string> VerifyStructure() override;
  std::optional<std::string> DamagedMark() override { return std::nullopt; }

  void SetNotificationSink(NotificationSink* sink) override;
  void ClearNotificationSink(NotificationSink* sink) override;
  std::unique_ptr<WorkWatch> WatchForWork() override;
  bool SignalWaiting() override EXCLUDES(watch_mu_);

  BackendStats Stats() const override;
  // How many versions the tables hold (tests: collection keeps this bounded).
  size_t VersionCountForTesting() const EXCLUDES(mu_);

  void ReleaseHandle() override { Close(); }
  void Close() override;

  // One write of a key: what a snapshot at or after `ts` (and before the
  // next version) reads.
  enum class VersionState : uint8_t { kLive, kDeleted, kPurged };
  struct Version {
    uint64_t ts;
    VersionState state;
    std::string value;
  };
  using Versions = std::vector<Version>;  // oldest first
  using Table = std::map<std::string, Versions, std::less<>>;

 private:
  friend class MemorySnapshot;
  friend class MemoryTables;
  friend class MemoryWorkWatch;

  explicit MemoryBackend(const BackendOptions& options);
  // Validates and applies one commit under the exclusive lock; delivers its
  // notifications after releasing it.
  CommitResult CommitNow(uint64_t start_ts, const std::vector<Mutation>& mutations,
                         const CommitExtras* extras) EXCLUDES(mu_, snapshots_mu_, watch_mu_);
  void ForgetSnapshot(uint64_t start_ts) EXCLUDES(snapshots_mu_);
  // Whether an open snapshot began in [from, to).
  bool SnapshotBetweenLocked(uint64_t from, uint64_t to) const REQUIRES(snapshots_mu_);
  // Drops versions that no open snapshot can read.
  void CollectLocked() REQUIRES(mu_, snapshots_mu_);
  void CollectKey(Table* table, const std::string& key, uint64_t oldest) REQUIRES(mu_);

  const BackendOptions options_;
  HandleState state_;  // forked away, closed (CheckUsable)

  // Readers shared; commits exclusive. Taken before snapshots_mu_.
  mutable SharedMutex mu_ ACQUIRED_BEFORE(snapshots_mu_);
  Table data_ GUARDED_BY(mu_);
  Table notify_ GUARDED_BY(mu_);  // by NotificationKey; value: the stamp
  std::map<std::string, uint64_t, std::less<>> ack_ GUARDED_BY(mu_);
  uint64_t ts_ GUARDED_BY(mu_) = 0;  // the last commit_ts
  uint64_t live_notifications_ GUARDED_BY(mu_) = 0;
  std::string observed_ GUARDED_BY(mu_);
  StrongColumns strong_ GUARDED_BY(mu_);
  // Keys that got a version at ts (or lost one to a purge): their older
  // versions may be collected once every open snapshot began at or after ts.
  struct Collectable {
    uint64_t ts;
    bool notify;
    std::string key;
  };
  std::deque<Collectable> collectable_ GUARDED_BY(mu_);  // in ts order

  mutable Mutex snapshots_mu_;
  std::multiset<uint64_t> snapshots_ GUARDED_BY(snapshots_mu_);  // start_ts of open snapshots

  SinkSlot sink_;

  // Wakes watches: a counter per kind of event.
  Mutex watch_mu_;
  CondVar watch_cv_;
  uint64_t commit_events_ GUARDED_BY(watch_mu_) = 0;
  uint64_t waiter_events_ GUARDED_BY(watch_mu_) = 0;

  std::atomic<uint64_t> commits_{0}, conflicts_{0}, tombstones_collected_{0};
};

}  // namespace percolite
