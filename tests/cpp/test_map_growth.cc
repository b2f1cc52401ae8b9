// Memory-map growth (backend/lmdb_backend.h): a store opened with a tiny map takes
// far more data than the map holds, open snapshots survive the growth, and
// opening a store while another process grows its map works.
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "percolite/env.h"
#include "percolite/transaction.h"
#include "test_util.h"

namespace {

using percolite::Cell;
using percolite::Env;
using percolite::ScanRange;
using percolite_test::FastOptions;
using percolite_test::ReadCommitted;
using percolite_test::Ref;
using percolite_test::ScanAll;
using percolite_test::TempDir;

constexpr size_t kMiB = size_t{1} << 20;
constexpr int kTransactions = 10;
constexpr int kValuesPerTransaction = 64;
constexpr size_t kValueSize = 64 * 1024;  // 10 x 64 x 64 KiB = 40 MiB in all

Cell BigCell(int tx, int i) {
  return Cell{"big" + std::to_string(tx), "f", std::to_string(1000 + i)};
}

// A value that differs per cell in every 8 KiB stretch, so a misplaced page shows.
std::string BigValue(int tx, int i) {
  std::string value(kValueSize, '\0');
  const std::string tag = "<" + std::to_string(tx) + ":" + std::to_string(i) + ">";
  for (size_t pos = 0; pos < value.size(); pos += 8192) value.replace(pos, tag.size(), tag);
  for (size_t pos = 0; pos < value.size(); ++pos) {
    if (value[pos] == '\0') value[pos] = static_cast<char>('a' + (pos * 7 + tx * 3 + i) % 26);
  }
  return value;
}

}  // namespace

TEST_CASE("The map grows past a 1 MiB start to hold 40 MiB, and old snapshots still read",
          "[map-growth]") {
  TempDir dir;
  percolite::BackendOptions options = FastOptions();
  options.initial_map_size = kMiB;
  auto env = Env::Open(dir.path(), options);
  const percolite::BackendStats at_open = env->Stats();
  CHECK(at_open.map_size <= 2 * kMiB);

  const Cell early{"early", "f", "q"}, replaced{"early", "f", "replaced"};
  {
    auto tx = env->Begin();
    tx->Set(Ref(early), "small");
    tx->Set(Ref(replaced), "before growth");
    tx->Commit();
  }
  auto old_snapshot = env->Begin();
  REQUIRE(env->Stats().map_growths == 0);

  for (int t = 0; t < kTransactions; ++t) {
    auto tx = env->Begin();
    for (int i = 0; i < kValuesPerTransaction; ++i) tx->Set(Ref(BigCell(t, i)), BigValue(t, i));
    if (t == kTransactions / 2) tx->Set(Ref(replaced), "after growth");
    REQUIRE_NOTHROW(tx->Commit());
  }

  const percolite::BackendStats grown = env->Stats();
  CHECK(grown.map_growths > 0);
  CHECK(grown.map_size >= kTransactions * kValuesPerTransaction * kValueSize);

  // The transaction begun before the growth reads its snapshot, and only it.
  CHECK(old_snapshot->Get(Ref(early)) == "small");
  CHECK(old_snapshot->Get(Ref(replaced)) == "before growth");
  CHECK(old_snapshot->Get(Ref(BigCell(0, 0))) == std::nullopt);
  const auto old_items = ScanAll(*old_snapshot, ScanRange::RowPrefix(""), 5);
  REQUIRE(old_items.size() == 2);
  CHECK(old_items[0].value == "small");
  CHECK(old_items[1].value == "before growth");
  old_snapshot->Abort();

  // Everything written reads back, by Get and by Scan.
  auto reader = env->Begin();
  CHECK(reader->Get(Ref(replaced)) == "after growth");
  size_t mismatches = 0;
  for (int t = 0; t < kTransactions; ++t) {
    for (int i = 0; i < kValuesPerTransaction; ++i) {
      mismatches += reader->Get(Ref(BigCell(t, i))) != BigValue(t, i);
    }
  }
  CHECK(mismatches == 0);
  const auto items = ScanAll(*reader, ScanRange::RowPrefix("big3"), 7);
  REQUIRE(items.size() == kValuesPerTransaction);
  for (int i = 0; i < kValuesPerTransaction; ++i) {
    CHECK(items[i].cell.qualifier == BigCell(3, i).qualifier);
    mismatches += items[i].value != BigValue(3, i);
  }
  CHECK(mismatches == 0);
}

