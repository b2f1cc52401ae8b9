// percolite/backend.h: the storage backend interface, the bottom layer.
//
// Everything above this header (transactions, notifications, workers, queues,
// Env) reaches storage only through Backend and Snapshot. A backend stores
// cells, notifications and the observed columns, validates and applies
// commits, and tells the layers above when a commit may have made work. It
// knows nothing of them: it calls up only through the NotificationSink it is
// handed and the callbacks of CommitAsync.
//
// Backends: "lmdb" (the default: a directory on disk, shared by every process
// that opens it), "memory" (one process, one private store per open; tests
// and deterministic simulation) and "postgresql" (a schema of a PostgreSQL
// database, shared by every process on every machine that opens it).
// open_backend.h names them and picks one from a target string.
//
// Thread safety: every method of Backend may be called from any thread at any
// time. A Snapshot is used by one thread at a time (its owner serialises
// access); it may move between threads. A WorkWatch is waited on by one thread;
// Interrupt may be called from any thread.
//
// Contract a backend must meet (the conformance tests in tests/cpp and
// tests/python run every backend against it)
// - Timestamps: one counter per store. BeginSnapshot returns a snapshot whose
//   start_ts is the counter's value: it sees every commit with commit_ts <=
//   start_ts and nothing later, for its whole life, whatever commits meanwhile.
// - Reads: Get, and ordered range walks (Visit) over encoded cell keys
//   (encoding.h), in byte order. Deleted cells are invisible.
// - Commit(start_ts, mutations, extras) applies all of the mutations
//   atomically with a fresh commit_ts, or none of them. Every committed
//   transaction gets a unique commit_ts, larger than every earlier one.
//   It fails with kConflict, naming the first conflicting cell, when a set or
//   deleted cell carries a commit_ts greater than start_ts (first committer
//   wins; write-write conflicts per cell; reads never conflict: plain snapshot
//   isolation). A delete leaves a tombstone, so a writer whose snapshot
//   predates it still conflicts; tombstones may be collected once no snapshot
//   that predates them is open.
// - Stamped writes (Mutation::stamped) are never validated and never
//   conflict: they land on StampedKey(key, commit_ts, stamp_seq), a key unique
//   to the transaction. Purges (Mutation::purge) remove one cell, or every cell
//   in [key, purge_end) (tombstones included), without a tombstone and without
//   validation; range purges apply before the other mutations of their commit.
//   Snapshots that predate a purge still see the purged cells.
// - Joinable stamped writes (Mutation::joinable) hold a packed record (below).
//   A backend that commits several transactions in one write may store the
//   joinable writes of those commits to one key as one record, under the
//   stamp of the first: its entries followed by the later ones', in commit
//   order, while the record stays within kPackedMaxEntries entries and
//   kPackedMaxBytes bytes (JoinPacked). The commits of one write become
//   visible together, so no snapshot tells the two apart; the store then
//   keeps fewer records than transactions (a combine queue's hot bucket).
// - Notifications: a commit that sets (not deletes) a strongly observed column
//   (SetObservedColumns) writes a notification for that cell stamped with its
//   commit_ts; each of extras->weak_notifications likewise. A commit with
//   extras->trigger (an observer run) fails with kConflict when the trigger's
//   ack was written after start_ts (another run committed first); otherwise it
//   writes the ack and removes the notification unless the notification's
//   stamp is greater than start_ts (set again after the run began: it
//   survives). A notification is removed only that way.
// - After a commit that wrote notifications, the backend hands them to the
//   NotificationSink set by this process (if any), before the committer's
//   Commit returns or its callback runs.
// - Durability: with SyncMode::kFull a commit is reported (and visible to
//   other snapshots) only once it is durable, for backends whose capabilities
//   say `durable`; group commit, if any, is the backend's own business.
// - CommitAsync calls `done` exactly once, on a thread of the backend's or on
//   the caller's own thread before it returns. `done` must not block: it may
//   submit more commits, never wait for one. Commit is a wait on the same
//   path (a backend may run it on the caller's thread).
// - WatchForWork: Wait returns soon after any commit of any process that
//   shares the store, when SignalWaiting is called by a process that waits for
//   workers, on Interrupt, or at the timeout. It may return spuriously.
// - ForkedAway: in a child created by fork() after the backend was opened,
//   every call throws kWrongState and nothing of the parent's state is touched.
// - Damage is never served and never kills the process: a stored record that
//   fails its checksum is kCorruption naming the cell; a read that faults on
//   damaged storage is kCorruption, and the backend then refuses every call
//   until the store is opened again. A persistent store whose durable history
//   went back in time is refused at open (kCorruption) unless
//   options.restored says it was restored from a copy on purpose.
// - Close drains commits already submitted, then refuses new ones (kClosed).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "percolite/encoding.h"
#include "percolite/latency.h"
#include "percolite/status.h"

