// percolite/leases.h: worker leases recorded in the store, and the share of
// the notifications each live lease takes.
//
// Thread safety: Mine, Share and Holders may be called from any thread; Start
// and Stop from the thread that owns the Leases.
//
// Contract
// - A worker pool that shares work by lease holds one: a cell in percolite's
//   own rows (failures.h, kSystemRowPrefix) keyed by an owner id unique to
//   the pool (host, process, random), holding its expiry (unix seconds by
//   the store's clock, Backend::NowUnix: on a server, the server's, so that
//   machines whose clocks disagree agree on which lease lapsed), its group
//   (the pools started together by one command share one) and its threads.
//   A background thread renews it every lease_seconds / 3, in a transaction
//   that also reads every other lease; a lease whose expiry has passed is
//   dead, and leases dead for a minute are deleted.
// - Partitions: a notification's row hash picks one of kLeasePartitions
//   partitions (hash % kLeasePartitions). Each belongs to one live lease, by
//   rendezvous hashing: the live owner with the largest
//   StableHash64(partition, seed = StableHash64(owner)). Every pool computes
//   the same assignment from the same leases, and a lease that comes or goes
//   moves only its own share.
// - A pool that dies stops renewing: its lease lapses within lease_seconds,
//   and the other pools take its partitions as soon as they read the leases
//   again (each pool's scanner does, every kLeaseRefreshMs while it runs,
//   and every renewal does); their scanners then find the work (workers.h).
//   A pool that stops deletes its lease, so the others take over at once,
//   and a pool that joins is seen as quickly.
// - Correctness never rests on leases: pools a renewal apart may both run a
//   partition (the ack cell makes duplicate runs harmless) or neither (until
//   the next renewal). A pool whose renewals fail keeps its last share.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "percolite/mutex.h"
#include "percolite/transaction.h"

namespace percolite {

constexpr uint32_t kLeasePartitions = 1024;
constexpr double kDefaultLeaseSeconds = 5.0;
constexpr int kLeaseRefreshMs = 100;

struct LeaseOptions {
  double lease_seconds = kDefaultLeaseSeconds;  // > 0
  std::string group;                            // empty: the owner id
  int threads = 0;                              // shown to others
  // Called on the renewing thread after this pool's share changed: the
  // partitions it takes now, and the live pools among which they are shared.
  std::function<void(uint32_t partitions, size_t pools)> on_change;
};

struct LeaseHolder {
  std::string owner;
  std::string group;
  int threads = 0;
  double expires_unix = 0;
  double renewed_unix = 0;  // when it was last renewed
  bool live = false;        // expires_unix > now, when read
  uint32_t partitions = 0;  // the partitions it takes now (live holders)
};

class Leases {
 public:
  Leases(std::shared_ptr<TransactionSource> source, LeaseOptions options);
  ~Leases();
  Leases(const Leases&) = delete;
  Leases& operator=(const Leases&) = delete;

  // Takes the lease (one renewal, on this thread: its errors are thrown
  // here), then renews it in the background.
  void Start() EXCLUDES(mu_);
  // Stops renewing and deletes the lease (best effort). Idempotent.
  void Stop() EXCLUDES(mu_);
  // Reads the leases again (no write) and recomputes this pool's share, at
  // most once per kLeaseRefreshMs: the pool's scanner calls it as it runs,
  // so a pool that joins or stops is seen in a fraction of a second, not at
  // the next renewal. Errors keep the last share.
  void Refresh() EXCLUDES(mu_);

  // Whether a notification of this row hash is in this pool's share.
  bool Mine(uint64_t row_hash) const EXCLUDES(mu_);
  // How many partitions this pool takes, and how often its share changed.
  uint32_t Share() const EXCLUDES(mu_);
  uint64_t Changes() const { return changes_.load(); }
  const std::string& owner() const { return owner_; }

  // Every lease recorded in the transaction's snapshot, with each live
  // holder's share as the pools compute it.
  static std::vector<LeaseHolder> Holders(Transaction& transaction, double now_unix);

 private:
  void Renew() EXCLUDES(mu_);
  void Loop() EXCLUDES(mu_);
  void Remove();
  // Sets this pool's share from the live owners (sorted); reports a change.
  void Adopt(const std::vector<std::string>& live) EXCLUDES(mu_);

  const std::weak_ptr<TransactionSource> source_;
  const LeaseOptions options_;
  const std::string owner_;

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<bool> mine_ GUARDED_BY(mu_);  // by partition
  bool stopping_ GUARDED_BY(mu_) = false;
  bool started_ GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> changes_{0};
  std::chrono::steady_clock::time_point refreshed_ GUARDED_BY(mu_){};
  std::thread thread_;
};

}  // namespace percolite
