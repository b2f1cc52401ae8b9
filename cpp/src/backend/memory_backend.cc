#include "memory_backend.h"

#include <algorithm>
#include <chrono>

namespace percolite {
namespace {

using Version = MemoryBackend::Version;
using VersionState = MemoryBackend::VersionState;
using Table = MemoryBackend::Table;

const std::string kLocation = ":memory:";

// The version a reader at `ts` sees, or nullptr.
const Version* VisibleAt(const MemoryBackend::Versions& versions, uint64_t ts) {
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    if (it->ts <= ts) return &*it;
  }
  return nullptr;
}

bool IsLive(const Version* v) { return v != nullptr && v->state == VersionState::kLive; }

}  // namespace

// The tables as commit_rules.h uses them, on the newest versions.
class MemoryTables {
 public:
  // Writes land at commit_ts. Lives only inside CommitNow's locked scope.
  MemoryTables(MemoryBackend* store, uint64_t commit_ts) REQUIRES(store->mu_, store->snapshots_mu_)
      : s_(store), ts_(commit_ts) {}

  std::optional<uint64_t> CellWrittenTs(std::string_view key) {
    AssertLocked();
    auto it = s_->data_.find(key);
    if (it == s_->data_.end() || it->second.empty()) return std::nullopt;
    const Version& newest = it->second.back();
    if (newest.state == VersionState::kPurged) return std::nullopt;  // as if never written
    return newest.ts;
  }
  std::optional<uint64_t> AckTs(std::string_view cell_key) {
    AssertLocked();
    auto it = s_->ack_.find(cell_key);
    if (it == s_->ack_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<uint64_t> NotificationStampAt(std::string_view key) {
    AssertLocked();
    auto it = s_->notify_.find(key);
    if (it == s_->notify_.end() || !IsLive(&it->second.back())) return std::nullopt;
    return ReadUint64BE(it->second.back().value);
  }
  void PutCell(std::string_view key, uint64_t, bool is_delete, std::string_view value) {
    AssertLocked();
    Put(&s_->data_, false, key, is_delete ? VersionState::kDeleted : VersionState::kLive, value);
  }
  // One commit per write: nothing to join with.
  void PutStamped(std::string_view, std::string_view stamped_key, uint64_t commit_ts,
                  std::string_view value, bool) {
    PutCell(stamped_key, commit_ts, false, value);
  }
  void PurgeCell(std::string_view key) {
    AssertLocked();
    auto it = s_->data_.find(key);
    if (it == s_->data_.end() || it->second.back().state == VersionState::kPurged) return;
    Append(&s_->data_, false, it, VersionState::kPurged, "");
  }
  void PurgeRange(std::string_view from, std::string_view end) {
    AssertLocked();
    for (auto it = s_->data_.lower_bound(from); it != s_->data_.end() && it->first < end; ++it) {
      if (it->second.back().state != VersionState::kPurged) {
        Append(&s_->data_, false, it, VersionState::kPurged, "");
      }
    }
  }
  void PutNotification(std::string_view key, uint64_t stamp) {
    AssertLocked();
    auto it = s_->notify_.find(key);
    if (it == s_->notify_.end() || !IsLive(&it->second.back())) ++s_->live_notifications_;
    std::string value;
    AppendUint64BE(&value, stamp);
    Put(&s_->notify_, true, key, VersionState::kLive, value);
  }
  void RemoveNotification(std::string_view key) {
    AssertLocked();
    auto it = s_->notify_.find(key);
    if (it == s_->notify_.end() || !IsLive(&it->second.back())) return;
    --s_->live_notifications_;
    Append(&s_->notify_, true, it, VersionState::kDeleted, "");
  }
  void PutAck(std::string_view cell_key, uint64_t) {
    AssertLocked();
    s_->ack_[std::string(cell_key)] = ts_;
  }

 private:
  // The methods above are called by commit_rules.h's templates, which cannot
  // name the store's locks; the constructor required both, and they are held
  // for as long as this object lives.
  void AssertLocked() const ASSERT_CAPABILITY(s_->mu_) ASSERT_CAPABILITY(s_->snapshots_mu_) {}

  void Put(Table* table, bool notify, std::string_view key, VersionState state,
           std::string_view value) REQUIRES(s_->mu_, s_->snapshots_mu_) {
    auto it = table->find(key);
    if (it == table->end()) {
      it = table->emplace(std::string(key), MemoryBackend::Versions{}).first;
      it->second.push_back(Version{ts_, state, std::string(value)});
      // A first version needs collecting only when it is not a live one.
      if (state != VersionState::kLive) s_->collectable_.push_back({ts_, notify, it->first});
      return;
    }
    Append(table, notify, it, state, value);
  }
  void Append(Table*, bool notify, Table::iterator it, VersionState state, std::string_view value)
      REQUIRES(s_->mu_, s_->snapshots_mu_) {
    MemoryBackend::Versions& versions = it->second;
    if (versions.back().ts == ts_) {  // written twice by one commit (a purge, then a set)
      versions.back().state = state;
      versions.back().value.assign(value);
      return;
    }
    // The version this one supersedes was readable by snapshots from its ts
    // up to now; with none of those open, nothing can read it any more.
    if (!s_->SnapshotBetweenLocked(versions.back().ts, ts_)) {
      if (versions.back().state == VersionState::kDeleted) s_->tombstones_collected_.fetch_add(1);
      versions.pop_back();
    }
    versions.push_back(Version{ts_, state, std::string(value)});
    if (versions.size() > 1 || state != VersionState::kLive) {
      s_->collectable_.push_back({ts_, notify, it->first});
    }
  }

  MemoryBackend* s_;
  uint64_t ts_;
};

// A snapshot: reads the newest version at or before its start_ts.
class MemorySnapshot final : public Snapshot {
 public:
  MemorySnapshot(std::shared_ptr<MemoryBackend> store, uint64_t start_ts)
      : Snapshot(start_ts), store_(std::move(store)) {}
  ~MemorySnapshot() override { Release(); }

  std::optional<std::string> Get(std::string_view encoded_key) override {
    CheckOpen("reading from");
    ReaderMutexLock lock(&store_->mu_);
    auto it = store_->data_.find(encoded_key);
    if (it == store_->data_.end()) return std::nullopt;
    const Version* v = VisibleAt(it->second, start_ts());
    if (!IsLive(v)) return std::nullopt;
    return v->value;
  }

  TryRead TryGet(std::string_view encoded_key, ValueView found, void* context) override {
    CheckOpen("reading from");
    if (!store_->mu_.TryLockShared()) return TryRead::kWouldBlock;
    TryRead result = TryRead::kAbsent;
    auto it = store_->data_.find(encoded_key);
    if (it != store_->data_.end()) {
      const Version* v = VisibleAt(it->second, start_ts());
      if (IsLive(v)) {
        found(context, v->value);
        result = TryRead::kFound;
      }
    }
    store_->mu_.UnlockShared();
    return result;
  }

  bool Visit(std::string_view from, bool exclusive, std::string_view end,
             const CellVisitor& visit) override {
    CheckOpen("scanning");
    // The lock is taken for kChunk cells at a time, so a long walk never
    // holds up commits for long; each chunk resumes after the last key seen.
    constexpr size_t kChunk = 4096;
    std::string resume(from);
    bool after = exclusive;
    MemoryBackend* const store = store_.get();
    for (;;) {
      ReaderMutexLock lock(&store->mu_);
      auto it = after ? store->data_.upper_bound(resume) : store->data_.lower_bound(resume);
      for (size_t seen = 0; it != store->data_.end(); ++it) {
        if (!end.empty() && std::string_view(it->first) >= end) return true;
        const Version* v = VisibleAt(it->second, start_ts());
        if (IsLive(v) && !visit(it->first, v->value)) return false;
        if (++seen == kChunk) break;
      }
      if (it == store->data_.end()) return true;
      resume = it->first;
      after = true;
    }
  }

  std::optional<uint64_t> NotificationStamp(std::string_view cell_key) override {
    CheckOpen("reading from");
    std::string row;
    if (!RowOfCellKey(cell_key, &row)) return std::nullopt;
    const std::string key = NotificationKey(RowHash(row), cell_key);
    ReaderMutexLock lock(&store_->mu_);
    auto it = store_->notify_.find(key);
    if (it == store_->notify_.end()) return std::nullopt;
    const Version* v = VisibleAt(it->second, start_ts());
    if (!IsLive(v)) return std::nullopt;
    return ReadUint64BE(v->value);
  }

  void Release() override {
    if (released_) return;
    released_ = true;
    // In a forked child the store's locks may have been held by a thread
    // that does not exist there: touch nothing.
    if (!store_->ForkedAway()) store_->ForgetSnapshot(start_ts());
  }

 private:
  void CheckOpen(const char* what) const {
    store_->CheckUsable();
    if (released_) throw Error(ErrorCode::kClosed, std::string(what) + " a released snapshot");
  }

  std::shared_ptr<MemoryBackend> store_;
  bool released_ = false;
};

// Waits for the backend's event counters to move.
class MemoryWorkWatch final : public WorkWatch {
 public:
  explicit MemoryWorkWatch(std::shared_ptr<MemoryBackend> store) : store_(std::move(store)) {
    MutexLock lock(&store_->watch_mu_);
    commits_seen_ = store_->commit_events_;
    waiters_seen_ = store_->waiter_events_;
  }

  unsigned Wait(int timeout_ms) override {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(0, timeout_ms));
    MutexLock lock(&store_->watch_mu_);
    bool woken = true;  // false once the deadline passed
    while (EventsLocked() == kTimeout && woken) {
      woken = store_->watch_cv_.WaitUntil(&store_->watch_mu_, deadline);
    }
    const unsigned e = EventsLocked();
    commits_seen_ = store_->commit_events_;
    waiters_seen_ = store_->waiter_events_;
    interrupted_ = false;
    return e;
  }

  void Interrupt() override {
    {
      MutexLock lock(&store_->watch_mu_);
      interrupted_ = true;
    }
    store_->watch_cv_.SignalAll();
  }

 private:
  unsigned EventsLocked() const REQUIRES(store_->watch_mu_) {
    unsigned e = kTimeout;
    if (store_->commit_events_ != commits_seen_) e |= kCommitted;
    if (store_->waiter_events_ != waiters_seen_) e |= kWaiterSignal;
    if (interrupted_) e |= kInterrupted;
    return e;
  }

  std::shared_ptr<MemoryBackend> store_;
  uint64_t commits_seen_ GUARDED_BY(store_->watch_mu_) = 0;
  uint64_t waiters_seen_ GUARDED_BY(store_->watch_mu_) = 0;
  bool interrupted_ GUARDED_BY(store_->watch_mu_) = false;
};

// ---------------------------------------------------------------------------

std::shared_ptr<MemoryBackend> MemoryBackend::Open(const BackendOptions& options) {
  return std::shared_ptr<MemoryBackend>(new MemoryBackend(options));
}

MemoryBackend::MemoryBackend(const BackendOptions& options)
    : options_(options),
      state_(
          "a memory store belongs to the process that opened it; a forked child cannot "
          "use it (open the store in the child, or share an lmdb store)",
          "the memory store is closed") {}

const BackendCapabilities& MemoryBackend::capabilities() const {
  static const BackendCapabilities kMemory{"memory", /*persistent=*/false,
                                           /*cross_process=*/false, /*durable=*/false,
                                           /*max_value_size=*/size_t{0xFFFFFFFF} - 64};
  return kMemory;
}

const std::string& MemoryBackend::location() const { return kLocation; }

bool MemoryBackend::ForkedAway() const { return state_.ForkedAway(); }

void MemoryBackend::CheckUsable() const { state_.Check(); }

void MemoryBackend::Close() { state_.MarkClosed(); }

std::unique_ptr<Snapshot> MemoryBackend::BeginSnapshot() {
  CheckUsable();
  // Under the shared lock, so no commit collects what this snapshot is about
  // to read between reading ts_ and registering it.
  ReaderMutexLock lock(&mu_);
  const uint64_t start_ts = ts_;
  {
    MutexLock snapshots_lock(&snapshots_mu_);
    snapshots_.insert(start_ts);
  }
  return std::make_unique<MemorySnapshot>(shared_from_this(), start_ts);
}

void MemoryBackend::ForgetSnapshot(uint64_t start_ts) {
  MutexLock lock(&snapshots_mu_);
  auto it = snapshots_.find(start_ts);
  if (it != snapshots_.end()) snapshots_.erase(it);
}

CommitResult MemoryBackend::Commit(uint64_t start_ts, std::vector<Mutation> mutations,
                                   CommitExtras extras) {
  CheckUsable();
  const bool has_extras = extras.trigger || !extras.weak_notifications.empty();
  return CommitNow(start_ts, mutations, has_extras ? &extras : nullptr);
}

void MemoryBackend::CommitAsync(uint64_t start_ts, std::vector<Mutation> mutations,
                                CommitExtras extras, CommitCallback done) {
  CommitResult result = Commit(start_ts, std::move(mutations), std::move(extras));
  done(result);
}

CommitResult MemoryBackend::CommitNow(uint64_t start_ts, const std::vector<Mutation>& mutations,
                                      const CommitExtras* extras) {
  std::vector<Notification> written;
  CommitResult result;
  {
    WriterMutexLock lock(&mu_);
    if (state_.closed()) throw Error(ErrorCode::kClosed, "committing: the memory store is closed");
    // Held with mu_ (in that order, as BeginSnapshot does): collection reads the open snapshots.
    MutexLock snapshots_lock(&snapshots_mu_);
    MemoryTables tables(this, ts_ + 1);
    result.status = ValidateCommit(tables, start_ts, mutations, extras);
    if (!result.status.ok()) {
      conflicts_.fetch_add(1);
      return result;
    }
    result.commit_ts = ++ts_;
    ApplyCommit(tables, strong_, start_ts, ts_, mutations, extras, &written);
    CollectLocked();
  }
  commits_.fetch_add(1);
  sink_.Offer(written);
  {
    MutexLock lock(&watch_mu_);
    ++commit_events_;
  }
  watch_cv_.SignalAll();
  return result;
}

bool MemoryBackend::SnapshotBetweenLocked(uint64_t from, uint64_t to) const {
  auto it = snapshots_.lower_bound(from);
  return it != snapshots_.end() && *it < to;
}

void MemoryBackend::CollectLocked() {
  const uint64_t oldest = snapshots_.empty() ? ts_ : std::min(ts_, *snapshots_.begin());
  while (!collectable_.empty() && collectable_.front().ts <= oldest) {
    Collectable& c = collectable_.front();
    CollectKey(c.notify ? &notify_ : &data_, c.key, oldest);
    collectable_.pop_front();
  }
}

void MemoryBackend::CollectKey(Table* table, const std::string& key, uint64_t oldest) {
  auto it = table->find(key);
  if (it == table->end()) return;
  Versions& versions = it->second;
  // Every reader began at or after `oldest`: of the versions at or before it,
  // only the newest can still be read.
  size_t keep_from = 0;
  for (size_t i = 0; i < versions.size(); ++i) {
    if (versions[i].ts <= oldest) keep_from = i;
  }
  if (keep_from > 0) {
    for (size_t i = 0; i < keep_from; ++i) {
      if (versions[i].state == VersionState::kDeleted) tombstones_collected_.fetch_add(1);
    }
    versions.erase(versions.begin(), versions.begin() + static_cast<ptrdiff_t>(keep_from));
  }
  // A lone tombstone or purge that every reader sees is as good as nothing:
  // no writer's snapshot predates it, so it can cause no conflict.
  if (versions.size() == 1 && versions[0].ts <= oldest &&
      versions[0].state != VersionState::kLive) {
    if (versions[0].state == VersionState::kDeleted) tombstones_collected_.fetch_add(1);
    table->erase(it);
  }
}

size_t MemoryBackend::VersionCountForTesting() const {
  ReaderMutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, versions] : data_) n += versions.size();
  for (const auto& [key, versions] : notify_) n += versions.size();
  return n;
}

