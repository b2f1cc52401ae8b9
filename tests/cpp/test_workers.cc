// Notifications and the worker pool on their own (notifications.h,
// workers.h), over each backend: no Env, just a backend, a TransactionSource
// and a Workers pool, as the layers stack.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "percolite/backend.h"
#include "percolite/encoding.h"
#include "percolite/notifications.h"
#include "percolite/transaction.h"
#include "percolite/workers.h"
#include "test_util.h"
#include "workers/lanes.h"

namespace {

using percolite::Backend;
using percolite::Cell;
using percolite::ErrorCode;
using percolite::NotifyKind;
using percolite::ObservedColumn;
using percolite::Observer;
using percolite::Status;
using percolite::Transaction;
using percolite::TransactionSource;
using percolite::WorkWatch;
using percolite_test::ErrorCodeOf;
using percolite_test::FastOptions;
using percolite_test::Layers;
using percolite_test::Ref;
using percolite_test::TempDir;

void Set(TransactionSource& source, const Cell& cell, const std::string& value) {
  auto tx = source.Begin();
  tx->Set(Ref(cell), value);
  tx->Commit();
}

std::optional<std::string> Read(TransactionSource& source, const Cell& cell) {
  auto tx = source.Begin();
  auto value = tx->Get(Ref(cell));
  tx->Abort();
  return value;
}

bool Pending(TransactionSource& source, const Cell& cell) {
  auto tx = source.Begin();
  const bool pending =
      tx->NotificationPending(percolite::EncodeCellKey({cell.row, cell.family, cell.qualifier}));
  tx->Abort();
  return pending;
}

const ObservedColumn kContent{"doc", "content", NotifyKind::kStrong, "count"};

}  // namespace

TEST_CASE("A worker pool runs every strong notification and commits each run once",
          "[workers][conformance]") {
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  backend->SetObservedColumns({kContent});
  std::atomic<int> calls{0};
  Observer count{
      kContent, [&](const std::shared_ptr<Transaction>& tx, const Cell& cell) {
        ++calls;
        auto value = tx->Get(Ref(cell));
        tx->Set(Ref(Cell{cell.row, "doc", "length"}), std::to_string(value ? value->size() : 0));
        return Status::Ok();
      }};
  percolite::WorkerOptions options;
  options.threads = 3;
  percolite::Workers workers(source, {count}, options);
  workers.Start();
  constexpr int kRows = 60;
  for (int i = 0; i < kRows; ++i) {
    Set(*source, Cell{"row" + std::to_string(i), "doc", "content"}, std::string(i, 'x'));
  }
  Set(*source, Cell{"unobserved", "doc", "other"}, "v");  // makes no notification
  REQUIRE(workers.WaitIdle(30));
  workers.Stop();
  for (int i = 0; i < kRows; ++i) {
    CHECK(Read(*source, Cell{"row" + std::to_string(i), "doc", "length"}) == std::to_string(i));
  }
  CHECK(backend->PendingNotifications() == 0);
  const percolite::WorkerStats stats = workers.Stats();
  REQUIRE(stats.observers.size() == 1);
  CHECK(stats.observers[0].commits == kRows);
  CHECK(calls.load() >= kRows);
}

TEST_CASE("An observer's committed runs count what they wrote; every commit is timed",
          "[workers][graph]") {
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  backend->SetObservedColumns({kContent});
  const uint64_t timed_before = backend->commit_latency().Read().count;
  std::atomic<int> calls{0};
  Observer count{kContent, [&](const std::shared_ptr<Transaction>& tx, const Cell& cell) {
                   // The first run of row0 loses a conflict: its writes must not count.
                   if (cell.row == "row0" && calls.fetch_add(1) == 0) {
                     Set(*source, Cell{cell.row, "doc", "length"}, "0");
                   }
                   tx->Set(Ref(Cell{cell.row, "doc", "length"}), "1");
                   tx->CountWrite("family", "doc");
                   tx->CountWrite("queue", "out", 2);
                   tx->CountWrite("family", "doc");
                   return Status::Ok();
                 }};
  percolite::WorkerOptions options;
  options.threads = 2;
  percolite::Workers workers(source, {count}, options);
  workers.Start();
  constexpr int kRows = 20;
  for (int i = 0; i < kRows; ++i) {
    Set(*source, Cell{"row" + std::to_string(i), "doc", "content"}, "x");
  }
  REQUIRE(workers.WaitIdle(30));
  workers.Stop();
  const percolite::WorkerStats stats = workers.Stats();
  REQUIRE(stats.observers.size() == 1);
  const auto& o = stats.observers[0];
  const std::map<std::string, uint64_t> expected{{"family:doc", 2 * o.commits},
                                                 {"queue:out", 2 * o.commits}};
  CHECK(o.writes == expected);
  CHECK(o.commits >= kRows);
  CHECK(o.runs > o.commits);  // the lost run was not counted

  const auto reading = backend->commit_latency().Read();
  // Every commit of this test: the rows, the conflicting write, the runs.
  CHECK(reading.count - timed_before >= kRows + 1 + o.commits);
  CHECK(reading.cumulative.back() == reading.count);
  for (size_t i = 1; i < reading.cumulative.size(); ++i) {
    CHECK(reading.cumulative[i] >= reading.cumulative[i - 1]);
  }
  CHECK(reading.sum_seconds > 0);
}

