"""Several processes on one store, and fork() (design.md sections 3 and 8).
Each test drives its processes from a child interpreter with a timeout."""

from __future__ import annotations

import json
import time

import percolite
from conftest import COL, finish_isolated, start_isolated

_INCREMENTER = """
import json, os, sys, time
import percolite

path, ready_file, go_file = sys.argv[1], sys.argv[2], sys.argv[3]
COL = ("stats", "n")

def increment(tx):
    value = int(tx.get("counter", COL, b"0")) + 1
    tx.set("counter", COL, str(value))
    return tx, value

env = percolite.open(path)  # default sync="full"
open(ready_file, "w").close()
while not os.path.exists(go_file):  # start together, so the two really collide
    time.sleep(0.001)
done = []
for _ in range(300):
    tx, value = env.run(increment, retries=None)
    done.append((tx.commit_ts, value))
env.close()
print(json.dumps(done))
"""


def test_two_processes_increment_one_counter(store_path, tmp_path):
    percolite.open(store_path).close()  # create it before the race
    go_file = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [start_isolated(_INCREMENTER, store_path, r, go_file) for r in ready]
    deadline = time.monotonic() + 30
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break  # a worker died early: finish_isolated reports it
        time.sleep(0.005)
    go_file.touch()
    outputs = [finish_isolated(p, timeout=60) for p in procs]
    with percolite.open(store_path) as env:
        tx = env.transaction()
        assert tx.get("counter", ("stats", "n")) == b"600"
        tx.abort()
    merged = [tuple(r) for out in outputs for r in json.loads(out)]
    assert len(merged) == 600
    assert len({ts for ts, _ in merged}) == 600, "commit_ts must be unique across processes"
    # Serial order: sorted by commit_ts, the increments wrote 1, 2, ..., 600.
    assert [value for _, value in sorted(merged)] == list(range(1, 601))


def test_conflict_detected_across_processes(store_path, run_isolated):
    env = percolite.open(store_path, sync="none")
    with env.transaction() as tx:
        tx.set("x", COL, "orig")
    mine = env.transaction()
    run_isolated(
        """
        import sys, percolite
        with percolite.open(sys.argv[1], sync="none") as env:
            with env.transaction() as tx:
                tx.set("x", ("f", "q"), "other-process")
        """,
        store_path,
        timeout=30,
    )
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


_FORK_CHILD = """
import os, sys
import percolite

path = sys.argv[1]
env = percolite.open(path, sync="none")
with env.transaction() as tx:
    tx.set("parent", ("f", "q"), "before-fork")
open_tx = env.transaction()

pid = os.fork()
if pid == 0:
    # The child: the parent's handle and transaction must refuse, not crash.
    code = 0
    try:
        env.transaction()
        code |= 1
    except percolite.Error as e:
        if "fork" not in str(e) or isinstance(e, percolite.ClosedError):
            code |= 2
    except BaseException:
        code |= 4
    try:
        open_tx.get("parent", ("f", "q"))
        code |= 8
    except percolite.Error:
        pass
    except BaseException:
        code |= 16
    try:
        # Opening the store again in the child is the documented way.
        with percolite.open(path, sync="none") as again:
            with again.transaction() as tx:
                if tx.get("parent", ("f", "q")) != b"before-fork":
                    code |= 32
                tx.set("child", ("f", "q"), "reopened")
    except BaseException as e:
        sys.stderr.write("child reopen failed: %r\\n" % (e,))
        code |= 64
    sys.stderr.flush()
    os._exit(code)

_, status = os.waitpid(pid, 0)
print("child-exit", os.waitstatus_to_exitcode(status))
# The parent's handle and its open transaction still work.
assert open_tx.get("parent", ("f", "q")) == b"before-fork"
open_tx.abort()
with env.transaction() as tx:
    assert tx.get("child", ("f", "q")) == b"reopened"
    tx.set("parent", ("f", "q"), "after-fork")
env.close()
print("parent-ok")
"""


def test_env_used_in_forked_child_raises_error(store_path, run_isolated):
    out = run_isolated(_FORK_CHILD, store_path, timeout=30)
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
