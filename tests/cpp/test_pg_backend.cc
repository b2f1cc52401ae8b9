// What is particular to the postgresql backend (backend/pg_backend.h): its
// targets, its errors, and several handles on one store as several machines
// would hold them. The conformance tests run it like every backend when a
// test server is given (PERCOLITE_TEST_POSTGRES; scripts/test.sh starts one).
#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/pg_backend.h"
#include "percolite/backend.h"
#include "percolite/encoding.h"
#include "percolite/open_backend.h"
#include "percolite/pg_target.h"
#include "test_util.h"

using percolite::BackendOptions;
using percolite::ErrorCode;
using percolite::HidePasswords;
using percolite::Mutation;
using percolite::OpenBackend;
using percolite::ParsePgTarget;
using percolite::WorkWatch;
using percolite_test::ErrorCodeOf;
using percolite_test::FastOptions;
using percolite_test::HaveTestPostgres;
using percolite_test::MessageOf;
using percolite_test::ReadNow;
using percolite_test::SetOf;
using percolite_test::TempDir;
using percolite_test::TestPostgres;

namespace {

// Runs SQL on the test server.
void RunSql(const std::string& sql) {
  PGconn* conn = PQconnectdb(TestPostgres().c_str());
  REQUIRE(PQstatus(conn) == CONNECTION_OK);
  PGresult* result = PQexec(conn, sql.c_str());
  const ExecStatusType status = PQresultStatus(result);
  INFO(PQerrorMessage(conn));
  CHECK((status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK));
  PQclear(result);
  PQfinish(conn);
}

}  // namespace

TEST_CASE("A postgresql target keeps the schema for percolite and hides the password",
          "[backend][postgresql]") {
  const auto target = ParsePgTarget("postgresql://me:s3cret@db.example:5433/app?schema=jobs");
  CHECK(target.schema == "jobs");
  CHECK(target.conninfo == "postgresql://me:s3cret@db.example:5433/app");
  CHECK(target.display == "postgresql://me:***@db.example:5433/app?schema=jobs");
  CHECK(ParsePgTarget("postgres://h/db").schema == "percolite");
  const auto with_password = ParsePgTarget("postgresql://me@h/db?password=s3cret&sslmode=disable");
  CHECK(with_password.display == "postgresql://me@h/db?password=***&sslmode=disable");
  CHECK(with_password.conninfo.find("sslmode=disable") != std::string::npos);
  // libpq's own check: an unknown parameter is named.
  CHECK(MessageOf([] { ParsePgTarget("postgresql://h/db?colour=blue"); }).find("colour") !=
        std::string::npos);
  CHECK(ErrorCodeOf([] { ParsePgTarget("postgresql://h/db?schema=Bad-Name"); }) ==
        ErrorCode::kInvalidArgument);
  CHECK(ParsePgTarget("postgresql://h/db?poll_interval=0.5").poll_interval == 0.5);
  CHECK(ParsePgTarget("postgresql://h/db?poll_interval=0.5").conninfo == "postgresql://h/db");
  CHECK(ParsePgTarget("postgresql://h/db").poll_interval == 0);
  for (const char* bad : {"0", "-1", "nan", "x", "7200"}) {
    CHECK(MessageOf([&] {
            ParsePgTarget(std::string("postgresql://h/db?poll_interval=") + bad);
          }).find("poll_interval") != std::string::npos);
  }
  CHECK(ErrorCodeOf([] { OpenBackend("some/dir", "postgresql", FastOptions()); }) ==
        ErrorCode::kInvalidArgument);
}

