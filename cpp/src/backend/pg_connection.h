// pg_connection.h: talking to a PostgreSQL server through libpq: opening a
// connection, statements with binary parameters and results, and the small
// pool of connections that reads borrow for a statement.
//
// Every error names the server as the target shows it (PgTarget::display)
// and never its password (PgTarget::Hide on libpq's own messages).
#pragma once

#include <libpq-fe.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "handle_state.h"
#include "percolite/backend.h"
#include "percolite/mutex.h"
#include "percolite/pg_target.h"

namespace percolite {

// The types of the parameters percolite sends (pg_type's oids).
constexpr Oid kPgBoolOid = 16;
constexpr Oid kPgByteaOid = 17;
constexpr Oid kPgInt8Oid = 20;
constexpr Oid kPgTextOid = 25;
constexpr Oid kPgFloat8Oid = 701;
constexpr Oid kPgBoolArrayOid = 1000;
constexpr Oid kPgByteaArrayOid = 1001;
constexpr Oid kPgTextArrayOid = 1009;
constexpr Oid kPgInt8ArrayOid = 1016;
constexpr Oid kPgFloat8ArrayOid = 1022;

// A one-dimensional array in PostgreSQL's binary format, item by item:
// each item already in its element type's binary format, or NULL.
class PgArray {
 public:
  PgArray(Oid element, size_t count);
  void Add(std::string_view item);
  void AddNull();
  // The array; `count` items must have been added.
  std::string Done() &&;

 private:
  std::string out_;
  size_t count_, added_ = 0;
  bool nulls_ = false;
};

// Binary parameters of one statement (every one in PostgreSQL's binary format).
class PgParams {
 public:
  PgParams& Bytes(std::string_view value);
  PgParams& Bytes(std::string&& value);
  PgParams& Int8(uint64_t value);
  PgParams& ByteaArray(const std::vector<std::string>& items);
  PgParams& Int8Array(const std::vector<uint64_t>& items);
  PgParams& Null();

  int size() const { return static_cast<int>(values_.size()); }
  // Pointers into this object, for PQexecParams.
  void Prepare(std::vector<const char*>* pointers, std::vector<int>* lengths,
               std::vector<int>* formats) const;

 private:
  std::vector<std::string> values_;
  std::vector<bool> nulls_;  // by parameter, when any is NULL
};

// A statement's result (binary), freed on destruction.
class PgResult {
 public:
  explicit PgResult(PGresult* result) : result_(result) {}
  ~PgResult() { PQclear(result_); }
  PgResult(PgResult&& other) noexcept : result_(other.result_) { other.result_ = nullptr; }
  PgResult(const PgResult&) = delete;
  PgResult& operator=(const PgResult&) = delete;

  PGresult* get() const { return result_; }
  int rows() const { return PQntuples(result_); }
  bool null(int row, int column) const { return PQgetisnull(result_, row, column) != 0; }
  std::string_view bytes(int row, int column) const {
    return std::string_view(PQgetvalue(result_, row, column),
                            static_cast<size_t>(PQgetlength(result_, row, column)));
  }
  uint64_t int8(int row, int column) const;
  int16_t int2(int row, int column) const;

 private:
  PGresult* result_;
};

// Runs one statement with binary parameters and results; throws kStorage
// naming the server's message and `what` when it fails.
PgResult PgExec(PGconn* conn, const std::string& sql, const PgParams& params, const char* what,
                const PgTarget& target);
PgResult PgExec(PGconn* conn, const std::string& sql, const char* what, const PgTarget& target);
// Runs several statements without parameters (text results).
void PgExecScript(PGconn* conn, const std::string& sql, const char* what, const PgTarget& target);
// Ends the connection's transaction, ignoring errors (the connection may be gone).
void PgRollback(PGconn* conn);

// Statements sent to the server together and answered together: one round
// trip for all of them, however many (libpq's pipeline mode). A statement
// that fails makes the server skip the rest up to the next Run; in a
// transaction block, the block is then aborted and must be rolled back
// (after the pipeline is destroyed: ROLLBACK is a statement of its own).
class PgPipeline {
 public:
  // Throws kStorage when the connection cannot enter pipeline mode.
  PgPipeline(PGconn* conn, const PgTarget& target);
  // Leaves pipeline mode, reading any results left when a Run was cut short.
  ~PgPipeline();
  PgPipeline(const PgPipeline&) = delete;
  PgPipeline& operator=(const PgPipeline&) = delete;

  // Queues one statement with binary parameters and results; `what` names
  // it in an error. Throws kStorage when the connection broke.
  void Send(const std::string& sql, const PgParams& params, const char* what);
  void Send(const std::string& sql, const char* what) { Send(sql, PgParams(), what); }
  // Sends the statements queued since the last Run with a sync point and
  // reads their results, one per statement in order. Throws kStorage naming
  // the first that failed, once every result up to the sync point is read
  // (the connection stays usable), or as soon as the connection broke.
  std::vector<PgResult> Run();

 private:
  PGconn* const conn_;
  const PgTarget& target_;
  std::vector<const char*> queued_;  // what each statement queued is
  bool synced_ = true;               // no statement queued since the last sync point
};

// libpq's last message on `conn`, without its trailing newline.
std::string ServerMessage(PGconn* conn);

// Opens a new connection with synchronous_commit as `sync` asks; throws
// kStorage naming the server (not the password) when it cannot.
PGconn* PgConnect(const PgTarget& target, SyncMode sync);

// Connections for statements that need no session of their own: up to
// `size` open at once, kept idle between uses. Thread safe.
class PgPool {
 public:
  // A connection of the pool for one statement or a few; handed back (or
  // closed, when broken or inside a transaction) on destruction.
  class Lease {
   public:
    Lease(PgPool* pool, PGconn* conn) : pool_(pool), conn_(conn) {}
    ~Lease();
    Lease(Lease&& other) noexcept : pool_(other.pool_), conn_(other.conn_) {
      other.pool_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    PGconn* get() const { return conn_; }

   private:
    PgPool* pool_;
    PGconn* conn_;
  };

  // `state` is the handle's: once it is closed, the pool lends nothing.
  PgPool(const PgTarget& target, SyncMode sync, const HandleState& state, size_t size)
      : target_(target), sync_(sync), state_(state), size_(size) {}
  PgPool(const PgPool&) = delete;
  PgPool& operator=(const PgPool&) = delete;

  // An idle connection, or a new one while fewer than `size` are open;
  // waits for one otherwise. kClosed once the handle is closed.
  Lease Borrow() EXCLUDES(mu_);
  // One statement on a connection of the pool. A connection that broke (the
  // server restarted, the network dropped) is dropped and the statement
  // tried again on a new one, with back-off, for up to the target's
  // reconnect_timeout:
  // reads and the few idempotent writes made this way never half-apply.
  PgResult Query(const std::string& sql, const PgParams& params, const char* what) EXCLUDES(mu_);
  // Closes the idle connections and wakes every Borrow (call once the
  // handle is marked closed); leased ones close as they come back.
  void Close() EXCLUDES(mu_);

 private:
  void Return(PGconn* conn) EXCLUDES(mu_);

  const PgTarget& target_;
  const SyncMode sync_;
  const HandleState& state_;
  const size_t size_;

  Mutex mu_;
  CondVar returned_;  // a connection came back, or was closed
  std::vector<PGconn*> idle_ GUARDED_BY(mu_);
  size_t opened_ GUARDED_BY(mu_) = 0;  // idle and leased
};

}  // namespace percolite
