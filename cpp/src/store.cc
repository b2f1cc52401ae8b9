#include "percolite/store.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>

#include "lmdb_util.h"
#include "percolite/encoding.h"
#include "percolite/workers.h"

namespace percolite {
namespace {

constexpr std::string_view kCounterKey = "ts";
constexpr std::string_view kFormatKey = "format";
// Bumped whenever what older versions wrote would be misread. 2: combine-queue
// values moved to <id>:d:<bucket>:<key> (combine_queue.h).
constexpr std::string_view kFormat = "percolite/3";
constexpr std::string_view kObservedKey = "observed";
constexpr size_t kTombstonesPerBatch = 1024;

// fork() handling: a child sees a new generation and refuses the parent's stores.
std::atomic<uint64_t> g_fork_generation{0};
std::mutex g_registry_mu;
std::map<std::string, std::shared_ptr<Store>>* g_registry =
    new std::map<std::string, std::shared_ptr<Store>>;

void InstallForkHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork([] { g_registry_mu.lock(); }, [] { g_registry_mu.unlock(); },
                   [] {
                     g_fork_generation.fetch_add(1);
                     g_registry_mu.unlock();
                   });
  });
}

std::string ErrnoText(int err) { return std::strerror(err); }

std::string CanonicalDirectory(const std::string& path, const StoreOptions& options) {
  if (path.empty()) throw Error(ErrorCode::kInvalidArgument, "opening a store: the path is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      throw Error(ErrorCode::kStorage, "opening store '" + path +
                                           "': the path is a file, not a directory; percolite "
                                           "stores live in a directory of their own");
    }
  } else if (errno == ENOENT) {
    if (!options.create) {
      throw Error(ErrorCode::kStorage,
                  "opening store '" + path + "': no such directory (pass create=True to make it)");
    }
    mode_t dir_mode = options.file_mode | ((options.file_mode & 0444) >> 2);
    if (::mkdir(path.c_str(), dir_mode) != 0 && errno != EEXIST) {
      throw Error(ErrorCode::kStorage,
                  "creating store directory '" + path + "': " + ErrnoText(errno));
    }
  } else {
    throw Error(ErrorCode::kStorage, "opening store '" + path + "': " + ErrnoText(errno));
  }
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    throw Error(ErrorCode::kStorage, "opening store '" + path + "': " + ErrnoText(errno));
  }
  return resolved;
}

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

uint64_t ReadCounter(MDB_txn* txn, MDB_dbi meta) {
  MDB_val key = ToVal(kCounterKey), data;
  int rc = mdb_get(txn, meta, &key, &data);
  if (rc == MDB_NOTFOUND) return 0;
  CheckLmdb(rc, "reading the timestamp counter");
  if (data.mv_size != 8) throw Error(ErrorCode::kCorruption, "the timestamp counter is malformed");
  return ReadUint64BE(FromVal(data));
}

// A printable form of an encoded cell key, for error messages.
std::string DescribeKey(std::string_view encoded) {
  Cell cell;
  if (!DecodeCellKey(encoded, &cell)) return "an internal key";
  auto repr = [](const std::string& s) {
    std::string out = "b'";
    size_t shown = 0;
    for (unsigned char c : s) {
      if (++shown > 60) {
        out += "...";
        break;
      }
      if (c == '\\' || c == '\'') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c >= 32 && c < 127) {
        out += static_cast<char>(c);
      } else {
        char buf[5];
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      }
    }
    return out + "'";
  };
  return "row " + repr(cell.row) + " column (" + repr(cell.family) + ", " + repr(cell.qualifier) +
         ")";
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

struct TxnAborter {
  MDB_txn* txn;
  ~TxnAborter() {
    if (txn) mdb_txn_abort(txn);
  }
};

}  // namespace

struct Store::PendingCommit {
  uint64_t start_ts;
  const std::vector<Mutation>* mutations;
  const CommitExtras* extras = nullptr;
  CommitResult result;
  bool done = false;  // GUARDED_BY(queue_mu_)
  std::condition_variable cv;
};

// ---------------------------------------------------------------------------
// Opening and closing

std::shared_ptr<Store> Store::Acquire(const std::string& path, const StoreOptions& options) {
  InstallForkHandlers();
  std::string canonical = CanonicalDirectory(path, options);
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = g_registry->find(canonical);
  if (it != g_registry->end() && it->second->ForkedAway()) {
    // Inherited from the parent process: deliberately leaked, never touched.
    new std::shared_ptr<Store>(std::move(it->second));
    g_registry->erase(it);
    it = g_registry->end();
  }
  if (it != g_registry->end()) {
    Store& existing = *it->second;
    if (existing.options_.sync != options.sync) {
      throw Error(
          ErrorCode::kInvalidArgument,
          "opening store '" + canonical + "': it is already open in this process with sync='" +
              SyncName(existing.options_.sync) + "', not sync='" + SyncName(options.sync) + "'");
    }
    ++existing.handles_;
    return it->second;
  }
  std::shared_ptr<Store> store(new Store(canonical, options));
  store->OpenEnvironment();
  store->writer_ = std::make_unique<std::thread>([s = store.get()] { s->WriterLoop(); });
  store->handles_ = 1;
  (*g_registry)[canonical] = store;
  return store;
}

