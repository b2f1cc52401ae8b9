// percolite/env.h: a handle on an open store, and the transactions begun from it.
//
// Thread safety: all methods may be called from any thread.
//
// Contract
// - Env::Open returns a new handle. Handles of one path in one process share
//   one Store (store.h); the Store closes when its last handle closes.
// - Begin() starts a Transaction (transaction.h) tied to this handle.
// - Close() marks the handle closed, aborts its transactions that are still
//   active (waiting for any commit already in flight to finish: close drains
//   in-flight work) and releases the Store. Every later call on the handle or
//   its transactions throws kClosed. Close is idempotent.
// - A handle used in a child created by fork() throws kWrongState; closing it
//   there only marks it closed.
// - SetObservers stores the observed columns in the store (so every process
//   creates the same notifications) and keeps the observer functions for
//   StartWorkers. It throws kWrongState while workers run.
// - StartWorkers runs a Workers pool (workers.h); StopWorkers stops it; Close
//   stops it first. WaitIdle works with or without workers in this process.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "percolite/store.h"
#include "percolite/workers.h"

namespace percolite {

class Transaction;

class Env : public std::enable_shared_from_this<Env> {
 public:
  static std::shared_ptr<Env> Open(const std::string& path, const StoreOptions& options);
  ~Env();
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  std::shared_ptr<Transaction> Begin();
  void Close();
  bool closed() const;
  const std::string& path() const { return path_; }

  void SetObservers(std::vector<Observer> observers);
  void StartWorkers(const WorkerOptions& options);
  void StopWorkers();
  bool WaitIdle(double timeout_seconds);
  WorkerStats GetWorkerStats() const;
  std::vector<ObservedColumn> ObservedColumns() const { return store()->ObservedColumns(); }

  // The shared store; throws kClosed once this handle is closed.
  std::shared_ptr<Store> store() const;
  StoreStats Stats() const;

 private:
  friend class Transaction;
  Env(std::string path, std::shared_ptr<Store> store);
  void Forget(Transaction* transaction);

  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<Store> store_;                               // GUARDED_BY(mu_); null once closed
  std::map<Transaction*, std::weak_ptr<Transaction>> active_;  // GUARDED_BY(mu_)
  std::vector<Observer> observers_;                            // GUARDED_BY(mu_)
  std::shared_ptr<Workers> workers_;                           // GUARDED_BY(mu_)
  std::shared_ptr<Workers> stopped_workers_;  // GUARDED_BY(mu_): counters stay visible
};

}  // namespace percolite
