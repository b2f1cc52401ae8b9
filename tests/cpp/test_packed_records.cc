// Packed queue records (queues/queue_rows.h): a combine-queue add writes one
// record per touched bucket, runs take whole records and still fold each
// key's updates in commit order, single-entry records of older stores read
// as before, and parked keys stay in the record they shared.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "percolite/combine_queue.h"
#include "percolite/encoding.h"
#include "percolite/transaction.h"
#include "queues/queue_rows.h"
#include "test_util.h"

namespace {

using percolite_test::Int64;

constexpr const char* kRow = "cq:u:000000";  // the only bucket's entry row

// The records of kRow in family `family`: (qualifier, value), in order.
std::vector<std::pair<std::string, std::string>> Records(percolite::Env& env,
                                                         std::string_view family) {
  auto tx = env.Begin();
  percolite::ScanRange range;
  percolite::AppendEscapedPart(&range.from, kRow);
  percolite::AppendEscapedPart(&range.from, family);
  range.end = percolite::PrefixSuccessor(range.from);
  std::vector<std::pair<std::string, std::string>> records;
  tx->Visit(range, nullptr, [&](std::string_view key, std::string_view value) {
    percolite::Cell cell;
    REQUIRE(percolite::DecodeCellKey(key, &cell));
    records.emplace_back(cell.qualifier, std::string(value));
    return true;
  });
  tx->Abort();
  return records;
}

std::vector<std::pair<std::string, std::string>> Decoded(const std::string& value) {
  std::vector<std::pair<std::string_view, std::string_view>> views;
  REQUIRE(percolite::queue_rows::DecodePacked(value, &views));
  return {views.begin(), views.end()};
}

// Adds `updates` in one transaction, packed (as CombineQueue::Add does) or as
// single-entry records (as format percolite/4 stored them).
void Add(percolite::Env& env, const percolite::CombineQueue& queue,
         const std::vector<std::pair<std::string, std::string>>& updates, bool packed = true) {
  auto tx = env.Begin();
  if (packed) {
    queue.Add(*tx, updates);
  } else {
    percolite::queue_rows::Write(
        *tx, "cq", "u", "u", "cq:cq", 1, [](std::string_view) { return 0u; }, updates,
        /*packed=*/false);
  }
  tx->Commit();
}

std::optional<std::string> Current(percolite::Env& env, const percolite::CombineQueue& queue,
                                   const std::string& key) {
  auto tx = env.Begin();
  auto value = queue.Get(*tx, key);
  tx->Abort();
  return value;
}

percolite::CombineQueueOptions Options(std::vector<std::vector<percolite::Change>>* reports) {
  percolite::CombineQueueOptions options;
  options.id = "cq";
  options.buckets = 1;
  options.on_change = [reports](const std::shared_ptr<percolite::Transaction>&,
                                const std::vector<percolite::Change>& changes) {
    reports->push_back(changes);
    return percolite::Status::Ok();
  };
  return options;
}

}  // namespace

TEST_CASE("Packed records round-trip and malformed ones are refused", "[packed]") {
  std::string value;
  percolite::AppendPackedHeader(&value, 3);
  percolite::queue_rows::AppendPackedEntry(&value, "", "");
  percolite::queue_rows::AppendPackedEntry(&value, std::string(200, 'k'), std::string(300, '\0'));
  percolite::queue_rows::AppendPackedEntry(&value, "a", "b");
  const auto entries = Decoded(value);
  REQUIRE(entries.size() == 3);
  CHECK(entries[0] == std::make_pair(std::string(), std::string()));
  CHECK(entries[1] == std::make_pair(std::string(200, 'k'), std::string(300, '\0')));
  CHECK(entries[2] == std::make_pair(std::string("a"), std::string("b")));
  uint32_t count = 0;
  REQUIRE(percolite::PackedCount(value, &count));
  CHECK(count == 3);
  std::vector<std::pair<std::string_view, std::string_view>> out;
  CHECK_FALSE(percolite::queue_rows::DecodePacked(value.substr(0, value.size() - 1), &out));
  out.clear();
  CHECK_FALSE(percolite::queue_rows::DecodePacked(value + "x", &out));
  out.clear();
  CHECK_FALSE(percolite::queue_rows::DecodePacked("", &out));
  out.clear();
  std::string wrong_version = value;
  wrong_version[0] = 2;
  CHECK_FALSE(percolite::queue_rows::DecodePacked(wrong_version, &out));
  out.clear();
  CHECK_FALSE(
      percolite::queue_rows::DecodePacked(std::string("\x01\xff\xff\xff\xff\xff", 6), &out));
}

