#include "percolite/transaction.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

namespace percolite {

ScanRange ScanRange::RowPrefix(std::string_view prefix) {
  ScanRange range;
  range.from = EncodeRowPrefix(prefix);
  range.end = PrefixSuccessor(range.from);
  return range;
}

ScanRange ScanRange::Rows(std::string_view start_row, std::optional<std::string_view> end_row) {
  ScanRange range;
  range.from = EncodeRowStart(start_row);
  if (end_row) range.end = EncodeRowStart(*end_row);
  return range;
}

Transaction::Transaction(std::shared_ptr<TransactionSource> source,
                         std::unique_ptr<Snapshot> snapshot)
    : source_(source), snapshot_(std::move(snapshot)), start_ts_(snapshot_->start_ts()) {}

Transaction::~Transaction() {
  {
    MutexLock lock(&mu_);
    if (state_ == State::kActive) ReleaseLocked(State::kAborted);
  }
  if (auto source = source_.lock()) source->Forget(this);
}

Transaction::State Transaction::state() const {
  MutexLock lock(&mu_);
  return state_;
}

std::optional<uint64_t> Transaction::commit_ts() const {
  MutexLock lock(&mu_);
  return commit_ts_;
}

void Transaction::ValidateCell(const CellRef& cell) {
  if (cell.row.empty()) throw Error(ErrorCode::kInvalidArgument, "row must not be empty");
  if (cell.family.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "column family must not be empty");
  }
}

void Transaction::CheckActive() const {
  if (source_closed_) throw Error(ErrorCode::kClosed, "the transaction's store was closed");
  if (state_ == State::kCommitted) {
    throw Error(ErrorCode::kWrongState, "the transaction was already committed");
  }
  if (state_ == State::kAborted) {
    throw Error(ErrorCode::kWrongState, "the transaction was already aborted");
  }
  if (state_ == State::kCommitting) {
    throw Error(ErrorCode::kWrongState, "the transaction's commit was already submitted");
  }
}

void Transaction::ReleaseLocked(State s) {
  state_ = s;
  writes_.clear();
  stamped_.clear();
  purged_.clear();
  extras_ = CommitExtras();
  if (snapshot_) snapshot_->Release();
  snapshot_.reset();
}

std::optional<std::string> Transaction::Get(const CellRef& cell) {
  ValidateCell(cell);
  std::string key = EncodeCellKey(cell);
  MutexLock lock(&mu_);
  CheckActive();
  auto it = writes_.find(key);
  if (it != writes_.end()) {
    if (it->second.is_delete) return std::nullopt;
    return it->second.value;
  }
  if (!purged_.empty() && Purged(key)) return std::nullopt;
  return snapshot_->Get(key);
}

Snapshot::TryRead Transaction::TryGet(const CellRef& cell, Snapshot::ValueView found,
                                      void* context) {
  ValidateCell(cell);
  // One key buffer per thread: a look-up allocates nothing for its key.
  thread_local std::string key;
  key.clear();
  for (std::string_view part : {cell.row, cell.family, cell.qualifier})
    AppendEscapedPart(&key, part);
  if (!mu_.TryLock()) return Snapshot::TryRead::kWouldBlock;
  try {
    CheckActive();
    Snapshot::TryRead result;
    auto it = writes_.empty() ? writes_.end() : writes_.find(key);
    if (it != writes_.end()) {
      result = it->second.is_delete ? Snapshot::TryRead::kAbsent : Snapshot::TryRead::kFound;
      if (!it->second.is_delete) found(context, it->second.value);
    } else if (!purged_.empty() && Purged(key)) {
      result = Snapshot::TryRead::kAbsent;
    } else {
      result = snapshot_->TryGet(key, found, context);
    }
    mu_.Unlock();
    return result;
  } catch (...) {
    mu_.Unlock();
    throw;
  }
}

void Transaction::Set(const CellRef& cell, std::string_view value) {
  ValidateCell(cell);
  std::string key = EncodeCellKey(cell);
  MutexLock lock(&mu_);
  CheckActive();
  writes_[std::move(key)] = BufferedWrite{false, std::string(value)};
}