std::vector<ObservedColumn> MemoryBackend::ObservedColumns() {
  CheckUsable();
  ReaderMutexLock lock(&mu_);
  std::vector<ObservedColumn> columns;
  DecodeObservedColumns(observed_, &columns);
  return columns;
}

void MemoryBackend::SetObservedColumns(const std::vector<ObservedColumn>& columns) {
  CheckUsable();
  std::string encoded = EncodeObservedColumns(columns);
  WriterMutexLock lock(&mu_);
  if (!strong_.Load(encoded)) {
    throw Error(ErrorCode::kInvalidArgument, "the observed columns cannot be stored");
  }
  observed_ = std::move(encoded);
}

uint64_t MemoryBackend::PendingNotifications() {
  CheckUsable();
  ReaderMutexLock lock(&mu_);
  return live_notifications_;
}

bool MemoryBackend::ScanNotifications(std::string_view after, size_t limit,
                                      std::vector<Notification>* out) {
  CheckUsable();
  ReaderMutexLock lock(&mu_);
  auto it = after.empty() ? notify_.begin() : notify_.upper_bound(after);
  size_t taken = 0;
  for (; it != notify_.end(); ++it) {
    const Version& newest = it->second.back();
    if (!IsLive(&newest) || it->first.size() < 8) continue;
    if (taken == limit) return false;
    out->push_back(
        Notification{it->first.substr(8), ReadUint64BE(newest.value), ReadUint64BE(it->first)});
    ++taken;
  }
  return true;
}

