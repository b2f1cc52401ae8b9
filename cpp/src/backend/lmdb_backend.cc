#include "lmdb_backend.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "fork_guard.h"
#include "lmdb_util.h"
#include "percolite/encoding.h"

namespace percolite {
namespace {

constexpr std::string_view kCounterKey = "ts";
constexpr std::string_view kFormatKey = "format";
// Bumped whenever what older versions wrote would be misread. 2: combine-queue
// values moved to <id>:d:<bucket>:<key> (combine_queue.h). 4: every record
// ends with a checksum (encoding.h); opening a store of format 3 adds them.
constexpr std::string_view kFormat = "percolite/4";
constexpr std::string_view kFormatBeforeChecksums = "percolite/3";
constexpr std::string_view kObservedKey = "observed";
constexpr size_t kTombstonesPerBatch = 1024;

// One backend per canonical path in this process. fork() handling
// (fork_guard.h): a child sees a new generation and refuses the parent's stores.
std::mutex g_registry_mu;
std::map<std::string, std::shared_ptr<LmdbBackend>>* g_registry =
    new std::map<std::string, std::shared_ptr<LmdbBackend>>;

void InstallForkHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    InstallForkGeneration();
    pthread_atfork([] { g_registry_mu.lock(); }, [] { g_registry_mu.unlock(); },
                   [] { g_registry_mu.unlock(); });
  });
}

std::string ErrnoText(int err) { return std::strerror(err); }

std::string CanonicalDirectory(const std::string& path, const BackendOptions& options) {
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
                  "opening store '" + path + "': no such directory, and create is off");
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

// What an LMDB data file's meta page says (LMDB 0.9's MDB_meta, after the
// 16-byte page header): magic and version, page size, last page, txnid.
struct MetaPage {
  bool valid = false;
  uint32_t page_size = 0;
  uint64_t last_page = 0;
  uint64_t txnid = 0;
};

constexpr uint32_t kLmdbMagic = 0xBEEFC0DE;
constexpr uint32_t kLmdbDataVersion = 1;
constexpr size_t kPageHeader = 16;
constexpr size_t kMetaSize = 136;  // through mm_txnid

