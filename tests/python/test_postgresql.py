"""The postgresql backend as its users meet it: targets, errors, several
handles (as on several machines), worker groups killed or cut off by a
server restart, and the phrase count job on it.

The conformance tests run on postgresql like on every backend (the
``backend`` fixture, on the session's server); these are its own. Tests that
restart the server start a server of their own.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import percolite
import psycopg
import pytest
from _isolated import TESTS_DIR, load_fresh
from _postgres import temporary_postgres
from percolite._env import shown_target

COL = ("f", "q")


def test_a_postgresql_store_is_shared_by_handles_as_by_machines(postgres_server):
    target = f"{postgres_server.uri}&schema=shared_by_two"
    first = percolite.open(target)
    second = percolite.open(target, create=False)
    try:
        assert first.backend == "postgresql"
        assert first.capabilities["cross_process"] and first.capabilities["durable"]
        first.run(lambda tx: tx.set("r", COL, b"from the first"))
        tx = second.transaction()
        assert tx.get("r", COL) == b"from the first"
        tx.abort()
        stale = first.transaction()
        stale.get("r", COL)
        second.run(lambda tx: tx.set("r", COL, b"from the second"))
        stale.set("r", COL, b"late")
        with pytest.raises(percolite.CommitConflict):
            stale.commit()
    finally:
        first.close()
        second.close()


def test_postgresql_targets_that_cannot_work_are_clear_errors(postgres_server):
    with pytest.raises(ValueError, match="colour"):
        percolite.open(f"{postgres_server.uri}&colour=blue")
    with pytest.raises(ValueError, match="schema"):
        percolite.open(f"{postgres_server.uri}&schema=Not-A-Name")
    with pytest.raises(percolite.StorageError, match="create=False"):  # as for lmdb
        percolite.open(f"{postgres_server.uri}&schema=never_created", create=False)
    with pytest.raises(ValueError, match="given twice"):
        percolite.open(f"{postgres_server.uri}&schema=a&schema=b")
    for reserved in ("pg_mine", "information_schema"):
        with pytest.raises(ValueError, match="PostgreSQL's"):
            percolite.open(f"{postgres_server.uri}&schema={reserved}")
    with pytest.raises(ValueError, match="restored=True is for lmdb"):
        percolite.open(f"{postgres_server.uri}&schema=restored", restored=True)
    # libpq's key=value form where a URI belongs: refused, not made a directory.
    with pytest.raises(ValueError, match="key=value") as caught:
        percolite.open("host=localhost port=1 dbname=jobs password=s3cret")
    assert "s3cret" not in str(caught.value)
    # Upper-case schemes are schemes (libpq itself takes only lower case).
    with percolite.open(postgres_server.uri.replace("postgresql://", "POSTGRES://") + "&schema=up"):
        pass
    # A table of the same name that is not percolite's.
    with psycopg.connect(postgres_server.dsn, autocommit=True) as db:
        db.execute("CREATE SCHEMA IF NOT EXISTS someone_elses")
        db.execute("CREATE TABLE IF NOT EXISTS someone_elses.meta (id int, note text)")
    with pytest.raises(ValueError, match="not a percolite store"):
        percolite.open(f"{postgres_server.uri}&schema=someone_elses")
    with psycopg.connect(postgres_server.dsn, autocommit=True) as db:
        db.execute("CREATE SCHEMA IF NOT EXISTS their_cells")
        db.execute("CREATE TABLE IF NOT EXISTS their_cells.cells (id int)")
    with pytest.raises(ValueError, match=r"named like one of percolite's \(cells\)"):
        percolite.open(f"{postgres_server.uri}&schema=their_cells")
    # A store missing one of its tables is damaged, not new.
    percolite.open(f"{postgres_server.uri}&schema=half_dropped").close()
    with psycopg.connect(postgres_server.dsn, autocommit=True) as db:
        db.execute("DROP TABLE half_dropped.notify")
    with pytest.raises(percolite.CorruptionError, match="lacks some of its tables"):
        percolite.open(f"{postgres_server.uri}&schema=half_dropped")
    # Nothing listens on port 1 of the loopback address: refused at once.
    began = time.monotonic()
    with pytest.raises(percolite.StorageError, match="cannot connect") as caught:
        percolite.open("postgresql://me:s3cret@127.0.0.1:1/db")
    assert "s3cret" not in str(caught.value)
    assert time.monotonic() - began < 10
    # Nor when libpq cannot read the URI and quotes it back.
    for malformed in (
        "postgresql://u:SECRETpw@[::1]x/db",
        "postgresql://u:SECRET%zzpw@127.0.0.1:1/db",
        "postgresql://u:SECRETpw@[::1/db",
        "POSTGRESQL://u:SECRETpw@127.0.0.1:1/db?sslmode=nope",
    ):
        with pytest.raises((ValueError, percolite.Error)) as caught:
            percolite.open(malformed)
        assert "SECRET" not in str(caught.value), str(caught.value)


def test_a_wrong_password_is_a_clear_error_that_does_not_show_it(tmp_path):
    with temporary_postgres(tmp_path, password="right-one") as server:
        began = time.monotonic()
        with pytest.raises(percolite.StorageError, match="password authentication failed") as e:
            percolite.open(server.uri.replace("postgres@", "postgres:wrong-one@"))
        assert "wrong-one" not in str(e.value)
        assert time.monotonic() - began < 10
        right = server.uri.replace("postgres@", "postgres:right-one@") + "&schema=guarded"
        with percolite.open(right) as env:
            env.run(lambda tx: tx.set("r", COL, b"v"))
            assert "right-one" not in env.path


def test_status_and_errors_never_show_the_password(postgres_server, tmp_path):
    # Trust authentication ignores the password: it only has to stay unseen.
    target = f"{postgres_server.uri}&password=s3cret&schema=with_password"
    with percolite.open(target) as env:
        env.run(lambda tx: tx.set("r", COL, b"v"))
        assert "s3cret" not in env.path and "s3cret" not in repr(env)
        assert env.path == shown_target(target) == target.replace("s3cret", "***")
    status = subprocess.run(
        [sys.executable, "-m", "percolite", "status", target, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert "s3cret" not in status.stdout + status.stderr
    assert "with_password" in status.stdout


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # A URI's user info, percent-encoded or not, with a stray '@'.
        ("postgresql://me:s3cret@h:5433/db", "postgresql://me:***@h:5433/db"),
        ("postgres://me:s%40cr%3At@h/db", "postgres://me:***@h/db"),
        ("postgresql://me:p@ss@h/db", "postgresql://me:***@h/db"),
        # A password= query parameter (its name percent-encoded, as libpq allows).
        ("postgresql://h/db?password=s3cret&schema=x", "postgresql://h/db?password=***&schema=x"),
        (
            "postgresql://h/db?schema=x&pass%77ord=s%26cret",
            "postgresql://h/db?schema=x&pass%77ord=***",
        ),
        # libpq's key=value form, unquoted and quoted.
        ("host=h password=s3cret dbname=db", "host=h password=*** dbname=db"),
        ("host=h password='s3 \\' cret' dbname=db", "host=h password=*** dbname=db"),
        ("host=h password = s3cret", "host=h password = ***"),
        # No password: as written.
        ("postgresql://me@h/db?schema=x", "postgresql://me@h/db?schema=x"),
        ("host=h user=me dbname=db", "host=h user=me dbname=db"),
        # Malformed URIs lose their password too.
        ("postgresql://u:SECRETpw@[::1/db", "postgresql://u:***@[::1/db"),
        ("postgresql://u:SECRET%zzpw@127.0.0.1:1/db", "postgresql://u:***@127.0.0.1:1/db"),
    ],
)
def test_one_rule_hides_passwords_everywhere_they_are_shown(text, shown):
    from percolite import _core
    from percolite.exporters._postgres import _hide_password

    assert _core.hide_password(text) == shown
    # The exporters' DSNs and the commands' targets follow the same rule.
    assert _hide_password(text) == shown
    if "://" in text:
        assert shown_target(text) == shown


def _listening(dsn: str) -> int:
    with psycopg.connect(dsn) as db:
        return db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN percolite_%'"
        ).fetchone()[0]


def test_workers_listen_again_after_a_server_restart(tmp_path):
    app = percolite.App("relisten")
    seen = []

    @app.observer(COL)
    def observe(tx, row, column):
        seen.append(row)

    with temporary_postgres(tmp_path) as server:
        target = f"{server.uri}&schema=relisten"
        with percolite.open(target, app=app) as workers, percolite.open(target) as writer:
            workers.start_workers(1)
            deadline = time.monotonic() + 30
            while not _listening(server.dsn) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _listening(server.dsn) == 1
            server.restart()
            deadline = time.monotonic() + 30
            while not _listening(server.dsn) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _listening(server.dsn) == 1, "the workers listen again"
            writer.run(lambda tx: tx.set("after", COL, b"v"))
            workers.wait(timeout=30)
            assert seen == [b"after"]


def test_parked_work_names_a_command_that_works_when_pasted(postgres_server):
    app = percolite.App("parks")

    @app.observer(COL, max_attempts=1)
    def fails(tx, row, column):
        raise RuntimeError("always")

    target = f"{postgres_server.uri}&schema=parks"
    with percolite.open(target, app=app) as env:
        env.run(lambda tx: tx.set("r", COL, b"v"))
        env.start_workers(1)
        with pytest.raises(percolite.WorkParked) as caught:
            env.wait(timeout=60)
    message = str(caught.value)
    # Quoted for the shell: the URI's & would otherwise end the command.
    assert f"`percolite status '{env.path}'`" in message


def _increments_until(env, stop, done, errors):
    def increment(tx):
        tx.set("n", COL, str(int(tx.get("n", COL, b"0")) + 1))

    while not stop.is_set():
        try:
            env.run(increment, retries=None)
        except percolite.Error as e:  # reported, not swallowed
            errors.append(repr(e))
            return
        done.append(1)


def test_a_server_restart_mid_run_loses_nothing_and_applies_nothing_twice(tmp_path):
    with temporary_postgres(tmp_path) as server:
        env = percolite.open(f"{server.uri}&schema=restarted")
        stop, done, errors = threading.Event(), [], []
        threads = [
            threading.Thread(target=_increments_until, args=(env, stop, done, errors))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        time.sleep(0.5)
        before = len(done)
        server.restart()  # every connection cut, mid-commit for some
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        assert errors == []
        assert before > 0 and len(done) > before, "commits went on after the restart"
        tx = env.transaction()
        # Every increment a caller was told of is in, and none twice.
        assert int(tx.get("n", COL)) == len(done)
        tx.abort()
        # The restart shows as a reconnection to the same server, no failover.
        stats = env.stats()
        assert stats["reconnections"] >= 1 and stats["failovers"] == 0
        assert stats["server"] == f"{server.socket_dir}:{server.port}"
        assert stats["last_reconnection"]["cause"]
        # status() counts this process's reconnections at once, before its
        # metrics are flushed into the store.
        assert env.status()["server"]["reconnections"] >= stats["reconnections"]
        env.close()


def _worker_group(
    target: str, sink: str, clock: str | None = None, until_idle: bool = True
) -> subprocess.Popen:
    """``percolite worker ... --processes 2 --until-idle`` in a session of its
    own (as on another machine), the store given in the environment;
    ``clock``: its wall clock moved by that much (libfaketime's ``+180s``)."""
    env = {
        **os.environ,
        "PERCOLITE_DB": target,
        "PG_SINK": sink,
        "PG_SLOW": "0.2",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    command = [sys.executable, "-m", "percolite", "worker", "children.pg_groups_app:app"]
    command += ["--processes", "2", "--threads", "2"] + ["--until-idle"] * until_idle
    if clock is not None:
        command = ["faketime", "-f", clock, *command]
    return subprocess.Popen(
        command,
        cwd=TESTS_DIR,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _load_hot_updates(target: str, module, n_transactions: int, seed: int) -> dict[str, int]:
    """n transactions of 100 updates over 200 hot keys (40,000 for 400),
    through a loader; returns the expected sums."""
    rng = random.Random(seed)
    keys = [f"k{i:03}" for i in range(200)]
    weights = [1 / (i + 1) ** 1.1 for i in range(200)]
    expected: dict[str, int] = {}

    def add(tx, updates):
        module.hot.add(tx, updates)

    with percolite.open(target, app=module.app) as env, env.loader() as loader:
        for _ in range(n_transactions):
            updates: dict[str, int] = {}
            for key in rng.choices(keys, weights, k=100):
                updates[key] = updates.get(key, 0) + rng.randint(1, 9)
            for key, value in updates.items():
                expected[key] = expected.get(key, 0) + value
            loader.submit(add, updates)
    return expected


def _sink_rows(dsn: str) -> int:
    with psycopg.connect(dsn) as db:
        if db.execute("SELECT to_regclass('hot_values')").fetchone()[0] is None:
            return 0
        return db.execute("SELECT count(*) FROM hot_values").fetchone()[0]


def _check_exact(target: str, sink_dsn: str, module, expected: dict[str, int]) -> None:
    with percolite.open(target, app=module.app) as env:
        with env.transaction() as tx:
            assert dict(module.hot.scan(tx)) == expected
        status = env.status()
        assert status["pending"] == 0
    with psycopg.connect(sink_dsn) as db:
        rows = dict(db.execute("SELECT k, v FROM hot_values").fetchall())
    assert rows == expected


@pytest.mark.parametrize("fault", ["kill a group", "restart the server"])
def test_two_worker_groups_end_exact_through_a_fault(tmp_path, monkeypatch, fault):
    with temporary_postgres(tmp_path) as server:
        monkeypatch.setenv("PG_SINK", server.uri)
        module = load_fresh("children.pg_groups_app")
        target = f"{server.uri}&schema=groups"
        expected = _load_hot_updates(target, module, 400, seed=7)
        first = _worker_group(target, server.uri)
        second = _worker_group(target, server.uri)
        # The fault lands mid-run: once every worker process of both groups
        # holds its lease (none is still opening the store, which a server
        # that is down refuses) and the sink has rows, with work left.
        with percolite.open(target, app=module.app) as env:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                sum(lease["live"] for lease in env.status()["leases"]) == 4
                and _sink_rows(server.dsn)
            ):
                time.sleep(0.05)
            assert env.status()["pending"] > 0, "the fault lands mid-run"
        if fault == "kill a group":
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate(timeout=30)
        else:
            server.restart()
        out, err = second.communicate(timeout=300)
        assert second.returncode == 0, err
        if fault == "restart the server":
            first_out, first_err = first.communicate(timeout=300)
            assert first.returncode == 0, first_err
        # What the killed group left unfinished, a group started later takes over.
        last = _worker_group(target, server.uri)
        _out, err = last.communicate(timeout=300)
        assert last.returncode == 0, err
        _check_exact(target, server.dsn, module, expected)


def test_leases_are_judged_by_the_servers_clock_not_a_skewed_one(tmp_path, monkeypatch):
    """A group whose machine's clock runs 3 minutes ahead writes lease
    expiries 3 minutes late by its own clock; judged by the server's clock,
    its lease still lapses within seconds of its death."""
    with temporary_postgres(tmp_path) as server:
        monkeypatch.setenv("PG_SINK", server.uri)
        module = load_fresh("children.pg_groups_app")
        target = f"{server.uri}&schema=skewed"
        expected = _load_hot_updates(target, module, 400, seed=5)
        # Neither stops when idle: the group ahead must still be there to be
        # killed (a clock ahead makes it see the other's lease as long dead,
        # take every partition, and finish early).
        on_time = _worker_group(target, server.uri, until_idle=False)
        ahead = _worker_group(target, server.uri, clock="+180s", until_idle=False)
        try:
            with percolite.open(target, app=module.app) as env:

                def live_groups():
                    live = {}
                    for lease in env.status()["leases"]:
                        if lease["live"]:
                            live[lease["group"]] = live.get(lease["group"], 0) + 1
                    return live

                deadline = time.monotonic() + 60
                while sorted(live_groups().values()) != [2, 2]:
                    assert time.monotonic() < deadline, "both groups hold their leases"
                    time.sleep(0.05)
                os.killpg(ahead.pid, signal.SIGKILL)
                ahead.communicate(timeout=30)
                killed_at = time.monotonic()
                while list(live_groups().values()) != [2]:
                    # The lease is 5 s; a clock 3 minutes ahead would hold it 185 s.
                    assert time.monotonic() - killed_at < 60, "the dead group's lease lapsed"
                    time.sleep(0.1)
                deadline = time.monotonic() + 240
                while env.status()["pending"]:
                    assert time.monotonic() < deadline, "the other group finished the work"
                    time.sleep(0.2)
            on_time.send_signal(signal.SIGTERM)
            _out, err = on_time.communicate(timeout=120)
            assert on_time.returncode == 0, err
            _check_exact(target, server.dsn, module, expected)
        finally:
            for group in (on_time, ahead):
                if group.poll() is None:
                    os.killpg(group.pid, signal.SIGKILL)
                    group.communicate()


def test_phrasecount_on_postgresql_counts_as_on_lmdb(postgres_server, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(3)
    words = [f"w{i}" for i in range(40)]
    for i in range(60):
        (corpus / f"d{i}.txt").write_text(" ".join(rng.choices(words, k=rng.randint(5, 60))))
    target = f"{postgres_server.uri}&schema=phrases"
    counts = {}
    for db in (target, str(tmp_path / "pc.db")):  # postgresql, then lmdb
        result = subprocess.run(
            [sys.executable, "-m", "percolite", "phrasecount", str(corpus), "--db", db, "--quiet"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
    with psycopg.connect(postgres_server.dsn) as db:
        counts["postgresql"] = dict(
            (p, (d, t))
            for p, d, t in db.execute(
                "SELECT phrase, doc_count, total_count FROM phrases.phrase_counts"
            ).fetchall()
        )
    import sqlite3

    with sqlite3.connect(tmp_path / "pc.db.phrases.sqlite") as db:
        counts["lmdb"] = {
            p: (d, t)
            for p, d, t in db.execute("SELECT phrase, doc_count, total_count FROM phrase_counts")
        }
    assert counts["postgresql"] == counts["lmdb"]
    assert len(counts["lmdb"]) > 1000


def test_workers_poll_a_server_without_listen_when_told_to(postgres_server):
    """poll_interval: for servers speaking PostgreSQL's protocol without
    LISTEN/NOTIFY, workers look for work that often instead of being woken."""
    target = f"{postgres_server.uri}&schema=polled&poll_interval=0.1"
    app = percolite.App("polled")
    seen = []

    @app.observer(COL)
    def observe(tx, row, column):
        seen.append(row)

    with percolite.open(target, app=app) as workers, percolite.open(target) as writer:
        workers.start_workers(1)
        writer.run(lambda tx: tx.set("r", COL, b"v"))  # another handle: found by polling
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen == [b"r"]
    with pytest.raises(ValueError, match="poll_interval"):
        percolite.open(f"{postgres_server.uri}&poll_interval=never")
