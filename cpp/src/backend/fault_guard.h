// fault_guard.h: turns a fault inside LMDB into an error instead of a dead process.
//
// LMDB trusts the pages it maps: a damaged B-tree can make it read outside
// the map (SIGSEGV), past the end of the file (SIGBUS), or fail one of its
// own assertions (which calls abort()). RunGuarded runs one call into LMDB,
// or one read of mapped bytes, so that any of these on the calling thread
// while it runs comes back as a FaultError (kCorruption) thrown from
// RunGuarded itself, the way Go's debug.SetPanicOnFault or a Java mapped
// buffer turn a fault in mapped memory into an error.
//
// Rules for what runs inside
// - Only C calls (LMDB) and reads of bytes: a fault jumps straight back to
//   RunGuarded, so nothing between may own memory, locks or anything else
//   with a destructor. Allocate and lock outside, then call in.
// - What faulted is left as it was: the caller must treat the whole LMDB
//   environment as unusable (LmdbBackend refuses every later call until the
//   store is opened again).
//
// Thread safety: the guard is per thread; guards nest. SIGSEGV and SIGBUS
// raised on a thread that is not inside RunGuarded go to the handler that
// was installed before InstallFaultHandlers (or kill the process as they
// would have). Cost: a sigsetjmp without saving the signal mask and two
// thread-local writes per call.
#pragma once

#include <setjmp.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "percolite/status.h"

struct MDB_env;

namespace percolite {

// What a guarded call ran into.
class FaultError : public Error {
 public:
  explicit FaultError(const std::string& message) : Error(ErrorCode::kCorruption, message) {}
};

// One guarded call's landing place, on the caller's stack. Nothing in it is
// initialised up front (it is set up on every guarded call): the handlers
// fill in what the fault was.
struct GuardFrame {
  sigjmp_buf jump;
  GuardFrame* outer;
  int signal;  // SIGSEGV, SIGBUS, or 0 for an LMDB assertion
  uintptr_t address;
  char assertion[160];  // the assertion's text, when signal is 0
};

// The innermost active frame of this thread (null outside any guard).
GuardFrame*& CurrentGuardFrame();

// Installs the SIGSEGV/SIGBUS handlers once per process (idempotent).
void InstallFaultHandlers();

// LMDB's assertion callback (mdb_env_set_assert): inside a guard it jumps
// back like a fault; outside one it returns and LMDB aborts as it would.
extern "C" void PercoliteOnLmdbAssert(MDB_env* env, const char* message);

// Throws the FaultError describing `frame` while doing `what`.
[[noreturn]] void ThrowFault(const GuardFrame& frame, const char* what);

// Runs fn() (see the rules above) and returns what it returns; a fault or an
// LMDB assertion while it runs throws FaultError naming `what`.
template <typename Fn>
auto RunGuarded(const char* what, Fn&& fn) -> decltype(fn()) {
  GuardFrame frame;
  GuardFrame*& current = CurrentGuardFrame();
  frame.outer = current;
  // savemask 0: no system call. The handlers run with SA_NODEFER, so the
  // signal is not left blocked when the handler jumps back here.
  if (sigsetjmp(frame.jump, 0) != 0) {
    CurrentGuardFrame() = frame.outer;
    ThrowFault(frame, what);
  }
  current = &frame;
  if constexpr (std::is_void_v<decltype(fn())>) {
    fn();
    current = frame.outer;
  } else {
    auto result = fn();
    current = frame.outer;
    return result;
  }
}

}  // namespace percolite
