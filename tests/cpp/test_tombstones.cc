// Tombstone collection (backend/lmdb_backend.h): a delete's tombstone is removed once
// no open transaction began before the delete, and never earlier.
#include <lmdb.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "percolite/encoding.h"
#include "percolite/env.h"
#include "percolite/transaction.h"
#include "test_util.h"

namespace {

using percolite::Cell;
using percolite::Env;
using percolite::ErrorCode;
using percolite_test::CommitSet;
using percolite_test::ErrorCodeOf;
using percolite_test::FastOptions;
using percolite_test::ReadCommitted;
using percolite_test::Ref;
using percolite_test::TempDir;

// What the store's LMDB tables hold, read directly with LMDB once the store is closed.
struct RawTables {
  size_t live_records = 0;
  size_t tombstone_records = 0;
  size_t tombstone_index_entries = 0;
};

void CheckRc(int rc, const char* what) {
  INFO(what << ": " << mdb_strerror(rc));
  REQUIRE(rc == MDB_SUCCESS);
}

RawTables ReadRawTables(const std::string& path) {
  RawTables tables;
  MDB_env* env = nullptr;
  CheckRc(mdb_env_create(&env), "mdb_env_create");
  CheckRc(mdb_env_set_maxdbs(env, 16), "mdb_env_set_maxdbs");
  CheckRc(mdb_env_open(env, path.c_str(), MDB_RDONLY | MDB_NOTLS, 0600), "mdb_env_open");
  MDB_txn* txn = nullptr;
  CheckRc(mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn), "mdb_txn_begin");
  MDB_dbi data, index;
  CheckRc(mdb_dbi_open(txn, "data", 0, &data), "opening the data table");
  CheckRc(mdb_dbi_open(txn, "tombstones", 0, &index), "opening the tombstone index");

  MDB_cursor* cursor = nullptr;
  CheckRc(mdb_cursor_open(txn, data, &cursor), "mdb_cursor_open");
  MDB_val key, value;
  for (int rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST); rc == MDB_SUCCESS;
       rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT)) {
    percolite::RecordView record;
    REQUIRE(percolite::DecodeRecord(
                std::string_view(static_cast<const char*>(key.mv_data), key.mv_size),
                std::string_view(static_cast<const char*>(value.mv_data), value.mv_size),
                &record) == percolite::RecordCheck::kOk);
    ++(record.tombstone ? tables.tombstone_records : tables.live_records);
  }
  mdb_cursor_close(cursor);
  MDB_stat stat;
  CheckRc(mdb_stat(txn, index, &stat), "mdb_stat");
  tables.tombstone_index_entries = stat.ms_entries;
  mdb_txn_abort(txn);
  mdb_env_close(env);
  return tables;
}

// Cell 9 has a row longer than LMDB's key limit, so its tombstone sits under a hashed key.
Cell Numbered(int i) {
  if (i == 9) return Cell{std::string(600, 'n'), "f", "q"};
  return Cell{"cell" + std::to_string(i), "f", "q"};
}

// Sets cells 0..4, then deletes cells 0..2 and the never-written long cell 9 in
// one transaction: four tombstones. Returns the delete's commit_ts.
uint64_t WriteThenDelete(Env& env) {
  auto writer = env.Begin();
  for (int i = 0; i < 5; ++i) writer->Set(Ref(Numbered(i)), "v" + std::to_string(i));
  writer->Commit();
  auto deleter = env.Begin();
  for (int i : {0, 1, 2, 9}) deleter->Delete(Ref(Numbered(i)));
  deleter->Commit();
  return deleter->commit_ts().value();
}

}  // namespace

TEST_CASE("Later commits collect tombstones once no older transaction is open", "[tombstones]") {
  TempDir dir;
  {
    auto env = Env::Open(dir.path(), FastOptions());
    WriteThenDelete(*env);
    CommitSet(*env, Cell{"unrelated", "f", "q"}, "1");
    CommitSet(*env, Cell{"unrelated", "f", "q"}, "2");
    CHECK(env->Stats().tombstones_collected == 4);
    for (int i : {0, 1, 2, 9}) CHECK(ReadCommitted(*env, Numbered(i)) == std::nullopt);
    for (int i : {3, 4}) CHECK(ReadCommitted(*env, Numbered(i)) == "v" + std::to_string(i));
    env->Close();
  }
  const RawTables tables = ReadRawTables(dir.path());
  CHECK(tables.tombstone_records == 0);
  CHECK(tables.tombstone_index_entries == 0);
  CHECK(tables.live_records == 3);  // cells 3 and 4, and the unrelated cell
}

