// Internal helpers over LMDB: error translation and the cell table layout
// (stored keys, records, ordered scans). Callers hold the store's map lock
// (shared) for the whole of every call here, and copy out everything they keep.
#pragma once

#include <lmdb.h>

#include <functional>
#include <string>
#include <string_view>

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

// The raw record stored for an encoded cell key (a copy), or false if none.
// Throws kCorruption when a hashed key's record holds another key.
bool ReadRecord(MDB_txn* txn, MDB_dbi dbi, std::string_view encoded_key, std::string* record);

// Visits records in exact encoded-key order, starting at `from` (after it when
// `exclusive`) and stopping before `end` (no bound when empty). The visitor gets
// (encoded key, record) and returns false to stop. Returns true when the range
// was exhausted rather than stopped.
using RecordVisitor = std::function<bool(std::string_view key, const RecordView& record)>;
bool ScanRecords(MDB_txn* txn, MDB_dbi dbi, std::string_view from, bool exclusive,
                 std::string_view end, const RecordVisitor& visit);

}  // namespace percolite
