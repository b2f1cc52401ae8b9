// queue_rows.h (internal): what the combine queue and the export queue share.
// Both keep queued entries as stamped writes in one row per bucket, with the
// qualifier the 12-byte stamp (commit_ts, index; the writer puts it in front,
// backend.h) followed by the key's bytes, and a bucket row holding the "notify"
// and "cursor" cells. Entries sort in commit order, so a commit appends its
// entries at the end of each bucket it touches (a page or two per bucket,
// however many entries), and a run consumes entries from the front.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "percolite/backend.h"
#include "percolite/encoding.h"
#include "percolite/mutex.h"
#include "percolite/notifications.h"
#include "percolite/queue_limits.h"
#include "percolite/status.h"

namespace percolite {

class Transaction;

namespace queue_rows {

using percolite::kStampSize;  // commit_ts (8) + index (4), appended by the writer (backend.h)
constexpr std::string_view kNotifyQualifier = "notify";
constexpr std::string_view kCursorQualifier = "cursor";

// Throws kInvalidArgument naming the bad option. `kind` is "combine queue" or
// "export queue", `batch_name` the option bounding one run.
void CheckOptions(std::string_view kind, const std::string& id, uint32_t buckets,
                  std::string_view batch_name, size_t batch);

std::string BucketName(uint32_t bucket);  // 6 decimal digits

// The column a queue's processor observes, WEAK: the "notify" cells of its
// bucket rows (family `notify_family`), under QueueProcessorName(kind, id)
// (queue_limits.h, defined with the rest of the queues' rows here).
ObservedColumn ProcessorColumn(std::string_view kind, const std::string& id,
                               const std::string& notify_family);

// `processor` as the workers run it, on ProcessorColumn. Its runs are
// retried without limit (max_attempts 0): the queue parks failing keys
// itself (BucketStrategy::max_attempts), and parking the bucket's
// notification instead would stop every other key of the bucket with them.
// It waits for each commit (Observer::wait_for_commit): a bucket cannot run
// again before then anyway.
Observer ProcessorObserver(std::string_view kind, const std::string& id,
                           const std::string& notify_family, ObserverFn processor);

// Queues each (key, value) of `entries` as a stamped write in row
// "<id>:<kind>:<bucket>" (bucket = bucket_of(key)), family `family`, and sets
// one weak notification per touched bucket on row "<id>:b:<bucket>", column
// `notify_family`/"notify". Only buffers in `transaction`.
void Write(Transaction& transaction, const std::string& id, std::string_view kind,
           std::string_view family, const std::string& notify_family, uint32_t buckets,
           const std::function<uint32_t(std::string_view)>& bucket_of,
           const std::vector<std::pair<std::string, std::string>>& entries);

// One queued entry: views of bytes its Entries keeps.
struct Entry {
  std::string_view qualifier;  // as stored: the stamp, then the key
  std::string_view value;
  uint64_t commit_ts = 0;
  uint32_t index = 0;
  std::string_view key() const { return qualifier.substr(kStampSize); }
};

// What Read found: the entries, and the bytes they view, copied into blocks
// that never move, so the views stay valid as long as this object (moving it
// keeps them valid too). One allocation per block instead of two per entry.
class Entries {
 public:
  Entries() = default;
  Entries(const Entries&) = delete;
  Entries& operator=(const Entries&) = delete;
  Entries(Entries&&) = default;
  Entries& operator=(Entries&&) = default;

  std::vector<Entry>& list() { return list_; }
  const std::vector<Entry>& list() const { return list_; }
  // Appends an entry viewing copies of `qualifier` and `value`.
  Entry& Add(std::string_view qualifier, std::string_view value);

 private:
  std::string_view Keep(std::string_view bytes);