namespace percolite {

enum class SyncMode { kFull, kMeta, kNone };

struct BackendOptions {
  SyncMode sync = SyncMode::kFull;
  bool create = true;
  unsigned file_mode = 0600;                  // lmdb: for the data and lock files
  size_t initial_map_size = size_t{1} << 30;  // lmdb: grows by doubling when full
  unsigned max_readers = 2046;                // lmdb: one slot per open transaction
  size_t max_batch = 4096;                    // most commits in one group commit
  // lmdb: the data file was restored from a copy on purpose, so a store that
  // went back in time opens (and its durable mark starts again from it).
  bool restored = false;
};

// What a backend offers; the layers above ask instead of assuming.
struct BackendCapabilities {
  std::string name;            // "lmdb", "memory"
  bool persistent = false;     // data outlives the process
  bool cross_process = false;  // several processes may open one store at once
  bool durable = false;        // SyncMode::kFull commits survive a power cut
  size_t max_value_size = 0;   // largest value of one cell, in bytes
};

// One write of a transaction. `key` is an encoded cell key (encoding.h).
// A stamped write gets the transaction's commit_ts (8 bytes, big-endian) and
// stamp_seq (4 bytes) put in front of its qualifier (StampedKey): a key
// unique to the transaction, so stamped writes are never validated and never
// conflict (queue entries use them). Stamp first, a transaction's stamped
// writes to one row are adjacent and sort after every earlier commit's.
//
// A purge removes a cell that a stamped write created (a consumed queue
// entry): such keys are unique and never written again, so the purge is not
// validated and leaves no tombstone. Queues serialize their consumers by other
// writes (the bucket's cursor cell). A range purge (a non-empty purge_end)
// removes every stored cell whose encoded key k has key <= k < purge_end. Stamps
// are increasing, so a range that ends at the last entry a snapshot saw can
// never hold an entry committed after it.
struct Mutation {
  std::string key;
  bool is_delete = false;
  std::string value;
  bool stamped = false;
  uint32_t stamp_seq = 0;
  bool purge = false;
  std::string purge_end;
  bool joinable = false;  // stamped, and its value a packed record (see Commit's rules)
};

// A packed record: a version byte (kPackedVersion), the entry count (a
// varint, encoding.h), then the entries, each self-delimiting (the queues
// define their layout, queues/queue_rows.h). A writer starts a new record
// once one holds kPackedMaxEntries entries or kPackedMaxBytes bytes, so a
// record, and what a reader takes in one piece, stays small.
constexpr char kPackedVersion = 1;
constexpr size_t kPackedMaxEntries = 1024;
constexpr size_t kPackedMaxBytes = 256 * 1024;
void AppendPackedHeader(std::string* out, uint32_t count);
// The entry count in a packed record's header, and the header's size; false
// when the header does not decode.
bool PackedCount(std::string_view record, uint32_t* count, size_t* header_size = nullptr);
// Appends the entries of packed record `more` to packed record *record
// (counts added); false, with *record unchanged, when either header does
// not decode or the result would pass kPackedMaxEntries or kPackedMaxBytes.
bool JoinPacked(std::string* record, std::string_view more);

// The stamp put in front of a stamped write's qualifier: commit_ts (8 bytes)
// and stamp_seq (4 bytes), both big-endian.
constexpr size_t kStampSize = 12;

// The encoded key a stamped write lands on.
std::string StampedKey(std::string_view encoded_key, uint64_t commit_ts, uint32_t seq);

// Observed columns, as stored in the store so that every process committing
// to it creates the same notifications.
enum class NotifyKind : uint8_t { kStrong = 1, kWeak = 2 };

struct ObservedColumn {
  std::string family;
  std::string qualifier;
  NotifyKind kind = NotifyKind::kStrong;
  std::string observer;  // the observer's name, for status reports
};

std::string EncodeObservedColumns(const std::vector<ObservedColumn>& columns);
bool DecodeObservedColumns(std::string_view bytes, std::vector<ObservedColumn>* out);

// A pending notification, as found by ScanNotifications or handed over by a commit.
struct Notification {
  std::string cell_key;  // encoded cell key (encoding.h)
  uint64_t stamp = 0;    // commit_ts of the transaction that set it
  uint64_t row_hash = 0;
};

// Notifications are ordered by NotificationKey(row hash, cell key): the hash
// prefix spreads them, so a scan may start at a random point, and gives each
// of n worker processes the share hash % n == i.
uint64_t RowHash(std::string_view row);
std::string NotificationKey(uint64_t row_hash, std::string_view cell_key);

// What an observer run, or a transaction setting weak notifications, adds to
// its commit besides its mutations.
struct CommitExtras {
  std::vector<std::string> weak_notifications;  // encoded cell keys
  std::optional<std::string> trigger;           // the notification this run processes
};

struct CommitResult {
  Status status;
  uint64_t commit_ts = 0;
};
using CommitCallback = std::function<void(const CommitResult&)>;

struct BackendStats {
  uint64_t commits = 0;         // transactions committed through this backend object
  uint64_t conflicts = 0;       // commits refused with kConflict
  uint64_t batches = 0;         // write transactions of the store (group commits)
  uint64_t inline_batches = 0;  // of those, run by a committing thread itself
  uint64_t tombstones_collected = 0;
  uint64_t map_size = 0;  // lmdb: current size of the memory map in bytes
  uint64_t map_growths = 0;
  // Stores on a server (postgresql): the server the writer's connection
  // reached ("host:port"; empty for a local store), and the connections it
  // lost and made again. A reconnection that reached another host is a
  // failover (a promoted standby).
  std::string server;
  uint64_t reconnections = 0;
  std::string last_reconnection_cause;  // the error that lost the connection
  double last_reconnection_unix = 0;    // 0: none yet
  uint64_t failovers = 0;
  std::string last_failover;  // "old host:port -> new host:port"
  double last_failover_unix = 0;
  double clock_offset_seconds = 0;  // the server's clock minus this machine's
  // How long the batch the writer is committing has taken so far (0: none):
  // seconds on end mean a server that does not answer, or one waiting for a
  // synchronous standby that does not.
  double writer_busy_seconds = 0;
  // The server's replication, read at each connection of the writer:
  // "synchronous" (synchronous_standby_names is set: a commit waits for
  // standbys), "asynchronous" (standbys stream, commits do not wait for
  // them) or "none" (no standby connected); `standbys`, those connected.
  std::string replication;
  std::string synchronous_standby_names;
  uint64_t standbys = 0;
};

// Receives the notifications this process's commits wrote (the worker pool).
class NotificationSink {
 public:
  virtual ~NotificationSink() = default;
  // Called by the committing side after each commit that wrote notifications;
  // must not block on the backend.
  virtual void Offer(const std::vector<Notification>& notifications) = 0;
};

// Blocks a scanner until a commit may have made work.
class WorkWatch {
 public:
  // Why Wait returned; several may be set at once.
  enum Event : unsigned {
    kTimeout = 0,
    kCommitted = 1,     // a commit (of any process) may have written notifications
    kWaiterSignal = 2,  // a process without workers waits for the store to go idle
    kInterrupted = 4,   // Interrupt() was called
  };
  virtual ~WorkWatch() = default;
  virtual unsigned Wait(int timeout_ms) = 0;
  virtual void Interrupt() = 0;
};

// A consistent read view, held for its whole life.
class Snapshot {
 public:
  virtual ~Snapshot() = default;
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  uint64_t start_ts() const { return start_ts_; }

