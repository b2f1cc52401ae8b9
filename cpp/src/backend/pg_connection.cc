// pg_connection.cc: libpq connections, statements and the pool (pg_connection.h).
#include "pg_connection.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <thread>

#include "percolite/encoding.h"
#include "percolite/status.h"

namespace percolite {
namespace {

void AppendInt32BE(std::string* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}

void ThrowUnlessOk(PGconn* conn, const PgResult& result, const char* what, const PgTarget& target) {
  const ExecStatusType status = PQresultStatus(result.get());
  if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
    throw Error(ErrorCode::kStorage, std::string("postgresql (") + target.display + "): " + what +
                                         ": " + ServerMessage(conn));
  }
}

// Pauses between tries to reach a server: from 10 ms, doubling, at most a second.
class Backoff {
 public:
  void Pause() {
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::milliseconds(1000));
  }

 private:
  std::chrono::milliseconds pause_{10};
};

}  // namespace

std::string ServerMessage(PGconn* conn) {
  std::string message = conn ? PQerrorMessage(conn) : "out of memory";
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  return message;
}

PgParams& PgParams::Bytes(std::string_view value) {
  values_.emplace_back(value);
  return *this;
}

PgParams& PgParams::Int8(uint64_t value) {
  std::string out;
  AppendUint64BE(&out, value);
  values_.push_back(std::move(out));
  return *this;
}

PgParams& PgParams::Bytes(std::string&& value) {
  values_.push_back(std::move(value));
  return *this;
}

// The head: dimensions, whether there are nulls, the element type; then the
// length and lower bound of the one dimension (none when empty). Each item
// follows as its length (-1 for NULL) and bytes.
PgArray::PgArray(Oid element, size_t count) : count_(count) {
  AppendInt32BE(&out_, count == 0 ? 0 : 1);
  AppendInt32BE(&out_, 0);  // set by Done() when a NULL was added
  AppendInt32BE(&out_, element);
  if (count > 0) {
    AppendInt32BE(&out_, static_cast<uint32_t>(count));
    AppendInt32BE(&out_, 1);
  }
}

void PgArray::Add(std::string_view item) {
  AppendInt32BE(&out_, static_cast<uint32_t>(item.size()));
  out_.append(item);
  ++added_;
}

void PgArray::AddNull() {
  AppendInt32BE(&out_, static_cast<uint32_t>(-1));
  nulls_ = true;
  ++added_;
}

std::string PgArray::Done() && {
  if (added_ != count_) throw std::logic_error("PgArray: items added differ from the count");
  if (nulls_) out_[7] = 1;
  return std::move(out_);
}

PgParams& PgParams::ByteaArray(const std::vector<std::string>& items) {
  PgArray array(kPgByteaOid, items.size());
  for (const std::string& item : items) array.Add(item);
  return Bytes(std::move(array).Done());
}

PgParams& PgParams::Int8Array(const std::vector<uint64_t>& items) {
  PgArray array(kPgInt8Oid, items.size());
  std::string item;
  for (uint64_t value : items) {
    item.clear();
    AppendUint64BE(&item, value);
    array.Add(item);
  }
  return Bytes(std::move(array).Done());
}

PgParams& PgParams::Null() {
  nulls_.resize(values_.size(), false);
  nulls_.push_back(true);
  values_.emplace_back();
  return *this;
}

void PgParams::Prepare(std::vector<const char*>* pointers, std::vector<int>* lengths,
                       std::vector<int>* formats) const {
  for (size_t i = 0; i < values_.size(); ++i) {
    const bool null = i < nulls_.size() && nulls_[i];
    pointers->push_back(null ? nullptr : values_[i].data());
    lengths->push_back(static_cast<int>(values_[i].size()));
    formats->push_back(1);
  }
}

uint64_t PgResult::int8(int row, int column) const { return ReadUint64BE(bytes(row, column)); }

int16_t PgResult::int2(int row, int column) const {
  const std::string_view b = bytes(row, column);
  return static_cast<int16_t>((static_cast<unsigned char>(b[0]) << 8) |
                              static_cast<unsigned char>(b[1]));
}

