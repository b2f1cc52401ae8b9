// The LMDB backend's files beside LMDB's own work (lmdb_backend.h): the store
// directory and its path checks, the meta page check before LMDB maps
// data.mdb, and the durable mark.
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "lmdb_internal.h"

namespace percolite {

using lmdb_internal::ErrnoText;
using lmdb_internal::kDamagedFile;
using lmdb_internal::kDurableMarkFile;
using lmdb_internal::kDurableMarkSize;
using lmdb_internal::StoreDurableMark;

namespace {

// What an LMDB data file's meta page says (LMDB 0.9's MDB_meta, after the
// page header): magic and version, page size, last page, txnid.
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

// A process creating the store writes its meta pages right after creating
// the file: CheckStoreFiles looks again, kCheckTries times kCheckRetryEvery
// apart, before calling a file that looks empty or short damaged.
constexpr int kCheckTries = 20;
constexpr std::chrono::milliseconds kCheckRetryEvery{5};

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

// Checks data.mdb's two meta pages (open as `fd`, `size` bytes) against the
// file: both valid, of one page size, and the newest's pages all present.
// `corrupt` makes the error to throw.
template <typename Corrupt>
void CheckMetaPages(int fd, uint64_t size, const Corrupt& corrupt) {
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
  CheckMetaPages(fd, size, corrupt);
}

// The durable mark: the timestamp counter after the newest group commit known
// to be durable, stored after each group commit with sync="full" into a
// shared mapping of the file, and left to the kernel's writeback: it is
// stored only once the commit is durable, so after any crash it names a
// commit the data file holds, or an older one. A store whose counter, as LMDB
// serves it, is below the mark went back in time, whichever meta page LMDB
// chose and whatever txnid it carries. (Not a write() per batch: each one
// dirtied the mark's inode, so the next fdatasync had to commit the journal
// for it too, which slowed every durable commit.)
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

}  // namespace

namespace lmdb_internal {

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

void CheckStoreFiles(const std::string& dir, bool create) {
  for (int tries = 1;; ++tries) {
    try {
      CheckStoreFilesOnce(dir, create);
      return;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kCorruption || tries >= kCheckTries) throw;
      std::this_thread::sleep_for(kCheckRetryEvery);
    }
  }
}

}  // namespace lmdb_internal

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

void LmdbBackend::CloseDurableMark() {
  if (durable_mark_ != nullptr) ::munmap(durable_mark_, kDurableMarkSize);
  durable_mark_ = nullptr;
}

}  // namespace percolite