  // The value of the cell with this encoded key; nullopt if absent or deleted.
  virtual std::optional<std::string> Get(std::string_view encoded_key) = 0;
  // Get for a caller that must not wait (one holding the Python GIL), and
  // without copying: hands a live value to found(context, value), a view
  // valid only during that call, and returns kFound, or returns kAbsent.
  // Returns kWouldBlock, having read nothing, when the read would wait for a
  // lock or a server; the default, for backends that read over a network,
  // always does.
  enum class TryRead { kFound, kAbsent, kWouldBlock };
  using ValueView = void (*)(void* context, std::string_view value);
  virtual TryRead TryGet(std::string_view encoded_key, ValueView found, void* context);
  // Calls visit(key, value) for the live cells with from <= key (from < key
  // when `exclusive`) and key < end (no bound when `end` is empty), in key
  // order, with views valid only during the call, until it returns false.
  // Returns true when the range is exhausted. The visitor must not use this
  // snapshot or commit (the backend may hold a lock while it runs).
  using CellVisitor = std::function<bool(std::string_view key, std::string_view value)>;
  virtual bool Visit(std::string_view from, bool exclusive, std::string_view end,
                     const CellVisitor& visit) = 0;
  // The stamp of the pending notification of this cell in this snapshot.
  virtual std::optional<uint64_t> NotificationStamp(std::string_view cell_key) = 0;
  // Releases the view; later calls throw kClosed. Idempotent.
  virtual void Release() = 0;