void Store::ReleaseHandle() {
  std::shared_ptr<Store> keep_alive;
  std::lock_guard<std::mutex> lock(g_registry_mu);
  if (ForkedAway() || handles_ == 0) return;
  if (--handles_ > 0) return;
  auto it = g_registry->find(path_);
  if (it != g_registry->end() && it->second.get() == this) {
    keep_alive = std::move(it->second);
    g_registry->erase(it);
  }
  Close();
}

Store::Store(std::string path, const StoreOptions& options)
    : path_(std::move(path)),
      options_(options),
      fork_generation_(g_fork_generation.load()),
      map_lock_(std::make_unique<MapLock>()) {}

Store::~Store() {
  if (ForkedAway()) {
    // Threads and LMDB state belong to the parent: leak them rather than touch them.
    writer_.release();
    map_lock_.release();
    return;
  }
  Close();
  CloseEnvironment();
}

bool Store::ForkedAway() const { return fork_generation_ != g_fork_generation.load(); }

void Store::CheckUsable() const {
  if (ForkedAway()) {
    throw Error(ErrorCode::kWrongState,
                "store '" + path_ +
                    "' was opened before this process was forked; a forked child must open "
                    "the store again itself (or use the 'spawn' or 'forkserver' start method)");
  }
  if (closed_.load()) throw Error(ErrorCode::kClosed, "store '" + path_ + "' is closed");
}

void Store::OpenEnvironment() {
  MDB_env* env = nullptr;
  CheckLmdb(mdb_env_create(&env), "creating the LMDB environment");
  env_ = env;
  auto fail = [&](int rc, const std::string& what) {
    mdb_env_close(env_);
    env_ = nullptr;
    if (rc == EACCES || rc == EROFS || rc == EPERM) {
      throw Error(ErrorCode::kStorage, "opening store '" + path_ + "': " + what +
                                           ": permission denied (" + ErrnoText(rc) + ")");
    }
    throw LmdbError(rc, "opening store '" + path_ + "': " + what);
  };
  int rc = mdb_env_set_maxdbs(env_, 16);
  if (!rc) rc = mdb_env_set_maxreaders(env_, options_.max_readers);
  if (!rc) rc = mdb_env_set_mapsize(env_, options_.initial_map_size);
  if (rc) fail(rc, "configuring LMDB");
  unsigned flags = MDB_NOTLS;
  // sync="full" also runs LMDB with MDB_NOMETASYNC: data pages are always
  // synced before the meta page is written (so a crash never corrupts), and
  // the writer confirms a batch only after a later sync covered its meta page
  // (see WriterLoop): one sync per batch under load instead of two.
  if (options_.sync != SyncMode::kNone) flags |= MDB_NOMETASYNC;
  if (options_.sync == SyncMode::kNone) flags |= MDB_NOSYNC;
  rc = mdb_env_open(env_, path_.c_str(), flags, options_.file_mode);
  if (rc) fail(rc, "opening the LMDB environment");

  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(env_, nullptr, 0, &txn);
  if (rc) fail(rc, "beginning the set-up transaction");
  auto open_db = [&](const char* name, MDB_dbi* dbi) {
    int r = mdb_dbi_open(txn, name, MDB_CREATE, dbi);
    if (r) {
      mdb_txn_abort(txn);
      fail(r, std::string("opening table '") + name + "'");
    }
  };
  MDB_dbi data, meta, tombstones, notify, ack;
  open_db("data", &data);
  open_db("meta", &meta);
  open_db("tombstones", &tombstones);
  open_db("notify", &notify);
  open_db("ack", &ack);
  data_dbi_ = data;
  meta_dbi_ = meta;
  tombstone_dbi_ = tombstones;
  notify_dbi_ = notify;
  ack_dbi_ = ack;

  MDB_val key = ToVal(kFormatKey), value;
  rc = mdb_get(txn, meta, &key, &value);
  if (rc == MDB_NOTFOUND) {
    value = ToVal(kFormat);
    rc = mdb_put(txn, meta, &key, &value, 0);
  } else if (rc == 0 && FromVal(value) != kFormat) {
    std::string found(FromVal(value));
    mdb_txn_abort(txn);
    mdb_env_close(env_);
    env_ = nullptr;
    throw Error(ErrorCode::kCorruption, "opening store '" + path_ + "': its format is '" + found +
                                            "', this version of percolite reads '" +
                                            std::string(kFormat) + "'");
  }
  if (rc) {
    mdb_txn_abort(txn);
    fail(rc, "checking the store format");
  }
  rc = mdb_txn_commit(txn);
  if (rc) fail(rc, "committing the set-up transaction");
  int dead = 0;
  mdb_reader_check(env_, &dead);  // free slots of processes that died holding readers
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  map_size_ = info.me_mapsize;
}

