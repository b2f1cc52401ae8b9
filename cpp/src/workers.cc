#include "percolite/workers.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>

#include "percolite/transaction.h"
#include "records.h"
#include "workers/lanes.h"

namespace percolite {
namespace {

thread_local std::mt19937_64 t_random{std::random_device{}()};
thread_local bool t_on_worker_thread = false;
// The stop flag of the pool whose worker this thread is (StopRequested).
thread_local const std::atomic<bool>* t_stop_flag = nullptr;

// Makes the calling thread count as a worker thread while it lives: the
// observers and callbacks it calls are refused what they are refused there.
class AsWorkerThread {
 public:
  AsWorkerThread() : before_(t_on_worker_thread) { t_on_worker_thread = true; }
  ~AsWorkerThread() { t_on_worker_thread = before_; }
  AsWorkerThread(const AsWorkerThread&) = delete;
  AsWorkerThread& operator=(const AsWorkerThread&) = delete;

 private:
  const bool before_;
};

std::chrono::steady_clock::time_point FromNow(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(seconds));
}

SinkFailure SinkFailureOf(ErrorCode code) {
  if (code == ErrorCode::kSinkUnavailable) return SinkFailure::kDown;
  if (code == ErrorCode::kSinkRefused) return SinkFailure::kRefused;
  return SinkFailure::kNone;
}

double Uniform(double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(t_random);
}

// One lane per observer, and one for notifications no observer here runs.
std::vector<std::shared_ptr<const SinkTurn>> SinksOf(const std::vector<Observer>& observers) {
  std::vector<std::shared_ptr<const SinkTurn>> sinks;
  sinks.reserve(observers.size() + 1);
  for (const Observer& o : observers) sinks.push_back(o.sink);
  sinks.emplace_back();
  return sinks;
}

}  // namespace

Workers::Workers(std::shared_ptr<TransactionSource> source, std::vector<Observer> observers,
                 const WorkerOptions& options)
    : source_(source),
      backend_(source->backend()),
      observers_(std::move(observers)),
      options_(options),
      ready_(std::make_unique<Lanes>(SinksOf(observers_))) {
  for (const Observer& o : observers_) {
    ObserverStats os;
    os.column = o.column;
    stats_.push_back(os);
  }
}

Workers::~Workers() { Stop(); }

bool Workers::Mine(uint64_t row_hash) const {
  if (options_.worker_count == 0) return !leases_ || leases_->Mine(row_hash);
  return options_.worker_count == 1 || row_hash % static_cast<uint64_t>(options_.worker_count) ==
                                           static_cast<uint64_t>(options_.worker_index);
}

void Workers::Start() {
  {
    MutexLock lock(&mu_);
    if (started_) throw Error(ErrorCode::kWrongState, "workers were already started");
    started_ = true;
  }
  if (options_.worker_count == 0 && backend_->capabilities().cross_process) {
    std::shared_ptr<TransactionSource> source = source_.lock();
    if (!source) throw Error(ErrorCode::kClosed, "the store was closed");
    LeaseOptions lease;
    lease.lease_seconds = options_.lease_seconds;
    lease.group = options_.lease_group;
    lease.threads = options_.threads;
    if (options_.on_lease_change) {
      // Called from Start() and the renewals, once leases_ is set.
      lease.on_change = [this](uint32_t partitions, size_t pools) {
        options_.on_lease_change(leases_->owner(), partitions, pools);
      };
    }
    leases_ = std::make_unique<Leases>(source, lease);
    leases_->Start();
  }
  watch_ = backend_->WatchForWork();
  backend_->SetNotificationSink(this);
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
  scanner_ = std::thread([this] { ScannerLoop(); });
}

