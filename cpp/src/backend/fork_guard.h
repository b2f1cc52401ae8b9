// fork_guard.h: telling a forked child from the process that opened a backend.
//
// A child created by fork() inherits the parent's backends, but not their
// threads, and must not touch their files' locks. Backends record the
// generation when they open; in a child the generation has moved on, and
// every call refuses (kWrongState) instead of touching the parent's state.
#pragma once

#include <cstdint>

namespace percolite {

// Installs the pthread_atfork handler that advances the generation (once).
void InstallForkGeneration();
// The generation of this process: 0 until the first fork() after the handler.
uint64_t ForkGeneration();

}  // namespace percolite