template <typename T>
T ReadNative(const unsigned char* at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

MetaPage ParseMeta(const unsigned char* page, size_t size) {
  MetaPage meta;
  if (size < kPageHeader + kMetaSize) return meta;
  const unsigned char* m = page + kPageHeader;
  meta.page_size = ReadNative<uint32_t>(m + 24);
  meta.last_page = ReadNative<uint64_t>(m + 120);
  meta.txnid = ReadNative<uint64_t>(m + 128);
  const bool power_of_two = meta.page_size != 0 && (meta.page_size & (meta.page_size - 1)) == 0;
  meta.valid = ReadNative<uint32_t>(m) == kLmdbMagic &&
               ReadNative<uint32_t>(m + 4) == kLmdbDataVersion && power_of_two &&
               meta.page_size >= 512 && meta.page_size <= 65536 && meta.last_page >= 1;
  return meta;
}

// Refuses a symbolic link where the store keeps a file: percolite never
// follows one to create, truncate or map its target.
void RefuseLink(const std::string& file) {
  struct stat st;
  if (::lstat(file.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    throw Error(ErrorCode::kStorage,
                "opening store: '" + file +
                    "' is a symbolic link; percolite does not follow links to the files of its "
                    "store (a link to the store's directory itself is fine)");
  }
}

// The durable mark: the timestamp counter after the newest group commit known
// to be durable (8 bytes, big-endian, then their CRC32C), stored after each
// group commit with sync="full" into a shared mapping of the file, and left
// to the kernel's writeback: it is stored only once the commit is durable,
// so after any crash it names a commit the data file holds, or an older one.
// A store whose counter, as LMDB serves it, is below the mark went back in
// time, whichever meta page LMDB chose and whatever txnid it carries.
// (A write() per batch cost 14% of a lone durable commit: each one dirtied
// the mark's inode, and the next fdatasync's journal commit carried it.)
constexpr const char* kDurableMarkFile = "/durable-txn";
// Written when a read finds the store damaged (its text says what was found):
// commits to the store are refused from then on, by every handle and
// process, until it is opened with restored=True.
constexpr const char* kDamagedFile = "/damaged";
// How often a committing handle looks for a mark another process wrote.
constexpr std::chrono::milliseconds kDamageLookEvery{10};
constexpr size_t kDurableMarkSize = 12;

std::optional<uint64_t> ReadDurableMark(const std::string& dir) {
  const int fd = ::open((dir + kDurableMarkFile).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  char bytes[kDurableMarkSize];
  const bool read_whole = ::pread(fd, bytes, sizeof bytes, 0) == ssize_t{sizeof bytes};
  ::close(fd);
  if (!read_whole) return std::nullopt;
  const std::string_view mark(bytes, kDurableMarkSize);
  if (ReadUint32BE(mark.substr(8)) != Crc32c(mark.substr(0, 8))) {
    return std::nullopt;  // torn or damaged: it proves nothing
  }
  return ReadUint64BE(mark);
}

void StoreDurableMark(void* mark, uint64_t commit_ts) {
  std::string bytes;
  AppendUint64BE(&bytes, commit_ts);
  AppendUint32BE(&bytes, Crc32c(bytes));
  // A torn store (a crash mid-copy, or two processes at once) fails its CRC
  // and proves nothing at the next open: it only weakens the check.
  std::memcpy(mark, bytes.data(), kDurableMarkSize);
}

// Checks the store's files before LMDB maps them: LMDB trusts what it maps,
// so a truncated or damaged data file must be refused here, not fault later.
// Only a missing data file may be created, and only with `create`.
void CheckStoreFilesOnce(const std::string& dir, bool create) {
  const std::string data = dir + "/data.mdb";
  RefuseLink(data);
  RefuseLink(dir + "/lock.mdb");
  RefuseLink(dir + kDurableMarkFile);
  RefuseLink(dir + kDamagedFile);
  const int fd = ::open(data.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) {
      if (!create) {
        throw Error(ErrorCode::kStorage, "opening store '" + dir +
                                             "': no percolite store there (no data.mdb), and "
                                             "create is off");
      }
      return;  // a new store
    }
    if (errno == EACCES || errno == EPERM) return;  // LMDB reports it, as for any file
    throw Error(ErrorCode::kStorage, "opening '" + data + "': " + ErrnoText(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    throw Error(ErrorCode::kStorage, "reading '" + data + "': " + ErrnoText(errno));
  }
  auto corrupt = [&](const std::string& what) {
    return Error(ErrorCode::kCorruption,
                 "opening store '" + dir + "': data.mdb " + what +
                     "; it is left untouched: restore the store from a copy");
  };
  if (!S_ISREG(st.st_mode)) throw corrupt("is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) throw corrupt("is empty (0 bytes), not a store");
  // Meta pages 0 and 1: read the first, learn the page size, read the second.
  std::vector<unsigned char> buffer(kPageHeader + kMetaSize);
  auto read_at = [&](uint64_t offset) -> bool {
    return ::pread(fd, buffer.data(), buffer.size(), static_cast<off_t>(offset)) ==
           static_cast<ssize_t>(buffer.size());
  };
  if (!read_at(0))
    throw corrupt("is too short to hold a meta page (" + std::to_string(size) + " bytes)");
  MetaPage first = ParseMeta(buffer.data(), buffer.size());
  MetaPage second;
  const uint32_t page_size = first.valid ? first.page_size : 4096;
  if (size >= 2ull * page_size && read_at(page_size)) {
    second = ParseMeta(buffer.data(), buffer.size());
  }
  if (!first.valid && !second.valid) {
    throw corrupt(
        "has no valid meta page (wrong magic, version or page size): not an LMDB "
        "store of this format, or damaged");
  }
  if (first.valid != second.valid && size >= 2ull * (first.valid ? first.page_size : 4096)) {
    throw corrupt(std::string("has a damaged meta page (page ") + (first.valid ? "1" : "0") +
                  "; the other one is intact, but LMDB needs both to open it)");
  }
  if (first.valid && second.valid && first.page_size != second.page_size) {
    throw corrupt("has meta pages that disagree on the page size");
  }
  const MetaPage& newest =
      !second.valid || (first.valid && first.txnid >= second.txnid) ? first : second;
  if (size < 2ull * newest.page_size) {
    throw corrupt("is truncated: " + std::to_string(size) +
                  " bytes cannot hold its two meta pages");
  }
  const uint64_t needed = (newest.last_page + 1) * newest.page_size;
  if (size < needed) {
    throw corrupt("is truncated: its newest meta page (transaction " +
                  std::to_string(newest.txnid) + ") uses " + std::to_string(newest.last_page + 1) +
                  " pages of " + std::to_string(newest.page_size) + " bytes (" +
                  std::to_string(needed) + " bytes), the file holds " + std::to_string(size));
  }
}

void CheckStoreFiles(const std::string& dir, bool create) {
  // A process creating the store writes its meta pages right after creating
  // the file: what looks empty or short may be that, for a moment. Look again
  // for up to 100 ms before calling it damaged.
  for (int tries = 1;; ++tries) {
    try {
      CheckStoreFilesOnce(dir, create);
      return;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kCorruption || tries >= 20) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

// LMDB's main table (the one that lists the named tables) is handle 1.
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

uint64_t ReadCounter(MDB_txn* txn, MDB_dbi meta) {
  constexpr const char* kWhat = "reading the timestamp counter";
  MDB_val key = ToVal(kCounterKey), data;
  int rc = GuardedGet(txn, meta, &key, &data, kWhat);
  if (rc == MDB_NOTFOUND) return 0;
  CheckLmdb(rc, kWhat);
  if (data.mv_size != 8) throw Error(ErrorCode::kCorruption, "the timestamp counter is malformed");
  return ReadUint64BE(CopyOut(data, kWhat));
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
    if (txn) AbortTxn(txn);
  }
};

}  // namespace

struct LmdbBackend::PendingCommit {
  uint64_t start_ts;
  const std::vector<Mutation>* mutations;
  const CommitExtras* extras = nullptr;  // null when it has none
  CommitResult result;
  bool done = false;  // GUARDED_BY(queue_mu_)
  std::condition_variable cv;
  // CommitAsync: the request owns its writes, and is deleted once `callback` ran.
  std::vector<Mutation> owned_mutations;
  CommitExtras owned_extras;
  CommitCallback callback;
};

namespace {
bool HasExtras(const CommitExtras& extras) {
  return extras.trigger || !extras.weak_notifications.empty();
}
}  // namespace

// A snapshot: an LMDB read transaction held for its whole life.
class LmdbSnapshot final : public Snapshot {
 public:
  LmdbSnapshot(std::shared_ptr<LmdbBackend> store, MDB_txn* txn, uint64_t start_ts)
      : Snapshot(start_ts), store_(std::move(store)), txn_(txn) {}
  ~LmdbSnapshot() override;

  std::optional<std::string> Get(std::string_view encoded_key) override;
  bool Visit(std::string_view from, bool exclusive, std::string_view end,
             const CellVisitor& visit) override;
  std::optional<uint64_t> NotificationStamp(std::string_view cell_key) override;
  void Release() override;

 private:
  void CheckOpen(const char* what) const;
  std::shared_ptr<LmdbBackend> store_;
  MDB_txn* txn_;
};

const BackendCapabilities& LmdbBackend::capabilities() const {
  static const BackendCapabilities kLmdb{"lmdb", /*persistent=*/true, /*cross_process=*/true,
                                         /*durable=*/true,
                                         /*max_value_size=*/size_t{0xFFFFFFFF} - 64};
  return kLmdb;
}

// ---------------------------------------------------------------------------
// Opening and closing

std::shared_ptr<LmdbBackend> LmdbBackend::Acquire(const std::string& path,
                                                  const BackendOptions& options) {
  InstallForkHandlers();
  InstallFaultHandlers();
  std::string canonical = CanonicalDirectory(path, options);
  CheckStoreFiles(canonical, options.create);
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = g_registry->find(canonical);
  if (it != g_registry->end() && it->second->ForkedAway()) {
    // Inherited from the parent process: deliberately leaked, never touched.
    new std::shared_ptr<LmdbBackend>(std::move(it->second));
    g_registry->erase(it);
    it = g_registry->end();
  }
  if (it != g_registry->end()) {
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
  (*g_registry)[canonical] = store;
  return store;
}

void LmdbBackend::ReleaseHandle() {
  std::shared_ptr<LmdbBackend> keep_alive;
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

LmdbBackend::LmdbBackend(std::string path, const BackendOptions& options)
    : path_(std::move(path)),
      options_(options),
      state_("store '" + path_ +
                 "' was opened before this process was forked; a forked child must open "
                 "the store again itself (or use the 'spawn' or 'forkserver' start method)",
             "store '" + path_ + "' is closed"),
      map_lock_(std::make_unique<MapLock>()) {}

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

void LmdbBackend::Fail(const std::string& cause) {
  Poison(ErrorCode::kStorage,
         "store '" + path_ + "' is unusable after a failed write to disk (" + cause +
             "): what that write held was never shown to any reader; close every handle of "
             "the store in this process and open it again");
}

void LmdbBackend::Poison(ErrorCode code, const std::string& message) { state_.Fail(code, message); }

void LmdbBackend::FailDamaged(const FaultError& fault) {
  MarkDamaged(fault.what());
  Poison(ErrorCode::kCorruption,
         "store '" + path_ + "' is unusable after reading damaged pages (" + fault.what() +
             "); close every handle of the store in this process, run 'percolite check' on it "
             "and restore it from a copy");
}

void LmdbBackend::MarkDamaged(const std::string& problem) {
  {
    std::lock_guard<std::mutex> lock(damage_mu_);
    if (damaged_) return;
    damaged_ = problem;
    is_damaged_ = true;
  }
  // Best effort: the file tells every later handle and process.
  const int fd = ::open((path_ + kDamagedFile).c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, options_.file_mode);
  if (fd < 0) return;
  [[maybe_unused]] ssize_t written = ::write(fd, problem.data(), problem.size());
  ::close(fd);
}

std::optional<std::vector<std::string>> LmdbBackend::WalkSnapshot(uint64_t txnid, WalkScope scope) {
  int fd = -1;
  MDB_stat env_stat;
  struct stat file;
  if (mdb_env_get_fd(env_, &fd) != 0 || mdb_env_stat(env_, &env_stat) != 0 ||
      ::fstat(fd, &file) != 0) {
    return std::vector<std::string>{};  // cannot tell; the walk is a check on top of LMDB's own
  }
  // Through pread, not the map: a page past a damaged file's end is then
  // a short read, not a fault.
  const uint32_t page_size = env_stat.ms_psize;
  const auto read_page = [&](uint64_t pgno, size_t length, std::string* out) {
    out->resize(length);
    return ::pread(fd, out->data(), length, static_cast<off_t>(pgno * page_size)) ==
           static_cast<ssize_t>(length);
  };
  return WalkPages(txnid, page_size, static_cast<uint64_t>(file.st_size) / page_size, read_page,
                   scope);
}

void LmdbBackend::LookForDamagedMark() {
  if (is_damaged_.load(std::memory_order_relaxed)) return;
  const int fd = ::open((path_ + kDamagedFile).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  char text[512];
  const ssize_t n = ::read(fd, text, sizeof text);
  ::close(fd);
  std::lock_guard<std::mutex> lock(damage_mu_);
  if (damaged_) return;
  damaged_ = n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string("no details kept");
  is_damaged_ = true;
}

std::optional<std::string> LmdbBackend::DamagedMark() {
  LookForDamagedMark();
  std::lock_guard<std::mutex> lock(damage_mu_);
  return damaged_;
}

void LmdbBackend::CheckWritable() {
  // LMDB hands out pages its free list names without asking whether a tree
  // still uses them: a damaged free list would let this process's first
  // commit overwrite live pages. So the first commit proves it sound first.
  if (!free_list_checked_.load(std::memory_order_acquire)) CheckFreeList();
  // Damage another process found (its mark file) stops this handle's
  // commits too, within kDamageLookEvery.
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if (now - last_damage_look_ms_.load(std::memory_order_relaxed) >= kDamageLookEvery.count()) {
    last_damage_look_ms_.store(now, std::memory_order_relaxed);
    LookForDamagedMark();
  }
  if (!is_damaged_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(damage_mu_);
  if (!damaged_) return;
  throw Error(ErrorCode::kCorruption,
              "store '" + path_ + "' was found damaged (" + *damaged_ +
                  "), so nothing more is written to it: writing over damaged pages can make "
                  "things worse. Run 'percolite check' on it and restore it from a copy; after "
                  "putting a copy of data.mdb in place, open it once with "
                  "percolite.open(path, restored=True) or run 'percolite restored DIR'");
}

void LmdbBackend::OpenEnvironment() {
  MDB_env* env = nullptr;
  CheckLmdb(mdb_env_create(&env), "creating the LMDB environment");
  env_ = env;
  mdb_env_set_assert(env_, PercoliteOnLmdbAssert);
  MDB_txn* txn = nullptr;
  auto close_env = [&] {
    if (txn) AbortTxn(txn);
    txn = nullptr;
    mdb_env_close(env_);
    env_ = nullptr;
  };
  auto fail = [&](int rc, const std::string& what) {
    close_env();
    if (rc == EACCES || rc == EROFS || rc == EPERM) {
      throw Error(ErrorCode::kStorage, "opening store '" + path_ + "': " + what +
                                           ": permission denied (" + ErrnoText(rc) + ")");
    }
    throw LmdbError(rc, "opening store '" + path_ + "': " + what);
  };
  auto damaged = [&](const std::string& what) {
    close_env();
    return Error(ErrorCode::kCorruption, "opening store '" + path_ + "': " + what +
                                             "; it is left untouched: restore the store from "
                                             "a copy");
  };
  int rc = mdb_env_set_maxdbs(env_, 16);
  if (!rc) rc = mdb_env_set_maxreaders(env_, options_.max_readers);
  if (!rc) rc = mdb_env_set_mapsize(env_, options_.initial_map_size);
  if (rc) fail(rc, "configuring LMDB");
  unsigned flags = MDB_NOTLS;
  // sync="full": LMDB syncs a commit's data pages, then writes its meta page
  // through a descriptor opened with O_DSYNC, and only then publishes the
  // commit to readers (the txnid in the lock file). So no reader in any
  // process sees a commit before it is durable. "meta" skips the meta page's
  // sync (a crash may lose the last commits, which readers may have seen);
  // "none" leaves all flushing to the OS.
  if (options_.sync == SyncMode::kMeta) flags |= MDB_NOMETASYNC;
  if (options_.sync == SyncMode::kNone) flags |= MDB_NOSYNC;
  try {
    rc = LmdbCall("opening the LMDB environment",
                  [&] { return mdb_env_open(env_, path_.c_str(), flags, options_.file_mode); });
    if (rc) fail(rc, "opening the LMDB environment");
    // mdb_env_open sized the map from the data file; another process may
    // have grown the data past it since. Adopt its size and begin again, as
    // every transaction does (TryBeginTxn): nothing else uses this
    // environment yet, so the map may move.
    for (;;) {
      rc = LmdbCall("beginning the set-up transaction",
                    [&] { return mdb_txn_begin(env_, nullptr, 0, &txn); });
      if (rc != MDB_MAP_RESIZED) break;
      rc = LmdbCall("adopting the map size", [&] { return mdb_env_set_mapsize(env_, 0); });
      if (rc) fail(rc, "adopting the map size another process set");
    }
    if (rc) fail(rc, "beginning the set-up transaction");
    // Only a new store (nothing in LMDB's main table yet) gets its tables
    // created. In an existing one a missing table is damage: creating it
    // empty would serve a store that lost its data as if nothing happened.
    MDB_stat main_stat;
    rc = LmdbCall("reading the list of tables",
                  [&] { return mdb_stat(txn, MAIN_DBI_INDEX, &main_stat); });
    if (rc) fail(rc, "reading the list of tables");
    const bool new_store = main_stat.ms_entries == 0;
    auto open_db = [&](const char* name, unsigned* dbi) {
      MDB_dbi handle = 0;
      int r = LmdbCall("opening a table", [&] {
        return mdb_dbi_open(txn, name, new_store ? MDB_CREATE : 0, &handle);
      });
      if (r == MDB_NOTFOUND) {
        throw damaged(std::string("its table '") + name +
                      "' is missing (the store's pages are damaged)");
      }
      if (r) fail(r, std::string("opening table '") + name + "'");
      *dbi = handle;
    };
    open_db("data", &data_dbi_);
    open_db("meta", &meta_dbi_);
    open_db("tombstones", &tombstone_dbi_);
    open_db("notify", &notify_dbi_);
    open_db("ack", &ack_dbi_);

    constexpr const char* kWhat = "checking the store format";
    MDB_val key = ToVal(kFormatKey), value;
    rc = GuardedGet(txn, meta_dbi_, &key, &value, kWhat);
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
          throw damaged("its pages are damaged (" + problems->front() + ")");
        }
        AddChecksums(txn);
        value = ToVal(kFormat);
        rc = GuardedPut(txn, meta_dbi_, &key, &value, kWhat);
      } else if (found != kFormat) {
        throw damaged("its format is '" + found + "', this version of percolite reads '" +
                      std::string(kFormat) + "' (and upgrades '" +
                      std::string(kFormatBeforeChecksums) + "')");
      }
    }
    if (rc) fail(rc, kWhat);
    rc = LmdbCall("committing the set-up transaction", [&] { return mdb_txn_commit(txn); });
    txn = nullptr;  // freed by mdb_txn_commit, even on failure
    if (rc) fail(rc, "committing the set-up transaction");
  } catch (const FaultError& fault) {
    close_env();
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

void LmdbBackend::OpenDurableMark() {
  if (options_.restored) {
    ::unlink((path_ + kDamagedFile).c_str());  // a copy restored on purpose starts afresh
  } else {
    LookForDamagedMark();
  }
  const uint64_t newest = BeginSnapshot()->start_ts();  // the counter, as LMDB serves it
  if (!options_.restored) {
    if (const std::optional<uint64_t> mark = ReadDurableMark(path_); mark && *mark > newest) {
      throw Error(ErrorCode::kCorruption,
                  "opening store '" + path_ + "': it went back in time: a commit at timestamp " +
                      std::to_string(*mark) + " was durable, but the newest commit its data " +
                      "file holds is at timestamp " + std::to_string(newest) +
                      " (a damaged meta page let an older one take over, or an old copy was put "
                      "in place of data.mdb); the last commits are missing. It is left "
                      "untouched: run 'percolite check' on it and restore the store from a copy. "
                      "If you restored data.mdb from a backup on purpose, open it once with "
                      "percolite.open(path, restored=True) or run 'percolite restored DIR'");
    }
  }
  // Only sync="full" commits are durable when they return; with "meta" or
  // "none" a crash may take back commits a mark had already named, so only
  // "full" keeps it (any mode may reset it, with restored).
  const bool keep = options_.sync == SyncMode::kFull;
  if (!keep && !options_.restored) return;
  // Best effort from here: without a mark, opening just cannot tell.
  const int fd = ::open((path_ + kDurableMarkFile).c_str(),
                        O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, options_.file_mode);
  if (fd < 0) return;
  struct stat st;
  const bool sized = ::fstat(fd, &st) == 0 && (st.st_size >= off_t{kDurableMarkSize} ||
                                               ::ftruncate(fd, kDurableMarkSize) == 0);
  void* map = sized ? ::mmap(nullptr, kDurableMarkSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
  if (map != MAP_FAILED && options_.restored) {
    // A data file restored on purpose: the mark starts again from what it holds.
    StoreDurableMark(map, newest);
    ::msync(map, kDurableMarkSize, MS_SYNC);
  }
  ::close(fd);  // the mapping stays
  if (map == MAP_FAILED) return;
  if (keep) {
    durable_mark_ = map;
  } else {
    ::munmap(map, kDurableMarkSize);
  }
}

void LmdbBackend::Close() {
  if (ForkedAway()) return;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (writer_ && writer_->joinable()) writer_->join();
  state_.MarkClosed();
  CloseEnvironment();
}

void LmdbBackend::CloseEnvironment() {
  MapLock::Exclusive lock(*map_lock_);
  // Snapshots are counted under the shared lock, so this check cannot race
  // with one being created: the last one to be released closes LMDB instead.
  if (env_ == nullptr || live_snapshots_.load() > 0) return;
  mdb_env_close(env_);
  env_ = nullptr;
  if (durable_mark_ != nullptr) ::munmap(durable_mark_, kDurableMarkSize);
  durable_mark_ = nullptr;
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

void LmdbBackend::GrowMap(bool adopt_only) {
  MapLock::Exclusive lock(*map_lock_);
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  size_t new_size = adopt_only ? 0 : info.me_mapsize * 2;
  CheckLmdb(LmdbCall("growing the memory map", [&] { return mdb_env_set_mapsize(env_, new_size); }),
            "growing the memory map");
  mdb_env_info(env_, &info);
  map_size_ = info.me_mapsize;
  if (!adopt_only) map_growths_.fetch_add(1);
}

// ---------------------------------------------------------------------------
// Snapshots

MDB_txn* LmdbBackend::TryBeginTxn(MapLock::Shared& lock, unsigned flags, const char* what) {
  if (env_ == nullptr || state_.closed()) {
    throw Error(ErrorCode::kClosed, "store '" + path_ + "' is closed");
  }
  MDB_txn* txn = nullptr;
  int rc = LmdbCall(what, [&] { return mdb_txn_begin(env_, nullptr, flags, &txn); });
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

std::unique_ptr<Snapshot> LmdbBackend::BeginSnapshot() {
  CheckUsable();
  for (;;) {
    MapLock::Shared lock(*map_lock_);
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
    LmdbBackend::MapLock::Shared lock(*store_->map_lock_);
    AbortTxn(txn_);
    txn_ = nullptr;
  }
  if (store_->live_snapshots_.fetch_sub(1) == 1 && store_->state_.closed()) {
    store_->CloseEnvironment();  // the store closed while this snapshot was open
  }
}

std::optional<std::string> LmdbSnapshot::Get(std::string_view encoded_key) {
  CheckOpen("reading from");
  LmdbBackend::MapLock::Shared lock(*store_->map_lock_);
  RecordView record;
  if (!store_->Contain([&] { return ReadRecord(txn_, store_->data_dbi_, encoded_key, &record); })) {
    return std::nullopt;
  }
  if (record.tombstone) return std::nullopt;
  return std::string(record.value);
}

std::optional<uint64_t> LmdbSnapshot::NotificationStamp(std::string_view cell_key) {
  CheckOpen("reading from");
  Cell cell;
  if (!DecodeCellKey(cell_key, &cell)) return std::nullopt;
  LmdbBackend::MapLock::Shared lock(*store_->map_lock_);
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
    LmdbBackend::MapLock::Shared lock(*store_->map_lock_);
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
// Group commit

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
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_) throw Error(ErrorCode::kClosed, "committing: store '" + path_ + "' is closed");
    queue_.push_back(pending.release());
  }
  queue_cv_.notify_one();  // the writer leads unless a committer already does
}

CommitResult LmdbBackend::Commit(uint64_t start_ts, std::vector<Mutation> mutations,
                                 CommitExtras extras) {
  CheckUsable();
  CheckWritable();
  PendingCommit pending;
  pending.start_ts = start_ts;
  pending.mutations = &mutations;
  if (HasExtras(extras)) pending.extras = &extras;
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
    LmdbBackend* store;
    std::unique_lock<std::mutex>* lock;
    ~Resign() {
      if (!lock->owns_lock()) lock->lock();
      store->leading_ = false;
      // The writer takes over what others queued meanwhile (and Close waits
      // for leadership to be free).
      if (store->stopping_ || !store->queue_.empty()) {
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
    std::lock_guard<std::mutex> lock(queue_mu_);
    for (PendingCommit* p : done) {
      if (p->callback) {
        asynchronous.emplace_back(p);
        continue;
      }
      p->done = true;
      p->cv.notify_one();
    }
  }
  done.clear();
  // Outside queue_mu_: a callback may submit the next commit.
  for (const auto& p : asynchronous) p->callback(p->result);
}

bool LmdbBackend::LeadOnce(std::vector<PendingCommit*>& batch) {
  batch.clear();
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    while (!queue_.empty() && batch.size() < options_.max_batch) {
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
  }
  if (batch.empty()) return false;
  ProcessBatch(batch);  // with sync="full", durable when it returns (OpenEnvironment)
  Wake(batch);
  return true;
}

void LmdbBackend::WriterLoop() {
  pthread_setname_np(pthread_self(), "pc-writer");  // shown by top -H, perf, py-spy
  std::vector<PendingCommit*> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return !leading_ && (stopping_ || !queue_.empty()); });
      // Stopping, and everything queued was committed.
      if (queue_.empty()) return;
      leading_ = true;
    }
    LeadOnce(batch);
    std::lock_guard<std::mutex> lock(queue_mu_);
    leading_ = false;
  }
}

Status LmdbBackend::SyncMeta() {
  MapLock::Shared lock(*map_lock_);
  int rc = mdb_env_sync(env_, 1);
  if (rc != MDB_SUCCESS) {
    Fail(std::string("syncing committed data: ") + mdb_strerror(rc));
    return Status::Make(ErrorCode::kStorage,
                        std::string("syncing committed data to disk: ") + mdb_strerror(rc));
  }
  return Status::Ok();
}

namespace {

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

  MDB_txn* txn_;
  uint64_t txnid_;
  MDB_dbi data_, tombstones_, notify_, ack_;
};

}  // namespace

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

bool LmdbBackend::WriteBatch(std::vector<PendingCommit*>& batch,
                             std::vector<Notification>* written) {
  MapLock::Shared lock(*map_lock_);
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

void LmdbBackend::Deliver(const std::vector<Notification>& written) {
  if (written.empty()) return;
  sink_.Offer(written);
}

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
    MapLock::Shared lock(*map_lock_);
    MDB_txn* txn = Contain([&] { return TryBeginTxn(lock, MDB_RDONLY, "beginning a read"); });
    if (txn == nullptr) continue;
    TxnAborter aborter{txn};
    return Contain([&] { return fn(txn); });
  }
}

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

void LmdbBackend::SetObservedColumns(const std::vector<ObservedColumn>& columns) {
  CheckUsable();
  CheckWritable();
  std::string encoded = EncodeObservedColumns(columns);
  for (;;) {
    try {
      MapLock::Shared lock(*map_lock_);
      constexpr const char* kWhat = "storing the observed columns";
      MDB_txn* txn = Contain([&] { return TryBeginTxn(lock, 0, kWhat); });
      if (txn == nullptr) continue;
      TxnAborter aborter{txn};
      MDB_val key = ToVal(kObservedKey), value = ToVal(encoded);
      CheckLmdb(Contain([&] { return GuardedPut(txn, meta_dbi_, &key, &value, kWhat); }), kWhat);
      aborter.txn = nullptr;
      CheckLmdb(Contain([&] { return LmdbCall(kWhat, [&] { return mdb_txn_commit(txn); }); }),
                kWhat);
      lock.unlock();
      SyncMeta().ThrowIfError();
      return;
    } catch (const LmdbError& e) {
      if (e.rc() != MDB_MAP_FULL) throw;
      GrowMap(/*adopt_only=*/false);
    }
  }
}

std::string LmdbBackend::SignalFilePath() const { return path_ + "/waiting"; }

namespace {
// Opens the signal file for writing, creating it if missing; -1 on failure.
int OpenSignalFile(const std::string& path, mode_t mode) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
}
}  // namespace

bool LmdbBackend::CreateSignalFile() const {
  int fd = OpenSignalFile(SignalFilePath(), options_.file_mode);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

bool LmdbBackend::SignalWaiting() {
  // The touch (an IN_ATTRIB event) is the signal; the file stays empty.
  int fd = OpenSignalFile(SignalFilePath(), options_.file_mode);
  if (fd < 0) return false;
  const bool touched = ::futimens(fd, nullptr) == 0;
  ::close(fd);
  return touched;
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

std::vector<std::string> LmdbBackend::WalkStorePages(WalkScope scope) {
  // Other processes may commit twice between our snapshot's start and our
  // read of its meta page; then walk a newer snapshot. Only a stream of
  // commits that keeps winning that race gives up, and proves nothing.
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::optional<std::vector<std::string>> problems =
        WithReadTxn([&](MDB_txn* txn) { return WalkSnapshot(mdb_txn_id(txn), scope); });
    if (problems) return std::move(*problems);
  }
  return {};
}

void LmdbBackend::CheckFreeList() {
  std::lock_guard<std::mutex> lock(free_list_mu_);
  if (free_list_checked_.load()) return;
  const std::vector<std::string> problems = WalkStorePages(WalkScope::kFreeList);
  if (!problems.empty()) MarkDamaged(problems.front());
  free_list_checked_ = true;
}

std::vector<std::string> LmdbBackend::VerifyStructure() {
  std::optional<FaultError> fault;
  auto problems = WithReadTxn([&](MDB_txn* txn) {
    std::vector<std::string> problems;
    const struct {
      const char* name;
      unsigned dbi;
      bool records;  // values are records with checksums (encoding.h)
    } tables[] = {{"data", data_dbi_, true},
                  {"meta", meta_dbi_, false},
                  {"tombstones", tombstone_dbi_, false},
                  {"notify", notify_dbi_, true},
                  {"ack", ack_dbi_, true}};
    uint64_t newest_stamp = 0;  // the largest commit_ts any record carries
    for (const auto& table : tables) {
      const std::string name = std::string("table '") + table.name + "'";
      std::string walk_problem;
      uint64_t seen = 0, bad_records = 0, misplaced = 0, unreachable = 0;
      std::string first_bad, previous;
      MDB_stat stat;
      int rc = 0;
      try {
        rc = LmdbCall("checking a table", [&] { return mdb_stat(txn, table.dbi, &stat); });
        if (rc != 0) {
          problems.push_back(name + ": " + mdb_strerror(rc));
          continue;
        }
        MDB_cursor* cursor = nullptr;
        rc = LmdbCall("checking a table", [&] { return mdb_cursor_open(txn, table.dbi, &cursor); });
        if (rc != 0) {
          problems.push_back(name + ": " + mdb_strerror(rc));
          continue;
        }
        std::unique_ptr<MDB_cursor, void (*)(MDB_cursor*)> closer(cursor, mdb_cursor_close);
        MDB_val key, value;
        for (rc = GuardedCursorGet(cursor, &key, &value, MDB_FIRST, "checking a table"); rc == 0;
             rc = GuardedCursorGet(cursor, &key, &value, MDB_NEXT, "checking a table")) {
          ++seen;
          const std::string stored = CopyOut(key, "checking a table");
          if (seen > 1 && stored <= previous) ++misplaced;  // LMDB orders keys as bytes
          // Searching for the key must land on this very entry: damaged
          // branch pages send searches astray while a walk still finds it.
          MDB_val again = ToVal(stored), found;
          if (GuardedGet(txn, table.dbi, &again, &found, "checking a table") != 0 ||
              found.mv_data != value.mv_data || found.mv_size != value.mv_size) {
            ++unreachable;
          }
          if (table.records) {
            RecordView record;
            const RecordCheck check = RunGuarded(
                "checking a table", [&] { return DecodeRecord(stored, FromVal(value), &record); });
            bool ok = check == RecordCheck::kOk;
            if (ok && table.dbi == data_dbi_) {
              Cell cell;
              ok = IsHashedStoredKey(stored) || DecodeCellKey(stored, &cell);
            }
            if (!ok && bad_records++ == 0) {
              first_bad = DescribeKey(stored.size() > 8 && table.dbi != data_dbi_
                                          ? std::string_view(stored).substr(8)
                                          : std::string_view(stored));
            }
            if (ok) newest_stamp = std::max(newest_stamp, record.commit_ts);
          }
          previous = stored;
        }
      } catch (const FaultError& e) {
        if (!fault) fault.emplace(e);
        walk_problem =
            name + ": reading entry " + std::to_string(seen + 1) + " faulted (" + e.what() + ")";
      } catch (const Error& e) {
        walk_problem =
            name + ": reading entry " + std::to_string(seen + 1) + " failed (" + e.what() + ")";
      }
      if (!walk_problem.empty()) {
        problems.push_back(walk_problem);
      } else if (rc != MDB_NOTFOUND) {
        problems.push_back(name + ": reading entry " + std::to_string(seen + 1) +
                           " failed: " + mdb_strerror(rc));
      } else if (seen != stat.ms_entries) {
        problems.push_back(name + " records " + std::to_string(stat.ms_entries) +
                           " entries, its pages hold " + std::to_string(seen));
      }
      if (misplaced > 0) {
        problems.push_back(name + ": " + std::to_string(misplaced) + " keys out of order");
      }
      if (unreachable > 0) {
        problems.push_back(name + ": " + std::to_string(unreachable) +
                           " entries found by a walk are not found by a search for their key");
      }
      if (bad_records > 0) {
        problems.push_back(
            name + ": " + std::to_string(bad_records) +
            " records are malformed or fail their checksum (the first: " + first_bad + ")");
      }
    }
    if (!fault) {
      try {
        const uint64_t counter = ReadCounter(txn, meta_dbi_);
        if (newest_stamp > counter) {
          problems.push_back("a record carries commit timestamp " + std::to_string(newest_stamp) +
                             ", past the store's timestamp counter " + std::to_string(counter));
        }
      } catch (const FaultError& e) {
        fault.emplace(e);
        problems.push_back(std::string("reading the timestamp counter faulted (") + e.what() + ")");
      } catch (const Error& e) {
        problems.push_back(std::string("reading the timestamp counter failed (") + e.what() + ")");
      }
    }
    return problems;
  });
  if (!fault) {
    // Every page, as LMDB lays them out: what no entry leads through (the
    // free list above all) is seen only this way. In a snapshot of its own,
    // outside the one above: the map lock is not taken twice.
    for (std::string& problem : WalkStorePages(WalkScope::kEveryPage)) {
      problems.push_back(std::move(problem));
    }
  }
  if (fault) FailDamaged(*fault);  // as after any fault: reopen before going on
  if (!problems.empty()) MarkDamaged(problems.front());  // no process writes over it now
  return problems;
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

void LmdbBackend::SetNotificationSink(NotificationSink* sink) {
  sink_.Set(sink, "workers are already running for store '" + path_ +
                      "' in this process (one worker pool per store and process)");
}

void LmdbBackend::ClearNotificationSink(NotificationSink* sink) { sink_.Clear(sink); }

// ---------------------------------------------------------------------------
// Waiting for work

namespace {

void Drain(int fd) {
  char buf[4096];
  while (::read(fd, buf, sizeof buf) > 0) {
  }
}

// Reads every pending event of the (non-blocking) inotify descriptor `fd`;
// sets *watched when one is for watch descriptor `watch`, *other when one is
// for another watch.
void ReadInotify(int fd, int watch, bool* watched, bool* other) {
  alignas(struct inotify_event) char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return;
    for (ssize_t at = 0; at + static_cast<ssize_t>(sizeof(struct inotify_event)) <= n;) {
      const auto* event = reinterpret_cast<const struct inotify_event*>(buf + at);
      *(event->wd == watch ? watched : other) = true;
      at += sizeof(struct inotify_event) + event->len;
    }
  }
}

// Every commit of every process writes the data file: inotify (IN_MODIFY)
// wakes the watcher at once, so an idle pool costs no CPU. Without inotify it
// polls every 50 ms.
class LmdbWorkWatch final : public WorkWatch {
 public:
  explicit LmdbWorkWatch(const LmdbBackend& backend) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      throw Error(ErrorCode::kStorage, std::string("creating an eventfd: ") + std::strerror(errno));
    }
    inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (inotify_fd_ >= 0) {
      const std::string data_file = backend.path() + "/data.mdb";
      if (::inotify_add_watch(inotify_fd_, data_file.c_str(), IN_MODIFY) < 0) {
        ::close(inotify_fd_);
        inotify_fd_ = -1;
      }
    }
    if (inotify_fd_ >= 0 && backend.CreateSignalFile()) {
      signal_watch_ = ::inotify_add_watch(inotify_fd_, backend.SignalFilePath().c_str(), IN_ATTRIB);
    }
  }
  ~LmdbWorkWatch() override {
    if (inotify_fd_ >= 0) ::close(inotify_fd_);
    ::close(wake_fd_);
  }

  unsigned Wait(int timeout_ms) override {
    // A data-file write wakes us before LMDB publishes the commit to new
    // readers (the txnid in the lock file is updated after the meta page is
    // written), so a scan right after a wake can miss it: after a write, Wait
    // also returns 1 ms and then 5 ms later, for a rescan.
    if (followups_ > 0) timeout_ms = std::min(timeout_ms, followups_ == 2 ? 1 : 5);
    if (inotify_fd_ < 0) timeout_ms = std::min(timeout_ms, 50);
    struct pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
    const int nfds = inotify_fd_ >= 0 ? 2 : 1;
    const int ready = ::poll(fds, nfds, timeout_ms);
    unsigned events = kTimeout;
    if (ready > 0) {
      if (fds[0].revents) {
        Drain(wake_fd_);
        events |= kInterrupted;
      }
      if (nfds == 2 && fds[1].revents) {
        bool signalled = false, written = false;
        ReadInotify(inotify_fd_, signal_watch_, &signalled, &written);
        if (written) {
          followups_ = 2;
          events |= kCommitted;
        }
        if (signalled) events |= kWaiterSignal;
      }
    } else if (followups_ > 0) {
      --followups_;
      events |= kCommitted;
    }
    return events;
  }

  void Interrupt() override {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

 private:
  int wake_fd_ = -1;
  int inotify_fd_ = -1;
  int signal_watch_ = -1;
  int followups_ = 0;
};

}  // namespace

std::unique_ptr<WorkWatch> LmdbBackend::WatchForWork() {
  CheckUsable();
  return std::make_unique<LmdbWorkWatch>(*this);
}

}  // namespace percolite
