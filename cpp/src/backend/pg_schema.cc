// pg_schema.cc: finding the store in its schema, checking that it is a
// percolite store of this format, and creating it (pg_backend.h).
#include <optional>
#include <string>

#include "pg_backend.h"

namespace percolite {
namespace {

// What the schema holds: nullopt for a store of this format, "" for nothing
// of percolite's (a store may be created there), or else why it cannot be
// opened (kInvalidArgument). Throws kCorruption for a store missing tables.
std::optional<std::string> FindStore(PGconn* conn, const PgStatements& sql,
                                     const PgTarget& target) {
  const std::string& schema = target.schema;
  PgResult exists = PgExec(conn, sql.find_meta, "looking for the store", target);
  PgResult found = PgExec(conn, sql.find_tables, "looking for the store", target);
  if (exists.bytes(0, 0)[0] == 0) {
    if (found.rows() == 0) return std::string();
    return "schema " + schema + " holds a table named like one of percolite's (" +
           std::string(found.bytes(0, 0)) +
           ") but no percolite store: choose another schema (?schema=NAME in the target)";
  }
  PgResult columns = PgExec(conn, sql.check_meta_columns, "checking the store's tables", target);
  if (columns.int8(0, 0) != 2) {
    return "the table " + schema +
           ".meta is not a percolite store's (it has other columns): choose another schema "
           "(?schema=NAME in the target)";
  }
  PgParams name;
  name.Bytes(kPgFormatName);
  PgResult format = PgExec(conn, sql.read_format, name, "reading the store's format", target);
  if (format.rows() == 0) {
    return "the table " + schema +
           ".meta is not a percolite store's (it has no format record): choose another "
           "schema (?schema=NAME in the target)";
  }
  if (format.bytes(0, 0) == kPgFormatBeforePacking) {
    // Its single-entry queue records read as they are: only the tag changes,
    // so a version that knows only the old format refuses the store from now.
    PgExec(conn, sql.retag_format, "upgrading the store's format", target);
  } else if (format.bytes(0, 0) != kPgFormat) {
    return "the store in schema " + schema + " has format '" + std::string(format.bytes(0, 0)) +
           "'; this version of percolite reads format " + std::string(kPgFormat);
  }
  if (static_cast<size_t>(found.rows()) != std::size(kPgTables)) {
    throw Error(ErrorCode::kCorruption,
                "the store in schema " + schema + " of '" + target.display +
                    "' lacks some of its tables (it has " + std::to_string(found.rows()) + " of " +
                    std::to_string(std::size(kPgTables)) +
                    "): were they dropped? restore the schema from a backup");
  }
  return std::nullopt;
}

}  // namespace

void PgBackend::CreateOrCheckSchema(PGconn* conn, bool create) {
  std::optional<std::string> problem = FindStore(conn, sql_, target_);
  if (!problem) return;
  if (!problem->empty()) throw Error(ErrorCode::kInvalidArgument, *problem);
  if (!create) {
    throw Error(ErrorCode::kStorage, "no percolite store in schema " + target_.schema + " of '" +
                                         target_.display + "', and create=False");
  }
  // Created in one transaction, under a lock, so openers racing to create it
  // take turns and the second finds it whole.
  PgExec(conn, "BEGIN", "creating the store", target_);
  try {
    PgExec(conn, sql_.lock_creation, "creating the store", target_);
    problem = FindStore(conn, sql_, target_);
    if (problem && problem->empty()) {
      PgExecScript(conn, sql_.create, "creating the store", target_);
    } else if (problem) {
      throw Error(ErrorCode::kInvalidArgument, *problem);
    }
    PgExec(conn, "COMMIT", "creating the store", target_);
  } catch (...) {
    PgRollback(conn);
    throw;
  }
}

std::vector<std::string> PgBackend::VerifyStructure() {
  CheckUsable();
  // The server keeps its own pages and checksums; what percolite can check
  // is that the store is one of its format (checked at open, and again here).
  PgPool::Lease lease = pool_.Borrow();
  CreateOrCheckSchema(lease.get(), /*create=*/false);
  return {};
}

}  // namespace percolite
