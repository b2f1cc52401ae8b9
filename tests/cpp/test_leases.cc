// Worker leases (leases.h): how live pools split the partitions, hand them
// over, and what the store records of each, over each backend.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "percolite/leases.h"
#include "percolite/transaction.h"
#include "test_util.h"

namespace {

using Store = percolite_test::Layers;

}  // namespace

TEST_CASE("Leases split the partitions between live pools and hand them over on Stop",
          "[leases][conformance]") {
  Store store(PERCOLITE_EACH_BACKEND());
  percolite::LeaseOptions options;
  // Long enough that a renewal delayed by a busy machine never lets a lease
  // lapse here (renewals come every second); the waits below allow 10 s.
  options.lease_seconds = 3;
  percolite::Leases a(store.source, options);
  percolite::Leases b(store.source, options);
  a.Start();
  CHECK(a.Share() == percolite::kLeasePartitions);  // alone so far
  b.Start();
  // a learns of b at its next renewal (every lease_seconds / 3).
  for (int i = 0; i < 500 && a.Share() == percolite::kLeasePartitions; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(a.Share() + b.Share() == percolite::kLeasePartitions);
  CHECK(a.Share() > percolite::kLeasePartitions / 4);
  CHECK(b.Share() > percolite::kLeasePartitions / 4);
  for (uint64_t hash = 0; hash < 5000; ++hash) {
    REQUIRE(a.Mine(hash) != b.Mine(hash));  // every partition has one owner
  }
  {
    auto tx = store.source->Begin();
    auto holders = percolite::Leases::Holders(*tx, 0);
    tx->Abort();
    REQUIRE(holders.size() == 2);
    CHECK(holders[0].partitions + holders[1].partitions == percolite::kLeasePartitions);
    for (const auto& holder : holders) {
      CHECK(holder.expires_unix - holder.renewed_unix == Approx(options.lease_seconds));
    }
  }
  b.Stop();  // deletes its lease: a takes everything at its next renewal
  for (int i = 0; i < 500 && a.Share() != percolite::kLeasePartitions; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(a.Share() == percolite::kLeasePartitions);
  a.Stop();
  auto tx = store.source->Begin();
  CHECK(percolite::Leases::Holders(*tx, 0).empty());
  tx->Abort();
}
