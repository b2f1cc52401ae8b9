// Snapshot-isolation transactions (percolite/transaction.h):
// write-write conflicts, atomicity, commit timestamps, snapshots, read-your-writes,
// states and closing.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "percolite/encoding.h"
#include "percolite/env.h"
#include "percolite/status.h"
#include "percolite/transaction.h"
#include "test_util.h"

namespace {

using percolite::Cell;
using percolite::Env;
using percolite::ErrorCode;
using percolite::ScanRange;
using percolite::Transaction;
using percolite_test::CommitSet;
using percolite_test::ErrorCodeOf;
using percolite_test::FastOptions;
using percolite_test::ReadCommitted;
using percolite_test::Ref;
using percolite_test::ScanAll;
using percolite_test::TempDir;

enum class Op { kSet, kDelete };

void Apply(Transaction& tx, const Cell& cell, Op op, const std::string& value) {
  if (op == Op::kSet) {
    tx.Set(Ref(cell), value);
  } else {
    tx.Delete(Ref(cell));
  }
}

struct RaceOutcome {
  ErrorCode second_commit;
  Transaction::State second_state;
  std::optional<std::string> final_value;
  uint64_t conflicts_counted;
};

// Two transactions begin, write `cell` with `first` and `second`, and commit in
// that order. The cell holds "before" first when `preexisting`.
RaceOutcome RaceOnOneCell(Op first, Op second, bool preexisting) {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const Cell cell{"row", "fam", "qual"};
  if (preexisting) CommitSet(*env, cell, "before");
  auto t1 = env->Begin();
  auto t2 = env->Begin();
  Apply(*t1, cell, first, "first");
  Apply(*t2, cell, second, "second");
  t1->Commit();
  RaceOutcome outcome;
  outcome.second_commit = ErrorCodeOf([&] { t2->Commit(); });
  outcome.second_state = t2->state();
  outcome.final_value = ReadCommitted(*env, cell);
  outcome.conflicts_counted = env->Stats().conflicts;
  return outcome;
}

void CheckSecondRefused(const RaceOutcome& outcome, const std::optional<std::string>& expected) {
  CHECK(outcome.second_commit == ErrorCode::kConflict);
  CHECK(outcome.second_state == Transaction::State::kAborted);
  CHECK(outcome.final_value == expected);
  CHECK(outcome.conflicts_counted == 1);
}

// A model of committed cells, ordered like encoded keys (std::string compares unsigned bytes).
using Model = std::map<std::tuple<std::string, std::string, std::string>, std::string>;

std::vector<std::string> Render(const std::vector<percolite::ScanItem>& items) {
  std::vector<std::string> out;
  for (const auto& item : items) {
    out.push_back(item.cell.row + "/" + item.cell.family + "/" + item.cell.qualifier + "=" +
                  item.value);
  }
  return out;
}

std::vector<std::string> Render(const Model& model, const std::string& row_prefix) {
  std::vector<std::string> out;
  for (const auto& [cell, value] : model) {
    const auto& [row, family, qualifier] = cell;
    if (row.compare(0, row_prefix.size(), row_prefix) != 0) continue;
    out.push_back(row + "/" + family + "/" + qualifier + "=" + value);
  }
  return out;
}

}  // namespace

TEST_CASE("Concurrent sets of one cell: the later committer conflicts", "[transactions]") {
  CheckSecondRefused(RaceOnOneCell(Op::kSet, Op::kSet, /*preexisting=*/false), "first");
  CheckSecondRefused(RaceOnOneCell(Op::kSet, Op::kSet, /*preexisting=*/true), "first");
}

