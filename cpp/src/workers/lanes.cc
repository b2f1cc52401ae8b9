#include "lanes.h"

namespace percolite {

void Lanes::Push(size_t lane, std::string key) {
  queues_[lane].push_back(std::move(key));
  ++size_;
}

bool Lanes::SinkBusy(uint64_t sink) const {
  for (size_t lane = 0; lane < queues_.size(); ++lane) {
    if (running_[lane] > 0 && SinkOf(lane) == sink) return true;
  }
  return false;
}

size_t Lanes::Pick() const {
  if (size_ == 0) return kNone;
  size_t best = kNone;
  for (size_t lane = 0; lane < queues_.size(); ++lane) {
    if (queues_[lane].empty()) continue;
    if (best != kNone && (running_[lane] > running_[best] ||
                          (running_[lane] == running_[best] && served_[lane] >= served_[best]))) {
      continue;
    }
    const uint64_t sink = SinkOf(lane);
    if (sink != 0 && SinkBusy(sink)) continue;
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
