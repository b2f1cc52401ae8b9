#include "percolite/notifications.h"

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

}  // namespace percolite
