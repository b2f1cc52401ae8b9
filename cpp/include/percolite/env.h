// percolite/env.h: a handle on an open store: its backend, the transactions
// begun from it, its observers and its worker pool.
//
// Thread safety: all methods may be called from any thread.
//
// Contract
// - Env::Open(target, backend, options) opens the backend OpenBackend
//   (backend.h) chooses and returns a new handle. Handles of one lmdb path in
//   one process share one backend, which closes when its last handle closes;
//   each ":memory:" handle has a private store of its own.
// - The store's identity (identity.h) is made when workers first start on
//   a store that has none (StartWorkers, StepWorkers, RunHere): every export
//   carries it. Open with options.restored starts the store's next epoch
//   (and makes the identity if need be). A store that cannot commit runs
//   without one until it can.
// - Begin() starts a Transaction (transaction.h) tied to this handle.
// - Close() marks the handle closed, aborts its transactions that are still
//   active (waiting for any commit already in flight to finish: close drains
//   in-flight work) and releases the backend. Every later call on the handle
//   or its transactions throws kClosed. Close is idempotent.
// - A handle used in a child created by fork() throws kWrongState; closing it
//   there only marks it closed.
// - SetObservers stores the observed columns in the store (so every process
//   creates the same notifications) and keeps the observer functions for
//   StartWorkers. It throws kWrongState while workers run.
// - StartWorkers runs a Workers pool (workers.h); StopWorkers stops it; Close
//   stops it first. StopWorkers (or Close) called while StartWorkers runs on
//   another thread waits for the pool to start, then stops it. WaitIdle
//   works with or without workers in this process: without them it polls the
//   store and signals the other processes' pools that someone waits
//   (Backend::SignalWaiting). On a store no other process can open
//   (capabilities().cross_process false), waiting without workers for
//   pending notifications throws kWrongState at once: it would never end.
// - StopWorkers, Close and WaitIdle called from an observer (a worker thread)
//   throw kWrongState: a worker cannot wait for its own pool.
// - RunHere runs the pending work in the calling thread, deterministically
//   (workers.h, "Running here"), for tests; not while workers run.
// - WorkRecords, FailureSummaries and RetryParked read and change the
//   failure records every process shares (failures.h).
// - DropNotifications consumes the pending notifications of columns no
//   observer will run any more (an app upgraded without them), which would
//   otherwise stay pending, and keep WaitIdle waiting, for ever.
// - An Env destroyed on a worker thread (its last reference dropped there) is
//   closed by a thread of its own instead, after the destructor returns: it
//   stops the pool (letting running observers finish), closes the handle and
//   drops the pool with its observers. WaitForClosing waits until every such
//   thread has done so. Call it before the runtime the observers call into
//   goes away (the Python package does, at interpreter exit) and before the
//   process exits: until then such a thread may run observers' last runs
//   and release their callables, and it uses statics that exit destroys.
//   Not from a worker thread (kWrongState): that thread's own pool may be
//   the one being stopped.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "percolite/backend.h"
#include "percolite/failures.h"
#include "percolite/identity.h"
#include "percolite/leases.h"
#include "percolite/mutex.h"
#include "percolite/notifications.h"
#include "percolite/transaction.h"
#include "percolite/workers.h"

namespace percolite {

class Env : public std::enable_shared_from_this<Env> {
 public:
  static std::shared_ptr<Env> Open(const std::string& target, const BackendOptions& options,
                                   const std::string& backend = "");
  ~Env();
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  // Blocks until every Env destroyed on a worker thread is closed (above).
  static void WaitForClosing();

  std::shared_ptr<Transaction> Begin();
  void Close() EXCLUDES(mu_, start_stop_mu_);
  bool closed() const;
  // The store's location: its canonical directory, or ":memory:".
  const std::string& path() const { return path_; }
  const BackendCapabilities& capabilities() const { return capabilities_; }

  void SetObservers(std::vector<Observer> observers) EXCLUDES(mu_);
  void StartWorkers(const WorkerOptions& options) EXCLUDES(mu_, start_stop_mu_);
  void StopWorkers() EXCLUDES(mu_, start_stop_mu_);
  bool WaitIdle(double timeout_seconds) EXCLUDES(mu_);
  // Runs the pending work in the calling thread until none is left
  // (Workers::RunHere); throws kWrongState while workers run or from an
  // observer. The counters join GetWorkerStats' until workers start.
  RunHereSummary RunHere(const RunHereOptions& options) EXCLUDES(mu_, run_here_mu_);
  // The pool RunHere runs in, not started, for a scheduler of this
  // process's own that runs work step by step (Workers::BeginRun); one per
  // handle, so its counters add up. Throws kWrongState while workers run.
  std::shared_ptr<Workers> StepWorkers() EXCLUDES(mu_);
  WorkerStats GetWorkerStats() const EXCLUDES(mu_);
  std::vector<ObservedColumn> ObservedColumns() const { return backend()->ObservedColumns(); }

  // The store's identity and epoch (identity.h), read now; none when the
  // store could not make it yet (it refused commits since it was created).
  std::optional<StoreIdentity> Identity();
  // Makes the store's identity when it has none (one commit, the first
  // time); a store that refuses commits is left without (no throw).
  // StartWorkers and StepWorkers call it first, so every export carries it.
  void MakeIdentity();

  // Failed and parked work recorded in the store (failures.h), read in a
  // fresh snapshot; RetryParked puts the parked work `match` accepts back.
  std::vector<WorkRecord> WorkRecords(bool parked_only);
  std::vector<FailureSummary> FailureSummaries();
  size_t RetryParked(const std::function<bool(const WorkRecord&)>& match);
  // Every worker lease recorded in the store (leases.h), read now.
  std::vector<LeaseHolder> LeaseHolders();

  // Consumes (as a run that commits would, notifications.h) every pending
  // notification of these (family, qualifier) columns, for an app that no
  // longer observes them; returns how many. One commit each.
  size_t DropNotifications(const std::vector<std::pair<std::string, std::string>>& columns);

  // The backend; throws kClosed once this handle is closed.
  std::shared_ptr<Backend> backend() const { return transactions_->backend(); }
  BackendStats Stats() const;
  // Backend::WaitingForStandbys of the store (a query on a server).
  Backend::StandbyWaits WaitingForStandbys();

 private:
  explicit Env(std::shared_ptr<Backend> backend);

  const std::string path_;
  const BackendCapabilities capabilities_;
  const std::shared_ptr<TransactionSource> transactions_;
  mutable Mutex mu_;
  std::vector<Observer> observers_ GUARDED_BY(mu_);
  std::shared_ptr<Workers> workers_ GUARDED_BY(mu_);
  std::shared_ptr<Workers> stopped_workers_ GUARDED_BY(mu_);  // counters stay visible
  std::shared_ptr<Workers> step_workers_ GUARDED_BY(mu_);     // StepWorkers
  Mutex run_here_mu_;                                         // held by the one RunHere running
  std::atomic<bool> identity_made_{false};                    // MakeIdentity succeeded
  // Held while StartWorkers starts a pool and while StopWorkers takes it, so
  // no pool is stopped while its threads are still being started.
  Mutex start_stop_mu_ ACQUIRED_BEFORE(mu_);
};

}  // namespace percolite
