// percolite/notifications.h: notifications, the trigger of observers, and
// the observers they trigger.
//
// Thread safety: the types here are values. Observer functions are called on
// worker threads (workers.h), one notification per thread at a time.
//
// Contract
// - An observer is registered for a column, STRONG or WEAK. The observed
//   columns and their kinds are stored in the store itself, so that every
//   process committing to it (with or without the application bound) creates
//   the same notifications.
// - Strong: a committed transaction that *sets* (not deletes) a strongly
//   observed column creates a notification for that cell, stamped with the
//   transaction's commit_ts. Several sets before a run collapse into one
//   notification (same cell, newest stamp).
// - Weak: Transaction::SetWeakNotification(cell) creates a notification when
//   the transaction commits. It never conflicts with anything. Delivery is at
//   least once.
// - An observer runs in its own transaction, and commits it together with:
//   (a) a write of the notification's ack cell, validated like any write, so
//   two concurrent runs of one notification conflict and at most one commits;
//   (b) the removal of the notification, done only if the notification's
//   stamp is <= the run's start_ts: a notification set again after the run
//   began survives, and runs again.
// - A notification is removed only by such a commit; a run that fails, raises
//   or dies leaves it in place.
//
// The backend (backend.h) stores notifications, acks and the observed
// columns and applies rules (a)-(b) at commit; the transaction layer carries a
// run's trigger (Transaction::SetTrigger) and weak notifications to its
// commit; the worker layer (workers.h) finds notifications and runs observers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "percolite/backend.h"
#include "percolite/encoding.h"
#include "percolite/status.h"
#include "percolite/transaction.h"

namespace percolite {

// Runs one notification in `transaction`. Returns ok, or an error status
// (kCallback with the traceback for a raising Python observer). Returning ok
// commits the run (unless it deferred itself: Transaction::DeferTrigger).
using ObserverFn =
    std::function<Status(const std::shared_ptr<Transaction>& transaction, const Cell& cell)>;

// Runs of one notification that may fail before its work is parked
// (failures.h); 0 retries forever.
constexpr uint32_t kDefaultMaxAttempts = 10;
constexpr uint32_t kMaxAttemptsLimit = 1000000;

// The sink an observer's runs write, when that sink takes one writer at a
// time (an SQLite database): runs of observers that name the same sink take
// turns in a worker pool (workers.h, "Sinks"). An exporter may learn its sink
// only when it is first called (one chosen by configuration), so the name
// may be set at any time, from any thread, and is read at each scheduling.
class SinkTurn {
 public:
  // "" names none. Names are compared by a 64-bit hash: two sinks whose
  // names collide would only take turns when they need not.
  void Name(std::string_view sink) {
    id_.store(sink.empty() ? 0 : (StableHash64(sink) | 1), std::memory_order_relaxed);
  }
  // 0 when none is named, else the same value for the same name.
  uint64_t id() const { return id_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> id_{0};
};

struct Observer {
  ObservedColumn column;
  ObserverFn fn;
  uint32_t max_attempts = kDefaultMaxAttempts;
  // The worker waits for each run's commit before its next notification
  // (workers.h "Committing"), as a queue's processor does: its bucket cannot
  // run again before the commit anyway, and a thread freed early only folds
  // other buckets sooner, in more and smaller batches that compete with the
  // commits feeding them.
  bool wait_for_commit = false;
  // The sink its runs write, or null (SinkTurn).
  std::shared_ptr<const SinkTurn> sink;
};

}  // namespace percolite