void Workers::Stop() {
  {
    MutexLock lock(&mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
    stop_requested_ = true;
  }
  backend_->ClearNotificationSink(this);
  work_cv_.SignalAll();
  idle_cv_.SignalAll();
  if (watch_) watch_->Interrupt();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  if (scanner_.joinable()) scanner_.join();
  watch_.reset();
  // The commits the writer holds come back whatever happens to them (the
  // backend reports every one it took), and are settled here: counted, and
  // a failed one recorded, as a worker would.
  std::deque<Committed> committed;
  {
    MutexLock lock(&mu_);
    while (in_flight_ != 0) commit_cv_.Wait(&mu_);
    committed.swap(committed_);
  }
  {
    // Settling may call on_failure: the callbacks' thread rules hold here too.
    AsWorkerThread as_worker;
    for (Committed& c : committed) SettleCommitted(c.run, c.result);
  }
  if (leases_) leases_->Stop();  // others take over at once
  MutexLock lock(&mu_);
  entries_.clear();
  ready_->Clear();
  delayed_.clear();
  deferred_count_ = 0;
  hurried_ready_ = 0;
}

Workers::Enqueued Workers::EnqueueLocked(const Notification& notification) {
  auto it = entries_.find(notification.cell_key);
  if (it != entries_.end()) {
    Entry& entry = it->second;
    if (notification.stamp <= entry.notification.stamp) {
      return entry.running ? Enqueued::kRunning : Enqueued::kHeld;
    }
    entry.notification.stamp = notification.stamp;
    if (entry.running) entry.again = true;
    return Enqueued::kNew;
  }
  if (entries_.size() >= options_.queue_capacity) return Enqueued::kHeld;  // found later
  Entry entry{notification};
  Cell cell;
  if (!DecodeCellKey(notification.cell_key, &cell) || Find(cell, &entry.lane) == nullptr) {
    entry.lane = observers_.size();
  }
  const size_t lane = entry.lane;
  entries_.emplace(notification.cell_key, std::move(entry));
  ready_->Push(lane, notification.cell_key);
  work_cv_.Signal();
  // One no observer here runs is only taken off the queue: not new work.
  return lane < observers_.size() ? Enqueued::kNew : Enqueued::kHeld;
}

void Workers::Offer(const std::vector<Notification>& notifications) {
  MutexLock lock(&mu_);
  if (stopping_) return;
  for (const Notification& n : notifications) {
    if (Mine(n.row_hash)) EnqueueLocked(n);
  }
}

const Observer* Workers::Find(const Cell& cell, size_t* index) const {
  for (size_t i = 0; i < observers_.size(); ++i) {
    const ObservedColumn& c = observers_[i].column;
    if (c.family == cell.family && c.qualifier == cell.qualifier) {
      *index = i;
      return &observers_[i];
    }
  }
  return nullptr;
}

BegunRun Workers::BeginRun(const Notification& notification, bool hurried, bool fail) {
  BegunRun run = BeginRunUncounted(notification, hurried, fail);
  if (run.outcome != RunOutcome::kReady) Count(run);
  return run;
}

BegunRun Workers::BeginRunUncounted(const Notification& notification, bool hurried, bool fail) {
  BegunRun run;
  run.notification = notification;
  const Observer* observer = nullptr;
  if (DecodeCellKey(notification.cell_key, &run.cell))
    observer = Find(run.cell, &run.observer_index);
  if (observer == nullptr) {
    run.outcome = RunOutcome::kNoObserver;
    return run;
  }
  run.observer = observer->column.observer;
  std::shared_ptr<TransactionSource> source = source_.lock();
  if (!source) {
    run.outcome = RunOutcome::kGone;
    return run;
  }
  try {
    run.transaction = source->Begin();
    if (!run.transaction->NotificationPending(notification.cell_key)) {
      run.transaction->Abort();
      run.transaction.reset();
      run.outcome = RunOutcome::kGone;
      return run;
    }
    run.transaction->SetTrigger(notification.cell_key);
    const std::optional<WorkRecord> record =
        ReadWorkRecord(*run.transaction, notification.cell_key);
    if (record && record->parked) {
      run.transaction->Commit();  // consumes the notification; the work stays parked
      run.transaction.reset();
      run.outcome = RunOutcome::kSkippedParked;
      return run;
    }
    if (hurried) run.transaction->SetHurried();
    const Status status = CallObserver(*observer, &run, fail);
    if (!status.ok()) {
      run.transaction->Abort();
      run.transaction.reset();
      if (status.code() == ErrorCode::kClosed) {  // closing, or stopped (StopRequested)
        run.outcome = RunOutcome::kGone;
        return run;
      }
      run.error = status.message();
      run.sink = SinkFailureOf(status.code());
      run.outcome = RecordFailed(*source, *observer, &run);
      return run;
    }
    if (const double seconds = run.transaction->DeferredSeconds(); seconds > 0) {
      run.transaction->Abort();
      run.transaction.reset();
      run.deferred_seconds = seconds;
      run.outcome = RunOutcome::kDeferred;
      return run;
    }
    if (record) run.previous_failure = std::make_shared<const WorkRecord>(std::move(*record));
    run.outcome = RunOutcome::kReady;
  } catch (const Error& e) {
    Settle(*source, *observer, e, &run);
  }
  return run;
}

Status Workers::CallObserver(const Observer& observer, BegunRun* run, bool fail) {
  {
    MutexLock lock(&mu_);
    ++stats_[run->observer_index].runs;
    ++stats_[run->observer_index].running;
  }
  Status status;
  if (fail) {
    status = Status::Make(ErrorCode::kCallback, "a failure injected by the simulation");
  } else {
    try {
      // Keys a queue's run parks are counted and reported like failures,
      // once committed.
      ParkReporter reporter([this, index = run->observer_index, parked = run->parked_keys,
                             records = run->parked_records](const WorkRecord& r) {
        ++*parked;
        {
          MutexLock lock(&mu_);
          ++stats_[index].parked;
        }
        if (options_.on_failure) records->push_back(r);  // reported by ReportParked
      });
      status = observer.fn(run->transaction, run->cell);
    } catch (const std::exception& e) {
      status = Status::Make(ErrorCode::kCallback, e.what());
    }
  }
  {
    MutexLock lock(&mu_);
    --stats_[run->observer_index].running;
  }
  return status;
}

RunOutcome Workers::FinishRun(BegunRun& run, bool conflict) {
  if (run.outcome != RunOutcome::kReady) return run.outcome;
  std::shared_ptr<TransactionSource> source = source_.lock();
  if (!source) {
    run.transaction->Abort();
    run.transaction.reset();
    return run.outcome = RunOutcome::kGone;
  }
  const Observer& observer = observers_[run.observer_index];
  try {
    if (conflict) throw Error(ErrorCode::kConflict, "a conflict injected by the simulation");
    if (run.previous_failure) ForgetWorkRecord(*run.transaction, run.notification.cell_key);
    run.writes = run.transaction->WriteCounts();
    run.transaction->Commit();
    run.transaction.reset();
    run.outcome = RunOutcome::kCommitted;
  } catch (const Error& e) {
    Settle(*source, observer, e, &run);
  }
  Count(run);
  ReportParked(run);
  ReportRecovered(run);
  return run.outcome;
}

void Workers::ReportRecovered(const BegunRun& run) {
  if (run.outcome != RunOutcome::kCommitted || !run.previous_failure || !options_.on_recovery ||
      run.observer_index >= observers_.size()) {
    return;
  }
  options_.on_recovery(observers_[run.observer_index].column, *run.previous_failure);
}

void Workers::ReportParked(BegunRun& run) {
  if (run.parked_records->empty() || run.observer_index >= observers_.size()) return;
  std::vector<WorkRecord> records;
  records.swap(*run.parked_records);
  for (const WorkRecord& record : records) {
    options_.on_failure(observers_[run.observer_index].column, record);
  }
}

void Workers::SubmitCommit(std::string key, BegunRun run) {
  {
    MutexLock lock(&mu_);
    while (in_flight_ >= kMaxCommitsInFlight) commit_cv_.Wait(&mu_);
    ++in_flight_;
  }
  std::shared_ptr<Transaction> transaction = std::move(run.transaction);
  run.writes = transaction->WriteCounts();
  auto committed = std::make_shared<Committed>(Committed{std::move(key), std::move(run), {}});
  // On whichever thread learns the result: the backend's writer, a thread
  // whose own commit leads a group commit (LMDB), or this one, inside
  // CommitAsync. So it only takes mu_: never a commit, never the GIL. A
  // commit, a conflict or a closed store is settled here, so a run's end
  // never waits for a free worker (every thread may be in a slow observer);
  // a failure to record, or parked keys to report, goes to a worker (both
  // may block or call back). It runs once, even if CommitAsync throws after
  // calling it.
  auto once = std::make_shared<std::atomic<bool>>(false);
  auto done = [this, committed, once](const CommitResult& result) {
    if (once->exchange(true)) return;
    BegunRun& run = committed->run;
    RunOutcome outcome = RunOutcome::kReady;  // kReady: for a worker to settle
    // Parked keys and recoveries are reported by a worker (they call back).
    if (run.parked_records->empty() && !(run.previous_failure && options_.on_recovery)) {
      if (result.status.ok()) {
        outcome = RunOutcome::kCommitted;
      } else if (result.status.code() == ErrorCode::kConflict) {
        outcome = RunOutcome::kConflict;
      } else if (result.status.code() == ErrorCode::kClosed) {
        outcome = RunOutcome::kGone;
      }
    }
    if (outcome != RunOutcome::kReady) {
      run.outcome = outcome;
      Count(run);
    }
    // Everything under the lock, the notifications too: once in_flight_
    // reaches 0, Stop may return and this pool be destroyed.
    MutexLock lock(&mu_);
    --in_flight_;
    if (outcome != RunOutcome::kReady) {
      AfterRunLocked(committed->key, outcome, run);
    } else {
      committed->result = result;
      committed_.push_back(std::move(*committed));
    }
    if (waiters_ > 0 || Clock::now() < external_hurry_until_) HurryLocked();
    // A worker looks again: at what is ready or came back, and at delayed_,
    // which may have a retry (a conflict) sooner than any worker waits for.
    work_cv_.Signal();
    if (IdleLocked()) idle_cv_.SignalAll();
    commit_cv_.SignalAll();
  };
  try {
    if (committed->run.previous_failure) {
      ForgetWorkRecord(*transaction, committed->run.notification.cell_key);
    }
    transaction->CommitAsync(done);
  } catch (const Error& e) {  // not submitted (the store closed): nothing was written
    transaction->Abort();
    done(CommitResult{e.ToStatus(), 0});
  } catch (const std::exception& e) {
    transaction->Abort();
    done(CommitResult{Status::Make(ErrorCode::kStorage, e.what()), 0});
  }
}

RunOutcome Workers::SettleCommitted(BegunRun& run, const CommitResult& result) {
  if (result.status.ok()) {
    run.outcome = RunOutcome::kCommitted;
  } else {
    std::shared_ptr<TransactionSource> source = source_.lock();
    try {
      result.status.ThrowIfError();
    } catch (const Error& e) {
      if (source) {
        Settle(*source, observers_[run.observer_index], e, &run);  // records a failure
      } else {
        run.outcome = RunOutcome::kGone;
      }
    }
  }
  Count(run);
  ReportParked(run);
  ReportRecovered(run);
  return run.outcome;
}

void Workers::Settle(TransactionSource& source, const Observer& observer, const Error& e,
                     BegunRun* run) {
  if (run->transaction) run->transaction->Abort();
  run->transaction.reset();
  if (e.code() == ErrorCode::kConflict) {
    run->outcome = RunOutcome::kConflict;
  } else if (e.code() == ErrorCode::kClosed) {
    run->outcome = RunOutcome::kGone;
  } else {
    run->error = e.what();
    run->sink = SinkFailureOf(e.code());
    run->outcome = RecordFailed(source, observer, run);
  }
}

void Workers::Count(const BegunRun& run) {
  if (run.observer_index >= observers_.size()) return;  // stats_ has one per observer
  MutexLock lock(&mu_);
  ObserverStats& stats = stats_[run.observer_index];
  switch (run.outcome) {
    case RunOutcome::kCommitted:
      ++stats.commits;
      for (const auto& [target, n] : run.writes) stats.writes[target] += n;
      break;
    case RunOutcome::kSkippedParked:
      ++stats.skipped_parked;
      break;
    case RunOutcome::kConflict:
      ++stats.conflicts;
      break;
    case RunOutcome::kDeferred:
      ++stats.deferrals;
      break;
    case RunOutcome::kParked:
      ++stats.parked;
      [[fallthrough]];
    case RunOutcome::kFailed:
      ++stats.failures;
      stats.last_error = run.error;
      stats.last_failure_unix = records::UnixNow();
      break;
    default:
      break;
  }
}

RunOutcome Workers::RunOne(const Notification& notification, bool hurried, BegunRun* run) {
  *run = BeginRun(notification, hurried, /*fail=*/false);
  return FinishRun(*run, /*conflict=*/false);
}

RunOutcome Workers::RecordFailed(TransactionSource& source, const Observer& observer,
                                 BegunRun* run) {
  WorkRecord record;
  try {
    record = RecordFailure(source, observer.column.observer, run->notification.cell_key,
                           DescribeFailure(run->error, FailureType(run->sink)),
                           observer.max_attempts, records::UnixNow(), run->sink);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kClosed) return RunOutcome::kGone;
    // The record could not be written (the store failed): retry the run as
    // if it were the first failure.
    run->attempts = 1;
    return RunOutcome::kFailed;
  }
  run->attempts = record.attempts;
  // No record when the work is no longer pending (a run elsewhere committed
  // it, or a commit settled after a lost connection did): nothing to report.
  if (record.cell_key.empty()) return RunOutcome::kFailed;
  if (options_.on_failure) options_.on_failure(observer.column, record);
  return record.parked ? RunOutcome::kParked : RunOutcome::kFailed;
}

