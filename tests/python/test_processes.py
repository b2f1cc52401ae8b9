"""Several processes on one store, and fork().
Each test drives its processes from a child interpreter with a timeout; their
code is in children/processes.py. lmdb only: a store that other processes
share (test_backends has the memory store in a forked child)."""

from __future__ import annotations

import json
import time

import children.processes
import percolite
from _isolated import finish_child, run_child, start_child
from conftest import COL


def test_two_processes_increment_one_counter(store_path, tmp_path):
    percolite.open(store_path).close()  # create it before the race
    go_file = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [start_child(children.processes.incrementer, store_path, r, go_file) for r in ready]
    deadline = time.monotonic() + 30
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break  # a worker died early: finish_child reports it
        time.sleep(0.005)
    go_file.touch()
    outputs = [finish_child(p, timeout=60) for p in procs]
    with percolite.open(store_path) as env:
        tx = env.transaction()
        assert tx.get("counter", ("stats", "n")) == b"600"
        tx.abort()
    merged = [tuple(r) for out in outputs for r in json.loads(out)]
    assert len(merged) == 600
    assert len({ts for ts, _ in merged}) == 600, "commit_ts must be unique across processes"
    # Serial order: sorted by commit_ts, the increments wrote 1, 2, ..., 600.
    assert [value for _, value in sorted(merged)] == list(range(1, 601))


def test_conflict_detected_across_processes(store_path):
    env = percolite.open(store_path, sync="none")
    with env.transaction() as tx:
        tx.set("x", COL, "orig")
    mine = env.transaction()
    run_child(children.processes.write_x, store_path, timeout=30)
    assert mine.get("x", COL) == b"orig"  # still the snapshot
    mine.set("x", COL, "mine")
    mine.set("y", COL, "mine")
    try:
        mine.commit()
    except percolite.CommitConflict:
        pass
    else:
        raise AssertionError("a write by another process after start_ts must conflict")
    tx = env.transaction()
    assert tx.get("x", COL) == b"other-process"
    assert tx.get("y", COL) is None
    tx.abort()
    env.close()


def test_env_used_in_forked_child_raises_error(store_path):
    out = run_child(children.processes.fork_and_use_the_store, store_path, timeout=30)
    lines = out.split()
    # 0: the child got percolite.Error naming fork for env.transaction() and for
    # the inherited transaction, and could open the store again itself.
    assert "child-exit" in lines and lines[lines.index("child-exit") + 1] == "0", out
    assert "parent-ok" in lines
    with percolite.open(store_path, sync="none") as env:
        tx = env.transaction()
        assert tx.get("parent", COL) == b"after-fork"
        assert tx.get("child", COL) == b"reopened"
        tx.abort()
