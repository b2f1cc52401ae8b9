// Key and record encoding (percolite/encoding.h): order preservation, prefix and
// row-range bounds, long-key hashing, record layout.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "percolite/encoding.h"
#include "percolite/transaction.h"
#include "test_util.h"

namespace {

using percolite::Cell;
using percolite::CellRef;
using percolite_test::Describe;

// Bytes chosen to hit the escape byte, the terminator byte, the top byte and
// their neighbours; short parts make prefixes of each other common.
constexpr unsigned char kAlphabet[] = {0x00, 0x01, 0x02, 'a', 0x7F, 0x80, 0xFE, 0xFF};

std::string RandomBytes(std::mt19937_64& rng, size_t max_len) {
  std::uniform_int_distribution<size_t> len(0, max_len);
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 1);
  std::string out(len(rng), '\0');
  for (char& c : out) c = static_cast<char>(kAlphabet[pick(rng)]);
  return out;
}

// -1, 0 or 1 as `a` sorts before, equal to or after `b`, comparing unsigned bytes.
int ByteCompare(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(a[i]);
    const auto y = static_cast<unsigned char>(b[i]);
    if (x != y) return x < y ? -1 : 1;
  }
  if (a.size() == b.size()) return 0;
  return a.size() < b.size() ? -1 : 1;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

using Bytes = std::vector<unsigned char>;
using PartsTuple = std::tuple<Bytes, Bytes, Bytes>;

Bytes ToBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

PartsTuple AsTuple(const Cell& cell) {
  return PartsTuple(ToBytes(cell.row), ToBytes(cell.family), ToBytes(cell.qualifier));
}

int TupleCompare(const PartsTuple& a, const PartsTuple& b) {
  if (a < b) return -1;
  return b < a ? 1 : 0;
}

// Random cells plus, for a share of them, neighbours that differ by an
// appended 0x00 or 0xFF or a dropped last byte in one part.
std::vector<Cell> RandomCells(std::mt19937_64& rng, size_t count) {
  std::vector<Cell> cells;
  while (cells.size() < count) {
    Cell cell{RandomBytes(rng, 4), RandomBytes(rng, 3), RandomBytes(rng, 3)};
    cells.push_back(cell);
    for (std::string Cell::*part : {&Cell::row, &Cell::family, &Cell::qualifier}) {
      Cell longer = cell;
      (longer.*part).push_back('\x00');
      cells.push_back(longer);
      (longer.*part).back() = '\xFF';
      cells.push_back(longer);
      if (!(cell.*part).empty()) {
        Cell shorter = cell;
        (shorter.*part).pop_back();
        cells.push_back(shorter);
      }
    }
  }
  return cells;
}

std::vector<std::string> RowPrefixesOf(const std::vector<Cell>& cells, std::mt19937_64& rng) {
  std::set<std::string> prefixes;
  for (size_t i = 0; i < cells.size(); i += 7) {
    const std::string& row = cells[i].row;
    for (size_t n = 0; n <= row.size(); ++n) prefixes.insert(row.substr(0, n));
  }
  for (int i = 0; i < 100; ++i) prefixes.insert(RandomBytes(rng, 5));
  return std::vector<std::string>(prefixes.begin(), prefixes.end());
}

std::string EncodeCell(const Cell& cell) {
  return percolite::EncodeCellKey(CellRef{cell.row, cell.family, cell.qualifier});
}

}  // namespace

TEST_CASE("EncodeCellKey byte order equals (row, family, qualifier) tuple order", "[encoding]") {
  std::mt19937_64 rng(20240601);
  const std::vector<Cell> cells = RandomCells(rng, 800);
  std::vector<std::string> keys;
  std::vector<PartsTuple> tuples;
  for (const Cell& cell : cells) {
    keys.push_back(EncodeCell(cell));
    tuples.push_back(AsTuple(cell));
  }

  size_t mismatches = 0;
  std::string first_mismatch;
  for (size_t i = 0; i < cells.size(); ++i) {
    for (size_t j = 0; j < cells.size(); ++j) {
      if (ByteCompare(keys[i], keys[j]) == TupleCompare(tuples[i], tuples[j])) continue;
      if (mismatches++ == 0) first_mismatch = Describe(cells[i]) + " vs " + Describe(cells[j]);
    }
  }
  INFO("first mismatch: " << first_mismatch);
  REQUIRE(mismatches == 0);
}

TEST_CASE("DecodeCellKey round-trips every encoded cell", "[encoding]") {
  std::mt19937_64 rng(7);
  for (const Cell& cell : RandomCells(rng, 500)) {
    INFO(Describe(cell));
    Cell decoded{"junk", "junk", "junk"};
    REQUIRE(percolite::DecodeCellKey(EncodeCell(cell), &decoded));
    REQUIRE(percolite_test::SameCell(decoded, cell));
  }
}

