#include "percolite/workers.h"

#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "percolite/transaction.h"

namespace percolite {
namespace {

constexpr size_t kScanBudget = 4096;
constexpr int kScanSafetyNetMs = 1000;  // rescan this often even without inotify events
// How long after a signal of a wait in another process (Backend::SignalWaiting)
// this pool hurries as if a thread waited here.
constexpr std::chrono::milliseconds kExternalHurry{1000};

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

thread_local std::mt19937_64 t_random{std::random_device{}()};
thread_local bool t_on_worker_thread = false;

double Uniform(double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(t_random);
}

}  // namespace

void Workers::Lanes::Push(size_t lane, std::string key) {
  queues_[lane].push_back(std::move(key));
  ++size_;
}

std::pair<size_t, std::string> Workers::Lanes::Take() {
  size_t best = queues_.size();
  for (size_t i = 0; i < queues_.size(); ++i) {
    const size_t lane = (next_ + i) % queues_.size();
    if (!queues_[lane].empty() && (best == queues_.size() || running_[lane] < running_[best])) {
      best = lane;
    }
  }
  next_ = (best + 1) % queues_.size();
  std::string key = std::move(queues_[best].front());
  queues_[best].pop_front();
  --size_;
  ++running_[best];
  return {best, std::move(key)};
}

void Workers::Lanes::Clear() {
  for (auto& queue : queues_) queue.clear();
  size_ = 0;
}

Workers::Workers(std::shared_ptr<TransactionSource> source, std::vector<Observer> observers,
                 const WorkerOptions& options)
    : source_(source),
      backend_(source->backend()),
      observers_(std::move(observers)),
      options_(options),
      ready_(observers_.size() + 1) {
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
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
  }
  backend_->ClearNotificationSink(this);
  work_cv_.notify_all();
  idle_cv_.notify_all();
  if (watch_) watch_->Interrupt();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  if (scanner_.joinable()) scanner_.join();
  watch_.reset();
  if (leases_) leases_->Stop();  // others take over at once
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  ready_.Clear();
  delayed_.clear();
  deferred_count_ = 0;
  hurried_ready_ = 0;
}

void Workers::EnqueueLocked(const Notification& notification) {
  if (!Mine(notification.row_hash)) return;
  auto it = entries_.find(notification.cell_key);
  if (it != entries_.end()) {
    Entry& entry = it->second;
    if (notification.stamp > entry.notification.stamp) {
      entry.notification.stamp = notification.stamp;
      if (entry.running) entry.again = true;
    }
    return;
  }
  if (entries_.size() >= options_.queue_capacity) return;  // the scanner finds it later
  Entry entry{notification};
  Cell cell;
  if (!DecodeCellKey(notification.cell_key, &cell) || Find(cell, &entry.lane) == nullptr) {
    entry.lane = observers_.size();
  }
  const size_t lane = entry.lane;
  entries_.emplace(notification.cell_key, std::move(entry));
  ready_.Push(lane, notification.cell_key);
  work_cv_.notify_one();
}

void Workers::Offer(const std::vector<Notification>& notifications) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  for (const Notification& n : notifications) EnqueueLocked(n);
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

