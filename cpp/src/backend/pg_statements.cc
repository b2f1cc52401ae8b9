// pg_statements.cc: the text of every statement (pg_statements.h).
#include "pg_statements.h"

#include <cctype>
#include <stdexcept>
#include <utility>
#include <vector>

namespace percolite {
namespace {

using Names = std::vector<std::pair<std::string, std::string>>;

// `text` with each {name} replaced by its value in `names`.
std::string Substitute(std::string_view text, const Names& names) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text[i] != '{') {
      out.push_back(text[i++]);
      continue;
    }
    const size_t close = text.find('}', i);
    const std::string_view name = text.substr(i + 1, close - i - 1);
    const std::string* value = nullptr;
    for (const auto& [known, its] : names) {
      if (known == name) value = &its;
    }
    if (close == std::string_view::npos || value == nullptr) {
      throw std::logic_error("a postgresql statement names {" + std::string(name) +
                             "}, which is not known");
    }
    out += *value;
    i = close + 1;
  }
  return out;
}

// `text` with each PREFIX(x) written out as the indexes' expression.
std::string ExpandPrefixes(std::string_view text) {
  constexpr std::string_view kMacro = "PREFIX(";
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t at = text.find(kMacro, i);
    const size_t close = at == std::string_view::npos ? at : text.find(')', at);
    if (close == std::string_view::npos) {
      out.append(text.substr(i));
      break;
    }
    const std::string_view expression = text.substr(at + kMacro.size(), close - at - kMacro.size());
    out.append(text.substr(i, at - i));
    out.append("substr(").append(expression).append(", 1, ");
    out.append(std::to_string(kPgIndexedBytes)).append(")");
    i = close + 1;
  }
  return out;
}

// `text` on one line: each run of whitespace made one space (the
// statements hold no string literal where that would matter).
std::string OneLine(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) {
      out.push_back(c);
    } else if (!out.empty() && out.back() != ' ') {
      out.push_back(' ');
    }
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// Writes statements out: each {name} replaced, each PREFIX(x) expanded,
// on one line.
class Template {
 public:
  explicit Template(Names names) : names_(std::move(names)) {}
  // `more`: names of this statement alone.
  std::string operator()(std::string_view text, const Names& more = {}) const {
    Names names = names_;
    names.insert(names.end(), more.begin(), more.end());
    return OneLine(ExpandPrefixes(Substitute(text, names)));
  }

 private:
  const Names names_;
};

void SchemaStatements(const Template& sql, PgStatements* s) {
  // to_regclass: NULL when the table does not exist, without an error.
  s->find_meta = sql("SELECT to_regclass('{meta}') IS NOT NULL");
  s->find_tables = sql(R"sql(
      SELECT table_name::text FROM information_schema.tables
      WHERE table_schema = '{schema}' AND table_name IN ({table_list})
      ORDER BY table_name)sql");
  s->check_meta_columns = sql(R"sql(
      SELECT count(*) FROM information_schema.columns
      WHERE table_schema = '{schema}' AND table_name = 'meta'
        AND ((column_name = 'name' AND data_type = 'text')
          OR (column_name = 'value' AND data_type = 'bytea')))sql");
  s->read_format = sql("SELECT value FROM {meta} WHERE name = convert_from($1, 'UTF8')");
  s->retag_format =
      sql("UPDATE {meta} SET value = '{format}'::bytea "
          "WHERE name = '{format_name}' AND value = '{format_before_packing}'::bytea");
  s->lock_creation = sql("SELECT pg_advisory_xact_lock(hashtext('percolite:{schema}'))");
  s->create = sql(R"sql(
      CREATE SCHEMA IF NOT EXISTS {quoted_schema};
      CREATE TABLE {meta} (name text PRIMARY KEY, value bytea NOT NULL);
      CREATE TABLE {clock} (id smallint PRIMARY KEY CHECK (id = 1), ts bigint NOT NULL);
      INSERT INTO {clock} VALUES (1, 0);
      CREATE TABLE {cells} (key bytea NOT NULL, ts bigint NOT NULL, state smallint NOT NULL,
                            value bytea NOT NULL, purged_ts bigint);
      CREATE INDEX cells_key ON {cells} (PREFIX(key), ts);
      CREATE TABLE {notify} (nkey bytea NOT NULL, stamp bigint NOT NULL);
      CREATE UNIQUE INDEX notify_key ON {notify} (sha256(nkey));
      CREATE INDEX notify_order ON {notify} (PREFIX(nkey));
      CREATE TABLE {acks} (key bytea NOT NULL, ts bigint NOT NULL);
      CREATE UNIQUE INDEX acks_key ON {acks} (sha256(key));
      CREATE INDEX cells_purged ON {cells} (purged_ts) WHERE purged_ts IS NOT NULL;
      CREATE TABLE {garbage} (key bytea NOT NULL, ts bigint NOT NULL);
      CREATE INDEX garbage_ts ON {garbage} (ts);
      CREATE TABLE {handles} (id bytea PRIMARY KEY, horizon bigint NOT NULL,
                              seen timestamptz NOT NULL, token bytea);
      INSERT INTO {meta} VALUES ('observed', ''::bytea), ('{format_name}', '{format}'::bytea);
      )sql");
}

