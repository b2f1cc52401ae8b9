// The backend interface itself (percolite/backend.h): choosing a backend,
// asynchronous commits, and what is particular to the memory backend.
#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/memory_backend.h"
#include "percolite/backend.h"
#include "percolite/encoding.h"
#include "percolite/open_backend.h"
#include "test_util.h"

namespace {

using percolite::Backend;
using percolite::BackendOptions;
using percolite::CommitResult;
using percolite::ErrorCode;
using percolite::Mutation;
using percolite::OpenBackend;
using percolite_test::ErrorCodeOf;
using percolite_test::FastOptions;
using percolite_test::TempDir;

using percolite_test::Key;
using percolite_test::MessageOf;
using percolite_test::ReadNow;
using percolite_test::SetOf;

}  // namespace

TEST_CASE("OpenBackend picks the backend from the target, or from its name", "[backend]") {
  TempDir dir;
  CHECK(OpenBackend(":memory:", "", FastOptions())->capabilities().name == "memory");
  CHECK(OpenBackend("memory:", "", FastOptions())->capabilities().name == "memory");
  CHECK(OpenBackend(":memory:", "memory", FastOptions())->location() == ":memory:");
  auto plain = OpenBackend(dir.path(), "", FastOptions());
  CHECK(plain->capabilities().name == "lmdb");
  CHECK(plain->capabilities().durable);
  auto by_scheme = OpenBackend("lmdb://" + dir.path(), "", FastOptions());
  CHECK(by_scheme == plain);  // one lmdb backend per path and process
  by_scheme->ReleaseHandle();
  plain->ReleaseHandle();
}

TEST_CASE("OpenBackend refuses unknown schemes and names, naming them", "[backend]") {
  TempDir dir;
  CHECK(ErrorCodeOf([&] { OpenBackend("mysql://host/db", "", FastOptions()); }) ==
        ErrorCode::kInvalidArgument);
  CHECK(MessageOf([&] { OpenBackend("mysql://host/db", "", FastOptions()); }).find("'mysql://'") !=
        std::string::npos);
  CHECK(MessageOf([&] { OpenBackend(dir.path(), "sqlite", FastOptions()); }).find("'sqlite'") !=
        std::string::npos);
  CHECK(ErrorCodeOf([&] { OpenBackend(":memory:", "lmdb", FastOptions()); }) ==
        ErrorCode::kInvalidArgument);
  CHECK(ErrorCodeOf([&] { OpenBackend(dir.path(), "memory", FastOptions()); }) ==
        ErrorCode::kInvalidArgument);
  BackendOptions no_create = FastOptions();
  no_create.create = false;
  CHECK(MessageOf([&] { OpenBackend(":memory:", "", no_create); }).find("create=False") !=
        std::string::npos);
}

TEST_CASE("Each memory store is private to the handle that opened it", "[backend][memory]") {
  auto a = OpenBackend(":memory:", "", FastOptions());
  auto b = OpenBackend(":memory:", "", FastOptions());
  REQUIRE(a->Commit(0, {SetOf("r", "in a")}, {}).status.ok());
  CHECK(ReadNow(*a, "r") == "in a");
  CHECK(ReadNow(*b, "r") == std::nullopt);
  a->Close();
  CHECK(ErrorCodeOf([&] { a->BeginSnapshot(); }) == ErrorCode::kClosed);
  CHECK_NOTHROW(b->BeginSnapshot());
}

TEST_CASE("CommitAsync reports each commit once, with increasing commit_ts or a conflict",
          "[backend][conformance]") {
  TempDir dir;
  const std::string name = PERCOLITE_EACH_BACKEND();
  auto backend = OpenBackend(TargetFor(dir, name), name, FastOptions());
  const uint64_t start_ts = backend->BeginSnapshot()->start_ts();
  constexpr int kCommits = 200;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<CommitResult> results;
  for (int i = 0; i < kCommits; ++i) {
    backend->CommitAsync(start_ts, {SetOf("row" + std::to_string(i), "v")}, {},
                         [&](const CommitResult& result) {
                           std::lock_guard<std::mutex> lock(mu);
                           results.push_back(result);
                           cv.notify_all();
                         });
  }
  // One more writes a cell the first one wrote, from the same old snapshot.
  CommitResult conflict;
  bool conflict_done = false;
  backend->CommitAsync(start_ts, {SetOf("row0", "late")}, {}, [&](const CommitResult& result) {
    std::lock_guard<std::mutex> lock(mu);
    conflict = result;
    conflict_done = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30),
                        [&] { return conflict_done && results.size() == kCommits; }));
  }
  uint64_t last = start_ts;
  for (const CommitResult& r : results) {
    REQUIRE(r.status.ok());
    CHECK(r.commit_ts > last);  // reported in commit order
    last = r.commit_ts;
  }
  CHECK(conflict.status.code() == ErrorCode::kConflict);
  CHECK(ReadNow(*backend, "row0") == "v");
  CHECK(ReadNow(*backend, "row199") == "v");
  backend->ReleaseHandle();
}

TEST_CASE("The memory backend collects versions no snapshot can read", "[backend][memory]") {
  auto backend = percolite::MemoryBackend::Open(FastOptions());
  REQUIRE(backend->Commit(0, {SetOf("hot", "0")}, {}).status.ok());
  auto old = backend->BeginSnapshot();  // holds version "0"
  for (int i = 1; i <= 1000; ++i) {
    auto snapshot = backend->BeginSnapshot();
    const uint64_t start_ts = snapshot->start_ts();
    snapshot->Release();
    REQUIRE(backend->Commit(start_ts, {SetOf("hot", std::to_string(i))}, {}).status.ok());
  }
  CHECK(old->Get(Key("hot")) == "0");
  CHECK(backend->VersionCountForTesting() <= 3);  // "0", and the newest
  old->Release();
  // A deleted cell disappears once no snapshot predates its tombstone.
  const uint64_t ts = backend->BeginSnapshot()->start_ts();
  REQUIRE(backend->Commit(ts, {Mutation{Key("hot"), /*is_delete=*/true, ""}}, {}).status.ok());
  REQUIRE(backend->Commit(ts + 1, {SetOf("other", "x")}, {}).status.ok());
  CHECK(backend->VersionCountForTesting() == 1);
  CHECK(ReadNow(*backend, "hot") == std::nullopt);
}
