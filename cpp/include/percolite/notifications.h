// percolite/notifications.h: notifications, the trigger of observers.
//
// Thread safety: the functions here are pure; the registry of observed columns
// is a value type.
//
// Contract (design.md section 4)
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
// Layout: table `notify` maps StoredKeyFor(row hash (8 bytes) + encoded cell
// key) to a record whose commit_ts is the notification's stamp. The row hash
// prefix spreads notifications so that a scan may start at a random point, and
// gives each of n worker processes the share hash % n == i. Table `ack` maps
// encoded cell keys to records whose commit_ts is the last committed run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "percolite/encoding.h"

namespace percolite {

enum class NotifyKind : uint8_t { kStrong = 1, kWeak = 2 };

struct ObservedColumn {
  std::string family;
  std::string qualifier;
  NotifyKind kind = NotifyKind::kStrong;
  std::string observer;  // the observer's name, for status reports
};

// The set of observed columns as stored in the meta table.
std::string EncodeObservedColumns(const std::vector<ObservedColumn>& columns);
bool DecodeObservedColumns(std::string_view bytes, std::vector<ObservedColumn>* out);

// A pending notification, as found in the notify table or handed over by a commit.
struct Notification {
  std::string cell_key;  // encoded cell key (encoding.h)
  uint64_t stamp = 0;    // commit_ts of the transaction that set it
  uint64_t row_hash = 0;
};

uint64_t RowHash(std::string_view row);
// The key of a notification in the notify table, before StoredKeyFor.
std::string NotificationKey(uint64_t row_hash, std::string_view cell_key);

// What an observer run, or a transaction setting weak notifications, adds to
// its commit besides its mutations.
struct CommitExtras {
  std::vector<std::string> weak_notifications;  // encoded cell keys
  std::optional<std::string> trigger;           // the notification this run processes
};

}  // namespace percolite
