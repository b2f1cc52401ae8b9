// The export queue's processor, driven by hand: what it hands the exporter,
// what it deletes, and what a failing exporter leaves behind.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include "percolite/encoding.h"
#include "percolite/export_queue.h"
#include "percolite/transaction.h"
#include "test_util.h"

using percolite::ExportEntry;
using percolite::ExportQueue;
using percolite::ExportQueueOptions;
using percolite_test::FastOptions;
using percolite_test::TempDir;

namespace {

struct Sink {
  std::vector<std::vector<ExportEntry>> calls;
  bool fail = false;
};

std::shared_ptr<ExportQueue> MakeQueue(Sink* sink, uint32_t buckets, size_t batch_size,
                                       double linger_seconds = 0) {
  ExportQueueOptions options;
  options.id = "ex";
  options.buckets = buckets;
  options.batch_size = batch_size;
  options.linger_seconds = linger_seconds;
  options.exporter = [sink](const std::vector<ExportEntry>& entries) {
    sink->calls.push_back(entries);
    if (sink->fail) return percolite::Status::Make(percolite::ErrorCode::kCallback, "sink down");
    return percolite::Status::Ok();
  };
  return ExportQueue::Create(std::move(options));
}

// Runs the processor of bucket 0 once in its own transaction; returns its status.
percolite::Status RunBucket(percolite::Env& env, const ExportQueue& queue) {
  auto tx = env.Begin();
  auto column = queue.NotifyColumn();
  percolite::Cell cell{"ex:b:000000", column.family, column.qualifier};
  percolite::Status status = queue.Processor()(tx, cell);
  if (status.ok()) {
    tx->Commit();
  } else {
    tx->Abort();
  }
  return status;
}

void AddOne(percolite::Env& env, const ExportQueue& queue, const std::string& key) {
  auto tx = env.Begin();
  queue.Add(*tx, key, "v");
  tx->Commit();
}

size_t Depth(percolite::Env& env) {
  auto tx = env.Begin();
  auto items = percolite_test::ScanAll(*tx, percolite::ScanRange::Rows("ex:e:", "ex:e;"), 100);
  tx->Abort();
  return items.size();
}

}  // namespace

TEST_CASE("Exported entries are ordered by key then seq, and seq follows commit order",
          "[export]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  auto queue = MakeQueue(&sink, 1, 100);
  uint64_t first_ts = 0;
  for (int round = 0; round < 3; ++round) {
    auto tx = env->Begin();
    queue->Add(*tx, "b", "b" + std::to_string(round));
    queue->Add(*tx, "a", "a" + std::to_string(round));
    queue->Add(*tx, "a", "a" + std::to_string(round) + "'");
    tx->Commit();
    if (round == 0) first_ts = tx->commit_ts().value();
  }
  auto aborted = env->Begin();
  queue->Add(*aborted, "a", "never");
  aborted->Abort();

  REQUIRE(RunBucket(*env, *queue).ok());
  REQUIRE(sink.calls.size() == 1);
  const auto& got = sink.calls[0];
  REQUIRE(got.size() == 9);
  std::vector<std::string> values;
  for (const auto& e : got) values.push_back(e.value);
  CHECK(values ==
        std::vector<std::string>{"a0", "a0'", "a1", "a1'", "a2", "a2'", "b0", "b1", "b2"});
  for (size_t i = 1; i < got.size(); ++i) {
    if (got[i].key == got[i - 1].key) CHECK(got[i].seq > got[i - 1].seq);
  }
  // "b" was the first stamped write of the first transaction: index 0.
  CHECK(got[6].seq == percolite::Seq(first_ts, 0));
  CHECK(got[0].seq == percolite::Seq(first_ts, 1));
  CHECK(Depth(*env) == 0);
}

TEST_CASE("Batches take the oldest entries first, whatever their keys", "[export]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  auto queue = MakeQueue(&sink, 1, 2);
  for (const char* key : {"z", "a", "m", "b"}) AddOne(*env, *queue, key);
  REQUIRE(RunBucket(*env, *queue).ok());
  REQUIRE(RunBucket(*env, *queue).ok());
  REQUIRE(sink.calls.size() == 2);
  auto keys = [](const std::vector<ExportEntry>& call) {
    std::vector<std::string> out;
    for (const auto& e : call) out.push_back(e.key);
    return out;
  };
  // Commit order picks the batch; the exporter gets it by key.
  CHECK(keys(sink.calls[0]) == std::vector<std::string>{"a", "z"});
  CHECK(keys(sink.calls[1]) == std::vector<std::string>{"b", "m"});
  CHECK(Depth(*env) == 0);
}