std::map<std::pair<std::string, std::string>, uint64_t> MemoryBackend::CountPendingByColumn() {
  CheckUsable();
  ReaderMutexLock lock(&mu_);
  std::map<std::pair<std::string, std::string>, uint64_t> counts;
  for (const auto& [key, versions] : notify_) {
    if (IsLive(&versions.back())) CountByColumn(key, &counts);
  }
  return counts;
}

void MemoryBackend::SetNotificationSink(NotificationSink* sink) {
  sink_.Set(sink, "workers are already running for this memory store (one worker pool per store)");
}

void MemoryBackend::ClearNotificationSink(NotificationSink* sink) { sink_.Clear(sink); }

std::unique_ptr<WorkWatch> MemoryBackend::WatchForWork() {
  CheckUsable();
  return std::make_unique<MemoryWorkWatch>(shared_from_this());
}

bool MemoryBackend::SignalWaiting() {
  {
    MutexLock lock(&watch_mu_);
    ++waiter_events_;
  }
  watch_cv_.SignalAll();
  return true;
}

BackendStats MemoryBackend::Stats() const {
  BackendStats s;
  s.commits = commits_.load();
  s.conflicts = conflicts_.load();
  s.batches = commits_.load();
  s.tombstones_collected = tombstones_collected_.load();
  return s;
}

std::vector<std::string> MemoryBackend::VerifyStructure() {
  CheckUsable();
  return {};  // its tables are this process's own maps: nothing on disk to damage
}

}  // namespace percolite
