#include "lanes.h"

#include <algorithm>

namespace percolite {

void Lanes::Push(size_t lane, std::string key) {
  queues_[lane].push_back(std::move(key));
  ++size_;
}

size_t Lanes::Pick() const {
  if (size_ == 0) return kNone;
  // The sinks with a run going (few: one per observer at most).
  std::vector<uint64_t> busy;
  for (size_t lane = 0; lane < queues_.size(); ++lane) {
    if (running_[lane] > 0 && SinkOf(lane) != 0) busy.push_back(SinkOf(lane));
  }
  size_t best = kNone;
  for (size_t i = 0; i < queues_.size(); ++i) {
    const size_t lane = (next_ + i) % queues_.size();
    if (queues_[lane].empty()) continue;
    if (best != kNone && running_[lane] >= running_[best]) continue;
    const uint64_t sink = SinkOf(lane);
    if (sink != 0 && std::find(busy.begin(), busy.end(), sink) != busy.end()) continue;
    best = lane;
  }
  return best;
}

std::pair<size_t, std::string> Lanes::Take() {
  const size_t best = Pick();
  next_ = (best + 1) % queues_.size();
  std::string key = std::move(queues_[best].front());
  queues_[best].pop_front();
  --size_;
  ++running_[best];
  return {best, std::move(key)};
}

void Lanes::Clear() {
  for (auto& queue : queues_) queue.clear();
  size_ = 0;
}

}  // namespace percolite