Workers::Outcome Workers::RunOne(const Notification& notification, bool hurried,
                                 RunReport* report) {
  Cell cell;
  if (!DecodeCellKey(notification.cell_key, &cell)) return Outcome::kNoObserver;
  const Observer* observer = Find(cell, &report->observer_index);
  if (observer == nullptr) return Outcome::kNoObserver;
  std::shared_ptr<TransactionSource> source = source_.lock();
  if (!source) return Outcome::kGone;
  std::shared_ptr<Transaction> transaction;
  try {
    transaction = source->Begin();
    if (!transaction->NotificationPending(notification.cell_key)) {
      transaction->Abort();
      return Outcome::kGone;
    }
    transaction->SetTrigger(notification.cell_key);
    const std::optional<WorkRecord> record = ReadWorkRecord(*transaction, notification.cell_key);
    if (record && record->parked) {
      transaction->Commit();  // consumes the notification; the work stays parked
      return Outcome::kSkippedParked;
    }
    if (hurried) transaction->SetHurried();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_[report->observer_index].runs;
      ++stats_[report->observer_index].running;
    }
    Status status;
    try {
      // Keys a queue's run parks are reported like failures, once committed.
      ParkReporter reporter(options_.on_failure ? std::function<void(const WorkRecord&)>(
                                                      [this, observer](const WorkRecord& r) {
                                                        options_.on_failure(observer->column, r);
                                                      })
                                                : nullptr);
      status = observer->fn(transaction, cell);
    } catch (const std::exception& e) {
      status = Status::Make(ErrorCode::kCallback, e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --stats_[report->observer_index].running;
    }
    if (!status.ok()) {
      transaction->Abort();
      report->error = status.message();
      return RecordFailed(*source, notification, *observer, report);
    }
    if (const double seconds = transaction->DeferredSeconds(); seconds > 0) {
      transaction->Abort();
      report->deferred_seconds = seconds;
      return Outcome::kDeferred;
    }
    if (record) ForgetWorkRecord(*transaction, notification.cell_key);
    transaction->Commit();
    return Outcome::kCommitted;
  } catch (const Error& e) {
    if (transaction) transaction->Abort();
    if (e.code() == ErrorCode::kConflict) return Outcome::kConflict;
    if (e.code() == ErrorCode::kClosed) return Outcome::kGone;
    report->error = e.what();
    return RecordFailed(*source, notification, *observer, report);
  }
}

Workers::Outcome Workers::RecordFailed(TransactionSource& source, const Notification& notification,
                                       const Observer& observer, RunReport* report) {
  WorkRecord record;
  try {
    record = RecordFailure(source, observer.column.observer, notification.cell_key,
                           DescribeFailure(report->error), observer.max_attempts, UnixNow());
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kClosed) return Outcome::kGone;
    // The record could not be written (the store failed): retry the run as
    // if it were the first failure.
    report->attempts = 1;
    return Outcome::kFailed;
  }
  report->attempts = record.attempts;
  if (options_.on_failure) options_.on_failure(observer.column, record);
  return record.parked ? Outcome::kParked : Outcome::kFailed;
}

bool Workers::OnWorkerThread() { return t_on_worker_thread; }

RunHereSummary Workers::RunHere(const RunHereOptions& options) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_) throw Error(ErrorCode::kWrongState, "RunHere: the pool runs threads");
  }
  // Observers running here are refused what they are refused on a worker.
  struct OnWorker {
    bool before = t_on_worker_thread;
    OnWorker() { t_on_worker_thread = true; }
    ~OnWorker() { t_on_worker_thread = before; }
  } on_worker;
  RunHereSummary summary;
  for (;;) {
    std::vector<Notification> pending;
    backend_->ScanNotifications("", SIZE_MAX, &pending);
    std::vector<std::pair<Notification, Cell>> runnable;
    for (Notification& n : pending) {
      Cell cell;
      size_t index;
      if (DecodeCellKey(n.cell_key, &cell) && Find(cell, &index) != nullptr) {
        runnable.emplace_back(std::move(n), std::move(cell));
      }
    }
    if (runnable.empty()) return summary;
    bool progressed = false;  // a pass where nothing ran or changed would repeat itself
    for (const auto& [notification, cell] : runnable) {
      if (summary.runs >= options.max_runs) {
        summary.stuck = true;
        for (size_t i = 0; i < runnable.size() && i < 10; ++i) {
          summary.left.push_back(runnable[i].second);
        }
        return summary;
      }
      RunReport report;
      const Outcome outcome = RunOne(notification, /*hurried=*/true, &report);
      if (outcome == Outcome::kSkippedParked) progressed = true;
      if (outcome == Outcome::kGone || outcome == Outcome::kNoObserver ||
          outcome == Outcome::kSkippedParked) {
        continue;  // nothing ran
      }
      progressed = true;
      ++summary.runs;
      std::lock_guard<std::mutex> lock(mu_);
      ObserverStats& stats = stats_[report.observer_index];
      switch (outcome) {
        case Outcome::kCommitted:
          ++summary.commits;
          ++stats.commits;
          break;
        case Outcome::kConflict:
          ++summary.conflicts;
          ++stats.conflicts;
          break;
        case Outcome::kDeferred:
          ++summary.deferrals;
          ++stats.deferrals;
          break;
        case Outcome::kFailed:
        case Outcome::kParked:
          ++summary.failures;
          ++stats.failures;
          stats.last_error = report.error;
          stats.last_failure_unix = UnixNow();
          if (outcome == Outcome::kParked) {
            ++summary.parked;
            ++stats.parked;
          }
          if (options.stop_on_failure) {
            summary.failed = true;
            summary.error = report.error;
            return summary;
          }
          break;
        default:
          break;
      }
    }
    if (!progressed) return summary;
  }
}

