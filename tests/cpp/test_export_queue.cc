// The export queue's processor, driven by hand: what it hands the exporter,
// what it deletes, and what a failing exporter leaves behind.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
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
  options.exporter = [sink](const std::vector<ExportEntry>& entries,
                            const percolite::StoreIdentity&) {
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

TEST_CASE("Entries an observer run adds to a queue are counted as its writes to it",
          "[export][graph]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  auto queue = MakeQueue(&sink, 2, 100);
  using Counts = std::vector<std::pair<std::string, uint64_t>>;
  // Any other transaction keeps no counts: adders and loaders pay nothing.
  auto plain = env->Begin();
  queue->Add(*plain, "a", "1");
  CHECK(plain->WriteCounts().empty());
  plain->Abort();
  auto run = env->Begin();
  run->SetTrigger(percolite::EncodeCellKey({"doc", "f", "q"}));
  CHECK(run->WriteCounts().empty());
  queue->Add(*run, "a", "1");
  queue->Add(*run, {{"b", "2"}, {"c", "3"}});
  queue->Add(*run, std::vector<std::pair<std::string, std::string>>{});
  run->CountWrite("queue", "e");  // a prefix of "ex" is another target
  CHECK(run->WriteCounts() == Counts{{"queue:ex", 3}, {"queue:e", 1}});
  run->Abort();
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
    options.exporter = [](const std::vector<ExportEntry>&, const percolite::StoreIdentity&) {
      return percolite::Status::Ok();
    };
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
  const percolite::ExportFn sink_fn = [](const std::vector<ExportEntry>&,
                                         const percolite::StoreIdentity&) {
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
  // A linger far longer than the test, so no step of it can outlast the
  // cap on a busy machine: the looks alone decide.
  auto queue = MakeQueue(&sink, 1, /*batch_size=*/100, /*linger_seconds=*/3600);
  // A full batch first, exported at once: the bucket is no longer young.
  for (int i = 0; i < 100; ++i) AddOne(*env, *queue, "f" + std::to_string(i));
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == 0);
  REQUIRE(sink.calls.size() == 1);
  AddOne(*env, *queue, "a");
  // First look at a short batch: wait a quarter of linger, export nothing.
  CHECK(percolite_test::RunBucketAsWorker(*env, *queue) == Approx(900));
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

// -- When a sink fails: poison keys, outages, stops ("Poison keys and
// outages" in export_queue.h). max_attempts 1 makes the first run the last
// attempt, so it splits a failing batch at once.

namespace {

struct SplitSink {
  std::set<std::string> poison;  // a batch with any of these fails
  bool down = false;             // every batch fails
  percolite::ErrorCode code = percolite::ErrorCode::kCallback;
  size_t calls = 0;
  std::set<std::string> exported;
};

std::shared_ptr<ExportQueue> MakeSplitQueue(SplitSink* sink, size_t batch_size) {
  ExportQueueOptions options;
  options.id = "ex";
  options.buckets = 1;
  options.batch_size = batch_size;
  options.max_attempts = 1;
  options.exporter = [sink](const std::vector<ExportEntry>& entries,
                            const percolite::StoreIdentity&) {
    ++sink->calls;
    bool fails = sink->down;
    for (const ExportEntry& entry : entries) fails = fails || sink->poison.count(entry.key) != 0;
    if (fails) return percolite::Status::Make(sink->code, "refused");
    for (const ExportEntry& entry : entries) sink->exported.insert(entry.key);
    return percolite::Status::Ok();
  };
  return ExportQueue::Create(std::move(options));
}

std::string KeyNumber(int i) {
  char key[8];
  std::snprintf(key, sizeof key, "k%04d", i);
  return key;
}

void AddKeys(percolite::Env& env, const ExportQueue& queue, int count) {
  auto tx = env.Begin();
  for (int i = 0; i < count; ++i) queue.Add(*tx, KeyNumber(i), "v");
  tx->Commit();
}

std::set<std::string> ParkedKeys(percolite::Env& env) {
  std::set<std::string> keys;
  for (const percolite::WorkRecord& record : env.WorkRecords(true)) {
    if (record.key) keys.insert(*record.key);
  }
  return keys;
}

}  // namespace

TEST_CASE("One, two or three poison keys are parked alone and the rest is exported",
          "[export][poison]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  // k0003 and k0017 sit in different halves of the 20 keys; the three keys
  // of the last case in different quarters too.
  const std::set<std::string> poison =
      GENERATE(std::set<std::string>{"k0011"}, std::set<std::string>{"k0003", "k0017"},
               std::set<std::string>{"k0001", "k0009", "k0015"});
  SplitSink sink;
  sink.poison = poison;
  auto queue = MakeSplitQueue(&sink, 100);
  AddKeys(*env, *queue, 20);
  REQUIRE(RunBucket(*env, *queue).ok());
  CHECK(ParkedKeys(*env) == poison);
  CHECK(sink.exported.size() == 20 - poison.size());
  for (const std::string& key : poison) CHECK(sink.exported.count(key) == 0);
  CHECK(Depth(*env) == poison.size());  // the parked keys' entries stay queued
}

TEST_CASE("A sink that fails for every part of the split is down: nothing is parked",
          "[export][poison]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  SplitSink sink;
  sink.down = true;
  auto queue = MakeSplitQueue(&sink, 20000);
  AddKeys(*env, *queue, 20000);
  const percolite::Status status = RunBucket(*env, *queue);
  CHECK(status.code() == percolite::ErrorCode::kSinkUnavailable);
  CHECK(status.message() == "refused");  // the exporter's own error, as the record shows it
  CHECK(sink.calls == 1 + 2 + 4);        // the batch, its halves, their quarters: not 2n calls
  CHECK(ParkedKeys(*env).empty());
  CHECK(Depth(*env) == 20000);
}

TEST_CASE("A transient failure is not split: the run fails whole", "[export][poison]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  SplitSink sink;
  sink.down = true;
  sink.code = percolite::ErrorCode::kSinkUnavailable;
  auto queue = MakeSplitQueue(&sink, 100);
  AddKeys(*env, *queue, 50);
  CHECK(RunBucket(*env, *queue).code() == percolite::ErrorCode::kSinkUnavailable);
  CHECK(sink.calls == 1);
  CHECK(ParkedKeys(*env).empty());
  CHECK(Depth(*env) == 50);
}

namespace {

// The queue's processor as the worker pool runs it (as Python's Env does).
void StartQueueWorkers(percolite::Env& env, const std::shared_ptr<ExportQueue>& queue,
                       percolite::WorkerOptions options) {
  env.SetObservers({queue->AsObserver()});
  options.threads = 1;
  options.retry_initial_seconds = 0.001;
  options.retry_max_seconds = 0.005;
  env.StartWorkers(options);
}

}  // namespace

TEST_CASE("An outage never counts as an attempt: retried until the sink is back, none parked",
          "[export][poison][workers]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  std::atomic<int> down_for{12};  // more outage runs than max_attempts
  std::atomic<int> calls{0};
  ExportQueueOptions options;
  options.id = "ex";
  options.buckets = 1;
  options.max_attempts = 2;
  options.exporter = [&](const std::vector<ExportEntry>&, const percolite::StoreIdentity&) {
    ++calls;
    if (down_for.fetch_sub(1) > 0) {
      return percolite::Status::Make(percolite::ErrorCode::kSinkUnavailable, "connection refused");
    }
    return percolite::Status::Ok();
  };
  auto queue = ExportQueue::Create(std::move(options));
  AddKeys(*env, *queue, 100);
  std::mutex mu;
  std::vector<percolite::WorkRecord> failures, recoveries;
  percolite::WorkerOptions workers;
  workers.on_failure = [&](const percolite::ObservedColumn&, const percolite::WorkRecord& r) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back(r);
  };
  workers.on_recovery = [&](const percolite::ObservedColumn&, const percolite::WorkRecord& r) {
    std::lock_guard<std::mutex> lock(mu);
    recoveries.push_back(r);
  };
  StartQueueWorkers(*env, queue, workers);
  REQUIRE(env->WaitIdle(60));
  env->StopWorkers();
  CHECK(calls == 13);  // twelve whole batches refused, then one exported: never split
  CHECK(Depth(*env) == 0);
  CHECK(env->WorkRecords(false).empty());  // the commit deleted the record
  REQUIRE(failures.size() == 12);
  for (const percolite::WorkRecord& r : failures) {
    CHECK(r.sink == percolite::SinkFailure::kDown);
    CHECK(r.attempts == 0);
    CHECK_FALSE(r.parked);
    CHECK(r.error.message == "connection refused");
  }
  REQUIRE(recoveries.size() == 1);
  CHECK(recoveries[0].sink == percolite::SinkFailure::kDown);
  CHECK(recoveries[0].first_failure_unix <= recoveries[0].last_failure_unix);
}

TEST_CASE("A stop ends a split between two exporter calls; nothing is recorded or lost",
          "[export][poison][workers]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  std::atomic<int> calls{0};
  std::atomic<bool> in_split{false};
  ExportQueueOptions options;
  options.id = "ex";
  options.buckets = 1;
  options.batch_size = 50000;
  options.max_attempts = 1;
  options.exporter = [&](const std::vector<ExportEntry>&, const percolite::StoreIdentity&) {
    if (++calls == 2) {  // the first half: wait here until the pool is asked to stop
      in_split = true;
      for (int i = 0; i < 20000 && !percolite::Workers::StopRequested(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    return percolite::Status::Make(percolite::ErrorCode::kCallback, "bad entry");
  };
  auto queue = ExportQueue::Create(std::move(options));
  AddKeys(*env, *queue, 50000);
  StartQueueWorkers(*env, queue, percolite::WorkerOptions{});
  while (!in_split) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  env->StopWorkers();
  CHECK(calls == 2);  // the call going on ended; no other began
  CHECK(env->WorkRecords(false).empty());
  CHECK(env->FailureSummaries().empty());
  CHECK(Depth(*env) == 50000);
}