bool Workers::OnWorkerThread() { return t_on_worker_thread; }

bool Workers::StopRequested() {
  return t_stop_flag != nullptr && t_stop_flag->load(std::memory_order_relaxed);
}

std::vector<Notification> Workers::Runnable() {
  std::vector<Notification> pending, runnable;
  backend_->ScanNotifications("", SIZE_MAX, &pending);
  for (Notification& n : pending) {
    Cell cell;
    size_t index;
    if (DecodeCellKey(n.cell_key, &cell) && Find(cell, &index) != nullptr) {
      runnable.push_back(std::move(n));
    }
  }
  return runnable;
}

RunHereSummary Workers::RunHere(const RunHereOptions& options) {
  {
    MutexLock lock(&mu_);
    if (started_) throw Error(ErrorCode::kWrongState, "RunHere: the pool runs threads");
  }
  // Observers running here are refused what they are refused on a worker.
  AsWorkerThread on_worker;
  RunHereSummary summary;
  for (;;) {
    const std::vector<Notification> runnable = Runnable();
    if (runnable.empty()) return summary;
    bool progressed = false;  // a pass where nothing ran or changed would repeat itself
    for (const Notification& notification : runnable) {
      if (summary.runs >= options.max_runs) {
        summary.stuck = true;
        summary.left_total = runnable.size();
        for (size_t i = 0; i < runnable.size() && summary.left.size() < RunHereSummary::kMaxLeft;
             ++i) {
          Cell cell;
          size_t index;
          if (DecodeCellKey(runnable[i].cell_key, &cell)) {
            const Observer* observer = Find(cell, &index);
            summary.left.emplace_back(std::move(cell), observer ? observer->column.observer : "");
          }
        }
        return summary;
      }
      BegunRun report;
      const RunOutcome outcome = RunOne(notification, /*hurried=*/true, &report);
      if (outcome == RunOutcome::kSkippedParked) progressed = true;
      if (outcome == RunOutcome::kGone || outcome == RunOutcome::kNoObserver ||
          outcome == RunOutcome::kSkippedParked) {
        continue;  // nothing ran
      }
      progressed = true;
      ++summary.runs;
      summary.commits += outcome == RunOutcome::kCommitted;
      summary.conflicts += outcome == RunOutcome::kConflict;
      summary.deferrals += outcome == RunOutcome::kDeferred;
      summary.parked += (outcome == RunOutcome::kParked) + report.parked_keys->load();
      if (outcome == RunOutcome::kFailed || outcome == RunOutcome::kParked) {
        ++summary.failures;
        if (options.stop_on_failure) {
          summary.failed = true;
          summary.error = report.error;
          return summary;
        }
      }
    }
    if (!progressed) return summary;
  }
}

