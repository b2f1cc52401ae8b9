// Group commit in an LMDB store (lmdb_backend.h): the queue, its leader and
// the writer thread, one batch's write transaction, tombstone collection.
#include <pthread.h>

#include <climits>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lmdb_internal.h"

namespace percolite {

using lmdb_internal::kCounterKey;
using lmdb_internal::kObservedKey;
using lmdb_internal::ReadCounter;
using lmdb_internal::StoreDurableMark;
using lmdb_internal::TxnAborter;

struct LmdbBackend::PendingCommit {
  uint64_t start_ts;
  const std::vector<Mutation>* mutations;
  const CommitExtras* extras = nullptr;  // null when it has none
  CommitResult result;
  // Read and written under the backend's queue_mu_ (not an annotation: the
  // analysis cannot name another object's lock from here).
  bool done = false;
  CondVar cv;
  // CommitAsync: the request owns its writes, and is deleted once `callback` ran.
  std::vector<Mutation> owned_mutations;
  CommitExtras owned_extras;
  CommitCallback callback;
};

namespace {

constexpr size_t kTombstonesPerBatch = 1024;

bool HasExtras(const CommitExtras& extras) {
  return extras.trigger || !extras.weak_notifications.empty();
}

// The oldest snapshot (LMDB txnid) any reader in any process still holds.
uint64_t OldestReaderTxnid(MDB_env* env) {
  uint64_t oldest = UINT64_MAX;
  mdb_reader_list(
      env,
      [](const char* line, void* ctx) -> int {
        unsigned long long pid = 0, txnid = 0;
        char thread[32];
        if (std::sscanf(line, "%llu %31s %llu", &pid, thread, &txnid) == 3) {
          auto* oldest = static_cast<uint64_t*>(ctx);
          if (txnid < *oldest) *oldest = txnid;
        }
        return 0;
      },
      &oldest);
  return oldest;
}

// Deletes every stored cell whose whole encoded key k has from <= k < end
// (Mutation::purge_end), walking one cursor from the first; returns how many.
// A long key is stored under its first kMaxInlineKey bytes and a hash, so
// keys sharing those bytes sort by hash: each is checked by its whole key,
// and the walk ends only past every key whose first bytes could be in range.
size_t PurgeStoredRange(MDB_txn* txn, MDB_dbi dbi, std::string_view from, std::string_view end) {
  MDB_cursor* cursor = nullptr;
  constexpr const char* kWhat = "purging consumed queue entries";
  CheckLmdb(LmdbCall(kWhat, [&] { return mdb_cursor_open(txn, dbi, &cursor); }), kWhat);
  std::unique_ptr<MDB_cursor, void (*)(MDB_cursor*)> closer(cursor, mdb_cursor_close);
  const std::string_view end_inline = end.substr(0, kMaxInlineKey);
  MDB_val key = ToVal(from.substr(0, kMaxInlineKey)), value;
  // Each step moves the cursor and judges the entry it lands on under one
  // guard. What is deleted is not read, so only a hashed key's record (which
  // holds its whole key) is decoded and verified.
  bool beyond = false, in_range = false;
  auto step = [&](MDB_cursor_op op) {
    RecordCheck check = RecordCheck::kOk;
    const int rc = LmdbCall(kWhat, [&] {
      const int moved = mdb_cursor_get(cursor, &key, &value, op);
      if (moved != MDB_SUCCESS) return moved;
      const std::string_view stored = FromVal(key);
      beyond = stored.substr(0, kMaxInlineKey) > end_inline;
      std::string_view whole = stored;
      if (!beyond && IsHashedStoredKey(stored)) {
        RecordView record;
        check = DecodeRecord(stored, FromVal(value), &record);
        whole = record.full_key;
      }
      in_range = check == RecordCheck::kOk && whole >= from && whole < end;
      return moved;
    });
    if (rc == MDB_SUCCESS && check != RecordCheck::kOk) ThrowBadRecord(FromVal(key), check, kWhat);
    return rc;
  };
  int rc = step(MDB_SET_RANGE);
  size_t purged = 0;
  while (rc == MDB_SUCCESS && !beyond) {
    if (in_range) {
      CheckLmdb(LmdbCall(kWhat, [&] { return mdb_cursor_del(cursor, 0); }), kWhat);
      ++purged;
      // The cursor now rests on the next item (or past the last).
      rc = step(MDB_GET_CURRENT);
      if (rc == EINVAL) rc = MDB_NOTFOUND;  // the table became empty
    } else {
      rc = step(MDB_NEXT);
    }
  }
  if (rc != MDB_SUCCESS && rc != MDB_NOTFOUND) CheckLmdb(rc, kWhat);
  return purged;
}

void PutRecordAt(MDB_txn* txn, MDB_dbi dbi, std::string_view full_key, uint64_t ts) {
  std::string stored = StoredKeyFor(full_key);
  std::string_view hashed = IsHashedStoredKey(stored) ? full_key : std::string_view();
  std::string record = EncodeRecord(stored, ts, false, hashed, "");
  MDB_val k = ToVal(stored), v = ToVal(record);
  CheckLmdb(GuardedPut(txn, dbi, &k, &v, "writing a notification"), "writing a notification");
}

// The tables of one LMDB write transaction, as commit_rules.h uses them.
class LmdbTables {
 public:
  LmdbTables(MDB_txn* txn, uint64_t txnid, MDB_dbi data, MDB_dbi tombstones, MDB_dbi notify,
             MDB_dbi ack)
      : txn_(txn),
        txnid_(txnid),
        data_(data),
        tombstones_(tombstones),
        notify_(notify),
        ack_(ack) {}

