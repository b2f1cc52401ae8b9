"""The workload of the PostgreSQL fault tests (network cuts, slow links,
failovers, an orchestrator's): a loader in the test's process keeps adding
hot keys to a combine queue whose changes an export queue writes into a
PostgreSQL table, worker groups run the queues (``children.pg_groups_app``),
and :meth:`Run.finish` checks the store and the sink exact: the sums of the
loader transactions whose futures resolved, each applied once."""

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
from _isolated import TESTS_DIR, load_fresh
from _network import Link

__all__ = ["Run", "wait_for"]

KEYS = [f"k{i:03}" for i in range(200)]


def wait_for(condition, what: str, timeout: float = 120, detail=None) -> None:
    """Polls ``condition`` until it holds; fails after ``timeout`` seconds,
    with what ``detail()`` says of the state then (when given)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            said = "" if detail is None else f": {detail()}"
            raise AssertionError(f"timed out waiting for {what}{said}")
        time.sleep(0.1)


class Run:
    """The loader, the worker groups and the checks of one run."""

    def __init__(self, target: str, sink_uri: str, monkeypatch, native: bool = False) -> None:
        monkeypatch.setenv("PG_SINK", sink_uri)
        # Native: the export queue's exporter is the sink itself, whose
        # batches the core applies on libpq connections of its own.
        monkeypatch.setenv("PG_NATIVE", "1" if native else "0")
        self.module = load_fresh("children.pg_groups_app")
        assert self.module.out.delivery.startswith("native" if native else "python")
        self.sink_uri = sink_uri
        self.env = percolite.open(target, app=self.module.app)
        self.submitted: list = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._load, name="loading")
        self.groups: list[subprocess.Popen] = []
        self.rng = random.Random(17)

    def _load(self) -> None:
        with self.env.loader() as loader:
            while not self.stop.is_set():
                updates = {key: self.rng.randint(1, 9) for key in self.rng.sample(KEYS, 50)}
                self.submitted.append((loader.submit(self._add, updates), updates))
                time.sleep(0.002)  # a steady stream, not a flood

    def _add(self, tx, updates) -> None:
        self.module.hot.add(tx, updates)

    def start_loading(self) -> None:
        self.thread.start()

    def start_group(self, target: str, sink_uri: str, link: Link | None = None) -> subprocess.Popen:
        """``percolite worker`` (two processes), inside ``link``'s namespace
        if one is given."""
        command = [sys.executable, "-m", "percolite", "worker", "children.pg_groups_app:app"]
        command += ["--processes", "2", "--threads", "2"]
        group = subprocess.Popen(
            link.command(command) if link is not None else command,
            cwd=TESTS_DIR,
            env={**os.environ, "PERCOLITE_DB": target, "PG_SINK": sink_uri, "PG_SLOW": "0.05"},
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.groups.append(group)
        return group

    def committed(self) -> int:
        """Loader transactions whose futures resolved successfully so far."""
        return sum(
            future.done() and future.exception(timeout=0) is None for future, _ in self.submitted
        )

    def live_leases(self) -> dict[str, int]:
        """Live leases by group."""
        live: dict[str, int] = {}
        for lease in self.env.status()["leases"]:
            if lease["live"]:
                live[lease["group"]] = live.get(lease["group"], 0) + 1
        return live

    def sink_rows(self) -> int:
        with psycopg.connect(self.sink_uri) as db:
            if db.execute("SELECT to_regclass('hot_values')").fetchone()[0] is None:
                return 0
            return db.execute("SELECT count(*) FROM hot_values").fetchone()[0]

    def finish(self) -> tuple[list[str], float]:
        """Stops loading, waits for the groups to drain the queues, stops
        them (each must exit 0), checks the store and the sink; returns
        the groups' stderr and the loader transactions applied."""
        self.stop.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the loader finished"
        expected: dict[str, int] = {}
        applied = 0
        for future, updates in self.submitted:
            error = future.exception(timeout=0)
            assert error is None or isinstance(error, percolite.Error), error
            if error is None:
                applied += 1
                for key, value in updates.items():
                    expected[key] = expected.get(key, 0) + value
        wait_for(
            lambda: self.env.status()["pending"] == 0,
            "the groups to drain the queues",
            240,
            detail=self._state,
        )
        errors = []
        for group in self.groups:
            group.send_signal(signal.SIGTERM)
            _out, err = group.communicate(timeout=120)
            assert group.returncode == 0, err
            errors.append(err)
        with self.env.transaction() as tx:
            assert dict(self.module.hot.scan(tx)) == expected
        with psycopg.connect(self.sink_uri) as db:
            assert dict(db.execute("SELECT k, v FROM hot_values").fetchall()) == expected
        return errors, applied

    def _state(self) -> str:
        """What is pending and who holds leases, and whether each group runs."""
        status = self.env.status()
        pending = {
            o["name"]: (o["pending"], o.get("last_error"))
            for o in status["observers"]
            if o["pending"]
        }
        leases = [(lease["group"], lease["live"]) for lease in status["leases"]]
        running = [group.poll() is None for group in self.groups]
        return (
            f"pending {pending}, parked {status['parked']}, queues {status['queues']}, "
            f"leases {leases}, groups running {running}"
        )

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=120)
        for group in self.groups:
            if group.poll() is None:
                os.killpg(group.pid, signal.SIGKILL)
                group.communicate()
        self.env.close()
