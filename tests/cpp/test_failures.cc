// Failed and parked work recorded in the store (failures.h), and the worker
// pool's use of it (workers.h), over each backend.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "percolite/backend.h"
#include "percolite/encoding.h"
#include "percolite/failures.h"
#include "percolite/notifications.h"
#include "percolite/transaction.h"
#include "percolite/workers.h"
#include "test_util.h"

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
using percolite::WorkRecord;
using percolite_test::FastOptions;
using percolite_test::Ref;
using percolite_test::TempDir;

using Store = percolite_test::Layers;

const ObservedColumn kContent{"doc", "content", NotifyKind::kStrong, "index"};

void SetContent(TransactionSource& source, const std::string& row) {
  auto tx = source.Begin();
  tx->Set({row, "doc", "content"}, "text");
  tx->Commit();
}

std::vector<WorkRecord> Records(TransactionSource& source, bool parked_only) {
  auto tx = source.Begin();
  auto records = percolite::ListWorkRecords(*tx, parked_only);
  tx->Abort();
  return records;
}

percolite::WorkerOptions Fast() {
  percolite::WorkerOptions options;
  options.threads = 2;
  options.retry_initial_seconds = 0.002;
  options.retry_max_seconds = 0.01;
  return options;
}

}  // namespace

TEST_CASE("DescribeFailure splits a Python traceback into type, message and text", "[failures]") {
  const std::string traceback =
      "Traceback (most recent call last):\n"
      "  File \"app.py\", line 3, in index\n"
      "    raise ValueError('bad: x')\n"
      "ValueError: bad: x\n";
  auto detail = percolite::DescribeFailure(traceback);
  CHECK(detail.type == "ValueError");
  CHECK(detail.message == "bad: x");
  CHECK(detail.traceback == traceback);

  // A chained exception: the last one is the one reported.
  const std::string chained = traceback +
                              "\nDuring handling of the above exception, another exception "
                              "occurred:\n\nTraceback (most recent call last):\n"
                              "  File \"app.py\", line 5, in index\n"
                              "    raise mod.Oops('two\\nlines')\n"
                              "mod.Oops: two\nlines\n";
  detail = percolite::DescribeFailure(chained);
  CHECK(detail.type == "mod.Oops");
  CHECK(detail.message == "two\nlines");

  // An exception without a message, and text that is no traceback at all.
  detail = percolite::DescribeFailure(
      "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n    x\nKeyError\n");
  CHECK(detail.type == "KeyError");
  CHECK(detail.message.empty());
  detail = percolite::DescribeFailure("the sink is down\n", "CoreError");
  CHECK(detail.type == "CoreError");
  CHECK(detail.message == "the sink is down");
}

