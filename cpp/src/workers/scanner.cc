#include "scanner.h"

#include <pthread.h>

#include <algorithm>
#include <random>

#include "lanes.h"
#include "percolite/encoding.h"
#include "percolite/workers.h"

namespace percolite {
namespace {

constexpr size_t kScanBudget = 4096;    // notifications read by one scan, at most
constexpr int kScanSafetyNetMs = 1000;  // rescan this often even when no commit wakes the watch

}  // namespace

std::vector<Notification> ScanPending(Backend& backend, std::string* position, size_t budget) {
  std::vector<Notification> found;
  const bool reached_end = backend.ScanNotifications(*position, budget, &found);
  if (reached_end && !position->empty() && found.size() < budget) {
    // Wrap around: the part before the random starting point.
    backend.ScanNotifications("", budget - found.size(), &found);
    position->clear();
  } else if (!found.empty()) {
    *position = NotificationKey(found.back().row_hash, found.back().cell_key);
  }
  return found;
}

std::chrono::milliseconds ScanPacer::After(const ScanCounts& counts) {
  // A scan that found only what the workers already hold and are not
  // running (deferred runs, a backlog handed over by local commits) read
  // and looked up each of them for nothing: wait longer before the next,
  // doubling from kBusyRescan up to kScanBackoffMax; only Stop ends that
  // pause early. Where another pool's notifications were among them, that
  // pool may commit work into ours at any time: kBusyRescan at most then. A
  // scan that found something new, a run going (whose commit may come with
  // another process's work, which a pause there would leave waiting), or
  // nothing at all (an idle store, where a wake-up must be quick) rescans on
  // the next wake. Without the pause, a lingering queue bucket would make
  // the scanner rescan after every commit.
  if (counts.found == 0 || counts.fresh > 0 || counts.running > 0) {
    backoff_ = std::chrono::milliseconds::zero();
  } else if (counts.others > 0) {
    backoff_ = kBusyRescan;
  } else {
    backoff_ = std::min(std::max(backoff_ * 2, kBusyRescan), kScanBackoffMax);
  }
  return backoff_;
}

ScanCounts Workers::ScanOnce(std::string* position) {
  ScanCounts counts;
  size_t room;
  {
    MutexLock lock(&mu_);
    if (stopping_ || entries_.size() >= options_.queue_capacity) return counts;
    room = options_.queue_capacity - entries_.size();
    ++scans_;
  }
  const std::vector<Notification> found =
      ScanPending(*backend_, position, std::min(kScanBudget, room * 2));
  counts.found = found.size();
  MutexLock lock(&mu_);
  for (const Notification& n : found) {
    if (!Mine(n.row_hash)) {
      ++counts.others;
      continue;
    }
    switch (EnqueueLocked(n)) {
      case Enqueued::kNew:
        ++counts.fresh;
        break;
      case Enqueued::kRunning:
        ++counts.running;
        break;
      case Enqueued::kHeld:
        break;
    }
  }
  return counts;
}

void Workers::ScannerLoop() {
  pthread_setname_np(pthread_self(), "pc-scanner");  // shown by top -H, perf, py-spy
  std::string position;
  std::mt19937_64 random{std::random_device{}()};
  AppendUint64BE(&position, random());  // start at a random point
  ScanPacer pacer;
  for (;;) {
    ScanCounts counts;
    {
      MutexLock lock(&mu_);
      if (stopping_) break;
    }
    try {
      if (leases_) leases_->Refresh();  // pools that joined or left, seen quickly
      counts = ScanOnce(&position);
    } catch (const Error&) {
      // The store is closing, or a transient failure: the next wake retries.
    }
    const unsigned events = watch_->Wait(kScanSafetyNetMs);
    if (events & WorkWatch::kWaiterSignal) {
      MutexLock lock(&mu_);
      external_hurry_until_ = Clock::now() + kExternalHurry;
      HurryLocked();
    }
    const std::chrono::milliseconds pause = pacer.After(counts);
    const Clock::time_point resume = Clock::now() + pause;
    MutexLock lock(&mu_);
    // While the workers are busy, scanning on every commit is wasted work:
    // local commits are handed over directly. Rescan at most every
    // kBusyRescan then, or sooner once the pool goes idle (one wait: the
    // first signal ends it).
    if (!stopping_ && (!ready_->empty() || active_ >= options_.threads)) {
      idle_cv_.WaitFor(&mu_, kBusyRescan);
    }
    while (!stopping_) {
      if (!idle_cv_.WaitUntil(&mu_, resume)) break;
    }
  }
}

}  // namespace percolite