void ReadStatements(const Template& sql, PgStatements* s) {
  s->read_clock = sql("SELECT ts FROM {clock} WHERE id = 1");
  s->server_clock = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8";
  s->replication =
      "SELECT current_setting('synchronous_standby_names'), "
      "(SELECT count(*) FROM pg_stat_replication)::int8";
  s->standby_waits =
      "SELECT count(*)::int8, coalesce((extract(epoch FROM clock_timestamp() - "
      "min(state_change)) * 1000)::int8, 0) FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
      "AND application_name = current_setting('application_name')";
  s->get = sql(R"sql(
      SELECT state, value FROM {cells}
      WHERE PREFIX(key) = PREFIX($1::bytea) AND key = $1
        AND ts <= $2 AND (purged_ts IS NULL OR purged_ts > $2)
      ORDER BY ts DESC LIMIT 1)sql");
  for (int exclusive = 0; exclusive < 2; ++exclusive) {
    for (int bounded = 0; bounded < 2; ++bounded) {
      s->visit[exclusive][bounded] = sql(
          R"sql(
          SELECT DISTINCT ON (PREFIX(key), key) key, state, value FROM {cells}
          WHERE PREFIX(key) >= PREFIX($1::bytea) AND key {after} $1
            AND ts <= $2 AND (purged_ts IS NULL OR purged_ts > $2)
            {bound}
          ORDER BY PREFIX(key), key, ts DESC LIMIT $3)sql",
          {{"after", exclusive ? ">" : ">="},
           {"bound", bounded ? "AND PREFIX(key) <= PREFIX($4::bytea) AND key < $4" : ""}});
    }
  }
  s->notification_stamp =
      sql("SELECT stamp FROM {notify} WHERE sha256(nkey) = sha256($1) AND nkey = $1");
  s->read_observed = sql("SELECT value FROM {meta} WHERE name = 'observed'");
  s->write_observed = sql("UPDATE {meta} SET value = $1 WHERE name = 'observed'");
  s->count_notifications = sql("SELECT count(*) FROM {notify}");
  s->scan_notifications = sql(R"sql(
      SELECT nkey, stamp FROM {notify}
      WHERE PREFIX(nkey) >= PREFIX($1::bytea) AND nkey > $1
      ORDER BY PREFIX(nkey), nkey LIMIT $2)sql");
  s->notification_keys = sql("SELECT nkey FROM {notify}");
}

void CommitStatements(const Template& sql, PgStatements* s) {
  s->lock_clock_and_observed = sql(R"sql(
      SELECT c.ts, m.value FROM {clock} c, {meta} m
      WHERE c.id = 1 AND m.name = 'observed' FOR UPDATE OF c)sql");
  // Per key, its newest version through cells_key (newest first): never a
  // join over a scan of cells, which a freshly grown table's statistics can
  // make the planner prefer.
  s->newest_versions = sql(R"sql(
      SELECT u.k, v.ts FROM unnest($1::bytea[]) AS u(k)
      CROSS JOIN LATERAL (
        SELECT c.ts FROM {cells} c
        WHERE PREFIX(c.key) = PREFIX(u.k) AND c.key = u.k AND c.purged_ts IS NULL
        ORDER BY PREFIX(c.key) DESC, c.ts DESC LIMIT 1) AS v)sql");
  s->read_acks = sql(R"sql(
      SELECT a.key, a.ts FROM unnest($1::bytea[]) AS u(k)
      JOIN {acks} a ON sha256(a.key) = sha256(u.k) AND a.key = u.k)sql");
  s->read_notifications = sql(R"sql(
      SELECT n.nkey, n.stamp FROM unnest($1::bytea[]) AS u(k)
      JOIN {notify} n ON sha256(n.nkey) = sha256(u.k) AND n.nkey = u.k)sql");
  s->insert_cells = sql(R"sql(
      INSERT INTO {cells} (key, ts, state, value)
      SELECT k, t, s::smallint, v
      FROM unnest($1::bytea[], $2::int8[], $3::int8[], $4::bytea[]) AS u(k, t, s, v))sql");
  // A version keeps the earliest purge's ts, and a purge covers only the
  // versions written before it.
  s->purge_keys = sql(R"sql(
      UPDATE {cells} c SET purged_ts = p.ts
      FROM (SELECT key, min(ts) AS ts FROM unnest($1::bytea[], $2::int8[]) AS u(key, ts)
            GROUP BY key) AS p
      WHERE PREFIX(c.key) = PREFIX(p.key) AND c.key = p.key AND c.ts < p.ts
        AND (c.purged_ts IS NULL OR c.purged_ts > p.ts))sql");
  s->purge_range = sql(R"sql(
      UPDATE {cells} SET purged_ts = $3
      WHERE PREFIX(key) >= PREFIX($1::bytea) AND PREFIX(key) <= PREFIX($2::bytea)
        AND key >= $1 AND key < $2 AND ts < $3
        AND (purged_ts IS NULL OR purged_ts > $3))sql");
  s->delete_notifications = sql(R"sql(
      DELETE FROM {notify} n USING unnest($1::bytea[]) AS u(k)
      WHERE sha256(n.nkey) = sha256(u.k) AND n.nkey = u.k)sql");
  s->upsert_notifications = sql(R"sql(
      INSERT INTO {notify} SELECT * FROM unnest($1::bytea[], $2::int8[])
      ON CONFLICT ((sha256(nkey))) DO UPDATE SET stamp = excluded.stamp)sql");
  s->upsert_acks = sql(R"sql(
      INSERT INTO {acks} SELECT * FROM unnest($1::bytea[], $2::int8[])
      ON CONFLICT ((sha256(key))) DO UPDATE SET ts = excluded.ts)sql");
  s->insert_garbage = sql("INSERT INTO {garbage} SELECT * FROM unnest($1::bytea[], $2::int8[])");
  s->advance_clock = sql("UPDATE {clock} SET ts = $1 WHERE id = 1");
  s->notify_commit = sql("SELECT pg_notify('{channel}', 'c')");
  s->end_session =
      sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
          "WHERE pid = $1::int8::int AND backend_start::text = $2::text");
  s->session_started =
      sql("SELECT backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()");
  s->lock_clock = sql("SELECT ts FROM {clock} WHERE id = 1 FOR UPDATE");
  s->read_token = sql("SELECT token FROM {handles} WHERE id = $1");
}

