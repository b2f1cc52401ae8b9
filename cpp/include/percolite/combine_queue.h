// percolite/combine_queue.h: the combine queue (after Fluo Recipes'
// CombineQueue, first described as the collision-free map).
//
// Thread safety: a CombineQueue is immutable after construction; Add, Get and
// the processor may run on any threads at once.
//
// Contract
// - Add(tx, updates) queues (key, update) pairs in `tx` without reading or
//   writing current values: each update is a stamped write (backend.h) in the
//   key's bucket, unique to its transaction, plus a weak notification of the
//   bucket. Adders never collide with each other or with the processor.
// - The processor of a bucket (a WEAK observer of NotifyColumn(), run by the
//   workers) reads, in one transaction: the bucket's queued updates in its
//   snapshot, oldest first, the first buffer_size of them (all, if fewer are
//   queued) and every later update of their keys, so one key's updates are
//   never split across runs; the current values of those keys; combines per
//   key the current value followed by the updates in commit order; writes
//   each new value (nullopt deletes the key); deletes the consumed updates;
//   and calls on_change once with every Change(key, old, new) whose value
//   changed, in key order. When updates of other keys remain, it marks the
//   bucket's cursor cell and notifies the bucket again.
// - Every run writes the bucket's cursor cell, so two runs of one bucket never
//   both commit. A run that follows a marked one does not linger.
// - Lingering (linger_seconds > 0): as for the export queue (export_queue.h),
//   with buffer_size for batch_size: while updates keep arriving, a bucket
//   waits up to linger_seconds to fold more of them in one run (fewer runs,
//   hot keys written once per run), so changes are reported up to about
//   linger_seconds later; as there, a linger never idles a waiter.
// - Poison keys: when a run fails (the combiner, on_change, or a forwarding
//   raises or refuses a value) max_attempts times in a row, the last attempt
//   splits its batch by key, level by level, until each failing key is
//   alone (the rule, and when a split that fails everywhere is taken for an
//   outage instead, are the export queue's: export_queue.h, "Poison keys and
//   outages"); those keys are parked (failures.h) with the error, the other
//   keys fold, and the parked keys' updates, the ones queued and the ones
//   added later, stay queued, unfolded, until the key is retried
//   (RetryParked). So the guarantees below still hold for every key, parked
//   ones included. A stop ends a fold with a Python combiner between two
//   keys (nothing of the run commits).
// - Guarantees, as in Fluo Recipes: (1) the new value reported for a key combines
//   every update of that key committed before the processing transaction
//   started; (2) the old value reported for a key is the new value of the
//   previous report for that key (the first report's old value is absent).
// - Native forwarding: for each queue in export_to, every Change is added to
//   it as (key, ExportValue(new)) inside the processing transaction, before
//   on_change runs, with no Python and no GIL (a deletion exports as one).
// - on_change runs inside the processing transaction: what it writes (for
//   instance adds to an export queue or another combine queue) commits
//   atomically with the new values. It must not write the queue's own rows.
//
// Layout (rows are "<id>:<kind>:..."; ':' is reserved in ids)
//   <id>:u:<bucket>   family "U", qualifier stamp (12 bytes)               queued updates,
//                     value: every update one Add queued in the bucket      packed
//   <id>:u:<bucket>   family "u", qualifier stamp (12 bytes) + key         queued update
//                     (single; only in stores written before percolite/5)
//   <id>:b:<bucket>   family "cq:<id>", qualifiers "notify" and "cursor"   bucket state
//   <id>:d:<bucket>:<key>  family "cq", qualifier "v"                       current value
// where <bucket> is the bucket number in 6 decimal digits. The stamp first
// (backend.h) keeps updates in commit order, so an add appends one record
// (queue_rows.h: more for a very large add) to the end of each bucket it
// touches, one storage write per bucket instead of one per update; a run
// scans its whole bucket for the updates of its keys (reads only). Current
// values sit by bucket (as in the seed: "data is organized to make reading
// existing values for keys in a bucket more efficient"): a run's reads and
// writes stay within its bucket's pages instead of touching pages
// all over the store.
//
// Native combiners (no Python, no GIL): "sum", "max", "min" over int64,
// float64 and fixed-length int64 tuples (elementwise), and "last" over any
// bytes. Numbers are stored big-endian (int64 two's complement, float64
// IEEE-754). "sum" deletes a key whose sum is zero (all-zero for tuples) and
// fails when the result of a run does not fit in int64 (it never wraps; the
// sum is taken in 128 bits, so a later compensating update unsticks a key).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "percolite/export_queue.h"
#include "percolite/notifications.h"
#include "percolite/status.h"
#include "percolite/workers.h"

