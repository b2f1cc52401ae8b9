// Opening and closing an LMDB store (lmdb_backend.h): the registry of open
// stores, LMDB's environment and its set-up transaction, map growth.
#include <errno.h>
#include <pthread.h>

#include <map>
#include <mutex>
#include <thread>

#include "fork_guard.h"
#include "lmdb_internal.h"

namespace percolite {

using lmdb_internal::CanonicalDirectory;
using lmdb_internal::CheckStoreFiles;
using lmdb_internal::ErrnoText;
using lmdb_internal::kFormatKey;

namespace {

// Bumped whenever what older versions wrote would be misread. 2: combine-queue
// values moved to <id>:d:<bucket>:<key> (combine_queue.h). 4: every record
// ends with a checksum (encoding.h); opening a store of kFormatBeforeChecksums
// adds them. 5: queue entries may be packed, several to a record
// (queues/queue_rows.h); a store of kFormatBeforePacking holds only
// single-entry records, which this version still reads, so opening one just
// retags it (after which a version that knows only percolite/4 refuses it).
constexpr std::string_view kFormat = "percolite/5";
constexpr std::string_view kFormatBeforePacking = "percolite/4";
constexpr std::string_view kFormatBeforeChecksums = "percolite/3";

// The handle of LMDB's main table, the one that lists the named tables.
constexpr MDB_dbi MAIN_DBI_INDEX = 1;

const char* SyncName(SyncMode mode) {
  switch (mode) {
    case SyncMode::kFull:
      return "full";
    case SyncMode::kMeta:
      return "meta";
    case SyncMode::kNone:
      return "none";
  }
  return "?";
}

}  // namespace

Mutex LmdbBackend::registry_mu_;

std::map<std::string, std::shared_ptr<LmdbBackend>>& LmdbBackend::Registry() {
  // Never destroyed: no exit-time destructor runs under a late ReleaseHandle.
  static auto* registry = new std::map<std::string, std::shared_ptr<LmdbBackend>>;
  return *registry;
}

// One backend per canonical path in this process. fork() handling
// (fork_guard.h): a child sees a new generation and refuses the parent's stores.
void LmdbBackend::InstallForkHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    InstallForkGeneration();
    // The registry is held across fork(), so a child never inherits it
    // locked. Taken in one handler and released in another: the analysis
    // cannot pair them.
    pthread_atfork([]() NO_THREAD_SAFETY_ANALYSIS { registry_mu_.Lock(); },
                   []() NO_THREAD_SAFETY_ANALYSIS { registry_mu_.Unlock(); },
                   []() NO_THREAD_SAFETY_ANALYSIS { registry_mu_.Unlock(); });
  });
}

const BackendCapabilities& LmdbBackend::capabilities() const {
  static const BackendCapabilities kLmdb{"lmdb", /*persistent=*/true, /*cross_process=*/true,
                                         /*durable=*/true,
                                         /*max_value_size=*/size_t{0xFFFFFFFF} - 64};
  return kLmdb;
}

std::shared_ptr<LmdbBackend> LmdbBackend::Acquire(const std::string& path,
                                                  const BackendOptions& options) {
  InstallForkHandlers();
  InstallFaultHandlers();
  std::string canonical = CanonicalDirectory(path, options);
  CheckStoreFiles(canonical, options.create);
  MutexLock lock(&registry_mu_);
  std::map<std::string, std::shared_ptr<LmdbBackend>>& registry = Registry();
  auto it = registry.find(canonical);
  if (it != registry.end() && it->second->ForkedAway()) {
    // Inherited from the parent process: deliberately leaked, never touched.
    new std::shared_ptr<LmdbBackend>(std::move(it->second));
    registry.erase(it);
    it = registry.end();
  }
  if (it != registry.end()) {
    LmdbBackend& existing = *it->second;
    if (existing.options_.sync != options.sync) {
      throw Error(
          ErrorCode::kInvalidArgument,
          "opening store '" + canonical + "': it is already open in this process with sync='" +
              SyncName(existing.options_.sync) + "', not sync='" + SyncName(options.sync) + "'");
    }
    ++existing.handles_;
    return it->second;
  }
  std::shared_ptr<LmdbBackend> store(new LmdbBackend(canonical, options));
  store->OpenEnvironment();
  store->OpenDurableMark();
  store->writer_ = std::make_unique<std::thread>([s = store.get()] { s->WriterLoop(); });
  store->handles_ = 1;
  registry[canonical] = store;
  return store;
}

