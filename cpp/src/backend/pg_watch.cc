// pg_watch.cc: waiting for work (WatchForWork) and waking the waiters
// (SignalWaiting): LISTEN/NOTIFY on the store's channel, or polling for
// servers without it (pg_backend.h).
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "pg_backend.h"

namespace percolite {
namespace {

// Waits on LISTEN, on a connection of its own, and on an eventfd for Interrupt.
class PgWorkWatch final : public WorkWatch {
 public:
  explicit PgWorkWatch(std::shared_ptr<PgBackend> store) : store_(std::move(store)) {
    conn_ = store_->Connect();
    try {
      PgExec(conn_, store_->sql().listen, "listening for commits", store_->target());
    } catch (...) {
      PQfinish(conn_);
      throw;
    }
    interrupt_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~PgWorkWatch() override {
    if (!store_->ForkedAway()) PQfinish(conn_);
    if (interrupt_fd_ >= 0) ::close(interrupt_fd_);
  }

  unsigned Wait(int timeout_ms) override {
    // Not listening (the server went away, and was not back at the last
    // try): try again now; while it stays away, wait on Interrupt alone and
    // say work may exist, so the scanner looks as often as it waits.
    const bool listening = PQstatus(conn_) == CONNECTION_OK || Reconnect();
    unsigned events = listening ? Drain() : kCommitted;
    if (listening && events != kTimeout) return events;
    pollfd fds[2] = {{listening ? PQsocket(conn_) : -1, POLLIN, 0}, {interrupt_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, std::max(0, timeout_ms));
    if (ready > 0 && (fds[1].revents & POLLIN)) {
      uint64_t count;
      while (::read(interrupt_fd_, &count, sizeof count) > 0) {
      }
      events |= kInterrupted;
    }
    if (ready > 0 && (fds[0].revents & (POLLIN | POLLERR | POLLHUP))) {
      if (PQconsumeInput(conn_) == 0 || PQstatus(conn_) != CONNECTION_OK) {
        // The server went away: say work may exist (the scanner looks, and
        // its reads report the trouble), and listen again on a new connection.
        Reconnect();
        events |= kCommitted;
      }
    }
    return events | Drain();
  }

  void Interrupt() override {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(interrupt_fd_, &one, sizeof one);
  }

 private:
  unsigned Drain() {
    unsigned events = kTimeout;
    PQconsumeInput(conn_);
    while (PGnotify* n = PQnotifies(conn_)) {
      events |= (n->extra && n->extra[0] == 'w') ? kWaiterSignal : kCommitted;
      PQfreemem(n);
    }
    return events;
  }

  // Listens on a new connection; false when the server cannot be reached
  // (the broken connection stays, and the next Wait tries again).
  bool Reconnect() {
    PGconn* fresh = nullptr;
    try {
      fresh = store_->Connect();
      PgExec(fresh, store_->sql().listen, "listening for commits", store_->target());
    } catch (const Error&) {
      PQfinish(fresh);
      return false;
    }
    PQfinish(conn_);
    conn_ = fresh;
    return true;
  }

  std::shared_ptr<PgBackend> store_;
  PGconn* conn_ = nullptr;
  int interrupt_fd_ = -1;
};

// Polls instead of listening (poll_interval in the target): for servers that
// speak PostgreSQL's protocol without LISTEN/NOTIFY. Says "committed" every
// interval, so the scanner looks for work that often.
class PgPollWatch final : public WorkWatch {
 public:
  explicit PgPollWatch(double seconds)
      : interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(seconds))),
        next_(std::chrono::steady_clock::now() + interval_) {}

  unsigned Wait(int timeout_ms) override EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const auto until = std::min(next_, std::chrono::steady_clock::now() +
                                           std::chrono::milliseconds(std::max(0, timeout_ms)));
    while (!interrupted_) {
      if (!interrupt_.WaitUntil(&mu_, until)) break;
    }
    unsigned events = kTimeout;
    if (interrupted_) events |= kInterrupted;
    interrupted_ = false;
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_) {
      events |= kCommitted;
      next_ = now + interval_;
    }
    return events;
  }

  void Interrupt() override EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      interrupted_ = true;
    }
    interrupt_.SignalAll();
  }

 private:
  const std::chrono::steady_clock::duration interval_;
  Mutex mu_;
  CondVar interrupt_;
  std::chrono::steady_clock::time_point next_ GUARDED_BY(mu_);
  bool interrupted_ GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<WorkWatch> PgBackend::WatchForWork() {
  CheckUsable();
  if (target_.poll_interval > 0) return std::make_unique<PgPollWatch>(target_.poll_interval);
  return std::make_unique<PgWorkWatch>(shared_from_this());
}

bool PgBackend::SignalWaiting() {
  if (target_.poll_interval > 0) return false;  // no channel to signal on
  try {
    CheckUsable();
    Query(sql_.notify_waiter, PgParams(), "signalling a wait");
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace percolite