  // Visit, copying at most `limit` cells into `out`; true when the range is exhausted.
  bool Scan(std::string_view from, bool exclusive, std::string_view end, size_t limit,
            std::vector<std::pair<std::string, std::string>>* out);
  // How many live cells Visit would visit in that range, at most `limit`.
  size_t Count(std::string_view from, bool exclusive, std::string_view end, size_t limit);

 protected:
  explicit Snapshot(uint64_t start_ts) : start_ts_(start_ts) {}

 private:
  const uint64_t start_ts_;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const BackendCapabilities& capabilities() const = 0;
  // Where the store is: the canonical directory for lmdb, ":memory:" for memory.
  virtual const std::string& location() const = 0;
  virtual const BackendOptions& options() const = 0;

  // Throws kClosed after Close(), kWrongState in a forked child.
  virtual void CheckUsable() const = 0;
  virtual bool ForkedAway() const = 0;

  virtual std::unique_ptr<Snapshot> BeginSnapshot() = 0;

  // Submits a commit (see the contract above); `done` receives the result.
  // `mutations` must be sorted by key without duplicates (range purges first).
  virtual void CommitAsync(uint64_t start_ts, std::vector<Mutation> mutations, CommitExtras extras,
                           CommitCallback done) = 0;
  // Commits and waits for the result. The default waits on CommitAsync.
  virtual CommitResult Commit(uint64_t start_ts, std::vector<Mutation> mutations,
                              CommitExtras extras);

  // The observed columns stored in the store, and replacing them.
  virtual std::vector<ObservedColumn> ObservedColumns() = 0;
  virtual void SetObservedColumns(const std::vector<ObservedColumn>& columns) = 0;

  // Pending notifications: how many; a chunk in NotificationKey order starting
  // after `after` (empty: from the start; any 8 bytes: a random point),
  // returning true when it reached the end; counts per column.
  virtual uint64_t PendingNotifications() = 0;
  virtual bool ScanNotifications(std::string_view after, size_t limit,
                                 std::vector<Notification>* out) = 0;
  virtual std::map<std::pair<std::string, std::string>, uint64_t> CountPendingByColumn() = 0;

  // The sink that receives this process's new notifications; at most one.
  // Throws kWrongState when another is set.
  virtual void SetNotificationSink(NotificationSink* sink) = 0;
  virtual void ClearNotificationSink(NotificationSink* sink) = 0;

  virtual std::unique_ptr<WorkWatch> WatchForWork() = 0;
  // Tells every process's WorkWatch that someone waits for the store to go
  // idle (best effort: false when the signal could not be sent).
  virtual bool SignalWaiting() = 0;

  virtual BackendStats Stats() const = 0;

  // The store's clock, in unix seconds: what worker leases are judged by, so
  // that processes on machines whose clocks disagree agree on which lease
  // lapsed. A local store's is this machine's clock; a store on a server
  // reads the server's (through its offset from this machine's clock,
  // measured on the writer's connection).
  virtual double NowUnix() const;

  // Stores on a server: sessions of this store (of any process: those with
  // this handle's application_name) whose commit waits for a synchronous
  // standby, and the longest such wait. Zeros for a local store.
  struct StandbyWaits {
    uint64_t sessions = 0;
    double longest_seconds = 0;
  };
  virtual StandbyWaits WaitingForStandbys() { return {}; }
  // How long this process's successful commits took, from the committer's
  // call to its result (queueing, group commit and sync included); recorded
  // by the transaction layer for every backend alike.
  LatencyHistogram& commit_latency() { return commit_latency_; }

  // Walks every table of the store and compares what it finds with the
  // store's own bookkeeping (lmdb: each table's recorded entry count, key
  // order, a search for every key, every checksum, and every page of the
  // file: each tree's pages and the free list, which must name only pages
  // no tree uses); returns the problems, empty when none were found, and
  // when there are some, records the store damaged (commits are refused
  // from then on, as after any damage a read finds).
  virtual std::vector<std::string> VerifyStructure() = 0;
  // The damage recorded for this store (by any handle or process, at any
  // time since its last restore) that makes it refuse commits; nullopt when none.
  virtual std::optional<std::string> DamagedMark() = 0;

  // Called once by each opener when it is done with the backend: a backend
  // shared by several openers (one lmdb store per path and process) closes
  // with its last handle.
  virtual void ReleaseHandle() = 0;
  // Drains submitted commits and closes. Idempotent.
  virtual void Close() = 0;

 private:
  LatencyHistogram commit_latency_;
};

}  // namespace percolite