TEST_CASE("A postgresql target reaches the primary and notices a vanished server",
          "[backend][postgresql]") {
  // What the URI leaves out, percolite adds; what it sets, it keeps.
  const auto plain = ParsePgTarget("postgresql://h/db");
  CHECK(plain.connect ==
        "postgresql://h/db?connect_timeout=10&keepalives=1&keepalives_idle=5&"
        "keepalives_interval=2&keepalives_count=3&tcp_user_timeout=10000&"
        "application_name=percolite.percolite");
  const auto own = ParsePgTarget(
      "postgresql://h/db?connect_timeout=3&keepalives_idle=30&application_name=mine&schema=s");
  CHECK(own.connect.find("application_name=mine") != std::string::npos);
  CHECK(own.connect.find("application_name=percolite") == std::string::npos);
  CHECK(ParsePgTarget("postgresql://h/db?schema=s").connect.find("application_name=percolite.s") !=
        std::string::npos);
  CHECK(own.connect.find("connect_timeout=3") != std::string::npos);
  CHECK(own.connect.find("connect_timeout=10") == std::string::npos);
  CHECK(own.connect.find("keepalives_idle=30") != std::string::npos);
  CHECK(own.connect.find("keepalives_idle=5") == std::string::npos);
  // Several hosts, in the authority or in host=: libpq must look for the primary.
  for (const char* several :
       {"postgresql://h1:5432,h2:5432/db", "postgresql://u@/db?host=/a,/b&port=5441,5442"}) {
    CHECK(ParsePgTarget(several).connect.find("target_session_attrs=read-write") !=
          std::string::npos);
  }
  CHECK(plain.connect.find("target_session_attrs") == std::string::npos);
  for (const char* writes : {"read-write", "primary"}) {
    const auto target =
        ParsePgTarget(std::string("postgresql://h1,h2/db?target_session_attrs=") + writes);
    const size_t at = target.connect.find(std::string("target_session_attrs=") + writes);
    CHECK(at != std::string::npos);
    CHECK(target.connect.find("target_session_attrs", at + 1) == std::string::npos);
  }
  for (const char* reads : {"any", "standby", "read-only", "prefer-standby"}) {
    const std::string message = MessageOf(
        [&] { ParsePgTarget(std::string("postgresql://h/db?target_session_attrs=") + reads); });
    CHECK(message.find(std::string("target_session_attrs=") + reads) != std::string::npos);
    CHECK(message.find("primary") != std::string::npos);
  }
  // How long a handle keeps trying: a setting of percolite's, not libpq's.
  CHECK(plain.reconnect_timeout == 30);
  const auto patient = ParsePgTarget("postgresql://h/db?reconnect_timeout=45");
  CHECK(patient.reconnect_timeout == 45);
  CHECK(patient.conninfo == "postgresql://h/db");
  for (const char* bad : {"0", "-1", "x", "61"}) {
    CHECK(MessageOf([&] {
            ParsePgTarget(std::string("postgresql://h/db?reconnect_timeout=") + bad);
          }).find("reconnect_timeout") != std::string::npos);
  }
  CHECK(MessageOf([] {
          ParsePgTarget("postgresql://h/db?reconnect_timeout=5&reconnect_timeout=6");
        }).find("twice") != std::string::npos);
}

TEST_CASE("One rule hides passwords: in a URI, its query, and libpq's key=value form",
          "[backend][postgresql]") {
  // A URI's user info, percent-encoded or not, and with a stray '@' or ':'.
  CHECK(HidePasswords("postgresql://me:s3cret@h:5433/db") == "postgresql://me:***@h:5433/db");
  CHECK(HidePasswords("postgres://me:s%40cr%3At@h/db") == "postgres://me:***@h/db");
  CHECK(HidePasswords("postgresql://me:p@ss:w@h/db?x=1") == "postgresql://me:***@h/db?x=1");
  CHECK(HidePasswords("postgresql://:s3cret@h") == "postgresql://:***@h");
  // A password= query parameter, its name percent-encoded as libpq allows.
  CHECK(HidePasswords("postgresql://h/db?password=s3cret&sslmode=disable") ==
        "postgresql://h/db?password=***&sslmode=disable");
  CHECK(HidePasswords("postgresql://h/db?sslmode=disable&pass%77ord=s%26cret") ==
        "postgresql://h/db?sslmode=disable&pass%77ord=***");
  // libpq's key=value form: unquoted, quoted (with escapes), spaced.
  CHECK(HidePasswords("host=h password=s3cret dbname=db") == "host=h password=*** dbname=db");
  CHECK(HidePasswords("host=h password='s3 \\' cret' dbname=db") ==
        "host=h password=*** dbname=db");
  CHECK(HidePasswords("password = s3cret") == "password = ***");
  CHECK(HidePasswords("host=h password=") == "host=h password=***");
  // No password: everything as written.
  for (const char* plain :
       {"postgresql://me@h:5433/db?schema=jobs", "postgresql://h/db?user=me&sslmode=disable",
        "host=h user=me dbname=db old_password=x", "/a/store/dir", "",
        "password authentication failed for user \"me\""}) {
    CHECK(HidePasswords(plain) == plain);
  }
  // Malformed URIs still lose their password.
  CHECK(HidePasswords("postgresql://u:SECRETpw@[::1/db") == "postgresql://u:***@[::1/db");
  CHECK(HidePasswords("postgresql://u:SECRET%zzpw@127.0.0.1:1/db") ==
        "postgresql://u:***@127.0.0.1:1/db");
  // In a message, a URI ends at whitespace.
  CHECK(HidePasswords("cannot open postgresql://u:pw@h now, password=x") ==
        "cannot open postgresql://u:***@h now, password=***");
  // The target's display and its errors follow the same rule.
  CHECK(ParsePgTarget("postgresql://me:s3cret@h/db?password=s3cret").display ==
        "postgresql://me:***@h/db?password=***");
  const std::string refused = MessageOf([] { ParsePgTarget("mysql://me:s3cret@h/db"); });
  CHECK(refused.find("mysql://me:***@h/db") != std::string::npos);
  const std::string malformed =
      MessageOf([] { ParsePgTarget("postgresql://me:s3cret@h/db?colour=blue"); });
  CHECK(malformed.find("postgresql://me:***@h/db?colour=blue") != std::string::npos);
  CHECK(malformed.find("s3cret") == std::string::npos);
}

