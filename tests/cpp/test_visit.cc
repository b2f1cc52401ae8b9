// Transaction::Visit: the cells Scan returns, as views, without copies.
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace {

using percolite::Cell;
using percolite::Env;
using percolite::ErrorCode;
using percolite::ScanItem;
using percolite::ScanRange;
using percolite_test::FastOptions;
using percolite_test::Ref;
using percolite_test::ScanAll;
using percolite_test::TempDir;

using Cells = std::vector<std::pair<std::string, std::string>>;  // (row/family/qualifier, value)

std::string Name(const Cell& cell) { return cell.row + "/" + cell.family + "/" + cell.qualifier; }

Cells FromScan(const std::vector<ScanItem>& items) {
  Cells out;
  for (const ScanItem& item : items) out.emplace_back(Name(item.cell), item.value);
  return out;
}

Cells FromVisit(percolite::Transaction& tx, const ScanRange& range, const std::string* after,
                size_t stop_after = SIZE_MAX, bool* exhausted = nullptr) {
  Cells out;
  bool done = tx.Visit(range, after, [&](std::string_view key, std::string_view value) {
    Cell cell;
    REQUIRE(percolite::DecodeCellKey(key, &cell));
    out.emplace_back(Name(cell), std::string(value));
    return out.size() < stop_after;
  });
  if (exhausted) *exhausted = done;
  return out;
}

}  // namespace

TEST_CASE("Visit sees what Scan sees: own writes, deletes, purges, long keys", "[visit]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  std::mt19937 rng(3);
  auto row_of = [&](int i) {
    std::string row = "r" + std::to_string(i % 7);
    if (i % 11 == 0) row += std::string(500, 'L');  // stored under a hashed key
    return row;
  };
  {
    auto tx = env->Begin();
    for (int i = 0; i < 400; ++i) {
      tx->Set({row_of(i), i % 3 ? "f" : "g", "q" + std::to_string(i)},
              "committed " + std::to_string(i));
    }
    for (int i = 0; i < 50; ++i) tx->AddStamped({"r3", "e", "entry" + std::to_string(i)}, "queued");
    tx->Commit();
  }
  {
    auto tx = env->Begin();  // a committed delete leaves a tombstone: not a cell
    for (int i = 0; i < 400; i += 9)
      tx->Delete({row_of(i), i % 3 ? "f" : "g", "q" + std::to_string(i)});
    tx->Commit();
  }
  auto tx = env->Begin();
  for (int i = 0; i < 200; ++i) {
    const int n = static_cast<int>(rng() % 500);
    const Cell cell{row_of(n), n % 3 ? "f" : "g", "q" + std::to_string(n)};
    if (rng() % 3 == 0) {
      tx->Delete(Ref(cell));
    } else {
      tx->Set(Ref(cell), "own " + std::to_string(i));
    }
  }
  std::vector<ScanItem> entries = ScanAll(*tx, ScanRange::Rows("r3", std::string("r3\0", 3)), 50);
  std::vector<std::string> stamps;
  for (const ScanItem& item : entries) {
    if (item.cell.family == "e")
      stamps.push_back(item.cell.qualifier.substr(0, percolite::kStampSize));
  }
  REQUIRE(stamps.size() == 50);
  tx->PurgeStamps("r3", "e", stamps[5], stamps[30]);

  const std::vector<ScanRange> ranges = {
      ScanRange::RowPrefix(""), ScanRange::RowPrefix("r3"), ScanRange::Rows("r2", "r5"),
      ScanRange::Rows("r6", std::nullopt), ScanRange::Rows("zz", std::nullopt)};
  for (const ScanRange& range : ranges) {
    std::vector<ScanItem> scanned = ScanAll(*tx, range, 37);
    bool exhausted = false;
    CHECK(FromVisit(*tx, range, nullptr, SIZE_MAX, &exhausted) == FromScan(scanned));
    CHECK(exhausted);
    // From a resume point: the keys after a Scan chunk.
    percolite::ScanChunk first = tx->Scan(range, nullptr, 25);
    if (!first.done) {
      std::vector<ScanItem> rest = ScanAll(*tx, range, 1000);
      rest.erase(rest.begin(), rest.begin() + first.items.size());
      CHECK(FromVisit(*tx, range, &first.resume_after) == FromScan(rest));
    }
    // Stopping early: the first cells, and not exhausted.
    if (scanned.size() > 3) {
      Cells three = FromVisit(*tx, range, nullptr, 3, &exhausted);
      CHECK_FALSE(exhausted);
      const Cells all = FromScan(scanned);
      CHECK(three == Cells(all.begin(), all.begin() + 3));
    }
  }
  ScanRange by_column = ScanRange::RowPrefix("r");
  by_column.columns.emplace_back("f", "q1");
  CHECK(percolite_test::ErrorCodeOf([&] { FromVisit(*tx, by_column, nullptr); }) ==
        ErrorCode::kInvalidArgument);
  tx->Abort();
  CHECK(percolite_test::ErrorCodeOf([&] { FromVisit(*tx, ranges[0], nullptr); }) ==
        ErrorCode::kWrongState);
  env->Close();
}

TEST_CASE("Visit walks a range of many thousand cells in chunks, long rows included", "[visit]") {
  // The snapshot takes the map lock for a few thousand cells at a time and
  // resumes after the last one: nothing may be lost or repeated at a seam,
  // not even inside a group of long rows (stored hashed, re-sorted per group).
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const std::string long_prefix(500, 'L');
  {
    auto tx = env->Begin();
    for (int i = 0; i < 10000; ++i) {
      char name[16];
      std::snprintf(name, sizeof name, "r%05d", i);
      std::string row = name;
      if (i >= 4000 && i < 4200) row = "r04000" + long_prefix + name;  // one hashed group
      // From the third chunk on, rows ever longer: the key a chunk resumes
      // after must not change (or move) while that chunk is walked.
      if (i >= 8192) row += std::string(static_cast<size_t>(600 + 4 * (i - 8192)), 'g');
      tx->Set({row, "f", "q"}, std::to_string(i));
    }
    tx->Commit();
  }
  auto tx = env->Begin();
  const ScanRange all = ScanRange::RowPrefix("r");
  const Cells scanned = FromScan(ScanAll(*tx, all, 1000));
  REQUIRE(scanned.size() == 10000);
  bool exhausted = false;
  CHECK(FromVisit(*tx, all, nullptr, SIZE_MAX, &exhausted) == scanned);
  CHECK(exhausted);
  for (size_t stop : {4096, 4097, 6000}) {
    Cells first = FromVisit(*tx, all, nullptr, stop, &exhausted);
    CHECK_FALSE(exhausted);
    CHECK(first == Cells(scanned.begin(), scanned.begin() + stop));
  }
  tx->Abort();
  env->Close();
}
