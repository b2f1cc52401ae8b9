// percolite/open_backend.h: naming a store and opening its backend.
//
// A target string names a backend and its store: a directory (lmdb), an
// in-memory store, or a schema of a PostgreSQL database. ParseTarget reads
// one; OpenBackend opens the backend it names. This unit sits above the
// backends (it builds each of them), so the interface in backend.h never
// includes an implementation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "percolite/backend.h"

namespace percolite {

// What a target names: the backend, and where its store is (the directory
// for lmdb; empty for memory).
struct BackendTarget {
  std::string backend;
  std::string location;
};

// Reads a target:
//   ":memory:", "memory:" or "memory://"       a new private in-memory store
//   "lmdb:PATH", "lmdb://PATH" or a plain PATH  the LMDB store in directory PATH
// Schemes are case-insensitive; a relative path with a colon ("data:2024")
// stays a path. `backend` ("lmdb", "memory", or empty for "from the target")
// names the backend instead. Throws kInvalidArgument naming what is wrong: an
// empty target, a NUL byte in it, an unknown scheme or name, a target and a name that disagree,
// a path for memory, no path for lmdb.
BackendTarget ParseTarget(const std::string& target, const std::string& backend);

// Opens the backend ParseTarget reads from `target`; a memory store with
// options.create false throws kInvalidArgument (a new memory store is always
// empty).
std::shared_ptr<Backend> OpenBackend(const std::string& target, const std::string& backend,
                                     const BackendOptions& options);
// The names OpenBackend accepts for `backend`, and the schemes of targets.
std::vector<std::string> BackendNames();

}  // namespace percolite