void Transaction::Delete(const CellRef& cell) {
  ValidateCell(cell);
  std::string key = EncodeCellKey(cell);
  MutexLock lock(&mu_);
  CheckActive();
  writes_[std::move(key)] = BufferedWrite{true, std::string()};
}

void Transaction::Purge(const CellRef& cell) {
  ValidateCell(cell);
  std::string key = EncodeCellKey(cell);
  MutexLock lock(&mu_);
  CheckActive();
  writes_[std::move(key)] = BufferedWrite{true, std::string(), true};
}

namespace {

// The stamp after `stamp` (a big-endian counter); false when there is none.
bool NextStamp(std::string* stamp) {
  for (size_t i = stamp->size(); i-- > 0;) {
    unsigned char byte = static_cast<unsigned char>((*stamp)[i]);
    (*stamp)[i] = static_cast<char>(byte + 1);
    if (byte != 0xFF) return true;
  }
  return false;
}

}  // namespace

void Transaction::PurgeStamps(std::string_view row, std::string_view family,
                              std::string_view first_stamp, std::string_view last_stamp) {
  ValidateCell({row, family, {}});
  if (first_stamp.size() != kStampSize || last_stamp.size() != kStampSize) {
    throw Error(ErrorCode::kInvalidArgument, "a stamp is " + std::to_string(kStampSize) + " bytes");
  }
  if (first_stamp > last_stamp) {
    throw Error(ErrorCode::kInvalidArgument, "the first stamp of a purge is after the last");
  }
  std::string from = EncodeCellKey({row, family, first_stamp});
  std::string after(last_stamp);
  std::string end;
  if (NextStamp(&after)) {
    end = EncodeCellKey({row, family, after});
  } else {  // the largest stamp: to the end of the column family
    AppendEscapedPart(&end, row);
    AppendEscapedPart(&end, family);
    end = PrefixSuccessor(end);
  }
  MutexLock lock(&mu_);
  CheckActive();
  purged_.emplace_back(std::move(from), std::move(end));
}

bool Transaction::Purged(std::string_view key) const {
  for (const auto& [from, end] : purged_) {
    if (from <= key && key < end) return true;
  }
  return false;
}

void Transaction::AddStamped(const CellRef& cell, std::string_view value, bool joinable) {
  ValidateCell(cell);
  std::string key = EncodeCellKey(cell);
  MutexLock lock(&mu_);
  CheckActive();
  Mutation m;
  m.key = std::move(key);
  m.value.assign(value);
  m.stamped = true;
  m.stamp_seq = static_cast<uint32_t>(stamped_.size());
  m.joinable = joinable;
  stamped_.push_back(std::move(m));
}

struct Transaction::Savepoint::State {
  std::map<std::string, BufferedWrite> writes;
  size_t stamped = 0;
  std::vector<std::pair<std::string, std::string>> purged;
  std::vector<std::string> weak_notifications;
};

Transaction::Savepoint Transaction::Save() const {
  MutexLock lock(&mu_);
  CheckActive();
  auto state = std::make_shared<Savepoint::State>();
  state->writes = writes_;
  state->stamped = stamped_.size();
  state->purged = purged_;
  state->weak_notifications = extras_.weak_notifications;
  Savepoint savepoint;
  savepoint.state_ = std::move(state);
  return savepoint;
}

void Transaction::RollbackTo(const Savepoint& savepoint) {
  if (!savepoint.state_) throw Error(ErrorCode::kInvalidArgument, "an empty savepoint");
  MutexLock lock(&mu_);
  CheckActive();
  const Savepoint::State& state = *savepoint.state_;
  if (state.stamped > stamped_.size()) {
    throw Error(ErrorCode::kInvalidArgument, "a savepoint of another transaction");
  }
  writes_ = state.writes;
  stamped_.resize(state.stamped);
  purged_ = state.purged;
  extras_.weak_notifications = state.weak_notifications;
}

size_t Transaction::StampedCount() const {
  MutexLock lock(&mu_);
  return stamped_.size();
}

void Transaction::SetWeakNotification(const CellRef& cell) {
  ValidateCell(cell);
  std::string key = EncodeCellKey(cell);
  MutexLock lock(&mu_);
  CheckActive();
  for (const std::string& existing : extras_.weak_notifications) {
    if (existing == key) return;
  }
  extras_.weak_notifications.push_back(std::move(key));
}

