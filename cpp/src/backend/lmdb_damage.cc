// Failures and damage in an LMDB store (lmdb_backend.h): failing the handle,
// the damage mark, the free-list check before the first commit, and
// VerifyStructure.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "lmdb_internal.h"

namespace percolite {

using lmdb_internal::kDamagedFile;
using lmdb_internal::ReadCounter;

namespace {

// How often a committing handle looks for a mark another process wrote.
constexpr std::chrono::milliseconds kDamageLookEvery{10};

constexpr const char* kChecking = "checking a table";

// A table VerifyStructure checks.
struct TableToCheck {
  const char* name;
  MDB_dbi dbi;
  bool records;  // values are records with checksums (encoding.h)
  bool cells;    // keys are cell keys (the data table)
};

// What a walk over one table found.
struct TableWalk {
  uint64_t seen = 0, bad_records = 0, misplaced = 0, unreachable = 0;
  std::string first_bad;
  int rc = 0;  // the last step's LMDB code: MDB_NOTFOUND once past the last entry
};

// Verifies the record `value` holds for `stored` as a record of `table`.
void CheckRecord(const TableToCheck& table, const std::string& stored, const MDB_val& value,
                 TableWalk* walk, uint64_t* newest_stamp) {
  RecordView record;
  const RecordCheck check =
      RunGuarded(kChecking, [&] { return DecodeRecord(stored, FromVal(value), &record); });
  bool ok = check == RecordCheck::kOk;
  if (ok && table.cells) {
    Cell cell;
    ok = IsHashedStoredKey(stored) || DecodeCellKey(stored, &cell);
  }
  if (!ok && walk->bad_records++ == 0) {
    walk->first_bad =
        DescribeKey(stored.size() > 8 && !table.cells ? std::string_view(stored).substr(8)
                                                      : std::string_view(stored));
  }
  if (ok) *newest_stamp = std::max(*newest_stamp, record.commit_ts);
}

// Walks every entry of `table` (LMDB's count of them goes to *stat),
// counting in *walk what is wrong; *newest_stamp gets the largest commit_ts
// a record carries. Returns LMDB's code when the table cannot be read at
// all, else 0. Throws (FaultError, Error) when reading an entry fails.
int WalkTable(MDB_txn* txn, const TableToCheck& table, MDB_stat* stat, TableWalk* walk,
              uint64_t* newest_stamp) {
  int rc = LmdbCall(kChecking, [&] { return mdb_stat(txn, table.dbi, stat); });
  if (rc != 0) return rc;
  MDB_cursor* cursor = nullptr;
  rc = LmdbCall(kChecking, [&] { return mdb_cursor_open(txn, table.dbi, &cursor); });
  if (rc != 0) return rc;
  std::unique_ptr<MDB_cursor, void (*)(MDB_cursor*)> closer(cursor, mdb_cursor_close);
  MDB_val key, value;
  std::string previous;
  for (walk->rc = GuardedCursorGet(cursor, &key, &value, MDB_FIRST, kChecking); walk->rc == 0;
       walk->rc = GuardedCursorGet(cursor, &key, &value, MDB_NEXT, kChecking)) {
    ++walk->seen;
    const std::string stored = CopyOut(key, kChecking);
    if (walk->seen > 1 && stored <= previous) ++walk->misplaced;  // LMDB orders keys as bytes
    // Searching for the key must land on this very entry: damaged branch
    // pages send searches astray while a walk still finds it.
    MDB_val again = ToVal(stored), found;
    if (GuardedGet(txn, table.dbi, &again, &found, kChecking) != 0 ||
        found.mv_data != value.mv_data || found.mv_size != value.mv_size) {
      ++walk->unreachable;
    }
    if (table.records) CheckRecord(table, stored, value, walk, newest_stamp);
    previous = stored;
  }
  return 0;
}

// Checks one table: its problems go to *problems, the first fault to *fault.
void CheckTable(MDB_txn* txn, const TableToCheck& table, uint64_t* newest_stamp,
                std::optional<FaultError>* fault, std::vector<std::string>* problems) {
  const std::string name = std::string("table '") + table.name + "'";
  TableWalk walk;
  MDB_stat stat;
  std::string walk_problem;
  try {
    if (const int rc = WalkTable(txn, table, &stat, &walk, newest_stamp); rc != 0) {
      problems->push_back(name + ": " + mdb_strerror(rc));
      return;
    }
  } catch (const FaultError& e) {
    if (!*fault) fault->emplace(e);
    walk_problem =
        name + ": reading entry " + std::to_string(walk.seen + 1) + " faulted (" + e.what() + ")";
  } catch (const Error& e) {
    walk_problem =
        name + ": reading entry " + std::to_string(walk.seen + 1) + " failed (" + e.what() + ")";
  }
  if (!walk_problem.empty()) {
    problems->push_back(walk_problem);
  } else if (walk.rc != MDB_NOTFOUND) {
    problems->push_back(name + ": reading entry " + std::to_string(walk.seen + 1) +
                        " failed: " + mdb_strerror(walk.rc));
  } else if (walk.seen != stat.ms_entries) {
    problems->push_back(name + " records " + std::to_string(stat.ms_entries) +
                        " entries, its pages hold " + std::to_string(walk.seen));
  }
  if (walk.misplaced > 0) {
    problems->push_back(name + ": " + std::to_string(walk.misplaced) + " keys out of order");
  }
  if (walk.unreachable > 0) {
    problems->push_back(name + ": " + std::to_string(walk.unreachable) +
                        " entries found by a walk are not found by a search for their key");
  }
  if (walk.bad_records > 0) {
    problems->push_back(
        name + ": " + std::to_string(walk.bad_records) +
        " records are malformed or fail their checksum (the first: " + walk.first_bad + ")");
  }
}

// Checks that no record is stamped past the timestamp counter.
void CheckCounter(MDB_txn* txn, MDB_dbi meta, uint64_t newest_stamp,
                  std::optional<FaultError>* fault, std::vector<std::string>* problems) {
  try {
    const uint64_t counter = ReadCounter(txn, meta);
    if (newest_stamp > counter) {
      problems->push_back("a record carries commit timestamp " + std::to_string(newest_stamp) +
                          ", past the store's timestamp counter " + std::to_string(counter));
    }
  } catch (const FaultError& e) {
    fault->emplace(e);
    problems->push_back(std::string("reading the timestamp counter faulted (") + e.what() + ")");
  } catch (const Error& e) {
    problems->push_back(std::string("reading the timestamp counter failed (") + e.what() + ")");
  }
}

}  // namespace

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
    MutexLock lock(&damage_mu_);
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

void LmdbBackend::LookForDamagedMark() {
  if (is_damaged_.load(std::memory_order_relaxed)) return;
  const int fd = ::open((path_ + kDamagedFile).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  char text[512];
  const ssize_t n = ::read(fd, text, sizeof text);
  ::close(fd);
  MutexLock lock(&damage_mu_);
  if (damaged_) return;
  damaged_ = n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string("no details kept");
  is_damaged_ = true;
}

std::optional<std::string> LmdbBackend::DamagedMark() {
  LookForDamagedMark();
  MutexLock lock(&damage_mu_);
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
  MutexLock lock(&damage_mu_);
  if (!damaged_) return;
  throw Error(ErrorCode::kCorruption,
              "store '" + path_ + "' was found damaged (" + *damaged_ +
                  "), so nothing more is written to it: writing over damaged pages can make "
                  "things worse. Run 'percolite check' on it and restore it from a copy; after "
                  "putting a copy of data.mdb in place, open it once with "
                  "percolite.open(path, restored=True) or run 'percolite restored DIR'");
}

void LmdbBackend::CheckFreeList() {
  MutexLock lock(&free_list_mu_);
  if (free_list_checked_.load()) return;
  const std::vector<std::string> problems = WalkStorePages(WalkScope::kFreeList);
  if (!problems.empty()) MarkDamaged(problems.front());
  free_list_checked_ = true;
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

std::vector<std::string> LmdbBackend::VerifyStructure() {
  std::optional<FaultError> fault;
  auto problems = WithReadTxn([&](MDB_txn* txn) {
    std::vector<std::string> problems;
    const TableToCheck tables[] = {{"data", data_dbi_, /*records=*/true, /*cells=*/true},
                                   {"meta", meta_dbi_, false, false},
                                   {"tombstones", tombstone_dbi_, false, false},
                                   {"notify", notify_dbi_, true, false},
                                   {"ack", ack_dbi_, true, false}};
    uint64_t newest_stamp = 0;  // the largest commit_ts any record carries
    for (const TableToCheck& table : tables) {
      CheckTable(txn, table, &newest_stamp, &fault, &problems);
    }
    if (!fault) CheckCounter(txn, meta_dbi_, newest_stamp, &fault, &problems);
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

}  // namespace percolite
