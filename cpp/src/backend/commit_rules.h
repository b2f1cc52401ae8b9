// How a backend validates and applies one commit: the rules of backend.h
// written once, over the tables of the backend's write state.
//
// A backend calls ValidateCommit, then (when it passes) ApplyCommit, for each
// commit, in commit_ts order, inside one write of its own (an LMDB write
// transaction, the memory store's lock). `Tables` is the backend's view of
// that write state; it provides:
//
//   std::optional<uint64_t> CellWrittenTs(std::string_view key);
//       commit_ts of the cell's stored record, tombstones included
//   std::optional<uint64_t> AckTs(std::string_view cell_key);
//   std::optional<uint64_t> NotificationStampAt(std::string_view notification_key);
//   void PutCell(std::string_view key, uint64_t commit_ts, bool is_delete,
//                std::string_view value);      // a delete leaves a tombstone
//   void PutStamped(std::string_view key, std::string_view stamped_key,
//                   uint64_t commit_ts, std::string_view value, bool join);
//       a stamped write of `key`: PutCell(stamped_key, ...); with `join`
//       (a joinable write, backend.h) the backend may instead join it to the
//       record of `key` an earlier commit of the same write left open; a
//       write without `join` closes that record (records stay in commit order)
//   void PurgeCell(std::string_view key);       // no tombstone
//   void PurgeRange(std::string_view from, std::string_view end);
//   void PutNotification(std::string_view notification_key, uint64_t stamp);
//   void RemoveNotification(std::string_view notification_key);
//   void PutAck(std::string_view cell_key, uint64_t commit_ts);
//
// Thread safety: the caller serialises commits (one writer at a time).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "percolite/backend.h"
#include "percolite/encoding.h"
#include "percolite/status.h"

namespace percolite {

// A printable form of an encoded cell key, for error messages.
std::string DescribeKey(std::string_view encoded);

// The strongly observed columns, matched against encoded keys without
// decoding them.
class StrongColumns {
 public:
  // Loads the columns from their stored form (EncodeObservedColumns); returns
  // false when the bytes are malformed. Cheap when they did not change.
  bool Load(std::string_view stored);
  bool empty() const { return tails_.empty(); }
  // True when `key` sets a strongly observed column; *row is then its row.
  bool Match(std::string_view key, std::string* row) const;

 private:
  std::string stored_;
  // Family and qualifier parts as encoded in a key (encoding.h).
  std::set<std::string, std::less<>> tails_;
};

// kConflict when a set or deleted cell was written after start_ts, or when
// another run of the trigger's observer committed after start_ts; ok otherwise.
template <typename Tables>
Status ValidateCommit(Tables& tables, uint64_t start_ts, const std::vector<Mutation>& mutations,
                      const CommitExtras* extras) {
  for (const Mutation& m : mutations) {
    if (m.stamped || m.purge) continue;
    const std::optional<uint64_t> written_ts = tables.CellWrittenTs(m.key);
    if (written_ts && *written_ts > start_ts) {
      return Status::Make(ErrorCode::kConflict,
                          "commit conflict on " + DescribeKey(m.key) +
                              ": it was written by a transaction that committed at ts " +
                              std::to_string(*written_ts) + ", after this transaction's start_ts " +
                              std::to_string(start_ts));
    }
  }
  if (extras && extras->trigger) {
    const std::optional<uint64_t> ack = tables.AckTs(*extras->trigger);
    if (ack && *ack > start_ts) {
      return Status::Make(ErrorCode::kConflict,
                          "commit conflict: another run of the observer for " +
                              DescribeKey(*extras->trigger) + " committed first");
    }
  }
  return Status::Ok();
}

namespace commit_rules_internal {
template <typename Tables>
void Notify(Tables& tables, const std::string& cell_key, std::string_view row, uint64_t stamp,
            std::vector<Notification>* written) {
  const uint64_t hash = RowHash(row);
  tables.PutNotification(NotificationKey(hash, cell_key), stamp);
  written->push_back(Notification{cell_key, stamp, hash});
}
}  // namespace commit_rules_internal

// Applies a validated commit at commit_ts: its mutations (range purges
// first, as the transaction orders them), the notifications it makes (appended
// to *written), and, for an observer run, the ack and the removal of its
// notification unless it was set again after start_ts.
template <typename Tables>
void ApplyCommit(Tables& tables, const StrongColumns& strong, uint64_t start_ts, uint64_t commit_ts,
                 const std::vector<Mutation>& mutations, const CommitExtras* extras,
                 std::vector<Notification>* written) {
  std::string row;
  for (const Mutation& m : mutations) {
    if (m.purge) {
      if (m.purge_end.empty()) {
        tables.PurgeCell(m.key);
      } else {
        tables.PurgeRange(m.key, m.purge_end);
      }
      continue;
    }
    const std::string stamped_key =
        m.stamped ? StampedKey(m.key, commit_ts, m.stamp_seq) : std::string();
    const std::string& key = m.stamped ? stamped_key : m.key;
    const bool notify = !m.is_delete && !strong.empty() && strong.Match(key, &row);
    if (m.stamped) {
      // A notified cell must exist under its own key: not joined.
      tables.PutStamped(m.key, key, commit_ts, m.value, m.joinable && !notify);
    } else {
      tables.PutCell(key, commit_ts, m.is_delete, m.value);
    }
    if (notify) commit_rules_internal::Notify(tables, key, row, commit_ts, written);
  }
  if (extras == nullptr) return;
  for (const std::string& cell_key : extras->weak_notifications) {
    if (RowOfCellKey(cell_key, &row)) {
      commit_rules_internal::Notify(tables, cell_key, row, commit_ts, written);
    }
  }
  if (extras->trigger) {
    const std::string& trigger = *extras->trigger;
    tables.PutAck(trigger, commit_ts);
    if (RowOfCellKey(trigger, &row)) {
      const std::string key = NotificationKey(RowHash(row), trigger);
      const std::optional<uint64_t> stamp = tables.NotificationStampAt(key);
      if (stamp && *stamp <= start_ts) tables.RemoveNotification(key);
    }
  }
}

}  // namespace percolite