void Transaction::SetTrigger(std::string cell_key) {
  MutexLock lock(&mu_);
  CheckActive();
  extras_.trigger = std::move(cell_key);
  observer_run_.store(true, std::memory_order_relaxed);
}

void Transaction::DeferTrigger(double seconds) {
  MutexLock lock(&mu_);
  CheckActive();
  if (!extras_.trigger) {
    throw Error(ErrorCode::kWrongState, "only an observer run can be deferred");
  }
  if (!(seconds > 0)) throw Error(ErrorCode::kInvalidArgument, "a deferral needs seconds > 0");
  deferred_seconds_ = std::max(deferred_seconds_, seconds);
}

double Transaction::DeferredSeconds() const {
  MutexLock lock(&mu_);
  return deferred_seconds_;
}

void Transaction::SetHurried() {
  MutexLock lock(&mu_);
  hurried_ = true;
}

bool Transaction::Hurried() const {
  MutexLock lock(&mu_);
  return hurried_;
}

bool Transaction::NotificationPending(const std::string& cell_key) {
  MutexLock lock(&mu_);
  CheckActive();
  return snapshot_->NotificationStamp(cell_key).has_value();
}

ScanChunk Transaction::Scan(const ScanRange& range, const std::string* resume_after, size_t limit) {
  if (limit == 0) limit = 1;
  MutexLock lock(&mu_);
  CheckActive();
  const std::string& from = resume_after ? *resume_after : range.from;
  const bool exclusive = resume_after != nullptr;

  std::vector<std::pair<std::string, std::string>> snap;
  const bool snap_done = snapshot_->Scan(from, exclusive, range.end, limit, &snap);

  std::set<std::pair<std::string_view, std::string_view>> wanted;
  for (const auto& [family, qualifier] : range.columns) wanted.emplace(family, qualifier);

  ScanChunk chunk;
  auto emit = [&](const std::string& key, const std::string& value) {
    Cell cell;
    if (!DecodeCellKey(key, &cell)) return;  // not a cell key: internal data
    if (!wanted.empty() && !wanted.count({cell.family, cell.qualifier})) return;
    chunk.items.push_back(ScanItem{std::move(cell), value});
  };
  // Own writes inside the window the snapshot part covers win over the snapshot.
  auto it = exclusive ? writes_.upper_bound(from) : writes_.lower_bound(from);
  auto in_window = [&](const std::string& key) {
    if (!snap_done) return key <= snap.back().first;
    return range.end.empty() || key < range.end;
  };
  size_t i = 0;
  bool stopped_early = false;
  for (;;) {
    if (chunk.items.size() == limit) {
      stopped_early = true;
      break;
    }
    const bool have_snap = i < snap.size();
    const bool have_own = it != writes_.end() && in_window(it->first);
    if (!have_snap && !have_own) break;
    if (have_own && (!have_snap || it->first <= snap[i].first)) {
      if (have_snap && it->first == snap[i].first) ++i;
      if (!it->second.is_delete) emit(it->first, it->second.value);
      chunk.resume_after = it->first;
      ++it;
    } else {
      if (purged_.empty() || !Purged(snap[i].first)) emit(snap[i].first, snap[i].second);
      chunk.resume_after = snap[i].first;
      ++i;
    }
  }
  chunk.done = snap_done && !stopped_early;
  return chunk;
}

namespace {

// Appends the row, family and qualifier of cell key `key` to *bytes, decoded,
// and their lengths to *sizes. False, with nothing appended, when `key` is not
// a cell key.
bool AppendCellParts(std::string_view key, std::string* bytes, std::vector<size_t>* sizes) {
  size_t parts[3];
  if (!CellKeyParts(key, &parts)) return false;
  for (int i = 0; i < 3; ++i) {
    // A part's escaped bytes, less its two-byte terminator.
    const size_t end = (i < 2 ? parts[i + 1] : key.size()) - 2;
    std::string_view part = key.substr(parts[i], end - parts[i]);
    const size_t before = bytes->size();
    for (;;) {  // a zero byte is stored as 0x00 0xFF: keep the zero only
      const void* zero = std::memchr(part.data(), '\0', part.size());
      if (zero == nullptr) {
        bytes->append(part);
        break;
      }
      const size_t at = static_cast<size_t>(static_cast<const char*>(zero) - part.data());
      bytes->append(part.data(), at + 1);
      part.remove_prefix(at + 2);
    }
    sizes->push_back(bytes->size() - before);
  }
  return true;
}

}  // namespace

