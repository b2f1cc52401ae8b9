// mutex.h: a mutex, its scoped lock and a condition variable that clang's
// thread-safety analysis understands.
//
// libstdc++'s std::mutex and std::unique_lock carry no capability attributes,
// so "this member is guarded by that mutex" would otherwise be a comment.
// With these wrappers it is a declaration: GUARDED_BY(mu_) on the member,
// REQUIRES(mu_) or EXCLUDES(mu_) on the functions, and a clang build with
// -Wthread-safety -Werror (scripts/check-thread-safety.sh) rejects a read or
// write of the member without the lock. Other compilers see plain
// std::mutex code: every annotation expands to nothing.
//
// Waiting on a CondVar is written as an explicit loop over the condition,
//
//   MutexLock lock(&mu_);
//   while (!done_) cv_.Wait(&mu_);
//
// because the analysis cannot see that a predicate lambda runs under the lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define PERCOLITE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PERCOLITE_THREAD_ANNOTATION(x)
#endif

// A type whose objects are locks (Mutex).
#define CAPABILITY(x) PERCOLITE_THREAD_ANNOTATION(capability(x))
// A type whose objects hold a lock for their lifetime (MutexLock).
#define SCOPED_CAPABILITY PERCOLITE_THREAD_ANNOTATION(scoped_lockable)
// A member read or written only with the lock held.
#define GUARDED_BY(x) PERCOLITE_THREAD_ANNOTATION(guarded_by(x))
// A pointer member whose pointee is read or written only with the lock held.
#define PT_GUARDED_BY(x) PERCOLITE_THREAD_ANNOTATION(pt_guarded_by(x))
// Locks that must be taken before (or after) this one.
#define ACQUIRED_BEFORE(...) PERCOLITE_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) PERCOLITE_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
// A function called with the lock held (REQUIRES) or not held (EXCLUDES).
#define REQUIRES(...) PERCOLITE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// A function called with the lock held at least shared (a SharedMutex's readers).
#define REQUIRES_SHARED(...) PERCOLITE_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define EXCLUDES(...) PERCOLITE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// A function that takes, releases or tries to take the lock.
#define ACQUIRE(...) PERCOLITE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) PERCOLITE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) PERCOLITE_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// The same for a lock taken shared (SharedMutex, the LMDB map lock).
#define ACQUIRE_SHARED(...) PERCOLITE_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) PERCOLITE_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) \
  PERCOLITE_THREAD_ANNOTATION(try_acquire_shared_capability(__VA_ARGS__))
// A function that checks at run time that the lock is held.
#define ASSERT_CAPABILITY(x) PERCOLITE_THREAD_ANNOTATION(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) PERCOLITE_THREAD_ANNOTATION(assert_shared_capability(x))
// A function that returns a reference to the given lock.
#define RETURN_CAPABILITY(x) PERCOLITE_THREAD_ANNOTATION(lock_returned(x))
// Turns the analysis off for one function; the reason goes beside it.
#define NO_THREAD_SAFETY_ANALYSIS PERCOLITE_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace percolite {

class CondVar;

// A std::mutex the analysis knows as a lock.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds the lock (no run-time check).
  void AssertHeld() ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction. Unlock() and Lock() let a
// scope step out of the lock (to call user code, say) and back in.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A std::shared_mutex the analysis knows as a lock that readers share: a
// member GUARDED_BY it may be read with the lock held shared or exclusive,
// and written only with it held exclusive.
class CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void LockShared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() RELEASE_SHARED() { mu_.unlock_shared(); }
  bool TryLockShared() TRY_ACQUIRE_SHARED(true) { return mu_.try_lock_shared(); }
  // Tells the analysis the caller holds the lock exclusive (AssertHeld) or
  // at least shared (AssertReaderHeld); no run-time check.
  void AssertHeld() ASSERT_CAPABILITY(this) {}
  void AssertReaderHeld() ASSERT_SHARED_CAPABILITY(this) {}

 private:
  std::shared_mutex mu_;
};

// Holds a SharedMutex exclusive from construction to destruction.
class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterMutexLock() RELEASE() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds a SharedMutex shared from construction to destruction.
class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_->LockShared(); }
  ~ReaderMutexLock() RELEASE() { mu_->UnlockShared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// A std::condition_variable whose waits name the Mutex they release.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases *mu, waits for a signal (or a spurious wake-up), takes *mu again.
  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait, but gives up at `deadline`: false when it timed out.
  template <class Clock, class Duration>
  bool WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool signalled = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return signalled;
  }
  // As Wait, but gives up after `timeout`: false when it timed out.
  template <class Rep, class Period>
  bool WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& timeout) REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace percolite
