// pg_backend.cc: the postgresql handle: opening and closing it, snapshots
// and their reads, and what is read outside snapshots (pg_backend.h).
#include "pg_backend.h"

#include <algorithm>
#include <map>
#include <random>
#include <utility>

#include "commit_rules.h"
#include "percolite/encoding.h"

namespace percolite {
namespace {

class PgSnapshot final : public Snapshot {
 public:
  PgSnapshot(std::shared_ptr<PgBackend> store, uint64_t start_ts)
      : Snapshot(start_ts), store_(std::move(store)), sql_(store_->sql()) {}
  ~PgSnapshot() override { Release(); }

  std::optional<std::string> Get(std::string_view encoded_key) override {
    CheckOpen("reading from");
    std::optional<std::string> value;
    if (!ReadAhead(encoded_key, &value)) {
      PgParams params;
      params.Bytes(encoded_key).Int8(start_ts());
      PgResult r = store_->Query(sql_.get, params, "reading a cell");
      if (r.rows() > 0 && r.int2(0, 0) == kPgLive) value.emplace(r.bytes(0, 1));
    }
    last_get_.assign(encoded_key);
    return value;
  }

  bool Visit(std::string_view from, bool exclusive, std::string_view end,
             const CellVisitor& visit) override {
    CheckOpen("scanning");
    std::string resume(from);
    bool after = exclusive;
    size_t page = 128;
    for (;;) {
      PgParams params;
      params.Bytes(resume).Int8(start_ts()).Int8(page);
      if (!end.empty()) params.Bytes(end);
      PgResult rows = store_->Query(sql_.visit[after][!end.empty()], params, "scanning cells");
      const int n = rows.rows();
      for (int i = 0; i < n; ++i) {
        if (rows.int2(i, 1) != kPgLive) continue;
        if (!visit(rows.bytes(i, 0), rows.bytes(i, 2))) return false;
      }
      if (static_cast<size_t>(n) < page) return true;
      resume.assign(rows.bytes(n - 1, 0));
      after = true;
      page = std::min<size_t>(page * 4, 8192);
    }
  }

  std::optional<uint64_t> NotificationStamp(std::string_view cell_key) override {
    CheckOpen("reading from");
    std::string row;
    if (!RowOfCellKey(cell_key, &row)) return std::nullopt;
    PgParams params;
    params.Bytes(NotificationKey(RowHash(row), cell_key));
    PgResult r = store_->Query(sql_.notification_stamp, params, "reading a notification");
    if (r.rows() == 0) return std::nullopt;
    const uint64_t stamp = r.int8(0, 0);
    if (stamp > start_ts()) return std::nullopt;
    return stamp;
  }

  void Release() override {
    if (released_) return;
    released_ = true;
    if (!store_->ForkedAway()) store_->ForgetSnapshot(start_ts());
  }

 private:
  void CheckOpen(const char* what) const {
    store_->CheckUsable();
    if (released_) throw Error(ErrorCode::kClosed, std::string(what) + " a released snapshot");
  }

  // Gets in ascending key order (a fold reading the current value of each
  // key it folds, keys in order) cost a round trip each: after two of them,
  // the versions from the key on, up to the end of the two keys' common
  // prefix, are read in one statement, and the Gets they cover answered from
  // them (a snapshot's reads never change). The read grows while its rows
  // are used and stops when they are not, so what it reads in vain stays a
  // fraction of what is used. True when *value was found this way.
  bool ReadAhead(std::string_view key, std::optional<std::string>* value) {
    if (Covered(key)) {
      ++ahead_used_;
      auto it = ahead_.find(key);
      if (it != ahead_.end()) *value = it->second;
      return true;
    }
    if (last_get_.empty() || !(std::string_view(last_get_) < key)) return false;
    size_t common = 0;
    while (common < last_get_.size() && common < key.size() && last_get_[common] == key[common]) {
      ++common;
    }
    const std::string end = PrefixSuccessor(key.substr(0, common));
    if (end.empty()) return false;
    const bool first = ahead_end_.empty();
    const bool used = ahead_used_ > 0;
    ahead_.clear();
    ahead_from_.clear();
    ahead_end_.clear();
    ahead_used_ = 0;
    if (!first && !used) {
      ahead_size_ = kFirstReadAhead;
      return false;  // the last read went unused: this Get alone
    }
    ahead_size_ = first ? kFirstReadAhead : std::min(ahead_size_ * 4, kMaxReadAhead);
    PgParams params;
    params.Bytes(key).Int8(start_ts()).Int8(ahead_size_).Bytes(end);
    PgResult rows = store_->Query(sql_.visit[0][1], params, "reading cells");
    const int n = rows.rows();
    for (int i = 0; i < n; ++i) {
      std::optional<std::string>& slot = ahead_[std::string(rows.bytes(i, 0))];
      if (rows.int2(i, 1) == kPgLive) slot.emplace(rows.bytes(i, 2));
    }
    ahead_from_.assign(key);
    if (static_cast<size_t>(n) < ahead_size_) {
      ahead_end_ = end;  // every key up to the end was read
    } else {
      ahead_end_ = std::string(rows.bytes(n - 1, 0));
      ahead_end_.push_back('\0');  // the smallest key after the last one read
    }
    auto it = ahead_.find(key);
    if (it != ahead_.end()) *value = it->second;
    return true;
  }
  bool Covered(std::string_view key) const {
    return !ahead_end_.empty() && std::string_view(ahead_from_) <= key &&
           key < std::string_view(ahead_end_);
  }

