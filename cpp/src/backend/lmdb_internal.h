// lmdb_internal.h: what the files of the LMDB backend share (lmdb_backend.h
// says which file does what); nothing else includes it.
#pragma once

#include <lmdb.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "lmdb_backend.h"
#include "lmdb_util.h"
#include "percolite/encoding.h"

namespace percolite {
namespace lmdb_internal {

// The keys of percolite's own entries in the meta table: the timestamp
// counter, the store format (lmdb_store.cc) and the observed columns.
inline constexpr std::string_view kCounterKey = "ts";
inline constexpr std::string_view kFormatKey = "format";
inline constexpr std::string_view kObservedKey = "observed";

// Written when a read finds the store damaged (its text says what was found):
// commits to the store are refused from then on, by every handle and
// process, until it is opened with restored=True (lmdb_damage.cc).
inline constexpr const char* kDamagedFile = "/damaged";
// The durable mark (lmdb_files.cc): the timestamp counter (big-endian),
// then the CRC32C of those bytes.
inline constexpr const char* kDurableMarkFile = "/durable-txn";
inline constexpr size_t kDurableMarkSize = sizeof(uint64_t) + sizeof(uint32_t);

inline std::string ErrnoText(int err) { return std::strerror(err); }

// lmdb_files.cc: the directory of the store at `path`, made when missing and
// options.create; its real path.
std::string CanonicalDirectory(const std::string& path, const BackendOptions& options);
// lmdb_files.cc: checks the store's files before LMDB maps them (LMDB trusts
// what it maps): a truncated or damaged data file is refused here, not
// faulted on later. Only a missing data file may be created, and only with
// `create`.
void CheckStoreFiles(const std::string& dir, bool create);

// Stores `commit_ts` into the mapped durable mark. Inline: it runs once per
// durable group commit.
inline void StoreDurableMark(void* mark, uint64_t commit_ts) {
  std::string bytes;
  AppendUint64BE(&bytes, commit_ts);
  AppendUint32BE(&bytes, Crc32c(bytes));
  // A torn store (a crash mid-copy, or two processes at once) fails its CRC
  // and proves nothing at the next open: it only weakens the check.
  std::memcpy(mark, bytes.data(), kDurableMarkSize);
}

// lmdb_snapshot.cc: the timestamp counter as `txn` sees it (0 in a new store).
uint64_t ReadCounter(MDB_txn* txn, MDB_dbi meta);

// Aborts `txn` on the way out of a scope, unless it was set to null.
struct TxnAborter {
  MDB_txn* txn;
  ~TxnAborter() {
    if (txn) AbortTxn(txn);
  }
};

}  // namespace lmdb_internal

template <typename Fn>
auto LmdbBackend::Contain(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const FaultError& fault) {
    FailDamaged(fault);
    throw;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kCorruption) MarkDamaged(e.what());
    throw;
  }
}

template <typename Fn>
auto LmdbBackend::WithReadTxn(Fn&& fn) {
  CheckUsable();
  for (;;) {
    LmdbMapLock::Shared lock(map_lock_.get());
    MDB_txn* txn = Contain([&] { return TryBeginTxn(lock, MDB_RDONLY, "beginning a read"); });
    if (txn == nullptr) continue;
    lmdb_internal::TxnAborter aborter{txn};
    return Contain([&] { return fn(txn); });
  }
}

}  // namespace percolite
