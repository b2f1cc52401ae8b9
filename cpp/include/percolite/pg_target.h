// percolite/pg_target.h: what a postgresql:// target says, and the one rule
// that keeps its password out of everything shown.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace percolite {

// `text` with every password in it replaced by ***, the rest as written:
// - the password of a URI's user info (scheme://user:PASSWORD@host): the
//   authority runs to the first '/' (where libpq ends it) or whitespace
//   (where a URI in a message ends), and the user info to the authority's
//   last '@' (a password with a stray '@' is hidden whole);
// - a query parameter whose name (percent-decoded, as libpq decodes it) is
//   password: ?password=VALUE or &password=VALUE, up to the next '&' or
//   whitespace;
// - libpq's key=value form, password=VALUE (spaces around '=' allowed),
//   VALUE single-quoted (with backslash escapes) or running to whitespace.
// A password is hidden whether percent-encoded or not, and in a malformed
// URI too: the rule reads the text, not the URI.
std::string HidePasswords(std::string_view text);

// What a postgresql:// target says: the connection URI (without percolite's
// own parameters), the URI libpq connects with (that, plus percolite's
// defaults for what it leaves out), the schema, and a form fit to show (the
// target as written, through HidePasswords).
struct PgTarget {
  std::string conninfo;
  std::string connect;
  std::string schema;
  std::string display;
  double poll_interval = 0;  // seconds; 0: wake-ups by LISTEN/NOTIFY
  // How long a handle keeps trying to reach a server (a primary) that went
  // away before a call reports kStorage: long enough to outlast a restart or
  // an orchestrator's failover.
  double reconnect_timeout = kDefaultReconnectTimeout;
  static constexpr double kDefaultReconnectTimeout = 30;
  // A handle away from the server for longer than the handles' lease no
  // longer holds back the collection of old versions its snapshots may
  // still read, so it must give up before then (pg_backend.h checks).
  static constexpr double kMaxReconnectTimeout = 60;
  // The password as written in the target (and decoded), to keep out of
  // libpq's messages, which quote it bare: Hide applies HidePasswords and
  // replaces each occurrence of these in `text` with ***.
  std::vector<std::string> secrets;
  std::string Hide(std::string text) const;
  // When a handle that starts reconnecting now gives up.
  std::chrono::steady_clock::time_point ReconnectDeadline() const {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(reconnect_timeout));
  }
};

// Reads a postgresql:// (or postgres://) URI; percolite's own query
// parameters are taken out, the rest is left to libpq: `schema`
// ([a-z_][a-z0-9_]*, at most 40 characters, default "percolite"),
// `poll_interval` (seconds, for servers without LISTEN/NOTIFY: workers look
// for work that often instead of being woken), and `reconnect_timeout`
// (seconds, default 30, at most 60). Throws kInvalidArgument naming what is wrong (never
// the password).
//
// A store writes, so it must reach the primary: `target_session_attrs` may
// be read-write or primary, and is set to read-write when the URI names
// several hosts and no such attribute (libpq then tries the hosts in turn
// until one accepts writes, which is how a client follows a failover).
// What the URI leaves out, `connect` adds: connect_timeout=10 (per host, as
// libpq applies it), TCP keepalives (idle 5 s, interval 2 s, 3 probes) and
// tcp_user_timeout=10000 ms, so that a server that vanished without closing
// its connections is noticed in about 10 s instead of TCP's many minutes
// (they do nothing over a Unix socket).
PgTarget ParsePgTarget(const std::string& target);

// The application_name a store's connections take when the URI names none,
// "percolite.<schema>": what the server shows of them (pg_stat_activity),
// and how status finds this store's sessions there.
std::string PgApplicationName(const PgTarget& target);

// The defaults above, (libpq keyword, value), for other clients of a
// postgresql server that should notice a vanished one as quickly (the
// PostgreSQL exporter's connections).
std::vector<std::pair<std::string, std::string>> PgConnectDefaults();

}  // namespace percolite
