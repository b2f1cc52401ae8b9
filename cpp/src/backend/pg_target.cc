// pg_target.cc: reading a postgresql:// target, and the rule that hides
// passwords (percolite/pg_target.h).
#include "percolite/pg_target.h"

#include <libpq-fe.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "percolite/status.h"

namespace percolite {
namespace {

constexpr std::string_view kHidden = "***";
constexpr size_t kNone = std::string_view::npos;

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

int FromHex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX escapes decoded; a malformed one is kept as written (libpq refuses it later).
std::string PercentDecode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && FromHex(text[i + 1]) >= 0 &&
        FromHex(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(FromHex(text[i + 1]) * 16 + FromHex(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

bool IsSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

// Where a password's value is in a text: [begin, end).
struct Span {
  size_t begin;
  size_t end;
};

// `at` is just past a "://": the password of the authority's user info.
std::optional<Span> UserinfoPassword(std::string_view text, size_t at) {
  size_t end = at;
  while (end < text.size() && text[end] != '/' && !IsSpace(text[end])) ++end;
  const size_t userinfo_end = text.substr(at, end - at).rfind('@');
  if (userinfo_end == kNone) return std::nullopt;
  const size_t colon = text.substr(at, userinfo_end).find(':');
  if (colon == kNone) return std::nullopt;
  return Span{at + colon + 1, at + userinfo_end};
}

// `at` is just past a '?' or '&': the value of the parameter there, when
// its name is password.
std::optional<Span> QueryPassword(std::string_view text, size_t at) {
  size_t eq = at;
  while (eq < text.size() && text[eq] != '=' && text[eq] != '&' && !IsSpace(text[eq])) ++eq;
  if (eq == text.size() || text[eq] != '=') return std::nullopt;
  if (PercentDecode(text.substr(at, eq - at)) != "password") return std::nullopt;
  size_t end = eq + 1;
  while (end < text.size() && text[end] != '&' && !IsSpace(text[end])) ++end;
  return Span{eq + 1, end};
}

// `at` starts a word: the value of libpq's password=VALUE there, read as
// libpq reads it (a backslash escapes the next character).
std::optional<Span> KeywordPassword(std::string_view text, size_t at) {
  constexpr std::string_view kKeyword = "password";
  if (text.substr(at, kKeyword.size()) != kKeyword) return std::nullopt;
  size_t i = at + kKeyword.size();
  while (i < text.size() && IsSpace(text[i])) ++i;
  if (i == text.size() || text[i] != '=') return std::nullopt;
  ++i;
  while (i < text.size() && IsSpace(text[i])) ++i;
  const size_t begin = i;
  const bool quoted = i < text.size() && text[i] == '\'';
  if (quoted) ++i;
  for (; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (quoted ? text[i] == '\'' : IsSpace(text[i])) {
      break;
    }
  }
  if (quoted && i < text.size()) ++i;  // the closing quote
  return Span{begin, std::min(i, text.size())};
}

// The offset of the authority in a postgresql:// (or postgres://, any case)
// URI; kInvalidArgument for any other text.
size_t AuthorityStart(const std::string& target) {
  const size_t scheme_end = target.find("://");
  const std::string scheme =
      scheme_end == kNone ? "" : Lower(std::string_view(target).substr(0, scheme_end));
  if (scheme != "postgresql" && scheme != "postgres") {
    throw Error(
        ErrorCode::kInvalidArgument,
        "a postgresql store is named by a postgresql:// URI, not '" + HidePasswords(target) + "'");
  }
  return scheme_end + 3;
}

bool ValidSchema(std::string_view name) {
  if (name.empty() || name.size() > 40) return false;
  // PostgreSQL's own schemas.
  if (name.substr(0, 3) == "pg_" || name == "information_schema") return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// A number of seconds in (0, most], or kInvalidArgument naming `name`.
double ReadSeconds(const std::string& name, const std::string& value, double most) {
  char* end = nullptr;
  const double seconds = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !(seconds > 0 && seconds <= most)) {
    char bound[32];
    std::snprintf(bound, sizeof bound, "%g", most);
    throw Error(ErrorCode::kInvalidArgument,
                name + " '" + value +
                    "' in the postgresql target: a number of seconds, more than 0 and at most " +
                    bound);
  }
  return seconds;
}

const std::string& ReadSchema(const std::string& value) {
  if (!ValidSchema(value)) {
    throw Error(ErrorCode::kInvalidArgument,
                "schema '" + value +
                    "' in the postgresql target: a schema name is 1 to 40 characters of "
                    "[a-z0-9_], starting with a letter or _, and not one of PostgreSQL's own "
                    "(pg_*, information_schema)");
  }
  return value;
}

// Takes percolite's own parameters (schema, poll_interval,
// reconnect_timeout) out of `query` into *out, and a password's into
// out->secrets; returns the parameters left to libpq, as written.
std::vector<std::string> ReadQuery(std::string_view query, PgTarget* out) {
  std::vector<std::string> kept;
  std::set<std::string> seen;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == kNone ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    const std::string name = PercentDecode(pair.substr(0, eq));
    const std::string value = eq == kNone ? std::string() : PercentDecode(pair.substr(eq + 1));
    if (name == "password" && eq != kNone) {
      out->secrets.emplace_back(pair.substr(eq + 1));
      out->secrets.push_back(value);
    }
    const bool ours = name == "poll_interval" || name == "schema" || name == "reconnect_timeout";
    if (ours && !seen.insert(name).second) {
      throw Error(ErrorCode::kInvalidArgument,
                  name + " is given twice in the postgresql target: give it once");
    }
    if (name == "poll_interval") {
      out->poll_interval = ReadSeconds(name, value, 3600);
    } else if (name == "reconnect_timeout") {
      out->reconnect_timeout = ReadSeconds(name, value, PgTarget::kMaxReconnectTimeout);
    } else if (name == "schema") {
      out->schema = ReadSchema(value);
    } else {
      kept.emplace_back(pair);
    }
  }
  return kept;
}

// libpq's reading of the URI: the options it sets (name -> value), or
// kInvalidArgument for unknown parameters or a malformed URI.
std::map<std::string, std::string> ReadWithLibpq(const PgTarget& target) {
  char* message = nullptr;
  PQconninfoOption* options = PQconninfoParse(target.conninfo.c_str(), &message);
  if (options == nullptr) {
    std::string why = message ? message : "it cannot be read";
    if (message) PQfreemem(message);
    while (!why.empty() && why.back() == '\n') why.pop_back();
    throw Error(ErrorCode::kInvalidArgument, "the postgresql target '" + target.display +
                                                 "' is not a valid URI: " + target.Hide(why));
  }
  std::map<std::string, std::string> set;
  for (const PQconninfoOption* option = options; option->keyword != nullptr; ++option) {
    if (option->val != nullptr) set[option->keyword] = option->val;
  }
  PQconninfoFree(options);
  return set;
}

// What percolite adds to a URI that leaves it out (pg_target.h says why).
constexpr std::pair<const char*, const char*> kConnectDefaults[] = {
    {"connect_timeout", "10"},    {"keepalives", "1"},       {"keepalives_idle", "5"},
    {"keepalives_interval", "2"}, {"keepalives_count", "3"}, {"tcp_user_timeout", "10000"},
};

}  // namespace

std::string PgApplicationName(const PgTarget& target) { return "percolite." + target.schema; }

std::vector<std::pair<std::string, std::string>> PgConnectDefaults() {
  return {std::begin(kConnectDefaults), std::end(kConnectDefaults)};
}

namespace {

// `target_session_attrs` checked (a store must write), or set when several
// hosts are named; then the defaults. Returns the URI libpq connects with.
std::string ConnectUri(const PgTarget& target, const std::map<std::string, std::string>& set) {
  std::string uri = target.conninfo;
  const auto add = [&uri](std::string_view name, std::string_view value) {
    uri += uri.find('?') == std::string::npos ? '?' : '&';
    uri.append(name).append("=").append(value);
  };
  const auto attrs = set.find("target_session_attrs");
  if (attrs != set.end()) {
    if (attrs->second != "read-write" && attrs->second != "primary") {
      throw Error(ErrorCode::kInvalidArgument,
                  "target_session_attrs=" + attrs->second +
                      " in the postgresql target: a store writes, so it must reach the "
                      "primary: use read-write or primary, or leave it out");
    }
  } else {
    const auto host = set.find("host");
    const auto hostaddr = set.find("hostaddr");
    const bool several = (host != set.end() && host->second.find(',') != std::string::npos) ||
                         (hostaddr != set.end() && hostaddr->second.find(',') != std::string::npos);
    if (several) add("target_session_attrs", "read-write");
  }
  for (const auto& [name, value] : kConnectDefaults) {
    if (set.count(name) == 0) add(name, value);
  }
  // Names the store's sessions in pg_stat_activity (PgApplicationName).
  if (set.count("application_name") == 0) add("application_name", PgApplicationName(target));
  return uri;
}

}  // namespace

std::string HidePasswords(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    std::optional<Span> password;
    if (text.compare(i, 3, "://") == 0) {
      password = UserinfoPassword(text, i + 3);
    } else if (text[i] == '?' || text[i] == '&') {
      password = QueryPassword(text, i + 1);
    } else if (i == 0 || !IsWordChar(text[i - 1])) {
      password = KeywordPassword(text, i);
    }
    if (!password) {
      out.push_back(text[i++]);
      continue;
    }
    out.append(text.substr(i, password->begin - i));
    out.append(kHidden);
    i = password->end;
  }
  return out;
}

std::string PgTarget::Hide(std::string text) const {
  text = HidePasswords(text);
  for (const std::string& secret : secrets) {
    if (secret.empty()) continue;
    for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at)) {
      text.replace(at, secret.size(), kHidden);
      at += kHidden.size();
    }
  }
  return text;
}

PgTarget ParsePgTarget(const std::string& target) {
  const size_t authority = AuthorityStart(target);
  PgTarget out;
  out.schema = "percolite";
  out.display = HidePasswords(target);
  // The password, wherever it is, to keep out of libpq's messages too.
  if (const std::optional<Span> password = UserinfoPassword(target, authority)) {
    const std::string secret = target.substr(password->begin, password->end - password->begin);
    out.secrets.push_back(secret);
    out.secrets.push_back(PercentDecode(secret));
  }
  const size_t query = target.find('?');
  // The scheme as libpq wants it (it takes only lower case).
  out.conninfo =
      "postgresql://" +
      target.substr(authority, query == std::string::npos ? std::string::npos : query - authority);
  if (query != std::string::npos) {
    const std::vector<std::string> kept =
        ReadQuery(std::string_view(target).substr(query + 1), &out);
    for (size_t i = 0; i < kept.size(); ++i) out.conninfo += (i == 0 ? "?" : "&") + kept[i];
  }
  out.connect = ConnectUri(out, ReadWithLibpq(out));
  return out;
}

}  // namespace percolite