void Store::Close() {
  if (ForkedAway()) return;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (writer_ && writer_->joinable()) writer_->join();
  closed_ = true;
  CloseEnvironment();
}

void Store::CloseEnvironment() {
  MapLock::Exclusive lock(*map_lock_);
  // Snapshots are counted under the shared lock, so this check cannot race
  // with one being created: the last one to be released closes LMDB instead.
  if (env_ == nullptr || live_snapshots_.load() > 0) return;
  mdb_env_close(env_);
  env_ = nullptr;
}

StoreStats Store::Stats() const {
  StoreStats s;
  s.commits = commits_.load();
  s.conflicts = conflicts_.load();
  s.batches = batches_.load();
  s.inline_batches = inline_batches_.load();
  s.tombstones_collected = tombstones_collected_.load();
  s.map_size = map_size_.load();
  s.map_growths = map_growths_.load();
  return s;
}

void Store::GrowMap(bool adopt_only) {
  MapLock::Exclusive lock(*map_lock_);
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  size_t new_size = adopt_only ? 0 : info.me_mapsize * 2;
  CheckLmdb(mdb_env_set_mapsize(env_, new_size), "growing the memory map");
  mdb_env_info(env_, &info);
  map_size_ = info.me_mapsize;
  if (!adopt_only) map_growths_.fetch_add(1);
}

// ---------------------------------------------------------------------------
// Snapshots

