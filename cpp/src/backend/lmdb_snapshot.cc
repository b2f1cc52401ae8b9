// Reads from an LMDB store (lmdb_backend.h): snapshots, and the short reads
// of the observed columns and the notifications.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lmdb_internal.h"

namespace percolite {

using lmdb_internal::kCounterKey;
using lmdb_internal::kObservedKey;
using lmdb_internal::ReadCounter;

namespace lmdb_internal {

uint64_t ReadCounter(MDB_txn* txn, MDB_dbi meta) {
  constexpr const char* kWhat = "reading the timestamp counter";
  MDB_val key = ToVal(kCounterKey), data;
  int rc = GuardedGet(txn, meta, &key, &data, kWhat);
  if (rc == MDB_NOTFOUND) return 0;
  CheckLmdb(rc, kWhat);
  if (data.mv_size != 8) throw Error(ErrorCode::kCorruption, "the timestamp counter is malformed");
  return ReadUint64BE(CopyOut(data, kWhat));
}

}  // namespace lmdb_internal

// A snapshot: an LMDB read transaction held for its whole life. Each read
// holds the map lock shared while it is inside the map.
class LmdbSnapshot final : public Snapshot {
 public:
  LmdbSnapshot(std::shared_ptr<LmdbBackend> store, MDB_txn* txn, uint64_t start_ts)
      : Snapshot(start_ts), store_(std::move(store)), txn_(txn) {}
  ~LmdbSnapshot() override;

  std::optional<std::string> Get(std::string_view encoded_key) override;
  TryRead TryGet(std::string_view encoded_key, ValueView found, void* context) override;
  bool Visit(std::string_view from, bool exclusive, std::string_view end,
             const CellVisitor& visit) override;
  std::optional<uint64_t> NotificationStamp(std::string_view cell_key) override;
  void Release() override;

