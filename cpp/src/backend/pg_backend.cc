#include "pg_backend.h"

#include <libpq-fe.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <unordered_map>
#include <utility>

namespace percolite {
namespace {

// The store's format, in meta: a store of another format is refused.
constexpr std::string_view kFormatName = "percolite-store";
constexpr std::string_view kFormat = "1";
constexpr Oid kByteaOid = 17;

// PostgreSQL caps an index entry near 2.7 KB, and keys have no limit: the
// indexes hold the first kIndexedBytes of a key (cells, notification scans)
// or its SHA-256 (unique notifications and acks), and statements compare the
// whole key after. Ordering by (prefix, key) is ordering by key.
#define PREFIX(x) "substr(" x ", 1, 2000)"

constexpr Oid kInt8Oid = 20;

enum CellState : int64_t { kLive = 0, kDeleted = 1 };

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

int FromHex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string PercentDecode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() + 0 && FromHex(text[i + 1]) >= 0 &&
        FromHex(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(FromHex(text[i + 1]) * 16 + FromHex(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

// The tables of a store, in its schema.
constexpr const char* kTables[] = {"meta", "clock",   "cells",  "notify",
                                   "acks", "garbage", "handles"};

bool ValidSchema(std::string_view name) {
  if (name.empty() || name.size() > 40) return false;
  // PostgreSQL's own schemas.
  if (name.substr(0, 3) == "pg_" || name == "information_schema") return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// Binary parameters of one statement (every one in PostgreSQL's binary format).
class Params {
 public:
  Params& Bytes(std::string_view value) {
    values_.emplace_back(value);
    return *this;
  }
  Params& Int8(uint64_t value) {
    std::string out;
    AppendUint64BE(&out, value);
    values_.push_back(std::move(out));
    return *this;
  }
  template <typename T, typename Get>
  Params& Array(const std::vector<T>& items, Oid element, Get get) {
    std::string out;
    auto int32 = [&out](uint32_t v) {
      for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
    };
    int32(items.empty() ? 0 : 1);  // dimensions
    int32(0);                      // no nulls
    int32(element);
    if (!items.empty()) {
      int32(static_cast<uint32_t>(items.size()));
      int32(1);  // lower bound
    }
    for (const T& item : items) {
      const std::string bytes = get(item);
      int32(static_cast<uint32_t>(bytes.size()));
      out.append(bytes);
    }
    values_.push_back(std::move(out));
    return *this;
  }
  Params& ByteaArray(const std::vector<std::string>& items) {
    return Array(items, kByteaOid, [](const std::string& s) { return s; });
  }
  Params& Int8Array(const std::vector<uint64_t>& items) {
    return Array(items, kInt8Oid, [](uint64_t v) {
      std::string out;
      AppendUint64BE(&out, v);
      return out;
    });
  }

  int size() const { return static_cast<int>(values_.size()); }
  void Prepare(std::vector<const char*>* pointers, std::vector<int>* lengths,
               std::vector<int>* formats) const {
    for (const std::string& value : values_) {
      pointers->push_back(value.data());
      lengths->push_back(static_cast<int>(value.size()));
      formats->push_back(1);
    }
  }

 private:
  std::vector<std::string> values_;
};

// A statement's result, freed on destruction.
class Result {
 public:
  explicit Result(PGresult* result) : result_(result) {}
  ~Result() { PQclear(result_); }
  Result(Result&& other) noexcept : result_(other.result_) { other.result_ = nullptr; }
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;

  PGresult* get() const { return result_; }
  int rows() const { return PQntuples(result_); }
  bool null(int row, int column) const { return PQgetisnull(result_, row, column) != 0; }
  std::string_view bytes(int row, int column) const {
    return std::string_view(PQgetvalue(result_, row, column),
                            static_cast<size_t>(PQgetlength(result_, row, column)));
  }
  uint64_t int8(int row, int column) const { return ReadUint64BE(bytes(row, column)); }
  int16_t int2(int row, int column) const {
    const std::string_view b = bytes(row, column);
    return static_cast<int16_t>((static_cast<unsigned char>(b[0]) << 8) |
                                static_cast<unsigned char>(b[1]));
  }

 private:
  PGresult* result_;
};

std::string ServerMessage(PGconn* conn) {
  std::string message = conn ? PQerrorMessage(conn) : "out of memory";
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  return message;
}

// Runs one statement with binary parameters and results; throws kStorage
// naming the server's message and `what` when it fails.
Result Exec(PGconn* conn, const std::string& sql, const Params& params, const char* what,
            const PgTarget& target) {
  std::vector<const char*> pointers;
  std::vector<int> lengths, formats;
  params.Prepare(&pointers, &lengths, &formats);
  Result result(PQexecParams(conn, sql.c_str(), params.size(), nullptr, pointers.data(),
                             lengths.data(), formats.data(), /*resultFormat=*/1));
  const ExecStatusType status = PQresultStatus(result.get());
  if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
    throw Error(ErrorCode::kStorage, std::string("postgresql (") + target.display + "): " + what +
                                         ": " + ServerMessage(conn));
  }
  return result;
}

Result Exec(PGconn* conn, const std::string& sql, const char* what, const PgTarget& target) {
  return Exec(conn, sql, Params(), what, target);
}

// Runs several statements without parameters (text results).
void ExecScript(PGconn* conn, const std::string& sql, const char* what, const PgTarget& target) {
  Result result(PQexec(conn, sql.c_str()));
  const ExecStatusType status = PQresultStatus(result.get());
  if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
    throw Error(ErrorCode::kStorage, std::string("postgresql (") + target.display + "): " + what +
                                         ": " + ServerMessage(conn));
  }
}

void Rollback(PGconn* conn) { PQclear(PQexec(conn, "ROLLBACK")); }

}  // namespace

// ---------------------------------------------------------------------------

std::string PgTarget::Hide(std::string text) const {
  for (const std::string& secret : secrets) {
    if (secret.empty()) continue;
    for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at)) {
      text.replace(at, secret.size(), "***");
      at += 3;
    }
  }
  return text;
}

PgTarget ParsePgTarget(const std::string& target) {
  const size_t scheme_end = target.find("://");
  const std::string scheme =
      scheme_end == std::string::npos ? "" : Lower(std::string_view(target).substr(0, scheme_end));
  if (scheme != "postgresql" && scheme != "postgres") {
    throw Error(ErrorCode::kInvalidArgument,
                "a postgresql store is named by a postgresql:// URI, not '" + target + "'");
  }
  PgTarget out;
  out.schema = "percolite";
  const size_t query = target.find('?');
  // The scheme as libpq wants it (it takes only lower case).
  std::string base = "postgresql://" + target.substr(scheme_end + 3, query == std::string::npos
                                                                         ? std::string::npos
                                                                         : query - scheme_end - 3);
  // The password, wherever it is, to keep out of every message: in the
  // user info (user:secret@host) and in a password= parameter.
  {
    const size_t start = scheme_end + 3;
    const size_t end = std::min(target.find('/', start), query);
    const size_t at = target.rfind('@', end == std::string::npos ? target.size() : end);
    if (at != std::string::npos && at >= start) {
      const size_t colon = target.find(':', start);
      if (colon != std::string::npos && colon < at) {
        const std::string secret = target.substr(colon + 1, at - colon - 1);
        out.secrets.push_back(secret);
        out.secrets.push_back(PercentDecode(secret));
      }
    }
  }
  std::vector<std::string> kept, shown;
  bool seen_schema = false, seen_poll = false;
  if (query != std::string::npos) {
    std::string_view rest = std::string_view(target).substr(query + 1);
    while (!rest.empty()) {
      const size_t amp = rest.find('&');
      const std::string_view pair = rest.substr(0, amp);
      rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
      if (pair.empty()) continue;
      const size_t eq = pair.find('=');
      const std::string name = PercentDecode(pair.substr(0, eq));
      const std::string value =
          eq == std::string_view::npos ? std::string() : PercentDecode(pair.substr(eq + 1));
      if (name == "password") {
        out.secrets.emplace_back(pair.substr(eq + 1));
        out.secrets.push_back(value);
      }
      if ((name == "poll_interval" && std::exchange(seen_poll, true)) ||
          (name == "schema" && std::exchange(seen_schema, true))) {
        throw Error(ErrorCode::kInvalidArgument,
                    name + " is given twice in the postgresql target: give it once");
      }
      if (name == "poll_interval") {
        char* end = nullptr;
        const double seconds = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !(seconds > 0 && seconds <= 3600)) {
          throw Error(ErrorCode::kInvalidArgument,
                      "poll_interval '" + value +
                          "' in the postgresql target: a number of seconds, more than 0 and at "
                          "most 3600");
        }
        out.poll_interval = seconds;
        shown.emplace_back(pair);
        continue;
      }
      if (name == "schema") {
        if (!ValidSchema(value)) {
          throw Error(ErrorCode::kInvalidArgument,
                      "schema '" + value +
                          "' in the postgresql target: a schema name is 1 to 40 characters of "
                          "[a-z0-9_], starting with a letter or _, and not one of PostgreSQL's "
                          "own (pg_*, information_schema)");
        }
        out.schema = value;
        shown.emplace_back(pair);
        continue;
      }
      kept.emplace_back(pair);
      if (name != "password") shown.emplace_back(pair);
    }
  }
  out.conninfo = base;
  for (size_t i = 0; i < kept.size(); ++i) out.conninfo += (i == 0 ? "?" : "&") + kept[i];
  // Shown without a password: postgresql://user:secret@host -> postgresql://user@host.
  std::string display = base;
  const size_t authority = scheme_end + 3;
  const size_t at = display.find('@', authority);
  const size_t slash = display.find('/', authority);
  if (at != std::string::npos && (slash == std::string::npos || at < slash)) {
    const size_t colon = display.find(':', authority);
    if (colon != std::string::npos && colon < at) display.erase(colon, at - colon);
  }
  for (size_t i = 0; i < shown.size(); ++i) display += (i == 0 ? "?" : "&") + shown[i];
  out.display = display;
  // libpq's own check of the rest: unknown parameters, a malformed URI.
  char* message = nullptr;
  PQconninfoOption* options = PQconninfoParse(out.conninfo.c_str(), &message);
  if (options == nullptr) {
    std::string why = message ? message : "it cannot be read";
    if (message) PQfreemem(message);
    while (!why.empty() && why.back() == '\n') why.pop_back();
    throw Error(ErrorCode::kInvalidArgument,
                "the postgresql target '" + out.display + "' is not a valid URI: " + out.Hide(why));
  }
  PQconninfoFree(options);
  return out;
}