void LmdbBackend::ReleaseHandle() {
  std::shared_ptr<LmdbBackend> keep_alive;
  MutexLock lock(&registry_mu_);
  if (ForkedAway() || handles_ == 0) return;
  if (--handles_ > 0) return;
  std::map<std::string, std::shared_ptr<LmdbBackend>>& registry = Registry();
  auto it = registry.find(path_);
  if (it != registry.end() && it->second.get() == this) {
    keep_alive = std::move(it->second);
    registry.erase(it);
  }
  Close();
}

LmdbBackend::LmdbBackend(std::string path, const BackendOptions& options)
    : path_(std::move(path)),
      options_(options),
      state_("store '" + path_ +
                 "' was opened before this process was forked; a forked child must open "
                 "the store again itself (or use the 'spawn' or 'forkserver' start method)",
             "store '" + path_ + "' is closed"),
      map_lock_(std::make_unique<LmdbMapLock>()) {}

LmdbBackend::~LmdbBackend() {
  if (ForkedAway()) {
    // Threads and LMDB state belong to the parent: leak them rather than touch them.
    writer_.release();
    map_lock_.release();
    return;
  }
  Close();
  CloseEnvironment();
}

bool LmdbBackend::ForkedAway() const { return state_.ForkedAway(); }

void LmdbBackend::CheckUsable() const { state_.Check(); }

// ---------------------------------------------------------------------------
// The environment

// One opening of the environment: when it fails, the environment closes
// (and its set-up transaction, if one is open, aborts) before the error
// leaves, naming the store.
struct LmdbBackend::Opening {
  LmdbBackend& store;
  MDB_txn* txn = nullptr;  // the set-up transaction, once begun

  void Abandon() {
    if (txn) AbortTxn(txn);
    txn = nullptr;
    mdb_env_close(store.env_);
    store.env_ = nullptr;
  }
  [[noreturn]] void Fail(int rc, const std::string& what) {
    Abandon();
    if (rc == EACCES || rc == EROFS || rc == EPERM) {
      throw Error(ErrorCode::kStorage, "opening store '" + store.path_ + "': " + what +
                                           ": permission denied (" + ErrnoText(rc) + ")");
    }
    throw LmdbError(rc, "opening store '" + store.path_ + "': " + what);
  }
  // The error to throw for a store found damaged.
  Error Damaged(const std::string& what) {
    Abandon();
    return Error(ErrorCode::kCorruption, "opening store '" + store.path_ + "': " + what +
                                             "; it is left untouched: restore the store from "
                                             "a copy");
  }
};

void LmdbBackend::OpenEnvironment() {
  MDB_env* env = nullptr;
  CheckLmdb(mdb_env_create(&env), "creating the LMDB environment");
  env_ = env;
  mdb_env_set_assert(env_, PercoliteOnLmdbAssert);
  Opening opening{*this};
  int rc = mdb_env_set_maxdbs(env_, 16);
  if (!rc) rc = mdb_env_set_maxreaders(env_, options_.max_readers);
  if (!rc) rc = mdb_env_set_mapsize(env_, options_.initial_map_size);
  if (rc) opening.Fail(rc, "configuring LMDB");
  try {
    StartEnvironment(opening);
    OpenTables(opening);
    CheckFormat(opening);
    rc = LmdbCall("committing the set-up transaction", [&] { return mdb_txn_commit(opening.txn); });
    opening.txn = nullptr;  // freed by mdb_txn_commit, even on failure
    if (rc) opening.Fail(rc, "committing the set-up transaction");
  } catch (const FaultError& fault) {
    opening.Abandon();
    throw Error(ErrorCode::kCorruption, "opening store '" + path_ + "': " + fault.what() +
                                            "; it is left untouched: restore the store from a "
                                            "copy");
  }
  int dead = 0;
  mdb_reader_check(env_, &dead);  // free slots of processes that died holding readers
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  map_size_ = info.me_mapsize;
}

