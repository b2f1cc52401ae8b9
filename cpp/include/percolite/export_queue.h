// percolite/export_queue.h: the export queue (after Fluo Recipes'
// ExportQueue): only committed data leaves for external systems.
//
// Thread safety: an ExportQueue is immutable after construction, but for the
// name of its sink (NameSink, atomic); Add and the processor may run on any
// threads at once. The exporter may be called from several worker threads
// (different buckets) and processes at once.
//
// Contract
// - Add(tx, key, value) queues an entry as a stamped write (backend.h) in the
//   key's bucket, plus a weak notification of the bucket: the entry exists if
//   and only if `tx` commits, and adders never collide with each other or
//   with the processor.
// - Each entry's sequence number is Seq(commit_ts, index): the commit_ts of
//   the transaction that added it, shifted left by kSeqIndexBits, plus the
//   entry's index among that transaction's stamped writes. Commit timestamps
//   follow commit order, so for one key a later commit always has a larger
//   seq (stronger than Fluo, which uses the start timestamp). A transaction
//   may add at most 2^kSeqIndexBits stamped writes when it uses an export
//   queue; seqs stay below 2^63 while commit_ts < 2^43.
// - The processor of a bucket (a WEAK observer of NotifyColumn(), run by the
//   workers) reads, in one transaction, up to batch_size entries after the
//   bucket's cursor, oldest first (entries are stored in commit order), calls
//   the exporter once with them ordered by key, then seq, and with the
//   store's identity and epoch (identity.h: a sink belongs to one store), and, when the
//   exporter succeeds, deletes them in the same transaction. When entries
//   remain, it records where it stopped and notifies the bucket again.
// - Lingering (linger_seconds > 0, like Kafka's linger.ms): a run that
//   begins at the start of its bucket and finds a short batch (fewer than
//   batch_size entries) defers itself (workers.h) for linger_seconds / 4
//   instead of exporting, and looks again (a look counts the entries, it
//   does not copy them). It exports when the batch is full,
//   when no entries arrived since its last look, when at least as many
//   entries wait as the runs of this process that went on after a look
//   found in all (a young bucket: its second look), or when linger_seconds
//   have passed since this process
//   first found the bucket short. So the exporter gets fewer, fuller batches
//   while adders are busy, an entry waits at most about linger_seconds
//   longer, and an idle queue drains within linger_seconds / 2. The young
//   bucket rule is for jobs that start with a burst (a load, a fresh store):
//   a batch costs a sink (or a combine queue's fold, combine_queue.h) about
//   in proportion to what it already holds, so while the batches are at
//   least that large they cost little more than one big batch would, and
//   they go while the adders are still busy instead of all at the end; the
//   batches at least double, so after a few of them lingering is as before.
//   Each process starts young (a restart, each worker process): at most
//   about log2(batch_size) + 1 such early batches per bucket and process.
//   With linger_seconds = 0 (the default) every run
//   exports at once. A linger never idles a waiter: while a thread of this
//   process waits for the workers (Env::WaitIdle, Python's Env.wait and
//   Env.process) and they have nothing else to run, the lingering runs are
//   brought forward and export what they hold (workers.h, "Hurrying").
// - At least once: an exporter that fails (or a run that dies, or loses the
//   commit to a concurrent run of the same bucket: every run writes the
//   cursor cell, so two runs of one bucket never both commit) leaves the
//   entries queued; the workers retry with backoff, and the retry delivers
//   the same entries again, possibly with more after them. A sink makes this
//   idempotent with a seq guard: an entry applies only when its seq is larger
//   than the last applied seq of its key.
// - Poison keys and outages ("When a sink fails"): the sink being down and
//   a key that cannot be exported are different failures.
//   * An exporter that fails with kSinkUnavailable (status.h; the Python
//     layer reports so for transient errors: connections, time-outs, a
//     locked database) means the sink is down: the run fails whole and is
//     retried with the workers' capped backoff for as long as the sink stays
//     down; nothing is split, nothing is parked, and these runs do not count
//     toward max_attempts (failures.h, "Outages").
//   * Other failures count. After max_attempts failed runs of a bucket in a
//     row, the last attempt splits its batch by key, level by level: every
//     failing part of several keys is split in halves and the halves are
//     sent (what the exporter sent of the keys that succeed is sent, at
//     least once as always). A key alone in a failing part is poison: it is
//     parked (failures.h) with its error, the others are exported and go on,
//     and its entries, queued and later, stay queued until it is retried
//     (RetryParked). But when every part tried at one level fails, and there
//     were at least four, the sink is failing for everything: the run ends as
//     an outage (kSinkUnavailable) and parks nothing. One, two or three
//     poison keys can never make that happen (k poison keys fail at most k
//     parts of a level), so they are always parked alone; four or more, each
//     in its own quarter of a batch, are taken for an outage.
//   * A stop (Workers::StopRequested) ends a split between two exporter
//     calls: nothing of the run commits and the entries stay queued.
//
// Layout (rows are "<id>:<kind>:..."; ':' is reserved in ids)
//   <id>:e:<bucket>   family "e", qualifier stamp (12 bytes) + key         queued entry
//   <id>:b:<bucket>   family "eq:<id>", qualifiers "notify" and "cursor"   bucket state
// where <bucket> is the bucket number in 6 decimal digits. The stamp first
// (backend.h) keeps entries in commit order: an add appends to its bucket. A
// queued value is
// one tag byte, then the value's bytes: ExportValue() gives "\x01" + value for
// a value and "\x00" for a deletion (the Python layer and the combine
// queue's native forwarding, combine_queue.h, both use it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "percolite/identity.h"
#include "percolite/notifications.h"
#include "percolite/status.h"
#include "percolite/workers.h"

