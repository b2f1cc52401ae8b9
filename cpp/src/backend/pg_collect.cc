// pg_collect.cc: collecting old versions (pg_backend.h). Each handle
// publishes in the handles table the oldest start_ts its snapshots have or
// may get; after each batch the writer deletes what none of the handles
// seen lately can read any more.
#include <algorithm>
#include <chrono>

#include "pg_backend.h"

namespace percolite {

void PgBackend::ForgetPending(uint64_t start_ts) {
  MutexLock lock(&snapshots_mu_);
  auto it = pending_starts_.find(start_ts);
  if (it != pending_starts_.end()) pending_starts_.erase(it);
}

uint64_t PgBackend::Horizon(uint64_t clock) {
  MutexLock lock(&snapshots_mu_);
  // A snapshot being begun may read any counter value from the last
  // published one on: do not move past it until it is registered.
  if (beginning_ > 0) return horizon_;
  uint64_t h = clock;
  if (!snapshots_.empty()) h = std::min(h, *snapshots_.begin());
  if (!pending_starts_.empty()) h = std::min(h, *pending_starts_.begin());
  horizon_ = std::max(horizon_, h);
  return horizon_;
}

PgParams PgBackend::PublishParams(uint64_t clock, const std::string* token) {
  PgParams p;
  p.Bytes(handle_id_).Int8(Horizon(clock));
  if (token != nullptr) p.Bytes(*token);
  return p;
}

void PgBackend::Publish(PGconn* conn, uint64_t clock, const std::string* token) {
  PgExec(conn, token != nullptr ? sql_.publish_with_token : sql_.publish,
         PublishParams(clock, token), "publishing the oldest snapshot", target_);
}

void PgBackend::Heartbeat() {
  if (PQstatus(writer_conn_) != CONNECTION_OK && !ReconnectWriter(ServerMessage(writer_conn_))) {
    return;
  }
  try {
    PgResult r = PgExec(writer_conn_, sql_.read_clock, "publishing the oldest snapshot", target_);
    Publish(writer_conn_, r.int8(0, 0), nullptr);
  } catch (const Error&) {
    // The next batch or heartbeat tries again.
  }
}

bool PgBackend::CollectDue() {
  const auto now = std::chrono::steady_clock::now();
  {
    // Under load, collecting after every batch would cost each batch a
    // statement and a transaction of its own: once in a while is enough.
    MutexLock lock(&mu_);
    if (!queue_.empty() && now - last_collect_ < kCollectInterval) return false;
  }
  last_collect_ = now;
  return true;
}

void PgBackend::Collect(PGconn* conn) {
  // Every handle seen lately published the oldest start_ts its snapshots
  // may have; versions superseded at or before the least of them, and
  // tombstones and purges at or before it, are read by nobody. One round
  // trip; a collection the server loses in a crash is done again by the
  // next, so it does not wait for the server to flush it.
  constexpr const char* kWhat = "collecting old versions";
  try {
    std::vector<PgResult> results;
    {
      PgPipeline pipe(conn, target_);
      pipe.Send("BEGIN", kWhat);
      pipe.Send(sql_.collect_settings, kWhat);
      pipe.Send(sql_.collect, kWhat);
      pipe.Send("COMMIT", kWhat);
      results = pipe.Run();
    }
    tombstones_collected_.fetch_add(results[2].int8(0, 0));
  } catch (const Error&) {
    if (PQstatus(conn) == CONNECTION_OK) PgRollback(conn);
    throw;
  }
}

}  // namespace percolite