TEST_CASE("A set and a concurrent delete of one cell conflict in either order", "[transactions]") {
  SECTION("set commits first, the delete is refused") {
    CheckSecondRefused(RaceOnOneCell(Op::kSet, Op::kDelete, /*preexisting=*/true), "first");
  }
  SECTION("delete commits first, the set is refused") {
    CheckSecondRefused(RaceOnOneCell(Op::kDelete, Op::kSet, /*preexisting=*/true), std::nullopt);
  }
  SECTION("two deletes of one cell conflict too") {
    CheckSecondRefused(RaceOnOneCell(Op::kDelete, Op::kDelete, /*preexisting=*/true), std::nullopt);
  }
}

TEST_CASE("Deleting a never-existing cell leaves a tombstone a concurrent set conflicts with",
          "[transactions]") {
  CheckSecondRefused(RaceOnOneCell(Op::kDelete, Op::kSet, /*preexisting=*/false), std::nullopt);
}

TEST_CASE("Concurrent writes of different cells, even in one row, do not conflict",
          "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const Cell existing{"r1", "f", "q"};
  CommitSet(*env, existing, "v0");
  const std::vector<Cell> cells = {
      {"r1", "f", "q"}, {"r2", "f", "q"}, {"r1", "f", "q2"}, {"r1", "g", "q"}, {"r1", "f", ""}};
  std::vector<std::shared_ptr<Transaction>> txs;
  for (size_t i = 0; i < cells.size(); ++i) {
    txs.push_back(env->Begin());
    txs.back()->Set(Ref(cells[i]), "v" + std::to_string(i + 1));
  }
  for (auto& tx : txs) REQUIRE_NOTHROW(tx->Commit());
  for (size_t i = 0; i < cells.size(); ++i) {
    CHECK(ReadCommitted(*env, cells[i]) == "v" + std::to_string(i + 1));
  }
  CHECK(env->Stats().conflicts == 0);
}

TEST_CASE("Reads never conflict, so write skew commits", "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const Cell x{"oncall", "doctor", "alice"}, y{"oncall", "doctor", "bob"};
  CommitSet(*env, x, "on");
  CommitSet(*env, y, "on");

  // Each doctor leaves if the other is still on call: both read both cells.
  auto alice = env->Begin();
  auto bob = env->Begin();
  REQUIRE(alice->Get(Ref(y)) == "on");
  REQUIRE(bob->Get(Ref(x)) == "on");
  alice->Set(Ref(x), "off");
  bob->Set(Ref(y), "off");
  REQUIRE_NOTHROW(alice->Commit());
  REQUIRE_NOTHROW(bob->Commit());
  CHECK(ReadCommitted(*env, x) == "off");
  CHECK(ReadCommitted(*env, y) == "off");

  // A cell only read, and overwritten meanwhile, does not stop a commit either.
  auto reader = env->Begin();
  REQUIRE(reader->Get(Ref(x)) == "off");
  reader->Set(Ref(Cell{"other", "f", "q"}), "w");
  CommitSet(*env, x, "back on");
  CHECK(reader->Get(Ref(x)) == "off");
  REQUIRE_NOTHROW(reader->Commit());
  CHECK(env->Stats().conflicts == 0);
}

TEST_CASE("A refused commit applies none of its writes", "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const Cell a{"a", "f", "q"}, b{"b", "f", "q"}, c{"c", "f", "q"}, d{"d", "f", "q"};
  CommitSet(*env, a, "a0");
  CommitSet(*env, b, "b0");
  CommitSet(*env, d, "d0");
  const uint64_t commits_before = env->Stats().commits;

  auto loser = env->Begin();
  // Cells sorted before and after the conflicting one, a new cell and a delete.
  loser->Set(Ref(a), "a2");
  loser->Set(Ref(b), "b2");
  loser->Set(Ref(c), "c2");
  loser->Delete(Ref(d));
  CommitSet(*env, b, "b1");
  CHECK(ErrorCodeOf([&] { loser->Commit(); }) == ErrorCode::kConflict);
  CHECK_FALSE(loser->commit_ts().has_value());

  CHECK(ReadCommitted(*env, a) == "a0");
  CHECK(ReadCommitted(*env, b) == "b1");
  CHECK(ReadCommitted(*env, c) == std::nullopt);
  CHECK(ReadCommitted(*env, d) == "d0");
  CHECK(env->Stats().commits == commits_before + 1);

  // The untouched cells stay writable by transactions that began before the refusal.
  auto later = env->Begin();
  later->Set(Ref(a), "a3");
  later->Set(Ref(c), "c3");
  REQUIRE_NOTHROW(later->Commit());
  CHECK(ReadCommitted(*env, c) == "c3");
}

