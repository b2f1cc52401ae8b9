// The native path of percolite.exporters.Postgres (export_queue.h, "Native
// sinks"): a batch is one transaction of two statements, the exporter's own
// SQL, whose parameters are arrays bound straight from the queued bytes:
// the first raises the guards (and checks the owner and the key columns'
// types), the second writes the rows of the entries whose guard rose. The
// fixed codecs' bytes are already PostgreSQL's binary formats: a str is
// UTF-8 text, an int64 or float64 eight big-endian bytes, as int8 and float8
// are sent. The server checks what the exporter would refuse (text that is
// not UTF-8 or holds NUL): such a transaction fails, is rolled back whole,
// and the batch goes to the exporter.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/pg_connection.h"
#include "child_safe_mutex.h"
#include "percolite/encoding.h"
#include "percolite/export_queue.h"
#include "percolite/pg_target.h"
#include "sink_rows.h"

namespace percolite {
namespace {

// How a cell's items are sent: their type, and the type of their array.
struct CellTypes {
  Oid element, array;
};

CellTypes TypesOf(SinkCell cell) {
  switch (cell) {
    case SinkCell::kText:
      return {kPgTextOid, kPgTextArrayOid};
    case SinkCell::kBlob:
      return {kPgByteaOid, kPgByteaArrayOid};
    case SinkCell::kInt64:
      return {kPgInt8Oid, kPgInt8ArrayOid};
    case SinkCell::kFloat64:
      return {kPgFloat8Oid, kPgFloat8ArrayOid};
  }
  return {0, 0};
}

// The statements with parameters, prepared on a connection when first used.
enum Statement { kRaise, kRaiseUnowned, kWrite, kStatements };
const char* const kStatementNames[kStatements] = {"percolite_raise", "percolite_raise_unowned",
                                                  "percolite_write"};

struct Connection {
  PGconn* pg = nullptr;
  bool prepared[kStatements] = {};
};

// The numbers of an int8[] in PostgreSQL's text form ("{1,2,3}").
std::unordered_set<uint64_t> ParseInt8Array(std::string_view text) {
  std::unordered_set<uint64_t> out;
  uint64_t value = 0;
  bool digits = false;
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      value = value * 10 + static_cast<uint64_t>(c - '0');
      digits = true;
    } else if (digits) {
      out.insert(value);
      value = 0;
      digits = false;
    }
  }
  return out;
}

// Whether `a` sorts before `b` as the exporter orders keys: by the value of
// each cell in turn (numbers as numbers, text and bytes by their bytes).
bool KeyBefore(const std::vector<SinkCell>& cells, std::string_view a, std::string_view b) {
  if (WholeCell(cells)) return a < b;
  for (size_t i = 0; i < cells.size(); ++i) {
    const std::string_view x = a.substr(8 * i, 8), y = b.substr(8 * i, 8);
    if (cells[i] == SinkCell::kFloat64) {
      const double u = SinkDouble(x), v = SinkDouble(y);
      if (u != v) return u < v;
    } else {
      const auto u = static_cast<int64_t>(ReadUint64BE(x));
      const auto v = static_cast<int64_t>(ReadUint64BE(y));
      if (u != v) return u < v;
    }
  }
  return false;
}

// An error of a connection that broke or of a server that is going away or
// took the connection read-only (a standby after a failover): an outage,
// and the connection is not kept.
bool LostServer(PGconn* conn, const PGresult* result) {
  if (PQstatus(conn) != CONNECTION_OK) return true;
  const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
  if (state == nullptr) return true;  // no answer from the server
  const std::string code(state);
  return code.compare(0, 2, "08") == 0 || code.compare(0, 3, "57P") == 0 || code == "25006";
}

