// percolite/pg_target.h: what a postgresql:// target says, and the one rule
// that keeps its password out of everything shown.
#pragma once

#include <string>
#include <vector>

namespace percolite {

// What a postgresql:// target says: the connection URI libpq gets (without
// percolite's own parameters), the schema, and a form fit to show (no password).
struct PgTarget {
  std::string conninfo;
  std::string schema;
  std::string display;
  double poll_interval = 0;  // seconds; 0: wake-ups by LISTEN/NOTIFY
  // The password as written in the target (and decoded), to keep out of
  // messages: Hide replaces each occurrence in `text` with ***.
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
