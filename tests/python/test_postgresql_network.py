"""Worker groups on other machines, as far as one machine can show it: each
group runs in a network namespace of its own and reaches the PostgreSQL
server over TCP on a veth link (``_network.Link``). One group's link is cut
mid-run (every packet dropped, as a partition looks to TCP) and restored; a
link 20 ms slower each way still gives exact results; a failover between
two servers is followed over TCP.

A loader in this process (over the server's Unix socket) keeps adding hot
keys to a combine queue whose changes an export queue writes into a
PostgreSQL table; the groups run the queues (``children.pg_groups_app``).
Every run ends with the store and the sink exact: the sums of the loader
transactions whose futures resolved, each applied once.

Root is needed for the namespaces (CI runs as root).
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
from _network import DelayProxy, Link
from _postgres import temporary_postgres

KEYS = [f"k{i:03}" for i in range(200)]


@pytest.fixture
def links():
    made = []
    try:
        made += [Link(1), Link(2)]
        yield made
    finally:
        for link in made:
            link.close()


def _wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class Run:
    """The loader, the worker groups and the checks of one run."""

    def __init__(self, target: str, sink_uri: str, monkeypatch) -> None:
        monkeypatch.setenv("PG_SINK", sink_uri)
        self.module = load_fresh("children.pg_groups_app")
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

    def start_group(self, link: Link, target: str, sink_uri: str) -> subprocess.Popen:
        """``percolite worker`` (two processes) inside ``link``'s namespace."""
        command = [sys.executable, "-m", "percolite", "worker", "children.pg_groups_app:app"]
        group = subprocess.Popen(
            link.command(command + ["--processes", "2", "--threads", "2"]),
            cwd=TESTS_DIR,
            env={**os.environ, "PERCOLITE_DB": target, "PG_SINK": sink_uri, "PG_SLOW": "0.05"},
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.groups.append(group)
        return group

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
        _wait_for(lambda: self.env.status()["pending"] == 0, "the groups to drain the queues", 240)
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

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=120)
        for group in self.groups:
            if group.poll() is None:
                os.killpg(group.pid, signal.SIGKILL)
                group.communicate()
        self.env.close()


def test_a_group_cut_off_for_20_s_loses_its_lease_and_rejoins(links, tmp_path, monkeypatch):
    a, b = links
    with temporary_postgres(tmp_path, tcp=(f"{a.here},{b.here}", Link.subnet)) as server:
        run = Run(f"{server.uri}&schema=partition", server.uri, monkeypatch)
        try:
            run.start_loading()
            for link in (a, b):
                uri = f"postgresql://postgres@{link.here}:{server.port}/postgres"
                run.start_group(link, f"{uri}?schema=partition", uri)
            _wait_for(
                lambda: sorted(run.live_leases().values()) == [2, 2] and run.sink_rows() > 0,
                "both groups at work",
            )
            # A group's leases are named after its command's pid (ip netns
            # exec runs the command in its own process).
            cut_group = next(name for name in run.live_leases() if f":{run.groups[0].pid}:" in name)
            a.cut()
            cut_at = time.monotonic()
            # The cut group's leases lapse; the other group takes its partitions.
            _wait_for(
                lambda: (
                    list(run.live_leases()) not in ([], [cut_group])
                    and cut_group not in run.live_leases()
                ),
                "the cut group's leases to lapse",
                30,
            )
            time.sleep(max(0.0, 20 - (time.monotonic() - cut_at)))
            a.restore()
            _wait_for(lambda: run.live_leases().get(cut_group) == 2, "the cut group to rejoin", 90)
            errors, applied = run.finish()
            assert applied > 0
            # The cut group's processes lost their connections and made them
            # again: each says so once, however many attempts it took.
            cut_err = errors[0]
            lines = cut_err.count("the connection to the server was lost")
            assert 1 <= lines <= 2, cut_err
        finally:
            run.close()


@pytest.mark.parametrize("delay", [0.0, 0.02])
def test_a_slow_link_still_gives_exact_results(links, tmp_path, monkeypatch, delay):
    a, _b = links
    with temporary_postgres(tmp_path, tcp=(a.here, Link.subnet)) as server:
        proxy = DelayProxy(a.here, (a.here, server.port), delay)
        run = Run(f"{server.uri}&schema=slow", server.uri, monkeypatch)
        try:
            uri = f"postgresql://postgres@{a.here}:{proxy.port}/postgres"
            run.start_loading()
            run.start_group(a, f"{uri}?schema=slow", uri)
            _wait_for(lambda: run.sink_rows() > 0, "the group at work")
            time.sleep(5)
            _errors, applied = run.finish()
            assert applied > 0
        finally:
            run.close()
            proxy.close()


def test_a_group_over_tcp_follows_a_failover(links, tmp_path, monkeypatch):
    a, _b = links
    subnet = Link.subnet
    with temporary_postgres(tmp_path, synchronous_standby=True, tcp=(a.here, subnet)) as primary:
        standby = primary.make_standby(tcp=(a.here_too, subnet))
        try:
            both = (
                f"postgresql://postgres@{a.here}:{primary.port},{a.here_too}:{standby.port}"
                "/postgres?target_session_attrs=read-write"
            )
            run = Run(f"{both}&schema=tcp_failover", both, monkeypatch)
            try:
                run.start_loading()
                run.start_group(a, f"{both}&schema=tcp_failover", both)
                _wait_for(
                    lambda: sum(run.live_leases().values()) == 2 and run.sink_rows() > 0,
                    "the group at work",
                )
                primary.kill()
                time.sleep(0.5)
                standby.promote()
                resolved = sum(future.done() for future, _ in run.submitted)
                _wait_for(
                    lambda: sum(future.done() for future, _ in run.submitted) > resolved + 100,
                    "loader commits on the promoted standby",
                )
                errors, _applied = run.finish()
                assert 1 <= errors[0].count("failed over to another server") <= 2, errors[0]
            finally:
                run.close()
        finally:
            standby.stop()
