// pg_target.cc: reading a postgresql:// target (percolite/pg_target.h).
#include "percolite/pg_target.h"

#include <libpq-fe.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <utility>

#include "percolite/status.h"

namespace percolite {
namespace {

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

std::string PercentDecode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() + 0 && FromHex(text[i + 1]) >= 0 &&
        FromHex(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(FromHex(text[i + 1]) * 16 + FromHex(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
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

}  // namespace

std::string PgTarget::Hide(std::string text) const {
  for (const std::string& secret : secrets) {
    if (secret.empty()) continue;
    for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at)) {
      text.replace(at, secret.size(), "***");
      at += 3;
    }
  }
  return text;
}

PgTarget ParsePgTarget(const std::string& target) {
  const size_t scheme_end = target.find("://");
  const std::string scheme =
      scheme_end == std::string::npos ? "" : Lower(std::string_view(target).substr(0, scheme_end));
  if (scheme != "postgresql" && scheme != "postgres") {
    throw Error(ErrorCode::kInvalidArgument,
                "a postgresql store is named by a postgresql:// URI, not '" + target + "'");
  }
  PgTarget out;
  out.schema = "percolite";
  const size_t query = target.find('?');
  // The scheme as libpq wants it (it takes only lower case).
  std::string base = "postgresql://" + target.substr(scheme_end + 3, query == std::string::npos
                                                                         ? std::string::npos
                                                                         : query - scheme_end - 3);
  // The password, wherever it is, to keep out of every message: in the
  // user info (user:secret@host) and in a password= parameter.
  {
    const size_t start = scheme_end + 3;
    const size_t end = std::min(target.find('/', start), query);
    const size_t at = target.rfind('@', end == std::string::npos ? target.size() : end);
    if (at != std::string::npos && at >= start) {
      const size_t colon = target.find(':', start);
      if (colon != std::string::npos && colon < at) {
        const std::string secret = target.substr(colon + 1, at - colon - 1);
        out.secrets.push_back(secret);
        out.secrets.push_back(PercentDecode(secret));
      }
    }
  }
  std::vector<std::string> kept, shown;
  bool seen_schema = false, seen_poll = false;
  if (query != std::string::npos) {
    std::string_view rest = std::string_view(target).substr(query + 1);
    while (!rest.empty()) {
      const size_t amp = rest.find('&');
      const std::string_view pair = rest.substr(0, amp);
      rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
      if (pair.empty()) continue;
      const size_t eq = pair.find('=');
      const std::string name = PercentDecode(pair.substr(0, eq));
      const std::string value =
          eq == std::string_view::npos ? std::string() : PercentDecode(pair.substr(eq + 1));
      if (name == "password") {
        out.secrets.emplace_back(pair.substr(eq + 1));
        out.secrets.push_back(value);
      }
      if ((name == "poll_interval" && std::exchange(seen_poll, true)) ||
          (name == "schema" && std::exchange(seen_schema, true))) {
        throw Error(ErrorCode::kInvalidArgument,
                    name + " is given twice in the postgresql target: give it once");
      }
      if (name == "poll_interval") {
        char* end = nullptr;
        const double seconds = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !(seconds > 0 && seconds <= 3600)) {
          throw Error(ErrorCode::kInvalidArgument,
                      "poll_interval '" + value +
                          "' in the postgresql target: a number of seconds, more than 0 and at "
                          "most 3600");
        }
        out.poll_interval = seconds;
        shown.emplace_back(pair);
        continue;
      }
      if (name == "schema") {
        if (!ValidSchema(value)) {
          throw Error(ErrorCode::kInvalidArgument,
                      "schema '" + value +
                          "' in the postgresql target: a schema name is 1 to 40 characters of "
                          "[a-z0-9_], starting with a letter or _, and not one of PostgreSQL's "
                          "own (pg_*, information_schema)");
        }
        out.schema = value;
        shown.emplace_back(pair);
        continue;
      }
      kept.emplace_back(pair);
      if (name != "password") shown.emplace_back(pair);
    }
  }
  out.conninfo = base;
  for (size_t i = 0; i < kept.size(); ++i) out.conninfo += (i == 0 ? "?" : "&") + kept[i];
  // Shown without a password: postgresql://user:secret@host -> postgresql://user@host.
  std::string display = base;
  const size_t authority = scheme_end + 3;
  const size_t at = display.find('@', authority);
  const size_t slash = display.find('/', authority);
  if (at != std::string::npos && (slash == std::string::npos || at < slash)) {
    const size_t colon = display.find(':', authority);
    if (colon != std::string::npos && colon < at) display.erase(colon, at - colon);
  }
  for (size_t i = 0; i < shown.size(); ++i) display += (i == 0 ? "?" : "&") + shown[i];
  out.display = display;
  // libpq's own check of the rest: unknown parameters, a malformed URI.
  char* message = nullptr;
  PQconninfoOption* options = PQconninfoParse(out.conninfo.c_str(), &message);
  if (options == nullptr) {
    std::string why = message ? message : "it cannot be read";
    if (message) PQfreemem(message);
    while (!why.empty() && why.back() == '\n') why.pop_back();
    throw Error(ErrorCode::kInvalidArgument,
                "the postgresql target '" + out.display + "' is not a valid URI: " + out.Hide(why));
  }
  PQconninfoFree(options);
  return out;
}

}  // namespace percolite
