// The queues as the workers run them: each queue's AsObserver() registered
// with Env::SetObservers, as the Python package registers an app's queues,
// then driven by a worker pool (StartWorkers, WaitIdle) or in the calling
// thread (RunHere), over each backend.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "percolite/combine_queue.h"
#include "percolite/encoding.h"
#include "percolite/env.h"
#include "percolite/export_queue.h"
#include "percolite/notifications.h"
#include "percolite/queue_limits.h"
#include "percolite/transaction.h"
#include "percolite/workers.h"
#include "test_util.h"

using percolite::CombineQueue;
using percolite::CombineQueueOptions;
using percolite::ExportEntry;
using percolite::ExportQueue;
using percolite::ExportQueueOptions;
using percolite::NotifyKind;
using percolite::Observer;
using percolite::Status;
using percolite_test::TempDir;

namespace {

using percolite_test::Int64;

std::shared_ptr<CombineQueue> MakeTotals(uint32_t max_attempts = percolite::kDefaultMaxAttempts,
                                         std::shared_ptr<const ExportQueue> export_to = nullptr) {
  CombineQueueOptions options;
  options.id = "totals";
  options.buckets = 4;
  options.buffer_size = 8;  // several runs per bucket
  options.max_attempts = max_attempts;
  if (export_to) options.export_to.push_back(std::move(export_to));
  return CombineQueue::Create(std::move(options));
}

// What an exporter received, in the order it received it; it fails its
// first `fail_first` calls.
struct Sink {
  std::mutex mu;
  std::vector<ExportEntry> entries;
  std::vector<percolite::StoreIdentity> stores;
  std::atomic<int> calls{0};
  int fail_first = 0;

  percolite::ExportFn Exporter() {
    return [this](const std::vector<ExportEntry>& batch, const percolite::StoreIdentity& store) {
      if (calls.fetch_add(1) < fail_first) {
        return Status::Make(percolite::ErrorCode::kCallback, "sink says no");
      }
      std::lock_guard<std::mutex> lock(mu);
      entries.insert(entries.end(), batch.begin(), batch.end());
      stores.push_back(store);
      return Status::Ok();
    };
  }
};

std::shared_ptr<ExportQueue> MakeOutbox(Sink* sink,
                                        uint32_t max_attempts = percolite::kDefaultMaxAttempts,
                                        uint32_t buckets = 3) {
  ExportQueueOptions options;
  options.id = "outbox";
  options.buckets = buckets;
  options.batch_size = 16;
  options.max_attempts = max_attempts;
  options.exporter = sink->Exporter();
  return ExportQueue::Create(std::move(options));
}

// The pool as Python's Env.start_workers starts it by default (sharing by
// lease), with short retries.
void StartWorkers(percolite::Env& env) {
  percolite::WorkerOptions options;
  options.threads = 3;
  options.worker_count = 0;
  options.retry_initial_seconds = 0.001;
  options.retry_max_seconds = 0.005;
  env.StartWorkers(options);
}

// A copy: callers pass a temporary WorkerStats.
percolite::ObserverStats StatsOf(const percolite::WorkerStats& stats, const std::string& name) {
  for (const percolite::ObserverStats& o : stats.observers) {
    if (o.column.observer == name) return o;
  }
  FAIL("no observer named " << name);
  throw std::logic_error("unreachable");
}

bool QueueRowsLeft(percolite::Env& env, const std::string& prefix) {
  auto tx = env.Begin();
  std::string end = prefix;
  end.back() = static_cast<char>(end.back() + 1);
  const bool left =
      !percolite_test::ScanAll(*tx, percolite::ScanRange::Rows(prefix, end), 10).empty();
  tx->Abort();
  return left;
}

}  // namespace

TEST_CASE("A queue's observer is its processor on its notify column, retried without limit",
          "[queues][workers]") {
  Sink sink;
  // The queues' own limits on failed runs park keys; they never reach the observer.
  const auto totals = MakeTotals(/*max_attempts=*/3);
  const auto outbox = MakeOutbox(&sink, /*max_attempts=*/2);

  const Observer combine = totals->AsObserver();
  CHECK(combine.column.family == "cq:totals");
  CHECK(combine.column.qualifier == "notify");
  CHECK(combine.column.kind == NotifyKind::kWeak);
  CHECK(combine.column.observer == "combine queue totals");
  CHECK(combine.column.observer == totals->NotifyColumn().observer);
  CHECK(combine.max_attempts == 0);
  CHECK(combine.wait_for_commit);
  CHECK(static_cast<bool>(combine.fn));

  const Observer exporting = outbox->AsObserver();
  CHECK(exporting.column.family == "eq:outbox");
  CHECK(exporting.column.qualifier == "notify");
  CHECK(exporting.column.kind == NotifyKind::kWeak);
  CHECK(exporting.column.observer == "export queue outbox");
  CHECK(exporting.column.family == outbox->NotifyColumn().family);
  CHECK(exporting.max_attempts == 0);
  CHECK(exporting.wait_for_commit);
  CHECK(static_cast<bool>(exporting.fn));
}