TEST_CASE("Two runs of one notification conflict on its ack: only the first commits",
          "[notifications][conformance]") {
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  backend->SetObservedColumns({kContent});
  const Cell cell{"r", "doc", "content"};
  Set(*source, cell, "v1");
  REQUIRE(backend->PendingNotifications() == 1);
  const std::string key = percolite::EncodeCellKey(Ref(cell));
  auto first = source->Begin(), second = source->Begin();
  for (auto& run : {first, second}) {
    REQUIRE(run->NotificationPending(key));
    run->SetTrigger(key);
    run->Set(Ref(Cell{"r", "doc", "out"}), "from a run");
  }
  first->Commit();
  CHECK(ErrorCodeOf([&] { second->Commit(); }) == ErrorCode::kConflict);
  CHECK_FALSE(Pending(*source, cell));
  CHECK(backend->PendingNotifications() == 0);
}

TEST_CASE("A notification set again after a run began survives the run, and a delete makes none",
          "[notifications][conformance]") {
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  backend->SetObservedColumns({kContent});
  const Cell cell{"r", "doc", "content"};
  const std::string key = percolite::EncodeCellKey(Ref(cell));
  Set(*source, cell, "v1");
  auto run = source->Begin();
  run->SetTrigger(key);
  Set(*source, cell, "v2");  // after the run's snapshot
  run->Commit();
  CHECK(Pending(*source, cell));  // runs again, to see v2

  auto again = source->Begin();
  again->SetTrigger(key);
  again->Commit();
  CHECK_FALSE(Pending(*source, cell));

  auto remove = source->Begin();
  remove->Delete(Ref(cell));
  remove->Commit();
  CHECK(backend->PendingNotifications() == 0);
}

TEST_CASE("Weak notifications never conflict and collapse into one per cell",
          "[notifications][conformance]") {
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  const Cell cell{"bucket", "q", "notify"};
  auto a = source->Begin(), b = source->Begin();
  a->SetWeakNotification(Ref(cell));
  b->SetWeakNotification(Ref(cell));
  a->Commit();
  CHECK_NOTHROW(b->Commit());
  CHECK(backend->PendingNotifications() == 1);
  std::vector<percolite::Notification> found;
  CHECK(backend->ScanNotifications("", 10, &found));
  REQUIRE(found.size() == 1);
  CHECK(found[0].cell_key == percolite::EncodeCellKey(Ref(cell)));
  CHECK(found[0].stamp == b->commit_ts().value());  // the newest stamp
}

TEST_CASE("A failing observer is retried until it succeeds, its failures counted",
          "[workers][conformance]") {
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  backend->SetObservedColumns({kContent});
  std::atomic<int> calls{0};
  Observer flaky{kContent, [&](const std::shared_ptr<Transaction>& tx, const Cell& cell) {
                   if (++calls <= 2) return Status::Make(ErrorCode::kCallback, "not yet");
                   tx->Set(Ref(Cell{cell.row, "doc", "done"}), "yes");
                   return Status::Ok();
                 }};
  percolite::WorkerOptions options;
  options.threads = 1;
  options.retry_initial_seconds = 0.01;
  percolite::Workers workers(source, {flaky}, options);
  workers.Start();
  Set(*source, Cell{"r", "doc", "content"}, "v");
  REQUIRE(workers.WaitIdle(30));
  workers.Stop();
  CHECK(Read(*source, Cell{"r", "doc", "done"}) == "yes");
  const percolite::ObserverStats stats = workers.Stats().observers.at(0);
  CHECK(stats.failures == 2);
  CHECK(stats.commits == 1);
  CHECK(stats.last_error == "not yet");
}

