// child_safe_mutex.h: a mutex that a forked child finds unlocked.
//
// A child created by fork() has only the thread that forked. A mutex
// another thread of the parent held at that moment would stay locked in the
// child forever, and the child's first use of the object would hang. The
// native sinks (export_queue.h) live as long as their exporters, which a
// child inherits, so each guards its state with one of these: every live
// one is made anew in the child, before anything else runs there.
#pragma once

#include <mutex>
#include <new>

namespace percolite {

class ChildSafeMutex {
 public:
  ChildSafeMutex();
  ~ChildSafeMutex();
  ChildSafeMutex(const ChildSafeMutex&) = delete;
  ChildSafeMutex& operator=(const ChildSafeMutex&) = delete;

  // For std::lock_guard.
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

  // In a forked child only: a new, unlocked mutex in place of the parent's.
  void Renew() { new (&mu_) std::mutex; }

 private:
  std::mutex mu_;
};

}  // namespace percolite
