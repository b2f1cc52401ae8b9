// The scanner of a worker pool (workers.h, "Finding work"): a thread that
// finds the pending notifications no local commit handed over (other
// processes' commits, work left by a crash or a failure) by reading the
// notification table on from a random point, and sleeps between scans in
// the backend's WorkWatch. Workers::ScannerLoop runs it; the pieces here
// are what it does apart from the pool's own state.
//
// Thread safety: ScanPending is safe from any thread (the backend's
// ScanNotifications is); a ScanPacer is used by one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "percolite/backend.h"

namespace percolite {

// What one scan found (Workers::ScanOnce).
struct ScanCounts {
  size_t found = 0;    // notifications read
  size_t fresh = 0;    // of them, new work for this pool (Workers::Enqueued::kNew)
  size_t running = 0;  // of them, held and running (Workers::Enqueued::kRunning)
  size_t others = 0;   // of them, another pool's (not Workers::Mine)
};

// Up to `budget` pending notifications in NotificationKey order from
// *position on, wrapping round to the start of the table once when the
// end comes first; *position is left where the next scan goes on.
std::vector<Notification> ScanPending(Backend& backend, std::string* position, size_t budget);

// How long the scanner waits after a scan, from what the scan found, before
// it scans again on the next wake (kBusyRescan, kScanBackoffMax).
class ScanPacer {
 public:
  std::chrono::milliseconds After(const ScanCounts& counts);

 private:
  std::chrono::milliseconds backoff_{0};
};

}  // namespace percolite
