// Group commit (backend/lmdb_backend.h): validation of batch members against each
// other, and batching of concurrent commits into fewer LMDB write transactions.
#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/lmdb_backend.h"
#include "percolite/encoding.h"
#include "percolite/env.h"
#include "percolite/transaction.h"
#include "test_util.h"

namespace {

using percolite::Cell;
using percolite::CommitResult;
using percolite::Env;
using percolite::ErrorCode;
using percolite::Mutation;
using Store = percolite::LmdbBackend;
using percolite_test::CommitSet;
using percolite_test::FastOptions;
using percolite_test::ReadCommitted;
using percolite_test::Ref;
using percolite_test::TempDir;

std::string Key(const Cell& cell) { return percolite::EncodeCellKey(Ref(cell)); }

Mutation SetOf(const Cell& cell, const std::string& value) {
  return Mutation{Key(cell), /*is_delete=*/false, value};
}

Mutation DeleteOf(const Cell& cell) { return Mutation{Key(cell), /*is_delete=*/true, ""}; }

uint64_t CurrentStartTs(Store& store) {
  auto snapshot = store.BeginSnapshot();
  const uint64_t ts = snapshot->start_ts();
  snapshot->Release();
  return ts;
}

}  // namespace

TEST_CASE("In one batch, a member writing a cell an earlier member wrote is refused whole",
          "[group-commit]") {
  TempDir dir;
  auto env = Env::Open(dir.path(), FastOptions());
  const Cell before{"a", "f", "q"}, shared{"m", "f", "q"}, after{"z", "f", "q"};
  CommitSet(*env, before, "a0");
  std::shared_ptr<Store> store = std::dynamic_pointer_cast<Store>(env->backend());
  const uint64_t start_ts = CurrentStartTs(*store);
  const percolite::BackendStats stats_before = store->Stats();

  // The refused member writes cells sorted before and after the shared one.
  const std::vector<CommitResult> results = store->CommitBatchForTesting({
      {start_ts, {SetOf(shared, "first")}},
      {start_ts, {SetOf(before, "second"), SetOf(shared, "second"), SetOf(after, "second")}},
  });
  REQUIRE(results.size() == 2);
  CHECK(results[0].status.ok());
  CHECK(results[0].commit_ts > start_ts);
  CHECK(results[1].status.code() == ErrorCode::kConflict);

  CHECK(ReadCommitted(*env, shared) == "first");
  CHECK(ReadCommitted(*env, before) == "a0");
  CHECK(ReadCommitted(*env, after) == std::nullopt);

  const percolite::BackendStats stats = store->Stats();
  CHECK(stats.batches == stats_before.batches + 1);
  CHECK(stats.commits == stats_before.commits + 1);
  CHECK(stats.conflicts == stats_before.conflicts + 1);
}

TEST_CASE("In one batch, a member setting a cell an earlier member deleted is refused",
          "[group-commit]") {
  TempDir dir;
  auto env = Env::Open(dir.path(), FastOptions());
  const Cell cell{"never", "f", "q"}, other{"other", "f", "q"};
  std::shared_ptr<Store> store = std::dynamic_pointer_cast<Store>(env->backend());
  const uint64_t start_ts = CurrentStartTs(*store);
  const std::vector<CommitResult> results = store->CommitBatchForTesting({
      {start_ts, {DeleteOf(cell)}},
      {start_ts, {SetOf(cell, "second"), SetOf(other, "second")}},
  });
  REQUIRE(results.size() == 2);
  CHECK(results[0].status.ok());
  CHECK(results[1].status.code() == ErrorCode::kConflict);
  CHECK(ReadCommitted(*env, cell) == std::nullopt);
  CHECK(ReadCommitted(*env, other) == std::nullopt);
}

TEST_CASE("In one batch, members writing disjoint cells both commit with consecutive stamps",
          "[group-commit]") {
  TempDir dir;
  auto env = Env::Open(dir.path(), FastOptions());
  const Cell x{"x", "f", "q"}, y{"y", "f", "q"}, y2{"y", "f", "q2"};
  CommitSet(*env, x, "x0");
  std::shared_ptr<Store> store = std::dynamic_pointer_cast<Store>(env->backend());
  const uint64_t start_ts = CurrentStartTs(*store);
  const uint64_t batches_before = store->Stats().batches;

  const std::vector<CommitResult> results = store->CommitBatchForTesting({
      {start_ts, {SetOf(x, "x1"), SetOf(y2, "y2")}},
      {start_ts, {SetOf(y, "y1")}},
  });
  REQUIRE(results.size() == 2);
  REQUIRE(results[0].status.ok());
  REQUIRE(results[1].status.ok());
  CHECK(results[0].commit_ts > start_ts);
  CHECK(results[1].commit_ts == results[0].commit_ts + 1);
  CHECK(store->Stats().batches == batches_before + 1);

  CHECK(ReadCommitted(*env, x) == "x1");
  CHECK(ReadCommitted(*env, y) == "y1");
  CHECK(ReadCommitted(*env, y2) == "y2");
  // The next snapshot covers the whole batch.
  CHECK(CurrentStartTs(*store) == results[1].commit_ts);
}