TEST_CASE("DecodeCellKey rejects truncated, extended and corrupted keys", "[encoding]") {
  std::mt19937_64 rng(11);
  for (const Cell& cell : RandomCells(rng, 100)) {
    INFO(Describe(cell));
    const std::string key = EncodeCell(cell);
    Cell out;
    for (size_t n = 0; n < key.size(); ++n) {
      INFO("prefix of " << n << " bytes");
      CHECK_FALSE(percolite::DecodeCellKey(key.substr(0, n), &out));
    }
    CHECK_FALSE(percolite::DecodeCellKey(key + "x", &out));
    CHECK_FALSE(percolite::DecodeCellKey(key + std::string("\x00\x01", 2), &out));
    // Any byte after an escape other than 0xFF (escaped zero) or 0x01 (terminator).
    for (size_t i = 0; i + 1 < key.size(); ++i) {
      if (key[i] != '\x00') continue;
      std::string bad = key;
      bad[i + 1] = '\x02';
      CHECK_FALSE(percolite::DecodeCellKey(bad, &out));
      ++i;  // skip the byte paired with this escape
    }
  }
}

TEST_CASE("PrefixQualifier splices what EncodeCellKey of the longer qualifier gives",
          "[encoding]") {
  std::mt19937_64 rng(13);
  const std::vector<Cell> cells = RandomCells(rng, 300);
  for (size_t i = 0; i < cells.size(); ++i) {
    const Cell& cell = cells[i];
    // Prefixes with zeros, 0x01 and 0xFF bytes (a stamp's bytes are any bytes).
    const std::string prefix =
        cells[(i + 1) % cells.size()].qualifier + std::string("\x00\x01\xff", 3);
    INFO(Describe(cell) << " prefix of " << prefix.size() << " bytes");
    const std::string key = EncodeCell(cell);
    size_t parts[3];
    REQUIRE(percolite::CellKeyParts(key, &parts));
    CHECK(parts[0] == 0);  // each part: its escaped bytes, then the 2-byte terminator
    CHECK(parts[1] == percolite::EncodeRowPrefix(cell.row).size() + 2);
    CHECK(parts[2] == parts[1] + percolite::EncodeRowPrefix(cell.family).size() + 2);
    std::string spliced = "junk";
    REQUIRE(percolite::PrefixQualifier(key, prefix, &spliced));
    CHECK(spliced == EncodeCell(Cell{cell.row, cell.family, prefix + cell.qualifier}));
  }
}

TEST_CASE("CellKeyParts and PrefixQualifier reject what DecodeCellKey rejects", "[encoding]") {
  std::mt19937_64 rng(17);
  auto rejected = [](const std::string& key) {
    size_t parts[3];
    std::string out;
    Cell cell;
    const bool decodes = percolite::DecodeCellKey(key, &cell);
    CHECK(percolite::CellKeyParts(key, &parts) == decodes);
    CHECK(percolite::PrefixQualifier(key, "stamp", &out) == decodes);
    return !decodes;
  };
  for (const Cell& cell : RandomCells(rng, 100)) {
    INFO(Describe(cell));
    const std::string key = EncodeCell(cell);
    CHECK_FALSE(rejected(key));
    for (size_t n = 0; n < key.size(); ++n) CHECK(rejected(key.substr(0, n)));
    CHECK(rejected(key + "x"));
    CHECK(rejected(key + std::string("\x00\x01", 2)));
    for (size_t i = 0; i + 1 < key.size(); ++i) {
      if (key[i] != '\x00') continue;
      std::string bad = key;
      bad[i + 1] = '\x02';
      CHECK(rejected(bad));
      ++i;
    }
  }
}

TEST_CASE("EncodeRowPrefix is a prefix exactly of the keys whose row starts with it",
          "[encoding]") {
  std::mt19937_64 rng(12345);
  const std::vector<Cell> cells = RandomCells(rng, 400);
  const std::vector<std::string> prefixes = RowPrefixesOf(cells, rng);
  size_t positives = 0, mismatches = 0;
  std::string first_mismatch;
  for (const std::string& prefix : prefixes) {
    const std::string encoded_prefix = percolite::EncodeRowPrefix(prefix);
    for (const Cell& cell : cells) {
      const bool expected = StartsWith(cell.row, prefix);
      positives += expected;
      if (StartsWith(EncodeCell(cell), encoded_prefix) == expected) continue;
      if (mismatches++ == 0) {
        first_mismatch = "prefix " + Describe(Cell{prefix, "", ""}) + " cell " + Describe(cell);
      }
    }
  }
  INFO("first mismatch: " << first_mismatch);
  CHECK(positives > prefixes.size());  // the check saw both outcomes
  REQUIRE(mismatches == 0);
}

