// The native path of percolite.exporters.Postgres (export_queue.h, "Native
// sinks"): a batch is one statement, the exporter's own SQL, whose
// parameters are arrays bound straight from the queued bytes. The fixed
// codecs' bytes are already PostgreSQL's binary formats: a str is UTF-8
// text, an int64 or float64 eight big-endian bytes, as int8 and float8 are
// sent. The server checks what the exporter would refuse (text that is not
// UTF-8 or holds NUL): such a statement fails, is rolled back whole, and
// the batch goes to the exporter.
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
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

constexpr Oid kBoolOid = 16;
constexpr Oid kByteaOid = 17;
constexpr Oid kInt8Oid = 20;
constexpr Oid kTextOid = 25;
constexpr Oid kFloat8Oid = 701;
constexpr Oid kBoolArrayOid = 1000;
constexpr Oid kByteaArrayOid = 1001;
constexpr Oid kTextArrayOid = 1009;
constexpr Oid kInt8ArrayOid = 1016;
constexpr Oid kFloat8ArrayOid = 1022;

Oid ElementOid(SinkCell cell) {
  switch (cell) {
    case SinkCell::kText:
      return kTextOid;
    case SinkCell::kBlob:
      return kByteaOid;
    case SinkCell::kInt64:
      return kInt8Oid;
    case SinkCell::kFloat64:
      return kFloat8Oid;
  }
  return 0;
}

Oid ArrayOid(SinkCell cell) {
  switch (cell) {
    case SinkCell::kText:
      return kTextArrayOid;
    case SinkCell::kBlob:
      return kByteaArrayOid;
    case SinkCell::kInt64:
      return kInt8ArrayOid;
    case SinkCell::kFloat64:
      return kFloat8ArrayOid;
  }
  return 0;
}

// The statements, prepared on a connection when first used.
enum Statement { kApply, kApplyUnowned, kStatements };
const char* const kStatementNames[kStatements] = {"percolite_apply", "percolite_apply_unowned"};

struct Connection {
  PGconn* pg = nullptr;
  bool prepared[kStatements] = {};
};

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

