// The Catch2 test runner of the percolite core.
//
// Without Catch2's own SIGSEGV/SIGBUS handlers: the core installs handlers
// of its own (src/backend/fault_guard.h) that must stay first, and a test
// that crashes still shows as failed (killed by its signal) under ctest.
#define CATCH_CONFIG_NO_POSIX_SIGNALS
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
