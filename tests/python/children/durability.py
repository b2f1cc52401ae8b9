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


def observe_when_told(db, opened, go, checked, count):
    """Commit ``count`` notifications and start one worker thread, whose
    first run waits for ``go``; create ``opened``. Once ``go`` exists (the
    test holds the syncs first), print how many observer runs the thread
    made while the first run's commit waits for its sync, create
    ``checked``, and once the test lets the syncs pass, how many runs'
    writes are in the store."""
    count = int(count)
    runs = []
    app = percolite.App("held")

    @app.observer(("f", "in"), notify=percolite.STRONG)
    def copy(tx, row, column):
        while not os.path.exists(go):
            time.sleep(0.005)
        tx.set(row, ("f", "out"), tx.get(row, column))
        runs.append(row)

    env = percolite.open(db, app=app, sync="full")
    env.run(lambda tx: [tx.set(f"r{i:03d}", ("f", "in"), b"x") for i in range(count)])
    env.start_workers(1)
    open(opened, "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    deadline = time.monotonic() + 10
    while len(runs) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"runs while held: {len(runs)}")
    print(f"committing while held: {env.status(queues=False)['workers']['committing']}")
    open(checked, "w").close()
    env.wait(timeout=60)
    with env.transaction() as tx:
        print(f"then: {sum(1 for _ in tx.scan(columns=[('f', 'out')]))} written")
    env.close()