namespace percolite {

class Transaction;
namespace queue_rows {
class Linger;
struct Entry;
}  // namespace queue_rows

constexpr int kSeqIndexBits = 20;
constexpr uint64_t kMaxSeqCommitTs = uint64_t{1} << (63 - kSeqIndexBits);

inline uint64_t Seq(uint64_t commit_ts, uint32_t index) {
  return (commit_ts << kSeqIndexBits) | index;
}

// The queued form of a value: "\x01" + bytes, or "\x00" for a deletion.
inline std::string ExportValue(const std::optional<std::string>& value) {
  if (!value) return std::string(1, '\0');
  std::string out(1, '\1');
  out.append(*value);
  return out;
}

struct ExportEntry {
  std::string key;
  std::string value;
  uint64_t seq = 0;
};

// `store`: the identity and epoch of the store the entries come from
// (identity.h), read in the run's snapshot; an empty id when it has none.
using ExportFn =
    std::function<Status(const std::vector<ExportEntry>& entries, const StoreIdentity& store)>;

struct ExportQueueOptions {
  std::string id;
  uint32_t buckets = 64;
  size_t batch_size = 1024;
  ExportFn exporter;
  double linger_seconds = 0;  // 0 to 3600 (see Lingering above)
  // Failed runs of a bucket before its poison keys are parked (see At least
  // once above); 0 never parks.
  uint32_t max_attempts = kDefaultMaxAttempts;
};

// Native sinks: a built-in sink whose batches the queue's exporter can
// apply itself, from the queued bytes and without Python, when the keys and
// values have fixed encodings. The exporter object stays the authority: it
// creates the tables, records the owner and reports every error its way, so
// whatever the native path is not sure to do exactly as it would (a sink not
// set up yet, an owner to adopt or refuse, a cell it would refuse) goes to
// it instead.
class NativeSink {
 public:
  virtual ~NativeSink() = default;
  // The outcome of applying `entries` (by key, then seq, as the exporter
  // gets them), or nullopt, with nothing written, when the exporter must
  // take this batch. Safe to call from several threads at once.
  virtual std::optional<Status> Deliver(const std::vector<ExportEntry>& entries,
                                        const StoreIdentity& store) = 0;
  // Every later Deliver() returns nullopt (the exporter was closed).
  virtual void Close() = 0;
  // Batches applied natively, and batches handed back (nullopt).
  virtual std::pair<uint64_t, uint64_t> Counters() const = 0;
};

// How a queued key or value maps to columns: one cell of all its bytes
// (kText, kBlob), or cells of 8 bytes each, big-endian (kInt64, kFloat64).
enum class SinkCell { kText, kBlob, kInt64, kFloat64 };

// An SQLite sink (the Python exporter percolite.exporters.SQLite). Every
// statement is the exporter's SQL; parameters are the key cells, then as
// named.
struct SqliteSinkOptions {
  // A loaded shared object (Python's _sqlite3 module) that SQLite's
  // functions are looked up through: the sink must use the very library
  // the exporter uses, since a second copy's POSIX locks would not see the
  // first one's (the SQLite documentation's "How To Corrupt").
  std::string library;
  std::string path;             // the database file, made and switched to WAL by the exporter
  std::string name;             // the sink, in messages
  double timeout_seconds = 30;  // the busy timeout
  std::vector<SinkCell> key_cells, value_cells;
  std::string select_owner;  // -> store, epoch
  std::string any_guard;     // -> a row when the guard table has one
  std::string upsert;        // keys, values, seq: inserts, or updates a row of a smaller seq
  std::string guard_seq;     // keys -> seq of the key's guard row
  std::string clear_guard;   // keys: deletes the key's guard row
  std::string row_seq;       // keys -> seq of the key's row
  std::string delete_row;    // keys: deletes the key's row
  std::string raise_guard;   // keys, seq: inserts the guard row or raises its seq
};

// Throws kInvalidArgument saying why when SQLite's functions cannot be
// found through options.library (an SQLite linked in statically, its
// symbols hidden) or the options are inconsistent.
std::shared_ptr<NativeSink> MakeSqliteSink(SqliteSinkOptions options);

// A PostgreSQL sink (the Python exporter percolite.exporters.Postgres),
// reached through libpq. A batch is one transaction of two statements, the
// exporter's SQL: `raise` raises the guard rows, `write` writes the rows of
// the keys whose guard holds the batch's seq. Both take the same
// parameters: $1 the store's id (text) and $2 its epoch (int8), then one
// array per key cell and one per value cell (NULL items for deletions), the
// seqs (int8[]) and whether each key has a value (bool[]), one item per
// key, in the order the exporter takes keys in (so that concurrent batches
// lock guard rows in one order).
struct PostgresSinkOptions {
  // libpq keywords and values, in order: the first is dbname, the
  // exporter's DSN (expanded by libpq), then what the DSN leaves out.
  std::vector<std::pair<std::string, std::string>> connect;
  std::string name;  // the sink, in messages (no password in it)
  std::vector<SinkCell> key_cells, value_cells;
  // -> one row: whether it raised the guards (the sink belongs to the
  // batch's store and epoch, and the key columns fit), the seqs whose
  // guard rose (int8[], NULL for none), and whether the tables' key
  // columns compare exactly with the cells.
  std::string raise;
  std::string raise_unowned;  // the same for entries of no store
  std::string write;          // writes the rows of the entries whose guard rose
};

// Throws kInvalidArgument when the options are inconsistent; connects at
// the first batch.
std::shared_ptr<NativeSink> MakePostgresSink(PostgresSinkOptions options);

class ExportQueue : public std::enable_shared_from_this<ExportQueue> {
 public:
  // Throws kInvalidArgument naming the bad option.
  static std::shared_ptr<ExportQueue> Create(ExportQueueOptions options);

