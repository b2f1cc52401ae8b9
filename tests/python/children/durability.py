"""Children of test_durability.py: a process whose durable writes the
sync_gate shim holds or fails (it runs with LD_PRELOAD set by the test)."""

from __future__ import annotations

import os
import time

import percolite

COL = ("f", "q")


def commit_when_told(db, opened, go):
    """Open ``db``, create ``opened``, wait for ``go`` to exist, then commit
    one cell; print what happened, and what a later call on the handle does."""
    env = percolite.open(db, sync="full")
    open(opened, "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    try:
        env.run(lambda tx: tx.set("r", COL, b"durable"), retries=0)
        print("committed")
    except percolite.Error as e:
        print(f"commit failed: {type(e).__name__}: {e}")
        try:
            env.transaction()
            print("then: a transaction began")
        except percolite.Error as later:
            print(f"then: {type(later).__name__}: {later}")
    env.close()


def load_when_told(db, opened, go, held, checked):
    """Submit one transaction through a loader once ``go`` exists; while its
    sync is held (``held`` exists), check that its future has not resolved,
    then create ``checked`` and wait for the future."""
    env = percolite.open(db, sync="full")
    open(opened, "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    with env.loader() as loader:
        future = loader.submit(lambda tx: tx.set("r", COL, b"loaded") or "done")
        while not os.path.exists(held):
            time.sleep(0.005)
        time.sleep(0.3)
        print(f"while held: done={future.done()}")
        open(checked, "w").close()
        print(f"then: {future.result(timeout=30)}")
    env.close()
