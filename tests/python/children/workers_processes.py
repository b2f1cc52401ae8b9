"""Children of test_workers_processes.py: observers on worker threads, and
wait/stop_workers/close while observers run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

import percolite

from children import open_store

# State of the observer of busy_app: how many runs are in progress, and
# whether one has started.
busy_lock = threading.Lock()
in_progress = [0]
started = threading.Event()

# What busy_exit_with_observers_running leaves open when the interpreter exits.
left_running = []


def busy_app(sleep):
    """An app whose observer of ("doc", "content") sleeps ``sleep`` seconds,
    holds the GIL for a while, then counts its run (a counter cell and a
    marker cell per committed run)."""
    app = percolite.App()

    @app.observer(("doc", "content"))
    def busy(tx, row, column):
        with busy_lock:
            in_progress[0] += 1
        started.set()
        try:
            time.sleep(sleep)
            sum(range(20000))  # holds the GIL for a while
            tx.set(row, ("obs", "runs"), str(int(tx.get(row, ("obs", "runs"), b"0")) + 1))
            tx.set(row, ("obs", "run:" + uuid.uuid4().hex), "1")
        finally:
            with busy_lock:
                in_progress[0] -= 1

    return app


def load(env, n):
    for start in range(0, n, 10):
        with env.transaction() as tx:
            for i in range(start, min(n, start + 10)):
                tx.set(f"doc:{i:04}", ("doc", "content"), "x")


def runs(env):
    """{row: [counter, markers]} of the busy observer's committed runs."""
    out = {}
    with env.transaction() as tx:
        for row, column, value in tx.scan():
            if column == (b"obs", b"runs"):
                out.setdefault(row.decode(), [0, 0])[0] = int(value)
            elif column.family == b"obs":
                out.setdefault(row.decode(), [0, 0])[1] += 1
    return out


def observers_on_worker_threads(backend, db):
    app = percolite.App()
    lock = threading.Lock()
    idents, running, most = set(), [0], [0]

    @app.observer(("doc", "content"))
    def slow(tx, row, column):
        with lock:
            idents.add(threading.get_ident())
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)  # releases the GIL: other observers may run
        with lock:
            running[0] -= 1
        tx.set(row, ("doc", "done"), "1")

    env = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        for i in range(40):
            tx.set(f"doc:{i:02}", ("doc", "content"), "x")
    env.start_workers(4)
    # The main thread keeps running Python while the observers run.
    ticks = 0
    while not env.wait(timeout=0.01):
        ticks += 1
    threads = env.status()["workers"]["threads"]
    env.stop_workers()
    with env.transaction() as tx:
        done = sum(1 for _ in tx.scan(columns=[("doc", "done")]))
    print(
        json.dumps(
            {
                "main": threading.get_ident(),
                "idents": sorted(idents),
                "most": most[0],
                "done": done,
                "ticks": ticks,
                "threads": threads,
            }
        )
    )
    env.close()


def busy_wait(backend, db, sleep):
    app = busy_app(sleep)
    env = open_store(backend, db, app=app, sync="none")
    env.start_workers(4)
    load(env, 300)
    idle = env.wait()
    env.stop_workers()
    r = runs(env)
    print(
        json.dumps(
            {
                "idle": idle,
                "rows": len(r),
                "once": all(v == [1, 1] for v in r.values()),
                "pending": env.status()["pending"],
            }
        )
    )
    env.close()


def busy_stop_workers(backend, db, sleep):
    app = busy_app(sleep)
    env = open_store(backend, db, app=app, sync="none")
    load(env, 200)
    env.start_workers(4)
    assert started.wait(20)
    env.stop_workers()
    after_stop = {
        "in_progress": in_progress[0],
        "running": env.workers_running,
        "active": env.status()["workers"]["active"],
        "committing": env.status()["workers"]["committing"],
        "pending": env.status()["pending"],
        "rows": len(runs(env)),
    }
    env.stop_workers()  # idempotent
    totals = env.process(threads=4, timeout=30)
    r = runs(env)
    print(
        json.dumps(
            {
                "after_stop": after_stop,
                "idle": totals["idle"],
                "rows": len(r),
                "once": all(v == [1, 1] for v in r.values()),
                "pending": env.status()["pending"],
            }
        )
    )
    env.close()