TEST_CASE("A failing exporter leaves its batch queued; the retry delivers it again", "[export]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  auto queue = MakeQueue(&sink, 1, 2);
  auto tx = env->Begin();
  for (const char* key : {"k1", "k2", "k3"}) queue->Add(*tx, key, key);
  tx->Commit();

  sink.fail = true;
  CHECK(RunBucket(*env, *queue).code() == percolite::ErrorCode::kCallback);
  CHECK(Depth(*env) == 3);
  sink.fail = false;
  REQUIRE(RunBucket(*env, *queue).ok());  // batch_size 2: k1, k2 again
  REQUIRE(sink.calls.size() == 2);
  CHECK(sink.calls[0].size() == 2);
  CHECK(sink.calls[1].size() == 2);
  CHECK(sink.calls[1][0].seq == sink.calls[0][0].seq);
  CHECK(sink.calls[1][1].key == "k2");
  CHECK(Depth(*env) == 1);
  REQUIRE(RunBucket(*env, *queue).ok());  // continues after the cursor
  REQUIRE(sink.calls.size() == 3);
  REQUIRE(sink.calls[2].size() == 1);
  CHECK(sink.calls[2][0].key == "k3");
  CHECK(Depth(*env) == 0);
}

TEST_CASE("Two runs of one bucket cannot both commit", "[export]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  auto queue = MakeQueue(&sink, 1, 100);
  auto add = env->Begin();
  queue->Add(*add, "k", "v");
  add->Commit();
  auto column = queue->NotifyColumn();
  percolite::Cell cell{"ex:b:000000", column.family, column.qualifier};
  auto first = env->Begin();
  auto second = env->Begin();
  REQUIRE(queue->Processor()(first, cell).ok());
  REQUIRE(queue->Processor()(second, cell).ok());
  first->Commit();
  CHECK(percolite_test::ErrorCodeOf([&] { second->Commit(); }) == percolite::ErrorCode::kConflict);
  CHECK(sink.calls.size() == 2);  // delivered twice: at least once, absorbed by a seq guard
  CHECK(sink.calls[0][0].seq == sink.calls[1][0].seq);
}

TEST_CASE("Export queue options are checked", "[export]") {
  Sink sink;
  auto make = [&](std::string id, uint32_t buckets, size_t batch) {
    ExportQueueOptions options;
    options.id = std::move(id);
    options.buckets = buckets;
    options.batch_size = batch;
    options.exporter = [](const std::vector<ExportEntry>&) { return percolite::Status::Ok(); };
    ExportQueue::Create(std::move(options));
  };
  using percolite_test::ErrorCodeOf;
  const auto invalid = percolite::ErrorCode::kInvalidArgument;
  CHECK(ErrorCodeOf([&] { make("a:b", 4, 10); }) == invalid);
  CHECK(ErrorCodeOf([&] { make("", 4, 10); }) == invalid);
  CHECK(ErrorCodeOf([&] { make("ok", 0, 10); }) == invalid);
  CHECK(ErrorCodeOf([&] { make("ok", 4, 0); }) == invalid);
  CHECK(ErrorCodeOf([&] {
          ExportQueue::Create(ExportQueueOptions{"ok", 4, 10, nullptr});
        }) == invalid);
  const percolite::ExportFn sink_fn = [](const std::vector<ExportEntry>&) {
    return percolite::Status::Ok();
  };
  CHECK(ErrorCodeOf([&] { make("ok", 4, 10); }) == percolite::ErrorCode::kOk);
  for (double linger : {-1.0, 3600.5, std::nan("")}) {
    CHECK(ErrorCodeOf([&] {
            ExportQueueOptions options{"ok", 4, 10, sink_fn, linger};
            ExportQueue::Create(std::move(options));
          }) == invalid);
  }
}

