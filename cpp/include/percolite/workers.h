// percolite/workers.h: observers and the worker pool that runs them.
//
// Thread safety: Start, Stop, WaitIdle and Stats may be called from any
// thread. Observer functions are called on worker threads, one notification
// per thread at a time; Env refuses StopWorkers, Close and WaitIdle from them
// (kWrongState), since a worker cannot wait for itself.
//
// Contract (notifications.h has the delivery rules)
// - Finding work: the process that commits a notification hands it straight
//   to its own workers (no scan latency). A scanner thread finds the rest
//   (other processes' commits, work left by a crash or a failure) by scanning
//   the pending notifications from a random point. Between scans it sleeps in
//   the backend's WorkWatch (backend.h), which wakes it when any process
//   commits, so an idle pool costs no CPU. While the workers are busy it
//   rescans at most every kBusyRescan, and after a scan that found only work
//   the pool already holds (a lingering queue bucket, a backlog handed over
//   by local commits) it waits longer, doubling up to kScanBackoffMax: such
//   a scan reads and looks up every notification for nothing. Work another
//   process commits is so found within kScanBackoffMax, or kBusyRescan while
//   other pools' work is pending, and at once while this pool has runs going
//   or nothing pending.
// - Scheduling: ready notifications wait in one FIFO per observer, and a free
//   thread serves the observer with the fewest runs going (ties: the one
//   served least recently). So one observer whose runs are slow or wait on
//   something (an exporter on its sink) cannot hold every thread while other
//   observers have work; alone, it gets them all.
// - Sinks: the runs of observers that name the same sink (Observer::sink,
//   notifications.h: an SQLite database, which takes one writer at a time)
//   take turns: while one of them runs, a free thread serves other
//   observers, or waits, rather than start another that would only wait
//   for the sink's write lock; when the run ends, the observer that waited
//   longest goes. Export queues name their exporter's sink (export_queue.h,
//   NameSink). A sink named while a run of it is going counts from the
//   pool's next choice. Turns are per pool: the pools of other processes go
//   on, and the sink's own lock keeps its writes in turn.
// - Sharing: by lease (WorkerOptions::worker_count 0), each pool takes the
//   partitions leases.h assigns to its lease, and takes over those of pools
//   whose lease lapsed; with worker_count n, pool `worker_index` takes the
//   notifications whose row hash is worker_index mod n. Duplicates across
//   processes are harmless: the ack cell lets at most one run of a
//   notification commit.
// - Committing: a worker hands its run's commit to the backend's group-commit
//   writer (Transaction::CommitAsync) and goes on with the next notification,
//   so observer runs are not bound by threads / commit latency (a queue's
//   processor, Observer::wait_for_commit, waits for its commit instead). The
//   notification stays held (not run again here) until the commit comes back
//   and is settled as below: at once when it committed, lost a conflict or
//   found the store closed (so it never waits for a free worker); by the next
//   free worker when a failure must be recorded or parked keys reported. At
//   most kMaxCommitsInFlight commits of a pool are out at once (past that a
//   worker waits for room). WaitIdle counts commits out as work; Stop waits
//   for them and settles them.
// - Before running, a worker checks in the run's own snapshot that the
//   notification is still pending; a notification another run already
//   removed is skipped, so a run never repeats work that committed.
// - An observer that fails (returns a non-ok Status, e.g. a Python exception)
//   has its transaction aborted; the failure is recorded in the store
//   (failures.h) and the notification stays and is retried with exponential
//   backoff (retry_initial_seconds doubling to retry_max_seconds, jittered,
//   from the attempts recorded in the store, so a restart does not reset
//   them). Once a notification's runs have failed Observer::max_attempts
//   times, its work is parked: the notification is consumed, the record
//   kept, and a later notification of the same cell is consumed without
//   running until the work is retried (RetryParked). A run that commits
//   deletes its notification's record. Failures are also counted per
//   observer in memory, with the last error text (Stats), and each recorded
//   failure is reported to WorkerOptions::on_failure.
//   A failure with status kSinkUnavailable (status.h) is an outage, not
//   an attempt: recorded as such (failures.h "Outages"), retried with the
//   same capped backoff for as long as it lasts, never parked; one with
//   kSinkRefused parks (blocks) the work at once. When a run
//   commits after failures, its record goes, and WorkerOptions::on_recovery
//   hears of it.
// - A run that loses a write-write conflict is retried after a short jittered
//   delay; it re-checks that the notification is still pending.
// - Deferring: a run that calls Transaction::DeferTrigger(seconds) and
//   returns ok is aborted (nothing it wrote commits), is counted as a
//   deferral, not a failure, and runs again after `seconds`; the
//   notification stays pending meanwhile, so WaitIdle waits for it. New
//   offers of the same notification do not bring the run forward.
// - Hurrying: while a thread waits in WaitIdle, a deferral never leaves the
//   pool idle: when nothing is ready to run but runs already hurried, the
//   runs that deferred themselves are brought forward, once each, and begin
//   with Transaction::Hurried() true, so a lingering queue (export_queue.h)
//   goes on with what it holds. While other work is ready, deferrals keep
//   their time (a queue still gathers what its upstream observers produce).
//   Runs going and commits still out count as such work: a queue waits for
//   what they add.
//   Retries of failures and conflicts keep their delays, and a hurried run
//   that defers again is deferred as asked. A wait in another process, one
//   without workers of its own (Env::WaitIdle), hurries this pool too: it
//   signals through the backend (Backend::SignalWaiting), and the pool
//   hurries as if a local thread waited until kExternalHurry after the last
//   signal its WorkWatch saw (best effort: where the backend cannot signal,
//   deferrals just keep their time).
// - Running here (RunHere, for tests): a pool that was not started can run
//   the pending work in the calling thread instead, one run at a time, with
//   no threads and no waiting: each pass scans every pending notification
//   and runs those with an observer in the order they are stored (the
//   notification table's key order, so the same store gives the same runs),
//   hurried (lingering queues go on with what they hold); it ends when a
//   pass finds nothing an observer runs. Retries of failures and conflicts,
//   and runs that defer themselves, come in the next pass: time is not
//   waited for but counted in passes. Failures are recorded and parked as
//   on worker threads.
// - WaitIdle returns true once the notify table is empty and no observer is
//   running in this pool and none of its commits is out; false when the
//   timeout elapses first.
// - Stop lets running observers finish, runs nothing new, joins threads, then
//   waits for the commits still out and settles them (failures recorded, on
//   the calling thread, which counts as a worker thread meanwhile). A run
//   that could go on for long between callbacks (a queue splitting a failing
//   batch, folding many keys) asks StopRequested() between them and, once
//   it is true, gives up with a kClosed status: nothing it wrote commits,
//   no failure is recorded, and its notification stays pending. So a stop
//   waits for at most the user callbacks already running.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "percolite/backend.h"
#include "percolite/failures.h"
#include "percolite/leases.h"
#include "percolite/mutex.h"
#include "percolite/notifications.h"
#include "percolite/status.h"
#include "percolite/transaction.h"