MDB_txn* Store::TryBeginTxn(MapLock::Shared& lock, unsigned flags, const char* what) {
  if (env_ == nullptr || closed_.load()) {
    throw Error(ErrorCode::kClosed, "store '" + path_ + "' is closed");
  }
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(env_, nullptr, flags, &txn);
  if (rc == MDB_MAP_RESIZED) {  // another process grew the map: adopt its size
    lock.unlock();
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

std::unique_ptr<Snapshot> Store::BeginSnapshot() {
  CheckUsable();
  for (;;) {
    MapLock::Shared lock(*map_lock_);
    MDB_txn* txn = TryBeginTxn(lock, MDB_RDONLY, "beginning a transaction");
    if (txn == nullptr) continue;
    uint64_t start_ts;
    try {
      start_ts = ReadCounter(txn, meta_dbi_);
    } catch (...) {
      mdb_txn_abort(txn);
      throw;
    }
    live_snapshots_.fetch_add(1);
    return std::unique_ptr<Snapshot>(new Snapshot(shared_from_this(), txn, start_ts));
  }
}

Snapshot::~Snapshot() {
  if (store_ && store_->ForkedAway()) return;  // the parent's reader slot: leave it alone
  Release();
}

void Snapshot::Release() {
  if (txn_ == nullptr) return;
  if (store_->ForkedAway()) {
    txn_ = nullptr;
    return;
  }
  {
    Store::MapLock::Shared lock(*store_->map_lock_);
    mdb_txn_abort(txn_);
    txn_ = nullptr;
  }
  if (store_->live_snapshots_.fetch_sub(1) == 1 && store_->closed_.load()) {
    store_->CloseEnvironment();  // the store closed while this snapshot was open
  }
}

std::optional<std::string> Snapshot::Get(std::string_view encoded_key) {
  store_->CheckUsable();
  if (txn_ == nullptr) throw Error(ErrorCode::kClosed, "reading from a released snapshot");
  Store::MapLock::Shared lock(*store_->map_lock_);
  std::string raw;
  if (!ReadRecord(txn_, store_->data_dbi_, encoded_key, &raw)) return std::nullopt;
  RecordView record;
  if (!DecodeRecord(raw, &record))
    throw Error(ErrorCode::kCorruption, "reading a cell: malformed record");
  if (record.tombstone) return std::nullopt;
  return std::string(record.value);
}

std::optional<uint64_t> Snapshot::NotificationStamp(std::string_view cell_key) {
  store_->CheckUsable();
  if (txn_ == nullptr) throw Error(ErrorCode::kClosed, "reading from a released snapshot");
  Cell cell;
  if (!DecodeCellKey(cell_key, &cell)) return std::nullopt;
  Store::MapLock::Shared lock(*store_->map_lock_);
  std::string raw;
  if (!ReadRecord(txn_, store_->notify_dbi_, NotificationKey(RowHash(cell.row), cell_key), &raw)) {
    return std::nullopt;
  }
  return ReadUint64BE(raw);
}

bool Snapshot::Scan(std::string_view from, bool exclusive, std::string_view end, size_t limit,
                    std::vector<std::pair<std::string, std::string>>* out) {
  store_->CheckUsable();
  if (txn_ == nullptr) throw Error(ErrorCode::kClosed, "scanning a released snapshot");
  Store::MapLock::Shared lock(*store_->map_lock_);
  size_t taken = 0;
  return ScanRecords(txn_, store_->data_dbi_, from, exclusive, end,
                     [&](std::string_view key, const RecordView& record) {
                       if (taken == limit) return false;
                       if (!record.tombstone) {
                         out->emplace_back(std::string(key), std::string(record.value));
                         ++taken;
                       }
                       return true;
                     });
}

bool Snapshot::Visit(std::string_view from, bool exclusive, std::string_view end,
                     const CellVisitor& visit) {
  store_->CheckUsable();
  if (txn_ == nullptr) throw Error(ErrorCode::kClosed, "scanning a released snapshot");
  // The map lock is taken for kVisitChunk cells at a time, so a long walk
  // never holds up a map growth (which takes it exclusively) for long.
  constexpr size_t kVisitChunk = 4096;
  std::string last, resume;  // the key a chunk ended at; where this chunk began
  for (bool first = true;; first = false) {
    resume.swap(last);  // its own string: `last` is written when this chunk ends
    Store::MapLock::Shared lock(*store_->map_lock_);
    size_t visited = 0;
    bool stopped = false;
    const bool exhausted = ScanRecords(
        txn_, store_->data_dbi_, first ? from : std::string_view(resume), first ? exclusive : true,
        end, [&](std::string_view key, const RecordView& record) {
          if (!record.tombstone && !visit(key, record.value)) {
            stopped = true;
            return false;
          }
          if (++visited < kVisitChunk) return true;
          last.assign(key);  // the next chunk resumes after it
          return false;
        });
    if (exhausted) return true;
    if (stopped) return false;
  }
}

size_t Snapshot::Count(std::string_view from, bool exclusive, std::string_view end, size_t limit) {
  store_->CheckUsable();
  if (txn_ == nullptr) throw Error(ErrorCode::kClosed, "scanning a released snapshot");
  Store::MapLock::Shared lock(*store_->map_lock_);
  size_t counted = 0;
  ScanRecords(txn_, store_->data_dbi_, from, exclusive, end,
              [&](std::string_view, const RecordView& record) {
                if (counted == limit) return false;
                if (!record.tombstone) ++counted;
                return true;
              });
  return counted;
}

// ---------------------------------------------------------------------------
// Group commit

CommitResult Store::Commit(uint64_t start_ts, const std::vector<Mutation>& mutations,
                           const CommitExtras* extras) {
  CheckUsable();
  PendingCommit pending;
  pending.start_ts = start_ts;
  pending.mutations = &mutations;
  pending.extras = extras;
  std::unique_lock<std::mutex> lock(queue_mu_);
  if (stopping_) throw Error(ErrorCode::kClosed, "committing: store '" + path_ + "' is closed");
  queue_.push_back(&pending);
  if (leading_) {
    // The leader commits this request with a later batch and wakes us.
    pending.cv.wait(lock, [&] { return pending.done; });
    return pending.result;
  }
  // No one leads: lead on this thread until our own commit is done, so a
  // lone committer pays no hand-off to the writer thread.
  leading_ = true;
  lock.unlock();
  std::vector<PendingCommit*> batch;
  struct Resign {  // gives leadership back even if a step throws
    Store* store;
    std::unique_lock<std::mutex>* lock;
    ~Resign() {
      if (!lock->owns_lock()) lock->lock();
      store->leading_ = false;
      // The writer takes over what others queued meanwhile (and Close waits
      // for leadership to be free).
      if (store->stopping_ || !store->queue_.empty() || !store->unconfirmed_.empty()) {
        store->queue_cv_.notify_one();
      }
    }
  } resign{this, &lock};
  for (;;) {
    if (LeadOnce(batch)) inline_batches_.fetch_add(1);
    lock.lock();
    if (pending.done) break;
    lock.unlock();
  }
  return pending.result;
}

std::vector<CommitResult> Store::CommitBatchForTesting(
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

void Store::Wake(std::vector<PendingCommit*>& done) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  for (PendingCommit* p : done) {
    p->done = true;
    p->cv.notify_one();
  }
  done.clear();
}

// A batch of at least this many cells first confirms the previous batch
// with a sync of its own (LeadOnce).
constexpr size_t kEarlySyncCells = 256;

bool Store::LeadOnce(std::vector<PendingCommit*>& batch) {
  // With sync="full", a committed batch is durable once its meta page is
  // synced. The next batch's commit syncs the file (its data pages), which
  // covers the previous meta page; when nothing else is queued, an explicit
  // sync does it, as it does before a large batch (kEarlySyncCells). So
  // committers of a batch are woken after the following sync, and a loaded
  // leader pays about one sync per batch.
  const bool deferred_meta_sync = options_.sync == SyncMode::kFull;
  batch.clear();
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    while (!queue_.empty() && batch.size() < options_.max_batch) {
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
  }
  auto sync_unconfirmed = [&] {
    Status synced = SyncMeta();
    for (PendingCommit* p : unconfirmed_) {
      if (!synced.ok()) p->result = CommitResult{synced, 0};
    }
  };
  auto confirm_now = [&] {  // an explicit sync, then wake them
    if (!unconfirmed_.empty()) sync_unconfirmed();
    Wake(unconfirmed_);
  };
  if (batch.empty()) {
    confirm_now();
    return false;
  }
  if (deferred_meta_sync && !unconfirmed_.empty()) {
    // A large batch (an observer run adding a document's phrases, a queue
    // run writing thousands of cells) takes long to write: sync now rather
    // than keep the previous batch's committers waiting behind it.
    size_t cells = 0;
    for (const PendingCommit* p : batch) {
      // A range purge (first, if any) deletes a run of queue entries: a large write.
      const std::vector<Mutation>& m = *p->mutations;
      cells += m.size() + (!m.empty() && !m.front().purge_end.empty() ? kEarlySyncCells : 0);
    }
    if (cells >= kEarlySyncCells) confirm_now();
  }
  const bool committed = ProcessBatch(batch);
  // Nothing was committed, so nothing was synced: sync explicitly.
  if (!committed && !unconfirmed_.empty()) sync_unconfirmed();
  Wake(unconfirmed_);  // the file was synced after their meta pages were written
  if (!deferred_meta_sync) {
    Wake(batch);
    return true;
  }
  std::vector<PendingCommit*> refused;  // nothing to make durable
  for (PendingCommit* p : batch) (p->result.status.ok() ? unconfirmed_ : refused).push_back(p);
  Wake(refused);
  return true;
}

void Store::WriterLoop() {
  pthread_setname_np(pthread_self(), "pc-writer");  // shown by top -H, perf, py-spy
  std::vector<PendingCommit*> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [&] {
        return !leading_ && (stopping_ || !queue_.empty() || !unconfirmed_.empty());
      });
      // Stopping, and everything queued was committed and confirmed.
      if (queue_.empty() && unconfirmed_.empty()) return;
      leading_ = true;
    }
    LeadOnce(batch);
    std::lock_guard<std::mutex> lock(queue_mu_);
    leading_ = false;
  }
}

