// Opening and closing stores (percolite/env.h, backend/lmdb_backend.h): one Store per
// path per process, option checks, persistence across reopening, closing while
// other threads work, and handles inherited by a forked child.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/lmdb_backend.h"
#include "percolite/env.h"
#include "percolite/transaction.h"
#include "test_util.h"

namespace {

using percolite::Cell;
using percolite::Env;
using percolite::ErrorCode;
using percolite::Transaction;
using percolite_test::CommitSet;
using percolite_test::ErrorCodeOf;
using percolite_test::FastOptions;
using percolite_test::ReadCommitted;
using percolite_test::Ref;
using percolite_test::TempDir;

}  // namespace

TEST_CASE("Handles of one path share one Store, which closes with its last handle", "[store]") {
  TempDir dir;
  const Cell cell{"r", "f", "q"};
  auto first = Env::Open(dir.path(), FastOptions());
  auto second = Env::Open(dir.path() + "/./", FastOptions());
  CHECK(first->backend() == second->backend());
  CHECK(first->path() == second->path());

  CommitSet(*first, cell, "from first");
  CHECK(ReadCommitted(*second, cell) == "from first");
  CHECK(second->Stats().commits == 1);

  std::weak_ptr<percolite::Backend> store = first->backend();
  first->Close();
  CHECK(ErrorCodeOf([&] { first->Begin(); }) == ErrorCode::kClosed);
  CHECK_FALSE(store.expired());
  CommitSet(*second, cell, "from second");  // the other handle still works
  CHECK(ReadCommitted(*second, cell) == "from second");
  second->Close();
  CHECK(store.expired());
}

TEST_CASE("Opening an open store with another sync mode is refused", "[store]") {
  TempDir dir;
  auto env = Env::Open(dir.path(), FastOptions());
  percolite::BackendOptions full;
  full.sync = percolite::SyncMode::kFull;
  CHECK(ErrorCodeOf([&] { Env::Open(dir.path(), full); }) == ErrorCode::kInvalidArgument);
  // The refusal did not disturb the open handle.
  CHECK_NOTHROW(CommitSet(*env, Cell{"r", "f", "q"}, "v"));
  env->Close();
  CHECK_NOTHROW(Env::Open(dir.path(), full)->Close());  // free to choose once closed
}

TEST_CASE("Data and the timestamp counter persist across closing and reopening", "[store]") {
  TempDir dir;
  const Cell cell{"r", "f", "q"}, gone{"r", "f", "gone"};
  uint64_t last_stamp = 0;
  {
    auto env = Env::Open(dir.path(), FastOptions());
    CommitSet(*env, gone, "x");
    auto tx = env->Begin();
    tx->Set(percolite_test::Ref(cell), "durable");
    tx->Delete(percolite_test::Ref(gone));
    tx->Commit();
    last_stamp = tx->commit_ts().value();
    env->Close();
  }
  auto env = Env::Open(dir.path(), FastOptions());
  CHECK(ReadCommitted(*env, cell) == "durable");
  CHECK(ReadCommitted(*env, gone) == std::nullopt);
  auto tx = env->Begin();
  CHECK(tx->start_ts() == last_stamp);
  tx->Abort();
  CHECK(CommitSet(*env, cell, "newer") > last_stamp);
}

TEST_CASE("Opening a missing directory without create, or a file, throws kStorage", "[store]") {
  TempDir dir;
  percolite::BackendOptions no_create = FastOptions();
  no_create.create = false;
  CHECK(ErrorCodeOf([&] { Env::Open(dir.path() + "/missing", no_create); }) == ErrorCode::kStorage);
  const std::string file = dir.path() + "/plain-file";
  std::ofstream(file) << "not a store";
  CHECK(ErrorCodeOf([&] { Env::Open(file, FastOptions()); }) == ErrorCode::kStorage);
  CHECK(ErrorCodeOf([&] { Env::Open("", FastOptions()); }) == ErrorCode::kInvalidArgument);
  // With create (the default) a missing directory is made.
  auto env = Env::Open(dir.path() + "/made", FastOptions());
  CHECK_NOTHROW(CommitSet(*env, Cell{"r", "f", "q"}, "v"));
}

