#include "lanes.h"

namespace percolite {

void Lanes::Push(size_t lane, std::string key) {
  queues_[lane].push_back(std::move(key));
  ++size_;
}

std::pair<size_t, std::string> Lanes::Take() {
  size_t best = queues_.size();
  for (size_t i = 0; i < queues_.size(); ++i) {
    const size_t lane = (next_ + i) % queues_.size();
    if (!queues_[lane].empty() && (best == queues_.size() || running_[lane] < running_[best])) {
      best = lane;
    }
  }
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
