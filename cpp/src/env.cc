#include "percolite/env.h"

#include <pthread.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "percolite/mutex.h"
#include "percolite/open_backend.h"
#include "percolite/transaction.h"

namespace percolite {
namespace {

// Handles being closed by threads of their own (~Env on a worker thread).
// Never destroyed: such a thread may still run while statics are destroyed.
struct Closing {
  Mutex mu;
  CondVar done;
  size_t threads GUARDED_BY(mu) = 0;
};

Closing& Closers() {
  static Closing* closing = new Closing;
  static std::once_flag fork_handlers;
  std::call_once(fork_handlers, [] {
    // A child created by fork() has none of the parent's threads, so it
    // waits for none of them: it starts afresh (the parent's threads may
    // wait on `done`), leaving the parent's copy locked and unused.
    // (The analysis cannot follow a lock held across fork().)
    pthread_atfork([]() NO_THREAD_SAFETY_ANALYSIS { closing->mu.Lock(); },
                   []() NO_THREAD_SAFETY_ANALYSIS { closing->mu.Unlock(); },
                   [] { closing = new Closing; });
  });
  return *closing;
}

}  // namespace

std::shared_ptr<Env> Env::Open(const std::string& target, const BackendOptions& options,
                               const std::string& backend) {
  std::shared_ptr<Env> env(new Env(OpenBackend(target, backend, options)));
  if (options.restored) EnsureStoreIdentity(*env->transactions_, /*new_epoch=*/true);
  return env;
}

void Env::MakeIdentity() {
  if (identity_made_) return;
  try {
    EnsureStoreIdentity(*transactions_, /*new_epoch=*/false);
    identity_made_ = true;
  } catch (const Error&) {
    // A store that refuses commits (damaged, a full disk) commits no run
    // either; it makes its identity once it can commit again.
  }
}

std::optional<StoreIdentity> Env::Identity() {
  std::shared_ptr<Transaction> transaction = Begin();
  std::optional<StoreIdentity> identity = ReadStoreIdentity(*transaction);
  transaction->Abort();
  return identity;
}

Env::Env(std::shared_ptr<Backend> backend)
    : path_(backend->location()),
      capabilities_(backend->capabilities()),
      transactions_(std::make_shared<TransactionSource>(std::move(backend))) {}

Env::~Env() {
  if (!Workers::OnWorkerThread()) {
    Close();
    return;
  }
  // Destroyed on a worker thread: its last reference was dropped inside an
  // observer, or Python's garbage collector freed it there. That thread
  // cannot wait for a worker pool (it may belong to this one), so a thread of
  // its own stops the pool and closes the handle.
  std::shared_ptr<Workers> workers;
  {
    MutexLock lock(&mu_);
    workers = std::move(workers_);
  }
  if (workers && workers->ForkedAway()) {
    new std::shared_ptr<Workers>(std::move(workers));  // the parent's threads: never join them
  }
  Closing& closing = Closers();
  {
    MutexLock lock(&closing.mu);
    ++closing.threads;
  }
  std::thread([&closing, workers = std::move(workers), transactions = transactions_]() mutable {
    if (workers) workers->Stop();
    if (std::shared_ptr<Backend> backend = transactions->Close()) backend->ReleaseHandle();
    // Dropped before WaitForClosing may return: the pool holds the
    // observers' callables, which a language runtime must release while
    // it still runs (Python kills a thread that takes the GIL while it
    // finalizes).
    workers.reset();
    transactions.reset();
    MutexLock lock(&closing.mu);
    if (--closing.threads == 0) closing.done.SignalAll();
  }).detach();
}

bool Env::closed() const { return transactions_->closed(); }

BackendStats Env::Stats() const { return backend()->Stats(); }

Backend::StandbyWaits Env::WaitingForStandbys() { return backend()->WaitingForStandbys(); }

std::shared_ptr<Transaction> Env::Begin() { return transactions_->Begin(); }

void Env::SetObservers(std::vector<Observer> observers) {
  std::shared_ptr<Backend> store = backend();
  std::vector<ObservedColumn> columns;
  for (const Observer& o : observers) columns.push_back(o.column);
  MutexLock lock(&mu_);
  if (workers_) throw Error(ErrorCode::kWrongState, "observers cannot change while workers run");
  store->SetObservedColumns(columns);
  observers_ = std::move(observers);
  step_workers_.reset();  // it runs the observers it was made with
}

void Env::StartWorkers(const WorkerOptions& options) {
  if (options.threads < 1) throw Error(ErrorCode::kInvalidArgument, "threads must be >= 1");
  if (options.worker_count < 0 || options.worker_index < 0 ||
      (options.worker_count > 0 && options.worker_index >= options.worker_count) ||
      (options.worker_count == 0 && options.worker_index != 0)) {
    throw Error(ErrorCode::kInvalidArgument,
                "worker_index must be in [0, worker_count) and worker_count >= 1, or both 0 "
                "(share by lease)");
  }
  backend();       // throws when closed
  MakeIdentity();  // before any export: a sink learns its store from it
  MutexLock starting(&start_stop_mu_);
  std::shared_ptr<Workers> workers;
  {
    MutexLock lock(&mu_);
    if (workers_) throw Error(ErrorCode::kWrongState, "workers are already running");
    workers = std::make_shared<Workers>(transactions_, observers_, options);
    workers_ = workers;
  }
  try {
    workers->Start();
  } catch (...) {
    MutexLock lock(&mu_);
    workers_.reset();
    throw;
  }
}

namespace {

void RefuseOnWorkerThread(const char* what) {
  if (Workers::OnWorkerThread()) {
    throw Error(ErrorCode::kWrongState, std::string(what) +
                                            " cannot be called from inside an observer: a worker "
                                            "thread cannot wait for the worker pool it belongs to");
  }
}

}  // namespace

void Env::StopWorkers() {
  RefuseOnWorkerThread("stop_workers()");
  std::shared_ptr<Workers> workers;
  {
    // Only to take the pool, not while it stops: an observer Stop waits for
    // may call StartWorkers on this handle.
    MutexLock started(&start_stop_mu_);
    MutexLock lock(&mu_);
    workers = std::move(workers_);
    if (workers && workers->ForkedAway()) {
      // The parent's threads do not exist in a forked child: never join them.
      new std::shared_ptr<Workers>(std::move(workers));
      return;
    }
  }
  if (workers) workers->Stop();
  MutexLock lock(&mu_);
  if (workers) stopped_workers_ = workers;
}

std::shared_ptr<Workers> Env::StepWorkers() {
  MakeIdentity();
  backend();  // throws when closed
  MutexLock lock(&mu_);
  if (workers_) {
    throw Error(ErrorCode::kWrongState,
                "run_until_idle(): workers run on this handle; stop them first "
                "(stop_workers) or wait for them (wait)");
  }
  if (!step_workers_) {
    step_workers_ = std::make_shared<Workers>(transactions_, observers_, WorkerOptions{});
  }
  stopped_workers_ = step_workers_;  // its counters are the ones to show
  return step_workers_;
}

RunHereSummary Env::RunHere(const RunHereOptions& options) {
  RefuseOnWorkerThread("run_until_idle()");
  if (!run_here_mu_.TryLock()) {
    throw Error(ErrorCode::kWrongState,
                "run_until_idle(): it is already running on this handle in another thread; "
                "call it from one thread at a time");
  }
  try {
    RunHereSummary summary = StepWorkers()->RunHere(options);
    run_here_mu_.Unlock();
    return summary;
  } catch (...) {
    run_here_mu_.Unlock();
    throw;
  }
}

namespace {
// How often a wait without workers touches the signal file; well under
// Workers' kExternalHurry, so a waiting process keeps the others hurrying.
constexpr std::chrono::milliseconds kSignalEvery{100};
}  // namespace

bool Env::WaitIdle(double timeout_seconds) {
  RefuseOnWorkerThread("wait()");
  std::shared_ptr<Backend> store = backend();
  std::shared_ptr<Workers> workers;
  {
    MutexLock lock(&mu_);
    workers = workers_;
  }
  if (workers) return workers->WaitIdle(timeout_seconds);
  if (!capabilities_.cross_process) {
    // No other process can open this store: no one else will ever run its work.
    const uint64_t pending = store->PendingNotifications();
    if (pending == 0) return true;
    throw Error(ErrorCode::kWrongState,
                "wait(): " + std::to_string(pending) + " notification" +
                    (pending == 1 ? " is" : "s are") + " pending and no workers run on this " +
                    capabilities_.name +
                    " store, which no other process can open: start workers on this handle "
                    "(start_workers, or process() to run them until idle)");
  }
  // No workers here: others (other processes) do the work; poll the store,
  // and keep telling their pools that someone waits, so that they hurry
  // (workers.h) instead of lingering.
  const auto start = std::chrono::steady_clock::now();
  auto signalled = start - kSignalEvery;
  for (;;) {
    if (store->PendingNotifications() == 0) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now - signalled >= kSignalEvery) {
      store->SignalWaiting();
      signalled = now;
    }
    double elapsed = std::chrono::duration<double>(now - start).count();
    if (timeout_seconds >= 0 && elapsed >= timeout_seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

WorkerStats Env::GetWorkerStats() const {
  std::shared_ptr<Workers> workers;
  WorkerStats stats;
  {
    MutexLock lock(&mu_);
    workers = workers_ ? workers_ : stopped_workers_;
    if (!workers) {
      for (const Observer& o : observers_) {
        ObserverStats os;
        os.column = o.column;
        stats.observers.push_back(os);
      }
    }
  }
  if (workers) return workers->Stats();
  return stats;
}

std::vector<WorkRecord> Env::WorkRecords(bool parked_only) {
  std::shared_ptr<Transaction> transaction = Begin();
  std::vector<WorkRecord> records = ListWorkRecords(*transaction, parked_only);
  transaction->Abort();
  return records;
}

std::vector<FailureSummary> Env::FailureSummaries() {
  std::shared_ptr<Transaction> transaction = Begin();
  std::vector<FailureSummary> summaries = ListFailureSummaries(*transaction);
  transaction->Abort();
  return summaries;
}

std::vector<LeaseHolder> Env::LeaseHolders() {
  std::shared_ptr<Transaction> transaction = Begin();
  std::vector<LeaseHolder> holders = Leases::Holders(*transaction, backend()->NowUnix());
  transaction->Abort();
  return holders;
}

size_t Env::RetryParked(const std::function<bool(const WorkRecord&)>& match) {
  return percolite::RetryParked(*transactions_, match);
}

size_t Env::DropNotifications(const std::vector<std::pair<std::string, std::string>>& columns) {
  std::shared_ptr<Backend> store = backend();
  std::vector<std::string> keys;
  std::string after;
  for (bool done = false; !done;) {
    std::vector<Notification> chunk;
    done = store->ScanNotifications(after, 4096, &chunk);
    if (chunk.empty()) break;
    after = NotificationKey(chunk.back().row_hash, chunk.back().cell_key);
    Cell cell;
    for (const Notification& n : chunk) {
      if (!DecodeCellKey(n.cell_key, &cell)) continue;
      for (const auto& [family, qualifier] : columns) {
        if (cell.family == family && cell.qualifier == qualifier) {
          keys.push_back(n.cell_key);
          break;
        }
      }
    }
  }
  size_t dropped = 0;
  for (const std::string& key : keys) {
    for (int tries = 0;; ++tries) {
      std::shared_ptr<Transaction> transaction = Begin();
      try {
        if (!transaction->NotificationPending(key)) {
          transaction->Abort();
          break;
        }
        transaction->SetTrigger(key);
        transaction->Commit();
        ++dropped;
        break;
      } catch (const Error& e) {
        transaction->Abort();
        if (e.code() != ErrorCode::kConflict || tries >= 100) throw;
      }
    }
  }
  return dropped;
}

void Env::WaitForClosing() {
  RefuseOnWorkerThread("WaitForClosing()");
  Closing& closing = Closers();
  MutexLock lock(&closing.mu);
  while (closing.threads != 0) closing.done.Wait(&closing.mu);
}

void Env::Close() {
  RefuseOnWorkerThread("close()");
  StopWorkers();
  if (std::shared_ptr<Backend> backend = transactions_->Close()) backend->ReleaseHandle();
}

}  // namespace percolite