namespace percolite {

// Finding work: while the workers are busy, the scanner rescans at most this
// often; after scans that found only work the pool holds, it pauses from
// kBusyRescan doubling up to kScanBackoffMax.
constexpr std::chrono::milliseconds kBusyRescan{20};
constexpr std::chrono::milliseconds kScanBackoffMax{100};
// Committing: runs of one pool whose commits the writer may hold at once. A
// worker hands its run's commit over and takes the next notification, so
// observers go on while the writer applies and syncs a large batch (a
// combine queue's fold); past this many, a worker waits for room.
constexpr size_t kMaxCommitsInFlight = 256;
// Hurrying: how long after a signal of a wait in another process
// (Backend::SignalWaiting) a pool hurries as if a thread waited in it.
constexpr std::chrono::milliseconds kExternalHurry{1000};

struct WorkerOptions {
  int threads = 4;
  // Sharing: worker_count 0 shares the notifications by lease (leases.h)
  // with every other pool that does, on a store several processes can open
  // (on one that none can, the pool takes everything); worker_count n >= 1
  // takes the fixed share hash % n == worker_index.
  int worker_index = 0;
  int worker_count = 1;
  double lease_seconds = kDefaultLeaseSeconds;
  std::string lease_group;  // empty: a group of its own
  // Called when this pool's share by lease changes (LeaseOptions::on_change),
  // with its lease's owner id.
  std::function<void(const std::string& owner, uint32_t partitions, size_t pools)> on_lease_change;
  double retry_initial_seconds = 0.05;
  double retry_max_seconds = 2.0;
  size_t queue_capacity = 20000;  // notifications held in memory at once
  // Called on a worker thread after each failure is recorded (no lock held;
  // for commits settled by Stop, on the thread that stops the pool): the
  // observer's column and the record as written (parked or not).
  std::function<void(const ObservedColumn&, const WorkRecord&)> on_failure;
  // Called on a worker thread (as on_failure) when a run commits whose
  // notification had failed before: the record its commit deleted.
  std::function<void(const ObservedColumn&, const WorkRecord&)> on_recovery;
};

struct ObserverStats {
  ObservedColumn column;
  uint64_t runs = 0;            // observer calls
  uint64_t commits = 0;         // runs that committed
  uint64_t conflicts = 0;       // runs that lost a write-write conflict
  uint64_t failures = 0;        // runs that failed (raised)
  uint64_t deferrals = 0;       // runs that deferred themselves (Transaction::DeferTrigger)
  uint64_t parked = 0;          // notifications parked here (after their last failed attempt)
  uint64_t skipped_parked = 0;  // notifications of parked work consumed without a run
  int running = 0;
  std::string last_error;  // text of the last failure (the Python traceback)
  double last_failure_unix = 0;
  // What its committed runs wrote, by target (Transaction::WriteCounts):
  // the edges of the app's dataflow graph, learned from the runs.
  std::map<std::string, uint64_t> writes;
};

struct WorkerStats {
  bool running = false;
  int threads = 0;
  int queued = 0;  // in memory, ready or waiting for a retry
  int active = 0;  // observers running now
  // Runs whose commits are out (with the writer) or came back and wait to be
  // settled: their notifications stay held meanwhile.
  int committing = 0;
  uint64_t scans = 0;
  std::vector<ObserverStats> observers;
  std::string lease_owner;        // empty unless sharing by lease
  uint32_t lease_partitions = 0;  // of kLeasePartitions, in this pool's share
  uint64_t lease_changes = 0;     // times the share changed
};

struct RunHereOptions {
  uint64_t max_runs = 100000;   // more runs than this: stop with stuck set
  bool stop_on_failure = true;  // stop at the first failed run (failed set)
};

struct RunHereSummary {
  static constexpr size_t kMaxLeft = 10;  // pending cells `left` lists, at most

