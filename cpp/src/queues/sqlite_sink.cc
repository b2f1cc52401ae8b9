// The native path of percolite.exporters.SQLite (export_queue.h, "Native
// sinks"): the same statements and the same seq guard as the exporter's
// Python code, bound straight from the queued bytes.
//
// SQLite is reached through the library the exporter's Python module
// loaded, looked up with dlopen(RTLD_NOLOAD) and dlsym, never linked in: a
// second copy of SQLite in the process would keep its own table of POSIX
// locks, and closing a file there would drop the locks the first copy holds
// on it.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>

#include "child_safe_mutex.h"
#include "percolite/encoding.h"
#include "percolite/export_queue.h"
#include "sink_rows.h"

namespace percolite {
namespace {

// The few declarations of sqlite3.h used here (its ABI is stable).
struct sqlite3;
struct sqlite3_stmt;
constexpr int kSqliteOk = 0;
constexpr int kSqliteBusy = 5;
constexpr int kSqliteLocked = 6;
constexpr int kSqliteRow = 100;
constexpr int kSqliteDone = 101;
constexpr int kSqliteOpenReadWrite = 0x00000002;
constexpr int kSqliteInteger = 1;

struct Api {
  int (*threadsafe)();
  int (*open_v2)(const char*, sqlite3**, int, const char*);
  int (*close_v2)(sqlite3*);
  int (*busy_timeout)(sqlite3*, int);
  int (*prepare_v2)(sqlite3*, const char*, int, sqlite3_stmt**, const char**);
  int (*finalize)(sqlite3_stmt*);
  int (*reset)(sqlite3_stmt*);
  int (*step)(sqlite3_stmt*);
  int (*bind_int64)(sqlite3_stmt*, int, long long);
  int (*bind_double)(sqlite3_stmt*, int, double);
  int (*bind_text)(sqlite3_stmt*, int, const char*, int, void (*)(void*));
  int (*bind_blob)(sqlite3_stmt*, int, const void*, int, void (*)(void*));
  long long (*column_int64)(sqlite3_stmt*, int);
  const unsigned char* (*column_text)(sqlite3_stmt*, int);
  int (*column_bytes)(sqlite3_stmt*, int);
  int (*column_type)(sqlite3_stmt*, int);
  const char* (*errmsg)(sqlite3*);
  int (*exec)(sqlite3*, const char*, int (*)(void*, int, char**, char**), void*, char**);
};

template <typename F>
void Find(void* handle, const char* name, F* out, std::string* missing) {
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    if (!missing->empty()) missing->append(", ");
    missing->append(name);
  }
  *out = reinterpret_cast<F>(symbol);
}

// SQLite's functions through `library`, which must be loaded already.
Api LoadApi(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, library + " is not loaded in this process");
  }
  // dlsym through a handle searches the object, then its dependencies: a
  // module linking libsqlite3 dynamically gives that library's functions.
  Api api{};
  std::string missing;
  Find(handle, "sqlite3_threadsafe", &api.threadsafe, &missing);
  Find(handle, "sqlite3_open_v2", &api.open_v2, &missing);
  Find(handle, "sqlite3_close_v2", &api.close_v2, &missing);
  Find(handle, "sqlite3_busy_timeout", &api.busy_timeout, &missing);
  Find(handle, "sqlite3_prepare_v2", &api.prepare_v2, &missing);
  Find(handle, "sqlite3_finalize", &api.finalize, &missing);
  Find(handle, "sqlite3_reset", &api.reset, &missing);
  Find(handle, "sqlite3_step", &api.step, &missing);
  Find(handle, "sqlite3_bind_int64", &api.bind_int64, &missing);
  Find(handle, "sqlite3_bind_double", &api.bind_double, &missing);
  Find(handle, "sqlite3_bind_text", &api.bind_text, &missing);
  Find(handle, "sqlite3_bind_blob", &api.bind_blob, &missing);
  Find(handle, "sqlite3_column_int64", &api.column_int64, &missing);
  Find(handle, "sqlite3_column_text", &api.column_text, &missing);
  Find(handle, "sqlite3_column_bytes", &api.column_bytes, &missing);
  Find(handle, "sqlite3_column_type", &api.column_type, &missing);
  Find(handle, "sqlite3_errmsg", &api.errmsg, &missing);
  Find(handle, "sqlite3_exec", &api.exec, &missing);
  // The handle stays open: the module stays loaded as long as Python runs.
  if (!missing.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "SQLite's functions are not visible through " + library +
                    " (SQLite linked in statically?): missing " + missing);
  }
  if (api.threadsafe() == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "the SQLite of " + library + " was built single-threaded");
  }
  return api;
}

class SqliteSink final : public CountingSink {
 public:
  explicit SqliteSink(SqliteSinkOptions options)
      : CountingSink(SinkCells(options.key_cells, options.value_cells)),
        options_(std::move(options)),
        api_(LoadApi(options_.library)) {}