void CollectionStatements(const Template& sql, PgStatements* s) {
  s->publish = sql(R"sql(
      INSERT INTO {handles} VALUES ($1, $2, clock_timestamp(), NULL)
      ON CONFLICT (id) DO UPDATE SET horizon = excluded.horizon, seen = clock_timestamp())sql");
  s->publish_with_token = sql(R"sql(
      INSERT INTO {handles} VALUES ($1, $2, clock_timestamp(), $3)
      ON CONFLICT (id) DO UPDATE SET horizon = excluded.horizon, seen = clock_timestamp(),
                                     token = excluded.token)sql");
  s->forget_handle = sql("DELETE FROM {handles} WHERE id = $1");
  // h: the least horizon of the handles seen lately; g: the versions listed
  // as superseded (or tombstones) at or before it; gone: those versions
  // deleted (state 1, kPgDeleted: a tombstone); purged: the versions purged
  // at or before it.
  // Each garbage row names one key: found through cells_key, never by a
  // scan of cells, which a freshly grown table's statistics can make the
  // planner prefer.
  s->collect_settings = sql(R"sql(
      SELECT set_config('synchronous_commit', 'off', true),
             set_config('enable_hashjoin', 'off', true),
             set_config('enable_mergejoin', 'off', true))sql");
  s->collect = sql(R"sql(
      WITH h AS (SELECT min(horizon) AS ts FROM {handles}
                 WHERE seen > clock_timestamp() - interval '{lease_seconds} seconds'),
      g AS (DELETE FROM {garbage} WHERE ts <= (SELECT ts FROM h) RETURNING key, ts),
      gone AS (DELETE FROM {cells} c USING g
               WHERE PREFIX(c.key) = PREFIX(g.key) AND c.key = g.key
                 AND (c.ts < g.ts OR (c.ts = g.ts AND c.state = 1))
               RETURNING c.state),
      purged AS (DELETE FROM {cells} WHERE purged_ts <= (SELECT ts FROM h) RETURNING 1)
      SELECT (SELECT count(*) FROM gone WHERE state = 1), (SELECT count(*) FROM purged))sql");
}

}  // namespace

PgStatements::PgStatements(const std::string& schema, int handle_lease_seconds)
    : channel("percolite_" + schema) {
  std::string table_list;
  for (const char* table : kPgTables) {
    table_list += std::string(table_list.empty() ? "'" : ", '") + table + "'";
  }
  Names names = {
      {"schema", schema},
      {"quoted_schema", "\"" + schema + "\""},
      {"table_list", table_list},
      {"channel", channel},
      {"lease_seconds", std::to_string(handle_lease_seconds)},
      {"format_name", std::string(kPgFormatName)},
      {"format", std::string(kPgFormat)},
      {"format_before_packing", std::string(kPgFormatBeforePacking)},
  };
  for (const char* table : kPgTables) names.emplace_back(table, "\"" + schema + "\"." + table);
  const Template sql(std::move(names));
  SchemaStatements(sql, this);
  ReadStatements(sql, this);
  CommitStatements(sql, this);
  CollectionStatements(sql, this);
  listen = sql("LISTEN {channel}");
  notify_waiter = sql("SELECT pg_notify('{channel}', 'w')");
}

}  // namespace percolite