  static constexpr size_t kFirstReadAhead = 16;
  static constexpr size_t kMaxReadAhead = 1024;

  std::shared_ptr<PgBackend> store_;
  const PgStatements& sql_;  // the store's, built once
  bool released_ = false;
  std::string last_get_;  // the key of the last Get
  // The versions read ahead: every key in [ahead_from_, ahead_end_) is in
  // ahead_ (nullopt: a tombstone) or has no version this snapshot sees.
  std::map<std::string, std::optional<std::string>, std::less<>> ahead_;
  std::string ahead_from_, ahead_end_;
  size_t ahead_size_ = 0;  // rows asked for by the last read
  size_t ahead_used_ = 0;  // Gets it answered
};

}  // namespace

std::shared_ptr<PgBackend> PgBackend::Open(const std::string& target,
                                           const BackendOptions& options) {
  if (options.restored) {
    throw Error(ErrorCode::kInvalidArgument,
                "restored=True is for lmdb stores (a data file put back from a copy); a "
                "postgresql store's backups and restores are the server's");
  }
  std::shared_ptr<PgBackend> backend(new PgBackend(ParsePgTarget(target), options));
  {
    PgPool::Lease lease = backend->pool_.Borrow();
    backend->CreateOrCheckSchema(lease.get(), options.create);
  }
  backend->AdoptWriter(backend->Connect());
  backend->Heartbeat();
  backend->writer_ = std::thread([raw = backend.get()] { raw->WriterLoop(); });
  return backend;
}

PgBackend::PgBackend(PgTarget target, const BackendOptions& options)
    : target_(std::move(target)),
      options_(options),
      state_(
          "a postgresql store handle belongs to the process that opened it; a forked "
          "child must open the store again",
          "the postgresql store is closed"),
      sql_(target_.schema, kHandleLeaseSeconds),
      pool_(target_, options_.sync, state_, kPoolSize) {
  std::random_device random;
  for (int i = 0; i < 4; ++i) AppendUint64BE(&handle_id_, (uint64_t{random()} << 32) | random());
}

PgBackend::~PgBackend() {
  if (ForkedAway()) {
    // The writer thread does not exist here, and the connections are the
    // parent's: leave everything as it is.
    if (writer_.joinable()) writer_.detach();
    return;
  }
  Close();
}

const BackendCapabilities& PgBackend::capabilities() const {
  static const BackendCapabilities kPostgres{"postgresql", /*persistent=*/true,
                                             /*cross_process=*/true, /*durable=*/true,
                                             /*max_value_size=*/(size_t{1} << 30) - 64};
  return kPostgres;
}

bool PgBackend::ForkedAway() const { return state_.ForkedAway(); }

void PgBackend::CheckUsable() const { state_.Check(); }

void PgBackend::Fail(const std::string& why) { state_.Fail(ErrorCode::kStorage, why); }

void PgBackend::Close() {
  if (ForkedAway()) return;
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  queued_.SignalAll();
  if (writer_.joinable()) writer_.join();  // drains the queue first
  state_.MarkClosed();
  if (writer_conn_ != nullptr && PQstatus(writer_conn_) == CONNECTION_OK) {
    try {
      PgParams p;
      p.Bytes(handle_id_);
      PgExec(writer_conn_, sql_.forget_handle, p, "closing", target_);
    } catch (const Error&) {
      // Its row lapses by itself.
    }
  }
  PQfinish(writer_conn_);
  writer_conn_ = nullptr;
  pool_.Close();
}

// ---------------------------------------------------------------------------

std::unique_ptr<Snapshot> PgBackend::BeginSnapshot() {
  CheckUsable();
  {
    MutexLock lock(&snapshots_mu_);
    ++beginning_;
  }
  uint64_t start_ts = 0;
  try {
    start_ts = Query(sql_.read_clock, PgParams(), "beginning a snapshot").int8(0, 0);
  } catch (...) {
    MutexLock lock(&snapshots_mu_);
    --beginning_;
    throw;
  }
  {
    MutexLock lock(&snapshots_mu_);
    --beginning_;
    snapshots_.insert(start_ts);
  }
  return std::make_unique<PgSnapshot>(shared_from_this(), start_ts);
}

void PgBackend::ForgetSnapshot(uint64_t start_ts) {
  MutexLock lock(&snapshots_mu_);
  auto it = snapshots_.find(start_ts);
  if (it != snapshots_.end()) snapshots_.erase(it);
}

// ---------------------------------------------------------------------------

std::vector<ObservedColumn> PgBackend::ObservedColumns() {
  CheckUsable();
  PgResult r = Query(sql_.read_observed, PgParams(), "reading the observed columns");
  std::vector<ObservedColumn> columns;
  if (r.rows() > 0 && !DecodeObservedColumns(r.bytes(0, 0), &columns)) {
    throw Error(ErrorCode::kCorruption, "the store's observed columns cannot be read");
  }
  return columns;
}

void PgBackend::SetObservedColumns(const std::vector<ObservedColumn>& columns) {
  CheckUsable();
  const std::string encoded = EncodeObservedColumns(columns);
  StrongColumns check;
  if (!check.Load(encoded)) {
    throw Error(ErrorCode::kInvalidArgument, "the observed columns cannot be stored");
  }
  PgParams p;
  p.Bytes(encoded);
  Query(sql_.write_observed, p, "storing the observed columns");
}

uint64_t PgBackend::PendingNotifications() {
  CheckUsable();
  return Query(sql_.count_notifications, PgParams(), "counting notifications").int8(0, 0);
}

bool PgBackend::ScanNotifications(std::string_view after, size_t limit,
                                  std::vector<Notification>* out) {
  CheckUsable();
  limit = std::min<size_t>(limit, size_t{1} << 62);  // SIZE_MAX: everything
  PgParams p;
  p.Bytes(after).Int8(limit + 1);
  PgResult r = Query(sql_.scan_notifications, p, "scanning notifications");
  const size_t n = static_cast<size_t>(r.rows());
  for (size_t i = 0; i < std::min(n, limit); ++i) {
    const std::string_view key = r.bytes(static_cast<int>(i), 0);
    if (key.size() < 8) continue;
    out->push_back(Notification{std::string(key.substr(8)), r.int8(static_cast<int>(i), 1),
                                ReadUint64BE(key)});
  }
  return n <= limit;
}

std::map<std::pair<std::string, std::string>, uint64_t> PgBackend::CountPendingByColumn() {
  CheckUsable();
  PgResult r = Query(sql_.notification_keys, PgParams(), "counting notifications");
  std::map<std::pair<std::string, std::string>, uint64_t> counts;
  for (int i = 0; i < r.rows(); ++i) CountByColumn(r.bytes(i, 0), &counts);
  return counts;
}

void PgBackend::SetNotificationSink(NotificationSink* sink) {
  sink_.Set(sink, "workers are already running on this store handle (one worker pool per handle)");
}

void PgBackend::ClearNotificationSink(NotificationSink* sink) { sink_.Clear(sink); }

Backend::StandbyWaits PgBackend::WaitingForStandbys() {
  CheckUsable();
  const PgResult r = Query(sql_.standby_waits, PgParams(), "reading the sessions that wait");
  StandbyWaits waits;
  waits.sessions = r.int8(0, 0);
  waits.longest_seconds = static_cast<double>(r.int8(0, 1)) / 1000;
  return waits;
}

BackendStats PgBackend::Stats() const {
  BackendStats s;
  s.commits = commits_.load();
  s.conflicts = conflicts_.load();
  s.batches = batches_.load();
  s.tombstones_collected = tombstones_collected_.load();
  MutexLock lock(&link_mu_);
  s.server = link_.server;
  s.reconnections = link_.reconnections;
  s.last_reconnection_cause = link_.last_reconnection_cause;
  s.last_reconnection_unix = link_.last_reconnection_unix;
  s.failovers = link_.failovers;
  s.last_failover = link_.last_failover;
  s.last_failover_unix = link_.last_failover_unix;
  s.clock_offset_seconds = clock_offset_.load();
  s.replication = link_.replication;
  s.synchronous_standby_names = link_.synchronous_standby_names;
  s.standbys = link_.standbys;
  const double since = batch_since_.load();
  if (since > 0) s.writer_busy_seconds = std::max(0.0, Backend::NowUnix() - since);
  return s;
}

}  // namespace percolite