 private:
  void CheckOpen(const char* what) const;
  std::shared_ptr<LmdbBackend> store_;
  MDB_txn* txn_;
};

std::unique_ptr<Snapshot> LmdbBackend::BeginSnapshot() {
  CheckUsable();
  for (;;) {
    LmdbMapLock::Shared lock(map_lock_.get());
    MDB_txn* txn =
        Contain([&] { return TryBeginTxn(lock, MDB_RDONLY, "beginning a transaction"); });
    if (txn == nullptr) continue;
    uint64_t start_ts;
    try {
      start_ts = ReadCounter(txn, meta_dbi_);
    } catch (const FaultError& fault) {
      AbortTxn(txn);
      FailDamaged(fault);
      throw;
    } catch (...) {
      AbortTxn(txn);
      throw;
    }
    live_snapshots_.fetch_add(1);
    return std::make_unique<LmdbSnapshot>(shared_from_this(), txn, start_ts);
  }
}

LmdbSnapshot::~LmdbSnapshot() {
  if (store_ && store_->ForkedAway()) return;  // the parent's reader slot: leave it alone
  Release();
}

void LmdbSnapshot::CheckOpen(const char* what) const {
  store_->CheckUsable();
  if (txn_ == nullptr) throw Error(ErrorCode::kClosed, std::string(what) + " a released snapshot");
}

void LmdbSnapshot::Release() {
  if (txn_ == nullptr) return;
  if (store_->ForkedAway()) {
    txn_ = nullptr;
    return;
  }
  {
    LmdbMapLock::Shared lock(store_->map_lock_.get());
    AbortTxn(txn_);
    txn_ = nullptr;
  }
  if (store_->live_snapshots_.fetch_sub(1) == 1 && store_->state_.closed()) {
    store_->CloseEnvironment();  // the store closed while this snapshot was open
  }
}

std::optional<std::string> LmdbSnapshot::Get(std::string_view encoded_key) {
  CheckOpen("reading from");
  LmdbMapLock::Shared lock(store_->map_lock_.get());
  RecordView record;
  if (!store_->Contain([&] { return ReadRecord(txn_, store_->data_dbi_, encoded_key, &record); })) {
    return std::nullopt;
  }
  if (record.tombstone) return std::nullopt;
  return std::string(record.value);
}

Snapshot::TryRead LmdbSnapshot::TryGet(std::string_view encoded_key, ValueView found,
                                       void* context) {
  CheckOpen("reading from");
  // A map growth holds the lock exclusively: wait for it without the caller's lock.
  LmdbMapLock* const map_lock = store_->map_lock_.get();
  if (!map_lock->TryLockShared()) return TryRead::kWouldBlock;
  RecordView record;
  bool live;
  try {
    live = store_->Contain([&] {
      return ReadRecord(txn_, store_->data_dbi_, encoded_key, &record);
    }) && !record.tombstone;
    if (live) found(context, record.value);  // a view into the map: only while it is locked
  } catch (...) {
    map_lock->UnlockShared();
    throw;
  }
  map_lock->UnlockShared();
  return live ? TryRead::kFound : TryRead::kAbsent;
}

std::optional<uint64_t> LmdbSnapshot::NotificationStamp(std::string_view cell_key) {
  CheckOpen("reading from");
  Cell cell;
  if (!DecodeCellKey(cell_key, &cell)) return std::nullopt;
  LmdbMapLock::Shared lock(store_->map_lock_.get());
  RecordView record;
  const std::string key = NotificationKey(RowHash(cell.row), cell_key);
  if (!store_->Contain([&] { return ReadRecord(txn_, store_->notify_dbi_, key, &record); })) {
    return std::nullopt;
  }
  return record.commit_ts;
}

bool LmdbSnapshot::Visit(std::string_view from, bool exclusive, std::string_view end,
                         const CellVisitor& visit) {
  CheckOpen("scanning");
  // The map lock is taken for kVisitChunk cells at a time, so a long walk
  // never holds up a map growth (which takes it exclusively) for long.
  constexpr size_t kVisitChunk = 4096;
  std::string last, resume;  // the key a chunk ended at; where this chunk began
  for (bool first = true;; first = false) {
    resume.swap(last);  // its own string: `last` is written when this chunk ends
    LmdbMapLock::Shared lock(store_->map_lock_.get());
    size_t visited = 0;
    bool stopped = false;
    const bool exhausted = store_->Contain([&] {
      return ScanRecords(txn_, store_->data_dbi_, first ? from : std::string_view(resume),
                         first ? exclusive : true, end,
                         [&](std::string_view key, const RecordView& record) {
                           if (!record.tombstone && !visit(key, record.value)) {
                             stopped = true;
                             return false;
                           }
                           if (++visited < kVisitChunk) return true;
                           last.assign(key);  // the next chunk resumes after it
                           return false;
                         });
    });
    if (exhausted) return true;
    if (stopped) return false;
  }
}

// ---------------------------------------------------------------------------
// Short reads, each in a read transaction of its own

std::vector<ObservedColumn> LmdbBackend::ObservedColumns() {
  return WithReadTxn([&](MDB_txn* txn) {
    constexpr const char* kWhat = "reading the observed columns";
    std::vector<ObservedColumn> columns;
    MDB_val key = ToVal(kObservedKey), data;
    int rc = GuardedGet(txn, meta_dbi_, &key, &data, kWhat);
    if (rc == MDB_NOTFOUND) return columns;
    CheckLmdb(rc, kWhat);
    if (!DecodeObservedColumns(CopyOut(data, kWhat), &columns)) {
      throw Error(ErrorCode::kCorruption, "the stored observed columns are malformed");
    }
    return columns;
  });
}

uint64_t LmdbBackend::PendingNotifications() {
  return WithReadTxn([&](MDB_txn* txn) {
    MDB_stat stat;
    CheckLmdb(LmdbCall("counting notifications", [&] { return mdb_stat(txn, notify_dbi_, &stat); }),
              "counting notifications");
    return static_cast<uint64_t>(stat.ms_entries);
  });
}

bool LmdbBackend::ScanNotifications(std::string_view after, size_t limit,
                                    std::vector<Notification>* out) {
  return WithReadTxn([&](MDB_txn* txn) {
    size_t taken = 0;
    return ScanRecords(txn, notify_dbi_, after, !after.empty(), "",
                       [&](std::string_view key, const RecordView& record) {
                         if (taken == limit) return false;
                         if (key.size() < 8) return true;
                         out->push_back(Notification{std::string(key.substr(8)), record.commit_ts,
                                                     ReadUint64BE(key)});
                         ++taken;
                         return true;
                       });
  });
}

std::map<std::pair<std::string, std::string>, uint64_t> LmdbBackend::CountPendingByColumn() {
  return WithReadTxn([&](MDB_txn* txn) {
    std::map<std::pair<std::string, std::string>, uint64_t> counts;
    ScanRecords(txn, notify_dbi_, "", false, "", [&](std::string_view key, const RecordView&) {
      CountByColumn(key, &counts);
      return true;
    });
    return counts;
  });
}

}  // namespace percolite