Status Store::SyncMeta() {
  MapLock::Shared lock(*map_lock_);
  int rc = mdb_env_sync(env_, 1);
  if (rc != MDB_SUCCESS) {
    return Status::Make(ErrorCode::kStorage,
                        std::string("syncing committed data to disk: ") + mdb_strerror(rc) +
                            " (the commit was applied but may not be durable)");
  }
  return Status::Ok();
}

std::string StampedKey(std::string_view encoded_key, uint64_t commit_ts, uint32_t seq) {
  std::string stamp, key;
  AppendUint64BE(&stamp, commit_ts);
  for (int shift = 24; shift >= 0; shift -= 8) stamp.push_back(static_cast<char>(seq >> shift));
  if (!PrefixQualifier(encoded_key, stamp, &key)) {
    throw Error(ErrorCode::kInvalidArgument, "a stamped write needs a cell key");
  }
  return key;
}

namespace {

// Sets *row to the row of the cell key `key` (only the row is decoded);
// false when `key` is not a cell key.
bool RowOfCellKey(std::string_view key, std::string* row) {
  size_t parts[3], pos = 0;
  return CellKeyParts(key, &parts) && ReadEscapedPart(key, &pos, row);
}

// Deletes every stored cell whose whole encoded key k has from <= k < end
// (Mutation::purge_end), walking one cursor from the first; returns how many.
// A long key is stored under its first kMaxInlineKey bytes and a hash, so
// keys sharing those bytes sort by hash: each is checked by its whole key,
// and the walk ends only past every key whose first bytes could be in range.
size_t PurgeRange(MDB_txn* txn, MDB_dbi dbi, std::string_view from, std::string_view end) {
  MDB_cursor* cursor = nullptr;
  CheckLmdb(mdb_cursor_open(txn, dbi, &cursor), "opening a cursor to purge queue entries");
  std::unique_ptr<MDB_cursor, void (*)(MDB_cursor*)> closer(cursor, mdb_cursor_close);
  const std::string_view end_inline = end.substr(0, kMaxInlineKey);
  MDB_val key = ToVal(from.substr(0, kMaxInlineKey)), value;
  int rc = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE);
  size_t purged = 0;
  while (rc == MDB_SUCCESS) {
    const std::string_view stored = FromVal(key);
    if (stored.substr(0, kMaxInlineKey) > end_inline) break;
    std::string_view whole = stored;
    RecordView record;
    if (IsHashedStoredKey(stored)) {
      if (!DecodeRecord(FromVal(value), &record)) {
        throw Error(ErrorCode::kCorruption, "a stored record is malformed");
      }
      whole = record.full_key;
    }
    if (whole >= from && whole < end) {
      CheckLmdb(mdb_cursor_del(cursor, 0), "purging consumed queue entries");
      ++purged;
      // The cursor now rests on the next item (or past the last).
      rc = mdb_cursor_get(cursor, &key, &value, MDB_GET_CURRENT);
      if (rc == EINVAL) rc = MDB_NOTFOUND;  // the table became empty
    } else {
      rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT);
    }
  }
  if (rc != MDB_SUCCESS && rc != MDB_NOTFOUND) CheckLmdb(rc, "reading queue entries to purge");
  return purged;
}

