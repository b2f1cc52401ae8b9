// Range purges (Transaction::PurgeStamps, backend.h Mutation::purge_end): a
// consumer removes a run of consumed queue entries in one cursor walk.
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using percolite::Cell;
using percolite::Env;
using percolite::ErrorCode;
using percolite::ScanItem;
using percolite::ScanRange;
using percolite_test::ErrorCodeOf;
using percolite_test::FastOptions;
using percolite_test::Ref;
using percolite_test::ScanAll;
using percolite_test::TempDir;

std::string Stamp(const ScanItem& item) {
  return item.cell.qualifier.substr(0, percolite::kStampSize);
}

// Commits one transaction that queues `keys` as stamped writes of row/family.
void AddEntries(Env& env, const std::string& row, const std::string& family,
                const std::vector<std::string>& keys) {
  auto tx = env.Begin();
  for (const std::string& key : keys) tx->AddStamped({row, family, key}, "value of " + key);
  tx->Commit();
}

std::vector<std::string> Numbered(const std::string& prefix, int count) {
  std::vector<std::string> keys;
  for (int i = 0; i < count; ++i) keys.push_back(prefix + std::to_string(10000 + i));
  return keys;
}

std::multiset<std::string> Qualifiers(const std::vector<ScanItem>& items,
                                      const std::string& family) {
  std::multiset<std::string> out;
  for (const ScanItem& item : items) {
    if (item.cell.family == family) out.insert(item.cell.qualifier);
  }
  return out;
}

std::vector<ScanItem> RowItems(Env& env, const std::string& row) {
  auto tx = env.Begin();
  auto items = ScanAll(*tx, ScanRange::Rows(row, row + std::string(1, '\0')), 100);
  tx->Abort();
  return items;
}

}  // namespace

TEST_CASE("A range purge removes the entries between two stamps and nothing else", "[purge]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const std::string long_key(600, 'k');  // its cell key is stored hashed
  AddEntries(*env, "q", "e", Numbered("a", 300));
  AddEntries(*env, "q", "e", {long_key + "1", "b", long_key + "2"});
  AddEntries(*env, "q", "e", Numbered("c", 50));
  AddEntries(*env, "q2", "e", Numbered("other row ", 5));
  percolite_test::CommitSet(*env, Cell{"q", "f", "another family"}, "kept");

  auto consumer = env->Begin();
  const ScanRange row_q = ScanRange::Rows("q", std::string("q\0", 2));
  std::vector<ScanItem> seen = ScanAll(*consumer, row_q, 64);
  REQUIRE(seen.size() == 354);  // 353 entries and the other family's cell
  std::vector<ScanItem> entries;
  for (ScanItem& item : seen) {
    if (item.cell.family == "e") entries.push_back(std::move(item));
  }
  REQUIRE(entries.size() == 353);
  REQUIRE(entries[300].cell.qualifier.size() > 600);  // in commit order: long, "b", long
  REQUIRE(entries[302].cell.qualifier.size() > 600);

  // Committed after the consumer's snapshot: never in its range.
  AddEntries(*env, "q", "e", Numbered("d", 20));

  consumer->PurgeStamps("q", "e", Stamp(entries[10]), Stamp(entries[320]));
  // Its own reads no longer see the purged entries, by scan, get or count.
  std::vector<ScanItem> after = ScanAll(*consumer, row_q, 7);
  CHECK(Qualifiers(after, "e").size() == 353 - 311);
  CHECK_FALSE(consumer->Get(Ref(entries[10].cell)).has_value());
  CHECK_FALSE(consumer->Get(Ref(entries[300].cell)).has_value());
  CHECK_FALSE(consumer->Get(Ref(entries[302].cell)).has_value());
  CHECK(consumer->Get(Ref(entries[9].cell)) == "value of a10009");
  CHECK(consumer->Count(row_q, nullptr, 1000) == 353 - 311 + 1);
  // A write of its own to a purged cell wins over the purge.
  consumer->Set(Ref(entries[15].cell), "written again");
  CHECK(consumer->Get(Ref(entries[15].cell)) == "written again");
  consumer->Commit();

  std::multiset<std::string> expected;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i < 10 || i > 320 || i == 15) expected.insert(entries[i].cell.qualifier);
  }
  std::vector<ScanItem> now = RowItems(*env, "q");
  std::multiset<std::string> kept = Qualifiers(now, "e");
  size_t later = 0;
  for (const std::string& qualifier : kept) {
    if (qualifier.substr(percolite::kStampSize, 1) == "d") ++later;
  }
  CHECK(later == 20);
  for (const ScanItem& item : now) {
    if (item.cell.family == "e" && item.cell.qualifier.substr(percolite::kStampSize, 1) == "d") {
      expected.insert(item.cell.qualifier);
    }
  }
  CHECK(kept == expected);
  CHECK(Qualifiers(now, "f") == std::multiset<std::string>{"another family"});
  CHECK(RowItems(*env, "q2").size() == 5);
  env->Close();
}

TEST_CASE("A range purge over many pages deletes every entry in it", "[purge]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  AddEntries(*env, "before", "e", {"x"});
  AddEntries(*env, "q", "e", Numbered("a", 20000));
  AddEntries(*env, "r", "e", {"y"});
  std::vector<ScanItem> entries = RowItems(*env, "q");
  REQUIRE(entries.size() == 20000);

  auto middle = env->Begin();
  middle->PurgeStamps("q", "e", Stamp(entries[1000]), Stamp(entries[18999]));
  middle->Commit();
  std::vector<ScanItem> left = RowItems(*env, "q");
  REQUIRE(left.size() == 2000);
  CHECK(left[999].cell.qualifier == entries[999].cell.qualifier);
  CHECK(left[1000].cell.qualifier == entries[19000].cell.qualifier);

  // The rest in two transactions of one range each; purging gone entries again is no error.
  for (auto [first, last] : {std::pair{0, 999}, std::pair{0, 19999}}) {
    auto tx = env->Begin();
    tx->PurgeStamps("q", "e", Stamp(entries[first]), Stamp(entries[last]));
    tx->Commit();
  }
  CHECK(RowItems(*env, "q").empty());
  CHECK(RowItems(*env, "before").size() == 1);
  CHECK(RowItems(*env, "r").size() == 1);
  env->Close();
}

TEST_CASE("A range purge refuses malformed stamps and finished transactions", "[purge]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const std::string low(percolite::kStampSize, '\x01'), high(percolite::kStampSize, '\x02');
  auto tx = env->Begin();
  CHECK(ErrorCodeOf([&] { tx->PurgeStamps("q", "e", "short", high); }) ==
        ErrorCode::kInvalidArgument);
  CHECK(ErrorCodeOf([&] { tx->PurgeStamps("q", "e", low, high + "x"); }) ==
        ErrorCode::kInvalidArgument);
  CHECK(ErrorCodeOf([&] { tx->PurgeStamps("q", "e", high, low); }) == ErrorCode::kInvalidArgument);
  CHECK(ErrorCodeOf([&] { tx->PurgeStamps("", "e", low, high); }) == ErrorCode::kInvalidArgument);
  // The largest stamp has no successor: the range runs to the family's end.
  const std::string top(percolite::kStampSize, '\xff');
  tx->PurgeStamps("q", "e", low, top);
  tx->Commit();
  CHECK(ErrorCodeOf([&] { tx->PurgeStamps("q", "e", low, high); }) == ErrorCode::kWrongState);
  env->Close();
}