void Workers::WorkerLoop() {
  pthread_setname_np(pthread_self(), "pc-worker");  // shown by top -H, perf, py-spy
  t_on_worker_thread = true;
  t_stop_flag = &stop_requested_;
  MutexLock lock(&mu_);
  for (;;) {
    if (stopping_) return;
    if (!committed_.empty()) {  // a commit came back: settle it first
      Committed committed = std::move(committed_.front());
      committed_.pop_front();
      ++active_;
      lock.Unlock();
      const RunOutcome outcome = SettleCommitted(committed.run, committed.result);
      lock.Lock();
      --active_;
      AfterRunLocked(committed.key, outcome, committed.run);
      if (ready_->CanTake()) work_cv_.Signal();
      if (IdleLocked()) idle_cv_.SignalAll();
      continue;
    }
    const auto now = Clock::now();
    ReleaseDueLocked(now);
    if (waiters_ > 0 || now < external_hurry_until_) HurryLocked();
    auto taken = ready_->Take();
    if (!taken) {  // nothing ready, or only runs waiting for their sink
      if (delayed_.empty()) {
        work_cv_.Wait(&mu_);
      } else {
        // A copy: WaitUntil reads the deadline again after waking, and
        // another worker may erase the node it lives in meanwhile.
        const Clock::time_point until = delayed_.begin()->first;
        work_cv_.WaitUntil(&mu_, until);
      }
      continue;
    }
    auto [lane, key] = std::move(*taken);
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.hurry_ready) {
      it->second.hurry_ready = false;
      --hurried_ready_;
    }
    if (it == entries_.end() || it->second.running) {
      ready_->Done(lane);
      continue;
    }
    it->second.running = true;
    it->second.again = false;
    const Notification notification = it->second.notification;
    const bool hurried = it->second.hurried;
    ++active_;
    lock.Unlock();

    BegunRun report = BeginRun(notification, hurried, /*fail=*/false);
    RunOutcome outcome = report.outcome;
    const bool submitted =
        outcome == RunOutcome::kReady && !observers_[report.observer_index].wait_for_commit;
    if (submitted) {
      SubmitCommit(key, std::move(report));  // the entry stays running until it is settled
    } else if (outcome == RunOutcome::kReady) {
      outcome = FinishRun(report, /*conflict=*/false);
    }

    lock.Lock();
    --active_;
    ready_->Done(lane);
    if (!submitted) AfterRunLocked(key, outcome, report);
    if (ready_->CanTake()) work_cv_.Signal();  // a run that waited for this sink
    if (IdleLocked()) idle_cv_.SignalAll();
  }
}

