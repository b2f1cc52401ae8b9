// The parts of the backend layer every backend shares: the stored forms of
// stamps, notification keys and observed columns, and the blocking Commit.
#include "percolite/backend.h"

#include <chrono>

#include "percolite/mutex.h"

namespace percolite {
namespace {

void AppendLengthPrefixed(std::string* out, std::string_view part) {
  uint32_t n = static_cast<uint32_t>(part.size());
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(n >> shift));
  out->append(part);
}

bool ReadLengthPrefixed(std::string_view bytes, size_t* pos, std::string* out) {
  if (bytes.size() < *pos + 4) return false;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n = (n << 8) | static_cast<unsigned char>(bytes[*pos + i]);
  *pos += 4;
  if (bytes.size() < *pos + n) return false;
  out->assign(bytes.substr(*pos, n));
  *pos += n;
  return true;
}

}  // namespace

std::string EncodeObservedColumns(const std::vector<ObservedColumn>& columns) {
  std::string out;
  for (const ObservedColumn& c : columns) {
    AppendLengthPrefixed(&out, c.family);
    AppendLengthPrefixed(&out, c.qualifier);
    out.push_back(static_cast<char>(c.kind));
    AppendLengthPrefixed(&out, c.observer);
  }
  return out;
}

bool DecodeObservedColumns(std::string_view bytes, std::vector<ObservedColumn>* out) {
  out->clear();
  size_t pos = 0;
  while (pos < bytes.size()) {
    ObservedColumn c;
    if (!ReadLengthPrefixed(bytes, &pos, &c.family) ||
        !ReadLengthPrefixed(bytes, &pos, &c.qualifier) || pos >= bytes.size()) {
      return false;
    }
    c.kind = static_cast<NotifyKind>(bytes[pos++]);
    if (c.kind != NotifyKind::kStrong && c.kind != NotifyKind::kWeak) return false;
    if (!ReadLengthPrefixed(bytes, &pos, &c.observer)) return false;
    out->push_back(std::move(c));
  }
  return true;
}

uint64_t RowHash(std::string_view row) { return StableHash64(row, 7); }

std::string NotificationKey(uint64_t row_hash, std::string_view cell_key) {
  std::string key;
  key.reserve(8 + cell_key.size());
  AppendUint64BE(&key, row_hash);
  key.append(cell_key);
  return key;
}

std::string StampedKey(std::string_view encoded_key, uint64_t commit_ts, uint32_t seq) {
  std::string stamp, key;
  AppendUint64BE(&stamp, commit_ts);
  for (int shift = 24; shift >= 0; shift -= 8) stamp.push_back(static_cast<char>(seq >> shift));
  if (!PrefixQualifier(encoded_key, stamp, &key)) {
    throw Error(ErrorCode::kInvalidArgument, "a stamped write needs a cell key");
  }
  return key;
}

void AppendPackedHeader(std::string* out, uint32_t count) {
  out->push_back(kPackedVersion);
  AppendVarint32(out, count);
}

bool PackedCount(std::string_view record, uint32_t* count, size_t* header_size) {
  size_t pos = 1;
  if (record.empty() || record[0] != kPackedVersion || !ReadVarint32(record, &pos, count)) {
    return false;
  }
  if (header_size != nullptr) *header_size = pos;
  return true;
}

bool JoinPacked(std::string* record, std::string_view more) {
  uint32_t count = 0, more_count = 0;
  size_t header = 0, more_header = 0;
  if (!PackedCount(*record, &count, &header) || !PackedCount(more, &more_count, &more_header)) {
    return false;
  }
  const size_t bytes = record->size() - header + more.size() - more_header;
  if (size_t{count} + more_count > kPackedMaxEntries || bytes > kPackedMaxBytes) return false;
  std::string joined_header;
  AppendPackedHeader(&joined_header, count + more_count);
  record->replace(0, header, joined_header);
  record->append(more.substr(more_header));
  return true;
}

Snapshot::TryRead Snapshot::TryGet(std::string_view, ValueView, void*) {
  return TryRead::kWouldBlock;
}

bool Snapshot::Scan(std::string_view from, bool exclusive, std::string_view end, size_t limit,
                    std::vector<std::pair<std::string, std::string>>* out) {
  size_t taken = 0;
  return Visit(from, exclusive, end, [&](std::string_view key, std::string_view value) {
    if (taken == limit) return false;
    out->emplace_back(std::string(key), std::string(value));
    ++taken;
    return true;
  });
}

size_t Snapshot::Count(std::string_view from, bool exclusive, std::string_view end, size_t limit) {
  size_t counted = 0;
  Visit(from, exclusive, end, [&](std::string_view, std::string_view) {
    if (counted == limit) return false;
    ++counted;
    return true;
  });
  return counted;
}

CommitResult Backend::Commit(uint64_t start_ts, std::vector<Mutation> mutations,
                             CommitExtras extras) {
  Mutex mu;
  CondVar cv;
  bool done = false;
  CommitResult result;
  CommitAsync(start_ts, std::move(mutations), std::move(extras), [&](const CommitResult& r) {
    MutexLock lock(&mu);
    result = r;
    done = true;
    cv.Signal();
  });
  MutexLock lock(&mu);
  while (!done) cv.Wait(&mu);
  return result;
}

double Backend::NowUnix() const {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace percolite
