// Choosing a backend from a target string, and opening it.
#include "percolite/open_backend.h"

#include <cctype>

#include "lmdb_backend.h"
#include "memory_backend.h"
#include "pg_backend.h"

namespace percolite {
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
