"""Children of test_lifetime.py: handles whose last reference goes away on a
worker thread."""

from __future__ import annotations

import gc

import percolite

from children import open_store

COL = ("f", "q")


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