namespace percolite {

class Transaction;
namespace queue_rows {
class Linger;
struct Entry;
}  // namespace queue_rows

enum class ValueType { kBytes, kInt64, kFloat64, kInt64Tuple };
enum class NativeCombiner { kNone, kSum, kMax, kMin, kLast };

struct Change {
  std::string key;
  std::optional<std::string> old_value;
  std::optional<std::string> new_value;
};

// A combiner given from outside the core (Python): `values` holds the current
// value (when there is one) followed by the updates in commit order.
using CombineFn =
    std::function<Status(std::string_view key, const std::vector<std::string_view>& values,
                         std::optional<std::string>* result)>;
using ChangeFn = std::function<Status(const std::shared_ptr<Transaction>& transaction,
                                      const std::vector<Change>& changes)>;

struct CombineQueueOptions {
  std::string id;
  uint32_t buckets = 64;
  size_t buffer_size = 4096;
  NativeCombiner native = NativeCombiner::kSum;  // kNone: use `combiner`
  ValueType value_type = ValueType::kInt64;
  size_t tuple_length = 0;  // for kInt64Tuple
  CombineFn combiner;
  ChangeFn on_change;  // optional
  // Export queues fed natively with every change (key, new value).
  std::vector<std::shared_ptr<const ExportQueue>> export_to;
  double linger_seconds = 0;  // 0 to 3600 (see Lingering above)
  // Failed runs of a bucket before its poison keys are parked (see Poison
  // keys above); 0 never parks.
  uint32_t max_attempts = kDefaultMaxAttempts;
};

class CombineQueue : public std::enable_shared_from_this<CombineQueue> {
 public:
  // Throws kInvalidArgument naming the bad option.
  static std::shared_ptr<CombineQueue> Create(CombineQueueOptions options);

  const CombineQueueOptions& options() const { return options_; }
  uint32_t BucketOf(std::string_view key) const;

  // Queues updates; throws kInvalidArgument (nothing queued) when a value does
  // not fit the queue's value type.
  void Add(Transaction& transaction,
           const std::vector<std::pair<std::string, std::string>>& updates) const;

  std::optional<std::string> Get(Transaction& transaction, std::string_view key) const;

  // The observer processing one bucket; register it WEAK for NotifyColumn().
  ObservedColumn NotifyColumn() const;
  ObserverFn Processor() const;
  // Processor() as the workers run it, to register: on NotifyColumn(),
  // named "combine queue <id>", retried without limit (the queue parks its
  // poison keys itself, after options().max_attempts; parking the bucket's
  // notification would stop all its keys), waiting for each commit.
  Observer AsObserver() const;

  // Rows holding queued updates start with this prefix (for depth reports).
  std::string EntryRowPrefix() const;
  std::string DataRow(std::string_view key) const;
  // Rows of the current values of the keys in `bucket` start with this.
  std::string DataRowPrefix(uint32_t bucket) const;
  static constexpr std::string_view kDataFamily = "cq";
  static constexpr std::string_view kDataQualifier = "v";

  // Batches this process's runs handed to the combiner (exporter), and the
  // entries in them (metrics: entries / batches is the fold size).
  std::pair<uint64_t, uint64_t> Counters() const { return {batches_.load(), entries_.load()}; }

 private:
  explicit CombineQueue(CombineQueueOptions options);
  Status Process(const std::shared_ptr<Transaction>& transaction, const Cell& cell) const;
  // Folds a run's updates into the current values and reports the changes.
  Status Fold(const std::shared_ptr<Transaction>& transaction,
              const std::vector<queue_rows::Entry>& entries) const;
  Status Combine(std::string_view key, const std::vector<std::string_view>& values,
                 std::optional<std::string>* result) const;
  void CheckValue(std::string_view key, std::string_view value) const;
  size_t ValueSize() const;  // 0 for kBytes
  std::string BucketName(uint32_t bucket) const;

  const CombineQueueOptions options_;
  const std::string family_;  // "cq:<id>"
  const std::shared_ptr<queue_rows::Linger> linger_;
  mutable std::atomic<uint64_t> batches_{0};
  mutable std::atomic<uint64_t> entries_{0};
};

// Runs a native combiner over encoded values (exposed for tests).
Status CombineNative(NativeCombiner combiner, ValueType type, size_t tuple_length,
                     const std::vector<std::string_view>& values,
                     std::optional<std::string>* result);

}  // namespace percolite
