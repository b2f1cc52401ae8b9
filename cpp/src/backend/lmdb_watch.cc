// How workers hear of work in an LMDB store (lmdb_backend.h): the sink that
// gets this process's notifications, and, across processes, the work watch
// (inotify on the data file) and the signal file.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "lmdb_backend.h"

namespace percolite {
namespace {

// Without inotify a watch polls, this often.
constexpr int kPollEveryMs = 50;
// After a write to the data file, Wait returns again kFirstRescanMs later,
// then kSecondRescanMs after that (LmdbWorkWatch::Wait says why).
constexpr int kFirstRescanMs = 1;
constexpr int kSecondRescanMs = 5;

// Opens the signal file for writing, creating it if missing; -1 on failure.
int OpenSignalFile(const std::string& path, mode_t mode) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
}

void Drain(int fd) {
  char buf[4096];
  while (::read(fd, buf, sizeof buf) > 0) {
  }
}

// Reads every pending event of the (non-blocking) inotify descriptor `fd`;
// sets *watched when one is for watch descriptor `watch`, *other when one is
// for another watch.
void ReadInotify(int fd, int watch, bool* watched, bool* other) {
  alignas(struct inotify_event) char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return;
    for (ssize_t at = 0; at + static_cast<ssize_t>(sizeof(struct inotify_event)) <= n;) {
      const auto* event = reinterpret_cast<const struct inotify_event*>(buf + at);
      *(event->wd == watch ? watched : other) = true;
      at += sizeof(struct inotify_event) + event->len;
    }
  }
}

// Every commit of every process writes the data file: inotify (IN_MODIFY)
// wakes the watcher at once, so an idle pool costs no CPU. Without inotify it
// polls every kPollEveryMs.
class LmdbWorkWatch final : public WorkWatch {
 public:
  explicit LmdbWorkWatch(const LmdbBackend& backend) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      throw Error(ErrorCode::kStorage, std::string("creating an eventfd: ") + std::strerror(errno));
    }
    inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (inotify_fd_ >= 0) {
      const std::string data_file = backend.path() + "/data.mdb";
      if (::inotify_add_watch(inotify_fd_, data_file.c_str(), IN_MODIFY) < 0) {
        ::close(inotify_fd_);
        inotify_fd_ = -1;
      }
    }
    if (inotify_fd_ >= 0 && backend.CreateSignalFile()) {
      signal_watch_ = ::inotify_add_watch(inotify_fd_, backend.SignalFilePath().c_str(), IN_ATTRIB);
    }
  }
  ~LmdbWorkWatch() override {
    if (inotify_fd_ >= 0) ::close(inotify_fd_);
    ::close(wake_fd_);
  }

  unsigned Wait(int timeout_ms) override {
    // A data-file write wakes us before LMDB publishes the commit to new
    // readers (the txnid in the lock file is updated after the meta page is
    // written), so a scan right after a wake can miss it: after a write, Wait
    // also returns kFirstRescanMs and then kSecondRescanMs later, for a rescan.
    if (followups_ > 0) {
      timeout_ms = std::min(timeout_ms, followups_ == 2 ? kFirstRescanMs : kSecondRescanMs);
    }
    if (inotify_fd_ < 0) timeout_ms = std::min(timeout_ms, kPollEveryMs);
    struct pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
    const int nfds = inotify_fd_ >= 0 ? 2 : 1;
    const int ready = ::poll(fds, nfds, timeout_ms);
    unsigned events = kTimeout;
    if (ready > 0) {
      if (fds[0].revents) {
        Drain(wake_fd_);
        events |= kInterrupted;
      }
      if (nfds == 2 && fds[1].revents) {
        bool signalled = false, written = false;
        ReadInotify(inotify_fd_, signal_watch_, &signalled, &written);
        if (written) {
          followups_ = 2;
          events |= kCommitted;
        }
        if (signalled) events |= kWaiterSignal;
      }
    } else if (followups_ > 0) {
      --followups_;
      events |= kCommitted;
    }
    return events;
  }

  void Interrupt() override {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

 private:
  int wake_fd_ = -1;
  int inotify_fd_ = -1;
  int signal_watch_ = -1;
  int followups_ = 0;  // rescans still due after the last write (two after each)
};

}  // namespace

void LmdbBackend::SetNotificationSink(NotificationSink* sink) {
  sink_.Set(sink, "workers are already running for store '" + path_ +
                      "' in this process (one worker pool per store and process)");
}

void LmdbBackend::ClearNotificationSink(NotificationSink* sink) { sink_.Clear(sink); }

std::unique_ptr<WorkWatch> LmdbBackend::WatchForWork() {
  CheckUsable();
  return std::make_unique<LmdbWorkWatch>(*this);
}

std::string LmdbBackend::SignalFilePath() const { return path_ + "/waiting"; }

bool LmdbBackend::CreateSignalFile() const {
  int fd = OpenSignalFile(SignalFilePath(), options_.file_mode);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

bool LmdbBackend::SignalWaiting() {
  // The touch (an IN_ATTRIB event) is the signal; the file stays empty.
  int fd = OpenSignalFile(SignalFilePath(), options_.file_mode);
  if (fd < 0) return false;
  const bool touched = ::futimens(fd, nullptr) == 0;
  ::close(fd);
  return touched;
}

}  // namespace percolite