// ---------------------------------------------------------------------------

class PgBackend::Lease {
 public:
  Lease(PgBackend* backend, PGconn* conn) : backend_(backend), conn_(conn) {}
  ~Lease() {
    if (backend_ == nullptr) return;
    std::lock_guard<std::mutex> lock(backend_->pool_mu_);
    if (PQstatus(conn_) == CONNECTION_OK && PQtransactionStatus(conn_) == PQTRANS_IDLE &&
        !backend_->state_.closed()) {
      backend_->idle_.push_back(conn_);
    } else {
      PQfinish(conn_);
      --backend_->opened_;
    }
    backend_->pool_cv_.notify_one();
  }
  Lease(Lease&& other) noexcept : backend_(other.backend_), conn_(other.conn_) {
    other.backend_ = nullptr;
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  PGconn* get() const { return conn_; }

 private:
  PgBackend* backend_;
  PGconn* conn_;
};

PgBackend::Lease PgBackend::Borrow() {
  std::unique_lock<std::mutex> lock(pool_mu_);
  for (;;) {
    if (state_.closed()) throw Error(ErrorCode::kClosed, "the postgresql store is closed");
    if (!idle_.empty()) {
      PGconn* conn = idle_.back();
      idle_.pop_back();
      return Lease(this, conn);
    }
    if (opened_ < kPoolSize) {
      ++opened_;
      lock.unlock();
      try {
        return Lease(this, Connect());
      } catch (...) {
        lock.lock();
        --opened_;
        pool_cv_.notify_one();
        throw;
      }
    }
    pool_cv_.wait(lock);
  }
}

PGconn* PgBackend::Connect() const {
  // A connect timeout unless the target sets one: a server that does not
  // answer is an error, never a hang.
  std::string conninfo = target_.conninfo;
  if (conninfo.find("connect_timeout=") == std::string::npos) {
    conninfo += conninfo.find('?') == std::string::npos ? "?" : "&";
    conninfo += "connect_timeout=10";
  }
  PGconn* conn = PQconnectdb(conninfo.c_str());
  if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
    std::string why = target_.Hide(ServerMessage(conn));
    PQfinish(conn);
    throw Error(ErrorCode::kStorage,
                "cannot connect to the postgresql server of '" + target_.display + "': " + why);
  }
  // Notices (e.g. "schema already exists, skipping") are not the user's business.
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  const char* sync = options_.sync == SyncMode::kFull ? "on" : "off";
  try {
    Exec(conn, std::string("SET synchronous_commit = ") + sync, "setting up the connection",
         target_);
  } catch (...) {
    PQfinish(conn);
    throw;
  }
  return conn;
}

namespace {

// One statement on a connection of the pool. A connection that broke (the
// server restarted, the network dropped) is dropped and the statement tried
// again on a new one, with back-off, for up to kReconnectSeconds: reads and
// the few idempotent writes made this way never half-apply.
Result ReadQuery(PgBackend* store, const std::string& sql, const Params& params, const char* what,
                 const PgTarget& target) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(PgBackend::kReconnectSeconds);
  std::chrono::milliseconds pause(10);
  for (;;) {
    std::optional<PgBackend::Lease> lease;
    try {
      lease.emplace(store->Borrow());
    } catch (const Error& e) {
      // Could not connect: the server is down (or never was up).
      if (e.code() != ErrorCode::kStorage || std::chrono::steady_clock::now() > deadline) throw;
    }
    if (lease) {
      try {
        return Exec(lease->get(), sql, params, what, target);
      } catch (const Error&) {
        // The statement's own error, or the connection broke for too long.
        if (PQstatus(lease->get()) == CONNECTION_OK) throw;
        if (std::chrono::steady_clock::now() > deadline) throw;
      }
      lease.reset();  // a broken connection is dropped, not pooled
    }
    store->CheckUsable();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
}

Result ReadQuery(PgBackend* store, const std::string& sql, const char* what,
                 const PgTarget& target) {
  return ReadQuery(store, sql, Params(), what, target);
}

}  // namespace