void Workers::ReleaseDueLocked(Clock::time_point now) {
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    auto delayed = entries_.find(delayed_.begin()->second);
    if (delayed != entries_.end()) {
      if (delayed->second.deferred) --deferred_count_;
      delayed->second.deferred = false;
      ready_->Push(delayed->second.lane, delayed->first);
    }
    delayed_.erase(delayed_.begin());
  }
}

bool Workers::IdleLocked() const {
  return active_ == 0 && ready_->empty() && in_flight_ == 0 && committed_.empty();
}

void Workers::AfterRunLocked(const std::string& key, RunOutcome outcome, const BegunRun& run) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  entry.running = false;
  switch (outcome) {
    case RunOutcome::kReady:  // settled before it gets here
    case RunOutcome::kCommitted:
    case RunOutcome::kGone:
    case RunOutcome::kParked:
    case RunOutcome::kSkippedParked:
      if (entry.again && !stopping_) {
        entry.attempts = 0;
        entry.hurried = false;
        ready_->Push(entry.lane, key);
      } else {
        entries_.erase(it);
      }
      break;
    case RunOutcome::kNoObserver:
      entries_.erase(it);  // left pending for an application that observes it
      break;
    case RunOutcome::kDeferred:
      if (stopping_) break;
      entry.attempts = 0;
      entry.deferred = !entry.hurried;  // a hurried run that defers again is not hurried twice
      if (entry.deferred) ++deferred_count_;
      delayed_.emplace(FromNow(run.deferred_seconds), key);
      break;
    case RunOutcome::kConflict: {
      ++entry.attempts;
      double delay = Uniform(0.001, 0.005) * std::min(entry.attempts, 10);
      delayed_.emplace(FromNow(delay), key);
      break;
    }
    case RunOutcome::kFailed: {
      entry.attempts = std::max(entry.attempts + 1, static_cast<int>(run.attempts));
      double delay =
          std::min(options_.retry_max_seconds, options_.retry_initial_seconds *
                                                   std::pow(2.0, std::min(entry.attempts - 1, 30)));
      delay *= Uniform(0.5, 1.0);
      delayed_.emplace(FromNow(delay), key);
      break;
    }
  }
}

