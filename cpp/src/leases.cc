#include "percolite/leases.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "percolite/failures.h"
#include "records.h"

namespace percolite {
namespace {

const std::string kLeaseRow = kSystemRowPrefix + "leases";
constexpr std::string_view kLeaseFamily = "l";
// Version 2 adds the renewal's time; version 1 records (from an older
// process) are still read, their renewal taken as expiry - the default lease.
constexpr char kLeaseVersion = 2;
// Leases dead this long are deleted by whichever pool renews next.
constexpr double kForgetDeadSeconds = 60;

std::string NewOwnerId() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
  std::random_device random;
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%08x%08x", random(), random());
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + suffix;
}

std::string EncodeLease(const LeaseOptions& options, const std::string& group, double now) {
  std::string out(1, kLeaseVersion);
  records::PutDouble(&out, now + options.lease_seconds);
  records::PutString(&out, group);
  AppendUint64BE(&out, static_cast<uint64_t>(std::max(options.threads, 0)));
  records::PutDouble(&out, now);
  return out;
}

bool DecodeLease(std::string_view owner, std::string_view bytes, LeaseHolder* out) {
  records::Reader in(bytes);
  const char version = in.Byte();
  out->owner = std::string(owner);
  out->expires_unix = in.Double();
  out->group = in.String();
  out->threads = static_cast<int>(in.U64());
  out->renewed_unix = version >= 2 ? in.Double() : out->expires_unix - kDefaultLeaseSeconds;
  return in.ok() && in.done() && (version == 1 || version == kLeaseVersion);
}

// The owner that takes `partition` among `owners` (their StableHash64 in
// `seeds`): the largest hash wins, ties to the smaller id.
size_t OwnerOf(uint32_t partition, const std::vector<uint64_t>& seeds) {
  std::string bytes;
  AppendUint64BE(&bytes, partition);
  size_t best = 0;
  uint64_t best_hash = 0;
  for (size_t i = 0; i < seeds.size(); ++i) {
    const uint64_t h = StableHash64(bytes, seeds[i]);
    if (i == 0 || h > best_hash) {
      best = i;
      best_hash = h;
    }
  }
  return best;
}

// Partitions per owner (in `owners` order, sorted), for the live owners.
std::vector<uint32_t> Assign(const std::vector<std::string>& owners, std::vector<bool>* mine,
                             const std::string& self) {
  std::vector<uint64_t> seeds;
  for (const std::string& owner : owners) seeds.push_back(StableHash64(owner));
  std::vector<uint32_t> counts(owners.size(), 0);
  if (mine) mine->assign(kLeasePartitions, false);
  if (owners.empty()) return counts;
  for (uint32_t p = 0; p < kLeasePartitions; ++p) {
    const size_t owner = OwnerOf(p, seeds);
    ++counts[owner];
    if (mine && owners[owner] == self) (*mine)[p] = true;
  }
  return counts;
}

}  // namespace

Leases::Leases(std::shared_ptr<TransactionSource> source, LeaseOptions options)
    : source_(source),
      options_(std::move(options)),
      owner_(NewOwnerId()),
      mine_(kLeasePartitions, true) {
  if (!(options_.lease_seconds > 0) || options_.lease_seconds > 3600) {
    throw Error(ErrorCode::kInvalidArgument, "lease_seconds must be > 0 and at most 3600");
  }
}

Leases::~Leases() { Stop(); }

void Leases::Start() {
  {
    MutexLock lock(&mu_);
    if (started_) throw Error(ErrorCode::kWrongState, "the lease was already taken");
    started_ = true;
  }
  Renew();
  thread_ = std::thread([this] { Loop(); });
}

