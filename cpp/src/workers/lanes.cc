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
  for (size_t lane = 0; lane < queues_.size(); ++lane) {
    if (queues_[lane].empty()) continue;
    if (best != kNone && (running_[lane] > running_[best] ||
                          (running_[lane] == running_[best] && served_[lane] >= served_[best]))) {
      continue;
    }
    const uint64_t sink = SinkOf(lane);
    if (sink != 0 && std::find(busy.begin(), busy.end(), sink) != busy.end()) continue;
    best = lane;
  }
  return best;
}

std::optional<std::pair<size_t, std::string>> Lanes::Take() {
  const size_t best = Pick();
  if (best == kNone) return std::nullopt;
  std::string key = std::move(queues_[best].front());
  queues_[best].pop_front();
  --size_;
  ++running_[best];
  served_[best] = ++takes_;
  return std::make_pair(best, std::move(key));
}

void Lanes::Clear() {
  for (auto& queue : queues_) queue.clear();
  size_ = 0;
}

}  // namespace percolite
