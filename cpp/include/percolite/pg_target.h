// percolite/pg_target.h: what a postgresql:// target says, and the one rule
// that keeps its password out of everything shown.
#pragma once

#include <string>
#include <string_view>
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

// What a postgresql:// target says: the connection URI libpq gets (without
// percolite's own parameters), the schema, and a form fit to show (the
// target as written, through HidePasswords).
struct PgTarget {
  std::string conninfo;
  std::string schema;
  std::string display;
  double poll_interval = 0;  // seconds; 0: wake-ups by LISTEN/NOTIFY
  // The password as written in the target (and decoded), to keep out of
  // libpq's messages, which quote it bare: Hide applies HidePasswords and
  // replaces each occurrence of these in `text` with ***.
  std::vector<std::string> secrets;
  std::string Hide(std::string text) const;
};

// Reads a postgresql:// (or postgres://) URI; percolite's own query
// parameters are taken out, the rest is left to libpq: `schema`
// ([a-z_][a-z0-9_]*, at most 40 characters, default "percolite"), and
// `poll_interval` (seconds, for servers without LISTEN/NOTIFY: workers look
// for work that often instead of being woken). Throws kInvalidArgument naming what
// is wrong (never the password).
PgTarget ParsePgTarget(const std::string& target);

}  // namespace percolite