  ~SqliteSink() override {
    std::lock_guard<ChildSafeMutex> lock(mu_);
    Disconnect();
  }

  std::optional<Status> Apply(const std::vector<SinkRow>& rows,
                              const StoreIdentity& store) override {
    std::lock_guard<ChildSafeMutex> lock(mu_);
    return closed_ ? std::nullopt : DeliverLocked(rows, store);
  }

  void Close() override {
    std::lock_guard<ChildSafeMutex> lock(mu_);
    closed_ = true;
    Disconnect();
  }

 private:
  enum Statement {
    kBegin,
    kCommit,
    kSelectOwner,
    kAnyGuard,
    kUpsert,
    kGuardSeq,
    kClearGuard,
    kRowSeq,
    kDeleteRow,
    kRaiseGuard,
    kStatements
  };

  std::optional<Status> DeliverLocked(const std::vector<SinkRow>& rows,
                                      const StoreIdentity& store) {
    if (pid_ != getpid()) {
      // A forked child: the parent's connection is left alone, unused.
      db_ = nullptr;
      for (sqlite3_stmt*& s : statements_) s = nullptr;
    }
    if (db_ == nullptr && !Connect()) return std::nullopt;
    int rc = Run(kBegin);
    if (rc != kSqliteDone) return Failure("BEGIN IMMEDIATE", rc);
    std::optional<Status> outcome = Write(rows, store);
    if (outcome && outcome->ok()) {
      rc = Run(kCommit);
      if (rc == kSqliteDone) return outcome;
      outcome = Failure("COMMIT", rc);
    }
    api_.exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return outcome;
  }

  // Inside the transaction: nullopt when the exporter must take the batch.
  std::optional<Status> Write(const std::vector<SinkRow>& rows, const StoreIdentity& store) {
    if (!store.id.empty()) {
      sqlite3_stmt* owner = statements_[kSelectOwner];
      int rc = api_.step(owner);
      bool same = false;
      if (rc == kSqliteRow) {
        const char* id = reinterpret_cast<const char*>(api_.column_text(owner, 0));
        const int size = api_.column_bytes(owner, 0);
        same = id != nullptr && std::string_view(id, size) == store.id &&
               api_.column_type(owner, 1) == kSqliteInteger &&
               static_cast<uint64_t>(api_.column_int64(owner, 1)) == store.epoch;
        rc = api_.step(owner);  // one row; a second is the exporter's to judge
        if (rc == kSqliteRow) same = false;
      }
      api_.reset(owner);
      if (rc != kSqliteDone && rc != kSqliteRow) return Failure("the owner", rc);
      if (!same) return std::nullopt;  // to adopt, a new epoch, or another store's
    }
    int rc = api_.step(statements_[kAnyGuard]);
    api_.reset(statements_[kAnyGuard]);
    if (rc != kSqliteRow && rc != kSqliteDone) return Failure("the guard table", rc);
    const bool guarded = rc == kSqliteRow;
    for (const SinkRow& row : rows) {
      // As the exporter's set-wise statements: a guard row of a seq as
      // large drops the entry; a deletion no newer than the key's row too.
      if (guarded) {
        std::optional<int64_t> seq;
        rc = Seq(kGuardSeq, row, &seq);
        if (rc != kSqliteDone) return Failure("the guard table", rc);
        if (seq && *seq >= static_cast<int64_t>(row.seq)) continue;
      }
      if (row.present) {
        sqlite3_stmt* s = statements_[kUpsert];
        int index = BindKey(s, row);
        for (size_t i = 0; i < options_.value_cells.size(); ++i) {
          Bind(s, index++, options_.value_cells[i], row.value, i);
        }
        api_.bind_int64(s, index, static_cast<int64_t>(row.seq));
        rc = Step(kUpsert);
        if (rc != kSqliteDone) return Failure("the upsert", rc);
        if (guarded) {
          BindKey(statements_[kClearGuard], row);
          rc = Step(kClearGuard);
          if (rc != kSqliteDone) return Failure("the guard table", rc);
        }
        continue;
      }
      std::optional<int64_t> seq;
      rc = Seq(kRowSeq, row, &seq);
      if (rc != kSqliteDone) return Failure("the table", rc);
      if (seq && *seq >= static_cast<int64_t>(row.seq)) continue;
      if (seq) {
        BindKey(statements_[kDeleteRow], row);
        rc = Step(kDeleteRow);
        if (rc != kSqliteDone) return Failure("the deletion", rc);
      }
      sqlite3_stmt* s = statements_[kRaiseGuard];
      api_.bind_int64(s, BindKey(s, row), static_cast<int64_t>(row.seq));
      rc = Step(kRaiseGuard);
      if (rc != kSqliteDone) return Failure("the guard table", rc);
    }
    return Status::Ok();
  }