PgResult PgExec(PGconn* conn, const std::string& sql, const PgParams& params, const char* what,
                const PgTarget& target) {
  std::vector<const char*> pointers;
  std::vector<int> lengths, formats;
  params.Prepare(&pointers, &lengths, &formats);
  PgResult result(PQexecParams(conn, sql.c_str(), params.size(), nullptr, pointers.data(),
                               lengths.data(), formats.data(), /*resultFormat=*/1));
  ThrowUnlessOk(conn, result, what, target);
  return result;
}

PgResult PgExec(PGconn* conn, const std::string& sql, const char* what, const PgTarget& target) {
  return PgExec(conn, sql, PgParams(), what, target);
}

void PgExecScript(PGconn* conn, const std::string& sql, const char* what, const PgTarget& target) {
  PgResult result(PQexec(conn, sql.c_str()));
  ThrowUnlessOk(conn, result, what, target);
}

void PgRollback(PGconn* conn) { PQclear(PQexec(conn, "ROLLBACK")); }

PgPipeline::PgPipeline(PGconn* conn, const PgTarget& target) : conn_(conn), target_(target) {
  if (PQenterPipelineMode(conn_) != 1) {
    throw Error(ErrorCode::kStorage,
                "postgresql (" + target_.display +
                    "): cannot send statements together: " + ServerMessage(conn_));
  }
}

PgPipeline::~PgPipeline() {
  if (PQexitPipelineMode(conn_) == 1 || PQstatus(conn_) != CONNECTION_OK) return;
  // A Run cut short, or statements queued and never run: read out what the
  // server still sends (each statement's results end with a null, every
  // sync point with its own result), then leave.
  if (!synced_) PQpipelineSync(conn_);
  for (size_t nulls = 0; nulls <= 2 * queued_.size() + 4 && PQstatus(conn_) == CONNECTION_OK;) {
    PGresult* result = PQgetResult(conn_);
    if (result != nullptr) {
      PQclear(result);
    } else if (PQexitPipelineMode(conn_) == 1) {
      return;
    } else {
      ++nulls;
    }
  }
}

void PgPipeline::Send(const std::string& sql, const PgParams& params, const char* what) {
  std::vector<const char*> pointers;
  std::vector<int> lengths, formats;
  params.Prepare(&pointers, &lengths, &formats);
  if (PQsendQueryParams(conn_, sql.c_str(), params.size(), nullptr, pointers.data(), lengths.data(),
                        formats.data(), /*resultFormat=*/1) != 1) {
    throw Error(ErrorCode::kStorage, std::string("postgresql (") + target_.display + "): " + what +
                                         ": " + ServerMessage(conn_));
  }
  queued_.push_back(what);
  synced_ = false;
}

std::vector<PgResult> PgPipeline::Run() {
  const auto broken = [this](const char* what) {
    return Error(ErrorCode::kStorage, std::string("postgresql (") + target_.display + "): " + what +
                                          ": " + ServerMessage(conn_));
  };
  if (PQpipelineSync(conn_) != 1) throw broken(queued_.empty() ? "syncing" : queued_.back());
  synced_ = true;
  std::vector<PgResult> results;
  results.reserve(queued_.size());
  std::string failure;
  for (const char* what : queued_) {
    PGresult* raw = PQgetResult(conn_);
    if (raw == nullptr) throw broken(what);
    PgResult result(raw);
    const ExecStatusType status = PQresultStatus(raw);
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK &&
        status != PGRES_PIPELINE_ABORTED && failure.empty()) {
      std::string message = PQresultErrorMessage(raw);
      while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
        message.pop_back();
      }
      failure = std::string("postgresql (") + target_.display + "): " + what + ": " + message;
    }
    if (PQstatus(conn_) != CONNECTION_OK) throw broken(what);
    results.push_back(std::move(result));
    // The null that ends this statement's results.
    PGresult* extra = PQgetResult(conn_);
    if (extra != nullptr) {
      PQclear(extra);
      throw broken(what);
    }
  }
  PGresult* sync = PQgetResult(conn_);
  const bool synced = sync != nullptr && PQresultStatus(sync) == PGRES_PIPELINE_SYNC;
  PQclear(sync);
  if (!synced) throw broken("syncing");
  queued_.clear();
  if (!failure.empty()) throw Error(ErrorCode::kStorage, failure);
  return results;
}