void PutRecordAt(MDB_txn* txn, MDB_dbi dbi, std::string_view full_key, uint64_t ts) {
  std::string stored = StoredKeyFor(full_key);
  std::string_view hashed = IsHashedStoredKey(stored) ? full_key : std::string_view();
  std::string record = EncodeRecord(ts, false, hashed, "");
  MDB_val k = ToVal(stored), v = ToVal(record);
  CheckLmdb(mdb_put(txn, dbi, &k, &v, 0), "writing a notification");
}

}  // namespace

void Store::RefreshObserved(MDB_txn* txn) {
  MDB_val key = ToVal(kObservedKey), data;
  int rc = mdb_get(txn, meta_dbi_, &key, &data);
  std::string_view raw = rc == MDB_SUCCESS ? FromVal(data) : std::string_view();
  if (rc != MDB_SUCCESS && rc != MDB_NOTFOUND) CheckLmdb(rc, "reading the observed columns");
  if (raw == observed_raw_) return;
  std::vector<ObservedColumn> columns;
  if (!DecodeObservedColumns(raw, &columns)) {
    throw Error(ErrorCode::kCorruption, "the stored observed columns are malformed");
  }
  observed_raw_.assign(raw);
  strong_.clear();
  for (const ObservedColumn& c : columns) {
    if (c.kind != NotifyKind::kStrong) continue;
    std::string column;
    AppendEscapedPart(&column, c.family);
    AppendEscapedPart(&column, c.qualifier);
    strong_.insert(std::move(column));
  }
}

