// percolite/latency.h: a lock-free histogram of durations (commit latency).
//
// Thread safety: Record and Read may be called from any thread at once; a
// Read taken while others record is a consistent-enough picture for metrics
// (each count is exact, the counts are not read at one instant).
//
// The buckets are fixed, as Prometheus histograms are: a duration goes into
// the first bucket whose upper bound is at least as large, the last one has
// no bound. Counts are cumulative only in Read's result (`le` semantics),
// so a reader can take differences of two Reads for an interval.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace percolite {

class LatencyHistogram {
 public:
  // Upper bounds in seconds: 0.1 ms to 10 s; one more bucket beyond.
  static constexpr std::array<double, 12> kBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                     0.01,   0.025,   0.05,   0.1,   1.0,    10.0};
  static constexpr size_t kBuckets = kBounds.size() + 1;

  struct Reading {
    std::array<uint64_t, kBuckets> cumulative{};  // durations <= kBounds[i]; the last: all
    double sum_seconds = 0;
    uint64_t count = 0;
  };

  void Record(std::chrono::steady_clock::duration elapsed) {
    const double seconds = std::chrono::duration<double>(elapsed).count();
    size_t i = 0;
    while (i < kBounds.size() && seconds > kBounds[i]) ++i;
    counts_[i].fetch_add(1, std::memory_order_relaxed);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count();
    sum_ns_.fetch_add(ns > 0 ? static_cast<uint64_t>(ns) : 0, std::memory_order_relaxed);
  }

  Reading Read() const {
    Reading r;
    uint64_t running = 0;
    for (size_t i = 0; i < kBuckets; ++i) {
      running += counts_[i].load(std::memory_order_relaxed);
      r.cumulative[i] = running;
    }
    r.count = running;
    r.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
    return r;
  }

 private:
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> sum_ns_{0};
};

}  // namespace percolite