TEST_CASE("A tombstone outlives every transaction that began before the delete", "[tombstones]") {
  TempDir dir;
  {
    auto env = Env::Open(dir.path(), FastOptions());
    auto writer = env->Begin();
    writer->Set(Ref(Numbered(1)), "v1");
    writer->Commit();
    auto old_on_existing = env->Begin();
    auto old_on_never_written = env->Begin();
    auto deleter = env->Begin();
    for (int i : {0, 1, 2, 9}) deleter->Delete(Ref(Numbered(i)));
    deleter->Commit();
    for (int i = 0; i < 3; ++i) CommitSet(*env, Cell{"unrelated", "f", "q"}, std::to_string(i));
    CHECK(env->Stats().tombstones_collected == 0);

    // Their writes of the deleted cells are still refused: the tombstones are there.
    CHECK(old_on_existing->Get(Ref(Numbered(1))) == "v1");
    old_on_existing->Set(Ref(Numbered(1)), "late");
    CHECK(ErrorCodeOf([&] { old_on_existing->Commit(); }) == ErrorCode::kConflict);
    CommitSet(*env, Cell{"unrelated", "f", "q"}, "more");
    CHECK(env->Stats().tombstones_collected == 0);
    old_on_never_written->Set(Ref(Numbered(9)), "late");
    CHECK(ErrorCodeOf([&] { old_on_never_written->Commit(); }) == ErrorCode::kConflict);
    CHECK(env->Stats().tombstones_collected == 0);
    CHECK(ReadCommitted(*env, Numbered(1)) == std::nullopt);
    CHECK(ReadCommitted(*env, Numbered(9)) == std::nullopt);
    env->Close();
  }
  RawTables tables = ReadRawTables(dir.path());
  CHECK(tables.tombstone_records == 4);
  CHECK(tables.tombstone_index_entries == 4);

  // With nobody left from before the delete, the next commit collects them.
  {
    auto env = Env::Open(dir.path(), FastOptions());
    CommitSet(*env, Cell{"unrelated", "f", "q"}, "after");
    CHECK(env->Stats().tombstones_collected == 4);
    env->Close();
  }
  tables = ReadRawTables(dir.path());
  CHECK(tables.tombstone_records == 0);
  CHECK(tables.tombstone_index_entries == 0);
}

TEST_CASE("Transactions that began after the delete do not hold its tombstone back",
          "[tombstones]") {
  TempDir dir;
  auto env = Env::Open(dir.path(), FastOptions());
  auto before_delete = env->Begin();
  const uint64_t delete_ts = WriteThenDelete(*env);
  auto after_delete = env->Begin();
  REQUIRE(after_delete->start_ts() >= delete_ts);

  CommitSet(*env, Cell{"unrelated", "f", "q"}, "1");
  CHECK(env->Stats().tombstones_collected == 0);
  before_delete->Abort();
  CommitSet(*env, Cell{"unrelated", "f", "q"}, "2");
  CHECK(env->Stats().tombstones_collected == 4);

  // The younger transaction writes a deleted cell without a conflict, before and after.
  after_delete->Set(Ref(Numbered(0)), "again");
  REQUIRE_NOTHROW(after_delete->Commit());
  CHECK(ReadCommitted(*env, Numbered(0)) == "again");
}

TEST_CASE("Many tombstones are all collected over the following commits", "[tombstones]") {
  constexpr int kCells = 2500;
  TempDir dir;
  {
    auto env = Env::Open(dir.path(), FastOptions());
    auto deleter = env->Begin();
    for (int i = 0; i < kCells; ++i) deleter->Delete(Ref(Cell{"d" + std::to_string(i), "f", ""}));
    deleter->Commit();
    for (int i = 0; i < 10 && env->Stats().tombstones_collected < kCells; ++i) {
      CommitSet(*env, Cell{"unrelated", "f", "q"}, std::to_string(i));
    }
    CHECK(env->Stats().tombstones_collected == kCells);
    env->Close();
  }
  const RawTables tables = ReadRawTables(dir.path());
  CHECK(tables.tombstone_records == 0);
  CHECK(tables.tombstone_index_entries == 0);
  CHECK(tables.live_records == 1);
}

TEST_CASE("A purge removes a stamped cell without a tombstone; older snapshots still see it",
          "[tombstones]") {
  TempDir dir;
  {
    auto env = Env::Open(dir.path(), FastOptions());
    auto add = env->Begin();
    add->AddStamped({"queue", "e", "entry"}, "payload");
    add->Commit();
    auto older = env->Begin();
    auto read_all = [](percolite::Transaction& tx) {
      return percolite_test::ScanAll(tx, percolite::ScanRange::Rows("queue", "queuf"), 10);
    };
    auto items = read_all(*older);
    REQUIRE(items.size() == 1);
    auto purge = env->Begin();
    purge->Purge(Ref(items[0].cell));
    purge->Commit();
    auto newer = env->Begin();
    CHECK(read_all(*newer).empty());
    CHECK(read_all(*older).size() == 1);  // its LMDB snapshot predates the purge
    older->Abort();
    newer->Abort();
    // Purging a cell that is already gone is not an error (a retried consumer).
    auto again = env->Begin();
    again->Purge(Ref(items[0].cell));
    again->Commit();
    env->Close();
  }
  const RawTables tables = ReadRawTables(dir.path());
  CHECK(tables.tombstone_records == 0);
  CHECK(tables.tombstone_index_entries == 0);
  CHECK(tables.live_records == 0);
}
