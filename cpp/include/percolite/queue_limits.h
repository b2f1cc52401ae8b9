// percolite/queue_limits.h: the limits both queues (combine_queue.h,
// export_queue.h) check when they are created; the Python package reads them
// from percolite._core rather than repeating them.
#pragma once

#include <cstdint>

namespace percolite {

// Bucket rows are named by 6 decimal digits ("<id>:<kind>:000042").
constexpr uint32_t kMaxBuckets = 999999;

// The longest a short batch may wait for more entries (see Lingering in
// export_queue.h).
constexpr double kMaxLingerSeconds = 3600;

}  // namespace percolite
