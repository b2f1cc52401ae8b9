// pg_collect.cc: collecting old versions (pg_backend.h). Each handle
// publishes in the handles table the oldest start_ts its snapshots have or
// may get; after each batch the writer deletes what none of the handles
// seen lately can read any more.
#include <algorithm>

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

void PgBackend::Publish(PGconn* conn, uint64_t clock, const std::string* token) {
  PgParams p;
  p.Bytes(handle_id_).Int8(Horizon(clock));
  if (token != nullptr) p.Bytes(*token);
  PgExec(conn, token != nullptr ? sql_.publish_with_token : sql_.publish, p,
         "publishing the oldest snapshot", target_);
}

void PgBackend::Heartbeat() {
  if (PQstatus(writer_conn_) != CONNECTION_OK && !ReconnectWriter()) return;
  try {
    PgResult r = PgExec(writer_conn_, sql_.read_clock, "publishing the oldest snapshot", target_);
    Publish(writer_conn_, r.int8(0, 0), nullptr);
  } catch (const Error&) {
    // The next batch or heartbeat tries again.
  }
}

void PgBackend::Collect(PGconn* conn) {
  // Every handle seen lately published the oldest start_ts its snapshots
  // may have; versions superseded at or before the least of them, and
  // tombstones and purges at or before it, are read by nobody.
  PgResult r = PgExec(conn, sql_.collect, "collecting old versions", target_);
  tombstones_collected_.fetch_add(r.int8(0, 0));
}

}  // namespace percolite
