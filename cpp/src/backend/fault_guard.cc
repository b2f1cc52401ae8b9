#include "fault_guard.h"

#include <signal.h>

#include <cstdio>
#include <cstring>
#include <mutex>

namespace percolite {
namespace {

struct sigaction g_previous_segv, g_previous_bus;

// Hands a signal that no guard expects to whoever had it before.
void Chain(int signal, siginfo_t* info, void* context) {
  const struct sigaction& previous = signal == SIGBUS ? g_previous_bus : g_previous_segv;
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(signal, info, context);
    return;
  }
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal);
    return;
  }
  // The default action (ignoring a fault would re-run it forever): restore
  // it and raise, so the process dies of this signal as it would have.
  struct sigaction fallback;
  std::memset(&fallback, 0, sizeof fallback);
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(signal, &fallback, nullptr);
  raise(signal);
}

void OnFault(int signal, siginfo_t* info, void* context) {
  GuardFrame* frame = CurrentGuardFrame();
  if (frame == nullptr) {
    Chain(signal, info, context);
    return;
  }
  frame->signal = signal;
  frame->address = reinterpret_cast<uintptr_t>(info != nullptr ? info->si_addr : nullptr);
  siglongjmp(frame->jump, 1);
}

}  // namespace

GuardFrame*& CurrentGuardFrame() {
  static thread_local GuardFrame* frame = nullptr;
  return frame;
}

void InstallFaultHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    CurrentGuardFrame();  // this thread's slot exists before any handler reads it
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_sigaction = OnFault;
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &g_previous_segv);
    sigaction(SIGBUS, &action, &g_previous_bus);
  });
}

extern "C" void PercoliteOnLmdbAssert(MDB_env*, const char* message) {
  GuardFrame* frame = CurrentGuardFrame();
  if (frame == nullptr) return;  // LMDB aborts, as it would have
  frame->signal = 0;
  std::snprintf(frame->assertion, sizeof frame->assertion, "%s", message ? message : "?");
  siglongjmp(frame->jump, 1);
}

void ThrowFault(const GuardFrame& frame, const char* what) {
  std::string cause;
  if (frame.signal == 0) {
    cause = std::string("LMDB's assertion failed: ") + frame.assertion;
  } else {
    char address[32];
    std::snprintf(address, sizeof address, "%#lx", static_cast<unsigned long>(frame.address));
    cause =
        std::string(frame.signal == SIGBUS ? "SIGBUS" : "SIGSEGV") + " reading address " + address;
  }
  throw FaultError(std::string(what) + ": the store's pages are damaged (" + cause +
                   "); run 'percolite check' on it and restore the store from a copy");
}

}  // namespace percolite
