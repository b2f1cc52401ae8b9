// Shared helpers of the Catch2 tests of the percolite core.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "percolite/backend.h"
#include "percolite/encoding.h"
#include "percolite/env.h"
#include "percolite/open_backend.h"
#include "percolite/status.h"
#include "percolite/transaction.h"

namespace Catch {
template <>
struct StringMaker<percolite::ErrorCode> {
  static std::string convert(percolite::ErrorCode code) {
    switch (code) {
      case percolite::ErrorCode::kOk:
        return "kOk";
      case percolite::ErrorCode::kConflict:
        return "kConflict";
      case percolite::ErrorCode::kClosed:
        return "kClosed";
      case percolite::ErrorCode::kCorruption:
        return "kCorruption";
      case percolite::ErrorCode::kStorage:
        return "kStorage";
      case percolite::ErrorCode::kCallback:
        return "kCallback";
      case percolite::ErrorCode::kInvalidArgument:
        return "kInvalidArgument";
      case percolite::ErrorCode::kWrongState:
        return "kWrongState";
    }
    return "ErrorCode(" + std::to_string(static_cast<int>(code)) + ")";
  }
};
}  // namespace Catch

namespace percolite_test {

// An int64 as the native int64 codec stores it (big-endian two's complement).
inline std::string Int64(int64_t v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  std::string out;
  percolite::AppendUint64BE(&out, u);
  return out;
}

// A fresh directory under /tmp, removed with everything in it on destruction.
// Declare it before the Env that lives in it, so the Env closes first.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/percolite-test-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Options for tests that do not measure durability: no fsync, so they run fast.
inline percolite::BackendOptions FastOptions() {
  percolite::BackendOptions options;
  options.sync = percolite::SyncMode::kNone;
  return options;
}

// The server the postgresql backend is tested on: a postgresql:// URI in
// the environment variable PERCOLITE_TEST_POSTGRES (scripts/test.sh starts a
// temporary server and sets it); empty when it is not set.
inline std::string TestPostgres() {
  const char* uri = ::getenv("PERCOLITE_TEST_POSTGRES");
  return uri ? uri : "";
}

// The backends the conformance tests run on: lmdb, memory, and postgresql
// when a test server is given.
inline std::vector<std::string> ConformanceBackends() {
  std::vector<std::string> names = {"lmdb", "memory"};
  if (!TestPostgres().empty()) names.push_back("postgresql");
  return names;
}

// The conformance tests: a test case that opens its Env with
// OpenEnv(dir, PERCOLITE_EACH_BACKEND()) runs once per backend (a Catch2
// generator), so a new backend is one name away from being tested.
#define PERCOLITE_EACH_BACKEND() GENERATE(from_range(percolite_test::ConformanceBackends()))

// Where a new store of `backend` for a test is: the directory `dir` for
// lmdb, ":memory:", or a schema of its own on the test server.
inline std::string TargetFor(const TempDir& dir, const std::string& backend) {
  if (backend == "memory") return ":memory:";
  if (backend != "postgresql") return dir.path();
  // The directory's unique name names the schema: a fresh store per test.
  std::string schema = "t_";
  for (char c : dir.path().substr(dir.path().rfind('-') + 1)) {
    schema.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  const std::string uri = TestPostgres();
  return uri + (uri.find('?') == std::string::npos ? "?" : "&") + "schema=" + schema;
}

// A store of `backend` for a test (TargetFor).
inline std::shared_ptr<percolite::Env> OpenEnv(
    const TempDir& dir, const std::string& backend,
    const percolite::BackendOptions& options = FastOptions()) {
  return percolite::Env::Open(TargetFor(dir, backend), options, backend);
}

// The code of the percolite::Error that `body` throws, or kOk when it throws none.
// The two lowest layers for a test: a backend of `name` (in a directory of
// its own) and a source of transactions on it, closed in order at the end.
struct Layers {
  explicit Layers(const std::string& name)
      : backend(percolite::OpenBackend(TargetFor(dir, name), name, FastOptions())),
        source(std::make_shared<percolite::TransactionSource>(backend)) {}
  ~Layers() {
    source->Close();
    backend->ReleaseHandle();
  }
  TempDir dir;  // first: the store closes before its directory goes
  std::shared_ptr<percolite::Backend> backend;
  std::shared_ptr<percolite::TransactionSource> source;
};

inline percolite::ErrorCode ErrorCodeOf(const std::function<void()>& body) {
  try {
    body();
  } catch (const percolite::Error& e) {
    return e.code();
  }
  return percolite::ErrorCode::kOk;
}

// The error message of what `body` throws ("" when it throws nothing).
inline std::string MessageOf(const std::function<void()>& body) {
  try {
    body();
  } catch (const percolite::Error& e) {
    return e.what();
  }
  return "";
}

// Backend-level helpers: the encoded key of `row` in column f:q, a set of
// it, and its value in a snapshot begun now.
inline std::string Key(const std::string& row) { return percolite::EncodeCellKey({row, "f", "q"}); }
inline percolite::Mutation SetOf(const std::string& row, const std::string& value) {
  return percolite::Mutation{Key(row), /*is_delete=*/false, value};
}
inline std::optional<std::string> ReadNow(percolite::Backend& backend, const std::string& row) {
  return backend.BeginSnapshot()->Get(Key(row));
}

// Joinable records (backend.h), the same on every backend that writes
// several commits at once: JoinableBatch is a batch of commits (the second
// conflicts with the first), CheckJoinedBatch checks what the backend stored
// once it committed them in one write, given their results.
//
// A joinable stamped write to row `row`, family "U", of a packed record of
// `entries` (one byte each: the backend joins records, never reads entries).
inline percolite::Mutation JoinableOf(const std::string& row, const std::string& entries,
                                      bool joinable = true) {
  percolite::Mutation m{percolite::EncodeCellKey({row, "U", ""})};
  percolite::AppendPackedHeader(&m.value, static_cast<uint32_t>(entries.size()));
  m.value += entries;
  m.stamped = true;
  m.joinable = joinable;
  return m;
}

inline std::string PackedOf(const std::string& entries) {
  std::string record;
  percolite::AppendPackedHeader(&record, static_cast<uint32_t>(entries.size()));
  return record + entries;
}

// The stamped records of `row`, family "U", in key order: (commit_ts of the
// stamp, value).
inline std::vector<std::pair<uint64_t, std::string>> RecordsOf(percolite::Backend& backend,
                                                               const std::string& row) {
  std::string prefix;
  percolite::AppendEscapedPart(&prefix, row);
  percolite::AppendEscapedPart(&prefix, "U");
  std::vector<std::pair<std::string, std::string>> found;
  auto snapshot = backend.BeginSnapshot();
  snapshot->Scan(prefix, false, percolite::PrefixSuccessor(prefix), 100, &found);
  snapshot->Release();
  std::vector<std::pair<uint64_t, std::string>> records;
  for (const auto& [key, value] : found) {
    percolite::Cell cell;
    REQUIRE(percolite::DecodeCellKey(key, &cell));
    REQUIRE(cell.qualifier.size() == percolite::kStampSize);
    records.emplace_back(percolite::ReadUint64BE(cell.qualifier), value);
  }
  return records;
}

inline std::vector<std::vector<percolite::Mutation>> JoinableBatch() {
  const std::string full(percolite::kPackedMaxEntries - 1, 'f');
  return {
      {SetOf("a", "1"), JoinableOf("q", "ab")},
      {SetOf("a", "2"), JoinableOf("q", "x")},  // conflicts with the first
      {JoinableOf("q", "cde"), JoinableOf("r", "r")},
      {JoinableOf("q", "n", /*joinable=*/false)},
      {JoinableOf("q", "g")},
      {JoinableOf("s", full)},
      {JoinableOf("s", "hi")},  // would pass kPackedMaxEntries
      {JoinableOf("s", "j")},
  };
}

inline void CheckJoinedBatch(percolite::Backend& backend,
                             const std::vector<percolite::CommitResult>& results) {
  REQUIRE(results.size() == 8);
  CHECK(results[1].status.code() == percolite::ErrorCode::kConflict);
  const uint64_t ts = results[0].commit_ts;
  CHECK(results[7].commit_ts == ts + 6);
  using Records = std::vector<std::pair<uint64_t, std::string>>;
  // One record under the first commit's stamp, in commit order; the
  // conflicting commit's entries nowhere; a write that is not joinable keeps
  // its own record and closes the open one (records stay in commit order).
  CHECK(RecordsOf(backend, "q") ==
        Records{{ts, PackedOf("abcde")}, {ts + 2, PackedOf("n")}, {ts + 3, PackedOf("g")}});
  CHECK(RecordsOf(backend, "r") == Records{{ts + 1, PackedOf("r")}});
  // A record closes when the next would not fit; later ones join the new one.
  const std::string full(percolite::kPackedMaxEntries - 1, 'f');
  CHECK(RecordsOf(backend, "s") == Records{{ts + 4, PackedOf(full)}, {ts + 5, PackedOf("hij")}});
}

// False, with a warning, when no test server is given (scripts/test.sh
// always gives one): a postgresql-only test then has nothing to run on.
inline bool HaveTestPostgres() {
  if (!TestPostgres().empty()) return true;
  WARN("no test server (PERCOLITE_TEST_POSTGRES): scripts/test.sh starts one");
  return false;
}

inline percolite::CellRef Ref(const percolite::Cell& cell) {
  return percolite::CellRef{cell.row, cell.family, cell.qualifier};
}

// Reads one cell in a fresh transaction of `env`.
inline std::optional<std::string> ReadCommitted(percolite::Env& env, const percolite::Cell& cell) {
  auto tx = env.Begin();
  std::optional<std::string> value = tx->Get(Ref(cell));
  tx->Abort();
  return value;
}

// Sets one cell in its own transaction and returns that transaction's commit_ts.
inline uint64_t CommitSet(percolite::Env& env, const percolite::Cell& cell,
                          const std::string& value) {
  auto tx = env.Begin();
  tx->Set(Ref(cell), value);
  tx->Commit();
  return tx->commit_ts().value();
}

// Every item of `range`, gathered chunk by chunk with at most `limit` cells per chunk.
inline std::vector<percolite::ScanItem> ScanAll(percolite::Transaction& tx,
                                                const percolite::ScanRange& range, size_t limit) {
  std::vector<percolite::ScanItem> items;
  std::string resume;
  bool first = true;
  for (;;) {
    percolite::ScanChunk chunk = tx.Scan(range, first ? nullptr : &resume, limit);
    first = false;
    for (auto& item : chunk.items) items.push_back(std::move(item));
    if (chunk.done) return items;
    // Not a Catch2 assertion: Catch2's are not thread-safe, and reader
    // threads of the concurrency tests call this.
    if (chunk.resume_after.empty()) {
      throw std::logic_error("Scan returned an unfinished chunk without a resume key");
    }
    resume = chunk.resume_after;
  }
}

// A printable form of a cell for failure messages (bytes outside ASCII as \xNN).
inline std::string Describe(const percolite::Cell& cell) {
  auto repr = [](const std::string& s) {
    std::string out;
    for (unsigned char c : s) {
      if (c >= 32 && c < 127) {
        out += static_cast<char>(c);
      } else {
        static const char kHex[] = "0123456789abcdef";
        out += "\\x";
        out += kHex[c >> 4];
        out += kHex[c & 15];
      }
    }
    return out;
  };
  return "(" + repr(cell.row) + ", " + repr(cell.family) + ", " + repr(cell.qualifier) + ")";
}

inline bool SameCell(const percolite::Cell& a, const percolite::Cell& b) {
  return a.row == b.row && a.family == b.family && a.qualifier == b.qualifier;
}

// Runs bucket 0 of `queue` (a CombineQueue or an ExportQueue) as a worker
// would: an observer run of the bucket's notification. Returns the seconds the
// run deferred itself (it is then aborted), or 0 when it processed and committed.
template <typename Queue>
double RunBucketAsWorker(percolite::Env& env, const Queue& queue) {
  auto tx = env.Begin();
  const auto column = queue.NotifyColumn();
  const percolite::Cell cell{queue.options().id + ":b:000000", column.family, column.qualifier};
  tx->SetTrigger(percolite::EncodeCellKey({cell.row, cell.family, cell.qualifier}));
  REQUIRE(queue.Processor()(tx, cell).ok());
  const double deferred = tx->DeferredSeconds();
  if (deferred > 0) {
    tx->Abort();
  } else {
    tx->Commit();
  }
  return deferred;
}

}  // namespace percolite_test