TEST_CASE("Commit timestamps are unique and increase with commit order", "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());

  SECTION("one thread") {
    uint64_t previous = 0;
    for (int i = 0; i < 20; ++i) {
      auto tx = env->Begin();
      CHECK(tx->start_ts() >= previous);  // every earlier commit is in the snapshot
      tx->Set(Ref(Cell{"row" + std::to_string(i % 3), "f", "q"}), std::to_string(i));
      tx->Commit();
      REQUIRE(tx->commit_ts().has_value());
      CHECK(*tx->commit_ts() > tx->start_ts());
      CHECK(*tx->commit_ts() > previous);
      previous = *tx->commit_ts();
    }
  }

  SECTION("four threads at once") {
    constexpr int kThreads = 4, kPerThread = 25;
    std::vector<std::vector<uint64_t>> stamps(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          auto tx = env->Begin();
          tx->Set(Ref(Cell{"t" + std::to_string(t), "f", std::to_string(i)}), "v");
          tx->Commit();
          stamps[t].push_back(tx->commit_ts().value_or(0));
        }
      });
    }
    for (auto& thread : threads) thread.join();
    std::set<uint64_t> all;
    for (const auto& mine : stamps) {
      REQUIRE(mine.size() == kPerThread);
      for (size_t i = 1; i < mine.size(); ++i) CHECK(mine[i] > mine[i - 1]);
      all.insert(mine.begin(), mine.end());
    }
    CHECK(all.count(0) == 0);
    CHECK(all.size() == kThreads * kPerThread);
    CHECK(env->Stats().commits == kThreads * kPerThread);
  }
}

TEST_CASE("A transaction sees its snapshot, not commits made after it began", "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const Cell changed{"k1", "f", "q"}, added{"k2", "f", "q"}, removed{"k3", "f", "q"};
  CommitSet(*env, changed, "old");
  CommitSet(*env, removed, "here");

  auto early = env->Begin();
  auto writer = env->Begin();
  writer->Set(Ref(changed), "new");
  writer->Set(Ref(added), "added");
  writer->Delete(Ref(removed));
  writer->Commit();
  auto late = env->Begin();

  CHECK(early->start_ts() < *writer->commit_ts());
  CHECK(late->start_ts() >= *writer->commit_ts());

  CHECK(early->Get(Ref(changed)) == "old");
  CHECK(early->Get(Ref(added)) == std::nullopt);
  CHECK(early->Get(Ref(removed)) == "here");
  CHECK(Render(ScanAll(*early, ScanRange::RowPrefix("k"), 10)) ==
        std::vector<std::string>{"k1/f/q=old", "k3/f/q=here"});

  CHECK(late->Get(Ref(changed)) == "new");
  CHECK(late->Get(Ref(added)) == "added");
  CHECK(late->Get(Ref(removed)) == std::nullopt);
  CHECK(Render(ScanAll(*late, ScanRange::RowPrefix("k"), 10)) ==
        std::vector<std::string>{"k1/f/q=new", "k2/f/q=added"});
}

