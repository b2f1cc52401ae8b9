"""Combine queues processed by two worker processes (the CLI's
``worker module:app --processes 2 --until-idle``), with updates added from
another process while they run.

The workers run children/combine_app.py (and children/linger_app.py). The
checks (guarantee 1, the old/new chain of guarantee 2, exact final values)
are those of ``_combine_checks``; see its module docstring for how the
change observers record committed reports. lmdb only: processes share the
store.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import percolite
from _combine_checks import chain_violations, guarantee_1_violations, reference_sums
from _isolated import TESTS_DIR, load_fresh, run_command
from percolite._queue_rows import queue_depth

VOCABULARY = [f"word{i:02}" for i in range(60)]


def add_documents(db: Path, module, n: int, seed: int, adds: list) -> None:
    """n transactions, each adding one document's word counts (or removing a
    previously added document's); appends [commit_ts, key, delta] to adds."""
    rng = random.Random(seed)
    documents = []
    with percolite.open(db, app=module.app, sync="none") as env:
        for _ in range(n):
            if documents and rng.random() < 0.25:
                document = documents.pop(rng.randrange(len(documents)))
                update = {w: -c for w, c in document.items()}
            else:
                document = Counter(rng.choices(VOCABULARY, k=rng.randint(1, 10)))
                documents.append(document)
                update = dict(document)
            tx = env.transaction()
            module.words.add(tx, update)
            tx.commit()
            adds.extend([tx.commit_ts, json.dumps(w), d] for w, d in update.items())


def read_state(db: Path, module) -> dict:
    state = {"reports": {"w": {}, "h": {}}, "pids": set()}
    with percolite.open(db, app=module.app, sync="none") as env:
        with env.transaction() as tx:
            state["words"] = {json.dumps(k): v for k, v in module.words.scan(tx)}
            state["hist"] = {json.dumps(k): v for k, v in module.hist.scan(tx)}
            for tag in ("w", "h"):
                prefix = f"log:{tag}:".encode()
                for row, column, value in tx.scan(prefix=prefix):
                    old, new, pid = json.loads(value)
                    state["reports"][tag].setdefault(row[len(prefix) :].decode(), []).append(
                        [int(column.qualifier), old, new]
                    )
                    state["pids"].add(pid)
            state["queued"] = queue_depth(tx, b"wc:u:") + queue_depth(tx, b"hist:u:")
        status = env.status()
    state["pending"] = status["pending"]
    state["failures"] = {o["name"]: o["failures"] for o in status["observers"]}
    return state


def workers(db: Path):
    return run_command(
        [
            sys.executable,
            "-m",
            "percolite",
            "worker",
            "children.combine_app:app",
            "--db",
            str(db),
            "--processes",
            "2",
            "--threads",
            "2",
            "--until-idle",
        ],
        cwd=TESTS_DIR,
        timeout=60,
        env={**os.environ, "COMBINE_APP_CHANGE_DELAY": "0.05"},
    )


def test_two_worker_processes_on_the_same_queues_end_exact(tmp_path):
    db = tmp_path / "db"
    module = load_fresh("children.combine_app")
    adds: list = []
    add_documents(db, module, 300, seed=1, adds=adds)

    done = workers(db)
    assert done.returncode == 0, done.stderr
    first = read_state(db, module)
    assert first["words"] == reference_sums(adds)
    assert first["queued"] == 0 and first["pending"] == 0
    assert len(first["pids"]) == 2, "both worker processes processed buckets"

    # More documents, added from this process while both worker processes run
    # (they may go idle before the adder finishes: a second pass finishes).
    adder = threading.Thread(target=add_documents, args=(db, module, 400, 2, adds))
    adder.start()
    try:
        during = workers(db)
    finally:
        adder.join()
    assert during.returncode == 0, during.stderr
    done = workers(db)
    assert done.returncode == 0, done.stderr

    state = read_state(db, module)
    assert state["failures"] == {"combine queue wc": 0, "combine queue hist": 0}
    assert state["queued"] == 0 and state["pending"] == 0
    assert state["words"] == reference_sums(adds)
    histogram = Counter(state["words"].values())
    assert state["hist"] == {json.dumps(count): n for count, n in histogram.items()}
    assert chain_violations(state["reports"]["w"], state["words"]) == []
    assert chain_violations(state["reports"]["h"], state["hist"]) == []
    assert guarantee_1_violations(adds, state["reports"]["w"]) == []


def test_wait_without_workers_hurries_worker_processes(tmp_path):
    """A worker process lingers 600 s on a bucket; env.wait in another process
    (with no workers of its own) signals it through the store directory, so the
    update is folded at once instead of minutes later."""
    module = load_fresh("children.linger_app")
    db = tmp_path / "db"
    with percolite.open(db, app=module.app, sync="none") as env:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "percolite",
                "worker",
                "children.linger_app:app",
                "--db",
                str(db),
            ],
            cwd=TESTS_DIR,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            with env.transaction() as tx:
                module.hot.add(tx, {"k": 5})
            time.sleep(2.0)  # the worker starts, runs the bucket and defers it
            with env.transaction() as tx:
                assert module.hot.get(tx, "k") is None, "not lingering: folded already"
            assert env.status(queues=False)["pending"] == 1
            began = time.monotonic()
            idle = env.wait(timeout=30)
            seconds = time.monotonic() - began
            with env.transaction() as tx:
                assert module.hot.get(tx, "k") == 5
        finally:
            worker.send_signal(signal.SIGTERM)
            _out, err = worker.communicate(timeout=30)
    assert idle is True and seconds < 10, seconds
    assert worker.returncode == 0, err
    assert (db / "waiting").exists()