TEST_CASE("EncodeRowStart sorts after every key of a smaller row and before all others",
          "[encoding]") {
  std::mt19937_64 rng(99);
  const std::vector<Cell> cells = RandomCells(rng, 400);
  const std::vector<std::string> rows = RowPrefixesOf(cells, rng);
  size_t mismatches = 0;
  std::string first_mismatch;
  for (const std::string& row : rows) {
    const std::string start = percolite::EncodeRowStart(row);
    for (const Cell& cell : cells) {
      const int expected = ByteCompare(cell.row, row) < 0 ? -1 : 1;
      if (ByteCompare(EncodeCell(cell), start) == expected) continue;
      if (mismatches++ == 0) {
        first_mismatch = "row start " + Describe(Cell{row, "", ""}) + " cell " + Describe(cell);
      }
    }
  }
  INFO("first mismatch: " << first_mismatch);
  REQUIRE(mismatches == 0);
}

TEST_CASE("ScanRange bounds select exactly the cells of a row prefix or a row range",
          "[encoding]") {
  std::mt19937_64 rng(4242);
  const std::vector<Cell> cells = RandomCells(rng, 300);
  const std::vector<std::string> rows = RowPrefixesOf(cells, rng);
  auto in_range = [](const std::string& key, const percolite::ScanRange& range) {
    return ByteCompare(key, range.from) >= 0 &&
           (range.end.empty() || ByteCompare(key, range.end) < 0);
  };
  size_t mismatches = 0;
  std::string first_mismatch;
  auto note = [&](const std::string& what, const Cell& cell) {
    if (mismatches++ == 0) first_mismatch = what + " cell " + Describe(cell);
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string& low = rows[i];
    const std::string& high = rows[(i * 7 + 3) % rows.size()];
    if (high.empty()) continue;  // rows are never empty; an empty end means "no bound"
    const auto by_prefix = percolite::ScanRange::RowPrefix(low);
    const auto from_low = percolite::ScanRange::Rows(low, std::nullopt);
    const auto low_to_high = percolite::ScanRange::Rows(low, std::string_view(high));
    for (const Cell& cell : cells) {
      const std::string key = EncodeCell(cell);
      const bool at_or_after_low = ByteCompare(cell.row, low) >= 0;
      const bool before_high = ByteCompare(cell.row, high) < 0;
      if (in_range(key, by_prefix) != StartsWith(cell.row, low)) {
        note("prefix " + Describe(Cell{low, "", ""}), cell);
      }
      if (in_range(key, from_low) != at_or_after_low) {
        note("rows from " + Describe(Cell{low, "", ""}), cell);
      }
      if (in_range(key, low_to_high) != (at_or_after_low && before_high)) {
        note("rows " + Describe(Cell{low, "", ""}) + ".." + Describe(Cell{high, "", ""}), cell);
      }
    }
  }
  INFO("first mismatch: " << first_mismatch);
  REQUIRE(mismatches == 0);
}

TEST_CASE("PrefixSuccessor is the least string above every extension of the prefix", "[encoding]") {
  using percolite::PrefixSuccessor;
  CHECK(PrefixSuccessor("abc") == "abd");
  CHECK(PrefixSuccessor(std::string("a\xFF\xFF", 3)) == "b");
  CHECK(PrefixSuccessor(std::string("\x00", 1)) == std::string("\x01", 1));
  CHECK(PrefixSuccessor(std::string("\xFE\xFF", 2)) == "\xFF");
  CHECK(PrefixSuccessor("").empty());
  CHECK(PrefixSuccessor(std::string("\xFF\xFF\xFF", 3)).empty());

  std::mt19937_64 rng(5);
  for (int i = 0; i < 300; ++i) {
    const std::string prefix = RandomBytes(rng, 5);
    const std::string successor = PrefixSuccessor(prefix);
    INFO("prefix " << Describe(Cell{prefix, "", ""}) << " successor "
                   << Describe(Cell{successor, "", ""}));
    if (std::all_of(prefix.begin(), prefix.end(), [](char c) { return c == '\xFF'; })) {
      CHECK(successor.empty());
      continue;
    }
    REQUIRE_FALSE(successor.empty());
    CHECK(ByteCompare(successor, prefix) > 0);
    CHECK_FALSE(StartsWith(successor, prefix));
    CHECK(ByteCompare(successor, prefix + std::string(16, '\xFF')) > 0);
    // Every string in [prefix, successor) extends the prefix: nothing smaller would do.
    for (int j = 0; j < 50; ++j) {
      const std::string probe = prefix.substr(0, j % (prefix.size() + 1)) + RandomBytes(rng, 4);
      const bool between = ByteCompare(probe, prefix) >= 0 && ByteCompare(probe, successor) < 0;
      CHECK(between == StartsWith(probe, prefix));
    }
  }
}