TEST_CASE("A work watch wakes on a commit, on a waiter's signal and on Interrupt",
          "[workers][conformance]") {
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  auto watch = backend->WatchForWork();
  using Clock = std::chrono::steady_clock;
  // Waits until `events` shows up (a wait may return early or spuriously).
  auto wait_for = [&](unsigned wanted) {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < deadline) {
      if (watch->Wait(1000) & wanted) return true;
    }
    return false;
  };
  std::thread committer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Set(*source, Cell{"r", "f", "q"}, "v");
  });
  CHECK(wait_for(WorkWatch::kCommitted));
  committer.join();
  if (backend->SignalWaiting()) CHECK(wait_for(WorkWatch::kWaiterSignal));
  std::thread interrupter([&] { watch->Interrupt(); });
  CHECK(wait_for(WorkWatch::kInterrupted));
  interrupter.join();
  watch.reset();
}

TEST_CASE("RunHere runs a chain of observers in the calling thread until idle, in store order",
          "[workers][conformance]") {
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  const ObservedColumn length{"doc", "length", NotifyKind::kStrong, "total"};
  backend->SetObservedColumns({kContent, length});
  const std::thread::id here = std::this_thread::get_id();
  std::vector<std::string> order;
  bool elsewhere = false;
  Observer measure{kContent, [&](const std::shared_ptr<Transaction>& tx, const Cell& cell) {
                     elsewhere |= std::this_thread::get_id() != here;
                     order.push_back(cell.row);
                     auto value = tx->Get(Ref(cell));
                     tx->Set(Ref(Cell{cell.row, "doc", "length"}), std::to_string(value->size()));
                     return Status::Ok();
                   }};
  Observer total{length, [&](const std::shared_ptr<Transaction>& tx, const Cell& cell) {
                   auto value = tx->Get(Ref(cell));
                   auto sum = tx->Get(Ref(Cell{"total", "doc", "sum"}));
                   tx->Set(Ref(Cell{"total", "doc", "sum"}),
                           std::to_string(std::stol(sum.value_or("0")) + std::stol(*value)));
                   return Status::Ok();
                 }};
  for (int i = 0; i < 20; ++i) Set(*source, Cell{"r" + std::to_string(i), "doc", "content"}, "abc");
  percolite::Workers workers(source, {measure, total}, percolite::WorkerOptions{});
  const percolite::RunHereSummary summary = workers.RunHere({});
  CHECK_FALSE(elsewhere);
  CHECK(summary.runs == 40);
  CHECK(summary.commits == 40);
  CHECK_FALSE(summary.failed);
  CHECK_FALSE(summary.stuck);
  CHECK(Read(*source, Cell{"total", "doc", "sum"}) == "60");
  CHECK(backend->PendingNotifications() == 0);
  // The order is the store's: running again over the same store gives it again.
  Layers again(PERCOLITE_EACH_BACKEND());
  again.backend->SetObservedColumns({kContent, length});
  for (int i = 0; i < 20; ++i) {
    Set(*again.source, Cell{"r" + std::to_string(i), "doc", "content"}, "abc");
  }
  const std::vector<std::string> first = order;
  order.clear();
  percolite::Workers(again.source, {measure, total}, percolite::WorkerOptions{}).RunHere({});
  CHECK(order == first);
}

TEST_CASE("RunHere stops at a failure, or retries and parks it; max_runs stops an endless chain",
          "[workers][conformance]") {
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  backend->SetObservedColumns({kContent});
  int calls = 0;
  Observer broken{kContent, [&](const std::shared_ptr<Transaction>&, const Cell&) {
                    ++calls;
                    return Status::Make(ErrorCode::kCallback, "broken");
                  }};
  broken.max_attempts = 3;
  Set(*source, Cell{"r", "doc", "content"}, "v");
  percolite::Workers workers(source, {broken}, percolite::WorkerOptions{});
  percolite::RunHereSummary stopped = workers.RunHere({});
  CHECK(stopped.failed);
  CHECK(stopped.error == "broken");
  CHECK(stopped.runs == 1);
  CHECK(calls == 1);
  CHECK(Pending(*source, Cell{"r", "doc", "content"}));

  percolite::RunHereOptions keep_going;
  keep_going.stop_on_failure = false;
  percolite::RunHereSummary parked = workers.RunHere(keep_going);
  CHECK_FALSE(parked.failed);
  CHECK(parked.failures == 2);  // attempts 2 and 3 (the first was recorded above)
  CHECK(parked.parked == 1);
  CHECK(calls == 3);
  CHECK_FALSE(Pending(*source, Cell{"r", "doc", "content"}));

  // An observer that notifies itself again never lets the store go idle.
  Observer again{kContent, [&](const std::shared_ptr<Transaction>& tx, const Cell& cell) {
                   tx->Set(Ref(cell), "again");
                   return Status::Ok();
                 }};
  Set(*source, Cell{"s", "doc", "content"}, "v");
  percolite::RunHereOptions bounded;
  bounded.max_runs = 25;
  percolite::RunHereSummary stuck =
      percolite::Workers(source, {again}, percolite::WorkerOptions{}).RunHere(bounded);
  CHECK(stuck.stuck);
  CHECK(stuck.runs == 25);
  REQUIRE(stuck.left.size() == 1);
  CHECK(stuck.left[0].first.row == "s");
  CHECK(stuck.left[0].second == "count");
  CHECK(stuck.left_total == 1);
}

