#include "percolite/encoding.h"

#include <cstring>

namespace percolite {
namespace {

constexpr char kEscape = '\x00';
constexpr char kEscapedZero = '\xFF';
constexpr char kTerminator = '\x01';

// Zero bytes are rare in keys: copy the runs between them whole.
void AppendEscaped(std::string* out, std::string_view part) {
  // An empty view may have no data at all: memchr must not see its null.
  while (!part.empty()) {
    const void* zero = std::memchr(part.data(), kEscape, part.size());
    if (zero == nullptr) {
      out->append(part.data(), part.size());
      return;
    }
    const size_t at = static_cast<size_t>(static_cast<const char*>(zero) - part.data());
    out->append(part.data(), at + 1);
    out->push_back(kEscapedZero);
    part.remove_prefix(at + 1);
  }
}

// Reads one escaped, terminated part starting at *pos; advances *pos past the terminator.
bool ReadPart(std::string_view key, size_t* pos, std::string* out) {
  out->clear();
  size_t i = *pos;
  while (i < key.size()) {
    char c = key[i];
    if (c != kEscape) {
      out->push_back(c);
      ++i;
      continue;
    }
    if (i + 1 >= key.size()) return false;
    if (key[i + 1] == kEscapedZero) {
      out->push_back(kEscape);
      i += 2;
    } else if (key[i + 1] == kTerminator) {
      *pos = i + 2;
      return true;
    } else {
      return false;
    }
  }
  return false;
}

uint64_t Mix64(uint64_t x) {  // the splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Record layout: commit_ts (8, big-endian) | flags (1) | [full key length (4) | full key] | value
constexpr uint8_t kFlagTombstone = 1;
constexpr uint8_t kFlagHashedKey = 2;

}  // namespace

std::string EncodeCellKey(const CellRef& cell) {
  std::string out;
  out.reserve(cell.row.size() + cell.family.size() + cell.qualifier.size() + 6);
  for (std::string_view part : {cell.row, cell.family, cell.qualifier}) {
    AppendEscaped(&out, part);
    out.push_back(kEscape);
    out.push_back(kTerminator);
  }
  return out;
}

void AppendEscapedPart(std::string* out, std::string_view part) {
  AppendEscaped(out, part);
  out->push_back(kEscape);
  out->push_back(kTerminator);
}

bool ReadEscapedPart(std::string_view bytes, size_t* pos, std::string* out) {
  return ReadPart(bytes, pos, out);
}

bool DecodeCellKey(std::string_view key, Cell* out) {
  size_t pos = 0;
  return ReadPart(key, &pos, &out->row) && ReadPart(key, &pos, &out->family) &&
         ReadPart(key, &pos, &out->qualifier) && pos == key.size();
}

bool CellKeyParts(std::string_view key, size_t (*parts)[3]) {
  size_t part = 0, i = 0;
  (*parts)[0] = 0;
  while (i < key.size()) {
    const void* found = std::memchr(key.data() + i, kEscape, key.size() - i);
    if (found == nullptr || static_cast<const char*>(found) + 1 == key.data() + key.size()) {
      return false;
    }
    i = static_cast<size_t>(static_cast<const char*>(found) - key.data());
    if (key[i + 1] == kTerminator) {
      if (++part == 3) return i + 2 == key.size();
      (*parts)[part] = i + 2;
    } else if (key[i + 1] != kEscapedZero) {
      return false;
    }
    i += 2;
  }
  return false;
}

bool PrefixQualifier(std::string_view key, std::string_view prefix, std::string* out) {
  size_t parts[3];
  if (!CellKeyParts(key, &parts)) return false;
  out->clear();
  out->reserve(key.size() + 2 * prefix.size());
  out->append(key.substr(0, parts[2]));
  AppendEscaped(out, prefix);
  out->append(key.substr(parts[2]));
  return true;
}

std::string EncodeRowPrefix(std::string_view row_prefix) {
  std::string out;
  AppendEscaped(&out, row_prefix);
  return out;
}

std::string EncodeRowStart(std::string_view row) { return EncodeRowPrefix(row); }

std::string PrefixSuccessor(std::string_view prefix) {
  std::string out(prefix);
  while (!out.empty()) {
    unsigned char last = static_cast<unsigned char>(out.back());
    if (last != 0xFF) {
      out.back() = static_cast<char>(last + 1);
      return out;
    }
    out.pop_back();
  }
  return out;
}

uint64_t StableHash64(std::string_view bytes, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ULL ^ Mix64(seed);
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix64(h ^ bytes.size());
}

std::string StoredKeyFor(std::string_view encoded_key) {
  if (encoded_key.size() <= kMaxInlineKey) return std::string(encoded_key);
  std::string out(encoded_key.substr(0, kMaxInlineKey));
  AppendUint64BE(&out, StableHash64(encoded_key, 1));
  AppendUint64BE(&out, StableHash64(encoded_key, 2));
  return out;
}

void AppendUint64BE(std::string* out, uint64_t value) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(value >> shift));
}