TEST_CASE("A queue's processor name parses back to its kind and id; no other name does",
          "[queues]") {
  using percolite::ParseQueueProcessorName;
  using percolite::QueueProcessorName;
  using Parsed = std::optional<std::pair<std::string, std::string>>;
  Sink sink;
  // The names the queues run under, as AsObserver gives them.
  CHECK(ParseQueueProcessorName(MakeTotals()->AsObserver().column.observer) ==
        Parsed({"combine queue", "totals"}));
  CHECK(ParseQueueProcessorName(MakeOutbox(&sink)->AsObserver().column.observer) ==
        Parsed({"export queue", "outbox"}));

  // Ids may hold spaces, " queue " and the other kind: the id is the rest.
  for (const char* id : {"x", "a b", "a queue b", "export queue y", " ", "é\x01"}) {
    for (const char* kind : {"combine queue", "export queue"}) {
      CAPTURE(kind, id);
      const std::string name = QueueProcessorName(kind, id);
      CHECK(name == std::string(kind) + " " + id);
      CHECK(ParseQueueProcessorName(name) == Parsed({kind, id}));
    }
  }

  // An observer of the user's may contain " queue " or a kind without being a
  // queue's processor; only the exact prefixes count, with a non-empty id.
  for (const char* name :
       {"my queue x", "Combine queue x", "combine  queue x", "combine queue", "combine queue ",
        "export queue", "export queue ", "export queues x", "xexport queue y", "queue x",
        " combine queue x", "combine-queue x", ""}) {
    CAPTURE(name);
    CHECK_FALSE(ParseQueueProcessorName(name).has_value());
  }

  // Building refuses a kind it could not parse back.
  for (const char* kind : {"combine", "export", "my queue", "queue", "", "combine queue "}) {
    CAPTURE(kind);
    CHECK_THROWS_WITH(QueueProcessorName(kind, "x"),
                      Catch::Contains("a queue's kind is 'combine queue' or 'export queue'"));
  }
}

TEST_CASE("A combine queue registered as its observer folds every update through the workers",
          "[queues][workers][conformance]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const auto totals = MakeTotals();
  env->SetObservers({totals->AsObserver()});
  StartWorkers(*env);
  // Adds while the pool runs, as an app's transactions do: 40 commits over
  // 10 keys, each commit adding i to every key and 1 to key "k<i % 10>".
  constexpr int kCommits = 40, kKeys = 10;
  std::map<std::string, int64_t> expected;
  for (int i = 1; i <= kCommits; ++i) {
    std::vector<std::pair<std::string, std::string>> updates;
    for (int k = 0; k < kKeys; ++k) {
      const std::string key = "k" + std::to_string(k);
      updates.emplace_back(key, Int64(i));
      expected[key] += i;
    }
    updates.emplace_back("k" + std::to_string(i % kKeys), Int64(1));
    expected["k" + std::to_string(i % kKeys)] += 1;
    auto tx = env->Begin();
    totals->Add(*tx, updates);
    tx->Commit();
  }
  REQUIRE(env->WaitIdle(60));
  env->StopWorkers();

  auto tx = env->Begin();
  for (const auto& [key, sum] : expected) CHECK(totals->Get(*tx, key) == Int64(sum));
  tx->Abort();
  CHECK_FALSE(QueueRowsLeft(*env, totals->EntryRowPrefix()));
  CHECK(env->backend()->PendingNotifications() == 0);
  const auto observed = env->ObservedColumns();
  REQUIRE(observed.size() == 1);
  CHECK(observed[0].observer == "combine queue totals");
  CHECK(observed[0].kind == NotifyKind::kWeak);
  const percolite::ObserverStats stats = StatsOf(env->GetWorkerStats(), "combine queue totals");
  CHECK(stats.commits >= 1);
  CHECK(stats.failures == 0);
}

