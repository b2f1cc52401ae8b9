#include "queue_rows.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_set>

#include "percolite/encoding.h"
#include "percolite/failures.h"
#include "percolite/transaction.h"
#include "percolite/workers.h"

namespace percolite {
namespace queue_rows {

void CheckOptions(std::string_view kind, const std::string& id, uint32_t buckets,
                  std::string_view batch_name, size_t batch) {
  const std::string label(kind);
  if (id.empty()) throw Error(ErrorCode::kInvalidArgument, "a queue id must not be empty");
  for (unsigned char c : id) {
    if (c == ':' || c < 0x20 || c == 0x7F) {
      throw Error(ErrorCode::kInvalidArgument,
                  label + " id '" + id +
                      "' contains a character the layout reserves (':' or a control character)");
    }
  }
  if (buckets < 1 || buckets > kMaxBuckets) {
    throw Error(ErrorCode::kInvalidArgument, "buckets must be between 1 and " +
                                                 std::to_string(kMaxBuckets) + ", not " +
                                                 std::to_string(buckets));
  }
  if (batch < 1)
    throw Error(ErrorCode::kInvalidArgument, std::string(batch_name) + " must be >= 1");
}

std::string BucketName(uint32_t bucket) {
  // Every add names its buckets, so no snprintf (a tenth of a loader
  // thread's instructions): six digits, as buckets < kMaxBuckets + 1 allow.
  static_assert(kMaxBuckets <= 999999, "bucket names have six digits");
  std::string name(6, '0');
  for (size_t i = name.size(); i-- > 0 && bucket > 0; bucket /= 10) {
    name[i] = static_cast<char>('0' + bucket % 10);
  }
  return name;
}

ObservedColumn ProcessorColumn(std::string_view kind, const std::string& id,
                               const std::string& notify_family) {
  ObservedColumn column;
  column.family = notify_family;
  column.qualifier = std::string(kNotifyQualifier);
  column.kind = NotifyKind::kWeak;
  column.observer = QueueProcessorName(kind, id);
  return column;
}

Observer ProcessorObserver(std::string_view kind, const std::string& id,
                           const std::string& notify_family, ObserverFn processor) {
  Observer observer;
  observer.column = ProcessorColumn(kind, id, notify_family);
  observer.fn = std::move(processor);
  observer.max_attempts = 0;
  observer.wait_for_commit = true;
  return observer;
}

std::string PackedFamily(std::string_view family) {
  std::string packed(family);
  for (char& c : packed) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return packed;
}

namespace {

bool ReadSized(std::string_view in, size_t* pos, std::string_view* bytes) {
  uint32_t size = 0;
  if (!ReadVarint32(in, pos, &size) || in.size() - *pos < size) return false;
  *bytes = in.substr(*pos, size);
  *pos += size;
  return true;
}

}  // namespace

void AppendPackedEntry(std::string* out, std::string_view key, std::string_view value) {
  AppendVarint32(out, static_cast<uint32_t>(key.size()));
  out->append(key);
  AppendVarint32(out, static_cast<uint32_t>(value.size()));
  out->append(value);
}

bool DecodePacked(std::string_view value,
                  std::vector<std::pair<std::string_view, std::string_view>>* out,
                  std::string* why) {
  const auto fail = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  if (value.empty() || value[0] != kPackedVersion) {
    return fail("not a packed record of version " + std::to_string(int{kPackedVersion}));
  }
  uint32_t count = 0;
  size_t pos = 1;
  if (!ReadVarint32(value, &pos, &count)) return fail("its entry count does not decode");
  // Each entry takes at least two bytes: a count beyond that is damage, not
  // a reason to reserve memory.
  if (count == 0 || count > (value.size() - pos) / 2) {
    return fail("a count of " + std::to_string(count) + " entries in " +
                std::to_string(value.size()) + " bytes");
  }
  out->reserve(out->size() + count);
  for (uint32_t i = 0; i < count; ++i) {
    std::string_view key, entry_value;
    if (!ReadSized(value, &pos, &key) || !ReadSized(value, &pos, &entry_value)) {
      return fail("truncated in entry " + std::to_string(i + 1) + " of " + std::to_string(count));
    }
    out->emplace_back(key, entry_value);
  }
  if (pos != value.size()) {
    return fail(std::to_string(value.size() - pos) + " bytes after the last entry");
  }
  return true;
}

void Write(Transaction& transaction, const std::string& id, std::string_view kind,
           std::string_view family, const std::string& notify_family, uint32_t buckets,
           const std::function<uint32_t(std::string_view)>& bucket_of,
           const std::vector<std::pair<std::string, std::string>>& entries, bool packed) {
  const std::string entry_prefix = id + ":" + std::string(kind) + ":";
  if (!entries.empty()) transaction.CountWrite("queue", id, entries.size());
  if (!packed) {
    std::vector<bool> notified(buckets, false);
    for (const auto& [key, value] : entries) {
      const uint32_t bucket = bucket_of(key);
      const std::string name = BucketName(bucket);
      transaction.AddStamped({entry_prefix + name, family, key}, value);
      if (!notified[bucket]) {
        transaction.SetWeakNotification({id + ":b:" + name, notify_family, kNotifyQualifier});
        notified[bucket] = true;
      }
    }
    return;
  }
  // Each bucket's entries, in the order given (the stable sort keeps it).
  std::vector<std::pair<uint32_t, uint32_t>> order;  // (bucket, entry index)
  order.reserve(entries.size());
  for (uint32_t i = 0; i < entries.size(); ++i) order.emplace_back(bucket_of(entries[i].first), i);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const std::string packed_family = PackedFamily(family);
  std::string body, record;
  for (size_t first = 0; first < order.size();) {
    const uint32_t bucket = order[first].first;
    const std::string name = BucketName(bucket);
    const std::string row = entry_prefix + name;
    while (first < order.size() && order[first].first == bucket) {
      body.clear();
      uint32_t count = 0;
      for (; first < order.size() && order[first].first == bucket; ++first, ++count) {
        if (count == kPackedMaxEntries || (count > 0 && body.size() >= kPackedMaxBytes)) break;
        const auto& [key, value] = entries[order[first].second];
        AppendPackedEntry(&body, key, value);
      }
      record.clear();
      AppendPackedHeader(&record, count);
      record.append(body);
      transaction.AddStamped({row, packed_family, std::string_view()}, record, /*joinable=*/true);
    }
    transaction.SetWeakNotification({id + ":b:" + name, notify_family, kNotifyQualifier});
  }
}

// Blocks of at least this many bytes: a full run of short entries takes a few.
constexpr size_t kEntriesBlock = 64 * 1024;

std::string_view Entries::Keep(std::string_view bytes) {
  if (bytes.empty()) return std::string_view();  // there may be no block yet
  if (capacity_ - used_ < bytes.size()) {
    capacity_ = std::max(kEntriesBlock, bytes.size());
    blocks_.push_back(std::unique_ptr<char[]>(new char[capacity_]));
    used_ = 0;
  }
  char* at = blocks_.back().get() + used_;
  std::memcpy(at, bytes.data(), bytes.size());
  used_ += bytes.size();
  return std::string_view(at, bytes.size());
}

Entry& Entries::Add(std::string_view qualifier, std::string_view value) {
  Entry& entry = list_.emplace_back();
  entry.qualifier = Keep(qualifier);
  entry.key_bytes = entry.qualifier.substr(std::min(kStampSize, entry.qualifier.size()));
  entry.value = Keep(value);
  return entry;
}

Record& Entries::AddRecord(std::string_view qualifier, std::string_view value, bool packed) {
  Record& record = records_.emplace_back();
  record.qualifier = Keep(qualifier);
  record.value = Keep(value);
  record.packed = packed;
  return record;
}

namespace {

// The range of the cells of row/family; *prefix = the bytes in front of each
// cell's escaped qualifier.
ScanRange FamilyRange(const std::string& row, std::string_view family, size_t* prefix) {
  ScanRange range;
  AppendEscapedPart(&range.from, row);
  AppendEscapedPart(&range.from, family);
  if (prefix) *prefix = range.from.size();
  range.end = PrefixSuccessor(range.from);
  return range;
}

void ReadStamp(std::string_view qualifier, uint64_t* commit_ts, uint32_t* index) {
  *commit_ts = ReadUint64BE(qualifier);
  uint32_t i = 0;
  for (size_t b = 8; b < kStampSize; ++b) i = (i << 8) | static_cast<unsigned char>(qualifier[b]);
  *index = i;
}

}  // namespace

Status Read(Transaction& transaction, const std::string& row, std::string_view family,
            const std::string& cursor, size_t limit, bool whole_keys, bool packed,
            std::string_view what, const std::set<std::string, std::less<>>& skip, Entries* out,
            bool* more) {
  *more = false;
  if (packed && !cursor.empty()) {
    return Status::Make(ErrorCode::kInvalidArgument,
                        std::string(what) + ": a cursor cannot point into packed records");
  }
  // Past `limit` (whole_keys), only entries of these keys are taken. By
  // hash: an entry of another key with the same hash is taken too, and so
  // is every later entry of that key (all of them are after `limit`), so
  // each key's entries are still never split.
  std::unordered_set<uint64_t> taken_keys;
  size_t taken = 0;
  bool filling = true, stopped = false, malformed = false, follows = false;
  std::string qualifier;
  std::vector<std::pair<std::string_view, std::string_view>> decoded;
  std::vector<bool> take;
  // Whether a record from now on is past `limit`; false: stop here.
  auto past_limit = [&]() {
    if (filling && taken >= limit) {
      if (!whole_keys) {
        *more = true;
        stopped = true;
        return false;
      }
      filling = false;
    }
    return true;
  };
  auto single = [&](std::string_view value) {
    const std::string_view key = std::string_view(qualifier).substr(kStampSize);
    if (!skip.empty() && skip.count(key) != 0) {
      follows = false;
      return true;  // a parked key's entry stays queued
    }
    if (!past_limit()) return false;
    const uint64_t hash = whole_keys ? StableHash64(key) : 0;
    if (!filling && taken_keys.count(hash) == 0) {
      *more = true;
      follows = false;
      return true;
    }
    if (whole_keys) taken_keys.insert(hash);
    Entry& entry = out->Add(qualifier, value);
    ReadStamp(qualifier, &entry.commit_ts, &entry.index);
    const uint32_t first = static_cast<uint32_t>(out->list().size() - 1);
    out->records().push_back(Record{entry.qualifier, std::string_view(), false, follows, first, 1});
    follows = true;
    ++taken;
    return true;
  };
  auto packed_record = [&](std::string_view value) {
    decoded.clear();
    if (!DecodePacked(value, &decoded)) {
      malformed = true;
      return false;
    }
    bool unskipped = false;
    for (const auto& entry : decoded) {
      if (skip.empty() || skip.count(entry.first) == 0) unskipped = true;
    }
    if (!unskipped) {
      follows = false;
      return true;  // only parked keys' entries: it stays as it is
    }
    if (!past_limit()) return false;
    // Entry by entry, as for single-entry records: the batch may end inside
    // the record, and the rest of it stays (PurgeRead writes it back).
    take.assign(decoded.size(), false);
    size_t taking = 0;
    for (size_t i = 0; i < decoded.size(); ++i) {
      const std::string_view key = decoded[i].first;
      if (!skip.empty() && skip.count(key) != 0) continue;
      if (filling && taken + taking >= limit) filling = false;
      const uint64_t hash = whole_keys ? StableHash64(key) : 0;
      if (filling || (whole_keys && taken_keys.count(hash) != 0)) {
        take[i] = true;
        ++taking;
        if (whole_keys) taken_keys.insert(hash);
      } else {
        *more = true;  // it stays in the record
      }
    }
    if (taking == 0) {
      follows = false;
      return true;
    }
    Record& record = out->AddRecord(qualifier, value, true);
    record.follows = follows;
    record.first = static_cast<uint32_t>(out->list().size());
    follows = true;
    const uint32_t record_index = static_cast<uint32_t>(out->records().size() - 1);
    uint64_t commit_ts = 0;
    uint32_t index = 0;
    ReadStamp(qualifier, &commit_ts, &index);
    // The views into `value`, moved onto the copy the record keeps.
    const char* const kept = record.value.data();
    auto moved = [&](std::string_view bytes) {
      return std::string_view(kept + (bytes.data() - value.data()), bytes.size());
    };
    for (size_t i = 0; i < decoded.size(); ++i) {
      if (!take[i]) continue;
      const auto& [key, entry_value] = decoded[i];
      Entry& entry = out->list().emplace_back();
      entry.qualifier = record.qualifier;
      entry.key_bytes = moved(key);
      entry.value = moved(entry_value);
      entry.commit_ts = commit_ts;
      entry.index = index;
      entry.record = record_index;
      ++taken;
    }
    out->records().back().count = static_cast<uint32_t>(out->list().size()) - record.first;
    return true;
  };
  auto visit = [&](std::string_view visited_family, bool is_packed) {
    size_t prefix = 0;
    const ScanRange range = FamilyRange(row, visited_family, &prefix);
    std::string resume;
    if (!cursor.empty()) resume = EncodeCellKey({row, visited_family, cursor});
    follows = false;
    transaction.Visit(range, cursor.empty() ? nullptr : &resume,
                      [&](std::string_view cell, std::string_view value) {
                        size_t pos = prefix;
                        if (!ReadEscapedPart(cell, &pos, &qualifier) || pos != cell.size() ||
                            qualifier.size() < kStampSize ||
                            (is_packed && qualifier.size() != kStampSize)) {
                          malformed = true;
                          return false;
                        }
                        return is_packed ? packed_record(value) : single(value);
                      });
  };
  visit(family, false);
  if (packed && !stopped && !malformed) visit(PackedFamily(family), true);
  if (malformed) {
    return Status::Make(ErrorCode::kCorruption, std::string(what) + ": malformed queued entry");
  }
  return Status::Ok();
}

void PurgeRead(Transaction& transaction, const std::string& row, std::string_view family,
               const Entries& read, const std::set<std::string, std::less<>>& kept) {
  const std::string packed_family = PackedFamily(family);
  const std::vector<Entry>& entries = read.list();
  const std::vector<Record>& records = read.records();
  size_t run = SIZE_MAX;  // the first record of the run of whole records being gathered
  auto purge_run = [&](size_t end) {
    if (run == SIZE_MAX) return;
    transaction.PurgeStamps(row, records[run].packed ? std::string_view(packed_family) : family,
                            records[run].qualifier.substr(0, kStampSize),
                            records[end - 1].qualifier.substr(0, kStampSize));
    run = SIZE_MAX;
  };
  std::vector<std::pair<std::string_view, std::string_view>> decoded;
  std::string rewritten;
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& record = records[i];
    bool whole = true;
    if (!record.packed) {
      whole = kept.empty() || kept.count(entries[record.first].key()) == 0;
    } else {
      decoded.clear();
      DecodePacked(record.value, &decoded);  // Read decoded it already
      // What stays: the entries Read did not take (they view the same bytes
      // as the entries it took, so they are told apart by address), and
      // those of keys parked now.
      rewritten.clear();
      uint32_t stays = 0;
      size_t next = record.first;
      const size_t end = size_t{record.first} + record.count;
      for (const auto& [key, value] : decoded) {
        const bool was_taken = next < end && entries[next].key_bytes.data() == key.data();
        if (was_taken) ++next;
        if (was_taken && (kept.empty() || kept.count(key) == 0)) continue;
        AppendPackedEntry(&rewritten, key, value);
        ++stays;
      }
      if (stays > 0) {
        whole = false;
        if (stays < decoded.size()) {
          std::string value;
          AppendPackedHeader(&value, stays);
          value.append(rewritten);
          transaction.Set({row, packed_family, record.qualifier}, value);
        }
      }
    }
    if (!whole) {
      purge_run(i);
      continue;
    }
    if (run != SIZE_MAX && !record.follows) purge_run(i);
    if (run == SIZE_MAX) run = i;
  }
  purge_run(records.size());
}

void Peek(Transaction& transaction, const std::string& row, std::string_view family, bool packed,
          size_t limit, size_t* found, bool* more) {
  const size_t stop = limit == SIZE_MAX ? limit : limit + 1;
  size_t counted = transaction.Count(FamilyRange(row, family, nullptr), nullptr, stop);
  if (packed && counted < stop) {
    transaction.Visit(FamilyRange(row, PackedFamily(family), nullptr), nullptr,
                      [&](std::string_view, std::string_view value) {
                        uint32_t count = 1;  // a malformed one: Read reports it
                        if (!PackedCount(value, &count) || count == 0) count = 1;
                        counted += std::min<size_t>(count, stop - counted);
                        return counted < stop;
                      });
  }
  *found = std::min(counted, limit);
  *more = counted > limit;
}

Linger::Linger(std::string_view kind, const std::string& id, double seconds) : seconds_(seconds) {
  if (!(seconds >= 0 && seconds <= kMaxLingerSeconds)) {  // NaN fails too
    throw Error(ErrorCode::kInvalidArgument,
                std::string(kind) + " '" + id + "': linger must be between 0 and 3600 seconds");
  }
}

bool Linger::Defer(Transaction& transaction, const std::string& bucket_row,
                   const std::string& cursor, const std::string& entry_row, std::string_view family,
                   bool packed, size_t full) {
  // Only a run from the start of its bucket lingers; one after a cursor goes on.
  if (seconds_ <= 0 || !cursor.empty()) return false;
  if (transaction.Hurried()) {  // a thread waits for the workers, which have nothing else
    MutexLock lock(&mu_);
    short_.erase(bucket_row);
    return false;
  }
  size_t found = 0;
  bool more = false;
  Peek(transaction, entry_row, family, packed, full, &found, &more);
  const double wait = For(bucket_row, found, found > 0 && !more && found < full);
  if (wait <= 0) return false;
  transaction.DeferTrigger(wait);
  return true;
}

double Linger::For(const std::string& bucket_row, size_t found, bool short_batch) {
  const auto now = std::chrono::steady_clock::now();
  const double step = seconds_ / 4;
  MutexLock lock(&mu_);
  uint64_t& taken = taken_[bucket_row];
  if (!short_batch) {
    short_.erase(bucket_row);
    taken += found;
    return 0;
  }
  auto [it, first] = short_.try_emplace(bucket_row, Short{now, found});
  if (first) return step;
  const double waited = std::chrono::duration<double>(now - it->second.since).count();
  // Go now when nothing arrived since the last look (the adders paused), when
  // as many entries wait as this process's runs of the bucket found when they
  // went on (a young bucket: see "Lingering"), or once the linger has passed
  // (1 ms of slack for early wake-ups).
  if (found <= it->second.found || found >= taken || waited + 0.001 >= seconds_) {
    short_.erase(it);
    taken += found;
    return 0;
  }
  it->second.found = found;
  return std::min(step, seconds_ - waited);
}

namespace {
// The marker a run leaves in the cursor cell of a bucket with entries left,
// when the cursor does not name the last entry taken.
constexpr std::string_view kMoreMarker = "more";
}  // namespace

namespace {

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Whether a failed consume may be blamed on the keys of its batch (so the
// batch is split to find them) rather than on the store or the sink.
bool KeysMayBeAtFault(const Status& status) {
  switch (status.code()) {
    case ErrorCode::kClosed:
    case ErrorCode::kStorage:
    case ErrorCode::kCorruption:
    case ErrorCode::kConflict:
    case ErrorCode::kSinkUnavailable:
    case ErrorCode::kSinkRefused:
      return false;
    default:
      return true;
  }
}

Status Stopped(std::string_view what) {
  return Status::Make(ErrorCode::kClosed, std::string(what) + ": the workers are stopping");
}

// Part of a batch being split, and how its consume failed.
struct FailedPart {
  std::vector<Entry> entries;
  Status status;
};

// The distinct keys of `entries`, sorted.
std::vector<std::string_view> KeysOf(const std::vector<Entry>& entries) {
  std::vector<std::string_view> keys;
  keys.reserve(entries.size());
  for (const Entry& entry : entries) keys.push_back(entry.key());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

// The last attempt's consume (BucketStrategy, "Poison keys and outages" in
// export_queue.h): consumes `entries`; when that fails for a reason the keys
// may be at fault, splits the failing batch level by level: each failing part
// of several keys is split in two halves by key, and the halves are consumed
// (what a failing one buffered is undone). A part of one key that fails is
// poison. When every part tried at a level fails and there were at least
// kSinkDownParts of them, no key is at fault but the sink: the run fails with
// kSinkUnavailable and nothing is parked (k poison keys can make at most k
// parts of a level fail, so up to kSinkDownParts - 1 poison keys are always
// told apart from a sink that fails for everything). Otherwise the poison
// keys are parked (added to *parked) and the rest is consumed. Gives up with
// a kClosed status when the workers are stopping (Workers::StopRequested).
constexpr size_t kSinkDownParts = 4;

Status ConsumeOrPark(const BucketStrategy& strategy, Transaction& transaction,
                     const std::string& notify_key, const std::vector<Entry>& entries,
                     uint32_t attempts, double first_failure_unix,
                     std::set<std::string, std::less<>>* parked) {
  Transaction::Savepoint savepoint = transaction.Save();
  Status status = strategy.consume(transaction, entries);
  if (status.ok() || !KeysMayBeAtFault(status)) return status;
  transaction.RollbackTo(savepoint);
  std::vector<FailedPart> failing;
  failing.push_back(FailedPart{entries, std::move(status)});
  std::vector<FailedPart> poison;
  while (!failing.empty()) {
    std::vector<FailedPart> next;
    size_t tried = 0;
    for (FailedPart& part : failing) {
      const std::vector<std::string_view> keys = KeysOf(part.entries);
      if (keys.size() == 1) {
        poison.push_back(std::move(part));
        continue;
      }
      // Halves by key, each keeping its entries in commit order.
      const std::string_view first_of_second = keys[keys.size() / 2];
      std::vector<Entry> halves[2];
      for (const Entry& entry : part.entries) {
        halves[entry.key() < first_of_second ? 0 : 1].push_back(entry);
      }
      for (std::vector<Entry>& half : halves) {
        if (Workers::StopRequested()) return Stopped(strategy.what);
        savepoint = transaction.Save();
        status = strategy.consume(transaction, half);
        ++tried;
        if (status.ok()) continue;
        if (!KeysMayBeAtFault(status)) return status;
        transaction.RollbackTo(savepoint);
        next.push_back(FailedPart{std::move(half), std::move(status)});
      }
    }
    if (tried >= kSinkDownParts && next.size() == tried) {
      // The last failure's text, unchanged: it is what the record shows.
      return Status::Make(ErrorCode::kSinkUnavailable, next.back().status.message());
    }
    failing = std::move(next);
  }
  const double now = UnixNow();
  for (const FailedPart& part : poison) {
    const std::string_view key = part.entries.front().key();
    ParkKey(transaction, strategy.observer, notify_key, key, DescribeFailure(part.status.message()),
            attempts, first_failure_unix, now);
    parked->emplace(key);
  }
  return Status::Ok();
}

}  // namespace

Status ProcessBucket(const BucketStrategy& strategy, Transaction& transaction,
                     const Cell& bucket_cell) {
  const std::string& id = *strategy.id;
  const std::string prefix_b = id + ":b:";
  if (bucket_cell.row.compare(0, prefix_b.size(), prefix_b) != 0) {
    return Status::Make(ErrorCode::kInvalidArgument,
                        std::string(strategy.what) + ": notified on a row of another queue");
  }
  if (Workers::StopRequested()) return Stopped(strategy.what);
  const std::string& bucket_row = bucket_cell.row;
  std::string entry_row = id + ":";
  entry_row.append(strategy.entry_kind).append(":").append(bucket_row.substr(prefix_b.size()));
  const CellRef cursor_cell{bucket_row, *strategy.family, kCursorQualifier};
  // Non-empty when the previous run left entries behind: this run goes on
  // with them (and does not linger).
  const std::string cursor = transaction.Get(cursor_cell).value_or("");
  if (strategy.linger->Defer(transaction, bucket_row, cursor, entry_row, strategy.entry_kind,
                             strategy.packed, strategy.batch)) {
    return Status::Ok();
  }
  const std::string notify_key = EncodeCellKey({bucket_row, *strategy.family, kNotifyQualifier});
  std::set<std::string, std::less<>> parked;
  for (std::string& key : ParkedKeys(transaction, notify_key)) parked.insert(std::move(key));
  Entries read;
  const std::vector<Entry>& entries = read.list();
  bool more = false;
  Status status = Read(transaction, entry_row, strategy.entry_kind,
                       strategy.resume_after_cursor ? cursor : std::string(), strategy.batch,
                       strategy.whole_keys, strategy.packed, strategy.what, parked, &read, &more);
  if (!status.ok()) return status;
  if (!entries.empty()) {
    if (strategy.batches) ++*strategy.batches;
    if (strategy.entries) *strategy.entries += entries.size();
    uint32_t attempts = 0;  // failed runs of this bucket so far
    double first_failure_unix = 0;
    if (strategy.max_attempts > 0) {
      if (std::optional<WorkRecord> record = ReadWorkRecord(transaction, notify_key)) {
        attempts = record->attempts;
        first_failure_unix = record->first_failure_unix;
      }
    }
    std::set<std::string, std::less<>> parked_now;
    if (strategy.max_attempts > 0 && attempts + 1 >= strategy.max_attempts) {
      status = ConsumeOrPark(strategy, transaction, notify_key, entries, attempts + 1,
                             first_failure_unix, &parked_now);
    } else {
      status = strategy.consume(transaction, entries);
    }
    if (!status.ok()) return status;
    // Parked keys' entries stay: those parked before this run (in a packed
    // record it took for other keys) and now.
    parked.merge(parked_now);
    PurgeRead(transaction, entry_row, strategy.entry_kind, read, parked);
  }
  std::string_view next_cursor;
  if (more) next_cursor = strategy.resume_after_cursor ? entries.back().qualifier : kMoreMarker;
  transaction.Set(cursor_cell, next_cursor);
  // Run again to take the rest. (Entries sort in commit order, so none can
  // appear before the cursor: they would have been visible to this run.)
  if (more) transaction.SetWeakNotification({bucket_row, *strategy.family, kNotifyQualifier});
  return Status::Ok();
}

}  // namespace queue_rows

// Build and parse side by side: what one writes the other must read back.
std::vector<std::string> PackedQueueFamilies() {
  return {queue_rows::PackedFamily(queue_rows::kCombineUpdateFamily),
          queue_rows::PackedFamily(queue_rows::kExportEntryFamily)};
}

std::vector<std::pair<std::string_view, std::string_view>> PackedQueueEntries(
    std::string_view value) {
  std::vector<std::pair<std::string_view, std::string_view>> entries;
  std::string why;
  if (!queue_rows::DecodePacked(value, &entries, &why)) {
    throw Error(ErrorCode::kInvalidArgument, "a packed queue record that does not decode: " + why);
  }
  return entries;
}

std::optional<uint32_t> PackedQueueCount(std::string_view value) {
  uint32_t count = 0;
  if (!PackedCount(value, &count)) return std::nullopt;
  return count;
}

std::string QueueProcessorName(std::string_view kind, std::string_view id) {
  if (kind != kCombineQueueKind && kind != kExportQueueKind) {
    throw Error(ErrorCode::kInvalidArgument,
                "a queue's kind is '" + std::string(kCombineQueueKind) + "' or '" +
                    std::string(kExportQueueKind) + "', not '" + std::string(kind) + "'");
  }
  std::string name(kind);
  name.append(" ").append(id);
  return name;
}

std::optional<std::pair<std::string, std::string>> ParseQueueProcessorName(std::string_view name) {
  for (std::string_view kind : {kCombineQueueKind, kExportQueueKind}) {
    if (name.size() > kind.size() + 1 && name.substr(0, kind.size()) == kind &&
        name[kind.size()] == ' ') {
      return std::make_pair(std::string(kind), std::string(name.substr(kind.size() + 1)));
    }
  }
  return std::nullopt;
}

}  // namespace percolite