TEST_CASE("Work that fails max_attempts times is parked, no longer pending, and retried on demand",
          "[failures][workers][conformance]") {
  Store store(PERCOLITE_EACH_BACKEND());
  auto& source = store.source;
  store.backend->SetObservedColumns({kContent});
  std::atomic<bool> fixed{false};
  std::atomic<int> calls{0};
  Observer observer{kContent, [&](const std::shared_ptr<Transaction>& tx, const Cell& cell) {
                      ++calls;
                      if (!fixed) return Status::Make(ErrorCode::kCallback, "broken");
                      tx->Set({cell.row, "doc", "done"}, "yes");
                      return Status::Ok();
                    }};
  observer.max_attempts = 3;
  std::atomic<int> reported{0}, parked_reports{0};
  percolite::WorkerOptions options = Fast();
  options.on_failure = [&](const ObservedColumn& column, const WorkRecord& record) {
    CHECK(column.observer == "index");
    ++reported;
    if (record.parked) ++parked_reports;
  };
  {
    percolite::Workers workers(source, {observer}, options);
    workers.Start();
    SetContent(*source, "a");
    SetContent(*source, "b");
    REQUIRE(workers.WaitIdle(30));  // parked work is not pending
    workers.Stop();
    CHECK(workers.Stats().observers.at(0).parked == 2);
  }
  CHECK(calls == 6);
  CHECK(reported == 6);
  CHECK(parked_reports == 2);
  CHECK(store.backend->PendingNotifications() == 0);
  auto parked = Records(*source, true);
  REQUIRE(parked.size() == 2);
  CHECK(parked[0].attempts == 3);
  CHECK(parked[0].observer == "index");
  CHECK(parked[0].error.message == "broken");
  CHECK(parked[0].first_failure_unix <= parked[0].last_failure_unix);
  {
    auto tx = source->Begin();
    auto summaries = percolite::ListFailureSummaries(*tx);
    tx->Abort();
    REQUIRE(summaries.size() == 1);
    CHECK(summaries[0].failures == 6);
    CHECK(summaries[0].parked == 2);
  }

  // Retry only "a"; the fixed observer runs it once and deletes its record.
  fixed = true;
  const std::string key_a = percolite::EncodeCellKey({"a", "doc", "content"});
  CHECK(percolite::RetryParked(*source, [&](const WorkRecord& r) { return r.cell_key == key_a; }) ==
        1);
  {
    percolite::Workers workers(source, {observer}, options);
    workers.Start();
    REQUIRE(workers.WaitIdle(30));
    workers.Stop();
  }
  CHECK(calls == 7);
  parked = Records(*source, false);
  REQUIRE(parked.size() == 1);
  CHECK(parked[0].cell_key == percolite::EncodeCellKey({"b", "doc", "content"}));
  CHECK(percolite::RetryParked(*source, [](const WorkRecord&) { return true; }) == 1);
  CHECK(percolite::RetryParked(*source, [](const WorkRecord&) { return true; }) == 0);
}

TEST_CASE("A run that fails after its work was done elsewhere reports no empty record",
          "[failures][workers][conformance]") {
  Store store(PERCOLITE_EACH_BACKEND());
  auto& source = store.source;
  store.backend->SetObservedColumns({kContent});
  // The run's notification is consumed by another transaction (as by a run
  // elsewhere, or a commit settled after a lost connection), then it fails.
  Observer observer{kContent, [&](const std::shared_ptr<Transaction>&, const Cell& cell) {
                      auto other = source->Begin();
                      other->SetTrigger(percolite::EncodeCellKey({cell.row, "doc", "content"}));
                      other->Commit();
                      return Status::Make(ErrorCode::kCallback, "lost the race");
                    }};
  std::vector<WorkRecord> reported;
  std::mutex reported_mu;
  percolite::WorkerOptions options = Fast();
  options.on_failure = [&](const ObservedColumn&, const WorkRecord& record) {
    std::lock_guard<std::mutex> lock(reported_mu);
    reported.push_back(record);
  };
  {
    percolite::Workers workers(source, {observer}, options);
    workers.Start();
    SetContent(*source, "a");
    REQUIRE(workers.WaitIdle(30));
    workers.Stop();
    CHECK(workers.Stats().observers.at(0).failures == 1);
  }
  CHECK(reported.empty());
  CHECK(Records(*source, false).empty());
  CHECK(store.backend->PendingNotifications() == 0);
}

TEST_CASE("Failures recorded by many threads at once are all counted", "[failures][conformance]") {
  Store store(PERCOLITE_EACH_BACKEND());
  auto& source = store.source;
  store.backend->SetObservedColumns({kContent});
  constexpr int kThreads = 4, kEach = 25;
  for (int t = 0; t < kThreads; ++t) SetContent(*source, "row" + std::to_string(t));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string key =
          percolite::EncodeCellKey({"row" + std::to_string(t), "doc", "content"});
      for (int i = 0; i < kEach; ++i) {
        percolite::RecordFailure(*source, "index", key, {"E", "m", "t"}, 0, 1000.0 + i);
      }
    });
  }
  for (auto& t : threads) t.join();
  auto tx = source->Begin();
  auto summaries = percolite::ListFailureSummaries(*tx);
  auto records = percolite::ListWorkRecords(*tx, false);
  tx->Abort();
  REQUIRE(summaries.size() == 1);
  CHECK(summaries[0].failures == kThreads * kEach);
  CHECK(summaries[0].parked == 0);
  REQUIRE(records.size() == kThreads);
  for (const auto& r : records) CHECK(r.attempts == kEach);
}
