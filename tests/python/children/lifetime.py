"""Children of test_lifetime.py: handles whose last reference goes away on a
worker thread."""

from __future__ import annotations

import gc
import threading
import time

import percolite

from children import open_store

COL = ("f", "q")
DONE = ("f", "done")


def drop_an_env_inside_an_observer(backend, db, other_db):
    """An observer drops the last reference to another store's handle (still
    open, with workers running), then to its own store's."""
    others = [open_store(backend, other_db, sync="none")]
    others[0].start_workers(1)
    app = percolite.App()
    dropped = []

    @app.observer(COL)
    def observe(tx, row, column):
        if others:
            others.pop()  # the last reference: freed here, on a worker thread
            gc.collect()
            dropped.append(row)

    env = open_store(backend, db, app=app, sync="none")
    env.start_workers(2)
    env.run(lambda tx: tx.set("r", COL, b"v"))
    print("idle:", env.wait(timeout=30), "dropped:", len(dropped))
    env.close()


# How long each freed handle's own observer is still running after its handle
# is freed: far longer than this process takes to exit once nothing waits.
BUSY_SECONDS = 1.0


def _busy_app(started):
    """An app whose observer signals that it runs, sleeps BUSY_SECONDS (the
    GIL released), then writes the cell DONE of its row."""
    app = percolite.App()

    @app.observer(COL)
    def busy(tx, row, column):
        started.set()
        time.sleep(BUSY_SECONDS)
        tx.set(row, DONE, b"finished")

    return app


def free_busy_envs_on_a_worker_thread_then_exit(db, other_db, count):
    """An observer frees the last references to the handles of ``count``
    other lmdb stores (``other_db`` + 0, 1, ...) while each one's own
    observer is still running, then this process exits at once. The threads
    that close those handles let the runs finish and commit (the parent
    reads DONE), and the interpreter must wait for them: it ends a thread
    that takes the GIL while it finalizes."""
    started = [threading.Event() for _ in range(count)]
    others = [
        percolite.open(f"{other_db}{i}", app=_busy_app(started[i]), sync="none")
        for i in range(count)
    ]
    for other in others:
        other.start_workers(1)
        other.run(lambda tx: tx.set("r", COL, b"v"))
    del other  # `others` holds the only references
    running = sum(event.wait(timeout=30) for event in started)
    app = percolite.App()
    dropped = []

    @app.observer(COL)
    def observe(tx, row, column):
        while others:
            others.pop()  # the last reference: freed here, on a worker thread
            gc.collect()
            dropped.append(row)

    env = percolite.open(db, app=app, sync="none")
    env.start_workers(1)
    env.run(lambda tx: tx.set("r", COL, b"v"))
    print("running:", running, "idle:", env.wait(timeout=30), "dropped:", len(dropped))
    env.close()