TEST_CASE("BeginRun holds a run open for FinishRun: overlapping runs conflict, faults inject",
          "[workers][conformance]") {
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  backend->SetObservedColumns({kContent});
  int calls = 0;
  Observer bump{kContent, [&](const std::shared_ptr<Transaction>& tx, const Cell&) {
                  ++calls;
                  const Cell total{"total", "doc", "n"};
                  tx->Set(Ref(total),
                          std::to_string(std::stol(tx->Get(Ref(total)).value_or("0")) + 1));
                  return Status::Ok();
                }};
  Set(*source, Cell{"a", "doc", "content"}, "v");
  Set(*source, Cell{"b", "doc", "content"}, "v");
  percolite::Workers workers(source, {bump}, percolite::WorkerOptions{});
  const std::vector<percolite::Notification> runnable = workers.Runnable();
  REQUIRE(runnable.size() == 2);

  percolite::BegunRun first = workers.BeginRun(runnable[0], true, false);
  percolite::BegunRun second = workers.BeginRun(runnable[1], true, false);
  CHECK(first.outcome == percolite::RunOutcome::kReady);
  CHECK(second.outcome == percolite::RunOutcome::kReady);
  CHECK(calls == 2);
  CHECK(workers.FinishRun(first, false) == percolite::RunOutcome::kCommitted);
  CHECK(workers.FinishRun(second, false) == percolite::RunOutcome::kConflict);  // both wrote total
  CHECK(Read(*source, Cell{"total", "doc", "n"}) == "1");
  REQUIRE(workers.Runnable().size() == 1);  // the loser's notification stays

  // Injected: a conflict at the commit, then a failure instead of the observer.
  percolite::BegunRun again = workers.BeginRun(workers.Runnable()[0], true, false);
  CHECK(workers.FinishRun(again, /*conflict=*/true) == percolite::RunOutcome::kConflict);
  percolite::BegunRun failing = workers.BeginRun(workers.Runnable()[0], true, /*fail=*/true);
  CHECK(failing.outcome == percolite::RunOutcome::kFailed);
  CHECK(failing.error == "a failure injected by the simulation");
  CHECK(calls == 3);  // the failing run did not call the observer
  percolite::BegunRun last = workers.BeginRun(workers.Runnable()[0], true, false);
  CHECK(workers.FinishRun(last, false) == percolite::RunOutcome::kCommitted);
  CHECK(Read(*source, Cell{"total", "doc", "n"}) == "2");
  CHECK(workers.Runnable().empty());
  const percolite::ObserverStats stats = workers.Stats().observers.at(0);
  CHECK(stats.commits == 2);
  CHECK(stats.conflicts == 2);
  CHECK(stats.failures == 1);
  // A run dropped unfinished (a crash) leaves its notification for later.
  Set(*source, Cell{"c", "doc", "content"}, "v");
  {
    percolite::BegunRun dropped = workers.BeginRun(workers.Runnable()[0], true, false);
    dropped.transaction->Abort();
  }
  CHECK(workers.Runnable().size() == 1);
}

