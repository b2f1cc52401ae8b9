// sink_slot.h: what every backend does the same way besides the commit rules
// (commit_rules.h): holding the NotificationSink of this process, and
// counting pending notifications by column.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "percolite/backend.h"
#include "percolite/encoding.h"
#include "percolite/mutex.h"
#include "percolite/status.h"

namespace percolite {

// The one NotificationSink a backend hands its commits' notifications to
// (Backend::SetNotificationSink). Thread safe.
class SinkSlot {
 public:
  // Throws kWrongState with `taken` as the message when another sink is set.
  void Set(NotificationSink* sink, const std::string& taken) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (sink_ != nullptr && sink_ != sink) throw Error(ErrorCode::kWrongState, taken);
    sink_ = sink;
  }
  void Clear(NotificationSink* sink) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (sink_ == sink) sink_ = nullptr;
  }
  // Hands `written` to the sink, if one is set (a sink must not block).
  void Offer(const std::vector<Notification>& written) EXCLUDES(mu_) {
    if (written.empty()) return;
    MutexLock lock(&mu_);
    if (sink_) sink_->Offer(written);
  }

 private:
  Mutex mu_;
  NotificationSink* sink_ GUARDED_BY(mu_) = nullptr;
};

// Counts the notification stored under `notification_key`
// (NotificationKey: row hash, then cell key) in its column's entry.
inline void CountByColumn(std::string_view notification_key,
                          std::map<std::pair<std::string, std::string>, uint64_t>* counts) {
  Cell cell;
  if (notification_key.size() >= 8 && DecodeCellKey(notification_key.substr(8), &cell)) {
    ++(*counts)[{cell.family, cell.qualifier}];
  }
}

}  // namespace percolite