namespace {

// The server's side of a connection the network lost. percolite keeps a
// transaction open only from one round trip of a batch to the next, for
// milliseconds of the client's work, so a session idle in one for seconds
// has lost its client mid-batch: the server ends it after 5 s, releasing its
// locks (the clock row's among them, which every writer waits for). Over
// TCP the server probes a silent client as the client probes the server
// (the target's keepalive defaults) and gives up on unacknowledged data
// after 10 s; over a Unix socket these do nothing.
constexpr const char* kServerSideTimeouts =
    "SET idle_in_transaction_session_timeout = '5s'; SET tcp_keepalives_idle = 5; "
    "SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3; "
    "SET tcp_user_timeout = 10000";

}  // namespace

PGconn* PgConnect(const PgTarget& target, SyncMode sync) {
  // With the target's defaults (a connect timeout, keepalives): a server
  // that does not answer is an error, never a hang.
  PGconn* conn = PQconnectdb(target.connect.c_str());
  if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
    std::string why = target.Hide(ServerMessage(conn));
    PQfinish(conn);
    throw Error(ErrorCode::kStorage,
                "cannot connect to the postgresql server of '" + target.display + "': " + why);
  }
  // Notices (e.g. "schema already exists, skipping") are not the user's business.
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  const char* setting = sync == SyncMode::kFull ? "on" : "off";
  try {
    PgExecScript(conn,
                 std::string("SET synchronous_commit = ") + setting + "; " + kServerSideTimeouts,
                 "setting up the connection", target);
  } catch (...) {
    PQfinish(conn);
    throw;
  }
  return conn;
}

// ---------------------------------------------------------------------------

PgPool::Lease::~Lease() {
  if (pool_ != nullptr) pool_->Return(conn_);
}

void PgPool::Return(PGconn* conn) {
  MutexLock lock(&mu_);
  if (PQstatus(conn) == CONNECTION_OK && PQtransactionStatus(conn) == PQTRANS_IDLE &&
      !state_.closed()) {
    idle_.push_back(conn);
  } else {
    PQfinish(conn);
    --opened_;
  }
  returned_.Signal();
}

PgPool::Lease PgPool::Borrow() {
  {
    MutexLock lock(&mu_);
    while (!state_.closed() && idle_.empty() && opened_ >= size_) returned_.Wait(&mu_);
    if (state_.closed()) throw Error(ErrorCode::kClosed, "the postgresql store is closed");
    if (!idle_.empty()) {
      PGconn* conn = idle_.back();
      idle_.pop_back();
      return Lease(this, conn);
    }
    ++opened_;  // a place for the new connection, taken before connecting
  }
  try {
    return Lease(this, PgConnect(target_, sync_));
  } catch (...) {
    MutexLock lock(&mu_);
    --opened_;
    returned_.Signal();
    throw;
  }
}

PgResult PgPool::Query(const std::string& sql, const PgParams& params, const char* what) {
  const auto deadline = target_.ReconnectDeadline();
  Backoff backoff;
  for (;;) {
    std::optional<Lease> lease;
    try {
      lease.emplace(Borrow());
    } catch (const Error& e) {
      // Could not connect: the server is down (or never was up).
      if (e.code() != ErrorCode::kStorage || std::chrono::steady_clock::now() > deadline) throw;
    }
    if (lease) {
      try {
        return PgExec(lease->get(), sql, params, what, target_);
      } catch (const Error&) {
        // The statement's own error, or the connection broke for too long.
        if (PQstatus(lease->get()) == CONNECTION_OK) throw;
        if (std::chrono::steady_clock::now() > deadline) throw;
      }
      lease.reset();  // a broken connection is dropped, not pooled
    }
    state_.Check();
    backoff.Pause();
  }
}

void PgPool::Close() {
  MutexLock lock(&mu_);
  for (PGconn* conn : idle_) PQfinish(conn);
  opened_ -= idle_.size();
  idle_.clear();
  returned_.SignalAll();
}

}  // namespace percolite
