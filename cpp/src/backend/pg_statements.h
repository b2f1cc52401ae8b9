// pg_statements.h: the SQL of a postgresql store, every statement percolite
// sends, built once per handle with the names of its schema in place.
//
// Keys have no length limit, and PostgreSQL caps an index entry near 2.7 KB:
// the indexes hold a key's first kPgIndexedBytes (where order matters: cells,
// notification scans) or its SHA-256 (where only equality does: unique
// notifications and acks), and every statement compares the whole key
// after. Ordering by (prefix, key) is ordering by key. In the statements'
// text, PREFIX(x) stands for that prefix, substr(x, 1, kPgIndexedBytes): the
// expression of the indexes, which a statement must repeat for the server
// to use them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace percolite {

constexpr size_t kPgIndexedBytes = 2000;

// The store's format, in meta: a store of another format is refused. 2:
// queue entries may be packed, several to a record (queues/queue_rows.h); a
// store of kPgFormatBeforePacking holds only single-entry records, which
// this version still reads, so opening one just retags it.
constexpr std::string_view kPgFormatName = "percolite-store";
constexpr std::string_view kPgFormat = "2";
constexpr std::string_view kPgFormatBeforePacking = "1";

// The tables of a store, in its schema.
constexpr const char* kPgTables[] = {"meta", "clock",   "cells",  "notify",
                                     "acks", "garbage", "handles"};

// cells.state: a version holds a value, or is a tombstone.
enum PgCellState : int64_t { kPgLive = 0, kPgDeleted = 1 };

struct PgStatements {
  // For the store in `schema` (a valid name: it is put in the text as it
  // is); a handle not seen for `handle_lease_seconds` holds back no collection.
  PgStatements(const std::string& schema, int handle_lease_seconds);

  // The LISTEN/NOTIFY channel of the store.
  std::string channel;

  // Finding, checking and creating the store (pg_schema.cc).
  std::string find_meta;           // () -> whether the meta table exists
  std::string find_tables;         // () -> the store's table names present
  std::string check_meta_columns;  // () -> 2 when meta has percolite's columns
  std::string read_format;         // ($1 format name) -> value
  std::string retag_format;        // () kPgFormatBeforePacking -> kPgFormat
  std::string lock_creation;       // serializes openers racing to create
  std::string create;              // a script: the schema, tables and records

  // Snapshots and reads outside them.
  std::string read_clock;  // () -> ts: the newest commit_ts
  // () -> the server's clock, unix microseconds (int8).
  std::string server_clock;
  // () -> synchronous_standby_names (text), standbys connected (int8).
  std::string replication;
  // () -> sessions with this session's application_name waiting for a
  // synchronous standby (int8), the longest wait in ms (int8).
  std::string standby_waits;
  // ($1 key, $2 start_ts) -> state, value of the version a snapshot sees.
  std::string get;
  // ($1 from, $2 start_ts, $3 limit[, $4 end]) -> key, state, value: the
  // versions a snapshot sees from `from` on, [exclusive of from][bounded by end].
  std::string visit[2][2];
  std::string notification_stamp;   // ($1 notification key) -> stamp
  std::string read_observed;        // () -> the observed columns, encoded
  std::string write_observed;       // ($1 encoded)
  std::string count_notifications;  // () -> count
  std::string scan_notifications;   // ($1 after, $2 limit) -> nkey, stamp
  std::string notification_keys;    // () -> nkey

  // A batch of commits (pg_commit.cc), in the order it sends them.
  std::string lock_clock_and_observed;  // () -> ts, observed columns; locks the counter
  std::string newest_versions;          // ($1 keys) -> key, newest ts not purged
  std::string read_acks;                // ($1 cell keys) -> key, ts
  std::string read_notifications;       // ($1 notification keys) -> nkey, stamp
  std::string insert_cells;             // ($1 keys, $2 ts, $3 states, $4 values)
  std::string purge_keys;               // ($1 keys, $2 purge ts)
  std::string purge_range;              // ($1 from, $2 end, $3 purge ts)
  std::string delete_notifications;     // ($1 notification keys)
  std::string upsert_notifications;     // ($1 notification keys, $2 stamps)
  std::string upsert_acks;              // ($1 cell keys, $2 ts)
  std::string insert_garbage;           // ($1 keys, $2 ts)
  std::string advance_clock;            // ($1 ts)
  std::string notify_commit;            // wakes the watches of every handle
  // Settling a batch cut off by a lost connection.
  std::string end_session;      // ($1 server process id, $2 its session_started)
  std::string session_started;  // this session's start, as text
  std::string lock_clock;       // () -> ts; locks the counter
  std::string read_token;       // ($1 handle id) -> token

  // The handles table and collection (pg_collect.cc).
  std::string publish;             // ($1 handle id, $2 horizon)
  std::string publish_with_token;  // ($1 handle id, $2 horizon, $3 token)
  std::string forget_handle;       // ($1 handle id)
  // Settings of the collecting transaction: no wait for the flush, and
  // plans that follow the indexes whatever the statistics say.
  std::string collect_settings;
  std::string collect;  // () -> tombstones removed, purged versions removed

  // The watch (pg_watch.cc).
  std::string listen;
  std::string notify_waiter;
};

}  // namespace percolite