TEST_CASE("Nothing listening is a storage error naming the server, without the password",
          "[backend][postgresql]") {
  // Port 1 of the loopback address: closed, so the connection is refused at once.
  const auto began = std::chrono::steady_clock::now();
  const std::string message =
      MessageOf([] { OpenBackend("postgresql://me:s3cret@127.0.0.1:1/db", "", FastOptions()); });
  CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(10));
  CHECK(message.find("cannot connect") != std::string::npos);
  CHECK(message.find("127.0.0.1:1") != std::string::npos);
  CHECK(message.find("s3cret") == std::string::npos);
  CHECK(ErrorCodeOf([] { OpenBackend("postgresql://127.0.0.1:1/db", "", FastOptions()); }) ==
        ErrorCode::kStorage);
}

TEST_CASE("Handles on one postgresql store share it as processes on several machines would",
          "[backend][postgresql]") {
  if (!HaveTestPostgres()) return;
  TempDir dir;
  const std::string target = percolite_test::TargetFor(dir, "postgresql");
  BackendOptions no_create = FastOptions();
  no_create.create = false;
  CHECK(MessageOf([&] { OpenBackend(target, "", no_create); }).find("create=False") !=
        std::string::npos);

  auto a = OpenBackend(target, "", FastOptions());
  auto b = OpenBackend(target, "", no_create);
  auto watch = b->WatchForWork();
  const uint64_t start_ts = a->BeginSnapshot()->start_ts();
  REQUIRE(a->Commit(start_ts, {SetOf("r", "from a")}, {}).status.ok());
  CHECK(ReadNow(*b, "r") == "from a");
  // b's writer and a's take turns on the counter: b, with a snapshot older
  // than a's commit, loses the write-write conflict.
  const auto late = b->Commit(start_ts, {SetOf("r", "from b")}, {});
  CHECK(late.status.code() == ErrorCode::kConflict);
  // A commit by one handle wakes the other's watch (LISTEN/NOTIFY).
  bool woke = false;
  for (int i = 0; i < 50 && !woke; ++i) {
    woke = (watch->Wait(100) & WorkWatch::kCommitted) != 0;
  }
  CHECK(woke);
  REQUIRE(b->SignalWaiting());
  auto other = a->WatchForWork();
  REQUIRE(b->SignalWaiting());
  bool signalled = false;
  for (int i = 0; i < 50 && !signalled; ++i) {
    signalled = (other->Wait(100) & WorkWatch::kWaiterSignal) != 0;
  }
  CHECK(signalled);
  watch.reset();
  other.reset();
  a->ReleaseHandle();
  b->ReleaseHandle();
}

TEST_CASE("With poll_interval, workers poll instead of listening", "[backend][postgresql]") {
  if (!HaveTestPostgres()) return;
  TempDir dir;
  // A second between polls: long enough that a busy machine never lets one
  // pass between the two waits below.
  const std::string target = percolite_test::TargetFor(dir, "postgresql") + "&poll_interval=1";
  auto backend = OpenBackend(target, "", FastOptions());
  CHECK_FALSE(backend->SignalWaiting());  // no channel
  auto watch = backend->WatchForWork();
  const auto began = std::chrono::steady_clock::now();
  CHECK(watch->Wait(30000) == WorkWatch::kCommitted);  // the interval passed, not the timeout
  const auto waited = std::chrono::steady_clock::now() - began;
  CHECK(waited >= std::chrono::milliseconds(900));
  CHECK(waited < std::chrono::milliseconds(30000));
  CHECK(watch->Wait(10) == WorkWatch::kTimeout);
  watch->Interrupt();
  CHECK((watch->Wait(5000) & WorkWatch::kInterrupted) != 0);
  REQUIRE(backend->Commit(backend->BeginSnapshot()->start_ts(), {SetOf("r", "v")}, {}).status.ok());
  CHECK(ReadNow(*backend, "r") == "v");
  watch.reset();
  backend->ReleaseHandle();
}