  std::optional<uint64_t> CellWrittenTs(std::string_view key) { return TsIn(data_, key); }
  std::optional<uint64_t> AckTs(std::string_view cell_key) { return TsIn(ack_, cell_key); }
  std::optional<uint64_t> NotificationStampAt(std::string_view key) { return TsIn(notify_, key); }

  void PutCell(std::string_view key, uint64_t commit_ts, bool is_delete, std::string_view value) {
    std::string stored = StoredKeyFor(key);
    std::string_view full = IsHashedStoredKey(stored) ? key : std::string_view();
    std::string record = EncodeRecord(stored, commit_ts, is_delete, full, value);
    MDB_val k = ToVal(stored), v = ToVal(record);
    CheckLmdb(GuardedPut(txn_, data_, &k, &v, "writing a cell"), "writing a cell");
    if (!is_delete) return;
    // Index the tombstone by the LMDB txn that wrote it (CollectTombstones).
    std::string index_key, ts_bytes;
    AppendUint64BE(&index_key, txnid_);
    index_key += stored;
    AppendUint64BE(&ts_bytes, commit_ts);
    MDB_val tk = ToVal(index_key), tv = ToVal(ts_bytes);
    CheckLmdb(GuardedPut(txn_, tombstones_, &tk, &tv, "indexing a tombstone"),
              "indexing a tombstone");
  }
  // A joinable write is held until the batch's last commit (PutJoined),
  // joined where it fits: one put per record, not one per commit.
  void PutStamped(std::string_view key, std::string_view stamped_key, uint64_t commit_ts,
                  std::string_view value, bool join) {
    auto open = joinable_.find(key);
    if (open != joinable_.end()) {
      if (join && JoinPacked(&open->second.value, value)) return;
      PutCell(open->second.stamped_key, open->second.commit_ts, false, open->second.value);
      joinable_.erase(open);
    }
    if (join) {
      joinable_.emplace(key, Joined{std::string(stamped_key), commit_ts, std::string(value)});
    } else {
      PutCell(stamped_key, commit_ts, false, value);
    }
  }
  void PutJoined() {
    for (const auto& [key, record] : joinable_) {
      PutCell(record.stamped_key, record.commit_ts, false, record.value);
    }
    joinable_.clear();
  }

  void PurgeCell(std::string_view key) {
    std::string stored = StoredKeyFor(key);
    MDB_val k = ToVal(stored);
    int rc = GuardedDel(txn_, data_, &k, "purging a consumed queue entry");
    if (rc != MDB_NOTFOUND) CheckLmdb(rc, "purging a consumed queue entry");
  }
  void PurgeRange(std::string_view from, std::string_view end) {
    PurgeStoredRange(txn_, data_, from, end);
  }
  void PutNotification(std::string_view key, uint64_t stamp) {
    PutRecordAt(txn_, notify_, key, stamp);
  }
  void RemoveNotification(std::string_view key) {
    std::string stored = StoredKeyFor(key);
    MDB_val k = ToVal(stored);
    CheckLmdb(GuardedDel(txn_, notify_, &k, "removing a notification"), "removing a notification");
  }
  void PutAck(std::string_view cell_key, uint64_t commit_ts) {
    PutRecordAt(txn_, ack_, cell_key, commit_ts);
  }

 private:
  std::optional<uint64_t> TsIn(MDB_dbi dbi, std::string_view key) {
    RecordView record;
    if (!ReadRecord(txn_, dbi, key, &record)) return std::nullopt;
    return record.commit_ts;
  }

