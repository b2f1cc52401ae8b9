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
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "commit_rules.h"
#include "handle_state.h"
#include "percolite/backend.h"
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

  std::unique_ptr<Snapshot> BeginSnapshot() override;
  void CommitAsync(uint64_t start_ts, std::vector<Mutation> mutations, CommitExtras extras,
                   CommitCallback done) override;
  CommitResult Commit(uint64_t start_ts, std::vector<Mutation> mutations,
                      CommitExtras extras) override;

  std::vector<ObservedColumn> ObservedColumns() override;
  void SetObservedColumns(const std::vector<ObservedColumn>& columns) override;

  uint64_t PendingNotifications() override;
  bool ScanNotifications(std::string_view after, size_t limit,
                         std::vector<Notification>* out) override;
  std::map<std::pair<std::string, std::string>, uint64_t> CountPendingByColumn() override;
  std::vector<std::string> VerifyStructure() override;
  std::optional<std::string> DamagedMark() override { return std::nullopt; }

  void SetNotificationSink(NotificationSink* sink) override;
  void ClearNotificationSink(NotificationSink* sink) override;
  std::unique_ptr<WorkWatch> WatchForWork() override;
  bool SignalWaiting() override;

  BackendStats Stats() const override;
  // How many versions the tables hold (tests: collection keeps this bounded).
  size_t VersionCountForTesting() const;

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
                         const CommitExtras* extras);
  void ForgetSnapshot(uint64_t start_ts);
  // Whether an open snapshot began in [from, to) (snapshots_mu_ held).
  bool SnapshotBetweenLocked(uint64_t from, uint64_t to) const;
  // Drops versions that no open snapshot can read (mu_ held exclusively, and
  // snapshots_mu_).
  void CollectLocked();
  void CollectKey(Table* table, const std::string& key, uint64_t oldest);

  const BackendOptions options_;
  HandleState state_;  // forked away, closed (CheckUsable)

  mutable std::shared_mutex mu_;  // readers shared; commits exclusive
  Table data_;                    // GUARDED_BY(mu_)
  Table notify_;                  // GUARDED_BY(mu_), by NotificationKey; value: the stamp
  std::map<std::string, uint64_t, std::less<>> ack_;  // GUARDED_BY(mu_)
  uint64_t ts_ = 0;                                   // GUARDED_BY(mu_): the last commit_ts
  uint64_t live_notifications_ = 0;                   // GUARDED_BY(mu_)
  std::string observed_;                              // GUARDED_BY(mu_)
  StrongColumns strong_;                              // GUARDED_BY(mu_)
  // Keys that got a version at ts (or lost one to a purge): their older
  // versions may be collected once every open snapshot began at or after ts.
  struct Collectable {
    uint64_t ts;
    bool notify;
    std::string key;
  };
  std::deque<Collectable> collectable_;  // GUARDED_BY(mu_), in ts order

  mutable std::mutex snapshots_mu_;
  std::multiset<uint64_t> snapshots_;  // GUARDED_BY(snapshots_mu_): start_ts of open snapshots

  SinkSlot sink_;

  // Wakes watches: a counter per kind of event.
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  uint64_t commit_events_ = 0;  // GUARDED_BY(watch_mu_)
  uint64_t waiter_events_ = 0;  // GUARDED_BY(watch_mu_)

  std::atomic<uint64_t> commits_{0}, conflicts_{0}, tombstones_collected_{0};
};

}  // namespace percolite
