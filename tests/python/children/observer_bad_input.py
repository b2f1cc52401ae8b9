"""Children of test_observer_bad_input.py: misuse around observers and workers."""

from __future__ import annotations

import json
import threading
import time

import percolite

from children import open_store


def register_while_workers_run(backend, db):
    """Registers an observer while workers run (refused), then after they
    stopped (accepted, and it runs); prints what happened."""
    app = percolite.App()

    @app.observer(("doc", "content"))
    def first(tx, row, column):
        tx.set(row, ("doc", "first"), "1")

    env = open_store(backend, db, app=app, sync="none")
    env.start_workers(2)
    try:

        @app.observer(("doc", "other"))
        def late(tx, row, column):
            tx.set(row, ("doc", "late"), "1")
    except Exception as e:
        refused = [type(e).__name__, isinstance(e, percolite.Error), str(e)]
    else:
        refused = None
    observers_while_running = [o.name for o in app.observers]
    env.stop_workers()

    # Once the workers are stopped, registering works and the new observer runs.
    @app.observer(("doc", "other"))
    def late(tx, row, column):
        tx.set(row, ("doc", "late"), "1")

    with env.transaction() as tx:
        tx.set("doc:1", ("doc", "content"), "x")
        tx.set("doc:1", ("doc", "other"), "y")
    totals = env.process(threads=2, timeout=20)
    with env.transaction() as tx:
        outputs = [tx.get("doc:1", ("doc", "first")), tx.get("doc:1", ("doc", "late"))]
    print(
        json.dumps(
            {
                "refused": refused,
                "observers_while_running": observers_while_running,
                "observers": [o.name for o in app.observers],
                "idle": totals["idle"],
                "outputs": [None if v is None else v.decode() for v in outputs],
            }
        )
    )
    env.close()


def start_workers_twice(backend, db):
    """Starts workers twice; prints the second call's error and whether the
    first workers still run."""
    app = percolite.App()
    app.add_observer(("doc", "content"), lambda tx, row, column: None)
    env = open_store(backend, db, app=app, sync="none")
    env.start_workers(1)
    try:
        env.start_workers(1)
    except percolite.Error as e:
        second = type(e).__name__
    else:
        second = None
    running = env.status()["workers"]["running"]
    env.close()
    print(json.dumps({"second": second, "running": running}))


# What a misbehaving observer does with its own transaction.
MISUSES = {
    "commit": lambda tx: tx.commit(),
    "abort": lambda tx: tx.abort(),
    "with": lambda tx: tx.__enter__(),
}


def misusing_observer(backend, db, misuse):
    """An observer that does ``MISUSES[misuse]`` to its transaction until
    told to stop: prints its failures while misbehaving and what happens
    once it behaves."""
    misuse = MISUSES[misuse]
    app = percolite.App()
    misbehave = threading.Event()
    misbehave.set()

    @app.observer(("doc", "content"))
    def index(tx, row, column):
        tx.set(row, ("doc", "words"), str(len(tx.get(row, column).split())))
        if misbehave.is_set():
            misuse(tx)

    env = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        tx.set("doc:1", ("doc", "content"), "three little words")
    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    deadline = time.monotonic() + 20
    while env.status()["observers"][0]["failures"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    failing = env.status()
    with env.transaction() as tx:
        words_while_failing = tx.get("doc:1", ("doc", "words"))
    misbehave.clear()
    idle = env.wait(timeout=20)
    env.stop_workers()
    with env.transaction() as tx:
        words = tx.get("doc:1", ("doc", "words"))
    final = env.status()
    print(
        json.dumps(
            {
                "failures": failing["observers"][0]["failures"],
                "last_error": failing["observers"][0]["last_error"],
                "pending_while_failing": failing["pending"],
                "words_while_failing": words_while_failing is not None,
                "idle": idle,
                "words": None if words is None else words.decode(),
                "commits": final["observers"][0]["commits"],
                "pending": final["pending"],
            }
        )
    )
    env.close()
