// queue_rows::Entries: the bytes a queue read keeps, handed out as views that
// must stay valid while entries are added and after the object moves.
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "queues/queue_rows.h"

namespace {

using percolite::queue_rows::Entries;
using percolite::queue_rows::Entry;

TEST_CASE("Entries keeps every view valid across blocks and a move", "[queue_rows]") {
  Entries entries;
  // An empty value first, before any block exists.
  entries.Add("", "");
  std::vector<std::pair<std::string, std::string>> expected{{"", ""}};
  // Enough entries to fill several 64 KiB blocks, and values larger than one.
  for (int i = 0; i < 3000; ++i) {
    std::string qualifier = "stamp-" + std::to_string(i);
    std::string value(i % 1000 == 999 ? 200 * 1024 : static_cast<size_t>(i % 97),
                      static_cast<char>('a' + i % 26));
    entries.Add(qualifier, value);
    expected.emplace_back(std::move(qualifier), std::move(value));
  }
  const Entries moved = std::move(entries);
  REQUIRE(moved.list().size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const Entry& entry = moved.list()[i];
    REQUIRE(entry.qualifier == expected[i].first);
    REQUIRE(entry.value == expected[i].second);
  }
}

}  // namespace

TEST_CASE("Bucket names are six digits, in the order of their numbers", "[queue_rows]") {
  using percolite::queue_rows::BucketName;
  CHECK(BucketName(0) == "000000");
  CHECK(BucketName(7) == "000007");
  CHECK(BucketName(4096) == "004096");
  CHECK(BucketName(percolite::kMaxBuckets) == "999999");
  for (uint32_t bucket = 1; bucket < 2000; ++bucket) {
    CHECK(BucketName(bucket - 1) < BucketName(bucket));
  }
}
