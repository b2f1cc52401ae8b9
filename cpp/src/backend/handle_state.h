// handle_state.h: whether a backend handle may still be used.
//
// Every backend refuses a call in three cases, checked in this order:
// - forked away: the process is a child created by fork() after the backend
//   was opened (see fork_guard.h); the child must open the store itself;
// - closed: Close() ran;
// - failed: an earlier failure (a write that did not reach the disk, damaged
//   pages, a lost server) left the handle unusable; every later call throws
//   that first failure again, so no caller mistakes a broken handle for an
//   empty or stale store.
// HandleState keeps those facts for one backend and throws the backend's own
// words for each (a path, "the memory store", a server...).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "percolite/mutex.h"
#include "percolite/status.h"

namespace percolite {

class HandleState {
 public:
  // `forked` and `closed` are the messages of the kWrongState and kClosed
  // errors Check() throws.
  HandleState(std::string forked, std::string closed);

  // Throws (kWrongState, kClosed, or the failure's code) unless the handle is usable.
  void Check() const EXCLUDES(mu_);
  bool ForkedAway() const;

  void MarkClosed() { closed_.store(true); }
  bool closed() const { return closed_.load(); }

  // Records the first failure; later ones are dropped (the first is the
  // cause). True when this call recorded it.
  bool Fail(ErrorCode code, const std::string& message) EXCLUDES(mu_);
  bool failed() const { return failed_.load(); }
  // The first failure's message ("" before any).
  std::string failure() const EXCLUDES(mu_);

 private:
  const uint64_t fork_generation_;
  const std::string forked_;
  const std::string closed_message_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> failed_{false};  // set once failure_ is written, read without mu_
  mutable Mutex mu_;
  std::string failure_ GUARDED_BY(mu_);
  ErrorCode failure_code_ GUARDED_BY(mu_) = ErrorCode::kStorage;
};

}  // namespace percolite
