// The measuring stick of the SQLite sink (bench/bench_sqlite_sink.py): the
// upsert percolite.exporters.SQLite does, straight through SQLite's C API.
// Same tables (key TEXT primary key, value INTEGER, seq INTEGER, and the
// empty guard table <table>_seq, both WITHOUT ROWID, as the exporter makes
// tables whose values are numbers), same rows (key "k%09d", value and seq the
// row's index), WAL, synchronous=FULL, one BEGIN IMMEDIATE transaction per
// batch, each row one step of the exporter's prepared upsert with its seq
// guard.
//
//   sqlite_c_upsert DATABASE ROWS BATCH
// prints {"rows": ..., "seconds": ..., "rows_per_s": ...}.
#include <sqlite3.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

void Check(sqlite3* db, int rc, const char* what) {
  if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) {
    std::fprintf(stderr, "%s: %s\n", what, sqlite3_errmsg(db));
    std::exit(1);
  }
}

void Exec(sqlite3* db, const char* sql) {
  Check(db, sqlite3_exec(db, sql, nullptr, nullptr, nullptr), sql);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s DATABASE ROWS BATCH\n", argv[0]);
    return 2;
  }
  const long rows = std::atol(argv[2]), batch = std::atol(argv[3]);
  sqlite3* db = nullptr;
  Check(db, sqlite3_open(argv[1], &db), "open");
  Exec(db, "PRAGMA journal_mode=WAL");
  Exec(db, "PRAGMA synchronous=FULL");
  Exec(db,
       "CREATE TABLE IF NOT EXISTS \"t\" (\"key\" TEXT NOT NULL, \"value\" INTEGER, "
       "seq INTEGER NOT NULL, PRIMARY KEY (\"key\")) WITHOUT ROWID");
  Exec(db,
       "CREATE TABLE IF NOT EXISTS \"t_seq\" (\"key\" TEXT NOT NULL, seq INTEGER NOT NULL, "
       "PRIMARY KEY (\"key\")) WITHOUT ROWID");
  sqlite3_stmt *upsert = nullptr, *any_guard = nullptr;
  Check(db,
        sqlite3_prepare_v2(db,
                           "INSERT INTO \"t\" (\"key\", \"value\", seq) VALUES (?, ?, ?) "
                           "ON CONFLICT (\"key\") DO UPDATE SET \"value\" = excluded.\"value\", "
                           "seq = excluded.seq WHERE excluded.seq > \"t\".seq",
                           -1, &upsert, nullptr),
        "prepare");
  Check(db, sqlite3_prepare_v2(db, "SELECT 1 FROM \"t_seq\" LIMIT 1", -1, &any_guard, nullptr),
        "prepare");
  char key[32];
  const auto began = std::chrono::steady_clock::now();
  for (long start = 0; start < rows; start += batch) {
    Exec(db, "BEGIN IMMEDIATE");
    Check(db, sqlite3_step(any_guard), "guard");
    sqlite3_reset(any_guard);
    for (long i = start; i < rows && i < start + batch; ++i) {
      const int n = std::snprintf(key, sizeof key, "k%09ld", i);
      sqlite3_bind_text(upsert, 1, key, n, SQLITE_STATIC);
      sqlite3_bind_int64(upsert, 2, i);
      sqlite3_bind_int64(upsert, 3, i);
      Check(db, sqlite3_step(upsert), "upsert");
      sqlite3_reset(upsert);
    }
    Exec(db, "COMMIT");
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  sqlite3_finalize(upsert);
  sqlite3_finalize(any_guard);
  sqlite3_close(db);
  std::printf("{\"rows\": %ld, \"seconds\": %.6f, \"rows_per_s\": %.1f}\n", rows, seconds,
              rows / seconds);
  return 0;
}
