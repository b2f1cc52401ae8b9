// queue_rows.h (internal): what the combine queue and the export queue share.
// Both keep queued entries as stamped writes in one row per bucket
// ("<id>:<kind>:<bucket>"), and a bucket row holding the "notify" and
// "cursor" cells. An entry is stored one of two ways:
//  - a single-entry record, in family `kind`: qualifier = the 12-byte stamp
//    (commit_ts, index; the writer puts it in front, backend.h) followed by
//    the key's bytes, value = the entry's value. The export queue writes
//    these (each entry's stamp is its seq), and stores of format percolite/4
//    hold nothing else;
//  - a packed record, in the queue's packed family (PackedFamily): qualifier
//    = the stamp alone, value = every entry one Write call queued in that
//    bucket, in the order given. One stamped write per touched bucket instead
//    of one per entry (the combine queue writes these). They are joinable
//    (backend.h): a backend may store the records of the commits it writes
//    together as one, in commit order, under the first one's stamp.
// Records sort in commit order, so a commit appends at the end of each bucket
// it touches, and a run consumes records from the front. Single-entry
// records of the combine queue come only from stores of format percolite/4,
// so they all precede its packed records in commit order; Read visits them
// first.
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
// The families of single-entry records: a combine queue's updates, an
// export queue's entries.
constexpr std::string_view kCombineUpdateFamily = "u";
constexpr std::string_view kExportEntryFamily = "e";
constexpr std::string_view kCursorQualifier = "cursor";

// The family of a queue's packed records, given the family of its
// single-entry records ("u" -> "U").
std::string PackedFamily(std::string_view family);

// A packed record's value (backend.h: a version byte, the entry count,
// then the entries): here each entry is its key size, key, value size and
// value (sizes as varints, encoding.h). Write starts a new record once one
// holds kPackedMaxEntries entries or kPackedMaxBytes bytes.
void AppendPackedEntry(std::string* out, std::string_view key, std::string_view value);
// Decodes `value`; false (and *out partly filled, *why saying what is
// wrong when given) when it is malformed: a wrong version, a truncated or
// overlong size, bytes left over, or a count that disagrees with the
// entries. The views point into `value`.
bool DecodePacked(std::string_view value,
                  std::vector<std::pair<std::string_view, std::string_view>>* out,
                  std::string* why = nullptr);
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

// Queues each (key, value) of `entries` in row "<id>:<kind>:<bucket>"
// (bucket = bucket_of(key)): with `packed`, as packed records in family
// PackedFamily(family), one per touched bucket (more when one would pass
// kPackedMaxEntries or kPackedMaxBytes); else as single-entry records in
// family `family`. Sets one weak notification per touched bucket on row
// "<id>:b:<bucket>", column `notify_family`/"notify". Only buffers in
// `transaction`.
void Write(Transaction& transaction, const std::string& id, std::string_view kind,
           std::string_view family, const std::string& notify_family, uint32_t buckets,
           const std::function<uint32_t(std::string_view)>& bucket_of,
           const std::vector<std::pair<std::string, std::string>>& entries, bool packed = false);

// No record: an Entry read from a single-entry record.
constexpr uint32_t kSingle = UINT32_MAX;

// One queued entry: views of bytes its Entries keeps.
struct Entry {
  // A single-entry record's qualifier as stored (the stamp, then the key);
  // for an entry of a packed record, that record's qualifier (its stamp).
  std::string_view qualifier;
  std::string_view key_bytes;
  std::string_view value;
  uint64_t commit_ts = 0;  // the record's stamp
  uint32_t index = 0;
  uint32_t record = kSingle;  // for a packed record's entry: Entries::records()
  std::string_view key() const { return key_bytes; }
};

// A record Read took entries of: a packed record (whole, or in part: the
// rest stays in it), or a single-entry record (value empty, packed false).
struct Record {
  std::string_view qualifier;
  std::string_view value;  // a packed record's whole value
  bool packed = false;
  // Whether it directly follows the record before it in records(), in the
  // same family, with no record left out between: PurgeRead removes a run of
  // such records as one range.
  bool follows = false;
  uint32_t first = 0;  // its entries taken: list()[first, first + count)
  uint32_t count = 0;
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
  std::vector<Record>& records() { return records_; }
  const std::vector<Record>& records() const { return records_; }
  // Appends an entry viewing copies of `qualifier` and `value` (a
  // single-entry record's).
  Entry& Add(std::string_view qualifier, std::string_view value);
  // Appends a record viewing copies of `qualifier` and `value`; returns it.
  Record& AddRecord(std::string_view qualifier, std::string_view value, bool packed);

 private:
  std::string_view Keep(std::string_view bytes);

  std::vector<Entry> list_;
  std::vector<Record> records_;
  std::vector<std::unique_ptr<char[]>> blocks_;
  size_t used_ = 0;      // bytes used in blocks_.back()
  size_t capacity_ = 0;  // size of blocks_.back()
};

// Reads the entries of `row`: its single-entry records (family `family`),
// then, when `packed`, its packed records (PackedFamily(family)), in commit
// order, starting after `cursor` (empty: from the start; a cursor is only
// for single-entry records, so not with `packed`): the first `limit` of them
// (all, when fewer remain; the batch may end inside a packed record), and,
// when `whole_keys`, every later entry of their keys too (the rest of the
// row is scanned for them), so no key's entries are split. A packed record
// taken in part keeps the rest (PurgeRead writes it back in its place).
// Memory: the entries taken, and the records they came from (each at most
// kPackedMaxBytes plus one entry). Sets *more when entries remain
// that were not returned. Entries whose key is in `skip` (parked keys) are
// left where they are: neither returned nor counted in *more.
Status Read(Transaction& transaction, const std::string& row, std::string_view family,
            const std::string& cursor, size_t limit, bool whole_keys, bool packed,
            std::string_view what, const std::set<std::string, std::less<>>& skip, Entries* out,
            bool* more);

// Removes, in `transaction`, what a run consumed of the records Read
// returned in `read`: the entries it took, except those whose key is in
// `kept` (keys parked by the run). A record left with nothing goes (runs of
// consecutive ones as one range, Transaction::PurgeStamps); a packed record
// left with some entries is written again in place (same qualifier, so same
// position in commit order), holding just those.
void PurgeRead(Transaction& transaction, const std::string& row, std::string_view family,
               const Entries& read, const std::set<std::string, std::less<>>& kept);

// What Read from the start would find, without reading it: *found = the
// entries of `row` (single-entry records of `family`, and with `packed` the
// packed records' entries), at most `limit`, and *more = whether more than
// `limit` remain. Only counts (no copies; a packed record's count is in its
// header): a run that lingers costs a walk over its bucket's records, not a
// copy of them.
void Peek(Transaction& transaction, const std::string& row, std::string_view family, bool packed,
          size_t limit, size_t* found, bool* more);

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
             const std::string& entry_row, std::string_view family, bool packed, size_t full)
      EXCLUDES(mu_);

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
  bool packed = false;               // entries may be in packed records too (Write)
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