  // The seq column of the one row `which` selects for the key, if any.
  int Seq(Statement which, const SinkRow& row, std::optional<int64_t>* seq) {
    sqlite3_stmt* s = statements_[which];
    BindKey(s, row);
    int rc = api_.step(s);
    if (rc == kSqliteRow) {
      *seq = api_.column_int64(s, 0);
      rc = kSqliteDone;
    }
    api_.reset(s);
    return rc;
  }

  int Step(Statement which) {
    const int rc = api_.step(statements_[which]);
    api_.reset(statements_[which]);
    return rc;
  }

  int Run(Statement which) { return Step(which); }

  // Binds the key cells from parameter 1; returns the next parameter.
  int BindKey(sqlite3_stmt* s, const SinkRow& row) {
    int index = 1;
    for (size_t i = 0; i < options_.key_cells.size(); ++i) {
      Bind(s, index++, options_.key_cells[i], row.key, i);
    }
    return index;
  }

  // The data stays put until the statement is reset: bound without a copy.
  void Bind(sqlite3_stmt* s, int index, SinkCell cell, std::string_view data, size_t i) {
    static const char kEmpty[1] = {0};
    const char* bytes = data.empty() ? kEmpty : data.data();
    switch (cell) {
      case SinkCell::kText:
        api_.bind_text(s, index, bytes, static_cast<int>(data.size()), nullptr);
        return;
      case SinkCell::kBlob:
        api_.bind_blob(s, index, bytes, static_cast<int>(data.size()), nullptr);
        return;
      case SinkCell::kInt64:
        api_.bind_int64(s, index, static_cast<int64_t>(ReadUint64BE(data.substr(8 * i, 8))));
        return;
      case SinkCell::kFloat64:
        api_.bind_double(s, index, SinkDouble(data.substr(8 * i, 8)));
        return;
    }
  }

  Status Failure(const std::string& what, int rc) {
    const std::string message =
        options_.name + ": " + what + ": " + (db_ ? api_.errmsg(db_) : "no connection");
    // A locked database is an outage, as the exporter's Python path reports it.
    const int primary = rc & 0xff;
    const ErrorCode code = primary == kSqliteBusy || primary == kSqliteLocked
                               ? ErrorCode::kSinkUnavailable
                               : ErrorCode::kCallback;
    return Status::Make(code, message);
  }

  // Opens the database the exporter made and prepares its statements; false
  // (nothing open) when it is not there yet or not in WAL mode, or a table
  // is missing: the exporter then sets it up.
  bool Connect() {
    sqlite3* db = nullptr;
    if (api_.open_v2(options_.path.c_str(), &db, kSqliteOpenReadWrite, nullptr) != kSqliteOk) {
      if (db != nullptr) api_.close_v2(db);
      return false;
    }
    db_ = db;
    pid_ = getpid();
    api_.busy_timeout(db_, static_cast<int>(std::min(options_.timeout_seconds * 1000, 2e9)));
    const std::string sql[kStatements] = {"BEGIN IMMEDIATE",     "COMMIT",
                                          options_.select_owner, options_.any_guard,
                                          options_.upsert,       options_.guard_seq,
                                          options_.clear_guard,  options_.row_seq,
                                          options_.delete_row,   options_.raise_guard};
    bool ok = WalMode();
    for (int i = 0; ok && i < kStatements; ++i) {
      ok = api_.prepare_v2(db_, sql[i].c_str(), -1, &statements_[i], nullptr) == kSqliteOk;
    }
    if (!ok) Disconnect();
    return ok;
  }

  bool WalMode() {
    sqlite3_stmt* s = nullptr;
    if (api_.prepare_v2(db_, "PRAGMA journal_mode", -1, &s, nullptr) != kSqliteOk) return false;
    bool wal = false;
    if (api_.step(s) == kSqliteRow) {
      const char* mode = reinterpret_cast<const char*>(api_.column_text(s, 0));
      wal = mode != nullptr && std::strcmp(mode, "wal") == 0;
    }
    api_.finalize(s);
    return wal;
  }

  void Disconnect() {
    if (db_ == nullptr || pid_ != getpid()) {
      db_ = nullptr;
      return;
    }
    for (sqlite3_stmt*& s : statements_) {
      if (s != nullptr) api_.finalize(s);
      s = nullptr;
    }
    api_.close_v2(db_);
    db_ = nullptr;
  }

  const SqliteSinkOptions options_;
  const Api api_;
  ChildSafeMutex mu_;  // a forked child may use the sink
  bool closed_ = false;
  sqlite3* db_ = nullptr;
  pid_t pid_ = 0;
  sqlite3_stmt* statements_[kStatements] = {};
};

}  // namespace

std::shared_ptr<NativeSink> MakeSqliteSink(SqliteSinkOptions options) {
  return std::make_shared<SqliteSink>(std::move(options));
}

}  // namespace percolite
