#include "lmdb_util.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "commit_rules.h"

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
    : Error(CodeFor(rc),
            what + ": " + mdb_strerror(rc) +
                (CodeFor(rc) == ErrorCode::kCorruption
                     ? "; the store's pages are damaged: run 'percolite check' on it and restore "
                       "the store from a copy"
                     : "")),
      rc_(rc) {}

void CheckLmdb(int rc, const char* what) {
  if (rc != MDB_SUCCESS) throw LmdbError(rc, what);
}

void AbortTxn(MDB_txn* txn) {
  try {
    RunGuarded("aborting a transaction", [&] { mdb_txn_abort(txn); });
  } catch (const FaultError&) {
  }
}

int GuardedGet(MDB_txn* txn, MDB_dbi dbi, MDB_val* key, MDB_val* data, const char* what) {
  return LmdbCall(what, [&] { return mdb_get(txn, dbi, key, data); });
}

int GuardedCursorGet(MDB_cursor* cursor, MDB_val* key, MDB_val* data, MDB_cursor_op op,
                     const char* what) {
  return LmdbCall(what, [&] { return mdb_cursor_get(cursor, key, data, op); });
}

int GuardedPut(MDB_txn* txn, MDB_dbi dbi, MDB_val* key, MDB_val* data, const char* what) {
  return LmdbCall(what, [&] { return mdb_put(txn, dbi, key, data, 0); });
}

int GuardedDel(MDB_txn* txn, MDB_dbi dbi, MDB_val* key, const char* what) {
  return LmdbCall(what, [&] { return mdb_del(txn, dbi, key, nullptr); });
}

std::string CopyOut(const MDB_val& bytes, const char* what) {
  std::string copy(bytes.mv_size, '\0');
  RunGuarded(what, [&] { std::memcpy(copy.data(), bytes.mv_data, bytes.mv_size); });
  return copy;
}

void ThrowBadRecord(std::string_view stored_key, RecordCheck check, const char* what) {
  // Notification and ack keys carry an 8-byte row hash in front of the cell key.
  std::string cell = DescribeKey(stored_key);
  if (cell == "an internal key" && stored_key.size() > 8) cell = DescribeKey(stored_key.substr(8));
  throw Error(ErrorCode::kCorruption,
              std::string(what) + ": the record of " + cell +
                  (check == RecordCheck::kBadChecksum ? " fails its checksum" : " is malformed") +
                  ": the store's pages are damaged; run 'percolite check' and restore the store "
                  "from a copy");
}

void VerifyRecord(std::string_view stored_key, const MDB_val& data, RecordView* record,
                  const char* what) {
  const RecordCheck check =
      RunGuarded(what, [&] { return DecodeRecord(stored_key, FromVal(data), record); });
  if (check != RecordCheck::kOk) ThrowBadRecord(stored_key, check, what);
}

bool ReadRecord(MDB_txn* txn, MDB_dbi dbi, std::string_view encoded_key, RecordView* record) {
  constexpr const char* kWhat = "reading a cell";
  // Most keys are stored as they are: no copy of them for the look-up.
  std::string hashed;
  std::string_view stored = encoded_key;
  if (encoded_key.size() > kMaxInlineKey) stored = hashed = StoredKeyFor(encoded_key);
  MDB_val key = ToVal(stored), data;
  RecordCheck check = RecordCheck::kOk;
  // One guard for the look-up and the verification of what it found.
  const int rc = LmdbCall(kWhat, [&] {
    const int found = mdb_get(txn, dbi, &key, &data);
    if (found == MDB_SUCCESS) check = DecodeRecord(stored, FromVal(data), record);
    return found;
  });
  if (rc == MDB_NOTFOUND) return false;
  CheckLmdb(rc, kWhat);
  if (check != RecordCheck::kOk) ThrowBadRecord(stored, check, kWhat);
  if (IsHashedStoredKey(stored) && record->full_key != encoded_key) {
    throw Error(ErrorCode::kCorruption,
                "reading a cell: the record stored under a hashed long key holds another key");
  }
  return true;
}

bool ScanRecords(MDB_txn* txn, MDB_dbi dbi, std::string_view from, bool exclusive,
                 std::string_view end, const RecordVisitor& visit) {
  constexpr const char* kWhat = "scanning cells";
  MDB_cursor* cursor = nullptr;
  CheckLmdb(LmdbCall(kWhat, [&] { return mdb_cursor_open(txn, dbi, &cursor); }), kWhat);
  struct Closer {
    MDB_cursor* c;
    ~Closer() { mdb_cursor_close(c); }
  } closer{cursor};

  auto before_start = [&](std::string_view key) { return exclusive ? key <= from : key < from; };
  auto past_end = [&](std::string_view key) { return !end.empty() && key >= end; };

  // Each step moves the cursor and verifies the record it lands on under one
  // guard: the checksum covers the key's bytes too, so nothing below reads a
  // byte of the map that was not verified first.
  MDB_val key, data;
  RecordView record;
  auto step = [&](MDB_cursor_op op) {
    RecordCheck check = RecordCheck::kOk;
    const int rc = LmdbCall(kWhat, [&] {
      const int moved = mdb_cursor_get(cursor, &key, &data, op);
      if (moved == MDB_SUCCESS) check = DecodeRecord(FromVal(key), FromVal(data), &record);
      return moved;
    });
    if (rc == MDB_SUCCESS && check != RecordCheck::kOk) ThrowBadRecord(FromVal(key), check, kWhat);
    return rc;
  };

  std::string_view seek = from.substr(0, std::min(from.size(), kMaxInlineKey));
  key = ToVal(seek);
  int rc = step(seek.empty() ? MDB_FIRST : MDB_SET_RANGE);
  while (rc == MDB_SUCCESS) {
    std::string_view stored = FromVal(key);
    if (!IsHashedStoredKey(stored)) {
      if (past_end(stored)) return true;
      if (!before_start(stored) && !visit(stored, record)) return false;
      rc = step(MDB_NEXT);
      continue;
    }
    // A group of hashed long keys sharing their first kMaxInlineKey bytes is
    // contiguous in LMDB but ordered by hash: gather it and sort by full key.
    std::string group_prefix(stored.substr(0, kMaxInlineKey));
    // (full key, value, commit_ts, tombstone) of each verified record,
    // copied out of the map.
    std::vector<std::tuple<std::string, std::string, uint64_t, bool>> group;
    while (rc == MDB_SUCCESS) {
      std::string_view k = FromVal(key);
      if (!IsHashedStoredKey(k) || k.substr(0, kMaxInlineKey) != group_prefix) break;
      if (record.full_key.empty()) ThrowBadRecord(k, RecordCheck::kMalformed, kWhat);
      group.emplace_back(std::string(record.full_key), std::string(record.value), record.commit_ts,
                         record.tombstone);
      rc = step(MDB_NEXT);
    }
    std::sort(group.begin(), group.end());
    for (const auto& [full_key, value, commit_ts, tombstone] : group) {
      if (before_start(full_key)) continue;
      if (past_end(full_key)) return true;
      const RecordView sorted{commit_ts, tombstone, full_key, value};
      if (!visit(full_key, sorted)) return false;
    }
  }
  if (rc != MDB_NOTFOUND) CheckLmdb(rc, kWhat);
  return true;
}

}  // namespace percolite