void LmdbBackend::StartEnvironment(Opening& opening) {
  unsigned flags = MDB_NOTLS;
  // sync="full": LMDB syncs a commit's data pages, then writes its meta page
  // through a descriptor opened with O_DSYNC, and only then publishes the
  // commit to readers (the txnid in the lock file). So no reader in any
  // process sees a commit before it is durable. "meta" skips the meta page's
  // sync (a crash may lose the last commits, which readers may have seen);
  // "none" leaves all flushing to the OS.
  if (options_.sync == SyncMode::kMeta) flags |= MDB_NOMETASYNC;
  if (options_.sync == SyncMode::kNone) flags |= MDB_NOSYNC;
  int rc = LmdbCall("opening the LMDB environment",
                    [&] { return mdb_env_open(env_, path_.c_str(), flags, options_.file_mode); });
  if (rc) opening.Fail(rc, "opening the LMDB environment");
  // mdb_env_open sized the map from the data file; another process may
  // have grown the data past it since. Adopt its size and begin again, as
  // every transaction does (TryBeginTxn): nothing else uses this
  // environment yet, so the map may move.
  for (;;) {
    rc = LmdbCall("beginning the set-up transaction",
                  [&] { return mdb_txn_begin(env_, nullptr, 0, &opening.txn); });
    if (rc != MDB_MAP_RESIZED) break;
    rc = LmdbCall("adopting the map size", [&] { return mdb_env_set_mapsize(env_, 0); });
    if (rc) opening.Fail(rc, "adopting the map size another process set");
  }
  if (rc) opening.Fail(rc, "beginning the set-up transaction");
}

void LmdbBackend::OpenTables(Opening& opening) {
  // Only a new store (nothing in LMDB's main table yet) gets its tables
  // created. In an existing one a missing table is damage: creating it
  // empty would serve a store that lost its data as if nothing happened.
  MDB_stat main_stat;
  int rc = LmdbCall("reading the list of tables",
                    [&] { return mdb_stat(opening.txn, MAIN_DBI_INDEX, &main_stat); });
  if (rc) opening.Fail(rc, "reading the list of tables");
  const bool new_store = main_stat.ms_entries == 0;
  auto open_db = [&](const char* name, unsigned* dbi) {
    MDB_dbi handle = 0;
    int r = LmdbCall("opening a table", [&] {
      return mdb_dbi_open(opening.txn, name, new_store ? MDB_CREATE : 0, &handle);
    });
    if (r == MDB_NOTFOUND) {
      throw opening.Damaged(std::string("its table '") + name +
                            "' is missing (the store's pages are damaged)");
    }
    if (r) opening.Fail(r, std::string("opening table '") + name + "'");
    *dbi = handle;
  };
  open_db("data", &data_dbi_);
  open_db("meta", &meta_dbi_);
  open_db("tombstones", &tombstone_dbi_);
  open_db("notify", &notify_dbi_);
  open_db("ack", &ack_dbi_);
}

void LmdbBackend::CheckFormat(Opening& opening) {
  constexpr const char* kWhat = "checking the store format";
  MDB_txn* const txn = opening.txn;
  MDB_val key = ToVal(kFormatKey), value;
  int rc = GuardedGet(txn, meta_dbi_, &key, &value, kWhat);
  if (rc == MDB_NOTFOUND) {
    value = ToVal(kFormat);
    rc = GuardedPut(txn, meta_dbi_, &key, &value, kWhat);
  } else if (rc == 0) {
    const std::string found = CopyOut(value, kWhat);
    if (found == kFormatBeforeChecksums) {
      // The upgrade rewrites every record: prove the free list sound
      // first (CheckFreeList), in the snapshot this write transaction
      // starts from (nothing else can commit meanwhile).
      const std::optional<std::vector<std::string>> problems =
          WalkSnapshot(mdb_txn_id(txn) - 1, WalkScope::kFreeList);
      if (problems && !problems->empty()) {
        MarkDamaged(problems->front());
        throw opening.Damaged("its pages are damaged (" + problems->front() + ")");
      }
      AddChecksums(txn);
      value = ToVal(kFormat);
      rc = GuardedPut(txn, meta_dbi_, &key, &value, kWhat);
    } else if (found == kFormatBeforePacking) {
      value = ToVal(kFormat);
      rc = GuardedPut(txn, meta_dbi_, &key, &value, kWhat);
    } else if (found != kFormat) {
      throw opening.Damaged("its format is '" + found + "', this version of percolite reads '" +
                            std::string(kFormat) + "' (and upgrades '" +
                            std::string(kFormatBeforePacking) + "' and '" +
                            std::string(kFormatBeforeChecksums) + "')");
    }
  }
  if (rc) opening.Fail(rc, kWhat);
}