bool Store::ProcessBatch(std::vector<PendingCommit*>& batch) {
  std::vector<Notification> written;
  for (;;) {
    written.clear();
    try {
      MapLock::Shared lock(*map_lock_);
      MDB_txn* txn = TryBeginTxn(lock, 0, "beginning a group commit");
      if (txn == nullptr) continue;
      TxnAborter aborter{txn};
      const uint64_t txnid = mdb_txn_id(txn);
      uint64_t ts = ReadCounter(txn, meta_dbi_);
      RefreshObserved(txn);
      auto notify = [&](const std::string& cell_key, std::string_view row, uint64_t stamp) {
        uint64_t hash = RowHash(row);
        PutRecordAt(txn, notify_dbi_, NotificationKey(hash, cell_key), stamp);
        written.push_back(Notification{cell_key, stamp, hash});
      };
      uint64_t committed = 0, refused = 0;
      std::string raw, tombstone_key;
      for (PendingCommit* p : batch) {
        p->result = CommitResult{};
        // Validate every write before applying any: a refused member writes nothing.
        for (const Mutation& m : *p->mutations) {
          if (m.stamped || m.purge || !ReadRecord(txn, data_dbi_, m.key, &raw)) continue;
          uint64_t written_ts = ReadUint64BE(raw);
          if (written_ts > p->start_ts) {
            p->result.status = Status::Make(
                ErrorCode::kConflict,
                "commit conflict on " + DescribeKey(m.key) +
                    ": it was written by a transaction that committed at ts " +
                    std::to_string(written_ts) + ", after this transaction's start_ts " +
                    std::to_string(p->start_ts));
            break;
          }
        }
        const CommitExtras* extras = p->extras;
        if (p->result.status.ok() && extras && extras->trigger &&
            ReadRecord(txn, ack_dbi_, *extras->trigger, &raw) && ReadUint64BE(raw) > p->start_ts) {
          p->result.status = Status::Make(ErrorCode::kConflict,
                                          "commit conflict: another run of the observer for " +
                                              DescribeKey(*extras->trigger) + " committed first");
        }
        if (!p->result.status.ok()) {
          ++refused;
          continue;
        }
        const uint64_t commit_ts = ++ts;
        for (const Mutation& m : *p->mutations) {
          if (m.purge && !m.purge_end.empty()) {
            PurgeRange(txn, data_dbi_, m.key, m.purge_end);
            continue;
          }
          if (m.purge) {
            std::string stored = StoredKeyFor(m.key);
            MDB_val k = ToVal(stored);
            int rc = mdb_del(txn, data_dbi_, &k, nullptr);
            if (rc != MDB_NOTFOUND) CheckLmdb(rc, "purging a consumed queue entry");
            continue;
          }
          const std::string stamped_key =
              m.stamped ? StampedKey(m.key, commit_ts, m.stamp_seq) : std::string();
          const std::string& key = m.stamped ? stamped_key : m.key;
          std::string stored = StoredKeyFor(key);
          std::string_view full = IsHashedStoredKey(stored) ? std::string_view(key) : "";
          std::string record = EncodeRecord(commit_ts, m.is_delete, full, m.value);
          MDB_val k = ToVal(stored), v = ToVal(record);
          CheckLmdb(mdb_put(txn, data_dbi_, &k, &v, 0), "writing a cell");
          if (m.is_delete) {
            tombstone_key.clear();
            AppendUint64BE(&tombstone_key, txnid);
            tombstone_key += stored;
            std::string ts_bytes;
            AppendUint64BE(&ts_bytes, commit_ts);
            MDB_val tk = ToVal(tombstone_key), tv = ToVal(ts_bytes);
            CheckLmdb(mdb_put(txn, tombstone_dbi_, &tk, &tv, 0), "indexing a tombstone");
          } else if (!strong_.empty()) {
            size_t parts[3], pos = 0;
            std::string row;
            if (CellKeyParts(key, &parts) &&
                strong_.count(std::string_view(key).substr(parts[1])) &&
                ReadEscapedPart(key, &pos, &row)) {
              notify(key, row, commit_ts);
            }
          }
        }
        if (extras) {
          std::string row;
          for (const std::string& cell_key : extras->weak_notifications) {
            if (RowOfCellKey(cell_key, &row)) notify(cell_key, row, commit_ts);
          }
          if (extras->trigger) {
            const std::string& trigger = *extras->trigger;
            PutRecordAt(txn, ack_dbi_, trigger, commit_ts);
            if (RowOfCellKey(trigger, &row)) {
              // Remove the notification unless it was set again after the run began.
              std::string key = NotificationKey(RowHash(row), trigger);
              if (ReadRecord(txn, notify_dbi_, key, &raw) && ReadUint64BE(raw) <= p->start_ts) {
                std::string stored = StoredKeyFor(key);
                MDB_val k = ToVal(stored);
                CheckLmdb(mdb_del(txn, notify_dbi_, &k, nullptr), "removing a notification");
              }
            }
          }
        }
        p->result.commit_ts = commit_ts;
        ++committed;
      }
      uint64_t collected = CollectTombstones(txn, txnid);
      std::string ts_bytes;
      AppendUint64BE(&ts_bytes, ts);
      MDB_val ck = ToVal(kCounterKey), cv = ToVal(ts_bytes);
      CheckLmdb(mdb_put(txn, meta_dbi_, &ck, &cv, 0), "advancing the timestamp counter");
      aborter.txn = nullptr;  // mdb_txn_commit frees the transaction, even on failure
      CheckLmdb(mdb_txn_commit(txn), "committing a group commit");
      commits_.fetch_add(committed);
      conflicts_.fetch_add(refused);
      batches_.fetch_add(1);
      tombstones_collected_.fetch_add(collected);
      if (!written.empty()) {
        lock.unlock();
        std::lock_guard<std::mutex> listener_lock(listener_mu_);
        if (listener_) listener_->Offer(written);
      }
      return true;
    } catch (const LmdbError& e) {
      if (e.rc() == MDB_MAP_FULL) {
        GrowMap(/*adopt_only=*/false);
        continue;
      }
      for (PendingCommit* p : batch) p->result = CommitResult{e.ToStatus(), 0};
      return false;
    } catch (const Error& e) {
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

uint64_t Store::CollectTombstones(MDB_txn* txn, uint64_t current_txnid) {
  MDB_cursor* cursor = nullptr;
  CheckLmdb(mdb_cursor_open(txn, tombstone_dbi_, &cursor), "opening the tombstone index");
  std::vector<std::pair<std::string, uint64_t>> due;  // (index key, commit_ts)
  MDB_val key, value;
  int rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST);
  if (rc == MDB_SUCCESS) {
    // A tombstone written by LMDB txn W is visible to a reader of snapshot R
    // when R >= W; once every reader is that recent, no commit can need it.
    uint64_t oldest = OldestReaderTxnid(env_);
    while (rc == MDB_SUCCESS && due.size() < kTombstonesPerBatch) {
      std::string_view k = FromVal(key);
      uint64_t written_in = ReadUint64BE(k);
      if (written_in >= current_txnid || written_in > oldest) break;
      due.emplace_back(std::string(k), ReadUint64BE(FromVal(value)));
      rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT);
    }
  }
  mdb_cursor_close(cursor);
  if (rc != MDB_SUCCESS && rc != MDB_NOTFOUND) CheckLmdb(rc, "reading the tombstone index");
  uint64_t collected = 0;
  for (const auto& [index_key, commit_ts] : due) {
    std::string_view stored = std::string_view(index_key).substr(8);
    MDB_val k = ToVal(stored), v;
    if (mdb_get(txn, data_dbi_, &k, &v) == MDB_SUCCESS) {
      RecordView record;
      if (DecodeRecord(FromVal(v), &record) && record.tombstone && record.commit_ts == commit_ts) {
        CheckLmdb(mdb_del(txn, data_dbi_, &k, nullptr), "collecting a tombstone");
        ++collected;
      }
    }
    MDB_val ik = ToVal(index_key);
    CheckLmdb(mdb_del(txn, tombstone_dbi_, &ik, nullptr), "collecting a tombstone");
  }
  return collected;
}

template <typename Fn>
auto Store::WithReadTxn(Fn&& fn) {
  CheckUsable();
  for (;;) {
    MapLock::Shared lock(*map_lock_);
    MDB_txn* txn = TryBeginTxn(lock, MDB_RDONLY, "beginning a read");
    if (txn == nullptr) continue;
    TxnAborter aborter{txn};
    return fn(txn);
  }
}

std::vector<ObservedColumn> Store::ObservedColumns() {
  return WithReadTxn([&](MDB_txn* txn) {
    std::vector<ObservedColumn> columns;
    MDB_val key = ToVal(kObservedKey), data;
    int rc = mdb_get(txn, meta_dbi_, &key, &data);
    if (rc == MDB_NOTFOUND) return columns;
    CheckLmdb(rc, "reading the observed columns");
    if (!DecodeObservedColumns(FromVal(data), &columns)) {
      throw Error(ErrorCode::kCorruption, "the stored observed columns are malformed");
    }
    return columns;
  });
}

void Store::SetObservedColumns(const std::vector<ObservedColumn>& columns) {
  CheckUsable();
  std::string encoded = EncodeObservedColumns(columns);
  for (;;) {
    try {
      MapLock::Shared lock(*map_lock_);
      MDB_txn* txn = TryBeginTxn(lock, 0, "storing the observed columns");
      if (txn == nullptr) continue;
      TxnAborter aborter{txn};
      MDB_val key = ToVal(kObservedKey), value = ToVal(encoded);
      CheckLmdb(mdb_put(txn, meta_dbi_, &key, &value, 0), "storing the observed columns");
      aborter.txn = nullptr;
      CheckLmdb(mdb_txn_commit(txn), "storing the observed columns");
      lock.unlock();
      SyncMeta().ThrowIfError();
      return;
    } catch (const LmdbError& e) {
      if (e.rc() != MDB_MAP_FULL) throw;
      GrowMap(/*adopt_only=*/false);
    }
  }
}

std::string Store::SignalFilePath() const { return path_ + "/waiting"; }

namespace {
// Opens the signal file for writing, creating it if missing; -1 on failure.
int OpenSignalFile(const std::string& path, mode_t mode) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
}
}  // namespace