std::string PgBackend::Table(const char* name) const {
  return "\"" + target_.schema + "\"." + name;
}

// ---------------------------------------------------------------------------

std::shared_ptr<PgBackend> PgBackend::Open(const std::string& target,
                                           const BackendOptions& options) {
  if (options.restored) {
    throw Error(ErrorCode::kInvalidArgument,
                "restored=True is for lmdb stores (a data file put back from a copy); a "
                "postgresql store's backups and restores are the server's");
  }
  std::shared_ptr<PgBackend> backend(new PgBackend(ParsePgTarget(target), options));
  {
    Lease lease = backend->Borrow();
    backend->CreateOrCheckSchema(lease.get(), options.create);
  }
  backend->writer_conn_ = backend->Connect();
  backend->Heartbeat();
  backend->writer_ = std::thread([raw = backend.get()] { raw->WriterLoop(); });
  return backend;
}

PgBackend::PgBackend(PgTarget target, const BackendOptions& options)
    : target_(std::move(target)),
      options_(options),
      state_(
          "a postgresql store handle belongs to the process that opened it; a forked "
          "child must open the store again",
          "the postgresql store is closed") {
  channel_ = "percolite_" + target_.schema;
  const std::string cells = Table("cells");
  const std::string visible = " AND ts <= $2 AND (purged_ts IS NULL OR purged_ts > $2)";
  snapshot_sql_.get = "SELECT state, value FROM " + cells +
                      " WHERE " PREFIX("key") " = " PREFIX("$1::bytea") " AND key = $1" + visible +
                      " ORDER BY ts DESC LIMIT 1";
  for (int exclusive = 0; exclusive < 2; ++exclusive) {
    for (int bounded = 0; bounded < 2; ++bounded) {
      snapshot_sql_.visit[exclusive][bounded] =
          "SELECT DISTINCT ON (" PREFIX("key") ", key) key, state, value FROM " + cells +
          " WHERE " PREFIX("key") " >= " PREFIX("$1::bytea") " AND key " +
          (exclusive ? ">" : ">=") + " $1" + visible +
          (bounded ? " AND " PREFIX("key") " <= " PREFIX("$4::bytea") " AND key < $4" : "") +
          " ORDER BY " PREFIX("key") ", key, ts DESC LIMIT $3";
    }
  }
  std::random_device random;
  for (int i = 0; i < 4; ++i) AppendUint64BE(&handle_id_, (uint64_t{random()} << 32) | random());
}

PgBackend::~PgBackend() {
  if (ForkedAway()) {
    // The writer thread does not exist here, and the connections are the
    // parent's: leave everything as it is.
    if (writer_.joinable()) writer_.detach();
    return;
  }
  Close();
}

void PgBackend::CreateOrCheckSchema(PGconn* conn, bool create) {
  const std::string meta = Table("meta");
  auto check = [&]() -> std::optional<std::string> {
    // to_regclass: NULL when the table does not exist, without an error.
    Result exists = Exec(conn, "SELECT to_regclass('" + meta + "') IS NOT NULL",
                         "looking for the store", target_);
    std::string table_list;
    for (const char* table : kTables) {
      table_list += std::string(table_list.empty() ? "'" : ", '") + table + "'";
    }
    Result found =
        Exec(conn,
             "SELECT table_name::text FROM information_schema.tables WHERE "
             "table_schema = '" +
                 target_.schema + "' AND table_name IN (" + table_list + ") ORDER BY table_name",
             "looking for the store", target_);
    if (exists.bytes(0, 0)[0] == 0) {
      if (found.rows() == 0) return std::string();  // no store: one may be created
      return "schema " + target_.schema + " holds a table named like one of percolite's (" +
             std::string(found.bytes(0, 0)) +
             ") but no percolite store: choose another schema (?schema=NAME in the target)";
    }
    Result columns = Exec(
        conn,
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = '" + target_.schema +
            "' AND table_name = 'meta' AND ((column_name = 'name' AND data_type = 'text') OR "
            "(column_name = 'value' AND data_type = 'bytea'))",
        "checking the store's tables", target_);
    if (columns.int8(0, 0) != 2) {
      return "the table " + target_.schema +
             ".meta is not a percolite store's (it has other columns): choose another schema "
             "(?schema=NAME in the target)";
    }
    Params name;
    name.Bytes(kFormatName);
    Result format =
        Exec(conn, "SELECT value FROM " + meta + " WHERE name = convert_from($1, 'UTF8')", name,
             "reading the store's format", target_);
    if (format.rows() == 0) {
      return "the table " + target_.schema +
             ".meta is not a percolite store's (it has no format record): choose another "
             "schema (?schema=NAME in the target)";
    }
    if (format.bytes(0, 0) != kFormat) {
      return "the store in schema " + target_.schema + " has format '" +
             std::string(format.bytes(0, 0)) + "'; this version of percolite reads format " +
             std::string(kFormat);
    }
    if (static_cast<size_t>(found.rows()) != std::size(kTables)) {
      throw Error(ErrorCode::kCorruption,
                  "the store in schema " + target_.schema + " of '" + target_.display +
                      "' lacks some of its tables (it has " + std::to_string(found.rows()) +
                      " of " + std::to_string(std::size(kTables)) +
                      "): were they dropped? restore the schema from a backup");
    }
    return std::nullopt;  // a store of this format
  };
  std::optional<std::string> problem = check();
  if (!problem) return;
  if (!problem->empty()) throw Error(ErrorCode::kInvalidArgument, *problem);
  if (!create) {
    throw Error(ErrorCode::kStorage, "no percolite store in schema " + target_.schema + " of '" +
                                         target_.display + "', and create=False");
  }
  // Created in one transaction, under a lock, so openers racing to create it
  // take turns and the second finds it whole.
  const std::string s = "\"" + target_.schema + "\"";
  Exec(conn, "BEGIN", "creating the store", target_);
  try {
    Exec(conn, "SELECT pg_advisory_xact_lock(hashtext('percolite:" + target_.schema + "'))",
         "creating the store", target_);
    problem = check();
    if (problem && problem->empty()) {
      ExecScript(
          conn,
          "CREATE SCHEMA IF NOT EXISTS " + s + ";" + "CREATE TABLE " + s +
              ".meta (name text PRIMARY KEY, value bytea NOT NULL);" + "CREATE TABLE " + s +
              ".clock (id smallint PRIMARY KEY CHECK (id = 1), ts bigint NOT NULL);" +
              "INSERT INTO " + s + ".clock VALUES (1, 0);" + "CREATE TABLE " + s +
              ".cells (key bytea NOT NULL, ts bigint NOT NULL, state smallint NOT NULL, "
              "value bytea NOT NULL, purged_ts bigint);" +
              "CREATE INDEX cells_key ON " + s + ".cells (" PREFIX("key") ", ts);" +
              "CREATE TABLE " + s + ".notify (nkey bytea NOT NULL, stamp bigint NOT NULL);" +
              "CREATE UNIQUE INDEX notify_key ON " + s + ".notify (sha256(nkey));" +
              "CREATE INDEX notify_order ON " + s + ".notify (" PREFIX("nkey") ");" +
              "CREATE TABLE " + s + ".acks (key bytea NOT NULL, ts bigint NOT NULL);" +
              "CREATE UNIQUE INDEX acks_key ON " + s + ".acks (sha256(key));" +
              "CREATE INDEX cells_purged ON " + s +
              ".cells (purged_ts) WHERE purged_ts IS NOT NULL;" + "CREATE TABLE " + s +
              ".garbage (key bytea NOT NULL, ts bigint NOT NULL);" + "CREATE INDEX garbage_ts ON " +
              s + ".garbage (ts);" + "CREATE TABLE " + s +
              ".handles (id bytea PRIMARY KEY, horizon bigint NOT NULL, seen timestamptz NOT "
              "NULL, token bytea);" +
              "INSERT INTO " + s + ".meta VALUES ('observed', ''::bytea), ('" +
              std::string(kFormatName) + "', '" + std::string(kFormat) + "'::bytea);",
          "creating the store", target_);
    } else if (problem) {
      throw Error(ErrorCode::kInvalidArgument, *problem);
    }
    Exec(conn, "COMMIT", "creating the store", target_);
  } catch (...) {
    Rollback(conn);
    throw;
  }
}