TEST_CASE("Begin racing with Close returns a usable transaction or throws kClosed",
          "[store][close]") {
  // Each round closes the Env while two threads begin and read in a loop.
  for (int round = 0; round < 150; ++round) {
    TempDir dir;
    auto env = Env::Open(dir.path(), FastOptions());
    std::atomic<int> running{0};
    std::atomic<int> unexpected{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&] {
        ++running;
        for (;;) {
          const ErrorCode code = ErrorCodeOf([&] {
            auto tx = env->Begin();
            tx->Get(Ref(Cell{"r", "f", "q"}));
            tx->Abort();
          });
          if (code == ErrorCode::kOk) continue;
          if (code != ErrorCode::kClosed) ++unexpected;
          return;
        }
      });
    }
    while (running.load() < 2) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(round % 10 * 50));
    env->Close();
    for (auto& thread : threads) thread.join();
    INFO("round " << round);
    REQUIRE(unexpected.load() == 0);
  }
}

TEST_CASE("Commits racing with Close either land or throw kClosed and apply nothing",
          "[store][close]") {
  constexpr int kThreads = 3, kPerThread = 40;
  // sync="full" also covers commits committed but not yet confirmed durable
  // when the close begins.
  percolite::BackendOptions options;
  options.sync = GENERATE(percolite::SyncMode::kNone, percolite::SyncMode::kFull);
  TempDir dir;
  std::vector<std::vector<ErrorCode>> outcomes(kThreads);
  {
    auto env = Env::Open(dir.path(), options);
    // Every transaction begins before the close; only the commits race with it.
    std::vector<std::vector<std::shared_ptr<Transaction>>> pending(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      for (int i = 0; i < kPerThread; ++i) {
        pending[t].push_back(env->Begin());
        pending[t].back()->Set(Ref(Cell{"t" + std::to_string(t), "f", std::to_string(i)}), "v");
      }
    }
    std::atomic<int> committed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (auto& tx : pending[t]) {
          outcomes[t].push_back(ErrorCodeOf([&] { tx->Commit(); }));
          if (outcomes[t].back() == ErrorCode::kOk) ++committed;
        }
      });
    }
    while (committed.load() < kThreads) std::this_thread::yield();
    env->Close();
    for (auto& thread : threads) thread.join();
  }
  auto env = Env::Open(dir.path(), FastOptions());
  size_t landed = 0, refused = 0, wrong = 0;
  for (int t = 0; t < kThreads; ++t) {
    REQUIRE(outcomes[t].size() == kPerThread);
    for (int i = 0; i < kPerThread; ++i) {
      const bool present =
          ReadCommitted(*env, Cell{"t" + std::to_string(t), "f", std::to_string(i)}).has_value();
      const ErrorCode code = outcomes[t][i];
      if (code == ErrorCode::kOk) {
        ++landed;
        wrong += !present;
      } else if (code == ErrorCode::kClosed) {
        ++refused;
        wrong += present;
      } else {
        ++wrong;
      }
    }
  }
  INFO("landed " << landed << " refused " << refused);
  CHECK(landed >= kThreads);
  CHECK(wrong == 0);
}

TEST_CASE("A forked child gets kWrongState from inherited handles and may open the store anew",
          "[store][fork]") {
  TempDir dir;
  const Cell from_parent{"parent", "f", "q"}, from_child{"child", "f", "q"};
  auto env = Env::Open(dir.path(), FastOptions());
  CommitSet(*env, from_parent, "p");
  auto inherited = env->Begin();
  auto writer = env->Begin();
  writer->Set(Ref(from_child), "from the parent's transaction");

  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child: no Catch2 assertions here, only an exit status.
    int status = 0;
    if (ErrorCodeOf([&] { env->Begin(); }) != ErrorCode::kWrongState) status |= 1;
    if (ErrorCodeOf([&] { inherited->Get(Ref(from_parent)); }) != ErrorCode::kWrongState) {
      status |= 2;
    }
    // Nor can the child commit a transaction it inherited.
    if (ErrorCodeOf([&] { writer->Commit(); }) != ErrorCode::kWrongState) status |= 16;
    env->Close();  // only marks the inherited handle closed
    try {
      auto own = Env::Open(dir.path(), FastOptions());
      if (ReadCommitted(*own, from_parent) != "p") status |= 4;
      CommitSet(*own, from_child, "c");
      own->Close();
    } catch (...) {
      status |= 8;
    }
    ::_exit(status);
  }
  int wait_status = 0;
  REQUIRE(::waitpid(pid, &wait_status, 0) == pid);
  REQUIRE(WIFEXITED(wait_status));
  CHECK(WEXITSTATUS(wait_status) == 0);

  // The parent's handle and its open transaction are untouched by the child.
  CHECK(inherited->Get(Ref(from_parent)) == "p");
  CHECK(inherited->Get(Ref(from_child)) == std::nullopt);
  CHECK(ReadCommitted(*env, from_child) == "c");
  CHECK(CommitSet(*env, from_parent, "p2") > 0);
  // The parent's transaction keeps its writes (the child's "c" came after it).
  CHECK(writer->state() == Transaction::State::kActive);
  CHECK(ErrorCodeOf([&] { writer->Commit(); }) == ErrorCode::kConflict);
}

