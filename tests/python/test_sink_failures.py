"""When a sink fails (export_queue.h, "Poison keys and outages"): a sink that
is down is waited for, never mistaken for bad keys; poison keys are parked
alone; a stop ends percolite's own loops at once. Real SQLite sinks, real
worker processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import percolite
import pytest
from _isolated import TESTS_DIR, load_fresh, run_command
from _postgres import TemporaryPostgres, find_postgres_bin
from conftest import open_store


def sink_rows(sink_dir) -> dict[str, int]:
    path = sink_dir / "out.sqlite"
    if not path.exists():
        return {}
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT k, v FROM kv"))


def postgres_rows(dsn) -> dict[str, int]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT k, v FROM kv").fetchall())


@pytest.fixture
def sink_env(tmp_path, monkeypatch):
    """``$SINK_DIR`` for children/sink_app.py, and a function loading a fresh copy of it."""
    sink_dir = tmp_path / "sink"
    sink_dir.mkdir()
    monkeypatch.setenv("SINK_DIR", str(sink_dir))

    def load(**settings):
        for name, value in settings.items():
            monkeypatch.setenv(f"SINK_{name.upper()}", str(value))
        return load_fresh("children.sink_app")

    return sink_dir, load


def until(condition, timeout: float, what: str):
    """Polls ``condition()`` until it is true (returned) or ``timeout`` passes (fails)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


# -- poison keys and a sink failing for everything, in one process -------------


@pytest.mark.parametrize(
    "poison",
    [["k000011"], ["k000003", "k015017"]],
    ids=["one-key", "two-keys-in-different-halves"],
)
def test_poison_keys_among_20000_are_parked_alone_and_the_rest_exported(
    backend, tmp_path, sink_env, poison
):
    sink_dir, load = sink_env
    sink_app = load(entries=20000, buckets=1, batch=20000, attempts=1)
    (sink_dir / "poison").write_text("\n".join(poison))
    with open_store(backend, tmp_path / "db", app=sink_app.app, sync="none") as env:
        sink_app.load(env, 1)
        env.start_workers(1, retry_initial=0.005, retry_max=0.02)
        with pytest.raises(percolite.WorkParked) as parked:
            env.wait(60)
        assert parked.value.by_observer == {"export queue out": len(poison)}
        assert sorted(r["key"] for r in env.parked()) == poison
        assert env.sinks()["out"] == {"state": "ok"}
        env.stop_workers()
    want = sink_app.expected(1)
    for key in poison:
        del want[key]
    assert sink_rows(sink_dir) == want


def test_a_sink_failing_for_every_key_parks_nothing_and_shows_as_down(backend, tmp_path, sink_env):
    sink_dir, load = sink_env
    sink_app = load(entries=20000, buckets=1, batch=20000, attempts=1)
    (sink_dir / "refuse").write_text("")
    with open_store(backend, tmp_path / "db", app=sink_app.app, sync="none") as env:
        sink_app.load(env, 1)
        env.start_workers(1, retry_initial=0.005, retry_max=0.02)
        state = until(
            lambda: env.sinks()["out"]["state"] == "failing" and env.sinks()["out"],
            60,
            "the sink to show as failing",
        )
        assert state["last_error"]["type"] == "ValueError"
        assert state["last_error"]["message"] == "the sink refuses every entry"
        assert env.wait(0.5) is False  # it waits for the sink, it is not idle
        assert env.parked() == []
        status = env.status()
        assert status["sinks"]["out"]["state"] == "failing"
        assert status["sinks"]["out"]["waiting"] == 20000
        gauges = env.metrics()["gauges"]
        assert gauges["sink_failing"] == {"out": 1}
        assert gauges["sink_failing_since_unix"]["out"] == state["since_unix"]
        (sink_dir / "refuse").unlink()  # fixed: everything goes, nothing was parked
        assert env.wait(60)
        assert env.sinks()["out"] == {"state": "ok"}
        assert env.parked() == []
        env.stop_workers()
    assert sink_rows(sink_dir) == sink_app.expected(1)


# -- real worker processes ------------------------------------------------------


def cli(*args) -> list:
    return [sys.executable, "-m", "percolite", *map(str, args)]


def start_worker(db, sink_dir, log, **settings) -> subprocess.Popen:
    """`percolite -v worker --until-idle` (INFO: recoveries are logged there)."""
    environ = dict(os.environ, SINK_DIR=str(sink_dir))
    environ.update({f"SINK_{k.upper()}": str(v) for k, v in settings.items()})
    argv = cli("-v", "worker", "children.sink_app:app", "--db", db, "--until-idle")
    return subprocess.Popen(
        [os.fspath(a) for a in argv],
        cwd=TESTS_DIR,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )


def status_json(db, sink_dir) -> dict:
    environ = dict(os.environ, SINK_DIR=str(sink_dir))
    shown = run_command(cli("status", db, "--json"), timeout=60, env=environ)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def stop_at_once(worker: subprocess.Popen) -> None:
    """SIGTERM ends ``worker`` cleanly (status 0). Within 10 s: a hang guard,
    not a rate; before stops looked at the flag, a worker failing on its sink
    ignored SIGTERM for minutes."""
    asked = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert finish(worker, 30) == 0
    stopped_after = time.monotonic() - asked
    assert stopped_after < 10, stopped_after