TEST_CASE("A lingering bucket defers while entries keep arriving, then exports them at once",
          "[export]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  auto queue = MakeQueue(&sink, 1, /*batch_size=*/100, /*linger_seconds=*/0.4);
  // A full batch first, exported at once: the bucket is no longer young.
  for (int i = 0; i < 100; ++i) AddOne(*env, *queue, "f" + std::to_string(i));
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(sink.calls.size() == 1);
  AddOne(*env, *queue, "a");
  // First look at a short batch: wait a quarter of linger, export nothing.
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == Approx(0.1));
  CHECK(sink.calls.size() == 1);
  AddOne(*env, *queue, "b");
  // More arrived since the last look: wait again.
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) > 0);
  CHECK(sink.calls.size() == 1);
  CHECK(Depth(*env) == 2);
  // Nothing arrived since: export what is there, in one call.
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(sink.calls.size() == 2);
  CHECK(sink.calls[1].size() == 2);
  CHECK(Depth(*env) == 0);
}

TEST_CASE("Lingering ends after linger_seconds even while entries keep arriving", "[export]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  auto queue = MakeQueue(&sink, 1, /*batch_size=*/1000, /*linger_seconds=*/0.2);
  // A full batch first, exported at once: the bucket is no longer young (a
  // young one goes as soon as as many entries wait as its runs ever took).
  for (int i = 0; i < 1000; ++i) AddOne(*env, *queue, "f" + std::to_string(i));
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(sink.calls.size() == 1);
  const auto start = std::chrono::steady_clock::now();
  int added = 0;
  double deferred = 0;
  do {
    AddOne(*env, *queue, "k" + std::to_string(added++));
    deferred = percolite_test::RunBucketAsWorker(*env, *queue);
    CHECK(deferred <= Approx(0.05));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (deferred > 0 && added < 1000);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(elapsed >= 0.2);
  REQUIRE(sink.calls.size() == 2);
  CHECK(sink.calls[1].size() == static_cast<size_t>(added));
}

TEST_CASE("A young bucket goes once as many entries wait as its runs ever took", "[export]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  auto queue = MakeQueue(&sink, 1, /*batch_size=*/1000, /*linger_seconds=*/3600);
  // First look: it defers. Second: 2 wait, its runs took 0: it goes.
  AddOne(*env, *queue, "a");
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) > 0);
  AddOne(*env, *queue, "b");
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(sink.calls.size() == 1);
  CHECK(sink.calls[0].size() == 2);
  // Now it took 2: one entry, then a second, then a third keep it lingering
  // until 2 wait (the second look after the first), then it goes.
  AddOne(*env, *queue, "c");
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) > 0);  // first look
  AddOne(*env, *queue, "d");
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);  // 2 >= 2
  REQUIRE(sink.calls.size() == 2);
  CHECK(sink.calls[1].size() == 2);
  // Took 4: 3 entries arriving one per look keep it lingering (3 < 4).
  AddOne(*env, *queue, "e");
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) > 0);
  AddOne(*env, *queue, "f");
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) > 0);
  AddOne(*env, *queue, "g");
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) > 0);
  CHECK(sink.calls.size() == 2);
  AddOne(*env, *queue, "h");
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);  // 4 >= 4
  REQUIRE(sink.calls.size() == 3);
  CHECK(sink.calls[2].size() == 4);
}

TEST_CASE("A full batch is exported at once however long the linger", "[export]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  auto queue = MakeQueue(&sink, 1, /*batch_size=*/3, /*linger_seconds=*/3600);
  for (const char* key : {"a", "b", "c", "d"}) AddOne(*env, *queue, key);
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(sink.calls.size() == 1);
  CHECK(sink.calls[0].size() == 3);
  // The run stopped at a cursor; the run after a cursor does not linger.
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(sink.calls.size() == 2);
  CHECK(sink.calls[1].size() == 1);
}

TEST_CASE("Only an observer run can defer itself", "[export]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  auto tx = env->Begin();
  CHECK(percolite_test::ErrorCodeOf([&] { tx->DeferTrigger(1); }) ==
        percolite::ErrorCode::kWrongState);
  tx->SetTrigger(percolite::EncodeCellKey({"r", "f", "q"}));
  CHECK(percolite_test::ErrorCodeOf([&] { tx->DeferTrigger(0); }) ==
        percolite::ErrorCode::kInvalidArgument);
  tx->DeferTrigger(0.5);
  tx->DeferTrigger(0.2);
  CHECK(tx->DeferredSeconds() == 0.5);
  tx->Abort();
}