TEST_CASE("Concurrent transfers keep the total of every snapshot constant", "[transactions]") {
  constexpr int kAccounts = 8, kWriters = 3, kTransfersPerWriter = 60, kInitial = 100;
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  auto account = [](int i) { return Cell{"acct" + std::to_string(i), "bal", ""}; };
  {
    auto tx = env->Begin();
    for (int i = 0; i < kAccounts; ++i) tx->Set(Ref(account(i)), std::to_string(kInitial));
    tx->Commit();
  }
  std::atomic<bool> stop{false};
  std::atomic<int> bad_totals{0}, audits{0}, conflicts{0};
  std::thread auditor([&] {
    while (!stop.load()) {
      auto tx = env->Begin();
      long total = 0;
      for (const auto& item : ScanAll(*tx, ScanRange::RowPrefix("acct"), 3)) {
        total += std::stol(item.value);
      }
      bad_totals += total != kInitial * kAccounts;
      ++audits;
    }
  });
  // The memory backend commits in microseconds: without this wait the writers
  // could all finish before the auditor began its first audit.
  while (audits.load() == 0) std::this_thread::yield();
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      std::mt19937 rng(w);
      for (int done = 0; done < kTransfersPerWriter;) {
        const int from = rng() % kAccounts, to = (from + 1 + rng() % (kAccounts - 1)) % kAccounts;
        auto tx = env->Begin();
        const long a = std::stol(tx->Get(Ref(account(from))).value());
        const long b = std::stol(tx->Get(Ref(account(to))).value());
        tx->Set(Ref(account(from)), std::to_string(a - 1));
        tx->Set(Ref(account(to)), std::to_string(b + 1));
        if (ErrorCodeOf([&] { tx->Commit(); }) == ErrorCode::kOk) {
          ++done;
        } else {
          ++conflicts;
        }
      }
    });
  }
  for (auto& writer : writers) writer.join();
  stop = true;
  auditor.join();
  INFO("audits " << audits.load() << " conflicts " << conflicts.load());
  CHECK(audits.load() > 0);
  CHECK(bad_totals.load() == 0);
  CHECK(env->Stats().commits == 1 + kWriters * kTransfersPerWriter);
  CHECK(env->Stats().conflicts == static_cast<uint64_t>(conflicts.load()));
  auto tx = env->Begin();
  long total = 0;
  for (int i = 0; i < kAccounts; ++i) total += std::stol(tx->Get(Ref(account(i))).value());
  CHECK(total == kInitial * kAccounts);
}

TEST_CASE("Get reads the transaction's own sets and deletes before the snapshot",
          "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const Cell kept{"r", "f", "kept"}, overwritten{"r", "f", "over"}, deleted{"r", "f", "del"},
      fresh{"r", "f", "fresh"}, reborn{"r", "f", "reborn"}, transient{"r", "f", "transient"};
  CommitSet(*env, kept, "k0");
  CommitSet(*env, overwritten, "o0");
  CommitSet(*env, deleted, "d0");
  CommitSet(*env, reborn, "r0");

  auto tx = env->Begin();
  tx->Set(Ref(overwritten), "o1");
  tx->Delete(Ref(deleted));
  tx->Set(Ref(fresh), "");  // empty values are values
  tx->Delete(Ref(reborn));
  tx->Set(Ref(reborn), "r1");
  tx->Set(Ref(transient), "t1");
  tx->Delete(Ref(transient));

  CHECK(tx->Get(Ref(kept)) == "k0");
  CHECK(tx->Get(Ref(overwritten)) == "o1");
  CHECK(tx->Get(Ref(deleted)) == std::nullopt);
  CHECK(tx->Get(Ref(fresh)) == std::string());
  CHECK(tx->Get(Ref(reborn)) == "r1");
  CHECK(tx->Get(Ref(transient)) == std::nullopt);

  // Nobody else sees uncommitted writes.
  CHECK(ReadCommitted(*env, overwritten) == "o0");
  CHECK(ReadCommitted(*env, deleted) == "d0");
  CHECK(ReadCommitted(*env, fresh) == std::nullopt);

  tx->Commit();
  CHECK(ReadCommitted(*env, overwritten) == "o1");
  CHECK(ReadCommitted(*env, deleted) == std::nullopt);
  CHECK(ReadCommitted(*env, fresh) == std::string());
  CHECK(ReadCommitted(*env, reborn) == "r1");
  CHECK(ReadCommitted(*env, transient) == std::nullopt);
}

