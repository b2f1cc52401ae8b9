// The fault guard (src/backend/fault_guard.h): a fault inside RunGuarded is
// an error on the calling thread; a fault anywhere else still kills the
// process as it would have.

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "backend/fault_guard.h"
#include "test_util.h"

namespace {

// A page that faults when read (PROT_NONE).
struct ForbiddenPage {
  void* page = nullptr;
  ForbiddenPage() {
    page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(page != MAP_FAILED);
  }
  ~ForbiddenPage() { ::munmap(page, 4096); }
  int Read() const { return *static_cast<volatile const int*>(page); }
};

}  // namespace

TEST_CASE("A SIGSEGV inside a guard is a FaultError naming the operation", "[fault_guard]") {
  percolite::InstallFaultHandlers();
  ForbiddenPage forbidden;
  try {
    percolite::RunGuarded("reading a test page", [&] { return forbidden.Read(); });
    FAIL("the read did not fault");
  } catch (const percolite::FaultError& e) {
    CHECK(e.code() == percolite::ErrorCode::kCorruption);
    CHECK_THAT(e.what(), Catch::Contains("reading a test page"));
    CHECK_THAT(e.what(), Catch::Contains("SIGSEGV"));
  }
  // The thread goes on, and guards keep working after a fault.
  for (int i = 0; i < 3; ++i) {
    CHECK_THROWS_AS(percolite::RunGuarded("again", [&] { return forbidden.Read(); }),
                    percolite::FaultError);
  }
  CHECK(percolite::RunGuarded("a plain call", [] { return 7; }) == 7);
  CHECK(percolite::CurrentGuardFrame() == nullptr);
}

TEST_CASE("A SIGBUS past the end of a mapped file inside a guard is a FaultError",
          "[fault_guard]") {
  percolite::InstallFaultHandlers();
  percolite_test::TempDir dir;
  const std::string file = dir.path() + "/short";
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 4096) == 0);
  // Map two pages of a one-page file: the second one is past its end.
  void* map = ::mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(map != MAP_FAILED);
  const auto* past_end = static_cast<volatile const char*>(map) + 4096;
  CHECK_THROWS_WITH(percolite::RunGuarded("reading past the end", [&] { return *past_end; }),
                    Catch::Contains("SIGBUS"));
  ::munmap(map, 8192);
  ::close(fd);
}

TEST_CASE("Guards nest, and each thread has its own", "[fault_guard]") {
  percolite::InstallFaultHandlers();
  ForbiddenPage forbidden;
  // An inner fault lands in the inner guard; the outer one goes on.
  const int outer = percolite::RunGuarded("outer", [&] {
    try {
      percolite::RunGuarded("inner", [&] { return forbidden.Read(); });
    } catch (const percolite::FaultError&) {
      return 1;
    }
    return 0;
  });
  CHECK(outer == 1);
  std::atomic<int> caught{0};
  std::thread threads[4];
  for (auto& t : threads) {
    t = std::thread([&] {
      for (int i = 0; i < 50; ++i) {
        try {
          percolite::RunGuarded("a thread", [&] { return forbidden.Read(); });
        } catch (const percolite::FaultError&) {
          ++caught;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(caught == 200);
}

TEST_CASE("A fault outside every guard goes to the handler that was there before",
          "[fault_guard][fork]") {
  percolite::InstallFaultHandlers();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ForbiddenPage forbidden;
    forbidden.Read();
    ::_exit(0);  // not reached
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
#if defined(__SANITIZE_ADDRESS__)
  // The handler installed before ours is AddressSanitizer's: it reports the
  // fault and exits with status 1.
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) != 0);
#else
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
#endif
}

TEST_CASE("An LMDB assertion inside a guard is a FaultError", "[fault_guard]") {
  CHECK_THROWS_WITH(percolite::RunGuarded("a guarded call",
                                          [] {
                                            percolite::PercoliteOnLmdbAssert(nullptr,
                                                                             "mp->mp_pgno == pgno");
                                            return 0;
                                          }),
                    Catch::Contains("assertion failed: mp->mp_pgno == pgno"));
}