void Transaction::ScanPacked(const ScanRange& range, const std::string* resume_after, size_t limit,
                             PackedCells* out) {
  if (limit == 0) limit = 1;
  out->bytes.clear();
  out->sizes.clear();
  out->resume_after.clear();
  std::set<std::pair<std::string_view, std::string_view>> wanted;
  for (const auto& [family, qualifier] : range.columns) wanted.emplace(family, qualifier);
  ScanRange bounds;  // Visit takes no columns: they are filtered here
  bounds.from = range.from;
  bounds.end = range.end;
  size_t looked_at = 0;
  const bool exhausted =
      Visit(bounds, resume_after, [&](std::string_view key, std::string_view value) {
        const size_t bytes_before = out->bytes.size();
        if (AppendCellParts(key, &out->bytes, &out->sizes)) {
          const size_t* part = &out->sizes[out->sizes.size() - 3];
          const std::string_view family(out->bytes.data() + bytes_before + part[0], part[1]);
          const std::string_view qualifier(family.data() + part[1], part[2]);
          if (wanted.empty() || wanted.count({family, qualifier})) {
            out->bytes.append(value);
            out->sizes.push_back(value.size());
          } else {
            out->bytes.resize(bytes_before);
            out->sizes.resize(out->sizes.size() - 3);
          }
        }  // else not a cell key: internal data
        if (++looked_at < limit) return true;
        out->resume_after.assign(key);
        return false;
      });
  out->done = exhausted;
}

bool Transaction::Visit(const ScanRange& range, const std::string* resume_after,
                        const Snapshot::CellVisitor& visit) {
  if (!range.columns.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "visiting cells by column is not supported");
  }
  MutexLock lock(&mu_);
  CheckActive();
  const std::string& from = resume_after ? *resume_after : range.from;
  const bool exclusive = resume_after != nullptr;
  // Own writes merge in as in Scan: before, or instead of, the snapshot's cell.
  auto own = exclusive ? writes_.upper_bound(from) : writes_.lower_bound(from);
  // Both lambdas run inside snapshot_->Visit, before it returns: under `lock`.
  auto own_before = [&](std::string_view key) {  // emits own writes below `key`
    mu_.AssertHeld();
    for (; own != writes_.end() && std::string_view(own->first) < key; ++own) {
      if (!range.end.empty() && own->first >= range.end) return true;
      if (!own->second.is_delete && !visit(own->first, own->second.value)) return false;
    }
    return true;
  };
  bool stopped = false;
  const bool exhausted = snapshot_->Visit(from, exclusive, range.end,
                                          [&](std::string_view key, std::string_view value) {
                                            mu_.AssertHeld();
                                            if (!own_before(key)) {
                                              stopped = true;
                                              return false;
                                            }
                                            if (own != writes_.end() && own->first == key) {
                                              const BufferedWrite& write = (own++)->second;
                                              if (write.is_delete) return true;
                                              if (!visit(key, write.value)) {
                                                stopped = true;
                                                return false;
                                              }
                                              return true;
                                            }
                                            if (!purged_.empty() && Purged(key)) return true;
                                            if (!visit(key, value)) {
                                              stopped = true;
                                              return false;
                                            }
                                            return true;
                                          });
  if (stopped || !exhausted) return false;
  for (; own != writes_.end() && (range.end.empty() || own->first < range.end); ++own) {
    if (!own->second.is_delete && !visit(own->first, own->second.value)) return false;
  }
  return true;
}