TEST_CASE("StoredKeyFor keeps short keys and hashes long ones to a fixed size", "[encoding]") {
  using percolite::kHashedKeySize;
  using percolite::kMaxInlineKey;
  std::mt19937_64 rng(31337);
  for (size_t len : {size_t{0}, size_t{1}, size_t{100}, kMaxInlineKey - 1, kMaxInlineKey}) {
    const std::string key(len, 'k');
    INFO("length " << len);
    CHECK(percolite::StoredKeyFor(key) == key);
    CHECK_FALSE(percolite::IsHashedStoredKey(percolite::StoredKeyFor(key)));
  }
  for (size_t len : {kMaxInlineKey + 1, kHashedKeySize, size_t{511}, size_t{512}, size_t{5000}}) {
    std::string key(len, 'k');
    for (char& c : key) c = static_cast<char>(rng());
    INFO("length " << len);
    const std::string stored = percolite::StoredKeyFor(key);
    CHECK(stored.size() == kHashedKeySize);
    CHECK(percolite::IsHashedStoredKey(stored));
    CHECK(stored.substr(0, kMaxInlineKey) == key.substr(0, kMaxInlineKey));
    CHECK(percolite::StoredKeyFor(key) == stored);  // deterministic
  }

  // Long keys sharing their whole inline part, differing only after it (in
  // one byte, or in length only), must still be stored under distinct keys.
  const std::string shared(kMaxInlineKey, 's');
  std::set<std::string> inputs, stored;
  for (int i = 0; i < 4000; ++i) {
    std::string key = shared + RandomBytes(rng, 6);
    if (key.size() == kMaxInlineKey) key += 'x';
    if (!inputs.insert(key).second) continue;
    stored.insert(percolite::StoredKeyFor(key));
  }
  for (size_t extra = 1; extra <= 40; ++extra) {
    const std::string key = shared + std::string(extra, '\x00');
    if (inputs.insert(key).second) stored.insert(percolite::StoredKeyFor(key));
  }
  CHECK(inputs.size() > 1000);
  REQUIRE(stored.size() == inputs.size());
}

TEST_CASE("EncodeRecord and DecodeRecord round-trip every field", "[encoding]") {
  const std::string long_key = std::string(600, 'L') + std::string("\x00\xFF", 2);
  const std::string values[] = {"", "v", std::string("\x00\x01\xFF\x00", 4),
                                std::string(70000, 'x')};
  for (uint64_t ts : {uint64_t{0}, uint64_t{1}, uint64_t{255}, uint64_t{1} << 63, ~uint64_t{0}}) {
    for (bool tombstone : {false, true}) {
      for (const std::string& full_key : {std::string(), long_key}) {
        for (const std::string& value : values) {
          INFO("ts " << ts << " tombstone " << tombstone << " key size " << full_key.size()
                     << " value size " << value.size());
          const std::string stored = full_key.empty() ? "stored key" : "hashed stored key";
          const std::string bytes = percolite::EncodeRecord(stored, ts, tombstone, full_key, value);
          percolite::RecordView view;
          REQUIRE(percolite::DecodeRecord(stored, bytes, &view) == percolite::RecordCheck::kOk);
          CHECK(view.commit_ts == ts);
          CHECK(view.tombstone == tombstone);
          CHECK(view.full_key == full_key);
          CHECK(view.value == value);
          // The commit_ts leads the record, big-endian (the writer reads it directly).
          CHECK(percolite::ReadUint64BE(bytes) == ts);
        }
      }
    }
  }
}