TEST_CASE("Scan merges own writes into the snapshot in key order, for every chunk size",
          "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  Model committed;
  {
    auto tx = env->Begin();
    for (const std::string row : {"q0", "r1", "r3", "r5", "r7", "s0"}) {
      tx->Set(Ref(Cell{row, "f", "q"}), "s" + row);
      committed[{row, "f", "q"}] = "s" + row;
    }
    tx->Commit();
  }

  auto tx = env->Begin();
  Model mine = committed;
  auto set = [&](const std::string& row, const std::string& qualifier, const std::string& value) {
    tx->Set(Ref(Cell{row, "f", qualifier}), value);
    mine[{row, "f", qualifier}] = value;
  };
  auto erase = [&](const std::string& row) {
    tx->Delete(Ref(Cell{row, "f", "q"}));
    mine.erase({row, "f", "q"});
  };
  set("r0", "q", "o0");    // before every snapshot cell of the prefix
  set("r1", "q2", "o1b");  // a second column after a snapshot cell of the same row
  set("r2", "q", "o2");
  erase("r3");           // hides a snapshot cell
  set("r5", "q", "o5");  // replaces a snapshot value
  set("r6", "q", "o6");
  set("r7", "q", "gone");
  erase("r7");             // set then deleted: hidden
  set("r8", "q", "o8");    // after every snapshot cell of the prefix
  erase("r9");             // delete of a cell that never existed
  set("q9", "q", "out");   // outside the prefix
  set("r", "q", "short");  // the prefix itself as a row

  const std::vector<std::string> expected = Render(mine, "r");
  REQUIRE(expected.size() == 8);
  for (size_t limit : {1, 2, 3, 4, 5, 7, 1000}) {
    INFO("limit " << limit);
    CHECK(Render(ScanAll(*tx, ScanRange::RowPrefix("r"), limit)) == expected);
  }
  CHECK(Render(ScanAll(*tx, ScanRange::Rows("r2", std::string_view("r6")), 2)) ==
        std::vector<std::string>{"r2/f/q=o2", "r5/f/q=o5"});
  ScanRange second_columns = ScanRange::RowPrefix("r");
  second_columns.columns = {{"f", "q2"}};
  CHECK(Render(ScanAll(*tx, second_columns, 2)) == std::vector<std::string>{"r1/f/q2=o1b"});

  // Another transaction still sees only the committed cells.
  auto other = env->Begin();
  CHECK(Render(ScanAll(*other, ScanRange::RowPrefix("r"), 2)) == Render(committed, "r"));
}

TEST_CASE("Count gives what Scan would visit, up to limit, with or without own writes",
          "[transactions][count]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  for (const std::string row : {"q", "r1", "r2", "r3", "r4", "r5", "s"}) {
    CommitSet(*env, Cell{row, "f", "q"}, row);
  }
  {
    auto tx = env->Begin();
    tx->Delete(Ref(Cell{"r3", "f", "q"}));  // a tombstone inside the range
    tx->Commit();
  }
  const ScanRange range = ScanRange::RowPrefix("r");
  auto count_by_scan = [&](Transaction& tx, const std::string* resume) {
    size_t n = 0;
    std::string next;
    for (;;) {
      percolite::ScanChunk chunk = tx.Scan(range, resume, 2);
      n += chunk.items.size();
      if (chunk.done) return n;
      next = chunk.resume_after;
      resume = &next;
    }
  };
  {
    auto tx = env->Begin();  // no own writes: the snapshot counts alone
    CHECK(count_by_scan(*tx, nullptr) == 4);
    CHECK(tx->Count(range, nullptr, 100) == 4);
    CHECK(tx->Count(range, nullptr, 3) == 3);
    const std::string after_r2 = percolite::EncodeCellKey({"r2", "f", "q"});
    CHECK(tx->Count(range, &after_r2, 100) == 2);  // r4, r5
  }
  auto tx = env->Begin();
  tx->Delete(Ref(Cell{"r1", "f", "q"}));
  tx->Set(Ref(Cell{"r6", "f", "q"}), "new");
  tx->Set(Ref(Cell{"r2", "f", "q2"}), "new");
  CHECK(count_by_scan(*tx, nullptr) == 5);  // r2, r2/q2, r4, r5, r6
  for (size_t limit : {1, 4, 5, 100}) {
    INFO("limit " << limit);
    CHECK(tx->Count(range, nullptr, limit) == std::min<size_t>(limit, 5));
  }
  ScanRange by_column = range;
  by_column.columns = {{"f", "q"}};
  CHECK(ErrorCodeOf([&] { tx->Count(by_column, nullptr, 10); }) == ErrorCode::kInvalidArgument);
}

