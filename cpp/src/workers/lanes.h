// Lanes: the ready notifications of a worker pool, one FIFO ("lane") per
// observer (workers.h, "Scheduling"). Take serves the lane with the fewest
// runs going, ties in turn, so an observer whose runs are slow cannot hold
// every thread while other observers have work.
//
// Thread safety: none; the pool guards its Lanes with its own mutex.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace percolite {

class Lanes {
 public:
  explicit Lanes(size_t count) : queues_(count), running_(count, 0) {}
  void Push(size_t lane, std::string key);
  // Requires !empty(). The run it hands out counts as going until Done(lane).
  std::pair<size_t, std::string> Take();
  void Done(size_t lane) { --running_[lane]; }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // Drops every queued key; runs going stay counted until their Done.
  void Clear();

 private:
  std::vector<std::deque<std::string>> queues_;
  std::vector<int> running_;
  size_t size_ = 0;
  size_t next_ = 0;  // where ties start
};

}  // namespace percolite