TEST_CASE("A purge in the batch of the write it purges removes it", "[backend][postgresql]") {
  if (!HaveTestPostgres()) return;
  TempDir dir;
  auto backend = OpenBackend(percolite_test::TargetFor(dir, "postgresql"), "", FastOptions());
  for (int round = 0; round < 20; ++round) {
    const std::string row = "k" + std::to_string(round);
    const uint64_t start_ts = backend->BeginSnapshot()->start_ts();
    std::atomic<int> done{0};
    // Submitted together, so the writer takes them into one batch (most rounds).
    backend->CommitAsync(start_ts, {SetOf(row, "v")}, {},
                         [&](const percolite::CommitResult& r) { done += r.status.ok(); });
    Mutation purge{percolite::EncodeCellKey({row, "f", "q"})};
    purge.purge = true;
    backend->CommitAsync(start_ts, {purge}, {},
                         [&](const percolite::CommitResult& r) { done += r.status.ok(); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (done < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(done == 2);
    CHECK(ReadNow(*backend, row) == std::nullopt);
  }
  backend->ReleaseHandle();
}

TEST_CASE("A schema holding someone else's tables is refused, never reinterpreted",
          "[backend][postgresql]") {
  if (!HaveTestPostgres()) return;
  RunSql(
      "CREATE SCHEMA IF NOT EXISTS theirs; CREATE TABLE IF NOT EXISTS theirs.meta (id int, note "
      "text)");
  const std::string uri = TestPostgres();
  const std::string target =
      uri + (uri.find('?') == std::string::npos ? "?" : "&") + "schema=theirs";
  const std::string message = MessageOf([&] { OpenBackend(target, "", FastOptions()); });
  CHECK(message.find("not a percolite store") != std::string::npos);
  CHECK(ErrorCodeOf([&] { OpenBackend(target, "", FastOptions()); }) ==
        ErrorCode::kInvalidArgument);
}

namespace {

// Holds the counter row of a store's schema locked from a connection of its
// own, as another process's writer mid-batch would: this handle's writer
// takes its next batch and waits for the lock, and the commits submitted
// meanwhile queue up into the batch after it.
class ClockHolder {
 public:
  explicit ClockHolder(const std::string& schema) : conn_(PQconnectdb(TestPostgres().c_str())) {
    REQUIRE(PQstatus(conn_) == CONNECTION_OK);
    Exec("BEGIN");
    Exec("SELECT ts FROM \"" + schema + "\".clock WHERE id = 1 FOR UPDATE");
  }
  ~ClockHolder() { PQfinish(conn_); }
  void Release() { Exec("COMMIT"); }

 private:
  void Exec(const std::string& sql) {
    PGresult* result = PQexec(conn_, sql.c_str());
    const ExecStatusType status = PQresultStatus(result);
    INFO(PQerrorMessage(conn_));
    REQUIRE((status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK));
    PQclear(result);
  }
  PGconn* conn_;
};

// Commits submitted together, and their results once all are decided.
class Submitted {
 public:
  void Submit(percolite::Backend& backend, uint64_t start_ts, std::vector<Mutation> mutations) {
    const size_t index = results_.size();
    results_.emplace_back();
    backend.CommitAsync(start_ts, std::move(mutations), {},
                        [this, index](const percolite::CommitResult& r) {
                          results_[index] = r;
                          ++done_;
                        });
  }
  const std::vector<percolite::CommitResult>& Wait() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (done_ < results_.size() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(done_ == results_.size());
    return results_;
  }

 private:
  std::vector<percolite::CommitResult> results_;  // sized before any callback runs
  std::atomic<size_t> done_{0};
};

// Commits each of `commits` (all from one snapshot, taken first) in one
// batch of the writer, submitted while it waits for the counter's lock with
// a commit before them; their results, in order.
std::vector<percolite::CommitResult> CommitInOneBatch(percolite::Backend& backend,
                                                      const std::string& target,
                                                      std::vector<std::vector<Mutation>> commits) {
  const uint64_t start_ts = backend.BeginSnapshot()->start_ts();
  ClockHolder holder(ParsePgTarget(target).schema);
  Submitted first;
  first.Submit(backend, start_ts, {SetOf("before", "0")});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the writer waits for the lock
  const uint64_t batches = backend.Stats().batches;
  Submitted batch;
  for (auto& mutations : commits) batch.Submit(backend, start_ts, std::move(mutations));
  holder.Release();
  REQUIRE(first.Wait()[0].status.ok());
  std::vector<percolite::CommitResult> results = batch.Wait();
  CHECK(backend.Stats().batches == batches + 2);  // the first, then the rest in one
  return results;
}

}  // namespace

TEST_CASE("A batch holding a conflicting commit commits the others and reports the conflict",
          "[backend][postgresql]") {
  if (!HaveTestPostgres()) return;
  TempDir dir;
  const std::string target = percolite_test::TargetFor(dir, "postgresql");
  auto backend = OpenBackend(target, "", FastOptions());
  const auto results = CommitInOneBatch(*backend, target,
                                        {{SetOf("a", "1")},
                                         {SetOf("a", "2")},  // a write since its start: conflict
                                         {SetOf("b", "3")}});
  CHECK(results[0].status.ok());
  CHECK(results[1].status.code() == ErrorCode::kConflict);
  CHECK(results[2].status.ok());
  CHECK(results[2].commit_ts == results[0].commit_ts + 1);
  CHECK(ReadNow(*backend, "a") == "1");
  CHECK(ReadNow(*backend, "b") == "3");
  backend->ReleaseHandle();
}

TEST_CASE("On postgresql, the joinable records of one batch are stored as one, in order",
          "[backend][postgresql]") {
  if (!HaveTestPostgres()) return;
  TempDir dir;
  const std::string target = percolite_test::TargetFor(dir, "postgresql");
  auto backend = OpenBackend(target, "", FastOptions());
  const auto results = CommitInOneBatch(*backend, target, percolite_test::JoinableBatch());
  percolite_test::CheckJoinedBatch(*backend, results);
  backend->ReleaseHandle();
}

TEST_CASE("A server error in the middle of a batch fails only its commit",
          "[backend][postgresql]") {
  if (!HaveTestPostgres()) return;
  TempDir dir;
  const std::string target = percolite_test::TargetFor(dir, "postgresql");
  auto backend = OpenBackend(target, "", FastOptions());
  const std::string schema = "\"" + ParsePgTarget(target).schema + "\"";
  // The server refuses to store the value "boom": the batch holding it fails
  // at its writes, after its reads went through.
  RunSql("CREATE FUNCTION " + schema +
         ".refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
         "IF NEW.value = convert_to('boom', 'UTF8') THEN RAISE EXCEPTION 'no boom here'; END IF; "
         "RETURN NEW; END $$; CREATE TRIGGER refuse BEFORE INSERT ON " +
         schema + ".cells FOR EACH ROW EXECUTE FUNCTION " + schema + ".refuse()");
  const uint64_t start_ts = backend->BeginSnapshot()->start_ts();
  ClockHolder holder(ParsePgTarget(target).schema);
  Submitted first;
  first.Submit(*backend, start_ts, {SetOf("before", "0")});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Submitted batch;
  batch.Submit(*backend, start_ts, {SetOf("a", "1")});
  batch.Submit(*backend, start_ts, {SetOf("x", "boom")});
  batch.Submit(*backend, start_ts, {SetOf("b", "3")});
  holder.Release();
  REQUIRE(first.Wait()[0].status.ok());
  const auto& results = batch.Wait();
  CHECK(results[0].status.ok());
  CHECK(results[1].status.code() == ErrorCode::kStorage);
  CHECK(results[1].status.message().find("no boom here") != std::string::npos);
  CHECK(results[2].status.ok());
  CHECK(ReadNow(*backend, "a") == "1");
  CHECK(ReadNow(*backend, "x") == std::nullopt);
  CHECK(ReadNow(*backend, "b") == "3");
  // The writer's connection was left clean: later batches commit.
  REQUIRE(backend->Commit(backend->BeginSnapshot()->start_ts(), {SetOf("c", "4")}, {}).status.ok());
  CHECK(ReadNow(*backend, "c") == "4");
  backend->ReleaseHandle();
}

TEST_CASE("Gets in key order read what the snapshot sees, whatever commits after it",
          "[backend][postgresql]") {
  if (!HaveTestPostgres()) return;
  TempDir dir;
  auto backend = OpenBackend(percolite_test::TargetFor(dir, "postgresql"), "", FastOptions());
  // Rows r000..r599: every third never written, every fifth deleted.
  auto row = [](int i) {
    std::string name = std::to_string(i);
    return "r" + std::string(3 - name.size(), '0') + name;
  };
  std::map<std::string, std::string> expected;
  std::vector<Mutation> writes, deletes;
  for (int i = 0; i < 600; ++i) {
    if (i % 3 == 0) continue;
    writes.push_back(SetOf(row(i), "v" + std::to_string(i)));
    if (i % 5 == 0) {
      deletes.push_back(Mutation{percolite_test::Key(row(i)), /*is_delete=*/true, ""});
    } else {
      expected[row(i)] = "v" + std::to_string(i);
    }
  }
  REQUIRE(backend->Commit(backend->BeginSnapshot()->start_ts(), writes, {}).status.ok());
  REQUIRE(backend->Commit(backend->BeginSnapshot()->start_ts(), deletes, {}).status.ok());
  auto snapshot = backend->BeginSnapshot();
  // Later commits: every row rewritten, the never-written ones too.
  std::vector<Mutation> later;
  for (int i = 0; i < 600; ++i) later.push_back(SetOf(row(i), "later"));
  REQUIRE(backend->Commit(backend->BeginSnapshot()->start_ts(), later, {}).status.ok());
  auto expect = [&](int i) {
    auto it = expected.find(row(i));
    return it == expected.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  // Ascending, every key; then every seventh; then back down; then again.
  for (int i = 0; i < 600; ++i) CHECK(snapshot->Get(percolite_test::Key(row(i))) == expect(i));
  for (int i = 0; i < 600; i += 7) CHECK(snapshot->Get(percolite_test::Key(row(i))) == expect(i));
  for (int i = 599; i >= 0; i -= 3) CHECK(snapshot->Get(percolite_test::Key(row(i))) == expect(i));
  for (int i = 1; i < 600; i += 2) CHECK(snapshot->Get(percolite_test::Key(row(i))) == expect(i));
  // A key between two rows, and one past them all.
  CHECK(snapshot->Get(percolite::EncodeCellKey({"r0015", "f", "q"})) == std::nullopt);
  CHECK(snapshot->Get(percolite::EncodeCellKey({"s", "f", "q"})) == std::nullopt);
  CHECK(ReadNow(*backend, row(3)) == "later");
  backend->ReleaseHandle();
}

TEST_CASE("Settling a lost batch ends only the session that sent it, on the server that ran it",
          "[backend][postgresql]") {
  if (!HaveTestPostgres()) return;
  const percolite::PgTarget target = ParsePgTarget(TestPostgres());
  const percolite::PgStatements sql("settle_session", 60);
  PGconn* sender = percolite::PgConnect(target, percolite::SyncMode::kFull);
  PGconn* settler = percolite::PgConnect(target, percolite::SyncMode::kFull);
  const percolite::PgResult started =
      percolite::PgExec(sender, sql.session_started, "reading the start", target);
  REQUIRE(started.rows() == 1);
  const std::string start(started.bytes(0, 0));
  const auto end = [&](const std::string& when) {
    percolite::PgParams session;
    session.Int8(static_cast<uint64_t>(PQbackendPID(sender))).Bytes(when);
    percolite::PgExec(settler, sql.end_session, session, "ending", target);
  };
  const auto alive = [&] {
    PGresult* result = PQexec(sender, "SELECT 1");
    const bool ok = PQresultStatus(result) == PGRES_TUPLES_OK;
    PQclear(result);
    return ok;
  };
  // The same pid with another start is another session (after a restart or
  // on a promoted standby): left alone.
  end("2001-01-01 00:00:00+00");
  CHECK(alive());
  end(start);
  for (int i = 0; i < 100 && alive(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK_FALSE(alive());
  PQfinish(sender);
  PQfinish(settler);
}

TEST_CASE("A session whose client vanished mid-transaction is ended by the server",
          "[backend][postgresql]") {
  if (!HaveTestPostgres()) return;
  const percolite::PgTarget target = ParsePgTarget(TestPostgres());
  PGconn* conn = percolite::PgConnect(target, percolite::SyncMode::kFull);
  const auto show = [&](const char* name) {
    return std::string(
        percolite::PgExec(conn, std::string("SHOW ") + name, "showing", target).bytes(0, 0));
  };
  // Locks held by a writer cut off mid-batch are released within seconds.
  CHECK(show("idle_in_transaction_session_timeout") == "5s");
  CHECK(show("synchronous_commit") == "on");
  PQfinish(conn);
}