  uint64_t runs = 0;       // observer runs begun (queue runs included)
  uint64_t commits = 0;    // runs that committed
  uint64_t conflicts = 0;  // runs that lost a write-write conflict
  uint64_t failures = 0;   // runs that failed
  uint64_t parked = 0;     // work parked after its last attempt (queue keys included)
  uint64_t deferrals = 0;  // runs that deferred themselves
  bool failed = false;     // stopped at a failure (stop_on_failure)
  bool stuck = false;      // stopped at max_runs with work left
  std::string error;       // failed: the failure's text
  // stuck: the first kMaxLeft pending cells and their observers, and how
  // many were pending.
  std::vector<std::pair<Cell, std::string>> left;
  uint64_t left_total = 0;
};

// What a run came to (BeginRun, FinishRun).
enum class RunOutcome {
  kReady,          // begun: the observer ran; FinishRun commits it
  kCommitted,      // its transaction committed
  kGone,           // the notification was no longer pending (or the store closed)
  kConflict,       // it lost a write-write conflict; the notification stays
  kFailed,         // the observer failed; recorded, the notification stays
  kParked,         // it failed its last attempt; recorded and parked
  kSkippedParked,  // its work is parked: the notification was consumed unrun
  kDeferred,       // the run deferred itself (Transaction::DeferTrigger)
  kNoObserver,     // no observer of this pool observes the cell
};

// A run of one notification, begun by Workers::BeginRun. When kReady, its
// observer has run in `transaction`, which FinishRun commits; dropping it
// unfinished aborts the transaction (a process dying before its commit).
struct BegunRun {
  Notification notification;
  Cell cell;
  size_t observer_index = SIZE_MAX;  // in the pool's observers
  std::string observer;              // its name
  RunOutcome outcome = RunOutcome::kGone;
  std::shared_ptr<Transaction> transaction;  // kReady only
  // A failure record to delete on commit: the failures before this run.
  std::shared_ptr<const WorkRecord> previous_failure;
  std::string error;                      // kFailed, kParked: the failure's text
  SinkFailure sink = SinkFailure::kNone;  // kFailed, kParked: how the sink failed
  uint32_t attempts = 0;                  // kFailed: failed runs recorded in the store
  double deferred_seconds = 0;            // kDeferred
  // What the run's transaction wrote (Transaction::WriteCounts), taken
  // before it commits and counted once it has.
  std::vector<std::pair<std::string, uint64_t>> writes;
  // Queue keys the run parked, counted once its transaction commits, and
  // their records, reported to WorkerOptions::on_failure once the run is
  // settled, on the thread that settles it (never the backend's writer).
  std::shared_ptr<std::atomic<uint32_t>> parked_keys = std::make_shared<std::atomic<uint32_t>>(0);
  std::shared_ptr<std::vector<WorkRecord>> parked_records =
      std::make_shared<std::vector<WorkRecord>>();
};

class Lanes;        // the ready notifications, one FIFO per observer (workers/lanes.h)
struct ScanCounts;  // what a scan found (workers/scanner.h)

class Workers final : public NotificationSink {
 public:
  // Runs `observers` in transactions begun from `source`, on its backend.
  Workers(std::shared_ptr<TransactionSource> source, std::vector<Observer> observers,
          const WorkerOptions& options);
  ~Workers() override;
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  void Start() EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);
  bool WaitIdle(double timeout_seconds) EXCLUDES(mu_);
  // Runs what is pending in the calling thread (see "Running here"); throws
  // kWrongState on a started pool.
  RunHereSummary RunHere(const RunHereOptions& options) EXCLUDES(mu_);
  // One run in two steps, for a scheduler that holds several runs open at
  // once (a simulation): BeginRun checks the notification is pending and
  // runs its observer (with `fail`, the observer is not called and the run
  // fails as if it had raised); FinishRun commits a kReady run (with
  // `conflict`, it is aborted as if it had lost a conflict). Each settles
  // failures (recorded, parked) and counts the outcome as a worker thread
  // does. A worker thread's run is BeginRun then FinishRun.
  BegunRun BeginRun(const Notification& notification, bool hurried, bool fail) EXCLUDES(mu_);
  // The pending notifications an observer of this pool observes, in the
  // order the store keeps them.
  std::vector<Notification> Runnable();
  RunOutcome FinishRun(BegunRun& run, bool conflict) EXCLUDES(mu_);
  WorkerStats Stats() const EXCLUDES(mu_);

