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