void Workers::WorkerLoop() {
  pthread_setname_np(pthread_self(), "pc-worker");  // shown by top -H, perf, py-spy
  t_on_worker_thread = true;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stopping_) return;
    const auto now = Clock::now();
    while (!delayed_.empty() && delayed_.begin()->first <= now) {
      auto delayed = entries_.find(delayed_.begin()->second);
      if (delayed != entries_.end()) {
        if (delayed->second.deferred) --deferred_count_;
        delayed->second.deferred = false;
        ready_.Push(delayed->second.lane, delayed->first);
      }
      delayed_.erase(delayed_.begin());
    }
    if (waiters_ > 0 || now < external_hurry_until_) HurryLocked();
    if (ready_.empty()) {
      if (delayed_.empty()) {
        work_cv_.wait(lock);
      } else {
        // A copy: wait_until reads the deadline again after waking, and
        // another worker may erase the node it lives in meanwhile.
        const Clock::time_point until = delayed_.begin()->first;
        work_cv_.wait_until(lock, until);
      }
      continue;
    }
    auto [lane, key] = ready_.Take();
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.hurry_ready) {
      it->second.hurry_ready = false;
      --hurried_ready_;
    }
    if (it == entries_.end() || it->second.running) {
      ready_.Done(lane);
      continue;
    }
    it->second.running = true;
    it->second.again = false;
    const Notification notification = it->second.notification;
    const bool hurried = it->second.hurried;
    ++active_;
    lock.unlock();

    RunReport report;
    const Outcome outcome = RunOne(notification, hurried, &report);
    const size_t observer_index = report.observer_index;

    lock.lock();
    --active_;
    ready_.Done(lane);
    it = entries_.find(key);
    if (it != entries_.end()) {
      Entry& entry = it->second;
      entry.running = false;
      switch (outcome) {
        case Outcome::kCommitted:
        case Outcome::kGone:
        case Outcome::kParked:
        case Outcome::kSkippedParked:
          if (outcome == Outcome::kCommitted) ++stats_[observer_index].commits;
          if (outcome == Outcome::kSkippedParked) ++stats_[observer_index].skipped_parked;
          if (outcome == Outcome::kParked) {
            ObserverStats& s = stats_[observer_index];
            ++s.failures;
            ++s.parked;
            s.last_error = report.error;
            s.last_failure_unix = UnixNow();
          }
          if (entry.again && !stopping_) {
            entry.attempts = 0;
            entry.hurried = false;
            ready_.Push(entry.lane, key);
          } else {
            entries_.erase(it);
          }
          break;
        case Outcome::kNoObserver:
          entries_.erase(it);  // left pending for an application that observes it
          break;
        case Outcome::kDeferred:
          ++stats_[observer_index].deferrals;
          if (stopping_) break;
          entry.attempts = 0;
          entry.deferred = !entry.hurried;  // a hurried run that defers again is not hurried twice
          if (entry.deferred) ++deferred_count_;
          delayed_.emplace(
              Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(report.deferred_seconds)),
              key);
          break;
        case Outcome::kConflict: {
          ++stats_[observer_index].conflicts;
          ++entry.attempts;
          double delay = Uniform(0.001, 0.005) * std::min(entry.attempts, 10);
          delayed_.emplace(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(delay)),
                           key);
          break;
        }
        case Outcome::kFailed: {
          ObserverStats& s = stats_[observer_index == SIZE_MAX ? 0 : observer_index];
          ++s.failures;
          s.last_error = report.error;
          s.last_failure_unix = UnixNow();
          entry.attempts = std::max(entry.attempts + 1, static_cast<int>(report.attempts));
          double delay = std::min(
              options_.retry_max_seconds,
              options_.retry_initial_seconds * std::pow(2.0, std::min(entry.attempts - 1, 30)));
          delay *= Uniform(0.5, 1.0);
          delayed_.emplace(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(delay)),
                           key);
          break;
        }
      }
    }
    if (!ready_.empty()) work_cv_.notify_one();
    if (active_ == 0 && ready_.empty()) idle_cv_.notify_all();
  }
}

