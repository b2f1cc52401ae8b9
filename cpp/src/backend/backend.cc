// The parts of the backend layer every backend shares: the stored forms of
// stamps, notification keys and observed columns, and choosing a backend.
#include "percolite/backend.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "fork_guard.h"
#include "lmdb_backend.h"
#include "memory_backend.h"
#include "pg_backend.h"

namespace percolite {
namespace {

void AppendLengthPrefixed(std::string* out, std::string_view part) {
  uint32_t n = static_cast<uint32_t>(part.size());
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(n >> shift));
  out->append(part);
}

bool ReadLengthPrefixed(std::string_view bytes, size_t* pos, std::string* out) {
  if (bytes.size() < *pos + 4) return false;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n = (n << 8) | static_cast<unsigned char>(bytes[*pos + i]);
  *pos += 4;
  if (bytes.size() < *pos + n) return false;
  out->assign(bytes.substr(*pos, n));
  *pos += n;
  return true;
}

std::atomic<uint64_t> g_fork_generation{0};

}  // namespace

void InstallForkGeneration() {
  static std::once_flag once;
  std::call_once(once,
                 [] { pthread_atfork(nullptr, nullptr, [] { g_fork_generation.fetch_add(1); }); });
}

uint64_t ForkGeneration() { return g_fork_generation.load(); }

std::string EncodeObservedColumns(const std::vector<ObservedColumn>& columns) {
  std::string out;
  for (const ObservedColumn& c : columns) {
    AppendLengthPrefixed(&out, c.family);
    AppendLengthPrefixed(&out, c.qualifier);
    out.push_back(static_cast<char>(c.kind));
    AppendLengthPrefixed(&out, c.observer);
  }
  return out;
}

bool DecodeObservedColumns(std::string_view bytes, std::vector<ObservedColumn>* out) {
  out->clear();
  size_t pos = 0;
  while (pos < bytes.size()) {
    ObservedColumn c;
    if (!ReadLengthPrefixed(bytes, &pos, &c.family) ||
        !ReadLengthPrefixed(bytes, &pos, &c.qualifier) || pos >= bytes.size()) {
      return false;
    }
    c.kind = static_cast<NotifyKind>(bytes[pos++]);
    if (c.kind != NotifyKind::kStrong && c.kind != NotifyKind::kWeak) return false;
    if (!ReadLengthPrefixed(bytes, &pos, &c.observer)) return false;
    out->push_back(std::move(c));
  }
  return true;
}

uint64_t RowHash(std::string_view row) { return StableHash64(row, 7); }

