// The combine queue's native combiners and the stamped keys queue entries use.
#include <catch2/catch.hpp>
#include <climits>
#include <cstring>

#include "percolite/combine_queue.h"
#include "percolite/encoding.h"
#include "percolite/store.h"

using percolite::CombineNative;
using percolite::NativeCombiner;
using percolite::ValueType;

namespace {

std::string Int64(int64_t v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  std::string out;
  percolite::AppendUint64BE(&out, u);
  return out;
}

std::optional<std::string> Combine(NativeCombiner c, ValueType t, size_t n,
                                   std::vector<std::string> values) {
  std::optional<std::string> result;
  percolite::Status status = CombineNative(c, t, n, values, &result);
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

TEST_CASE("Stamped keys append commit_ts and sequence to the qualifier, in order") {
  std::string key = percolite::EncodeCellKey({"row", "u", "k"});
  std::string a = percolite::StampedKey(key, 5, 0);
  std::string b = percolite::StampedKey(key, 5, 1);
  std::string c = percolite::StampedKey(key, 6, 0);
  CHECK(a < b);
  CHECK(b < c);
  percolite::Cell cell;
  REQUIRE(percolite::DecodeCellKey(a, &cell));
  CHECK(cell.row == "row");
  CHECK(cell.qualifier.size() == 1 + 12);
}
