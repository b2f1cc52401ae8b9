// lmdb_map_lock.h: the lock that keeps an LMDB memory map in place.
//
// Readers hold it shared for the length of one LMDB call sequence; growing
// the map takes it exclusively, so no thread is inside the map while it
// moves. It prefers writers, so a resize is not starved by a stream of reads:
// std::shared_mutex promises no such thing (glibc's prefers readers), hence
// a pthread read-write lock of its own. It is a capability (mutex.h): a
// function that takes it exclusively is declared EXCLUDES it, and a clang
// build rejects a call to one from under a shared hold, which would deadlock.
#pragma once

#include <pthread.h>

#include "percolite/mutex.h"

namespace percolite {

class CAPABILITY("mutex") LmdbMapLock {
 public:
  LmdbMapLock() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &attr);
    pthread_rwlockattr_destroy(&attr);
  }
  ~LmdbMapLock() { pthread_rwlock_destroy(&lock_); }
  LmdbMapLock(const LmdbMapLock&) = delete;
  LmdbMapLock& operator=(const LmdbMapLock&) = delete;

  void Lock() ACQUIRE() { pthread_rwlock_wrlock(&lock_); }
  void Unlock() RELEASE() { pthread_rwlock_unlock(&lock_); }
  void LockShared() ACQUIRE_SHARED() { pthread_rwlock_rdlock(&lock_); }
  void UnlockShared() RELEASE_SHARED() { pthread_rwlock_unlock(&lock_); }
  bool TryLockShared() TRY_ACQUIRE_SHARED(true) { return pthread_rwlock_tryrdlock(&lock_) == 0; }

  // Holds the lock shared from construction until Unlock() or destruction.
  class SCOPED_CAPABILITY Shared {
   public:
    explicit Shared(LmdbMapLock* lock) ACQUIRE_SHARED(lock) : lock_(lock) { lock_->LockShared(); }
    ~Shared() RELEASE() {
      if (lock_ != nullptr) lock_->UnlockShared();
    }
    Shared(const Shared&) = delete;
    Shared& operator=(const Shared&) = delete;

    void Unlock() RELEASE() {
      if (lock_ != nullptr) lock_->UnlockShared();
      lock_ = nullptr;
    }

   private:
    LmdbMapLock* lock_;
  };

  // Holds the lock exclusively from construction to destruction.
  class SCOPED_CAPABILITY Exclusive {
   public:
    explicit Exclusive(LmdbMapLock* lock) ACQUIRE(lock) : lock_(lock) { lock_->Lock(); }
    ~Exclusive() RELEASE() { lock_->Unlock(); }
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;

   private:
    LmdbMapLock* const lock_;
  };

 private:
  pthread_rwlock_t lock_;
};

}  // namespace percolite
