// Internal helpers over LMDB: error translation and the cell table layout
// (stored keys, records, ordered scans). Callers hold the store's map lock
// (shared) for the whole of every call here, and copy out everything they keep.
#pragma once

#include <lmdb.h>

#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "fault_guard.h"
#include "percolite/encoding.h"
#include "percolite/status.h"

namespace percolite {

// An LMDB failure; `rc` keeps the LMDB code so callers can react to
// MDB_MAP_FULL / MDB_MAP_RESIZED.
class LmdbError : public Error {
 public:
  LmdbError(int rc, const std::string& what);
  int rc() const { return rc_; }

 private:
  int rc_;
};

// Throws LmdbError when rc != 0; `what` names the operation.
void CheckLmdb(int rc, const char* what);

inline MDB_val ToVal(std::string_view s) { return MDB_val{s.size(), const_cast<char*>(s.data())}; }
inline std::string_view FromVal(const MDB_val& v) {
  return std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
}

// Every call into LMDB that reads or writes the map runs under the fault
// guard (fault_guard.h): LmdbCall runs one and returns its result code.
template <typename Fn>
int LmdbCall(const char* what, Fn&& fn) {
  return RunGuarded(what, std::forward<Fn>(fn));
}
// Aborts `txn` under the guard. After a fault the transaction may be half
// written and aborting it fault again: then it is left as it is (the
// backend is unusable by then anyway) rather than take the process down.
void AbortTxn(MDB_txn* txn);
// mdb_get, mdb_cursor_get, mdb_put and mdb_del under the guard.
int GuardedGet(MDB_txn* txn, MDB_dbi dbi, MDB_val* key, MDB_val* data, const char* what);
int GuardedCursorGet(MDB_cursor* cursor, MDB_val* key, MDB_val* data, MDB_cursor_op op,
                     const char* what);
int GuardedPut(MDB_txn* txn, MDB_dbi dbi, MDB_val* key, MDB_val* data, const char* what);
int GuardedDel(MDB_txn* txn, MDB_dbi dbi, MDB_val* key, const char* what);

// A copy of bytes in the map, read under the guard (for values that carry no
// checksum: percolite's meta table, the tombstone index).
std::string CopyOut(const MDB_val& bytes, const char* what);

// Verifies and decodes the record LMDB holds for `stored_key` (its bytes in
// the map) under the guard; the checksum reads every byte, so the views it
// leaves in *record are safe to read while the transaction lasts. Throws
// kCorruption naming the cell when the record is malformed or fails its
// checksum, FaultError when reading it faults.
void VerifyRecord(std::string_view stored_key, const MDB_val& data, RecordView* record,
                  const char* what);
// Throws the kCorruption error for a record that failed DecodeRecord.
[[noreturn]] void ThrowBadRecord(std::string_view stored_key, RecordCheck check, const char* what);

// The record stored for an encoded cell key, verified (views into the map),
// or false if none. Throws kCorruption when a hashed key's record holds another key.
bool ReadRecord(MDB_txn* txn, MDB_dbi dbi, std::string_view encoded_key, RecordView* record);

// Visits records in exact encoded-key order, starting at `from` (after it when
// `exclusive`) and stopping before `end` (no bound when empty). The visitor gets
// (encoded key, verified record) and returns false to stop. Returns true when
// the range was exhausted rather than stopped.
using RecordVisitor = std::function<bool(std::string_view key, const RecordView& record)>;
bool ScanRecords(MDB_txn* txn, MDB_dbi dbi, std::string_view from, bool exclusive,
                 std::string_view end, const RecordVisitor& visit);

}  // namespace percolite
