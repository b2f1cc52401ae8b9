// Lanes: the ready notifications of a worker pool, one FIFO ("lane") per
// observer (workers.h, "Scheduling"). Take serves the lane with the fewest
// runs going, ties to the lane served least recently, so an observer whose
// runs are slow cannot hold every thread while other observers have work. A
// lane whose observer names a sink (notifications.h, SinkTurn) waits while a
// run of any lane naming the same sink is going (workers.h, "Sinks"); when
// the sink frees, the lane that waited longest goes.
//
// Thread safety: none; the pool guards its Lanes with its own mutex. (A
// sink's name may change meanwhile, from a run: Take decides once.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "percolite/notifications.h"

namespace percolite {

class Lanes {
 public:
  // One lane per entry of `sinks`: the sink its runs write, or null.
  explicit Lanes(std::vector<std::shared_ptr<const SinkTurn>> sinks)
      : queues_(sinks.size()),
        running_(sinks.size(), 0),
        served_(sinks.size(), 0),
        sinks_(std::move(sinks)) {}
  void Push(size_t lane, std::string key);
  // Whether Take would hand out a run now: a lane with a key whose sink has
  // no run going. A hint for waking workers; Take decides.
  bool CanTake() const { return Pick() != kNone; }
  // The next run and its lane, counted as going until Done(lane); nullopt
  // when no lane has one to hand out.
  std::optional<std::pair<size_t, std::string>> Take();
  void Done(size_t lane) { --running_[lane]; }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // Drops every queued key; runs going stay counted until their Done.
  void Clear();

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  uint64_t SinkOf(size_t lane) const { return sinks_[lane] ? sinks_[lane]->id() : 0; }
  // The lane Take serves, or kNone.
  size_t Pick() const;
  // Whether a run of a lane naming `sink` is going.
  bool SinkBusy(uint64_t sink) const;

  std::vector<std::deque<std::string>> queues_;
  std::vector<int> running_;
  std::vector<uint64_t> served_;  // when each lane last got a run (takes_ then)
  const std::vector<std::shared_ptr<const SinkTurn>> sinks_;
  size_t size_ = 0;
  uint64_t takes_ = 0;
};

}  // namespace percolite
