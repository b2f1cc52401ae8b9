"""The export queue across processes, into a real SQLite file: a worker killed
with SIGKILL in the middle of exporting, two worker processes with an exporter
failing on 30% of its calls, and the Export Queue recipe's inverted index (old and new count
rows) built under concurrency. Each ends with the sink equal to the
reference: at least once, duplicates absorbed by the seq guard. The workers
run children/exports_app.py. lmdb only: processes share the store.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import percolite
from _isolated import TESTS_DIR, load_fresh, run_command


def load_app(sink: Path):
    """The app the workers run (children/exports_app.py), exporting to ``sink``."""
    os.environ["SINK"] = str(sink)
    return load_fresh("children.exports_app")


def setup(tmp_path: Path):
    sink = tmp_path / "sink.sqlite"
    with sqlite3.connect(sink) as db:
        db.execute("CREATE TABLE ici(count INTEGER, row TEXT, PRIMARY KEY(count, row))")
        db.execute("CREATE TABLE ici_seq(row TEXT PRIMARY KEY, seq INTEGER)")
    return sink, load_app(sink)


def worker_command(db: Path, *args: str) -> list:
    app = "children.exports_app:app"
    return [sys.executable, "-m", "percolite", "worker", app, "--db", str(db), *args]


def environment(sink: Path, **extra: str) -> dict:
    env = dict(os.environ, SINK=str(sink), **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH")]))
    return env


def load_entries(db: Path, module, n_tx: int = 300, seed: int = 1) -> tuple[dict, int]:
    """Adds entries (updates and deletes of 150 keys) in ``n_tx`` transactions;
    returns the reference (the last committed value per key, deleted keys
    absent) and how many entries were added."""
    rng = random.Random(seed)
    reference: dict = {}
    added = 0
    with percolite.open(db, app=module.app, sync="none") as env:
        for _ in range(n_tx):
            batch = {f"k{rng.randrange(150)}": rng.randrange(1000) for _ in range(10)}
            for key in list(batch)[:2]:
                if rng.random() < 0.2:
                    batch[key] = None
            with env.transaction() as tx:
                for key, value in batch.items():
                    module.kv.add(tx, key, value)
            added += len(batch)
            for key, value in batch.items():
                if value is None:
                    reference.pop(key, None)
                else:
                    reference[key] = value
    return reference, added


def kv_rows(sink: Path) -> dict:
    with sqlite3.connect(sink) as db:
        return dict(db.execute("SELECT k, v FROM kv").fetchall())


def queued(db: Path, module) -> int:
    with percolite.open(db, sync="none") as env, env.transaction() as tx:
        return module.kv.depth(tx)


def test_worker_killed_mid_export_loses_nothing(tmp_path):
    sink, module = setup(tmp_path)
    db = tmp_path / "db"
    reference, total = load_entries(db, module)
    assert queued(db, module) == total > 2500
    worker = subprocess.Popen(
        worker_command(db, "--threads", "3"),
        cwd=TESTS_DIR,
        env=environment(sink, EXPORT_SLEEP="0.02"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and worker.poll() is None:
            # Batches go in commit order, ~20 keys each: 120 of the 150 keys
            # take several batches, so some runs have committed (the rest not).
            if sink.exists() and len(kv_rows_safe(sink)) >= 120:
                break
            time.sleep(0.01)
        assert worker.poll() is None, f"the worker exited early: {worker.stderr.read()}"
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        worker.stderr.close()
    assert worker.returncode == -signal.SIGKILL
    left = queued(db, module)
    assert 0 < left < total, "killed after some but not all exports"
    done = run_command(
        worker_command(db, "--threads", "3", "--until-idle"),
        cwd=TESTS_DIR,
        env=environment(sink),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert queued(db, module) == 0
    assert kv_rows(sink) == reference


def kv_rows_safe(sink: Path) -> dict:
    try:
        return kv_rows(sink)
    except sqlite3.OperationalError:  # the table is not created yet
        return {}


def test_two_processes_with_30_percent_failures_end_equal_to_the_reference(tmp_path):
    sink, module = setup(tmp_path)
    db = tmp_path / "db"
    reference, _ = load_entries(db, module, seed=2)
    done = run_command(
        worker_command(db, "--processes", "2", "--threads", "2", "--until-idle"),
        cwd=TESTS_DIR,
        env=environment(sink, EXPORT_FAIL="0.3"),
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert queued(db, module) == 0
    assert kv_rows(sink) == reference
    with percolite.open(db, sync="none") as env:
        observers = {o["name"]: o for o in env.status()["observers"]}
    # Failures are counted per process and not persisted; the queue is empty
    # and nothing is pending, so every failed batch was delivered again.
    assert observers["export queue kv"]["pending"] == 0


def test_inverted_index_stays_consistent_under_concurrency(tmp_path):
    sink, module = setup(tmp_path)
    db = tmp_path / "db"
    rows = [f"r{i:03d}" for i in range(60)]
    with percolite.open(db, app=module.app, sync="none") as env:
        workers = subprocess.Popen(
            worker_command(db, "--processes", "2", "--threads", "2"),
            cwd=TESTS_DIR,
            env=environment(sink, EXPORT_FAIL="0.3"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:

            def adder(seed: int) -> None:
                rng = random.Random(seed)
                for _ in range(250):
                    row = rng.choice(rows)

                    def bump(tx, row=row):
                        n = int(tx.get(row, module.UPDATES, b"0"))
                        tx.set(row, module.UPDATES, str(n + 1))

                    env.run(bump)

            threads = [threading.Thread(target=adder, args=(s,)) for s in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert env.wait(timeout=120), json.dumps(env.status(), default=str)
        finally:
            os.killpg(workers.pid, signal.SIGTERM)
            workers.wait(timeout=30)
            workers.stderr.close()
        with env.transaction() as tx:
            counters = {r: int(tx.get(r, module.COUNTER, b"0")) for r in rows}
            assert all(tx.get(r, module.UPDATES) is None for r in rows)
    assert sum(counters.values()) == 4 * 250
    with sqlite3.connect(sink) as db_:
        index = db_.execute("SELECT count, row FROM ici").fetchall()
    assert sorted(index) == sorted((n, r) for r, n in counters.items() if n), (
        "the inverted index has orphaned or missing rows"
    )