TEST_CASE(
    "An Env freed on a worker thread is closed by a thread of its own; WaitForClosing "
    "waits for it",
    "[store][lifetime]") {
  TempDir freed_dir, dir;
  const Cell cell{"r", "f", "q"}, done{"r", "f", "done"};
  const percolite::ObservedColumn column{"f", "q", percolite::NotifyKind::kStrong, "observe"};
  percolite::WorkerOptions one_thread;
  one_thread.threads = 1;

  // A store whose observer is still running when its handle is freed, until
  // `release`; the token is held by the observer, so by the pool and the handle.
  auto token = std::make_shared<int>(0);
  std::atomic<bool> started{false}, release{false};
  std::shared_ptr<Env> freed = Env::Open(freed_dir.path(), FastOptions());
  freed->SetObservers({percolite::Observer{
      column, [token, &started, &release](const std::shared_ptr<Transaction>& tx, const Cell& c) {
        started = true;
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        tx->Set(Ref(Cell{c.row, "f", "done"}), "finished");
        return percolite::Status::Ok();
      }}});
  freed->StartWorkers(one_thread);
  CommitSet(*freed, cell, "v");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!started && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(started);
  std::weak_ptr<percolite::Backend> freed_store = freed->backend();

  // Another store's observer drops the last reference to that handle.
  auto env = Env::Open(dir.path(), FastOptions());
  std::atomic<ErrorCode> waiting_in_observer{ErrorCode::kOk};
  env->SetObservers(
      {percolite::Observer{column, [&](const std::shared_ptr<Transaction>&, const Cell&) {
                             freed.reset();
                             waiting_in_observer = ErrorCodeOf([] { Env::WaitForClosing(); });
                             return percolite::Status::Ok();
                           }}});
  env->StartWorkers(one_thread);
  CommitSet(*env, cell, "v");
  REQUIRE(env->WaitIdle(30));
  CHECK(waiting_in_observer == ErrorCode::kWrongState);  // it may be stopping its own pool
  CHECK(token.use_count() > 1);                          // still closing: the run goes on

  // A child forked meanwhile has none of those threads: it waits for none.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::alarm(10);  // a wait that hangs ends the child with SIGALRM
    Env::WaitForClosing();
    ::_exit(0);
  }
  int wait_status = 0;
  REQUIRE(::waitpid(pid, &wait_status, 0) == pid);
  CHECK(WIFEXITED(wait_status));

  release = true;
  Env::WaitForClosing();
  // Closed in full: the pool and its observer are gone, and so is the store;
  // the run that was going on committed, and the pool's lease was given back.
  CHECK(token.use_count() == 1);
  CHECK(freed_store.expired());
  auto reopened = Env::Open(freed_dir.path(), FastOptions());
  CHECK(ReadCommitted(*reopened, done) == "finished");
  CHECK(reopened->LeaseHolders().empty());
  reopened->Close();
  env->Close();
}

TEST_CASE("StopWorkers racing StartWorkers on one handle stops the whole pool",
          "[store][lifetime]") {
  // Before StopWorkers waited for StartWorkers, it could stop a pool whose
  // threads were still being started: threads started after it joined were
  // destroyed joinable, which aborts the process ("terminate called without
  // an active exception"). So the rounds run in a child.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::alarm(60);
    int status = 0;
    try {
      auto env = Env::Open(":memory:", FastOptions());
      percolite::WorkerOptions options;
      options.threads = 4;
      for (int round = 0; round < 2000; ++round) {
        std::atomic<bool> go{false};
        std::thread stopper([&] {
          while (!go) std::this_thread::yield();
          env->StopWorkers();
        });
        go = true;
        env->StartWorkers(options);
        stopper.join();
        env->StopWorkers();
        // Stopped: no pool runs on the handle any more.
        if (env->GetWorkerStats().running) status |= 2;
      }
      env->Close();
    } catch (...) {
      status |= 1;
    }
    ::_exit(status);
  }
  int wait_status = 0;
  REQUIRE(::waitpid(pid, &wait_status, 0) == pid);
  INFO("child wait status " << wait_status);
  REQUIRE(WIFEXITED(wait_status));
  CHECK(WEXITSTATUS(wait_status) == 0);
}
