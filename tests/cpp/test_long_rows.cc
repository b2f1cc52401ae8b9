// Rows longer than LMDB's key limit: they are stored
// under hashed keys, yet Get, Scan order, read-your-writes and conflicts are
// exact for rows sharing long prefixes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "percolite/encoding.h"
#include "percolite/env.h"
#include "percolite/transaction.h"
#include "test_util.h"

namespace {

using percolite::Cell;
using percolite::Env;
using percolite::ErrorCode;
using percolite::ScanRange;
using percolite_test::ErrorCodeOf;
using percolite_test::FastOptions;
using percolite_test::ReadCommitted;
using percolite_test::Ref;
using percolite_test::ScanAll;
using percolite_test::TempDir;

using Bytes = std::vector<unsigned char>;
using Key = std::tuple<Bytes, Bytes, Bytes>;  // orders parts as unsigned bytes
using Model = std::map<Key, std::pair<Cell, std::string>>;

Bytes ToBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
Key KeyOf(const Cell& cell) {
  return Key(ToBytes(cell.row), ToBytes(cell.family), ToBytes(cell.qualifier));
}

// 5000 bytes of letters with an escape byte (0x00) and a top byte (0xFF) placed
// around the kMaxInlineKey boundary of the encoded key.
std::string BaseRow() {
  std::string base(5000, 'x');
  for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<char>('a' + (i * 11) % 26);
  base[200] = '\x00';
  base[300] = '\xFF';
  base[477] = '\x00';
  base[479] = '\xFF';
  base[481] = '\x00';
  return base;
}

std::vector<std::string> LongRows() {
  const std::string base = BaseRow();
  auto prefix = [&](size_t n) { return base.substr(0, n); };
  std::vector<std::string> rows = {prefix(400), prefix(480), prefix(481), prefix(5000)};
  for (size_t n = 470; n <= 490; ++n) rows.push_back(prefix(n));
  for (size_t n : {399, 400, 479, 480, 4999, 5000}) {
    rows.push_back(prefix(n) + '\x00');
    rows.push_back(prefix(n) + '\xFF');
    rows.push_back(prefix(n) + 'Z');
  }
  std::string last_up = prefix(481), last_down = prefix(481);
  last_up.back() = static_cast<char>(last_up.back() + 1);
  last_down.back() = static_cast<char>(last_down.back() - 1);  // 0x00 - 1 = 0xFF
  rows.push_back(last_up);
  rows.push_back(last_down);
  std::string early_difference = base;
  early_difference[10] = 'A';
  rows.push_back(early_difference);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// Each row gets a plain column, an empty qualifier, and a 600-byte qualifier.
std::vector<Cell> CellsOf(const std::vector<std::string>& rows) {
  std::vector<Cell> cells;
  for (const std::string& row : rows) {
    cells.push_back(Cell{row, "f", "q"});
    cells.push_back(Cell{row, "f", ""});
    cells.push_back(Cell{row, "g", std::string(600, 'Q')});
  }
  return cells;
}

std::string ValueFor(const Cell& cell, const std::string& tag) {
  return tag + ":" + std::to_string(cell.row.size()) + ":" +
         std::to_string(static_cast<unsigned char>(cell.row.back())) + ":" + cell.family +
         std::to_string(cell.qualifier.size());
}

// A short printable name of a cell: its row length and last bytes, and its column.
std::string Name(const Cell& cell) {
  std::string tail;
  for (size_t i = cell.row.size() >= 3 ? cell.row.size() - 3 : 0; i < cell.row.size(); ++i) {
    tail += std::to_string(static_cast<unsigned char>(cell.row[i])) + ".";
  }
  return "row[" + std::to_string(cell.row.size()) + "]..." + tail + " " + cell.family + ":" +
         std::to_string(cell.qualifier.size());
}

std::vector<std::string> Names(const std::vector<percolite::ScanItem>& items) {
  std::vector<std::string> out;
  for (const auto& item : items) out.push_back(Name(item.cell) + "=" + item.value);
  return out;
}

template <typename Keep>
std::vector<std::string> Names(const Model& model, Keep keep) {
  std::vector<std::string> out;
  for (const auto& [key, entry] : model) {
    if (keep(entry.first)) out.push_back(Name(entry.first) + "=" + entry.second);
  }
  return out;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Commits every cell of `cells` in three transactions, in a shuffled order.
Model CommitAll(Env& env, std::vector<Cell> cells) {
  std::mt19937 rng(3);
  std::shuffle(cells.begin(), cells.end(), rng);
  Model model;
  for (size_t part = 0; part < 3; ++part) {
    auto tx = env.Begin();
    for (size_t i = part; i < cells.size(); i += 3) {
      const std::string value = ValueFor(cells[i], "v");
      tx->Set(Ref(cells[i]), value);
      model[KeyOf(cells[i])] = {cells[i], value};
    }
    tx->Commit();
  }
  return model;
}

}  // namespace

TEST_CASE("Rows of 400 to 5000 bytes sharing long prefixes round-trip through Get", "[long-rows]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const std::vector<Cell> cells = CellsOf(LongRows());
  size_t hashed = 0;
  for (const Cell& cell : cells) {
    hashed +=
        percolite::IsHashedStoredKey(percolite::StoredKeyFor(percolite::EncodeCellKey(Ref(cell))));
  }
  REQUIRE(hashed > cells.size() / 2);  // most keys exceed the inline limit
  const Model model = CommitAll(*env, cells);
  REQUIRE(model.size() == cells.size());

  auto reader = env->Begin();
  size_t mismatches = 0;
  for (const auto& [key, entry] : model) {
    const auto value = reader->Get(Ref(entry.first));
    if (value != entry.second) {
      ++mismatches;
      UNSCOPED_INFO("wrong value for " << Name(entry.first));
    }
  }
  CHECK(mismatches == 0);
  // A row one byte longer or shorter than a stored one is a different row.
  const std::string base = BaseRow();
  CHECK(reader->Get(Ref(Cell{base.substr(0, 4998), "f", "q"})) == std::nullopt);
  CHECK(reader->Get(Ref(Cell{base + "x", "f", "q"})) == std::nullopt);
}

TEST_CASE("Scan returns long rows in exact lexicographic order, by prefix and by range",
          "[long-rows]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const Model model = CommitAll(*env, CellsOf(LongRows()));
  const std::string base = BaseRow();
  auto tx = env->Begin();

  const auto everything = Names(model, [](const Cell&) { return true; });
  for (size_t limit : {1, 2, 5, 1000}) {
    INFO("limit " << limit);
    CHECK(Names(ScanAll(*tx, ScanRange::RowPrefix(""), limit)) == everything);
  }

  for (size_t n : {400, 479, 480, 481, 4999}) {
    const std::string prefix = base.substr(0, n);
    INFO("prefix of " << n << " bytes");
    const auto expected = Names(model, [&](const Cell& c) { return StartsWith(c.row, prefix); });
    REQUIRE(expected.size() >= 3);
    CHECK(Names(ScanAll(*tx, ScanRange::RowPrefix(prefix), 2)) == expected);
  }

  const std::string low = base.substr(0, 480), high = base.substr(0, 4999) + '\xFF';
  const auto in_range = [&](const Cell& c) {
    return KeyOf(Cell{c.row, "", ""}) >= KeyOf(Cell{low, "", ""}) &&
           KeyOf(Cell{c.row, "", ""}) < KeyOf(Cell{high, "", ""});
  };
  const auto expected_range = Names(model, in_range);
  REQUIRE(expected_range.size() >= 3);
  REQUIRE(expected_range.size() < model.size());
  for (size_t limit : {1, 3, 1000}) {
    INFO("limit " << limit);
    CHECK(Names(ScanAll(*tx, ScanRange::Rows(low, std::string_view(high)), limit)) ==
          expected_range);
  }
}

TEST_CASE("Own writes of long rows merge into a scan in exact order", "[long-rows]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Model model = CommitAll(*env, CellsOf(LongRows()));
  const std::string base = BaseRow();

  auto tx = env->Begin();
  for (const std::string& row : {base.substr(0, 481) + "own", base + std::string("\x00", 1),
                                 base.substr(0, 480) + "\x01", base.substr(0, 2000)}) {
    const Cell cell{row, "f", "q"};
    tx->Set(Ref(cell), "own");
    model[KeyOf(cell)] = {cell, "own"};
  }
  for (const Cell& cell : {Cell{base, "f", "q"}, Cell{base.substr(0, 481), "g", ""},
                           Cell{base.substr(0, 481), "g", std::string(600, 'Q')}}) {
    tx->Delete(Ref(cell));
    model.erase(KeyOf(cell));
  }
  const Cell overwritten{base.substr(0, 480) + '\xFF', "f", ""};
  tx->Set(Ref(overwritten), "replaced");
  model[KeyOf(overwritten)].second = "replaced";

  const auto expected = Names(model, [](const Cell&) { return true; });
  for (size_t limit : {1, 4, 1000}) {
    INFO("limit " << limit);
    CHECK(Names(ScanAll(*tx, ScanRange::RowPrefix(""), limit)) == expected);
  }
  tx->Commit();
  auto reader = env->Begin();
  CHECK(Names(ScanAll(*reader, ScanRange::RowPrefix(""), 3)) == expected);
  CHECK(reader->Get(Ref(Cell{base, "f", "q"})) == std::nullopt);
  CHECK(reader->Get(Ref(overwritten)) == "replaced");
}

TEST_CASE("Conflicts on long rows are per cell, not per shared inline prefix", "[long-rows]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const std::string base = BaseRow();
  const Cell same{base, "f", "q"};
  const Cell sibling_a{base.substr(0, 481), "f", "q"}, sibling_b{base.substr(0, 490), "f", "q"};

  auto t1 = env->Begin();
  auto t2 = env->Begin();
  auto t3 = env->Begin();
  auto t4 = env->Begin();
  t1->Set(Ref(same), "t1");
  t2->Set(Ref(same), "t2");
  t3->Set(Ref(sibling_a), "t3");
  t4->Set(Ref(sibling_b), "t4");
  REQUIRE_NOTHROW(t1->Commit());
  CHECK(ErrorCodeOf([&] { t2->Commit(); }) == ErrorCode::kConflict);
  CHECK_NOTHROW(t3->Commit());
  CHECK_NOTHROW(t4->Commit());
  CHECK(ReadCommitted(*env, same) == "t1");
  CHECK(ReadCommitted(*env, sibling_a) == "t3");
  CHECK(ReadCommitted(*env, sibling_b) == "t4");

  // A delete of a long row leaves a tombstone that a concurrent set conflicts with.
  auto deleter = env->Begin();
  auto setter = env->Begin();
  deleter->Delete(Ref(same));
  setter->Set(Ref(same), "late");
  REQUIRE_NOTHROW(deleter->Commit());
  CHECK(ErrorCodeOf([&] { setter->Commit(); }) == ErrorCode::kConflict);
  CHECK(ReadCommitted(*env, same) == std::nullopt);
}