def calls_made(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def finish(worker: subprocess.Popen, timeout: float) -> int:
    try:
        return worker.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        pytest.fail(f"the worker did not finish within {timeout} s")


@pytest.mark.parametrize("outage", ["connection", "locked", "postgresql-stopped"])
def test_a_sink_down_for_20_s_parks_nothing_and_every_key_arrives_after_it(
    tmp_path, sink_env, outage
):
    """30,000 queued entries (each key queued twice), `percolite worker`
    running, the sink down for 20 s: raising ConnectionError, its SQLite
    file locked by another connection, or its PostgreSQL server stopped with
    `pg_ctl stop` and started again. Nothing is parked, `status --json`
    shows the outage while it lasts, a handful of log lines tell it, and
    every key arrives with its latest value once the sink is back."""
    sink_dir, load = sink_env
    settings = {"timeout": 0.5}
    server = None
    if outage == "postgresql-stopped":
        bin_dir = find_postgres_bin()
        assert bin_dir is not None, "PostgreSQL is installed by scripts/bootstrap.sh"
        server = TemporaryPostgres(bin_dir, tmp_path)
        settings["postgres"] = server.start()
    try:
        check_outage(tmp_path, sink_dir, load(**settings), settings, outage, server)
    finally:
        if server is not None:
            server.stop()


def check_outage(tmp_path, sink_dir, sink_app, settings, outage, server) -> None:
    db = tmp_path / "db"
    with percolite.open(db, app=sink_app.app, sync="none") as env:
        sink_app.load(env, 2)
    blocker = None
    if outage == "connection":
        (sink_dir / "down").write_text("")
    elif outage == "locked":
        sink_app.sink([percolite.SequencedExport("k000000", 0, 1)])  # the tables exist
        blocker = sqlite3.connect(sink_dir / "out.sqlite", isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
    else:
        server.pause()
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = start_worker(db, sink_dir, log, **settings)
        try:
            down_since = time.monotonic()
            sink = until(
                lambda: (
                    (s := status_json(db, sink_dir)["sinks"].get("out"))
                    and s["state"] == "failing"
                    and s
                ),
                60,
                "status to show the outage",
            )
            assert sink["waiting"] > 0
            assert status_json(db, sink_dir)["parked"] == 0
            time.sleep(max(0.0, 20 - (time.monotonic() - down_since)))
            assert worker.poll() is None, "the worker waits for the sink"
            during = status_json(db, sink_dir)
            assert during["parked"] == 0 and during["sinks"]["out"]["state"] == "failing"
        finally:
            if blocker is not None:
                blocker.execute("ROLLBACK")
                blocker.close()
            if server is not None:
                server.resume()
            (sink_dir / "down").unlink(missing_ok=True)
        assert finish(worker, 60) == 0
    if server is not None:
        assert postgres_rows(settings["postgres"]) == sink_app.expected(2)
    else:
        assert sink_rows(sink_dir) == sink_app.expected(2)
    after = status_json(db, sink_dir)
    assert after["parked"] == 0 and after["pending"] == 0
    out = after["sinks"]["out"]
    assert (out["state"], out["waiting"]) == ("ok", 0) and "last_error" not in out
    lines = [line for line in log_path.read_text().splitlines() if "percolite.observers" in line]
    failing = [line for line in lines if "the sink is failing" in line]
    assert len(failing) == 1, lines
    assert len(lines) <= 5, lines  # one when it starts, one when it recovers
    assert any("the sink recovered" in line for line in lines), lines


def test_sigterm_during_an_outage_ends_the_worker_at_once_and_loses_nothing(tmp_path, sink_env):
    sink_dir, load = sink_env
    sink_app = load()
    db = tmp_path / "db"
    with percolite.open(db, app=sink_app.app, sync="none") as env:
        sink_app.load(env, 1)
    (sink_dir / "down").write_text("")
    with open(tmp_path / "worker.log", "w") as log:
        worker = start_worker(db, sink_dir, log)
        until(
            lambda: status_json(db, sink_dir)["sinks"].get("out", {}).get("state") == "failing",
            60,
            "the outage",
        )
        stop_at_once(worker)
    (sink_dir / "down").unlink()
    with open(tmp_path / "again.log", "w") as log:
        assert finish(start_worker(db, sink_dir, log), 120) == 0
    assert sink_rows(sink_dir) == sink_app.expected(1)


def test_sigterm_during_the_split_of_50000_entries_ends_the_worker_at_once(tmp_path, sink_env):
    """The last attempt splits a batch of 50,000 entries that the sink
    refuses, each call taking 0.5 s: SIGTERM ends the worker after the call
    going on, with nothing parked; fixed, a restart exports every entry."""
    sink_dir, load = sink_env
    settings = dict(entries=50000, buckets=1, batch=50000, attempts=1)
    sink_app = load(**settings)
    db = tmp_path / "db"
    with percolite.open(db, app=sink_app.app, sync="none") as env:
        sink_app.load(env, 1)
    (sink_dir / "refuse").write_text("")
    (sink_dir / "slow").write_text("0.5")
    calls = sink_dir / "calls"
    with open(tmp_path / "worker.log", "w") as log:
        worker = start_worker(db, sink_dir, log, **settings)
        # The whole batch, then its first half: the split is under way.
        until(lambda: calls_made(calls) >= 2, 60, "the split")
        stop_at_once(worker)
    assert calls_made(calls) < 7, "the split went on after the stop"
    (sink_dir / "refuse").unlink()
    (sink_dir / "slow").unlink()
    with open(tmp_path / "again.log", "w") as log:
        assert finish(start_worker(db, sink_dir, log, **settings), 120) == 0
    assert sink_rows(sink_dir) == sink_app.expected(1)
    assert status_json(db, sink_dir)["parked"] == 0