  struct Joined {
    std::string stamped_key;
    uint64_t commit_ts = 0;
    std::string value;
  };

  MDB_txn* txn_;
  uint64_t txnid_;
  MDB_dbi data_, tombstones_, notify_, ack_;
  std::map<std::string, Joined, std::less<>> joinable_;  // unstamped key -> its open record
};

}  // namespace

// ---------------------------------------------------------------------------
// The queue and its leader

void LmdbBackend::CommitAsync(uint64_t start_ts, std::vector<Mutation> mutations,
                              CommitExtras extras, CommitCallback done) {
  CheckUsable();
  CheckWritable();
  auto pending = std::make_unique<PendingCommit>();
  pending->start_ts = start_ts;
  pending->owned_mutations = std::move(mutations);
  pending->mutations = &pending->owned_mutations;
  pending->owned_extras = std::move(extras);
  if (HasExtras(pending->owned_extras)) pending->extras = &pending->owned_extras;
  pending->callback = std::move(done);
  {
    MutexLock lock(&queue_mu_);
    if (stopping_) throw Error(ErrorCode::kClosed, "committing: store '" + path_ + "' is closed");
    queue_.push_back(pending.release());
  }
  queue_cv_.Signal();  // the writer leads unless a committer already does
}

CommitResult LmdbBackend::Commit(uint64_t start_ts, std::vector<Mutation> mutations,
                                 CommitExtras extras) {
  CheckUsable();
  CheckWritable();
  PendingCommit pending;
  pending.start_ts = start_ts;
  pending.mutations = &mutations;
  if (HasExtras(extras)) pending.extras = &extras;
  {
    MutexLock lock(&queue_mu_);
    if (stopping_) throw Error(ErrorCode::kClosed, "committing: store '" + path_ + "' is closed");
    queue_.push_back(&pending);
    if (leading_) {
      // The leader commits this request with a later batch and wakes us.
      while (!pending.done) pending.cv.Wait(&queue_mu_);
      return pending.result;
    }
    // No one leads: lead on this thread until our own commit is done, so a
    // lone committer pays no hand-off to the writer thread.
    leading_ = true;
  }
  LeadUntilDone(pending);
  return pending.result;  // set by this thread, the leader
}

void LmdbBackend::LeadUntilDone(const PendingCommit& pending) {
  std::vector<PendingCommit*> batch;
  for (;;) {
    try {
      if (LeadOnce(batch)) inline_batches_.fetch_add(1);
    } catch (...) {
      MutexLock lock(&queue_mu_);  // leadership goes back even if a step throws
      ResignLocked();
      throw;
    }
    MutexLock lock(&queue_mu_);
    if (pending.done) {
      ResignLocked();
      return;
    }
  }
}

void LmdbBackend::ResignLocked() {
  leading_ = false;
  // The writer takes over what others queued meanwhile (and Close waits
  // for leadership to be free).
  if (stopping_ || !queue_.empty()) queue_cv_.Signal();
}

std::vector<CommitResult> LmdbBackend::CommitBatchForTesting(
    const std::vector<std::pair<uint64_t, std::vector<Mutation>>>& commits) {
  CheckUsable();
  std::vector<PendingCommit> pending(commits.size());
  std::vector<PendingCommit*> batch;
  for (size_t i = 0; i < commits.size(); ++i) {
    pending[i].start_ts = commits[i].first;
    pending[i].mutations = &commits[i].second;
    batch.push_back(&pending[i]);
  }
  ProcessBatch(batch);
  std::vector<CommitResult> results;
  for (const PendingCommit& p : pending) results.push_back(p.result);
  return results;
}

void LmdbBackend::Wake(std::vector<PendingCommit*>& done) {
  std::vector<std::unique_ptr<PendingCommit>> asynchronous;
  {
    MutexLock lock(&queue_mu_);
    for (PendingCommit* p : done) {
      if (p->callback) {
        asynchronous.emplace_back(p);
        continue;
      }
      p->done = true;
      p->cv.Signal();
    }
  }
  done.clear();
  // Outside queue_mu_: a callback may submit the next commit.
  for (const auto& p : asynchronous) p->callback(p->result);
}

bool LmdbBackend::LeadOnce(std::vector<PendingCommit*>& batch) {
  batch.clear();
  {
    MutexLock lock(&queue_mu_);
    while (!queue_.empty() && batch.size() < options_.max_batch) {
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
  }
  if (batch.empty()) return false;
  ProcessBatch(batch);  // with sync="full", durable when it returns (StartEnvironment)
  Wake(batch);
  return true;
}

void LmdbBackend::WriterLoop() {
  pthread_setname_np(pthread_self(), "pc-writer");  // shown by top -H, perf, py-spy
  std::vector<PendingCommit*> batch;
  for (;;) {
    {
      MutexLock lock(&queue_mu_);
      while (leading_ || (!stopping_ && queue_.empty())) queue_cv_.Wait(&queue_mu_);
      // Stopping, and everything queued was committed.
      if (queue_.empty()) return;
      leading_ = true;
    }
    LeadOnce(batch);
    MutexLock lock(&queue_mu_);
    leading_ = false;
  }
}

// ---------------------------------------------------------------------------
// One batch

bool LmdbBackend::ProcessBatch(std::vector<PendingCommit*>& batch) {
  std::vector<Notification> written;
  for (;;) {
    written.clear();
    try {
      if (!WriteBatch(batch, &written)) continue;
      Deliver(written);
      return true;
    } catch (const LmdbError& e) {
      if (e.rc() == MDB_MAP_FULL) {
        GrowMap(/*adopt_only=*/false);
        continue;
      }
      for (PendingCommit* p : batch) p->result = CommitResult{e.ToStatus(), 0};
      return false;
    } catch (const FaultError& e) {
      FailDamaged(e);
      for (PendingCommit* p : batch) p->result = CommitResult{e.ToStatus(), 0};
      return false;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kCorruption) MarkDamaged(e.what());
      for (PendingCommit* p : batch) p->result = CommitResult{e.ToStatus(), 0};
      return false;
    } catch (const std::exception& e) {
      for (PendingCommit* p : batch) {
        p->result = CommitResult{
            Status::Make(ErrorCode::kStorage, std::string("group commit failed: ") + e.what()), 0};
      }
      return false;
    }
  }
}

void LmdbBackend::Deliver(const std::vector<Notification>& written) {
  if (written.empty()) return;
  sink_.Offer(written);
}

bool LmdbBackend::WriteBatch(std::vector<PendingCommit*>& batch,
                             std::vector<Notification>* written) {
  LmdbMapLock::Shared lock(map_lock_.get());
  MDB_txn* txn = TryBeginTxn(lock, 0, "beginning a group commit");
  if (txn == nullptr) return false;  // the map had grown: begin again
  TxnAborter aborter{txn};
  const uint64_t txnid = mdb_txn_id(txn);
  uint64_t ts = ReadCounter(txn, meta_dbi_);
  RefreshObserved(txn);
  LmdbTables tables(txn, txnid, data_dbi_, tombstone_dbi_, notify_dbi_, ack_dbi_);
  uint64_t committed = 0, refused = 0;
  for (PendingCommit* p : batch) {
    // Validate every write before applying any: a refused member writes nothing.
    p->result = CommitResult{ValidateCommit(tables, p->start_ts, *p->mutations, p->extras), 0};
    if (!p->result.status.ok()) {
      ++refused;
      continue;
    }
    p->result.commit_ts = ++ts;
    ApplyCommit(tables, strong_, p->start_ts, ts, *p->mutations, p->extras, written);
    ++committed;
  }
  tables.PutJoined();
  const uint64_t collected = CollectTombstones(txn, txnid);
  std::string ts_bytes;
  AppendUint64BE(&ts_bytes, ts);
  MDB_val ck = ToVal(kCounterKey), cv = ToVal(ts_bytes);
  CheckLmdb(GuardedPut(txn, meta_dbi_, &ck, &cv, "advancing the timestamp counter"),
            "advancing the timestamp counter");
  aborter.txn = nullptr;  // mdb_txn_commit frees the transaction, even on failure
  if (const int rc = LmdbCall("committing a group commit", [&] { return mdb_txn_commit(txn); });
      rc != MDB_SUCCESS) {
    // Writing or syncing failed: whether any of it reached the disk is
    // unknown, so, as PostgreSQL does after a failed fsync, the handle
    // refuses all further work until the store is opened again.
    if (rc != MDB_MAP_FULL) Fail(std::string("committing a group commit: ") + mdb_strerror(rc));
    CheckLmdb(rc, "committing a group commit");
  }
  if (durable_mark_ != nullptr) StoreDurableMark(durable_mark_, ts);
  commits_.fetch_add(committed);
  conflicts_.fetch_add(refused);
  batches_.fetch_add(1);
  tombstones_collected_.fetch_add(collected);
  return true;
}

void LmdbBackend::RefreshObserved(MDB_txn* txn) {
  constexpr const char* kWhat = "reading the observed columns";
  MDB_val key = ToVal(kObservedKey), data;
  int rc = GuardedGet(txn, meta_dbi_, &key, &data, kWhat);
  if (rc != MDB_SUCCESS && rc != MDB_NOTFOUND) CheckLmdb(rc, kWhat);
  const std::string raw = rc == MDB_SUCCESS ? CopyOut(data, kWhat) : std::string();
  if (!strong_.Load(raw)) {
    throw Error(ErrorCode::kCorruption, "the stored observed columns are malformed");
  }
}

uint64_t LmdbBackend::CollectTombstones(MDB_txn* txn, uint64_t current_txnid) {
  MDB_cursor* cursor = nullptr;
  constexpr const char* kWhat = "collecting tombstones";
  CheckLmdb(LmdbCall(kWhat, [&] { return mdb_cursor_open(txn, tombstone_dbi_, &cursor); }), kWhat);
  std::unique_ptr<MDB_cursor, void (*)(MDB_cursor*)> closer(cursor, mdb_cursor_close);
  std::vector<std::pair<std::string, uint64_t>> due;  // (index key, commit_ts)
  MDB_val key, value;
  int rc = GuardedCursorGet(cursor, &key, &value, MDB_FIRST, kWhat);
  if (rc == MDB_SUCCESS) {
    // A tombstone written by LMDB txn W is visible to a reader of snapshot R
    // when R >= W; once every reader is that recent, no commit can need it.
    uint64_t oldest = OldestReaderTxnid(env_);
    while (rc == MDB_SUCCESS && due.size() < kTombstonesPerBatch) {
      std::string k = CopyOut(key, kWhat);
      const std::string v = CopyOut(value, kWhat);
      if (k.size() < 8 || v.size() != 8) {
        throw Error(ErrorCode::kCorruption, "the tombstone index holds a malformed entry");
      }
      uint64_t written_in = ReadUint64BE(k);
      if (written_in >= current_txnid || written_in > oldest) break;
      due.emplace_back(std::move(k), ReadUint64BE(v));
      rc = GuardedCursorGet(cursor, &key, &value, MDB_NEXT, kWhat);
    }
  }
  closer.reset();
  if (rc != MDB_SUCCESS && rc != MDB_NOTFOUND) CheckLmdb(rc, kWhat);
  uint64_t collected = 0;
  for (const auto& [index_key, commit_ts] : due) {
    std::string_view stored = std::string_view(index_key).substr(8);
    MDB_val k = ToVal(stored), v;
    if (GuardedGet(txn, data_dbi_, &k, &v, kWhat) == MDB_SUCCESS) {
      RecordView record;
      VerifyRecord(stored, v, &record, kWhat);
      if (record.tombstone && record.commit_ts == commit_ts) {
        CheckLmdb(GuardedDel(txn, data_dbi_, &k, kWhat), kWhat);
        ++collected;
      }
    }
    MDB_val ik = ToVal(index_key);
    CheckLmdb(GuardedDel(txn, tombstone_dbi_, &ik, kWhat), kWhat);
  }
  return collected;
}

Status LmdbBackend::SyncMeta() {
  LmdbMapLock::Shared lock(map_lock_.get());
  int rc = mdb_env_sync(env_, 1);
  if (rc != MDB_SUCCESS) {
    Fail(std::string("syncing committed data: ") + mdb_strerror(rc));
    return Status::Make(ErrorCode::kStorage,
                        std::string("syncing committed data to disk: ") + mdb_strerror(rc));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// The observed columns: one write of the meta table, outside the queue

void LmdbBackend::SetObservedColumns(const std::vector<ObservedColumn>& columns) {
  CheckUsable();
  CheckWritable();
  std::string encoded = EncodeObservedColumns(columns);
  for (;;) {
    try {
      LmdbMapLock::Shared lock(map_lock_.get());
      constexpr const char* kWhat = "storing the observed columns";
      MDB_txn* txn = Contain([&] { return TryBeginTxn(lock, 0, kWhat); });
      if (txn == nullptr) continue;
      TxnAborter aborter{txn};
      MDB_val key = ToVal(kObservedKey), value = ToVal(encoded);
      CheckLmdb(Contain([&] { return GuardedPut(txn, meta_dbi_, &key, &value, kWhat); }), kWhat);
      aborter.txn = nullptr;
      CheckLmdb(Contain([&] { return LmdbCall(kWhat, [&] { return mdb_txn_commit(txn); }); }),
                kWhat);
      lock.Unlock();
      SyncMeta().ThrowIfError();
      return;
    } catch (const LmdbError& e) {
      if (e.rc() != MDB_MAP_FULL) throw;
      GrowMap(/*adopt_only=*/false);
    }
  }
}

}  // namespace percolite