TEST_CASE("Joined records hold both records' entries, within the limits", "[packed]") {
  const auto record = [](uint32_t count, const std::string& body) {
    std::string value;
    percolite::AppendPackedHeader(&value, count);
    return value + body;
  };
  std::string joined;
  percolite::AppendPackedHeader(&joined, 1);
  percolite::queue_rows::AppendPackedEntry(&joined, "a", "1");
  std::string more;
  percolite::AppendPackedHeader(&more, 2);
  percolite::queue_rows::AppendPackedEntry(&more, "b", "2");
  percolite::queue_rows::AppendPackedEntry(&more, "a", "3");
  REQUIRE(percolite::JoinPacked(&joined, more));
  const auto entries = Decoded(joined);
  using Entry = std::pair<std::string, std::string>;
  CHECK(entries == std::vector<Entry>{{"a", "1"}, {"b", "2"}, {"a", "3"}});

  // The count's varint grows a byte past 127 entries: the header is rewritten.
  std::string big = record(127, std::string(127 * 2, '\0'));
  REQUIRE(percolite::JoinPacked(&big, record(1, std::string(2, '\0'))));
  CHECK(Decoded(big).size() == 128);
  CHECK(big.size() == 3 + 128 * 2);

  // Refused, and left as it was: past the entry or byte limit, or a header
  // that does not decode.
  std::string full = record(percolite::kPackedMaxEntries, "");
  const std::string before = full;
  CHECK_FALSE(percolite::JoinPacked(&full, record(1, "")));
  CHECK(full == before);
  std::string large = record(1, std::string(percolite::kPackedMaxBytes - 10, 'x'));
  CHECK_FALSE(percolite::JoinPacked(&large, record(1, std::string(11, 'y'))));
  CHECK(percolite::JoinPacked(&large, record(1, std::string(10, 'y'))));
  std::string some = record(1, "xy");
  CHECK_FALSE(percolite::JoinPacked(&some, std::string("\x02\x01xy", 4)));
  CHECK_FALSE(percolite::JoinPacked(&some, ""));
  CHECK(some == record(1, "xy"));
}

TEST_CASE("An add of many updates to one bucket writes one record", "[packed]") {
  percolite_test::TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  std::vector<std::vector<percolite::Change>> reports;
  auto queue = percolite::CombineQueue::Create(Options(&reports));
  std::vector<std::pair<std::string, std::string>> updates;
  for (int i = 0; i < 50; ++i) updates.emplace_back("k" + std::to_string(i % 20), Int64(i));
  Add(*env, *queue, updates);
  const auto records = Records(*env, "U");
  REQUIRE(records.size() == 1);
  CHECK(records[0].first.size() == percolite::kStampSize);
  CHECK(Decoded(records[0].second) == updates);
  CHECK(Records(*env, "u").empty());
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  for (int k = 0; k < 20; ++k) {
    int64_t sum = 0;
    for (int i = k; i < 50; i += 20) sum += i;
    CHECK(Current(*env, *queue, "k" + std::to_string(k)) ==
          (sum ? std::optional(Int64(sum)) : std::nullopt));
  }
  CHECK(Records(*env, "U").empty());

  // A very large add is split into records of at most kPackedMaxEntries.
  updates.clear();
  for (size_t i = 0; i < percolite::kPackedMaxEntries + 5; ++i) {
    updates.emplace_back("big" + std::to_string(i), Int64(1));
  }
  Add(*env, *queue, updates);
  const auto big = Records(*env, "U");
  REQUIRE(big.size() == 2);
  CHECK(Decoded(big[0].second).size() == percolite::kPackedMaxEntries);
  CHECK(Decoded(big[1].second).size() == 5);
}

TEST_CASE("Single-entry records of an older store fold with packed ones, in order", "[packed]") {
  percolite_test::TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  std::vector<std::vector<percolite::Change>> reports;
  percolite::CombineQueueOptions options = Options(&reports);
  options.native = percolite::NativeCombiner::kLast;
  options.value_type = percolite::ValueType::kBytes;
  auto queue = percolite::CombineQueue::Create(options);
  Add(*env, *queue, {{"a", "1"}, {"b", "1"}, {"", "1"}}, /*packed=*/false);
  Add(*env, *queue, {{"a", "2"}}, /*packed=*/false);
  CHECK(Records(*env, "u").size() == 4);
  Add(*env, *queue, {{"a", "3"}, {"c", "3"}, {"", "3"}});
  Add(*env, *queue, {{"b", "4"}, {"a", "4"}});
  CHECK(Records(*env, "U").size() == 2);
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  CHECK(Current(*env, *queue, "a") == "4");
  CHECK(Current(*env, *queue, "b") == "4");
  CHECK(Current(*env, *queue, "c") == "3");
  CHECK(Current(*env, *queue, "") == "3");
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].size() == 4);  // each key reported once, folded once
  CHECK(Records(*env, "u").empty());
  CHECK(Records(*env, "U").empty());
}

