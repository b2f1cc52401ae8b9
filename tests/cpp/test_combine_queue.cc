// The combine queue's native combiners, the stamped keys queue entries use,
// and a lingering processor driven by hand.
#include <catch2/catch.hpp>
#include <climits>
#include <cstring>

#include "backend/lmdb_backend.h"
#include "percolite/combine_queue.h"
#include "percolite/encoding.h"
#include "percolite/transaction.h"
#include "test_util.h"

using percolite::CombineNative;
using percolite::NativeCombiner;
using percolite::ValueType;

namespace {

using percolite_test::Int64;

std::optional<std::string> Combine(NativeCombiner c, ValueType t, size_t n,
                                   std::vector<std::string> values) {
  std::optional<std::string> result;
  percolite::Status status =
      CombineNative(c, t, n, std::vector<std::string_view>(values.begin(), values.end()), &result);
  REQUIRE(status.ok());
  return result;
}

}  // namespace

TEST_CASE("Native sum adds int64 values and deletes a zero sum") {
  CHECK(Combine(NativeCombiner::kSum, ValueType::kInt64, 0, {Int64(5), Int64(-2), Int64(7)}) ==
        Int64(10));
  CHECK_FALSE(Combine(NativeCombiner::kSum, ValueType::kInt64, 0, {Int64(3), Int64(-3)}));
}

TEST_CASE("Native sum of int64 tuples is elementwise and deletes an all-zero tuple") {
  CHECK(Combine(NativeCombiner::kSum, ValueType::kInt64Tuple, 2,
                {Int64(1) + Int64(2), Int64(3) + Int64(-2)}) == Int64(4) + Int64(0));
  CHECK_FALSE(Combine(NativeCombiner::kSum, ValueType::kInt64Tuple, 2,
                      {Int64(1) + Int64(2), Int64(-1) + Int64(-2)}));
}

TEST_CASE("Native sum fails when the result overflows, not when a step does") {
  std::optional<std::string> result;
  CHECK_FALSE(CombineNative(NativeCombiner::kSum, ValueType::kInt64, 0,
                            {Int64(INT64_MAX), Int64(1)}, &result)
                  .ok());
  CHECK(Combine(NativeCombiner::kSum, ValueType::kInt64, 0,
                {Int64(INT64_MAX), Int64(1), Int64(-1)}) == Int64(INT64_MAX));
}

TEST_CASE("Native combiners reject a stored value of the wrong width, naming its size") {
  std::optional<std::string> result;
  // A 3-byte value among int64s (a store written with another value codec).
  percolite::Status status =
      CombineNative(NativeCombiner::kSum, ValueType::kInt64, 0, {Int64(1), "abc"}, &result);
  CHECK(status.code() == percolite::ErrorCode::kInvalidArgument);
  CHECK(status.message() == "combining: a stored value has 3 bytes, expected 8");
  CHECK_FALSE(result);
  // A one-element int64 where pairs are expected.
  status = CombineNative(NativeCombiner::kMax, ValueType::kInt64Tuple, 2,
                         {Int64(1) + Int64(2), Int64(4)}, &result);
  CHECK(status.message() == "combining: a stored value has 8 bytes, expected 16");
  CHECK_FALSE(result);
}

TEST_CASE("Native max, min and last") {
  CHECK(Combine(NativeCombiner::kMax, ValueType::kInt64, 0, {Int64(-5), Int64(9), Int64(2)}) ==
        Int64(9));
  CHECK(Combine(NativeCombiner::kMin, ValueType::kInt64, 0, {Int64(-5), Int64(9), Int64(2)}) ==
        Int64(-5));
  CHECK(Combine(NativeCombiner::kLast, ValueType::kBytes, 0, {"a", "b", "c"}) == "c");
}

TEST_CASE("A value of the wrong width is refused") {
  std::optional<std::string> result;
  CHECK_FALSE(
      CombineNative(NativeCombiner::kSum, ValueType::kInt64, 0, {Int64(1), "abc"}, &result).ok());
}

TEST_CASE("Stamped keys put commit_ts and sequence in front of the qualifier: commit order") {
  std::string key = percolite::EncodeCellKey({"row", "u", "k"});
  std::string a = percolite::StampedKey(key, 5, 0);
  std::string b = percolite::StampedKey(key, 5, 1);
  std::string c = percolite::StampedKey(key, 6, 0);
  CHECK(a < b);
  CHECK(b < c);
  // Whatever the qualifier, a later commit sorts after: a commit appends.
  CHECK(percolite::StampedKey(percolite::EncodeCellKey({"row", "u", "zzz"}), 5, 1) < c);
  CHECK(b < percolite::StampedKey(percolite::EncodeCellKey({"row", "u", "a"}), 6, 0));
  percolite::Cell cell;
  REQUIRE(percolite::DecodeCellKey(a, &cell));
  CHECK(cell.row == "row");
  CHECK(cell.qualifier.size() == 12 + 1);
  CHECK(cell.qualifier.substr(12) == "k");
  CHECK(percolite::ReadUint64BE(cell.qualifier) == 5);
}