void Workers::HurryLocked() {
  // Only when nothing is ready but runs hurried already, nothing runs and no
  // commit is out: other work, ready or going, may be what the deferred runs
  // are waiting to gather. The worker that ends the last run, or the thread
  // that learns of the last commit, calls this again.
  if (deferred_count_ == 0 || ready_->size() > hurried_ready_) return;
  if (active_ > 0 || in_flight_ > 0 || !committed_.empty()) return;
  bool any = false;
  for (auto it = delayed_.begin(); it != delayed_.end();) {
    auto entry = entries_.find(it->second);
    if (entry != entries_.end() && entry->second.deferred) {
      entry->second.deferred = false;
      entry->second.hurried = true;
      entry->second.hurry_ready = true;
      --deferred_count_;
      ++hurried_ready_;
      ready_->Push(entry->second.lane, entry->first);
      it = delayed_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  if (any) work_cv_.SignalAll();
}

bool Workers::WaitIdle(double timeout_seconds) {
  {
    MutexLock lock(&mu_);
    ++waiters_;
    HurryLocked();
  }
  struct Leave {
    Workers* self;
    ~Leave() {
      MutexLock lock(&self->mu_);
      --self->waiters_;
    }
  } leave{this};
  const auto deadline = timeout_seconds < 0 ? Clock::time_point::max() : FromNow(timeout_seconds);
  for (;;) {
    bool local_idle;
    {
      MutexLock lock(&mu_);
      local_idle = IdleLocked();
    }
    if (local_idle && backend_->PendingNotifications() == 0) return true;
    auto now = Clock::now();
    if (now >= deadline) return false;
    MutexLock lock(&mu_);
    idle_cv_.WaitFor(&mu_,
                     std::min<Clock::duration>(std::chrono::milliseconds(10), deadline - now));
  }
}

WorkerStats Workers::Stats() const {
  MutexLock lock(&mu_);
  WorkerStats s;
  s.running = started_ && !stopping_;
  s.threads = options_.threads;
  s.queued = static_cast<int>(ready_->size() + delayed_.size());
  s.active = active_;
  s.committing = static_cast<int>(in_flight_ + committed_.size());
  s.scans = scans_;
  s.observers = stats_;
  if (leases_) {
    s.lease_owner = leases_->owner();
    s.lease_partitions = leases_->Share();
    s.lease_changes = leases_->Changes();
  }
  return s;
}

}  // namespace percolite
