// percolite/encoding.h: how cells are laid out as LMDB keys and values.
//
// Thread safety: pure functions; call them from any thread.
//
// Contract
// - A cell is (row, family, qualifier); each part is any byte string.
// - EncodeCellKey is order-preserving: cells sort by row, then family, then
//   qualifier, each compared as unsigned bytes, shorter prefix first. Each part
//   is escaped (0x00 -> 0x00 0xFF) and terminated by 0x00 0x01, so byte order of
//   encoded keys equals the order of (row, family, qualifier) tuples.
// - The encoding of a row prefix is a byte prefix of every key whose row starts
//   with it (EncodeRowPrefix), and EncodeRowStart(r) sorts before every key of a
//   row >= r and after every key of a row < r: scans by prefix and by row range
//   are plain LMDB range scans.
// - LMDB keys are limited to 511 bytes. An encoded key longer than
//   kMaxInlineKey is stored under its first kMaxInlineKey bytes followed by a
//   128-bit hash of the whole key, and the whole key is kept in the record.
//   Keys sharing those first bytes are re-sorted by their whole key when
//   scanned (see cell_table.h), so order is exact for keys of any length.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace percolite {

struct CellRef {
  std::string_view row;
  std::string_view family;
  std::string_view qualifier;
};

struct Cell {
  std::string row;
  std::string family;
  std::string qualifier;
};

std::string EncodeCellKey(const CellRef& cell);
// Decodes a key produced by EncodeCellKey; returns false on malformed input.
bool DecodeCellKey(std::string_view key, Cell* out);
// Where the parts of an encoded cell key begin, without copying them: the
// row's escaped bytes at (*parts)[0] (always 0), the family's at (*parts)[1],
// the qualifier's at (*parts)[2]. False when `key` is not a cell key.
bool CellKeyParts(std::string_view key, size_t (*parts)[3]);
// Sets *out to the key of (row, family, prefix + qualifier) for the cell
// `key` encodes, spliced from its bytes (nothing decoded). False when `key`
// is not a cell key.
bool PrefixQualifier(std::string_view key, std::string_view prefix, std::string* out);
// Sets *row to the row of the cell key `key` (only the row is decoded);
// false when `key` is not a cell key.
bool RowOfCellKey(std::string_view key, std::string* row);
std::string EncodeRowPrefix(std::string_view row_prefix);
std::string EncodeRowStart(std::string_view row);
// The smallest byte string greater than every string that starts with `prefix`;
// empty when there is none (prefix is all 0xFF).
std::string PrefixSuccessor(std::string_view prefix);

// One part as EncodeCellKey writes it (escaped, then terminated by 0x00 0x01),
// and reading it back from `bytes` at *pos (advanced past the terminator).
void AppendEscapedPart(std::string* out, std::string_view part);
bool ReadEscapedPart(std::string_view bytes, size_t* pos, std::string* out);

// Long-key handling.
constexpr size_t kMaxInlineKey = 480;
constexpr size_t kHashedKeySize = kMaxInlineKey + 16;
std::string StoredKeyFor(std::string_view encoded_key);
inline bool IsHashedStoredKey(std::string_view stored) { return stored.size() == kHashedKeySize; }

// A stored record: the commit timestamp of the last write, whether that write
// was a delete (a tombstone), the whole key when the stored key is hashed, the
// value, and last a CRC32C of the stored key followed by everything before
// the checksum. Damage to a key or to any byte of its record is found by the
// first read that meets it (DecodeRecord), not served as data.
struct RecordView {
  uint64_t commit_ts = 0;
  bool tombstone = false;
  std::string_view full_key;  // empty unless the stored key is hashed
  std::string_view value;
};
constexpr size_t kRecordChecksumSize = 4;
std::string EncodeRecord(std::string_view stored_key, uint64_t commit_ts, bool tombstone,
                         std::string_view full_key_if_hashed, std::string_view value);
enum class RecordCheck { kOk, kMalformed, kBadChecksum };
// Verifies the checksum of a record read under `stored_key`, then decodes it;
// `out` holds views into `bytes`.
RecordCheck DecodeRecord(std::string_view stored_key, std::string_view bytes, RecordView* out);
// The record as the format before checksums (percolite/3) wrote it, given
// its checksum; for upgrading stores of that format.
std::string AddRecordChecksum(std::string_view stored_key, std::string_view unchecked_record);

// CRC32C (Castagnoli), continuing from `crc` (0 to start): the SSE4.2
// instruction where the processor has it, a table elsewhere; same results.
uint32_t Crc32c(std::string_view bytes, uint32_t crc = 0);

// Big-endian fixed-width integers: they sort numerically as bytes.
void AppendUint64BE(std::string* out, uint64_t value);
uint64_t ReadUint64BE(std::string_view bytes);  // requires bytes.size() >= 8
void AppendUint32BE(std::string* out, uint32_t value);
uint32_t ReadUint32BE(std::string_view bytes);  // requires bytes.size() >= 4

// Unsigned LEB128 varints of at most 32 bits. ReadVarint32 reads one at
// *pos and moves *pos past it; false when it is truncated or longer.
void AppendVarint32(std::string* out, uint32_t value);
bool ReadVarint32(std::string_view in, size_t* pos, uint32_t* value);

// 64-bit hash of bytes (FNV-1a folded through a 64-bit finalizer); stable across
// processes, platforms and versions, because bucket numbers on disk depend on it.
uint64_t StableHash64(std::string_view bytes, uint64_t seed = 0);

}  // namespace percolite