  // Called by the backend after a commit of this process: the notifications it wrote.
  void Offer(const std::vector<Notification>& notifications) override EXCLUDES(mu_);

  // True on a thread of any worker pool (an observer is running on it).
  static bool OnWorkerThread();
  // True on a worker thread of a pool that is stopping (see Stop above).
  static bool StopRequested();
  // True in a child forked after the pool started: its threads do not exist there.
  bool ForkedAway() const { return backend_->ForkedAway(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    Notification notification;
    size_t lane = 0;  // its observer's index in observers_ (observers_.size(): none)
    int attempts = 0;
    bool running = false;
    bool again = false;        // offered again while running
    bool deferred = false;     // in delayed_ because the run deferred itself
    bool hurried = false;      // brought forward by HurryLocked; not again
    bool hurry_ready = false;  // in ready_, put there by HurryLocked
  };

  bool Mine(uint64_t row_hash) const;
  // What EnqueueLocked made of a notification: new work (an entry an
  // observer here runs, or a raised stamp), an entry held and running, or
  // one held (waiting, or left for later when the queue is full).
  enum class Enqueued { kNew, kRunning, kHeld };
  // Only for a notification Mine(notification.row_hash).
  Enqueued EnqueueLocked(const Notification& notification) REQUIRES(mu_);
  void WorkerLoop() EXCLUDES(mu_);
  // Hands a kReady run's commit to the backend's writer (CommitAsync); its
  // result comes back through committed_.
  void SubmitCommit(std::string key, BegunRun run) EXCLUDES(mu_);
  // Settles a run whose commit came back (conflict, failure recorded),
  // counts it and reports its parked keys.
  RunOutcome SettleCommitted(BegunRun& run, const CommitResult& result) EXCLUDES(mu_);
  // What a settled run leaves of its entry (done, again, retried later,
  // deferred).
  void AfterRunLocked(const std::string& key, RunOutcome outcome, const BegunRun& run)
      REQUIRES(mu_);
  // Reports the queue keys a run parked (on_failure). Like on_recovery, a
  // callback that may call Stats: never under mu_.
  void ReportParked(BegunRun& run) EXCLUDES(mu_);
  // Reports a committed run that ended earlier failures (on_recovery).
  void ReportRecovered(const BegunRun& run) EXCLUDES(mu_);
  // The delayed runs (retries, deferrals) due by `now` become ready.
  void ReleaseDueLocked(Clock::time_point now) REQUIRES(mu_);
  // No run going, none ready, no commit in flight or unsettled.
  bool IdleLocked() const REQUIRES(mu_);
  // The scanner thread's loop and one scan of it, on from *position
  // (workers/scanner.cc).
  void ScannerLoop() EXCLUDES(mu_);
  ScanCounts ScanOnce(std::string* position) EXCLUDES(mu_);
  RunOutcome RunOne(const Notification& notification, bool hurried, BegunRun* run) EXCLUDES(mu_);
  BegunRun BeginRunUncounted(const Notification& notification, bool hurried, bool fail)
      EXCLUDES(mu_);
  // Calls the observer of a begun run in its transaction, counted as running
  // meanwhile: what it returned, or raised (or `fail` injected), as a status.
  Status CallObserver(const Observer& observer, BegunRun* run, bool fail) EXCLUDES(mu_);
  // Settles a run that threw `e`: conflict, gone, or a failure recorded.
  void Settle(TransactionSource& source, const Observer& observer, const Error& e, BegunRun* run)
      EXCLUDES(mu_);
  // Records a failed run in the store (failures.h): kFailed, or kParked
  // when it was the last attempt; kGone when the store closed meanwhile.
  // Its commit's callback takes mu_.
  RunOutcome RecordFailed(TransactionSource& source, const Observer& observer, BegunRun* run)
      EXCLUDES(mu_);
  // Adds a settled run's outcome to stats_.
  void Count(const BegunRun& run) EXCLUDES(mu_);
  // While a thread waits: when nothing but hurried runs is ready, deferred
  // runs not hurried before become ready now.
  void HurryLocked() REQUIRES(mu_);
  const Observer* Find(const Cell& cell, size_t* index) const;

  std::weak_ptr<TransactionSource> source_;
  std::shared_ptr<Backend> backend_;
  const std::vector<Observer> observers_;
  const WorkerOptions options_;

  mutable Mutex mu_;
  CondVar work_cv_;                                                        // workers wait here
  CondVar idle_cv_;                                                        // WaitIdle waits here
  std::unordered_map<std::string, Entry> entries_ GUARDED_BY(mu_);         // by cell key
  const std::unique_ptr<Lanes> ready_ PT_GUARDED_BY(mu_);                  // by observer
  std::multimap<Clock::time_point, std::string> delayed_ GUARDED_BY(mu_);  // retries, deferrals
  // Hurry as if a thread waited here until then: a wait in another process
  // touched the signal file (ScannerLoop).
  Clock::time_point external_hurry_until_ GUARDED_BY(mu_){};
  std::vector<ObserverStats> stats_ GUARDED_BY(mu_);  // one per observer, in observers_ order
  int active_ GUARDED_BY(mu_) = 0;
  int waiters_ GUARDED_BY(mu_) = 0;            // in WaitIdle
  size_t deferred_count_ GUARDED_BY(mu_) = 0;  // entries with `deferred`
  size_t hurried_ready_ GUARDED_BY(mu_) = 0;   // entries with `hurry_ready`
  bool stopping_ GUARDED_BY(mu_) = false;
  std::atomic<bool> stop_requested_{false};  // stopping_, for StopRequested() without mu_
  bool started_ GUARDED_BY(mu_) = false;
  uint64_t scans_ GUARDED_BY(mu_) = 0;
  // Runs whose commits the writer has (SubmitCommit): their entries stay
  // running until a worker settles what came back.
  struct Committed {
    std::string key;
    BegunRun run;
    CommitResult result;
  };
  size_t in_flight_ GUARDED_BY(mu_) = 0;             // submitted, not come back
  std::deque<Committed> committed_ GUARDED_BY(mu_);  // come back, not settled
  CondVar commit_cv_;  // a full pool's workers wait here for room; Stop, for none out

  std::unique_ptr<Leases> leases_;    // when sharing by lease
  std::unique_ptr<WorkWatch> watch_;  // the scanner sleeps in it; Stop interrupts it
  std::vector<std::thread> threads_;
  std::thread scanner_;
};

}  // namespace percolite