TEST_CASE("An export queue's observer outlasts more failed runs than an observer's limit",
          "[queues][workers][conformance]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  // More failed runs of its one bucket in a row than an ordinary observer
  // may have before its notification is parked; the queue never parks keys
  // (max_attempts 0), so only the observer's own limit could stop the retries.
  sink.fail_first = static_cast<int>(percolite::kDefaultMaxAttempts) + 5;
  const auto outbox = MakeOutbox(&sink, /*max_attempts=*/0, /*buckets=*/1);
  {
    auto tx = env->Begin();
    for (int i = 0; i < 30; ++i) outbox->Add(*tx, "key" + std::to_string(i % 7), std::to_string(i));
    tx->Commit();
  }
  env->SetObservers({outbox->AsObserver()});
  StartWorkers(*env);
  {
    auto tx = env->Begin();
    outbox->Add(*tx, "key0", "last");
    tx->Commit();
  }
  REQUIRE(env->WaitIdle(60));
  env->StopWorkers();

  CHECK(sink.calls.load() > sink.fail_first);
  std::lock_guard<std::mutex> lock(sink.mu);
  // At least once: a batch may come again, with the same seqs.
  std::map<std::string, std::map<uint64_t, std::string>> by_key;  // key -> seq -> value
  for (const ExportEntry& e : sink.entries) by_key[e.key][e.seq] = e.value;
  size_t distinct = 0;
  for (const auto& [key, entries] : by_key) distinct += entries.size();
  CHECK(distinct == 31);
  CHECK(by_key.size() == 7);
  // Seqs follow commit order: key0's first entry is the first commit's, its last the second's.
  CHECK(by_key["key0"].size() == 6);
  CHECK(by_key["key0"].begin()->second == "0");
  CHECK(by_key["key0"].rbegin()->second == "last");
  const auto identity = env->Identity();
  REQUIRE(identity);
  for (const percolite::StoreIdentity& store : sink.stores) CHECK(store.id == identity->id);
  CHECK_FALSE(QueueRowsLeft(*env, outbox->EntryRowPrefix()));
  CHECK(env->WorkRecords(false).empty());  // the commits deleted the failure records
  const percolite::ObserverStats stats = StatsOf(env->GetWorkerStats(), "export queue outbox");
  CHECK(stats.failures >= static_cast<uint64_t>(sink.fail_first));
  CHECK(stats.parked == 0);
  CHECK(stats.skipped_parked == 0);
}

TEST_CASE("A combine queue exporting to an export queue: both observers in one pool",
          "[queues][workers][conformance]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  const auto outbox = MakeOutbox(&sink);
  const auto totals = MakeTotals(percolite::kDefaultMaxAttempts, outbox);
  env->SetObservers({totals->AsObserver(), outbox->AsObserver()});
  StartWorkers(*env);
  for (int i = 1; i <= 20; ++i) {
    auto tx = env->Begin();
    totals->Add(*tx, {{"a", Int64(i)}, {"b", Int64(-i)}, {"c", Int64(1)}});
    tx->Commit();
  }
  // Once "c" has a value, an update that brings it to zero deletes it, and
  // the deletion is exported.
  REQUIRE(env->WaitIdle(60));
  {
    auto tx = env->Begin();
    totals->Add(*tx, {{"c", Int64(-20)}});
    tx->Commit();
  }
  REQUIRE(env->WaitIdle(60));
  env->StopWorkers();

  std::lock_guard<std::mutex> lock(sink.mu);
  std::map<std::string, ExportEntry> newest;  // by seq: the sink's own guard
  for (const ExportEntry& e : sink.entries) {
    if (!newest.count(e.key) || e.seq > newest[e.key].seq) newest[e.key] = e;
  }
  REQUIRE(newest.size() == 3);
  CHECK(newest["a"].value == percolite::ExportValue(Int64(210)));
  CHECK(newest["b"].value == percolite::ExportValue(Int64(-210)));
  CHECK(newest["c"].value == percolite::ExportValue(std::nullopt));
  CHECK(env->backend()->PendingNotifications() == 0);
  const percolite::WorkerStats stats = env->GetWorkerStats();
  CHECK(StatsOf(stats, "combine queue totals").commits >= 1);
  CHECK(StatsOf(stats, "export queue outbox").commits >= 1);
  // The combine queue's runs wrote to the export queue: the dataflow edge.
  CHECK(StatsOf(stats, "combine queue totals").writes.count("queue:outbox") == 1);
}

TEST_CASE("RunHere drains both queues in the calling thread, failing runs retried",
          "[queues][workers][conformance]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Sink sink;
  sink.fail_first = static_cast<int>(percolite::kDefaultMaxAttempts) + 2;  // one bucket's runs
  const auto outbox = MakeOutbox(&sink, /*max_attempts=*/0, /*buckets=*/1);
  const auto totals = MakeTotals(percolite::kDefaultMaxAttempts, outbox);
  env->SetObservers({totals->AsObserver(), outbox->AsObserver()});
  for (int i = 0; i < 5; ++i) {
    auto tx = env->Begin();
    totals->Add(*tx, {{"x", Int64(2)}, {"y", Int64(3)}});
    tx->Commit();
  }
  percolite::RunHereOptions options;
  options.stop_on_failure = false;  // as testing.run_until_idle(raise_errors=False)
  const percolite::RunHereSummary summary = env->RunHere(options);
  CHECK_FALSE(summary.failed);
  CHECK_FALSE(summary.stuck);
  CHECK(summary.parked == 0);
  CHECK(summary.failures == static_cast<uint64_t>(sink.fail_first));
  auto tx = env->Begin();
  CHECK(totals->Get(*tx, "x") == Int64(10));
  CHECK(totals->Get(*tx, "y") == Int64(15));
  tx->Abort();
  std::lock_guard<std::mutex> lock(sink.mu);
  std::map<std::string, std::string> exported;
  for (const ExportEntry& e : sink.entries) exported[e.key] = e.value;
  CHECK(exported["x"] == percolite::ExportValue(Int64(10)));
  CHECK(exported["y"] == percolite::ExportValue(Int64(15)));
  CHECK(env->backend()->PendingNotifications() == 0);
}