class PostgresSink final : public CountingSink {
 public:
  explicit PostgresSink(PostgresSinkOptions options)
      : CountingSink(SinkCells(options.key_cells, options.value_cells)),
        options_(std::move(options)) {
    if (options_.connect.empty() || options_.connect[0].first != "dbname") {
      throw Error(ErrorCode::kInvalidArgument, "the first connection keyword must be dbname");
    }
    if (options_.raise.empty() || options_.raise_unowned.empty() || options_.write.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "a statement of the native path is missing");
    }
    for (SinkCell cell : options_.key_cells) types_.push_back(TypesOf(cell).array);
    for (SinkCell cell : options_.value_cells) types_.push_back(TypesOf(cell).array);
    types_.insert(types_.begin(), {kPgTextOid, kPgInt8Oid});
    types_.push_back(kPgInt8ArrayOid);
    types_.push_back(kPgBoolArrayOid);
  }

  ~PostgresSink() override {
    std::lock_guard<ChildSafeMutex> lock(mu_);
    DropIdle();
  }

  std::optional<Status> Apply(const std::vector<SinkRow>& rows,
                              const StoreIdentity& store) override {
    // The queue hands keys over by their bytes; the exporter takes them by
    // value, and two paths writing one key must lock in the same order.
    // Text and bytes sort the same both ways: only numbers are sorted again.
    std::vector<SinkRow> ordered;
    if (!by_bytes_) {
      ordered = rows;
      std::sort(ordered.begin(), ordered.end(), [this](const SinkRow& a, const SinkRow& b) {
        return KeyBefore(cells().key(), a.key, b.key);
      });
    }
    std::string failure;
    std::optional<Connection> conn = Take(&failure);
    if (conn) return Write(&*conn, by_bytes_ ? rows : ordered, store);
    if (failure.empty()) return std::nullopt;
    return Status::Make(ErrorCode::kSinkUnavailable, failure);
  }

  void Close() override {
    std::lock_guard<ChildSafeMutex> lock(mu_);
    closed_ = true;
    DropIdle();
  }

 private:
  // An idle connection or a new one; nullopt with `failure` empty when the
  // exporter must take the batch (closed, or its SQL does not fit the
  // sink's tables), or naming why the server cannot be reached.
  std::optional<Connection> Take(std::string* failure) {
    {
      std::lock_guard<ChildSafeMutex> lock(mu_);
      if (closed_ || unfit_.load()) return std::nullopt;
      if (pid_ != getpid()) {
        // A forked child: the parent's connections are left alone, unused
        // (closing one would end the parent's session on the shared socket).
        idle_.clear();
        pid_ = getpid();
      }
      if (!idle_.empty()) {
        Connection conn = idle_.back();
        idle_.pop_back();
        return conn;
      }
    }
    std::vector<const char*> keywords, values;
    for (const auto& [keyword, value] : options_.connect) {
      keywords.push_back(keyword.c_str());
      values.push_back(value.c_str());
    }
    keywords.push_back(nullptr);
    values.push_back(nullptr);
    Connection conn;
    conn.pg = PQconnectdbParams(keywords.data(), values.data(), /*expand_dbname=*/1);
    if (conn.pg == nullptr || PQstatus(conn.pg) != CONNECTION_OK) {
      *failure = options_.name + ": cannot connect: " + HidePasswords(ServerMessage(conn.pg));
      PQfinish(conn.pg);
      return std::nullopt;
    }
    // The server's notices (warnings) are not the user's to read on stderr.
    PQsetNoticeProcessor(
        conn.pg, [](void*, const char*) {}, nullptr);
    return conn;
  }

  // Hands `conn` back to the idle ones (or closes it once the sink is closed).
  void Give(Connection conn) {
    std::lock_guard<ChildSafeMutex> lock(mu_);
    if (closed_ || pid_ != getpid()) {
      if (pid_ == getpid()) PQfinish(conn.pg);
      return;
    }
    idle_.push_back(conn);
  }

  void DropIdle() {  // with mu_ held
    if (pid_ == getpid()) {
      for (Connection& conn : idle_) PQfinish(conn.pg);
    }
    idle_.clear();
  }

  // The batch's transaction on `conn`, which goes back to the idle ones
  // unless a statement failed.
  std::optional<Status> Write(Connection* conn, const std::vector<SinkRow>& rows,
                              const StoreIdentity& store) {
    const Statement raise = store.id.empty() ? kRaiseUnowned : kRaise;
    for (Statement which : {raise, kWrite}) {
      if (conn->prepared[which]) continue;
      const std::string& sql = which == kRaise          ? options_.raise
                               : which == kRaiseUnowned ? options_.raise_unowned
                                                        : options_.write;
      PgResult prepared(PQprepare(conn->pg, kStatementNames[which], sql.c_str(),
                                  static_cast<int>(types_.size()), types_.data()));
      if (PQresultStatus(prepared.get()) != PGRES_COMMAND_OK) {
        return Failed(conn, prepared.get(), /*preparing=*/true);
      }
      conn->prepared[which] = true;
    }
    // A statement's parameters stay with libpq once it is sent.
    auto send = [&](Statement which, const std::vector<SinkRow>& batch) {
      return [this, &store, which, &batch](PGconn* pg) {
        PgParams params = Params(batch, store, /*values=*/which == kWrite);
        std::vector<const char*> pointers;
        std::vector<int> lengths, formats;
        params.Prepare(&pointers, &lengths, &formats);
        return PQsendQueryPrepared(pg, kStatementNames[which], params.size(), pointers.data(),
                                   lengths.data(), formats.data(), /*resultFormat=*/0);
      };
    };
    auto plain = [](const char* sql) {
      return [sql](PGconn* pg) {
        return PQsendQueryParams(pg, sql, 0, nullptr, nullptr, nullptr, nullptr, 0);
      };
    };
    // One round trip: BEGIN and the guards.
    std::vector<PgResult> first;
    if (!Together(conn->pg, {plain("BEGIN"), send(raise, rows)}, &first)) {
      return Failed(conn, nullptr, false);
    }
    for (size_t i = 0; i < first.size(); ++i) {
      const ExecStatusType want = i == 0 ? PGRES_COMMAND_OK : PGRES_TUPLES_OK;
      if (PQresultStatus(first[i].get()) != want) return Failed(conn, first[i].get(), false);
    }
    const PgResult& raised = first[1];
    if (raised.rows() != 1 || raised.null(0, 2) || raised.bytes(0, 2) != "t") {
      unfit_.store(true);  // key columns of other types: never native again
    }
    if (raised.rows() != 1 || raised.null(0, 0) || raised.bytes(0, 0) != "t") {
      // Nothing was written. Not the store's sink (yet): the exporter
      // adopts it, moves it to a new epoch, or refuses the batch; or a
      // table the exporter must write itself.
      PgResult ended(PQexec(conn->pg, "ROLLBACK"));
      if (PQresultStatus(ended.get()) != PGRES_COMMAND_OK) return Failed(conn, ended.get(), false);
      Give(*conn);
      return std::nullopt;
    }
    // The entries whose guard rose (seqs are unique): those to write.
    const std::unordered_set<uint64_t> newer =
        raised.null(0, 1) ? std::unordered_set<uint64_t>() : ParseInt8Array(raised.bytes(0, 1));
    std::vector<SinkRow> writing;
    for (const SinkRow& row : rows) {
      if (newer.count(row.seq) != 0) writing.push_back(row);
    }
    // One more: the rows, and COMMIT.
    std::vector<std::function<int(PGconn*)>> last;
    if (!writing.empty()) last.push_back(send(kWrite, writing));
    last.push_back(plain("COMMIT"));
    std::vector<PgResult> second;
    if (!Together(conn->pg, last, &second)) return Failed(conn, nullptr, false);
    for (const PgResult& result : second) {
      if (PQresultStatus(result.get()) != PGRES_COMMAND_OK) {
        return Failed(conn, result.get(), false);
      }
    }
    Give(*conn);
    return Status::Ok();
  }

  // Sends what each of `sends` queues, together, and reads one result per
  // statement: one round trip (libpq's pipeline mode). A statement that
  // fails makes the server skip the rest (PGRES_PIPELINE_ABORTED). False
  // when the connection broke or answered out of turn.
  static bool Together(PGconn* pg, const std::vector<std::function<int(PGconn*)>>& sends,
                       std::vector<PgResult>* results) {
    if (PQenterPipelineMode(pg) != 1) return false;
    for (const auto& queue : sends) {
      if (queue(pg) != 1) return false;
    }
    if (PQpipelineSync(pg) != 1) return false;
    for (size_t i = 0; i < sends.size(); ++i) {
      PGresult* result = PQgetResult(pg);
      if (result == nullptr) return false;
      results->emplace_back(result);
      PGresult* extra = PQgetResult(pg);  // the null that ends its results
      if (extra != nullptr) {
        PQclear(extra);
        return false;
      }
    }
    PgResult sync(PQgetResult(pg));
    return sync.get() != nullptr && PQresultStatus(sync.get()) == PGRES_PIPELINE_SYNC &&
           PQexitPipelineMode(pg) == 1;
  }

  // After a statement failed: the transaction is rolled back and the
  // connection closed (a broken one, or one whose prepared statements may
  // no longer fit the tables). A lost server is an outage; anything else
  // goes to the exporter, which reports it its way. A statement that
  // cannot be prepared for a reason other than a missing table (a column
  // of a type its cells do not convert to, a missing column or privilege:
  // SQLSTATE class 42) never will be: from then on every batch goes to the
  // exporter.
  std::optional<Status> Failed(Connection* conn, const PGresult* result, bool preparing) {
    const bool lost = LostServer(conn->pg, result);
    const std::string message = HidePasswords(ServerMessage(conn->pg));
    const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
    const std::string code = state != nullptr ? state : "";
    if (!lost && PQtransactionStatus(conn->pg) != PQTRANS_IDLE) PgRollback(conn->pg);
    PQfinish(conn->pg);
    conn->pg = nullptr;
    if (lost) return Status::Make(ErrorCode::kSinkUnavailable, options_.name + ": " + message);
    if (preparing && code.compare(0, 2, "42") == 0 && code != "42P01") unfit_.store(true);
    return std::nullopt;
  }

  // The statements' parameters for `rows`; without `values`, NULL for the
  // value arrays (the statement raising the guards reads no value).
  PgParams Params(const std::vector<SinkRow>& rows, const StoreIdentity& store, bool values) const {
    PgParams params;
    std::string epoch;
    AppendUint64BE(&epoch, store.epoch);
    params.Bytes(store.id).Bytes(std::move(epoch));
    AddCells(&params, rows, cells().key(), /*key=*/true);
    if (values) {
      AddCells(&params, rows, cells().value(), /*key=*/false);
    } else {
      for (size_t i = 0; i < cells().value().size(); ++i) params.Null();
    }
    PgArray seqs(kPgInt8Oid, rows.size());
    PgArray present(kPgBoolOid, rows.size());
    std::string seq;
    for (const SinkRow& row : rows) {
      seq.clear();
      AppendUint64BE(&seq, row.seq);
      seqs.Add(seq);
      present.Add(row.present ? std::string_view("\1", 1) : std::string_view("\0", 1));
    }
    params.Bytes(std::move(seqs).Done()).Bytes(std::move(present).Done());
    return params;
  }

  // One array per cell: the whole key or value for a text or blob cell,
  // else its 8 bytes; deleted rows' values are NULL.
  static void AddCells(PgParams* params, const std::vector<SinkRow>& rows,
                       const std::vector<SinkCell>& cells, bool key) {
    const bool whole = WholeCell(cells);
    for (size_t i = 0; i < cells.size(); ++i) {
      PgArray array(TypesOf(cells[i]).element, rows.size());
      for (const SinkRow& row : rows) {
        if (!key && !row.present) {
          array.AddNull();
          continue;
        }
        const std::string_view data = key ? row.key : row.value;
        array.Add(whole ? data : data.substr(8 * i, 8));
      }
      params->Bytes(std::move(array).Done());
    }
  }

  const PostgresSinkOptions options_;
  std::vector<Oid> types_;                          // of the statements' parameters
  const bool by_bytes_ = WholeCell(cells().key());  // keys need no sort
  ChildSafeMutex mu_;                               // a forked child may use the sink
  bool closed_ = false;
  pid_t pid_ = getpid();
  std::vector<Connection> idle_;
  std::atomic<bool> unfit_{false};
};

}  // namespace

std::shared_ptr<NativeSink> MakePostgresSink(PostgresSinkOptions options) {
  return std::make_shared<PostgresSink>(std::move(options));
}

}  // namespace percolite