  const ExportQueueOptions& options() const { return options_; }
  uint32_t BucketOf(std::string_view key) const;

  // Queues (key, value) in `transaction`. Throws kInvalidArgument (nothing
  // queued) when the transaction already holds 2^kSeqIndexBits stamped writes.
  void Add(Transaction& transaction, std::string_view key, std::string_view value) const;
  // Queues every (key, value) of `entries`, all or nothing: throws
  // kInvalidArgument, queuing none, when they would take the transaction past
  // 2^kSeqIndexBits stamped writes.
  void Add(Transaction& transaction,
           const std::vector<std::pair<std::string, std::string>>& entries) const;

  // The observer exporting one bucket; register it WEAK for NotifyColumn().
  ObservedColumn NotifyColumn() const;
  ObserverFn Processor() const;
  // Processor() as the workers run it, to register: on NotifyColumn(),
  // named "export queue <id>", retried without limit (the queue parks its
  // poison keys itself, after options().max_attempts, and an outage is
  // retried until the sink is back; parking the bucket's notification would
  // stop all its keys), waiting for each commit, its runs taking turns on
  // the sink NameSink names.
  Observer AsObserver() const;
  // Names the sink the exporter writes when it takes one writer at a time
  // ("" for none; notifications.h, SinkTurn): the runs of queues naming the
  // same sink then take turns in each worker pool (workers.h, "Sinks").
  // May be called at any time, from any thread (the exporter's sink may be
  // chosen only when it is first called).
  void NameSink(std::string_view sink) const { sink_->Name(sink); }

  // Rows holding queued entries start with this prefix (for depth reports).
  std::string EntryRowPrefix() const { return options_.id + ":e:"; }

  // Batches this process's runs handed to the combiner (exporter), and the
  // entries in them (metrics: entries / batches is the fold size).
  std::pair<uint64_t, uint64_t> Counters() const { return {batches_.load(), entries_.load()}; }

 private:
  explicit ExportQueue(ExportQueueOptions options);
  Status Process(const std::shared_ptr<Transaction>& transaction, const Cell& cell) const;
  // Hands a run's entries to the exporter, by key then seq, with the store's identity.
  Status Export(const std::string& what, const std::vector<queue_rows::Entry>& queued,
                const StoreIdentity& store) const;

  const ExportQueueOptions options_;
  const std::string family_;  // "eq:<id>"
  const std::shared_ptr<queue_rows::Linger> linger_;
  const std::shared_ptr<SinkTurn> sink_ = std::make_shared<SinkTurn>();
  mutable std::atomic<uint64_t> batches_{0};
  mutable std::atomic<uint64_t> entries_{0};
};

}  // namespace percolite