void Leases::Stop() {
  {
    MutexLock lock(&mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  Remove();
}

bool Leases::Mine(uint64_t row_hash) const {
  MutexLock lock(&mu_);
  return mine_[row_hash % kLeasePartitions];
}

uint32_t Leases::Share() const {
  MutexLock lock(&mu_);
  return static_cast<uint32_t>(std::count(mine_.begin(), mine_.end(), true));
}

std::vector<LeaseHolder> Leases::Holders(Transaction& transaction, double now_unix) {
  std::vector<LeaseHolder> holders;
  records::VisitFamily(transaction, kLeaseRow, kLeaseFamily,
                       [&](std::string_view owner, std::string_view value) {
                         LeaseHolder holder;
                         if (!DecodeLease(owner, value, &holder)) return;  // another version's
                         holder.live = holder.expires_unix > now_unix;
                         holders.push_back(std::move(holder));
                       });
  std::vector<std::string> live;
  for (const LeaseHolder& h : holders) {
    if (h.live) live.push_back(h.owner);
  }
  const std::vector<uint32_t> counts = Assign(live, nullptr, "");
  size_t next = 0;
  for (LeaseHolder& h : holders) {
    if (h.live) h.partitions = counts[next++];  // both in owner order
  }
  return holders;
}

void Leases::Renew() {
  std::shared_ptr<TransactionSource> source = source_.lock();
  if (!source) throw Error(ErrorCode::kClosed, "the store was closed");
  const std::string& group = options_.group.empty() ? owner_ : options_.group;
  for (int tries = 1;; ++tries) {
    std::shared_ptr<Transaction> transaction = source->Begin();
    try {
      const double now = source->backend()->NowUnix();
      std::vector<std::string> live{owner_};
      for (const LeaseHolder& holder : Holders(*transaction, now)) {
        if (holder.owner == owner_) continue;
        if (holder.live) {
          live.push_back(holder.owner);
        } else if (holder.expires_unix < now - kForgetDeadSeconds) {
          transaction->Delete({kLeaseRow, kLeaseFamily, holder.owner});
        }
      }
      transaction->Set({kLeaseRow, kLeaseFamily, owner_}, EncodeLease(options_, group, now));
      transaction->Commit();
      std::sort(live.begin(), live.end());
      Adopt(live);
      return;
    } catch (const Error& e) {
      transaction->Abort();
      // Two pools deleting one dead lease conflict: go again.
      if (e.code() != ErrorCode::kConflict || tries >= 20) throw;
      records::Backoff(tries);
    }
  }
}

void Leases::Adopt(const std::vector<std::string>& live) {
  std::vector<bool> mine;
  Assign(live, &mine, owner_);
  const uint32_t share = static_cast<uint32_t>(std::count(mine.begin(), mine.end(), true));
  bool changed;
  {
    MutexLock lock(&mu_);
    changed = mine != mine_ || changes_ == 0;
    if (changed) {
      mine_ = std::move(mine);
      ++changes_;
    }
  }
  if (changed && options_.on_change) options_.on_change(share, live.size());
}

void Leases::Refresh() {
  {
    MutexLock lock(&mu_);
    const auto now = std::chrono::steady_clock::now();
    if (!started_ || stopping_ || now - refreshed_ < std::chrono::milliseconds(kLeaseRefreshMs)) {
      return;
    }
    refreshed_ = now;
  }
  std::shared_ptr<TransactionSource> source = source_.lock();
  if (!source) return;
  try {
    std::shared_ptr<Transaction> transaction = source->Begin();
    std::vector<std::string> live{owner_};
    for (const LeaseHolder& holder : Holders(*transaction, source->backend()->NowUnix())) {
      if (holder.live && holder.owner != owner_) live.push_back(holder.owner);
    }
    transaction->Abort();
    std::sort(live.begin(), live.end());
    Adopt(live);
  } catch (const Error&) {
    // Closing or failing: keep the last share.
  }
}

void Leases::Loop() {
  pthread_setname_np(pthread_self(), "pc-lease");
  const auto every = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.lease_seconds / 3));
  MutexLock lock(&mu_);
  while (!stopping_) {
    const auto deadline = std::chrono::steady_clock::now() + every;
    bool woken = true;  // false once the deadline passed
    while (!stopping_ && woken) woken = cv_.WaitUntil(&mu_, deadline);
    if (stopping_) break;
    lock.Unlock();
    try {
      Renew();
    } catch (const Error&) {
      // The store is closing or failing: keep the last share; the next
      // round tries again (and the lease lapses if none succeeds).
    }
    lock.Lock();
  }
}

void Leases::Remove() {
  std::shared_ptr<TransactionSource> source = source_.lock();
  if (!source) return;
  try {
    std::shared_ptr<Transaction> transaction = source->Begin();
    transaction->Delete({kLeaseRow, kLeaseFamily, owner_});
    transaction->Commit();
  } catch (const Error&) {
    // Closed or failing: the lease lapses by itself.
  }
}

}  // namespace percolite
