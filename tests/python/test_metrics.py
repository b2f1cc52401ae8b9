"""Metrics: counters every process records in the store, totals read from
any process; the Prometheus text of `percolite status --prometheus` and of
`percolite worker --metrics-port`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import percolite
import pytest
from _isolated import TESTS_DIR, run_command
from conftest import open_store
from prometheus_client.parser import text_string_to_metric_families

CONTENT = ("doc", "content")


def make_app(fail_rows=()) -> percolite.App:
    app = percolite.App("metrics")

    @app.observer(CONTENT, max_attempts=1, name="index")
    def index(tx, row, column):
        if row in fail_rows:
            raise ValueError("no")
        tx.set(row, ("doc", "out"), "1")

    app.combine_queue("counts", buckets=2)
    return app


def samples(text: str) -> dict:
    """{(name, labels as a sorted tuple): value} of a Prometheus text page."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_what_was_done(backend, tmp_path):
    app = make_app(fail_rows={b"bad"})
    counts = app._queues["counts"]
    with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
        before = env.metrics()["counters"]["commits"]  # the app's record
        for i in range(10):
            with env.transaction() as tx:
                tx.set(f"r{i}", CONTENT, "x")
                counts.add(tx, {"a": 1, "b": 2})
        with env.transaction() as tx:
            tx.set("bad", CONTENT, "x")
        metrics = env.metrics()
        assert metrics["counters"]["commits"] - before == 11
        assert metrics["gauges"]["pending_notifications"] == 11 + 2  # rows, buckets
        assert metrics["gauges"]["pending_by_observer"] == {"index": 11, "combine queue counts": 2}
        env.process(2)
        metrics = env.metrics()
    counters, gauges = metrics["counters"], metrics["gauges"]
    assert counters["observer_runs"]["index"] == 11
    assert counters["observer_commits"]["index"] == 10
    assert counters["observer_failures"] == {"index": 1}
    assert counters["observer_parkings"] == {"index": 1}
    assert counters["queue_entries"] == {"counts": 20}
    assert (
        counters["queue_batches"]["counts"] == counters["observer_commits"]["combine queue counts"]
    )
    assert gauges["parked"] == 1 and gauges["parked_by_observer"] == {"index": 1}
    assert gauges["pending_notifications"] == 0 and gauges["queue_depth"] == {"counts": 0}
    assert counters["syncs"] >= 1
    assert gauges["transactions_per_sync"] == counters["commits"] / counters["syncs"]


def test_totals_add_up_over_processes_and_survive_them(tmp_path):
    db = tmp_path / "db"
    code = (
        "import percolite, sys\n"
        "with percolite.open(sys.argv[1], sync='none') as env:\n"
        "    for i in range(int(sys.argv[2])):\n"
        "        with env.transaction() as tx:\n"
        "            tx.set(f'r{i}', ('f', 'q'), 'x')\n"
    )
    with percolite.open(db, sync="none") as env:
        start = env.metrics()["counters"]["commits"]
    for n in (7, 5):
        assert run_command([sys.executable, "-c", code, db, str(n)], timeout=60).returncode == 0
    with percolite.open(db, sync="none") as env:
        assert env.metrics()["counters"]["commits"] - start == 12


def test_status_prometheus_parses(tmp_path):
    db = tmp_path / "db"
    app = make_app()
    with percolite.open(db, app=app, sync="none") as env:
        with env.transaction() as tx:
            tx.set("r", CONTENT, "x")
        env.process(1)
    shown = run_command([sys.executable, "-m", "percolite", "status", db, "--prometheus"])
    assert shown.returncode == 0, shown.stderr
    found = samples(shown.stdout)
    assert found[("percolite_observer_runs_total", (("observer", "index"),))] == 1.0
    assert found[("percolite_pending_notifications", ())] == 0.0
    assert ("percolite_commits_total", ()) in found
    # Queue depths without the app's code: the store records its queues.
    assert found[("percolite_queue_depth", (("queue", "counts"),))] == 0.0


def worker_command(db, port: int, *extra: str) -> list:
    """`percolite worker` running this module's APP on ``db``, serving metrics on ``port``."""
    worker = [sys.executable, "-m", "percolite", "worker", "test_metrics:APP", "--db", db]
    return [*worker, "--metrics-port", str(port), *extra]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_worker_serves_metrics_on_localhost_and_refuses_a_port_in_use(tmp_path):
    db = tmp_path / "db"
    with percolite.open(db, app=make_app(), sync="none"):
        pass
    port = free_port()
    worker = subprocess.Popen(
        worker_command(db, port),
        cwd=TESTS_DIR,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The server is up before the workers (a port in use stops the worker
        # before it does any work), so the first pages may show no lease yet.
        deadline = time.monotonic() + 30
        page, found = None, {}
        while time.monotonic() < deadline and found.get(("percolite_lease_holders", ()), 0) < 1:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    page = r.read().decode()
                found = samples(page)
            except OSError:
                pass
            time.sleep(0.1)
        assert page is not None, "no metrics served"
        assert found[("percolite_lease_holders", ())] >= 1.0, page
        assert found[("percolite_queue_depth", (("queue", "counts"),))] == 0.0
        busy = run_command(worker_command(db, port, "--until-idle"), cwd=TESTS_DIR, timeout=60)
        assert busy.returncode == 2
        assert f"--metrics-port {port}: the address is already in use" in busy.stderr
    finally:
        worker.terminate()
        worker.communicate(timeout=30)


@pytest.mark.parametrize("port", [0, -1, 70000])
def test_bad_metrics_port_is_a_usage_error(tmp_path, port):
    db = tmp_path / "db"
    with percolite.open(db, app=make_app(), sync="none"):
        pass
    result = run_command(worker_command(db, port, "--until-idle"), cwd=TESTS_DIR, timeout=60)
    assert result.returncode == 2
    assert "--metrics-port must be a port number from 1 to 65535" in result.stderr


APP = make_app()