std::string NotificationKey(uint64_t row_hash, std::string_view cell_key) {
  std::string key;
  key.reserve(8 + cell_key.size());
  AppendUint64BE(&key, row_hash);
  key.append(cell_key);
  return key;
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

bool Snapshot::Scan(std::string_view from, bool exclusive, std::string_view end, size_t limit,
                    std::vector<std::pair<std::string, std::string>>* out) {
  size_t taken = 0;
  return Visit(from, exclusive, end, [&](std::string_view key, std::string_view value) {
    if (taken == limit) return false;
    out->emplace_back(std::string(key), std::string(value));
    ++taken;
    return true;
  });
}

size_t Snapshot::Count(std::string_view from, bool exclusive, std::string_view end, size_t limit) {
  size_t counted = 0;
  Visit(from, exclusive, end, [&](std::string_view, std::string_view) {
    if (counted == limit) return false;
    ++counted;
    return true;
  });
  return counted;
}

CommitResult Backend::Commit(uint64_t start_ts, std::vector<Mutation> mutations,
                             CommitExtras extras) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  CommitResult result;
  CommitAsync(start_ts, std::move(mutations), std::move(extras), [&](const CommitResult& r) {
    std::lock_guard<std::mutex> lock(mu);
    result = r;
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return result;
}

namespace {

// The backends, by name: a new one is one more entry (and its class).
struct BackendEntry {
  const char* name;
  bool has_location;  // opens a path (lmdb), a URI (postgresql) or nothing (memory)
  bool uri;           // the location is the whole target (postgresql://...)
  std::shared_ptr<Backend> (*open)(const std::string& location, const BackendOptions& options);
};

const BackendEntry kBackends[] = {
    {"lmdb", true, false,
     [](const std::string& location, const BackendOptions& options) -> std::shared_ptr<Backend> {
       return LmdbBackend::Acquire(location, options);
     }},
    {"memory", false, false,
     [](const std::string&, const BackendOptions& options) -> std::shared_ptr<Backend> {
       if (!options.create) {
         throw Error(ErrorCode::kInvalidArgument,
                     "a memory store is always new and private to its handle, so create=False "
                     "cannot open an existing one");
       }
       return MemoryBackend::Open(options);
     }},
    {"postgresql", true, true,
     [](const std::string& location, const BackendOptions& options) -> std::shared_ptr<Backend> {
       return PgBackend::Open(location, options);
     }},
};

const BackendEntry* FindBackend(std::string_view name) {
  for (const BackendEntry& entry : kBackends) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string KnownNames() {
  std::string out;
  for (const BackendEntry& entry : kBackends) {
    if (!out.empty()) out += ", ";
    out += std::string("'") + entry.name + "'";
  }
  return out;
}

// "scheme" of "scheme://rest", or of "name:rest" for one of our names (so a
// relative path such as "data:2024" stays a path). False for a plain path.
bool SplitScheme(const std::string& target, std::string* scheme, std::string* rest) {
  const size_t colon = target.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  for (size_t i = 0; i < colon; ++i) {
    const char c = target[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (i > 0 && ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.'));
    if (!ok) return false;
  }
  const bool slashes = target.compare(colon + 1, 2, "//") == 0;
  std::string name = Lower(std::string_view(target).substr(0, colon));
  if (name == "postgres") name = "postgresql";  // libpq takes both
  if (!slashes && FindBackend(name) == nullptr) return false;
  *scheme = name;
  *rest = target.substr(colon + 1 + (slashes ? 2 : 0));
  return true;
}

// "host=db user=app ..." (libpq's key=value form), which would otherwise
// name a directory.
bool LooksLikeConnectionString(std::string_view target) {
  static const char* const kKeywords[] = {"host",    "hostaddr",       "port",    "dbname",
                                          "user",    "password",       "sslmode", "service",
                                          "options", "connect_timeout"};
  const size_t start = target.find_first_not_of(' ');
  if (start == std::string_view::npos) return false;
  for (const char* keyword : kKeywords) {
    const std::string_view k(keyword);
    if (target.compare(start, k.size(), k) != 0) continue;
    const size_t next = target.find_first_not_of(' ', start + k.size());
    if (next != std::string_view::npos && target[next] == '=') return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> BackendNames() {
  std::vector<std::string> names;
  for (const BackendEntry& entry : kBackends) names.emplace_back(entry.name);
  return names;
}

BackendTarget ParseTarget(const std::string& target, const std::string& backend) {
  if (target.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "opening a store: the path is empty");
  }
  if (target.find('\0') != std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                "opening a store: the path contains a NUL byte, which no file name can hold");
  }
  if (!backend.empty() && FindBackend(backend) == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "unknown backend '" + backend + "': percolite has " + KnownNames());
  }
  std::string scheme, rest = target;
  if (LooksLikeConnectionString(target)) {
    // Not echoed: it may hold a password.
    throw Error(ErrorCode::kInvalidArgument,
                "the target looks like a libpq key=value connection string; percolite opens a "
                "PostgreSQL store by URI: postgresql://user@host/database?schema=NAME");
  }
  if (target == ":memory:") {
    scheme = "memory";
    rest.clear();
  } else if (!SplitScheme(target, &scheme, &rest)) {
    scheme.clear();
  }
  if (!scheme.empty() && FindBackend(scheme) == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "unknown backend scheme '" + scheme + "://' in '" + target +
                    "': percolite opens a directory path (or lmdb://PATH), ':memory:' and "
                    "postgresql:// URIs");
  }
  if (!backend.empty() && !scheme.empty() && backend != scheme) {
    throw Error(ErrorCode::kInvalidArgument, "the target '" + target + "' names the " + scheme +
                                                 " backend, but backend='" + backend + "'");
  }
  const BackendEntry& entry = *FindBackend(!backend.empty()  ? backend
                                           : !scheme.empty() ? scheme
                                                             : "lmdb");
  if (!entry.has_location && !rest.empty()) {
    throw Error(ErrorCode::kInvalidArgument, std::string("a ") + entry.name +
                                                 " store has no path: open ':memory:' (got '" +
                                                 target + "')");
  }
  if (entry.has_location && rest.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "opening a store: '" + target + "' names no directory");
  }
  if (entry.uri) {
    if (scheme.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("a ") + entry.name + " store is named by a " + entry.name +
                      ":// URI (postgresql://user@host/database?schema=NAME), not '" + target +
                      "'");
    }
    return BackendTarget{entry.name, target};
  }
  return BackendTarget{entry.name, rest};
}

std::shared_ptr<Backend> OpenBackend(const std::string& target, const std::string& backend,
                                     const BackendOptions& options) {
  const BackendTarget parsed = ParseTarget(target, backend);
  return FindBackend(parsed.backend)->open(parsed.location, options);
}

}  // namespace percolite