TEST_CASE("Scan returns at most limit cells per chunk, counting the transaction's own writes",
          "[transactions][scan-limit]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  for (const std::string row : {"b", "d", "f", "h"}) CommitSet(*env, Cell{row, "f", "q"}, row);
  auto tx = env->Begin();
  for (const std::string row : {"a", "c", "e", "g", "i", "j"}) {
    tx->Set(Ref(Cell{row, "f", "q"}), row);
  }
  for (size_t limit : {1, 2, 3}) {
    INFO("limit " << limit);
    std::string resume;
    size_t total = 0;
    for (int chunks = 0; chunks < 100; ++chunks) {
      percolite::ScanChunk chunk =
          tx->Scan(ScanRange::RowPrefix(""), chunks == 0 ? nullptr : &resume, limit);
      CHECK(chunk.items.size() <= limit);
      total += chunk.items.size();
      if (chunk.done) break;
      resume = chunk.resume_after;
    }
    CHECK(total == 10);
  }
}

TEST_CASE("A transaction that wrote nothing commits without a commit_ts or a store write",
          "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const Cell cell{"r", "f", "q"};
  CommitSet(*env, cell, "v");
  const percolite::BackendStats before = env->Stats();

  auto reader = env->Begin();
  CHECK(reader->Get(Ref(cell)) == "v");
  REQUIRE_NOTHROW(reader->Commit());
  CHECK(reader->state() == Transaction::State::kCommitted);
  CHECK_FALSE(reader->commit_ts().has_value());

  auto idle = env->Begin();
  REQUIRE_NOTHROW(idle->Commit());
  CHECK_FALSE(idle->commit_ts().has_value());

  const percolite::BackendStats after = env->Stats();
  CHECK(after.commits == before.commits);
  CHECK(after.batches == before.batches);
  // The next writer's snapshot has not moved either.
  auto next = env->Begin();
  CHECK(next->start_ts() == reader->start_ts());
}

TEST_CASE("Every call but Abort throws kWrongState once a transaction is finished",
          "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const Cell cell{"r", "f", "q"};
  auto expect_finished = [&](Transaction& tx, Transaction::State state) {
    CHECK(tx.state() == state);
    CHECK(ErrorCodeOf([&] { tx.Get(Ref(cell)); }) == ErrorCode::kWrongState);
    CHECK(ErrorCodeOf([&] { tx.Set(Ref(cell), "x"); }) == ErrorCode::kWrongState);
    CHECK(ErrorCodeOf([&] { tx.Delete(Ref(cell)); }) == ErrorCode::kWrongState);
    CHECK(ErrorCodeOf([&] { tx.Scan(ScanRange::RowPrefix("r"), nullptr, 10); }) ==
          ErrorCode::kWrongState);
    CHECK(ErrorCodeOf([&] { tx.Commit(); }) == ErrorCode::kWrongState);
    CHECK_NOTHROW(tx.Abort());
    CHECK(tx.state() == state);
  };

  SECTION("after a commit") {
    auto tx = env->Begin();
    tx->Set(Ref(cell), "v");
    tx->Commit();
    const auto stamp = tx->commit_ts();
    expect_finished(*tx, Transaction::State::kCommitted);
    CHECK(tx->commit_ts() == stamp);
    CHECK(ReadCommitted(*env, cell) == "v");
  }
  SECTION("after an abort") {
    auto tx = env->Begin();
    tx->Set(Ref(cell), "v");
    tx->Abort();
    expect_finished(*tx, Transaction::State::kAborted);
    CHECK(ReadCommitted(*env, cell) == std::nullopt);
  }
  SECTION("after a refused commit") {
    auto tx = env->Begin();
    tx->Set(Ref(cell), "mine");
    CommitSet(*env, cell, "theirs");
    REQUIRE(ErrorCodeOf([&] { tx->Commit(); }) == ErrorCode::kConflict);
    expect_finished(*tx, Transaction::State::kAborted);
  }
}