uint64_t ReadUint64BE(std::string_view bytes) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

void AppendUint32BE(std::string* out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(value >> shift));
}

void AppendVarint32(std::string* out, uint32_t value) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

bool ReadVarint32(std::string_view in, size_t* pos, uint32_t* value) {
  uint64_t result = 0;
  for (int shift = 0; shift <= 28; shift += 7) {
    if (*pos >= in.size()) return false;
    const unsigned char byte = static_cast<unsigned char>(in[(*pos)++]);
    result |= uint64_t{byte & 0x7Fu} << shift;
    if ((byte & 0x80) == 0) {
      if (result > UINT32_MAX) return false;
      *value = static_cast<uint32_t>(result);
      return true;
    }
  }
  return false;
}

uint32_t ReadUint32BE(std::string_view bytes) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

namespace {

uint32_t RecordChecksum(std::string_view stored_key, std::string_view unchecked_record) {
  return Crc32c(unchecked_record, Crc32c(stored_key));
}

}  // namespace

std::string EncodeRecord(std::string_view stored_key, uint64_t commit_ts, bool tombstone,
                         std::string_view full_key_if_hashed, std::string_view value) {
  std::string out;
  out.reserve(17 + full_key_if_hashed.size() + value.size());
  AppendUint64BE(&out, commit_ts);
  uint8_t flags =
      (tombstone ? kFlagTombstone : 0) | (full_key_if_hashed.empty() ? 0 : kFlagHashedKey);
  out.push_back(static_cast<char>(flags));
  if (!full_key_if_hashed.empty()) {
    AppendUint32BE(&out, static_cast<uint32_t>(full_key_if_hashed.size()));
    out.append(full_key_if_hashed);
  }
  out.append(value);
  AppendUint32BE(&out, RecordChecksum(stored_key, out));
  return out;
}

std::string AddRecordChecksum(std::string_view stored_key, std::string_view unchecked_record) {
  std::string out(unchecked_record);
  AppendUint32BE(&out, RecordChecksum(stored_key, out));
  return out;
}

RecordCheck DecodeRecord(std::string_view stored_key, std::string_view bytes, RecordView* out) {
  if (bytes.size() < 9 + kRecordChecksumSize) return RecordCheck::kMalformed;
  const size_t body = bytes.size() - kRecordChecksumSize;
  if (ReadUint32BE(bytes.substr(body)) != RecordChecksum(stored_key, bytes.substr(0, body))) {
    return RecordCheck::kBadChecksum;
  }
  bytes = bytes.substr(0, body);
  out->commit_ts = ReadUint64BE(bytes);
  uint8_t flags = static_cast<uint8_t>(bytes[8]);
  if (flags & ~(kFlagTombstone | kFlagHashedKey)) return RecordCheck::kMalformed;
  out->tombstone = flags & kFlagTombstone;
  size_t pos = 9;
  out->full_key = {};
  if (flags & kFlagHashedKey) {
    if (bytes.size() < pos + 4) return RecordCheck::kMalformed;
    const uint32_t n = ReadUint32BE(bytes.substr(pos));
    pos += 4;
    if (bytes.size() - pos < n) return RecordCheck::kMalformed;
    out->full_key = bytes.substr(pos, n);
    pos += n;
  }
  out->value = bytes.substr(pos);
  return RecordCheck::kOk;
}

// ---------------------------------------------------------------------------
// CRC32C

namespace {

constexpr uint32_t kCastagnoli = 0x82F63B78;  // the reflected polynomial

struct Crc32cTable {
  uint32_t entries[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t crc = i;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (kCastagnoli & (0u - (crc & 1)));
      entries[i] = crc;
    }
  }
};

uint32_t Crc32cPortable(const unsigned char* p, size_t n, uint32_t crc) {
  static const Crc32cTable table;
  for (size_t i = 0; i < n; ++i) crc = table.entries[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(const unsigned char* p, size_t n,
                                                       uint32_t crc) {
  uint64_t wide = crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    wide = __builtin_ia32_crc32di(wide, word);
  }
  crc = static_cast<uint32_t>(wide);
  for (; n > 0; ++p, --n) crc = __builtin_ia32_crc32qi(crc, *p);
  return crc;
}
#endif

}  // namespace

uint32_t Crc32c(std::string_view bytes, uint32_t crc) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  crc = ~crc;
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  crc = has_sse42 ? Crc32cSse42(p, bytes.size(), crc) : Crc32cPortable(p, bytes.size(), crc);
#else
  crc = Crc32cPortable(p, bytes.size(), crc);
#endif
  return ~crc;
}

bool RowOfCellKey(std::string_view key, std::string* row) {
  size_t parts[3], pos = 0;
  return CellKeyParts(key, &parts) && ReadEscapedPart(key, &pos, row);
}

}  // namespace percolite