bool Store::CreateSignalFile() const {
  int fd = OpenSignalFile(SignalFilePath(), options_.file_mode);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

bool Store::SignalWaiting() const {
  // The touch (an IN_ATTRIB event) is the signal; the file stays empty.
  int fd = OpenSignalFile(SignalFilePath(), options_.file_mode);
  if (fd < 0) return false;
  const bool touched = ::futimens(fd, nullptr) == 0;
  ::close(fd);
  return touched;
}

uint64_t Store::PendingNotifications() {
  return WithReadTxn([&](MDB_txn* txn) {
    MDB_stat stat;
    CheckLmdb(mdb_stat(txn, notify_dbi_, &stat), "counting notifications");
    return static_cast<uint64_t>(stat.ms_entries);
  });
}

bool Store::ScanNotifications(std::string_view after, size_t limit,
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

std::map<std::pair<std::string, std::string>, uint64_t> Store::CountPendingByColumn() {
  return WithReadTxn([&](MDB_txn* txn) {
    std::map<std::pair<std::string, std::string>, uint64_t> counts;
    ScanRecords(txn, notify_dbi_, "", false, "", [&](std::string_view key, const RecordView&) {
      Cell cell;
      if (key.size() >= 8 && DecodeCellKey(key.substr(8), &cell)) {
        ++counts[{cell.family, cell.qualifier}];
      }
      return true;
    });
    return counts;
  });
}

void Store::SetNotificationListener(Workers* workers) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  if (listener_ != nullptr && listener_ != workers) {
    throw Error(ErrorCode::kWrongState,
                "workers are already running for store '" + path_ +
                    "' in this process (one worker pool per store and process)");
  }
  listener_ = workers;
}

void Store::ClearNotificationListener(Workers* workers) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  if (listener_ == workers) listener_ = nullptr;
}

}  // namespace percolite