size_t Transaction::Count(const ScanRange& range, const std::string* resume_after, size_t limit) {
  if (!range.columns.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "counting cells by column is not supported");
  }
  {
    MutexLock lock(&mu_);
    CheckActive();
    const std::string& from = resume_after ? *resume_after : range.from;
    auto own = resume_after ? writes_.upper_bound(from) : writes_.lower_bound(from);
    const bool own_in_range = own != writes_.end() && (range.end.empty() || own->first < range.end);
    if (!own_in_range && purged_.empty())
      return snapshot_->Count(from, resume_after != nullptr, range.end, limit);
  }
  // Own writes in the range, or purged ranges: count what Scan merges.
  size_t counted = 0;
  std::string resume;
  const std::string* after = resume_after;
  while (counted < limit) {
    ScanChunk chunk = Scan(range, after, std::min<size_t>(limit - counted, 1024));
    counted += chunk.items.size();
    if (chunk.done) break;
    resume = std::move(chunk.resume_after);
    after = &resume;
  }
  return counted;
}

bool Transaction::HasWritesLocked() const {
  return !writes_.empty() || !stamped_.empty() || !purged_.empty() || extras_.trigger ||
         !extras_.weak_notifications.empty();
}

std::vector<Mutation> Transaction::TakeMutationsLocked() {
  // The writes move into the mutations (keys and values are not copied).
  std::vector<Mutation> mutations;
  mutations.reserve(purged_.size() + writes_.size() + stamped_.size());
  for (auto& [from, end] : purged_) {  // first: the other writes win over a purge
    Mutation m;
    m.key = std::move(from);
    m.purge = true;
    m.purge_end = std::move(end);
    mutations.push_back(std::move(m));
  }
  while (!writes_.empty()) {
    auto node = writes_.extract(writes_.begin());
    BufferedWrite& write = node.mapped();
    Mutation m;
    m.key = std::move(node.key());
    m.is_delete = write.is_delete;
    m.value = std::move(write.value);
    m.purge = write.purge;
    mutations.push_back(std::move(m));
  }
  for (Mutation& m : stamped_) mutations.push_back(std::move(m));
  return mutations;
}

std::shared_ptr<Backend> Transaction::BackendLocked() const {
  std::shared_ptr<TransactionSource> source = source_.lock();
  if (!source) throw Error(ErrorCode::kClosed, "the transaction's store was closed");
  return source->backend();
}

void Transaction::AfterCommit(std::function<void()> fn) {
  MutexLock lock(&mu_);
  CheckActive();
  after_commit_.push_back(std::move(fn));
}

void Transaction::CountWrite(std::string_view kind, std::string_view name, uint64_t n) {
  // Only observer runs feed the graph: any other transaction (a loader's, an
  // adder's) pays one load here, no lock and no string.
  if (!observer_run_.load(std::memory_order_relaxed)) return;
  MutexLock lock(&mu_);
  // A handful of targets per run: a linear search, comparing in place.
  const size_t size = kind.size() + 1 + name.size();
  for (auto& [target, count] : write_counts_) {
    const std::string_view t(target);
    if (t.size() == size && t.substr(0, kind.size()) == kind && t.substr(kind.size() + 1) == name) {
      count += n;
      return;
    }
  }
  std::string target;
  target.reserve(size);
  target.append(kind).append(1, ':').append(name);
  write_counts_.emplace_back(std::move(target), n);
}

std::vector<std::pair<std::string, uint64_t>> Transaction::WriteCounts() const {
  MutexLock lock(&mu_);
  return write_counts_;
}

void Transaction::Commit() {
  std::vector<std::function<void()>> after;
  {
    MutexLock lock(&mu_);
    CommitLocked();
    after.swap(after_commit_);
  }
  for (auto& fn : after) fn();
}

void Transaction::CommitLocked() {
  CheckActive();
  if (!HasWritesLocked()) {
    ReleaseLocked(State::kCommitted);
    return;
  }
  std::shared_ptr<Backend> backend = BackendLocked();
  // From here on the transaction ends aborted unless the commit succeeds.
  CommitResult result;
  const auto began = std::chrono::steady_clock::now();
  try {
    result = backend->Commit(start_ts_, TakeMutationsLocked(), std::move(extras_));
  } catch (...) {
    ReleaseLocked(State::kAborted);
    throw;
  }
  if (!result.status.ok()) {
    ReleaseLocked(State::kAborted);
    result.status.ThrowIfError();
  }
  backend->commit_latency().Record(std::chrono::steady_clock::now() - began);
  commit_ts_ = result.commit_ts;
  ReleaseLocked(State::kCommitted);
}

