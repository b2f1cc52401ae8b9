// The store's identity (identity.h): made once, the same for every caller
// racing to make it, kept, and its epoch moved on by a restored open.
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "percolite/identity.h"
#include "test_util.h"

using percolite::EnsureStoreIdentity;
using percolite::ReadStoreIdentity;
using percolite::StoreIdentity;

namespace {

std::optional<StoreIdentity> Read(percolite::TransactionSource& source) {
  auto tx = source.Begin();
  std::optional<StoreIdentity> identity = ReadStoreIdentity(*tx);
  tx->Abort();
  return identity;
}

}  // namespace

TEST_CASE("Callers racing to make the identity all get the one that was stored",
          "[identity][conformance]") {
  percolite_test::Layers layers(PERCOLITE_EACH_BACKEND());
  CHECK_FALSE(Read(*layers.source).has_value());
  constexpr int kThreads = 8;
  std::vector<StoreIdentity> made(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] { made[i] = EnsureStoreIdentity(*layers.source, false); });
  }
  for (std::thread& t : threads) t.join();
  const std::optional<StoreIdentity> stored = Read(*layers.source);
  REQUIRE(stored.has_value());
  CHECK(stored->id.size() == 32);
  CHECK(stored->id.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(stored->epoch == 1);
  for (const StoreIdentity& identity : made) {
    CHECK(identity.id == stored->id);
    CHECK(identity.epoch == 1);
  }
}

TEST_CASE("A new epoch keeps the identity; ensuring again changes nothing",
          "[identity][conformance]") {
  percolite_test::Layers layers(PERCOLITE_EACH_BACKEND());
  const StoreIdentity first = EnsureStoreIdentity(*layers.source, false);
  CHECK(EnsureStoreIdentity(*layers.source, false).id == first.id);
  const StoreIdentity restored = EnsureStoreIdentity(*layers.source, true);
  CHECK(restored.id == first.id);
  CHECK(restored.epoch == 2);
  CHECK(Read(*layers.source)->epoch == 2);
  CHECK(EnsureStoreIdentity(*layers.source, false).epoch == 2);
}

TEST_CASE("Two stores get different identities", "[identity]") {
  percolite_test::Layers one("memory"), two("memory");
  CHECK(EnsureStoreIdentity(*one.source, false).id != EnsureStoreIdentity(*two.source, false).id);
}