TEST_CASE("Readers in other threads keep reading correct values while the map grows",
          "[map-growth]") {
  TempDir dir;
  percolite::BackendOptions options = FastOptions();
  options.initial_map_size = kMiB;
  auto env = Env::Open(dir.path(), options);
  const Cell early{"early", "f", "q"};
  {
    auto tx = env->Begin();
    tx->Set(Ref(early), "small");
    tx->Set(Ref(BigCell(99, 0)), BigValue(99, 0));
    tx->Commit();
  }

  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, wrong{0}, errors{0};
  auto read_loop = [&](bool hold_one_snapshot) {
    std::shared_ptr<percolite::Transaction> held;
    while (!stop.load()) {
      try {
        if (!held || !hold_one_snapshot) held = env->Begin();
        wrong += held->Get(Ref(early)) != "small";
        wrong += held->Get(Ref(BigCell(99, 0))) != BigValue(99, 0);
        wrong += ScanAll(*held, ScanRange::RowPrefix("early"), 1).size() != 1;
        ++reads;
      } catch (const percolite::Error&) {
        ++errors;
      }
    }
  };
  std::thread fresh_reader(read_loop, false);
  std::thread held_reader(read_loop, true);
  for (int t = 0; t < kTransactions; ++t) {
    auto tx = env->Begin();
    for (int i = 0; i < kValuesPerTransaction; ++i) tx->Set(Ref(BigCell(t, i)), BigValue(t, i));
    REQUIRE_NOTHROW(tx->Commit());
  }
  stop = true;
  fresh_reader.join();
  held_reader.join();

  CHECK(env->Stats().map_growths > 0);
  CHECK(reads.load() > 0);
  CHECK(wrong.load() == 0);
  CHECK(errors.load() == 0);
  auto reader = env->Begin();
  CHECK(reader->Get(Ref(BigCell(kTransactions - 1, kValuesPerTransaction - 1))) ==
        BigValue(kTransactions - 1, kValuesPerTransaction - 1));
}

TEST_CASE("Opening a store while another process grows its map adopts the new size",
          "[map-growth]") {
  TempDir dir;
  percolite::BackendOptions options = FastOptions();
  options.initial_map_size = kMiB;
  const Cell first{"first", "f", "q"};
  {
    auto env = Env::Open(dir.path(), options);
    percolite_test::CommitSet(*env, first, "v");
    env->Close();
  }
  int stop[2], grown[2];
  REQUIRE(::pipe(stop) == 0);
  REQUIRE(::pipe(grown) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child appends 16 KiB at a time, never freeing a page, so every
    // commit moves the end of the data past the map of a process that
    // opened the store before it; its own map grows by doubling. It says
    // when it first grew the map, and goes on until the parent closes the
    // pipe (at most 256 MiB). Exit status 0: no error.
    ::close(stop[1]);
    ::close(grown[0]);
    int status = 1;
    try {
      auto grower = Env::Open(dir.path(), options);
      const std::string value(16 * 1024, 'g');
      pollfd done{stop[0], POLLIN, 0};
      bool told = false;
      for (int t = 0; t < 16 * 1024 && ::poll(&done, 1, 0) == 0; ++t) {
        auto tx = grower->Begin();
        tx->Set(Ref(Cell{"grow" + std::to_string(t), "f", "q"}), value);
        tx->Commit();
        if (!told && grower->Stats().map_growths > 0) {
          told = ::write(grown[1], "g", 1) == 1;
        }
      }
      status = told ? 0 : 2;
      grower->Close();
    } catch (...) {
      status = 3;
    }
    ::_exit(status);
  }
  ::close(stop[0]);
  ::close(grown[1]);
  char byte = 0;
  REQUIRE(::read(grown[0], &byte, 1) == 1);  // the child grows the map from now on
  ::close(grown[0]);
  // Meanwhile this process opens the store again and again (each open
  // sizes its map from the data file, then begins its set-up transaction).
  constexpr int kOpens = 200;
  std::vector<std::string> failures;
  for (int i = 0; i < kOpens; ++i) {
    try {
      auto env = Env::Open(dir.path(), options);
      if (ReadCommitted(*env, first) != "v")
        failures.push_back("open " + std::to_string(i) + ": lost");
      env->Close();
    } catch (const percolite::Error& e) {
      failures.push_back("open " + std::to_string(i) + ": " + e.what());
    }
  }
  ::close(stop[1]);
  int wait_status = 0;
  REQUIRE(::waitpid(pid, &wait_status, 0) == pid);
  REQUIRE(WIFEXITED(wait_status));
  CHECK(WEXITSTATUS(wait_status) == 0);
  INFO(failures.size() << " of " << kOpens << " opens failed; the first: "
                       << (failures.empty() ? "" : failures.front()));
  CHECK(failures.empty());
}