TEST_CASE("Observers that name one sink take turns; a free thread serves others meanwhile",
          "[workers]") {
  // Three threads; observers "a" and "b" name the same sink, "c" none. Each
  // run of a or b holds the sink (counted) until the test lets it go; c's
  // runs return at once. While a run of a or b holds the sink, no other of
  // theirs starts, and c's runs all commit (a free thread serves c rather
  // than wait for the sink). Then the sink's runs go one at a time.
  Layers layers(PERCOLITE_EACH_BACKEND());
  auto& backend = layers.backend;
  auto& source = layers.source;
  const ObservedColumn a_column{"a", "x", NotifyKind::kStrong, "a"};
  const ObservedColumn b_column{"b", "x", NotifyKind::kStrong, "b"};
  const ObservedColumn c_column{"c", "x", NotifyKind::kStrong, "c"};
  backend->SetObservedColumns({a_column, b_column, c_column});
  auto sink = std::make_shared<percolite::SinkTurn>();
  sink->Name("sqlite:/tmp/one.db");
  std::mutex mu;
  std::condition_variable cv;
  int holding = 0, most_holding = 0, sink_runs = 0, c_runs = 0;
  bool let_go = false;
  auto holds_sink = [&](const std::shared_ptr<Transaction>&, const Cell&) {
    std::unique_lock<std::mutex> lock(mu);
    most_holding = std::max(most_holding, ++holding);
    ++sink_runs;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(20), [&] { return let_go; });
    --holding;
    return Status::Ok();
  };
  Observer a{a_column, holds_sink};
  Observer b{b_column, holds_sink};
  a.sink = sink;
  b.sink = sink;
  Observer c{c_column, [&](const std::shared_ptr<Transaction>&, const Cell&) {
               std::lock_guard<std::mutex> lock(mu);
               ++c_runs;
               cv.notify_all();
               return Status::Ok();
             }};
  percolite::WorkerOptions options;
  options.threads = 3;
  percolite::Workers workers(source, {a, b, c}, options);
  workers.Start();
  {
    auto tx = source->Begin();
    for (int i = 0; i < 4; ++i) {
      const std::string row = "r" + std::to_string(i);
      tx->Set(Ref(Cell{row, "a", "x"}), "1");
      tx->Set(Ref(Cell{row, "b", "x"}), "1");
      tx->Set(Ref(Cell{row, "c", "x"}), "1");
    }
    tx->Commit();
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(
        cv.wait_for(lock, std::chrono::seconds(20), [&] { return c_runs >= 4 && sink_runs >= 1; }));
    CHECK(sink_runs == 1);  // the other seven wait for the sink
    CHECK(holding == 1);
    let_go = true;
    cv.notify_all();
  }
  REQUIRE(workers.WaitIdle(30));
  workers.Stop();
  CHECK(sink_runs == 8);
  CHECK(most_holding == 1);
  CHECK(backend->PendingNotifications() == 0);

  // Named no more, the sink's runs go side by side again.
  sink->Name("");
  let_go = false;
  sink_runs = 0;
  percolite::Workers again(source, {a, b, c}, options);
  again.Start();
  {
    auto tx = source->Begin();
    tx->Set(Ref(Cell{"s", "a", "x"}), "2");
    tx->Set(Ref(Cell{"s", "b", "x"}), "2");
    tx->Commit();
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    CHECK(cv.wait_for(lock, std::chrono::seconds(20), [&] { return holding == 2; }));
    let_go = true;
    cv.notify_all();
  }
  REQUIRE(again.WaitIdle(30));
  again.Stop();
  CHECK(most_holding == 2);
}

TEST_CASE("Lanes: sink lanes wait for their sink and go in the order they waited", "[workers]") {
  // Lanes 0, 1 and 2 write sink s, lane 3 none (a feeder). While the sink
  // has a run going, only the feeder's runs are handed out; when it ends,
  // the sink lane served least recently goes, so the three take turns
  // rather than the first in lane order winning every time.
  auto s = std::make_shared<percolite::SinkTurn>();
  s->Name("sqlite:/tmp/s.db");
  percolite::Lanes lanes({s, s, s, nullptr});
  for (size_t lane = 0; lane < 3; ++lane) {
    for (int i = 0; i < 2; ++i) lanes.Push(lane, std::to_string(lane) + ":" + std::to_string(i));
  }
  std::vector<size_t> sink_order;
  for (int round = 0; round < 6; ++round) {
    auto run = lanes.Take();
    REQUIRE(run);
    sink_order.push_back(run->first);
    lanes.Push(3, "feeder" + std::to_string(round));
    auto feeder = lanes.Take();  // the sink is busy: only the feeder goes
    REQUIRE(feeder);
    CHECK(feeder->first == 3);
    CHECK_FALSE(lanes.CanTake());
    CHECK_FALSE(lanes.Take());
    lanes.Done(3);
    lanes.Done(run->first);
  }
  CHECK(sink_order == std::vector<size_t>{0, 1, 2, 0, 1, 2});
  CHECK(lanes.empty());

  // A sink named while a run of its lane is going: the lane's next run
  // waits from the next choice on; unnamed again, runs go side by side.
  auto late = std::make_shared<percolite::SinkTurn>();
  percolite::Lanes two({late, late});
  two.Push(0, "a");
  two.Push(0, "b");
  two.Push(1, "c");
  auto first = two.Take();
  REQUIRE(first);
  late->Name("sqlite:/tmp/late.db");
  CHECK_FALSE(two.CanTake());
  CHECK_FALSE(two.Take());
  late->Name("");
  CHECK(two.Take());
  CHECK(two.Take());
  CHECK(two.empty());
}
