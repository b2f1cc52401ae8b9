// A test-only shim, loaded with LD_PRELOAD into one child process, that holds
// or fails that process's durable writes: fsync, fdatasync, and writes
// through a descriptor opened with O_DSYNC (how LMDB makes a commit's meta
// page durable). While the file named by PERCOLITE_TEST_HOLD_SYNC exists,
// they wait (the first PERCOLITE_TEST_SYNC_PASS of them go through first, so
// a test can hold each durable write of a commit in turn, and the file named
// by PERCOLITE_TEST_SYNC_HELD is created once one waits); while the file
// named by PERCOLITE_TEST_FAIL_SYNC exists, they fail with EIO. Built by
// tests/python/test_durability.py.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace {

bool Exists(const char* variable) {
  const char* path = getenv(variable);
  struct stat st;
  return path != nullptr && stat(path, &st) == 0;
}

// 0 to go on, or -1 with errno set to fail the call.
int Gate() {
  static int passed = 0;  // one committing thread in these tests
  if (Exists("PERCOLITE_TEST_HOLD_SYNC")) {
    const char* pass = getenv("PERCOLITE_TEST_SYNC_PASS");
    if (pass != nullptr && passed < atoi(pass)) {
      ++passed;
      return 0;
    }
    if (const char* held = getenv("PERCOLITE_TEST_SYNC_HELD")) {
      const int fd = open(held, O_WRONLY | O_CREAT, 0600);
      if (fd >= 0) close(fd);
    }
    while (Exists("PERCOLITE_TEST_HOLD_SYNC")) usleep(1000);
  }
  if (Exists("PERCOLITE_TEST_FAIL_SYNC")) {
    errno = EIO;
    return -1;
  }
  return 0;
}

bool Durable(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_DSYNC) == O_DSYNC;
}

template <typename Fn>
Fn Next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" {

int fsync(int fd) {
  static auto real = Next<int (*)(int)>("fsync");
  return Gate() != 0 ? -1 : real(fd);
}

int fdatasync(int fd) {
  static auto real = Next<int (*)(int)>("fdatasync");
  return Gate() != 0 ? -1 : real(fd);
}

ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  static auto real = Next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite");
  if (Durable(fd) && Gate() != 0) return -1;
  return real(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void* buf, size_t count, off64_t offset) {
  static auto real = Next<ssize_t (*)(int, const void*, size_t, off64_t)>("pwrite64");
  if (Durable(fd) && Gate() != 0) return -1;
  return real(fd, buf, count, offset);
}

}  // extern "C"