class PostgresSink final : public NativeSink {
 public:
  explicit PostgresSink(PostgresSinkOptions options)
      : options_(std::move(options)), cells_(options_.key_cells, options_.value_cells) {
    if (options_.connect.empty() || options_.connect[0].first != "dbname") {
      throw Error(ErrorCode::kInvalidArgument, "the first connection keyword must be dbname");
    }
    if (options_.apply.empty() || options_.apply_unowned.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "no statement to apply a batch");
    }
    for (SinkCell cell : options_.key_cells) types_.push_back(ArrayOid(cell));
    for (SinkCell cell : options_.value_cells) types_.push_back(ArrayOid(cell));
    types_.insert(types_.begin(), {kTextOid, kInt8Oid});
    types_.push_back(kInt8ArrayOid);
    types_.push_back(kBoolArrayOid);
  }

  ~PostgresSink() override {
    std::lock_guard<ChildSafeMutex> lock(mu_);
    DropIdle();
  }

  std::optional<Status> Deliver(const std::vector<ExportEntry>& entries,
                                const StoreIdentity& store) override {
    std::vector<SinkRow> rows;
    std::optional<Connection> conn;
    std::string failure;
    if (cells_.Collapse(entries, &rows) && !rows.empty()) conn = Take(&failure);
    if (!conn) {
      if (failure.empty()) {
        declined_.fetch_add(1);
        return std::nullopt;
      }
      applied_.fetch_add(1);
      return Status::Make(ErrorCode::kSinkUnavailable, failure);
    }
    const std::optional<Status> outcome = Apply(&*conn, rows, store);
    (outcome ? applied_ : declined_).fetch_add(1);
    return outcome;
  }

  void Close() override {
    std::lock_guard<ChildSafeMutex> lock(mu_);
    closed_ = true;
    DropIdle();
  }

  std::pair<uint64_t, uint64_t> Counters() const override {
    return {applied_.load(), declined_.load()};
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

  // The batch's one statement on `conn`, which goes back to the idle ones
  // unless it failed.
  std::optional<Status> Apply(Connection* conn, const std::vector<SinkRow>& rows,
                              const StoreIdentity& store) {
    const Statement which = store.id.empty() ? kApplyUnowned : kApply;
    if (!conn->prepared[which]) {
      const std::string& sql = which == kApply ? options_.apply : options_.apply_unowned;
      PgResult prepared(PQprepare(conn->pg, kStatementNames[which], sql.c_str(),
                                  static_cast<int>(types_.size()), types_.data()));
      if (PQresultStatus(prepared.get()) != PGRES_COMMAND_OK) {
        return Failed(conn, prepared.get(), /*preparing=*/true);
      }
      conn->prepared[which] = true;
    }
    PgParams params = Params(rows, store);
    std::vector<const char*> pointers;
    std::vector<int> lengths, formats;
    params.Prepare(&pointers, &lengths, &formats);
    PgResult result(PQexecPrepared(conn->pg, kStatementNames[which], params.size(), pointers.data(),
                                   lengths.data(), formats.data(),
                                   /*resultFormat=*/0));
    if (PQresultStatus(result.get()) != PGRES_TUPLES_OK) {
      return Failed(conn, result.get(), /*preparing=*/false);
    }
    const bool owned = result.rows() == 1 && !result.null(0, 0) && result.bytes(0, 0) == "t";
    Give(*conn);
    // Not the store's sink (yet): nothing was written; the exporter adopts
    // it, moves it to a new epoch, or refuses the batch.
    if (!owned) return std::nullopt;
    return Status::Ok();
  }

  // After a statement failed: the connection is closed (a broken one, or
  // one whose prepared statements may no longer fit the tables). A lost
  // server is an outage; anything else goes to the exporter, which reports
  // it its way. A statement that cannot be prepared on a server that
  // answers, while the tables exist, never will be: from then on every
  // batch goes to the exporter.
  std::optional<Status> Failed(Connection* conn, const PGresult* result, bool preparing) {
    const bool lost = LostServer(conn->pg, result);
    const std::string message = HidePasswords(ServerMessage(conn->pg));
    const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
    const bool undefined = state != nullptr && std::string(state) == "42P01";
    PQfinish(conn->pg);
    conn->pg = nullptr;
    if (lost) return Status::Make(ErrorCode::kSinkUnavailable, options_.name + ": " + message);
    // An undefined table: the exporter has not made it yet.
    if (preparing && !undefined) unfit_.store(true);
    return std::nullopt;
  }

  PgParams Params(const std::vector<SinkRow>& rows, const StoreIdentity& store) const {
    PgParams params;
    std::string epoch;
    AppendUint64BE(&epoch, store.epoch);
    params.Bytes(store.id).Bytes(std::move(epoch));
    AddCells(&params, rows, cells_.key(), /*key=*/true);
    AddCells(&params, rows, cells_.value(), /*key=*/false);
    PgArray seqs(kInt8Oid, rows.size());
    PgArray present(kBoolOid, rows.size());
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
    const bool whole =
        cells.size() == 1 && (cells[0] == SinkCell::kText || cells[0] == SinkCell::kBlob);
    for (size_t i = 0; i < cells.size(); ++i) {
      PgArray array(ElementOid(cells[i]), rows.size());
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
  const SinkCells cells_;
  std::vector<Oid> types_;  // of the statements' parameters
  ChildSafeMutex mu_;       // a forked child may use the sink
  bool closed_ = false;
  pid_t pid_ = getpid();
  std::vector<Connection> idle_;
  std::atomic<bool> unfit_{false};
  std::atomic<uint64_t> applied_{0}, declined_{0};
};

}  // namespace

std::shared_ptr<NativeSink> MakePostgresSink(PostgresSinkOptions options) {
  return std::make_shared<PostgresSink>(std::move(options));
}

}  // namespace percolite