void Transaction::CommitAsync(CommitCallback done) {
  std::shared_ptr<Backend> backend;
  std::vector<Mutation> mutations;
  CommitExtras extras;
  {
    MutexLock lock(&mu_);
    CheckActive();
    if (!HasWritesLocked()) {
      ReleaseLocked(State::kCommitted);
    } else {
      backend = BackendLocked();
      mutations = TakeMutationsLocked();
      extras = std::move(extras_);
      ReleaseLocked(State::kCommitting);
    }
  }
  if (!backend) {  // nothing to write: committed without touching the store
    std::vector<std::function<void()>> after;
    {
      MutexLock lock(&mu_);
      after.swap(after_commit_);
    }
    for (auto& fn : after) fn();
    done(CommitResult{});
    return;
  }
  std::shared_ptr<Transaction> self = shared_from_this();
  // The backend calls `finish`, so its histogram outlives the call (a
  // pointer, not the shared_ptr: the backend must not own itself).
  auto finish = [self, latency = &backend->commit_latency(),
                 began = std::chrono::steady_clock::now(),
                 done = std::move(done)](const CommitResult& result) {
    if (result.status.ok()) latency->Record(std::chrono::steady_clock::now() - began);
    std::vector<std::function<void()>> after;
    {
      MutexLock lock(&self->mu_);
      if (result.status.ok()) self->commit_ts_ = result.commit_ts;
      self->state_ = result.status.ok() ? State::kCommitted : State::kAborted;
      after.swap(self->after_commit_);
    }
    if (result.status.ok()) {
      for (auto& fn : after) fn();
    }
    done(result);
  };
  try {
    backend->CommitAsync(start_ts_, std::move(mutations), std::move(extras), std::move(finish));
  } catch (...) {  // refused before it was queued: nothing was written
    MutexLock lock(&mu_);
    state_ = State::kAborted;
    throw;
  }
}

void Transaction::Abort() {
  MutexLock lock(&mu_);
  if (state_ == State::kActive) ReleaseLocked(State::kAborted);
}

void Transaction::AbortFromClose() {
  MutexLock lock(&mu_);
  source_closed_ = true;
  if (state_ == State::kActive) ReleaseLocked(State::kClosed);
}

// ---------------------------------------------------------------------------

TransactionSource::TransactionSource(std::shared_ptr<Backend> backend)
    : location_(backend->location()), backend_(std::move(backend)) {}

Error TransactionSource::ClosedError() const {
  return Error(ErrorCode::kClosed, "store '" + location_ + "' is closed");
}

std::shared_ptr<Backend> TransactionSource::backend() const {
  MutexLock lock(&mu_);
  if (backend_ == nullptr) throw ClosedError();
  backend_->CheckUsable();
  return backend_;
}

bool TransactionSource::closed() const {
  MutexLock lock(&mu_);
  return backend_ == nullptr;
}

std::shared_ptr<Transaction> TransactionSource::Begin() {
  std::shared_ptr<Backend> backend = this->backend();
  std::shared_ptr<Transaction> transaction(
      new Transaction(shared_from_this(), backend->BeginSnapshot()));
  MutexLock lock(&mu_);
  if (backend_ == nullptr) throw ClosedError();
  active_.emplace(transaction.get(), transaction);
  return transaction;
}

void TransactionSource::Forget(Transaction* transaction) {
  MutexLock lock(&mu_);
  active_.erase(transaction);
}

std::shared_ptr<Backend> TransactionSource::Close() {
  std::shared_ptr<Backend> backend;
  std::vector<std::shared_ptr<Transaction>> active;
  {
    MutexLock lock(&mu_);
    if (backend_ == nullptr) return nullptr;
    backend = std::move(backend_);
    for (auto& [raw, weak] : active_) {
      if (auto strong = weak.lock()) active.push_back(std::move(strong));
    }
    active_.clear();
  }
  // Each abort waits for a commit already in flight on that transaction.
  for (auto& transaction : active) transaction->AbortFromClose();
  return backend;
}

}  // namespace percolite
