#include "lmdb_util.h"

#include <algorithm>
#include <vector>

namespace percolite {
namespace {

ErrorCode CodeFor(int rc) {
  switch (rc) {
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_PANIC:
      return ErrorCode::kCorruption;
    default:
      return ErrorCode::kStorage;
  }
}

}  // namespace

LmdbError::LmdbError(int rc, const std::string& what)
    : Error(CodeFor(rc), what + ": " + mdb_strerror(rc)), rc_(rc) {}

void CheckLmdb(int rc, const char* what) {
  if (rc != MDB_SUCCESS) throw LmdbError(rc, what);
}

bool ReadRecord(MDB_txn* txn, MDB_dbi dbi, std::string_view encoded_key, std::string* record) {
  std::string stored = StoredKeyFor(encoded_key);
  MDB_val key = ToVal(stored), data;
  int rc = mdb_get(txn, dbi, &key, &data);
  if (rc == MDB_NOTFOUND) return false;
  CheckLmdb(rc, "reading a cell");
  if (IsHashedStoredKey(stored)) {
    RecordView view;
    if (!DecodeRecord(FromVal(data), &view) || view.full_key != encoded_key) {
      throw Error(ErrorCode::kCorruption,
                  "reading a cell: the record stored under a hashed long key holds another key");
    }
  }
  record->assign(static_cast<const char*>(data.mv_data), data.mv_size);
  return true;
}

bool ScanRecords(MDB_txn* txn, MDB_dbi dbi, std::string_view from, bool exclusive,
                 std::string_view end, const RecordVisitor& visit) {
  MDB_cursor* cursor = nullptr;
  CheckLmdb(mdb_cursor_open(txn, dbi, &cursor), "opening a cursor");
  struct Closer {
    MDB_cursor* c;
    ~Closer() { mdb_cursor_close(c); }
  } closer{cursor};

  auto before_start = [&](std::string_view key) { return exclusive ? key <= from : key < from; };
  auto past_end = [&](std::string_view key) { return !end.empty() && key >= end; };

  std::string_view seek = from.substr(0, std::min(from.size(), kMaxInlineKey));
  MDB_val key = ToVal(seek), data;
  int rc = mdb_cursor_get(cursor, &key, &data, seek.empty() ? MDB_FIRST : MDB_SET_RANGE);
  while (rc == MDB_SUCCESS) {
    std::string_view stored = FromVal(key);
    if (!IsHashedStoredKey(stored)) {
      if (past_end(stored)) return true;
      RecordView record;
      if (!DecodeRecord(FromVal(data), &record)) {
        throw Error(ErrorCode::kCorruption, "scanning cells: malformed record");
      }
      if (!before_start(stored) && !visit(stored, record)) return false;
      rc = mdb_cursor_get(cursor, &key, &data, MDB_NEXT);
      continue;
    }
    // A group of hashed long keys sharing their first kMaxInlineKey bytes is
    // contiguous in LMDB but ordered by hash: gather it and sort by full key.
    std::string group_prefix(stored.substr(0, kMaxInlineKey));
    std::vector<std::pair<std::string, std::string>> group;  // (full key, raw record)
    while (rc == MDB_SUCCESS) {
      std::string_view k = FromVal(key);
      if (!IsHashedStoredKey(k) || k.substr(0, kMaxInlineKey) != group_prefix) break;
      RecordView record;
      if (!DecodeRecord(FromVal(data), &record) || record.full_key.empty()) {
        throw Error(ErrorCode::kCorruption, "scanning cells: malformed long-key record");
      }
      group.emplace_back(std::string(record.full_key), std::string(FromVal(data)));
      rc = mdb_cursor_get(cursor, &key, &data, MDB_NEXT);
    }
    std::sort(group.begin(), group.end());
    for (const auto& [full_key, raw] : group) {
      if (before_start(full_key)) continue;
      if (past_end(full_key)) return true;
      RecordView record;
      DecodeRecord(raw, &record);
      if (!visit(full_key, record)) return false;
    }
  }
  if (rc != MDB_NOTFOUND) CheckLmdb(rc, "scanning cells");
  return true;
}

}  // namespace percolite