TEST_CASE("Closing the Env makes its transactions and the handle throw kClosed", "[transactions]") {
  TempDir dir;
  const Cell kept{"r", "f", "kept"}, pending{"r", "f", "pending"};
  auto env = Env::Open(dir.path(), FastOptions());
  CommitSet(*env, kept, "k");
  auto active = env->Begin();
  active->Set(Ref(pending), "never");
  auto committed = env->Begin();
  committed->Set(Ref(kept), "k2");
  committed->Commit();

  env->Close();
  CHECK(env->closed());
  for (Transaction* tx : {active.get(), committed.get()}) {
    CHECK(ErrorCodeOf([&] { tx->Get(Ref(kept)); }) == ErrorCode::kClosed);
    CHECK(ErrorCodeOf([&] { tx->Set(Ref(kept), "x"); }) == ErrorCode::kClosed);
    CHECK(ErrorCodeOf([&] { tx->Delete(Ref(kept)); }) == ErrorCode::kClosed);
    CHECK(ErrorCodeOf([&] { tx->Scan(ScanRange::RowPrefix("r"), nullptr, 10); }) ==
          ErrorCode::kClosed);
    CHECK(ErrorCodeOf([&] { tx->Commit(); }) == ErrorCode::kClosed);
    CHECK_NOTHROW(tx->Abort());
  }
  CHECK(ErrorCodeOf([&] { env->Begin(); }) == ErrorCode::kClosed);
  CHECK(ErrorCodeOf([&] { env->Stats(); }) == ErrorCode::kClosed);
  CHECK(ErrorCodeOf([&] { env->backend(); }) == ErrorCode::kClosed);
  CHECK_NOTHROW(env->Close());

  // The open transaction's buffered write was discarded; committed data stays.
  auto reopened = Env::Open(dir.path(), FastOptions());
  CHECK(ReadCommitted(*reopened, kept) == "k2");
  CHECK(ReadCommitted(*reopened, pending) == std::nullopt);
}

TEST_CASE("Empty rows and families are refused while empty qualifiers and binary bytes work",
          "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  auto tx = env->Begin();
  CHECK(ErrorCodeOf([&] { tx->Set(Ref(Cell{"", "f", "q"}), "v"); }) == ErrorCode::kInvalidArgument);
  CHECK(ErrorCodeOf([&] { tx->Set(Ref(Cell{"r", "", "q"}), "v"); }) == ErrorCode::kInvalidArgument);
  CHECK(ErrorCodeOf([&] { tx->Get(Ref(Cell{"", "f", "q"})); }) == ErrorCode::kInvalidArgument);
  CHECK(ErrorCodeOf([&] { tx->Delete(Ref(Cell{"r", "", ""})); }) == ErrorCode::kInvalidArgument);

  const Cell binary{std::string("\x00\xFF\x00", 3), std::string("\xFF", 1), std::string()};
  const std::string value("\x00\x00\x01\xFF", 4);
  tx->Set(Ref(binary), value);
  tx->Commit();
  CHECK(ReadCommitted(*env, binary) == value);
  auto reader = env->Begin();
  const auto items = ScanAll(*reader, ScanRange::RowPrefix(std::string("\x00", 1)), 10);
  REQUIRE(items.size() == 1);
  CHECK(percolite_test::SameCell(items[0].cell, binary));
  CHECK(items[0].value == value);
}