TEST_CASE("CRC32C gives the standard check values, split or whole", "[encoding]") {
  // The check value of the CRC-32C catalogue entry, and RFC 3720's vectors.
  CHECK(percolite::Crc32c("123456789") == 0xE3069283u);
  CHECK(percolite::Crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(percolite::Crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  CHECK(percolite::Crc32c(ascending) == 0x46DD794Eu);
  CHECK(percolite::Crc32c("") == 0u);
  const std::string text = "The quick brown fox jumps over the lazy dog, 0123456789 times.";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    INFO("split at " << cut);
    CHECK(percolite::Crc32c(text.substr(cut), percolite::Crc32c(text.substr(0, cut))) ==
          percolite::Crc32c(text));
  }
}

TEST_CASE("A changed byte anywhere in a record or its key fails the checksum", "[encoding]") {
  const std::string stored = "row\x00\x01f\x00\x01q\x00\x01";
  const std::string record = percolite::EncodeRecord(stored, 99, false, "", "some value");
  percolite::RecordView view;
  REQUIRE(percolite::DecodeRecord(stored, record, &view) == percolite::RecordCheck::kOk);
  for (size_t i = 0; i < record.size(); ++i) {
    for (int bit : {0, 7}) {
      std::string bad = record;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      INFO("record byte " << i << " bit " << bit);
      CHECK(percolite::DecodeRecord(stored, bad, &view) == percolite::RecordCheck::kBadChecksum);
    }
  }
  for (size_t i = 0; i < stored.size(); ++i) {
    std::string other = stored;
    other[i] = static_cast<char>(other[i] ^ 1);
    INFO("key byte " << i);
    CHECK(percolite::DecodeRecord(other, record, &view) == percolite::RecordCheck::kBadChecksum);
  }
  // The record of another key, or the same record cut short, is refused too.
  const std::string moved = percolite::EncodeRecord("other", 99, false, "", "some value");
  CHECK(percolite::DecodeRecord(stored, moved, &view) == percolite::RecordCheck::kBadChecksum);
  CHECK(percolite::DecodeRecord(stored, record.substr(0, record.size() - 1), &view) !=
        percolite::RecordCheck::kOk);
}

TEST_CASE("DecodeRecord rejects short records, unknown flags and truncated long keys",
          "[encoding]") {
  using percolite::RecordCheck;
  percolite::RecordView view;
  CHECK(percolite::DecodeRecord("k", "", &view) == RecordCheck::kMalformed);
  CHECK(percolite::DecodeRecord("k", std::string(12, '\0'), &view) == RecordCheck::kMalformed);

  // Records whose checksum is right but whose body is not: flags with
  // unknown bits, a hashed record cut inside its length field or its key.
  auto resealed = [](std::string_view stored, const std::string& body) {
    return percolite::AddRecordChecksum(stored, body);
  };
  const std::string plain = percolite::EncodeRecord("k", 42, false, "", "value");
  const std::string plain_body = plain.substr(0, plain.size() - percolite::kRecordChecksumSize);
  for (int bit = 2; bit < 8; ++bit) {
    std::string bad = plain_body;
    bad[8] = static_cast<char>(bad[8] | (1 << bit));
    INFO("flag bit " << bit);
    CHECK(percolite::DecodeRecord("k", resealed("k", bad), &view) == RecordCheck::kMalformed);
  }

  const std::string full_key(500, 'k');
  const std::string hashed = percolite::EncodeRecord("h", 7, false, full_key, "tail");
  const std::string body = hashed.substr(0, hashed.size() - percolite::kRecordChecksumSize);
  const size_t key_end = 9 + 4 + full_key.size();
  REQUIRE(body.size() == key_end + 4);
  for (size_t n = 9; n <= body.size(); ++n) {
    INFO("body cut to " << n << " bytes");
    const std::string truncated = resealed("h", body.substr(0, n));  // the view points into it
    const RecordCheck check = percolite::DecodeRecord("h", truncated, &view);
    CHECK((check == RecordCheck::kOk) == (n >= key_end));
    if (check == RecordCheck::kOk) {
      CHECK(view.full_key == full_key);
      CHECK(view.value == std::string("tail").substr(0, n - key_end));
    }
  }
}

TEST_CASE("Big-endian uint64 round-trips and sorts numerically as bytes", "[encoding]") {
  std::mt19937_64 rng(77);
  std::vector<uint64_t> numbers = {0, 1, 255, 256, ~uint64_t{0}, uint64_t{1} << 63};
  for (int i = 0; i < 500; ++i) numbers.push_back(rng() >> (rng() % 64));
  for (uint64_t a : numbers) {
    std::string ea;
    percolite::AppendUint64BE(&ea, a);
    REQUIRE(ea.size() == 8);
    REQUIRE(percolite::ReadUint64BE(ea) == a);
  }
  size_t mismatches = 0;
  for (uint64_t a : numbers) {
    for (uint64_t b : numbers) {
      std::string ea, eb;
      percolite::AppendUint64BE(&ea, a);
      percolite::AppendUint64BE(&eb, b);
      const int expected = a < b ? -1 : (a > b ? 1 : 0);
      mismatches += ByteCompare(ea, eb) != expected;
    }
  }
  REQUIRE(mismatches == 0);
}