def busy_close(db, sleep):
    app = busy_app(sleep)
    env = percolite.open(db, app=app, sync="none")
    load(env, 200)
    env.start_workers(4)
    assert started.wait(20)
    env.close()
    after_close = {"in_progress": in_progress[0], "closed": env.closed}
    try:
        env.wait(timeout=1)
    except percolite.ClosedError:
        after_close["wait"] = "ClosedError"
    env = percolite.open(db, app=app, sync="none")
    after_close["pending"] = env.status()["pending"]
    after_close["rows"] = len(runs(env))
    totals = env.process(threads=4, timeout=30)
    r = runs(env)
    print(
        json.dumps(
            {
                "after_close": after_close,
                "idle": totals["idle"],
                "rows": len(r),
                "once": all(v == [1, 1] for v in r.values()),
                "pending": env.status()["pending"],
            }
        )
    )
    env.close()


def busy_close_from_another_thread(backend, db, sleep):
    app = busy_app(sleep)
    env = open_store(backend, db, app=app, sync="none")
    load(env, 200)
    env.start_workers(2)
    assert started.wait(20)
    closer = threading.Timer(0.1, env.close)
    closer.start()
    began = time.monotonic()
    try:
        outcome = "returned " + str(env.wait(timeout=20))
    except percolite.ClosedError:
        outcome = "ClosedError"
    elapsed = time.monotonic() - began
    closer.join()
    print(
        json.dumps(
            {
                "outcome": outcome,
                "in_progress": in_progress[0],
                "closed": env.closed,
                "elapsed": elapsed,
            }
        )
    )


def busy_exit_with_observers_running(db, sleep):
    app = busy_app(sleep)
    env = percolite.open(db, app=app, sync="none")
    load(env, 200)
    env.start_workers(4)
    assert started.wait(20)
    print(json.dumps({}))
    # no stop_workers(), no close(): the interpreter exits with observers running
    # (a module global keeps the handle alive until then)
    left_running.append(env)


def busy_finish_after_exit(db, sleep):
    app = busy_app(sleep)
    env = percolite.open(db, app=app, sync="none")
    before = len(runs(env))
    pending = env.status()["pending"]
    env.process(threads=4, timeout=30)
    r = runs(env)
    print(
        json.dumps(
            {
                "before": before,
                "pending": pending,
                "rows": len(r),
                "once": all(v == [1, 1] for v in r.values()),
            }
        )
    )
    env.close()


def wait_interruptible(backend, db):
    app = percolite.App()

    @app.observer(("doc", "content"), max_attempts=None)  # retried forever: never parked
    def never(tx, row, column):
        raise RuntimeError("never succeeds")

    env = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        tx.set("doc:1", ("doc", "content"), "x")
    env.start_workers(2, retry_initial=0.01, retry_max=0.05)
    # Ctrl-C as a terminal sends it, even when this process was started with
    # SIGINT ignored (a background job of a non-interactive shell is).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    began = time.monotonic()
    try:
        env.wait()  # no timeout: only Ctrl-C ends it
        outcome = "returned"
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    elapsed = time.monotonic() - began
    env.close()
    print(json.dumps({"outcome": outcome, "elapsed": elapsed}))


def stop_or_close_inside_observer(backend, db, call):
    app = percolite.App()
    holder, outcomes = {}, []

    @app.observer(("doc", "content"))
    def stopper(tx, row, column):
        if not outcomes:
            try:
                getattr(holder["env"], call)()
                outcomes.append("returned")
            except percolite.Error:
                outcomes.append("percolite.Error")
                raise
            except BaseException as e:
                outcomes.append(f"{type(e).__name__}: {e}")
                raise
        tx.set(row, ("doc", "done"), "1")

    env = holder["env"] = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        tx.set("doc:1", ("doc", "content"), "x")
    env.start_workers(2, retry_initial=0.01, retry_max=0.05)
    try:
        env.wait(timeout=10)
    except percolite.ClosedError:
        pass
    env.close()
    print(json.dumps({"outcomes": outcomes}))