TEST_CASE("On lmdb, the joinable records of one batch are stored as one, in commit order",
          "[group-commit]") {
  TempDir dir;
  auto env = Env::Open(dir.path(), FastOptions());
  std::shared_ptr<Store> store = std::dynamic_pointer_cast<Store>(env->backend());
  const uint64_t start_ts = CurrentStartTs(*store);
  std::vector<std::pair<uint64_t, std::vector<Mutation>>> batch;
  for (auto& mutations : percolite_test::JoinableBatch()) {
    batch.emplace_back(start_ts, std::move(mutations));
  }
  percolite_test::CheckJoinedBatch(*store, store->CommitBatchForTesting(batch));
}

TEST_CASE("Concurrent commits with sync=full share LMDB write transactions", "[group-commit]") {
  TempDir dir;
  percolite::BackendOptions options;
  options.sync = percolite::SyncMode::kFull;
  auto env = Env::Open(dir.path(), options);
  constexpr int kThreads = 8, kPerThread = 15;

  std::mutex mu;
  std::condition_variable cv;
  int ready = 0;
  std::vector<std::vector<uint64_t>> stamps(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      {
        std::unique_lock<std::mutex> lock(mu);
        ++ready;
        cv.notify_all();
        cv.wait(lock, [&] { return ready == kThreads; });
      }
      for (int i = 0; i < kPerThread; ++i) {
        auto tx = env->Begin();
        tx->Set(Ref(Cell{"t" + std::to_string(t), "f", std::to_string(i)}), std::to_string(i));
        tx->Commit();
        stamps[t].push_back(tx->commit_ts().value_or(0));
      }
    });
  }
  for (auto& thread : threads) thread.join();

  const percolite::BackendStats stats = env->Stats();
  INFO("commits " << stats.commits << " batches " << stats.batches);
  CHECK(stats.commits == kThreads * kPerThread);
  CHECK(stats.conflicts == 0);
  CHECK(stats.batches < stats.commits);

  std::set<uint64_t> unique;
  for (const auto& mine : stamps) unique.insert(mine.begin(), mine.end());
  CHECK(unique.count(0) == 0);
  CHECK(unique.size() == kThreads * kPerThread);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      CHECK(ReadCommitted(*env, Cell{"t" + std::to_string(t), "f", std::to_string(i)}) ==
            std::to_string(i));
    }
  }
}

TEST_CASE("A lone committer runs its group commit on its own thread", "[group-commit]") {
  const percolite::SyncMode sync =
      GENERATE(percolite::SyncMode::kNone, percolite::SyncMode::kMeta, percolite::SyncMode::kFull);
  TempDir dir;
  percolite::BackendOptions options;
  options.sync = sync;
  auto env = Env::Open(dir.path(), options);
  constexpr int kCommits = 20;
  for (int i = 0; i < kCommits; ++i) CommitSet(*env, Cell{"r", "f", std::to_string(i)}, "v");

  // No other commit was ever in progress, so no commit was handed to the
  // writer thread: each one was a batch of its own, run by its committer.
  const percolite::BackendStats stats = env->Stats();
  CHECK(stats.commits == kCommits);
  CHECK(stats.batches == kCommits);
  CHECK(stats.inline_batches == kCommits);
  for (int i = 0; i < kCommits; ++i) {
    CHECK(ReadCommitted(*env, Cell{"r", "f", std::to_string(i)}) == "v");
  }
}

TEST_CASE(
    "Read-modify-write from many threads loses no update while committers and the writer "
    "take turns leading",
    "[group-commit]") {
  const percolite::SyncMode sync = GENERATE(percolite::SyncMode::kNone, percolite::SyncMode::kFull);
  TempDir dir;
  percolite::BackendOptions options;
  options.sync = sync;
  auto env = Env::Open(dir.path(), options);
  constexpr int kThreads = 6, kPerThread = 30;
  const Cell counter{"counter", "n", ""};
  const Cell hits{"hits", "n", ""};
  std::atomic<int> retries{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int done = 0; done < kPerThread;) {
        auto tx = env->Begin();
        const long n = std::stol(tx->Get(Ref(counter)).value_or("0"));
        tx->Set(Ref(counter), std::to_string(n + 1));
        // A cell of its own per commit too: a refused commit must apply neither.
        tx->Set(Ref(Cell{"t" + std::to_string(t), "f", std::to_string(done)}), std::to_string(n));
        if (percolite_test::ErrorCodeOf([&] { tx->Commit(); }) == ErrorCode::kOk) {
          ++done;
        } else {
          ++retries;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();

  const percolite::BackendStats stats = env->Stats();
  INFO("batches " << stats.batches << " inline " << stats.inline_batches << " retries "
                  << retries.load());
  CHECK(ReadCommitted(*env, counter) == std::to_string(kThreads * kPerThread));
  CHECK(stats.commits == kThreads * kPerThread);
  CHECK(stats.conflicts == static_cast<uint64_t>(retries.load()));
  CHECK(stats.inline_batches <= stats.batches);
  // Each committed increment read a distinct value: none was lost or doubled.
  std::set<std::string> seen;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      auto value = ReadCommitted(*env, Cell{"t" + std::to_string(t), "f", std::to_string(i)});
      REQUIRE(value.has_value());
      seen.insert(*value);
    }
  }
  CHECK(seen.size() == kThreads * kPerThread);
}