TEST_CASE("A run takes every queued update of its keys, from later records in part", "[packed]") {
  percolite_test::TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  std::vector<std::vector<percolite::Change>> reports;
  percolite::CombineQueueOptions options = Options(&reports);
  options.native = percolite::NativeCombiner::kLast;
  options.value_type = percolite::ValueType::kBytes;
  options.buffer_size = 1;
  auto queue = percolite::CombineQueue::Create(options);
  // Records: {a}, {b}, {a, b}, {c}, {a}. The first run takes {a} (its
  // batch) and every later update of a (guarantee 1): a's of {a, b}, which
  // is written back holding b's alone, in its place, and {a}.
  Add(*env, *queue, {{"a", "1"}});
  Add(*env, *queue, {{"b", "2"}});
  Add(*env, *queue, {{"a", "3"}, {"b", "3"}});
  Add(*env, *queue, {{"c", "4"}});
  Add(*env, *queue, {{"a", "5"}});
  const auto before = Records(*env, "U");
  REQUIRE(before.size() == 5);
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(reports.size() == 1);
  REQUIRE(reports[0].size() == 1);
  CHECK(reports[0][0].key == "a");
  CHECK(reports[0][0].new_value == "5");
  const auto after = Records(*env, "U");
  REQUIRE(after.size() == 3);
  CHECK(after[0] == before[1]);
  CHECK(after[1].first == before[2].first);
  CHECK(Decoded(after[1].second) == std::vector<std::pair<std::string, std::string>>{{"b", "3"}});
  CHECK(after[2] == before[3]);
  // Then b's two updates, in commit order, and c.
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(reports.size() == 2);
  REQUIRE(reports[1].size() == 1);
  CHECK(reports[1][0].key == "b");
  CHECK(reports[1][0].new_value == "3");
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(reports.size() == 3);
  CHECK(reports[2][0].key == "c");
  CHECK(Records(*env, "U").empty());
  CHECK(Current(*env, *queue, "a") == "5");
}

TEST_CASE("A parked key's updates stay in the packed record it shared", "[packed]") {
  percolite_test::TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  std::vector<std::vector<percolite::Change>> reports;
  percolite::CombineQueueOptions options = Options(&reports);
  options.native = percolite::NativeCombiner::kNone;
  options.max_attempts = 1;  // the first failure parks
  options.combiner = [](std::string_view key, const std::vector<std::string_view>& values,
                        std::optional<std::string>* result) {
    if (key == "bad") return percolite::Status::Make(percolite::ErrorCode::kCallback, "poison");
    return percolite::CombineNative(percolite::NativeCombiner::kSum, percolite::ValueType::kInt64,
                                    0, values, result);
  };
  auto queue = percolite::CombineQueue::Create(options);
  Add(*env, *queue, {{"good", Int64(1)}, {"bad", Int64(5)}, {"other", Int64(2)}});
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  CHECK(Current(*env, *queue, "good") == Int64(1));
  CHECK(Current(*env, *queue, "other") == Int64(2));
  auto records = Records(*env, "U");
  REQUIRE(records.size() == 1);
  CHECK(Decoded(records[0].second) ==
        std::vector<std::pair<std::string, std::string>>{{"bad", Int64(5)}});
  // Later runs skip it and leave it where it is, with the later update of
  // the parked key; the others go on.
  Add(*env, *queue, {{"bad", Int64(1)}, {"good", Int64(10)}});
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  CHECK(Current(*env, *queue, "good") == Int64(11));
  records = Records(*env, "U");
  REQUIRE(records.size() == 2);
  CHECK(Decoded(records[1].second) ==
        std::vector<std::pair<std::string, std::string>>{{"bad", Int64(1)}});
}

TEST_CASE("A packed record that does not decode fails the run as corruption", "[packed]") {
  percolite_test::TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  std::vector<std::vector<percolite::Change>> reports;
  auto queue = percolite::CombineQueue::Create(Options(&reports));
  Add(*env, *queue, {{"a", Int64(1)}});
  const std::string qualifier = Records(*env, "U").at(0).first;
  {
    auto tx = env->Begin();
    tx->Set({kRow, "U", qualifier}, std::string("\x01\x05garbage", 9));
    tx->Commit();
  }
  auto tx = env->Begin();
  const auto column = queue->NotifyColumn();
  const percolite::Cell cell{"cq:b:000000", column.family, column.qualifier};
  const percolite::Status status = queue->Processor()(tx, cell);
  CHECK(status.code() == percolite::ErrorCode::kCorruption);
  tx->Abort();
}