TEST_CASE("CommitAsync reports once; the transaction is committing, then committed or aborted",
          "[transactions][conformance]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  const Cell cell{"r", "f", "q"};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<percolite::CommitResult> results;
  auto record = [&](const percolite::CommitResult& result) {
    std::lock_guard<std::mutex> lock(mu);
    results.push_back(result);
    cv.notify_all();
  };
  auto wait_for = [&](size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return results.size() >= n; });
  };
  auto first = env->Begin(), second = env->Begin();
  first->Set(Ref(cell), "first");
  second->Set(Ref(cell), "second");
  first->CommitAsync(record);
  // Submitted: nothing more may be done with it until the result is in.
  CHECK(ErrorCodeOf([&] { first->Set(Ref(cell), "x"); }) == ErrorCode::kWrongState);
  CHECK(ErrorCodeOf([&] { first->Commit(); }) == ErrorCode::kWrongState);
  REQUIRE(wait_for(1));
  CHECK(results[0].status.ok());
  CHECK(first->state() == Transaction::State::kCommitted);
  CHECK(first->commit_ts() == results[0].commit_ts);
  CHECK(ReadCommitted(*env, cell) == "first");

  second->CommitAsync(record);  // its snapshot predates the first commit
  REQUIRE(wait_for(2));
  CHECK(results[1].status.code() == ErrorCode::kConflict);
  CHECK(second->state() == Transaction::State::kAborted);
  CHECK(second->commit_ts() == std::nullopt);
  CHECK(ReadCommitted(*env, cell) == "first");

  auto empty = env->Begin();  // wrote nothing: committed at once, no commit_ts
  empty->CommitAsync(record);
  REQUIRE(wait_for(3));
  CHECK(results[2].status.ok());
  CHECK(results[2].commit_ts == 0);
  CHECK(empty->state() == Transaction::State::kCommitted);
  env->Close();
}

TEST_CASE("RollbackTo drops what was buffered after Save, and only that", "[transactions]") {
  TempDir dir;
  auto env = percolite_test::OpenEnv(dir, PERCOLITE_EACH_BACKEND());
  auto tx = env->Begin();
  tx->Set({"r", "f", "kept"}, "1");
  tx->AddStamped({"q", "e", "kept"}, "s1");
  tx->SetWeakNotification({"w", "f", "kept"});
  const percolite::Transaction::Savepoint savepoint = tx->Save();
  tx->Set({"r", "f", "kept"}, "2");
  tx->Set({"r", "f", "dropped"}, "x");
  tx->Delete({"r", "f", "other"});
  tx->AddStamped({"q", "e", "dropped"}, "s2");
  tx->SetWeakNotification({"w", "f", "dropped"});
  CHECK(tx->StampedCount() == 2);
  tx->RollbackTo(savepoint);
  CHECK(tx->StampedCount() == 1);
  CHECK(tx->Get({"r", "f", "kept"}) == "1");
  CHECK_FALSE(tx->Get({"r", "f", "dropped"}).has_value());
  tx->Commit();
  auto check = env->Begin();
  CHECK(check->Get({"r", "f", "kept"}) == "1");
  CHECK_FALSE(check->Get({"r", "f", "dropped"}).has_value());
  auto chunk = check->Scan(percolite::ScanRange::RowPrefix("q"), nullptr, 10);
  REQUIRE(chunk.items.size() == 1);
  CHECK(chunk.items[0].value == "s1");
  CHECK(check->NotificationPending(percolite::EncodeCellKey({"w", "f", "kept"})));
  CHECK_FALSE(check->NotificationPending(percolite::EncodeCellKey({"w", "f", "dropped"})));
  check->Abort();
}