namespace {

void AddUpdate(percolite::Env& env, const percolite::CombineQueue& queue, int64_t value,
               const std::string& key = "hot") {
  auto tx = env.Begin();
  queue.Add(*tx, {{key, Int64(value)}});
  tx->Commit();
}

// One bucket named "cq"; each run's reported changes are appended to `reports`.
percolite::CombineQueueOptions RecordingOptions(
    std::vector<std::vector<percolite::Change>>* reports) {
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

size_t ChangeCount(const std::vector<std::vector<percolite::Change>>& reports) {
  size_t count = 0;
  for (const auto& report : reports) count += report.size();
  return count;
}

std::optional<std::string> Current(percolite::Env& env, const percolite::CombineQueue& queue,
                                   const std::string& key = "hot") {
  auto tx = env.Begin();
  auto value = queue.Get(*tx, key);
  tx->Abort();
  return value;
}

}  // namespace

TEST_CASE("A lingering combine queue folds updates that keep arriving in one run", "[combine]") {
  percolite_test::TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  std::vector<std::vector<percolite::Change>> reports;
  percolite::CombineQueueOptions options = RecordingOptions(&reports);
  options.buffer_size = 100;
  options.linger_seconds = 0.4;
  auto queue = percolite::CombineQueue::Create(options);
  // A full buffer first, folded at once: the bucket is no longer young (a
  // young one goes as soon as as many updates wait as its runs ever took).
  for (int i = 0; i < 100; ++i) AddUpdate(*env, *queue, 1, "old" + std::to_string(i));
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  CHECK(ChangeCount(reports) == 100);
  AddUpdate(*env, *queue, 1);
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == Approx(0.1));  // short: wait a quarter
  AddUpdate(*env, *queue, 2);
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) > 0);  // more arrived: wait again
  CHECK_FALSE(Current(*env, *queue).has_value());
  CHECK(ChangeCount(reports) == 100);
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);  // nothing new: fold both
  CHECK(Current(*env, *queue) == Int64(3));
  CHECK(ChangeCount(reports) == 101);

  options.linger_seconds = 3601;
  CHECK(percolite_test::ErrorCodeOf([&] { percolite::CombineQueue::Create(options); }) ==
        percolite::ErrorCode::kInvalidArgument);
}

TEST_CASE("A run folds every queued update of its keys, even past buffer_size", "[combine]") {
  percolite_test::TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  std::vector<std::vector<percolite::Change>> reports;
  percolite::CombineQueueOptions options = RecordingOptions(&reports);
  options.buffer_size = 1;
  auto queue = percolite::CombineQueue::Create(options);
  // Queued in commit order: a, b, a, c, a. The first run takes the oldest
  // update's key, "a", with all three of its updates (guarantee 1).
  AddUpdate(*env, *queue, 1, "a");
  AddUpdate(*env, *queue, 10, "b");
  AddUpdate(*env, *queue, 2, "a");
  AddUpdate(*env, *queue, 100, "c");
  AddUpdate(*env, *queue, 4, "a");
  REQUIRE(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(reports.size() == 1);
  REQUIRE(reports[0].size() == 1);
  CHECK(reports[0][0].key == "a");
  CHECK_FALSE(reports[0][0].old_value);
  CHECK(reports[0][0].new_value == Int64(7));
  CHECK_FALSE(Current(*env, *queue, "b").has_value());
  // Updates are left: the bucket is notified again, and the next runs take
  // the oldest remaining key each.
  {
    auto tx = env->Begin();
    CHECK(tx->NotificationPending(percolite::EncodeCellKey(
        {"cq:b:000000", queue->NotifyColumn().family, queue->NotifyColumn().qualifier})));
    tx->Abort();
  }
  AddUpdate(*env, *queue, 8, "a");
  REQUIRE(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(reports.size() == 2);
  CHECK(reports[1].size() == 1);
  CHECK(reports[1][0].key == "b");
  REQUIRE(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(reports.size() == 3);
  CHECK(reports[2][0].key == "c");
  REQUIRE(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(reports.size() == 4);
  CHECK(reports[3][0].key == "a");
  CHECK(reports[3][0].old_value == Int64(7));  // guarantee 2
  CHECK(reports[3][0].new_value == Int64(15));
  CHECK(Current(*env, *queue, "b") == Int64(10));
  CHECK(Current(*env, *queue, "c") == Int64(100));
}