size_t Workers::ScanOnce(std::string* position) {
  size_t room;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || entries_.size() >= options_.queue_capacity) return 0;
    room = options_.queue_capacity - entries_.size();
    ++scans_;
  }
  const size_t budget = std::min(kScanBudget, room * 2);
  std::vector<Notification> found;
  bool reached_end = backend_->ScanNotifications(*position, budget, &found);
  if (reached_end && !position->empty() && found.size() < budget) {
    // Wrap around: the part before the random starting point.
    backend_->ScanNotifications("", budget - found.size(), &found);
    position->clear();
  } else if (!found.empty()) {
    *position = NotificationKey(found.back().row_hash, found.back().cell_key);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const Notification& n : found) EnqueueLocked(n);
  return found.size();
}

void Workers::ScannerLoop() {
  pthread_setname_np(pthread_self(), "pc-scanner");
  std::string position;
  AppendUint64BE(&position, t_random());  // start at a random point
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    try {
      if (leases_) leases_->Refresh();  // pools that joined or left, seen quickly
      ScanOnce(&position);
    } catch (const Error&) {
      // The store is closing, or a transient failure: the next wake retries.
    }
    const unsigned events = watch_->Wait(kScanSafetyNetMs);
    if (events & WorkWatch::kWaiterSignal) {
      std::lock_guard<std::mutex> lock(mu_);
      external_hurry_until_ = Clock::now() + kExternalHurry;
      HurryLocked();
    }
    // While the workers are busy, scanning on every commit is wasted work:
    // local commits are handed over directly. Rescan at most every 20 ms then.
    std::unique_lock<std::mutex> lock(mu_);
    if (!stopping_ && (!ready_.empty() || active_ >= options_.threads)) {
      idle_cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
}

void Workers::HurryLocked() {
  // Only when nothing is ready but runs hurried already: other ready work may
  // be what the deferred runs are waiting to gather.
  if (deferred_count_ == 0 || ready_.size() > hurried_ready_) return;
  bool any = false;
  for (auto it = delayed_.begin(); it != delayed_.end();) {
    auto entry = entries_.find(it->second);
    if (entry != entries_.end() && entry->second.deferred) {
      entry->second.deferred = false;
      entry->second.hurried = true;
      entry->second.hurry_ready = true;
      --deferred_count_;
      ++hurried_ready_;
      ready_.Push(entry->second.lane, entry->first);
      it = delayed_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  if (any) work_cv_.notify_all();
}

bool Workers::WaitIdle(double timeout_seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++waiters_;
    HurryLocked();
  }
  struct Leave {
    Workers* self;
    ~Leave() {
      std::lock_guard<std::mutex> lock(self->mu_);
      --self->waiters_;
    }
  } leave{this};
  const auto deadline = timeout_seconds < 0
                            ? Clock::time_point::max()
                            : Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(timeout_seconds));
  for (;;) {
    bool local_idle;
    {
      std::lock_guard<std::mutex> lock(mu_);
      local_idle = active_ == 0 && ready_.empty();
    }
    if (local_idle && backend_->PendingNotifications() == 0) return true;
    auto now = Clock::now();
    if (now >= deadline) return false;
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait_for(lock,
                      std::min<Clock::duration>(std::chrono::milliseconds(10), deadline - now));
  }
}

WorkerStats Workers::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerStats s;
  s.running = started_ && !stopping_;
  s.threads = options_.threads;
  s.queued = static_cast<int>(ready_.size() + delayed_.size());
  s.active = active_;
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