const BackendCapabilities& PgBackend::capabilities() const {
  static const BackendCapabilities kPostgres{"postgresql", /*persistent=*/true,
                                             /*cross_process=*/true, /*durable=*/true,
                                             /*max_value_size=*/(size_t{1} << 30) - 64};
  return kPostgres;
}

bool PgBackend::ForkedAway() const { return state_.ForkedAway(); }

void PgBackend::CheckUsable() const { state_.Check(); }

bool PgBackend::ReconnectWriter() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kReconnectSeconds);
  std::chrono::milliseconds pause(10);
  for (;;) {
    try {
      PGconn* fresh = Connect();
      PQfinish(writer_conn_);
      writer_conn_ = fresh;
      return true;
    } catch (const Error&) {
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
}

bool PgBackend::CommitSettled(std::vector<Request>& batch, std::vector<CommitResult>* results,
                              std::vector<Notification>* written, std::string* error) {
  // A batch that the server drops the connection over every time (too large
  // a message, say) is given up after a few tries: its callers are told it
  // did not commit (it did not: each try was settled), and a batch of
  // several is then tried one commit at a time.
  constexpr int kMaxDrops = 3;
  for (int drops = 0;; ++drops) {
    if (drops == kMaxDrops) {
      results->clear();
      written->clear();
      *error = "postgresql (" + target_.display + "): the connection dropped " +
               std::to_string(kMaxDrops) + " times during this commit's batch (last: " + *error +
               "); it was not applied";
      return false;
    }
    if (state_.failed()) {
      results->clear();
      written->clear();
      *error = state_.failure();
      return false;
    }
    std::string token;
    std::random_device random;
    for (int i = 0; i < 2; ++i) AppendUint64BE(&token, (uint64_t{random()} << 32) | random());
    const int old_session = PQbackendPID(writer_conn_);
    if (CommitBatch(writer_conn_, batch, token, results, written, error)) return true;
    if (PQstatus(writer_conn_) == CONNECTION_OK) {
      results->clear();  // the server refused the batch: nothing of it applied
      written->clear();
      return false;
    }
    // The connection dropped somewhere in the batch, perhaps during COMMIT.
    // Settle what happened before anyone is told: reconnect, and read this
    // handle's token. The old session may still be alive on the server,
    // holding the counter row's lock (it takes it first); it is ended, and
    // the token read under that lock, so its commit is over either way.
    for (;;) {
      if (!ReconnectWriter()) {
        Fail("postgresql (" + target_.display + "): the connection was lost (" + *error +
             ") and the server did not come back within " + std::to_string(kReconnectSeconds) +
             " s; whether the last commits were applied is unknown: open the store again");
        results->clear();
        written->clear();
        return false;
      }
      try {
        Params pid;
        pid.Int8(static_cast<uint64_t>(old_session));
        Exec(writer_conn_, "SELECT pg_terminate_backend($1::int8::int)", pid,
             "ending the session a lost connection left", target_);
        Exec(writer_conn_, "BEGIN", "settling a commit cut off by a lost connection", target_);
        Exec(writer_conn_, "SELECT ts FROM " + Table("clock") + " WHERE id = 1 FOR UPDATE",
             "settling a commit cut off by a lost connection", target_);
        Params p;
        p.Bytes(handle_id_);
        Result r = Exec(writer_conn_, "SELECT token FROM " + Table("handles") + " WHERE id = $1", p,
                        "settling a commit cut off by a lost connection", target_);
        Exec(writer_conn_, "COMMIT", "settling a commit cut off by a lost connection", target_);
        if (r.rows() > 0 && !r.null(0, 0) && r.bytes(0, 0) == token) {
          batches_.fetch_add(1);
          return true;  // it committed: the results computed for it stand
        }
        break;  // not committed: run the batch again, validated anew
      } catch (const Error&) {
        if (PQstatus(writer_conn_) == CONNECTION_OK) Rollback(writer_conn_);
        // Lost again, or refused: reconnect and read the same token again.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }
}

void PgBackend::Heartbeat() {
  if (PQstatus(writer_conn_) != CONNECTION_OK && !ReconnectWriter()) return;
  try {
    Result r = Exec(writer_conn_, "SELECT ts FROM " + Table("clock") + " WHERE id = 1",
                    "publishing the oldest snapshot", target_);
    Publish(writer_conn_, r.int8(0, 0), nullptr);
  } catch (const Error&) {
    // The next batch or heartbeat tries again.
  }
}

void PgBackend::Fail(const std::string& why) { state_.Fail(ErrorCode::kStorage, why); }

void PgBackend::Close() {
  if (ForkedAway()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();  // drains the queue first
  state_.MarkClosed();
  if (writer_conn_ != nullptr && PQstatus(writer_conn_) == CONNECTION_OK) {
    try {
      Params p;
      p.Bytes(handle_id_);
      Exec(writer_conn_, "DELETE FROM " + Table("handles") + " WHERE id = $1", p, "closing",
           target_);
    } catch (const Error&) {
      // Its row lapses by itself.
    }
  }
  PQfinish(writer_conn_);
  writer_conn_ = nullptr;
  std::lock_guard<std::mutex> lock(pool_mu_);
  for (PGconn* conn : idle_) PQfinish(conn);
  opened_ -= idle_.size();
  idle_.clear();
  pool_cv_.notify_all();
}

// ---------------------------------------------------------------------------

namespace {

class PgSnapshot final : public Snapshot {
 public:
  PgSnapshot(std::shared_ptr<PgBackend> store, uint64_t start_ts)
      : Snapshot(start_ts), store_(std::move(store)), sql_(store_->snapshot_sql()) {}
  ~PgSnapshot() override { Release(); }

  std::optional<std::string> Get(std::string_view encoded_key) override {
    CheckOpen("reading from");
    Params params;
    params.Bytes(encoded_key).Int8(start_ts());
    Result r = ReadQuery(store_.get(), sql_.get, params, "reading a cell", store_->target());
    if (r.rows() == 0 || r.int2(0, 0) != kLive) return std::nullopt;
    return std::string(r.bytes(0, 1));
  }

  bool Visit(std::string_view from, bool exclusive, std::string_view end,
             const CellVisitor& visit) override {
    CheckOpen("scanning");
    std::string resume(from);
    bool after = exclusive;
    size_t page = 128;
    for (;;) {
      Params params;
      params.Bytes(resume).Int8(start_ts()).Int8(page);
      if (!end.empty()) params.Bytes(end);
      std::optional<Result> rows;
      {
        rows.emplace(ReadQuery(store_.get(), sql_.visit[after][!end.empty()], params,
                               "scanning cells", store_->target()));
      }
      const int n = rows->rows();
      for (int i = 0; i < n; ++i) {
        if (rows->int2(i, 1) != kLive) continue;
        if (!visit(rows->bytes(i, 0), rows->bytes(i, 2))) return false;
      }
      if (static_cast<size_t>(n) < page) return true;
      resume.assign(rows->bytes(n - 1, 0));
      after = true;
      page = std::min<size_t>(page * 4, 8192);
    }
  }

  std::optional<uint64_t> NotificationStamp(std::string_view cell_key) override {
    CheckOpen("reading from");
    std::string row;
    if (!RowOfCellKey(cell_key, &row)) return std::nullopt;
    Params params;
    params.Bytes(NotificationKey(RowHash(row), cell_key));
    Result r = ReadQuery(store_.get(),
                         "SELECT stamp FROM " + store_->Table("notify") +
                             " WHERE sha256(nkey) = sha256($1) AND nkey = $1",
                         params, "reading a notification", store_->target());
    if (r.rows() == 0) return std::nullopt;
    const uint64_t stamp = r.int8(0, 0);
    if (stamp > start_ts()) return std::nullopt;
    return stamp;
  }

  void Release() override {
    if (released_) return;
    released_ = true;
    if (!store_->ForkedAway()) store_->ForgetSnapshot(start_ts());
  }

 private:
  void CheckOpen(const char* what) const {
    store_->CheckUsable();
    if (released_) throw Error(ErrorCode::kClosed, std::string(what) + " a released snapshot");
  }

  std::shared_ptr<PgBackend> store_;
  const PgBackend::SnapshotSql& sql_;  // the store's, built once
  bool released_ = false;
};

// Waits on LISTEN, on a connection of its own, and on an eventfd for Interrupt.
class PgWorkWatch final : public WorkWatch {
 public:
  PgWorkWatch(std::shared_ptr<PgBackend> store) : store_(std::move(store)) {
    conn_ = store_->Connect();
    try {
      Exec(conn_, "LISTEN " + store_->channel(), "listening for commits", store_->target());
    } catch (...) {
      PQfinish(conn_);
      throw;
    }
    interrupt_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~PgWorkWatch() override {
    if (!store_->ForkedAway()) PQfinish(conn_);
    if (interrupt_fd_ >= 0) ::close(interrupt_fd_);
  }

  unsigned Wait(int timeout_ms) override {
    // Not listening (the server went away, and was not back at the last
    // try): try again now; while it stays away, wait on Interrupt alone and
    // say work may exist, so the scanner looks as often as it waits.
    const bool listening = PQstatus(conn_) == CONNECTION_OK || Reconnect();
    unsigned events = listening ? Drain() : kCommitted;
    if (listening && events != kTimeout) return events;
    pollfd fds[2] = {{listening ? PQsocket(conn_) : -1, POLLIN, 0}, {interrupt_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, std::max(0, timeout_ms));
    if (ready > 0 && (fds[1].revents & POLLIN)) {
      uint64_t count;
      while (::read(interrupt_fd_, &count, sizeof count) > 0) {
      }
      events |= kInterrupted;
    }
    if (ready > 0 && (fds[0].revents & (POLLIN | POLLERR | POLLHUP))) {
      if (PQconsumeInput(conn_) == 0 || PQstatus(conn_) != CONNECTION_OK) {
        // The server went away: say work may exist (the scanner looks, and
        // its reads report the trouble), and listen again on a new connection.
        Reconnect();
        events |= kCommitted;
      }
    }
    return events | Drain();
  }

  void Interrupt() override {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(interrupt_fd_, &one, sizeof one);
  }

 private:
  unsigned Drain() {
    unsigned events = kTimeout;
    PQconsumeInput(conn_);
    while (PGnotify* n = PQnotifies(conn_)) {
      events |= (n->extra && n->extra[0] == 'w') ? kWaiterSignal : kCommitted;
      PQfreemem(n);
    }
    return events;
  }

  // Listens on a new connection; false when the server cannot be reached
  // (the broken connection stays, and the next Wait tries again).
  bool Reconnect() {
    PGconn* fresh = nullptr;
    try {
      fresh = store_->Connect();
      Exec(fresh, "LISTEN " + store_->channel(), "listening for commits", store_->target());
    } catch (const Error&) {
      PQfinish(fresh);
      return false;
    }
    PQfinish(conn_);
    conn_ = fresh;
    return true;
  }

  std::shared_ptr<PgBackend> store_;
  PGconn* conn_ = nullptr;
  int interrupt_fd_ = -1;
};

// Polls instead of listening (poll_interval in the target): for servers that
// speak PostgreSQL's protocol without LISTEN/NOTIFY. Says "committed" every
// interval, so the scanner looks for work that often.
class PgPollWatch final : public WorkWatch {
 public:
  explicit PgPollWatch(double seconds)
      : interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(seconds))),
        next_(std::chrono::steady_clock::now() + interval_) {}

  unsigned Wait(int timeout_ms) override {
    std::unique_lock<std::mutex> lock(mu_);
    const auto until = std::min(next_, std::chrono::steady_clock::now() +
                                           std::chrono::milliseconds(std::max(0, timeout_ms)));
    cv_.wait_until(lock, until, [&] { return interrupted_; });
    unsigned events = kTimeout;
    if (interrupted_) events |= kInterrupted;
    interrupted_ = false;
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_) {
      events |= kCommitted;
      next_ = now + interval_;
    }
    return events;
  }

  void Interrupt() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      interrupted_ = true;
    }
    cv_.notify_all();
  }

 private:
  const std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point next_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool interrupted_ = false;
};

// The tables as commit_rules.h uses them: what the batch read before
// validating, overlaid with what its earlier commits wrote; writes are
// buffered and sent once the batch is decided.
class PgTables {
 public:
  std::optional<uint64_t> CellWrittenTs(std::string_view key) {
    auto it = written_.find(std::string(key));
    if (it != written_.end()) return it->second;
    return std::nullopt;
  }
  std::optional<uint64_t> AckTs(std::string_view cell_key) {
    auto it = acks_.find(std::string(cell_key));
    if (it == acks_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<uint64_t> NotificationStampAt(std::string_view key) {
    auto it = notify_.find(std::string(key));
    if (it == notify_.end()) return std::nullopt;
    return it->second;
  }
  void PutCell(std::string_view key, uint64_t commit_ts, bool is_delete, std::string_view value) {
    std::string k(key);
    // A version that supersedes another, or a tombstone: collectable later.
    auto [it, fresh] = written_.try_emplace(k, commit_ts);
    if (!fresh || is_delete) {
      garbage_keys.push_back(k);
      garbage_ts.push_back(commit_ts);
    }
    it->second = commit_ts;
    cell_keys.push_back(std::move(k));
    cell_ts.push_back(commit_ts);
    cell_states.push_back(is_delete ? kDeleted : kLive);
    cell_values.emplace_back(is_delete ? std::string_view() : value);
  }
  void PurgeCell(std::string_view key) {
    written_.erase(std::string(key));
    purge_keys.emplace_back(key);
    purge_ts.push_back(ts_);
  }
  void PurgeRange(std::string_view from, std::string_view end) {
    for (auto it = written_.lower_bound(std::string(from));
         it != written_.end() && it->first < end;) {
      it = written_.erase(it);
    }
    ranges.push_back({std::string(from), std::string(end), ts_});
  }
  void PutNotification(std::string_view key, uint64_t stamp) { notify_[std::string(key)] = stamp; }
  void RemoveNotification(std::string_view key) { notify_[std::string(key)] = std::nullopt; }
  void PutAck(std::string_view cell_key, uint64_t commit_ts) {
    acks_[std::string(cell_key)] = commit_ts;
    acks_changed_.insert(std::string(cell_key));
  }

  // What the batch read: a cell's newest ts, an ack, a notification's stamp.
  void LoadCell(std::string key, uint64_t ts) { written_[std::move(key)] = ts; }
  void LoadAck(std::string key, uint64_t ts) { acks_[std::move(key)] = ts; }
  void LoadNotification(std::string key, uint64_t stamp) { notify_[std::move(key)] = stamp; }
  // Notification keys read or written, and their final state.
  const std::map<std::string, std::optional<uint64_t>>& notifications() const { return notify_; }
  std::set<std::string> notifications_read;
  std::vector<std::string> changed_acks() const {
    return {acks_changed_.begin(), acks_changed_.end()};
  }
  uint64_t ack(const std::string& key) const { return acks_.at(key); }

  void set_ts(uint64_t ts) { ts_ = ts; }

  // Buffered writes.
  std::vector<std::string> garbage_keys;
  std::vector<uint64_t> garbage_ts;
  std::vector<std::string> cell_keys;
  std::vector<uint64_t> cell_ts;
  std::vector<uint64_t> cell_states;
  std::vector<std::string> cell_values;
  std::vector<std::string> purge_keys;
  std::vector<uint64_t> purge_ts;
  struct Range {
    std::string from, end;
    uint64_t ts;
  };
  std::vector<Range> ranges;

 private:
  uint64_t ts_ = 0;
  std::map<std::string, uint64_t, std::less<>> written_;
  std::map<std::string, uint64_t> acks_;
  std::set<std::string> acks_changed_;
  std::map<std::string, std::optional<uint64_t>> notify_;
};

}  // namespace

std::unique_ptr<Snapshot> PgBackend::BeginSnapshot() {
  CheckUsable();
  {
    std::lock_guard<std::mutex> lock(snapshots_mu_);
    ++beginning_;
  }
  uint64_t start_ts = 0;
  try {
    Result r = ReadQuery(this, "SELECT ts FROM " + Table("clock") + " WHERE id = 1",
                         "beginning a snapshot", target_);
    start_ts = r.int8(0, 0);
  } catch (...) {
    std::lock_guard<std::mutex> lock(snapshots_mu_);
    --beginning_;
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(snapshots_mu_);
    --beginning_;
    snapshots_.insert(start_ts);
  }
  return std::make_unique<PgSnapshot>(shared_from_this(), start_ts);
}

void PgBackend::ForgetSnapshot(uint64_t start_ts) {
  std::lock_guard<std::mutex> lock(snapshots_mu_);
  auto it = snapshots_.find(start_ts);
  if (it != snapshots_.end()) snapshots_.erase(it);
}

void PgBackend::ForgetPending(uint64_t start_ts) {
  std::lock_guard<std::mutex> lock(snapshots_mu_);
  auto it = pending_starts_.find(start_ts);
  if (it != pending_starts_.end()) pending_starts_.erase(it);
}

uint64_t PgBackend::Horizon(uint64_t clock) {
  std::lock_guard<std::mutex> lock(snapshots_mu_);
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
  Params p;
  p.Bytes(handle_id_).Int8(Horizon(clock));
  if (token != nullptr) p.Bytes(*token);
  Exec(conn,
       "INSERT INTO " + Table("handles") + " VALUES ($1, $2, clock_timestamp()" +
           (token ? ", $3" : ", NULL") +
           ") ON CONFLICT (id) DO UPDATE SET horizon = excluded.horizon, seen = clock_timestamp()" +
           (token ? ", token = excluded.token" : ""),
       p, "publishing the oldest snapshot", target_);
}

void PgBackend::Collect(PGconn* conn) {
  // Every handle seen lately published the oldest start_ts its snapshots
  // may have; versions superseded at or before the least of them, and
  // tombstones and purges at or before it, are read by nobody.
  const std::string cells = Table("cells");
  Result r = Exec(
      conn,
      "WITH h AS (SELECT min(horizon) AS ts FROM " + Table("handles") +
          " WHERE seen > clock_timestamp() - interval '" + std::to_string(kHandleLeaseSeconds) +
          " seconds'), g AS (DELETE FROM " + Table("garbage") +
          " WHERE ts <= (SELECT ts FROM h) RETURNING key, ts), gone AS (DELETE FROM " + cells +
          " c USING g WHERE " PREFIX("c.key") " = " PREFIX("g.key") " AND c.key = g.key AND "
          "(c.ts < g.ts OR (c.ts = g.ts AND c.state = 1)) RETURNING c.state), purged AS (DELETE "
          "FROM " +
          cells +
          " WHERE purged_ts <= (SELECT ts FROM h) RETURNING 1) SELECT (SELECT count(*) FROM gone "
          "WHERE state = 1), (SELECT count(*) FROM purged)",
      "collecting old versions", target_);
  tombstones_collected_.fetch_add(r.int8(0, 0));
}

void PgBackend::CommitAsync(uint64_t start_ts, std::vector<Mutation> mutations, CommitExtras extras,
                            CommitCallback done) {
  CheckUsable();
  {
    // Its start_ts holds back collection until it is decided, as an open
    // snapshot would: a tombstone its validation needs stays.
    std::lock_guard<std::mutex> lock(snapshots_mu_);
    pending_starts_.insert(start_ts);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ForgetPending(start_ts);
      throw Error(ErrorCode::kClosed, "committing: the postgresql store is closed");
    }
    queue_.push_back(Request{start_ts, std::move(mutations), std::move(extras), std::move(done)});
  }
  cv_.notify_one();
}

void PgBackend::WriterLoop() {
  for (;;) {
    std::vector<Request> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty() && stopping_) return;  // drained
      if (queue_.empty()) {
        // Idle: tell the other handles this one lives, with its oldest snapshot.
        lock.unlock();
        Heartbeat();
        continue;
      }
      while (!queue_.empty() && batch.size() < std::max<size_t>(options_.max_batch, 1)) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    std::vector<CommitResult> results;
    std::vector<Notification> written;
    std::string error;
    const std::string failed = state_.failure();
    bool ok = false;
    if (failed.empty()) {
      ok = CommitSettled(batch, &results, &written, &error);
      if (!ok && batch.size() > 1 && PQstatus(writer_conn_) == CONNECTION_OK) {
        // One commit may have made the server refuse the batch: try each alone.
        for (Request& request : batch) {
          std::vector<Request> one;
          one.push_back(std::move(request));
          std::vector<CommitResult> result;
          std::vector<Notification> notes;
          std::string why;
          if (CommitSettled(one, &result, &notes, &why)) {
            written.insert(written.end(), notes.begin(), notes.end());
            results.push_back(result[0]);
          } else {
            results.push_back(CommitResult{Status::Make(ErrorCode::kStorage, why), 0});
          }
          request = std::move(one[0]);
        }
        ok = true;
      }
    } else {
      error = failed;
    }
    if (!ok)
      results.assign(batch.size(), CommitResult{Status::Make(ErrorCode::kStorage, error), 0});
    sink_.Offer(written);
    if (ok) {
      try {
        Collect(writer_conn_);
      } catch (const Error&) {
        // Collecting waits for the next batch; the commits stand.
      }
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      if (results[i].status.ok()) commits_.fetch_add(1);
      if (results[i].status.code() == ErrorCode::kConflict) conflicts_.fetch_add(1);
      batch[i].done(results[i]);
      ForgetPending(batch[i].start_ts);
    }
  }
}

bool PgBackend::CommitBatch(PGconn* conn, std::vector<Request>& batch, const std::string& token,
                            std::vector<CommitResult>* results, std::vector<Notification>* written,
                            std::string* error) {
  results->clear();
  written->clear();
  try {
    Exec(conn, "BEGIN", "committing", target_);
    Result head = Exec(conn,
                       "SELECT c.ts, m.value FROM " + Table("clock") + " c, " + Table("meta") +
                           " m WHERE c.id = 1 AND m.name = 'observed' FOR UPDATE OF c",
                       "committing", target_);
    if (head.rows() != 1) {
      throw Error(ErrorCode::kCorruption, "the store in schema " + target_.schema +
                                              " has no counter or no observed-columns record");
    }
    uint64_t ts = head.int8(0, 0);
    StrongColumns strong;
    if (!strong.Load(head.bytes(0, 1))) {
      throw Error(ErrorCode::kCorruption, "the store's observed columns cannot be read");
    }
    // What validation needs, in three statements.
    std::vector<std::string> keys, triggers, trigger_notes;
    std::string row;
    for (const Request& r : batch) {
      for (const Mutation& m : r.mutations) {
        if (!m.stamped && !m.purge) keys.push_back(m.key);
      }
      if (r.extras.trigger) {
        triggers.push_back(*r.extras.trigger);
        if (RowOfCellKey(*r.extras.trigger, &row)) {
          trigger_notes.push_back(NotificationKey(RowHash(row), *r.extras.trigger));
        }
      }
    }
    PgTables tables;
    if (!keys.empty()) {
      Params p;
      p.ByteaArray(keys);
      Result found = Exec(conn,
                          "SELECT c.key, max(c.ts) FROM unnest($1::bytea[]) AS u(k) JOIN " +
                              Table("cells") + " c ON " PREFIX("c.key") " = " PREFIX("u.k") +
                              " AND c.key = u.k WHERE c.purged_ts IS NULL GROUP BY c.key",
                          p, "committing", target_);
      for (int i = 0; i < found.rows(); ++i) {
        tables.LoadCell(std::string(found.bytes(i, 0)), found.int8(i, 1));
      }
    }
    if (!triggers.empty()) {
      Params p;
      p.ByteaArray(triggers);
      Result found = Exec(conn,
                          "SELECT a.key, a.ts FROM unnest($1::bytea[]) AS u(k) JOIN " +
                              Table("acks") + " a ON sha256(a.key) = sha256(u.k) AND a.key = u.k",
                          p, "committing", target_);
      for (int i = 0; i < found.rows(); ++i) {
        tables.LoadAck(std::string(found.bytes(i, 0)), found.int8(i, 1));
      }
      Params q;
      q.ByteaArray(trigger_notes);
      Result notes =
          Exec(conn,
               "SELECT n.nkey, n.stamp FROM unnest($1::bytea[]) AS u(k) JOIN " + Table("notify") +
                   " n ON sha256(n.nkey) = sha256(u.k) AND n.nkey = u.k",
               q, "committing", target_);
      for (int i = 0; i < notes.rows(); ++i) {
        tables.LoadNotification(std::string(notes.bytes(i, 0)), notes.int8(i, 1));
      }
    }
    std::vector<Notification> notes;
    for (const Request& r : batch) {
      const bool has_extras = r.extras.trigger || !r.extras.weak_notifications.empty();
      const CommitExtras* extras = has_extras ? &r.extras : nullptr;
      tables.set_ts(ts + 1);
      CommitResult result;
      result.status = ValidateCommit(tables, r.start_ts, r.mutations, extras);
      if (result.status.ok()) {
        result.commit_ts = ++ts;
        ApplyCommit(tables, strong, r.start_ts, ts, r.mutations, extras, &notes);
      }
      results->push_back(result);
    }
    // The writes: the batch's versions first.
    if (!tables.cell_keys.empty()) {
      Params p;
      p.ByteaArray(tables.cell_keys)
          .Int8Array(tables.cell_ts)
          .Int8Array(tables.cell_states)
          .ByteaArray(tables.cell_values);
      Exec(conn,
           "INSERT INTO " + Table("cells") +
               " (key, ts, state, value) SELECT k, t, s::smallint, v FROM "
               "unnest($1::bytea[], $2::int8[], $3::int8[], $4::bytea[]) AS u(k, t, s, v)",
           p, "committing", target_);
    }
    // Then the purges, each over the versions written before it (earlier
    // batches, and earlier commits of this one; never its own commit's or a
    // later one's writes), each version keeping the earliest purge's ts.
    if (!tables.purge_keys.empty()) {
      Params p;
      p.ByteaArray(tables.purge_keys).Int8Array(tables.purge_ts);
      Exec(conn,
           "UPDATE " + Table("cells") +
               " c SET purged_ts = p.ts FROM (SELECT key, min(ts) AS ts FROM "
               "unnest($1::bytea[], $2::int8[]) AS u(key, ts) GROUP BY key) AS p WHERE " PREFIX(
                   "c.key") " = " PREFIX("p.key") " AND c.key = p.key AND c.ts < p.ts AND "
                                                  "(c.purged_ts IS NULL OR c.purged_ts > p.ts)",
           p, "committing", target_);
    }
    const std::string purge_range =
        "UPDATE " + Table("cells") + " SET purged_ts = $3 WHERE " +
        PREFIX("key") " >= " PREFIX("$1::bytea") " AND " PREFIX("key") " <= " PREFIX("$2::bytea") +
        " AND key >= $1 AND key < $2 AND ts < $3 AND (purged_ts IS NULL OR purged_ts > $3)";
    for (const PgTables::Range& range : tables.ranges) {
      Params p;
      p.Bytes(range.from).Bytes(range.end).Int8(range.ts);
      Exec(conn, purge_range, p, "committing", target_);
    }
    std::vector<std::string> put_keys, removed;
    std::vector<uint64_t> put_stamps;
    for (const auto& [key, stamp] : tables.notifications()) {
      if (stamp) {
        put_keys.push_back(key);
        put_stamps.push_back(*stamp);
      } else {
        removed.push_back(key);
      }
    }
    if (!removed.empty()) {
      Params p;
      p.ByteaArray(removed);
      Exec(conn,
           "DELETE FROM " + Table("notify") +
               " n USING unnest($1::bytea[]) AS u(k) WHERE sha256(n.nkey) = sha256(u.k) AND "
               "n.nkey = u.k",
           p, "committing", target_);
    }
    if (!put_keys.empty()) {
      // Only those this batch wrote: loaded ones it left alone are rewritten as they were.
      Params p;
      p.ByteaArray(put_keys).Int8Array(put_stamps);
      Exec(conn,
           "INSERT INTO " + Table("notify") +
               " SELECT * FROM unnest($1::bytea[], $2::int8[]) ON CONFLICT ((sha256(nkey))) DO "
               "UPDATE SET stamp = excluded.stamp",
           p, "committing", target_);
    }
    const std::vector<std::string> acks = tables.changed_acks();
    if (!acks.empty()) {
      std::vector<uint64_t> ack_ts;
      for (const std::string& key : acks) ack_ts.push_back(tables.ack(key));
      Params p;
      p.ByteaArray(acks).Int8Array(ack_ts);
      Exec(conn,
           "INSERT INTO " + Table("acks") +
               " SELECT * FROM unnest($1::bytea[], $2::int8[]) ON CONFLICT ((sha256(key))) DO "
               "UPDATE SET ts = excluded.ts",
           p, "committing", target_);
    }
    if (!tables.garbage_keys.empty()) {
      Params p;
      p.ByteaArray(tables.garbage_keys).Int8Array(tables.garbage_ts);
      Exec(conn,
           "INSERT INTO " + Table("garbage") + " SELECT * FROM unnest($1::bytea[], $2::int8[])", p,
           "committing", target_);
    }
    // The batch's token, in its own transaction: if the connection drops
    // during COMMIT, the writer reconnects and reads it back to learn
    // whether the batch committed.
    Publish(conn, head.int8(0, 0), &token);
    Params clock;
    clock.Int8(ts);
    Exec(conn, "UPDATE " + Table("clock") + " SET ts = $1 WHERE id = 1", clock, "committing",
         target_);
    if (target_.poll_interval == 0) {
      Exec(conn, "SELECT pg_notify('" + channel_ + "', 'c')", "committing", target_);
    }
    *written = std::move(notes);  // kept on failure too: the token may show it committed
    Exec(conn, "COMMIT", "committing", target_);
    batches_.fetch_add(1);
    return true;
  } catch (const Error& e) {
    *error = e.what();
    if (PQstatus(conn) == CONNECTION_OK) Rollback(conn);
    return false;
  }
}

// ---------------------------------------------------------------------------

std::vector<ObservedColumn> PgBackend::ObservedColumns() {
  CheckUsable();
  Result r = ReadQuery(this, "SELECT value FROM " + Table("meta") + " WHERE name = 'observed'",
                       "reading the observed columns", target_);
  std::vector<ObservedColumn> columns;
  if (r.rows() > 0 && !DecodeObservedColumns(r.bytes(0, 0), &columns)) {
    throw Error(ErrorCode::kCorruption, "the store's observed columns cannot be read");
  }
  return columns;
}

void PgBackend::SetObservedColumns(const std::vector<ObservedColumn>& columns) {
  CheckUsable();
  const std::string encoded = EncodeObservedColumns(columns);
  StrongColumns check;
  if (!check.Load(encoded)) {
    throw Error(ErrorCode::kInvalidArgument, "the observed columns cannot be stored");
  }
  Params p;
  p.Bytes(encoded);
  ReadQuery(this, "UPDATE " + Table("meta") + " SET value = $1 WHERE name = 'observed'", p,
            "storing the observed columns", target_);
}

uint64_t PgBackend::PendingNotifications() {
  CheckUsable();
  Result r =
      ReadQuery(this, "SELECT count(*) FROM " + Table("notify"), "counting notifications", target_);
  return r.int8(0, 0);
}

bool PgBackend::ScanNotifications(std::string_view after, size_t limit,
                                  std::vector<Notification>* out) {
  CheckUsable();
  limit = std::min<size_t>(limit, size_t{1} << 62);  // SIZE_MAX: everything
  Params p;
  p.Bytes(after).Int8(limit + 1);
  Result r =
      ReadQuery(this,
                "SELECT nkey, stamp FROM " + Table("notify") +
                    " WHERE " PREFIX("nkey") " >= " PREFIX(
                        "$1::bytea") " AND nkey > $1 ORDER BY " PREFIX("nkey") ", nkey LIMIT $2",
                p, "scanning notifications", target_);
  const size_t n = static_cast<size_t>(r.rows());
  for (size_t i = 0; i < std::min(n, limit); ++i) {
    const std::string_view key = r.bytes(static_cast<int>(i), 0);
    if (key.size() < 8) continue;
    out->push_back(Notification{std::string(key.substr(8)), r.int8(static_cast<int>(i), 1),
                                ReadUint64BE(key)});
  }
  return n <= limit;
}

std::map<std::pair<std::string, std::string>, uint64_t> PgBackend::CountPendingByColumn() {
  CheckUsable();
  Result r =
      ReadQuery(this, "SELECT nkey FROM " + Table("notify"), "counting notifications", target_);
  std::map<std::pair<std::string, std::string>, uint64_t> counts;
  for (int i = 0; i < r.rows(); ++i) CountByColumn(r.bytes(i, 0), &counts);
  return counts;
}

void PgBackend::SetNotificationSink(NotificationSink* sink) {
  sink_.Set(sink, "workers are already running on this store handle (one worker pool per handle)");
}

void PgBackend::ClearNotificationSink(NotificationSink* sink) { sink_.Clear(sink); }

std::unique_ptr<WorkWatch> PgBackend::WatchForWork() {
  CheckUsable();
  if (target_.poll_interval > 0) return std::make_unique<PgPollWatch>(target_.poll_interval);
  return std::make_unique<PgWorkWatch>(shared_from_this());
}

bool PgBackend::SignalWaiting() {
  if (target_.poll_interval > 0) return false;  // no channel to signal on
  try {
    CheckUsable();
    ReadQuery(this, "SELECT pg_notify('" + channel_ + "', 'w')", "signalling a wait", target_);
    return true;
  } catch (const Error&) {
    return false;
  }
}

BackendStats PgBackend::Stats() const {
  BackendStats s;
  s.commits = commits_.load();
  s.conflicts = conflicts_.load();
  s.batches = batches_.load();
  s.tombstones_collected = tombstones_collected_.load();
  return s;
}

std::vector<std::string> PgBackend::VerifyStructure() {
  CheckUsable();
  // The server keeps its own pages and checksums; what percolite can check
  // is that the store is one of its format (checked at open, and again here).
  Lease lease = Borrow();
  CreateOrCheckSchema(lease.get(), /*create=*/false);
  return {};
}

}  // namespace percolite
