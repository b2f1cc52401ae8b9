#include "fork_guard.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace percolite {
namespace {

std::atomic<uint64_t> g_fork_generation{0};

}  // namespace

void InstallForkGeneration() {
  static std::once_flag once;
  std::call_once(once,
                 [] { pthread_atfork(nullptr, nullptr, [] { g_fork_generation.fetch_add(1); }); });
}

uint64_t ForkGeneration() { return g_fork_generation.load(); }

}  // namespace percolite