  std::vector<Entry> list_;
  std::vector<std::unique_ptr<char[]>> blocks_;
  size_t used_ = 0;      // bytes used in blocks_.back()
  size_t capacity_ = 0;  // size of blocks_.back()
};

// Reads the entries of `row`/`family` in commit order, starting after
// `cursor` (empty: from the start): the first `limit` of them (all, when fewer
// remain), and, when `whole_keys`, every later entry of their keys too (the
// rest of the row is scanned for them), so no key's entries are split. Sets
// *more when entries remain that were not returned, and *consecutive to how
// many of the first entries of *out follow each other in the row with none
// left out between them: PurgeRead removes those as one range.
// Entries whose key is in `skip` (parked keys) are left where they are:
// neither returned nor counted in *more.
Status Read(Transaction& transaction, const std::string& row, std::string_view family,
            const std::string& cursor, size_t limit, bool whole_keys, std::string_view what,
            const std::set<std::string, std::less<>>& skip, Entries* out, bool* more,
            size_t* consecutive);

// Purges, in `transaction`, the entries Read returned in `entries`, of which
// the first `consecutive` go as one range (Transaction::PurgeStamps) and the
// rest one by one.
void PurgeRead(Transaction& transaction, const std::string& row, std::string_view family,
               const std::vector<Entry>& entries, size_t consecutive);

// What Read from the start would find, without reading it: *found = the
// entries of `row`/`family`, at most `limit`, and
// *more = whether more than `limit` remain. Only counts (no copies): a run
// that lingers costs a walk over its bucket's keys, not a copy of them.
void Peek(Transaction& transaction, const std::string& row, std::string_view family, size_t limit,
          size_t* found, bool* more);

// Lingering, for both queues (the rule is in export_queue.h): remembers, per
// bucket row, when this process first found it short and how many entries
// its last look found. Thread-safe.
class Linger {
 public:
  // Throws kInvalidArgument naming the queue unless 0 <= seconds <= 3600.
  Linger(std::string_view kind, const std::string& id, double seconds);
  // Called by a bucket run before it reads anything: counts the entries of
  // `entry_row`/`family` (Peek; from the start of the bucket when `cursor` is
  // empty, and only then can a run wait; `full`: the run's batch size). When
  // the run should wait, defers `transaction` (an observer run,
  // Transaction::DeferTrigger) and returns true: the caller returns ok without
  // writing anything.
  bool Defer(Transaction& transaction, const std::string& bucket_row, const std::string& cursor,
             const std::string& entry_row, std::string_view family, size_t full) EXCLUDES(mu_);

 private:
  struct Short {
    std::chrono::steady_clock::time_point since;
    size_t found = 0;
  };
  // The seconds to defer a run of `bucket_row` that found `found` entries
  // (`short_batch`: fewer than a full run), or 0 to process now.
  double For(const std::string& bucket_row, size_t found, bool short_batch) EXCLUDES(mu_);

  const double seconds_;
  Mutex mu_;
  std::unordered_map<std::string, Short> short_ GUARDED_BY(mu_);
  std::unordered_map<std::string, uint64_t> taken_ GUARDED_BY(mu_);
};

// How a queue runs one bucket. Both queues run the same steps in one
// observer transaction (ProcessBucket): find the bucket's rows, read its
// cursor cell, maybe linger, read a batch of entries, hand them to the
// queue's Consume, purge them, write the cursor cell (so two runs of one
// bucket can never both commit) and, when entries are left, notify the bucket
// again. What differs is this small strategy.
struct BucketStrategy {
  std::string_view what;             // "combine queue 'id'", for messages
  const std::string* id;             // the queue's id: rows are "<id>:<kind>:<bucket>"
  const std::string* family;         // the bucket row's family: "cq:<id>" / "eq:<id>"
  std::string_view entry_kind;       // the entry rows' kind letter, also their family
  size_t batch = 0;                  // entries one run takes (at least, with whole_keys)
  bool whole_keys = false;           // a run takes every queued entry of the keys it reads
  bool resume_after_cursor = false;  // the cursor names the last entry taken; else a marker
  Linger* linger = nullptr;
  // Handles the batch read, in commit order; its writes join the run's commit.
  std::function<Status(Transaction&, const std::vector<Entry>&)> consume;
  // Poison keys (failures.h): the processor's observer name, for the
  // records, and how many failed runs of a bucket end in parking keys (0:
  // never). A run that follows max_attempts - 1 failed runs of its bucket
  // (as the bucket notification's work record counts them) is the last
  // attempt: when consume fails on its batch, it splits the batch by key,
  // in halves, until each failing key is alone, parks those keys, and goes
  // on with the others. Parked keys' entries stay queued, skipped by later
  // runs, until the key is retried.
  std::string observer;
  uint32_t max_attempts = 0;
  // Counted when a run hands a batch to consume (metrics): batches and entries.
  std::atomic<uint64_t>* batches = nullptr;
  std::atomic<uint64_t>* entries = nullptr;
};

// Runs bucket `bucket_cell` of a queue as above; errors come back as a Status
// (nothing the run wrote commits, then).
Status ProcessBucket(const BucketStrategy& strategy, Transaction& transaction,
                     const Cell& bucket_cell);

}  // namespace queue_rows
}  // namespace percolite
