"""A store on a PostgreSQL primary with a synchronous standby, the primary's
machine lost mid-run (its postmaster SIGKILLed: no shutdown, no goodbye to
clients) and the standby promoted, as an operator or an orchestrator would.

Everything follows the primary through one multi-host URI: the loader, a
worker group in processes of its own, and the sink the export queue writes.
A commit in flight when the primary died is settled on the new primary by
its commit token (synchronous replication means every commit the old
primary reported is on the standby): the run ends with the store and the
sink exact, every loader future that resolved successfully applied once and
every one that failed not at all. The export queue runs both ways: through
an exporter function, and natively (the core applying batches on libpq
connections of its own, which must follow the primary too).
"""

from __future__ import annotations

import logging
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
from _postgres import both_servers, temporary_postgres


def _wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _sink_rows(uri: str) -> int:
    with psycopg.connect(uri) as db:
        if db.execute("SELECT to_regclass('hot_values')").fetchone()[0] is None:
            return 0
        return db.execute("SELECT count(*) FROM hot_values").fetchone()[0]


@pytest.mark.parametrize("delivery", ["python", "native"])
def test_a_failover_mid_run_loses_nothing_and_applies_nothing_twice(
    primary_and_standby, monkeypatch, delivery
):
    primary, standby = primary_and_standby
    sink_uri = both_servers(primary, standby)
    target = both_servers(primary, standby, "&schema=failover&reconnect_timeout=60")
    monkeypatch.setenv("PG_SINK", sink_uri)
    # Native: the sink's batches are applied by the core on libpq connections
    # of its own, which must follow the primary as the exporter's do.
    monkeypatch.setenv("PG_NATIVE", "1" if delivery == "native" else "0")
    module = load_fresh("children.pg_groups_app")
    assert module.out.delivery.startswith(delivery)
    rng = random.Random(11)
    keys = [f"k{i:03}" for i in range(200)]
    submitted: list = []  # (future, updates)
    stop_loading = threading.Event()

    def add(tx, updates):
        module.hot.add(tx, updates)

    env = percolite.open(target, app=module.app)

    def load() -> None:
        with env.loader() as loader:
            while not stop_loading.is_set():
                updates = {key: rng.randint(1, 9) for key in rng.sample(keys, 50)}
                submitted.append((loader.submit(add, updates), updates))

    loading = threading.Thread(target=load, name="loading")
    group = None
    try:
        loading.start()
        group = subprocess.Popen(
            [sys.executable, "-m", "percolite", "worker", "children.pg_groups_app:app"]
            + ["--processes", "2", "--threads", "2"],
            cwd=TESTS_DIR,
            env={**os.environ, "PERCOLITE_DB": target, "PG_SLOW": "0.05"},
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The primary dies with both processes of the group at work, rows in
        # the sink, and the loader committing.
        _wait_for(
            lambda: (
                sum(lease["live"] for lease in env.status()["leases"]) == 2
                and _sink_rows(sink_uri) > 0
            ),
            "the worker group to start exporting",
        )

        def committed() -> int:
            return sum(f.done() and f.exception(timeout=0) is None for f, _ in submitted)

        committed_before = committed()
        primary.kill()
        time.sleep(0.5)  # the orchestrator notices
        standby.promote()
        _wait_for(
            lambda: committed() > committed_before + 100,
            "loader commits on the promoted standby",
        )
        stop_loading.set()
        loading.join(timeout=120)
        assert not loading.is_alive(), "the loader finished"

        expected: dict[str, int] = {}
        failed = []
        for future, updates in submitted:
            error = future.exception(timeout=0)
            if error is not None:
                failed.append(error)
                continue
            for key, value in updates.items():
                expected[key] = expected.get(key, 0) + value
        # A failover may fail a commit it cannot settle; it must say which.
        assert all(isinstance(e, percolite.Error) for e in failed), failed
        assert len(failed) < len(submitted) / 10

        _wait_for(lambda: env.status()["pending"] == 0, "the group to finish the queues")
        # Seen in status, from the records of every process: this one's
        # writer reached the standby, which it names as a failover.
        _wait_for(lambda: env.status()["server"]["failovers"] >= 1, "the failover in status")
        server = env.status()["server"]
        assert server["address"] == f"{standby.socket_dir}:{standby.port}"
        failover = server["last_failover"]
        assert failover["servers"] == (
            f"{primary.socket_dir}:{primary.port} -> {standby.socket_dir}:{standby.port}"
        )
        assert server["last_reconnection"]["cause"]
        group.send_signal(signal.SIGTERM)
        _out, err = group.communicate(timeout=120)
        assert group.returncode == 0, err
        # Logged once by each process of the group that saw it, however many
        # attempts the reconnection took.
        assert 1 <= err.count("failed over to another server") <= 2, err

        with env.transaction() as tx:
            assert dict(module.hot.scan(tx)) == expected
        with psycopg.connect(sink_uri) as db:
            rows = dict(db.execute("SELECT k, v FROM hot_values").fetchall())
        assert rows == expected
    finally:
        stop_loading.set()
        loading.join(timeout=120)
        if group is not None and group.poll() is None:
            os.killpg(group.pid, signal.SIGKILL)
            group.communicate()
        env.close()


def test_commits_stalled_by_a_dead_synchronous_standby_show_in_status(primary_and_standby):
    primary, standby = primary_and_standby
    target = both_servers(primary, standby, "&schema=stalled")
    env = percolite.open(target)
    try:
        env.run(lambda tx: tx.set("r", ("f", "q"), b"1"))
        server = env.status()["server"]
        assert (server["replication"], server["standbys"]) == ("synchronous", 1)
        assert server["synchronous_standby_names"] == "*"
        standby.pause()  # the primary's commits now wait for it
        done = threading.Event()

        def commit() -> None:
            env.run(lambda tx: tx.set("r", ("f", "q"), b"2"))
            done.set()

        threading.Thread(target=commit, daemon=True).start()
        # Another process's status answers (it needs no sync for its own
        # writes) and names the stall, instead of hanging with the writer.
        deadline = time.monotonic() + 60
        while True:
            shown = subprocess.run(
                [sys.executable, "-m", "percolite", "status", "--db", target],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert shown.returncode == 0, shown.stderr
            if "commits waiting for a synchronous standby: 1 sessions" in shown.stdout:
                break
            assert time.monotonic() < deadline, shown.stdout
            time.sleep(0.5)
        assert "replication: synchronous (*), 0 standbys connected" in shown.stdout
        assert not done.is_set()
        standby.resume()  # the commit that waited goes through
        assert done.wait(60)
        with env.transaction() as tx:
            assert tx.get("r", ("f", "q")) == b"2"
    finally:
        env.close()


def test_asynchronous_replication_is_named_at_open(tmp_path, caplog):
    with temporary_postgres(tmp_path) as primary:
        standby = primary.make_standby()
        try:
            target = f"{primary.uri}&schema=async_named"
            with caplog.at_level(logging.WARNING, logger="percolite.store"):
                percolite.open(target).close()
            assert "replicates asynchronously (1 standby" in caplog.text
            assert "synchronous_standby_names = 'ANY 1 (s1, s2)'" in caplog.text
            caplog.clear()
            # A store that asked for no durable commits has nothing to lose.
            with caplog.at_level(logging.WARNING, logger="percolite.store"):
                percolite.open(target, sync="none").close()
            assert caplog.text == ""
        finally:
            standby.stop()