void LmdbBackend::AddChecksums(MDB_txn* txn) {
  // Every record of the cell, notification and acknowledgement tables gets
  // the checksum the current format ends each record with. One write
  // transaction: the store is upgraded whole or not at all.
  constexpr const char* kWhat = "upgrading the store to records with checksums";
  for (MDB_dbi dbi : {data_dbi_, notify_dbi_, ack_dbi_}) {
    MDB_cursor* cursor = nullptr;
    CheckLmdb(LmdbCall(kWhat, [&] { return mdb_cursor_open(txn, dbi, &cursor); }), kWhat);
    std::unique_ptr<MDB_cursor, void (*)(MDB_cursor*)> closer(cursor, mdb_cursor_close);
    MDB_val key, value;
    int rc = GuardedCursorGet(cursor, &key, &value, MDB_FIRST, kWhat);
    for (; rc == MDB_SUCCESS; rc = GuardedCursorGet(cursor, &key, &value, MDB_NEXT, kWhat)) {
      const std::string stored = CopyOut(key, kWhat);
      const std::string record = AddRecordChecksum(stored, CopyOut(value, kWhat));
      MDB_val k = ToVal(stored), v = ToVal(record);
      CheckLmdb(LmdbCall(kWhat, [&] { return mdb_cursor_put(cursor, &k, &v, MDB_CURRENT); }),
                kWhat);
    }
    if (rc != MDB_NOTFOUND) CheckLmdb(rc, kWhat);
  }
}

void LmdbBackend::Close() {
  if (ForkedAway()) return;
  {
    MutexLock lock(&queue_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  queue_cv_.SignalAll();
  if (writer_ && writer_->joinable()) writer_->join();
  state_.MarkClosed();
  CloseEnvironment();
}

void LmdbBackend::CloseEnvironment() {
  LmdbMapLock::Exclusive lock(map_lock_.get());
  // Snapshots are counted under the shared lock, so this check cannot race
  // with one being created: the last one to be released closes LMDB instead.
  if (env_ == nullptr || live_snapshots_.load() > 0) return;
  mdb_env_close(env_);
  env_ = nullptr;
  CloseDurableMark();
}

BackendStats LmdbBackend::Stats() const {
  BackendStats s;
  s.commits = commits_.load();
  s.conflicts = conflicts_.load();
  s.batches = batches_.load();
  s.inline_batches = inline_batches_.load();
  s.tombstones_collected = tombstones_collected_.load();
  s.map_size = map_size_.load();
  s.map_growths = map_growths_.load();
  return s;
}

// ---------------------------------------------------------------------------
// The map

void LmdbBackend::GrowMap(bool adopt_only) {
  LmdbMapLock::Exclusive lock(map_lock_.get());
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  size_t new_size = adopt_only ? 0 : info.me_mapsize * 2;
  CheckLmdb(LmdbCall("growing the memory map", [&] { return mdb_env_set_mapsize(env_, new_size); }),
            "growing the memory map");
  mdb_env_info(env_, &info);
  map_size_ = info.me_mapsize;
  if (!adopt_only) map_growths_.fetch_add(1);
}

MDB_txn* LmdbBackend::TryBeginTxn(LmdbMapLock::Shared& lock, unsigned flags, const char* what) {
  if (env_ == nullptr || state_.closed()) {
    throw Error(ErrorCode::kClosed, "store '" + path_ + "' is closed");
  }
  MDB_txn* txn = nullptr;
  int rc = LmdbCall(what, [&] { return mdb_txn_begin(env_, nullptr, flags, &txn); });
  if (rc == MDB_MAP_RESIZED) {  // another process grew the map: adopt its size
    lock.Unlock();
    GrowMap(/*adopt_only=*/true);
    return nullptr;
  }
  if (rc == MDB_READERS_FULL) {
    throw Error(ErrorCode::kStorage,
                std::string(what) + " on '" + path_ + "': all " +
                    std::to_string(options_.max_readers) +
                    " reader slots are in use; finish open transactions or open the store "
                    "with a larger max_readers");
  }
  CheckLmdb(rc, what);
  return txn;
}

}  // namespace percolite
