"""Children of test_notifications.py: the delivery contract of notifications.

Observers count their runs with side effects written in their own
transaction, so only runs that committed are counted: a counter cell, and one
marker cell with a unique qualifier per run (two committed runs leave two
markers even if they raced on the counter). An observer defined inside a
function is named by its ``__qualname__``; the children that look an
observer up by name give that name explicitly.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import percolite

from children import open_store

CONTENT = ("doc", "content")
RUNS = ("obs", "runs")


def record_run(tx, row, **extra):
    """Side effects in the observer's own transaction: only committed runs count."""
    tx.set(row, RUNS, str(int(tx.get(row, RUNS, b"0")) + 1))
    tx.set(row, ("obs", "run:" + uuid.uuid4().hex), json.dumps(extra))


def committed_runs(env):
    """{row: [counter, markers]} for every row an observer committed a run for."""
    out = {}
    with env.transaction() as tx:
        for row, column, value in tx.scan():
            if column.family != b"obs":
                continue
            entry = out.setdefault(row.decode(), [0, 0])
            if column.qualifier == b"runs":
                entry[0] = int(value)
            elif column.qualifier.startswith(b"run:"):
                entry[1] += 1
    return out


def markers(env, row):
    """The extra data each committed run of ``row`` recorded."""
    with env.transaction() as tx:
        return [
            json.loads(value)
            for r, column, value in tx.scan(prefix=row)
            if r == row.encode()
            and column.family == b"obs"
            and column.qualifier.startswith(b"run:")
        ]


def observer_stats(env):
    return {o["name"]: o for o in env.status()["observers"]}


def strong_once(backend, db, n, when):
    """``n`` rows, strongly notified before the workers start (processed with
    env.process) or while 8 worker threads run."""
    app = percolite.App()

    @app.observer(CONTENT, notify=percolite.STRONG)
    def index(tx, row, column):
        tx.get(row, column)
        record_run(tx, row)

    env = open_store(backend, db, app=app, sync="none")
    rows = [f"doc:{i:04}" for i in range(n)]

    def load():
        for start in range(0, n, 20):
            with env.transaction() as tx:
                for row in rows[start : start + 20]:
                    tx.set(row, CONTENT, "some words " + row)

    if when == "before_workers":
        load()
        totals = env.process(threads=8, timeout=40)
    else:
        env.start_workers(8)
        load()
        idle = env.wait(timeout=40)
        env.stop_workers()
        totals = dict(env.status()["observers"][0], idle=idle)
        del totals["family"], totals["qualifier"]
    print(
        json.dumps(
            {
                "runs": committed_runs(env),
                "totals": totals,
                "pending": env.status()["pending"],
                "rows": rows,
            }
        )
    )
    env.close()


def strong_sets_collapse(backend, db):
    """Five commits set one observed cell before any run."""
    app = percolite.App()

    @app.observer(CONTENT)
    def index(tx, row, column):
        record_run(tx, row, seen=tx.get(row, column).decode())

    env = open_store(backend, db, app=app, sync="none")
    for i in range(5):
        with env.transaction() as tx:
            tx.set("doc:1", CONTENT, f"version {i}")
    pending_before = env.status()["pending"]
    totals = env.process(threads=4, timeout=20)
    print(
        json.dumps(
            {
                "pending_before": pending_before,
                "totals": totals,
                "runs": committed_runs(env),
                "markers": markers(env, "doc:1"),
                "pending_after": env.status()["pending"],
            }
        )
    )
    env.close()


def strong_set_during_a_run(backend, db):
    """The observed cell is set again while its observer runs (blocked)."""
    app = percolite.App()
    started, release = threading.Event(), threading.Event()

    @app.observer(CONTENT, name="index")
    def index(tx, row, column):
        value = tx.get(row, column).decode()
        first = not started.is_set()
        if first:
            started.set()
            assert release.wait(20), "the test never released the observer"
        record_run(tx, row, seen=value, first=first)

    env = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        tx.set("doc:1", CONTENT, "old")
    env.start_workers(2)
    assert started.wait(20), "the observer never ran"
    # The observer is running (blocked); set the observed cell again.
    with env.transaction() as tx:
        tx.set("doc:1", CONTENT, "new")
    pending_during = env.status()["pending"]
    release.set()
    idle = env.wait(timeout=20)
    time.sleep(0.2)  # a third run, if there were one, would be under way by now
    idle_again = env.wait(timeout=20)
    env.stop_workers()
    print(
        json.dumps(
            {
                "idle": idle and idle_again,
                "pending_during": pending_during,
                "runs": committed_runs(env),
                "markers": markers(env, "doc:1"),
                "stats": observer_stats(env)["index"]["commits"],
            }
        )
    )
    env.close()


def delete_does_not_notify(backend, db):
    """Set, delete, set again an observed cell, processing after each."""
    app = percolite.App()

    @app.observer(CONTENT)
    def index(tx, row, column):
        record_run(tx, row, value=None if tx.get(row, column) is None else "set")

    env = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        tx.set("doc:1", CONTENT, "hello")
    first = env.process(threads=2, timeout=20)
    with env.transaction() as tx:
        tx.delete("doc:1", CONTENT)
    pending_after_delete = env.status()["pending"]
    second = env.process(threads=2, timeout=20)
    # Setting it again notifies again.
    with env.transaction() as tx:
        tx.set("doc:1", CONTENT, "back")
    pending_after_set = env.status()["pending"]
    third = env.process(threads=2, timeout=20)
    print(
        json.dumps(
            {
                "commits": [first["commits"], second["commits"], third["commits"]],
                "pending": [pending_after_delete, pending_after_set],
                "runs": committed_runs(env),
            }
        )
    )
    env.close()


def run_stored_notifications(db):
    """Processes the notifications an earlier process stored."""
    app = percolite.App()

    @app.observer(CONTENT)
    def index(tx, row, column):
        record_run(tx, row)

    env = percolite.open(db, app=app, sync="none")
    env.process(threads=2, timeout=20)
    print(json.dumps({"runs": committed_runs(env), "pending": env.status()["pending"]}))
    env.close()


def long_rows(backend, db):
    """Rows of 700 to 900 bytes, notified before and while workers run."""
    app = percolite.App()
    BUCKET = ("q", "bucket")

    @app.observer(CONTENT)
    def index(tx, row, column):
        record_run(tx, row, length=len(row))

    @app.observer(BUCKET, notify=percolite.WEAK)
    def drain(tx, row, column):
        record_run(tx, row, length=len(row))

    env = open_store(backend, db, app=app, sync="none")
    rows = ["long:" + str(i) * 700 for i in range(4)] + ["long:weak:" + "w" * 900]
    with env.transaction() as tx:  # found by the scanner
        tx.set(rows[0], CONTENT, "x")
        tx.set(rows[1], CONTENT, "x")
        tx.set_weak_notification(rows[4], BUCKET)
    pending_before = env.status()["pending"]
    env.start_workers(2)
    with env.transaction() as tx:  # handed over by the commit
        tx.set(rows[2], CONTENT, "x")
        tx.set(rows[3], CONTENT, "x")
    idle = env.wait(timeout=20)
    env.stop_workers()
    print(
        json.dumps(
            {
                "pending_before": pending_before,
                "idle": idle,
                "runs": committed_runs(env),
                "rows": rows,
                "lengths": [m["length"] for r in rows for m in markers(env, r)],
            }
        )
    )
    env.close()


def weak_at_least_once(backend, db, n):
    """``n`` rows weakly notified, half before the workers start."""
    app = percolite.App()
    BUCKET = ("q", "bucket")

    @app.observer(BUCKET, notify=percolite.WEAK)
    def drain(tx, row, column):
        record_run(tx, row)

    env = open_store(backend, db, app=app, sync="none")
    rows = [f"bucket:{i:03}" for i in range(n)]
    # Half notified before the workers start, half while they run; some
    # transactions carry writes, some only the notification.
    for i, row in enumerate(rows[: n // 2]):
        with env.transaction() as tx:
            tx.set_weak_notification(row, BUCKET)
            if i % 2:
                tx.set(row, ("q", "data"), "x")
    env.start_workers(4)
    for i, row in enumerate(rows[n // 2 :]):
        with env.transaction() as tx:
            tx.set_weak_notification(row, BUCKET)
            tx.set_weak_notification(row, BUCKET)  # twice in one transaction
            if i % 2:
                tx.set(row, ("q", "data"), "x")
    idle = env.wait(timeout=30)
    env.stop_workers()
    print(
        json.dumps(
            {
                "idle": idle,
                "rows": rows,
                "runs": committed_runs(env),
                "pending": env.status()["pending"],
            }
        )
    )
    env.close()


def weak_coalesce(backend, db):
    """Four commits weakly notify one cell before any run."""
    app = percolite.App()
    BUCKET = ("q", "bucket")

    @app.observer(BUCKET, notify=percolite.WEAK)
    def drain(tx, row, column):
        record_run(tx, row)

    env = open_store(backend, db, app=app, sync="none")
    for _ in range(4):
        with env.transaction() as tx:
            tx.set_weak_notification("bucket:1", BUCKET)
    pending_before = env.status()["pending"]
    totals = env.process(threads=4, timeout=20)
    print(
        json.dumps(
            {
                "pending_before": pending_before,
                "totals": totals,
                "runs": committed_runs(env),
                "pending": env.status()["pending"],
            }
        )
    )
    env.close()


def weak_never_collides(backend, db):
    """Weak notifications of a cell committed during and after its
    observer's run."""
    app = percolite.App()
    BUCKET = ("q", "bucket")
    started, release = threading.Event(), threading.Event()

    @app.observer(BUCKET, notify=percolite.WEAK, name="drain")
    def drain(tx, row, column):
        # Reads and writes other cells of the row (and another row).
        tx.set(row, ("q", "cursor"), str(int(tx.get(row, ("q", "cursor"), b"0")) + 1))
        tx.set("summary", ("q", "last"), row)
        if not started.is_set():
            started.set()
            assert release.wait(20), "the test never released the observer"
        record_run(tx, row)

    env = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        tx.set_weak_notification("bucket:1", BUCKET)
    env.start_workers(2)
    assert started.wait(20), "the observer never ran"
    conflicts = []

    def setter(tx):
        tx.set_weak_notification("bucket:1", BUCKET)
        tx.set("bucket:1", ("q", "data:" + uuid.uuid4().hex), "queued")

    # 1. Begun and committed while the observer's run is under way.
    tx = env.transaction()
    setter(tx)
    try:
        tx.commit()
    except percolite.CommitConflict as e:
        conflicts.append("during: " + str(e))
    # 2. Begun while the run is under way, committed after the run committed.
    late = env.transaction()
    setter(late)
    release.set()
    deadline = time.monotonic() + 20
    while observer_stats(env)["drain"]["commits"] < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    try:
        late.commit()
    except percolite.CommitConflict as e:
        conflicts.append("after: " + str(e))
    idle = env.wait(timeout=20)
    env.stop_workers()
    stats = observer_stats(env)["drain"]
    print(
        json.dumps(
            {
                "idle": idle,
                "conflicts": conflicts,
                "runs": committed_runs(env),
                "observer_conflicts": stats["conflicts"],
                "failures": stats["failures"],
            }
        )
    )
    env.close()


def weak_renotifies_itself(backend, db):
    """An observer draining 95 items 10 per run, re-notifying itself."""
    app = percolite.App()
    BUCKET = ("q", "bucket")

    @app.observer(BUCKET, notify=percolite.WEAK)
    def drain(tx, row, column):
        batch = []
        for cell in tx.scan(prefix="item:"):
            batch.append(cell)
            if len(batch) == 10:
                break
        for cell in batch:
            tx.delete(cell.row, cell.column)
            tx.set("done", ("out", cell.row), cell.value)
        record_run(tx, row, size=len(batch))
        if len(batch) == 10:
            tx.set_weak_notification(row, column)

    env = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        for i in range(95):
            tx.set(f"item:{i:03}", ("item", "value"), str(i))
        tx.set_weak_notification("bucket", BUCKET)
    totals = env.process(threads=2, timeout=30)
    with env.transaction() as tx:
        left = sum(1 for _ in tx.scan(prefix="item:"))
        done = sorted(int(value) for _, _, value in tx.scan(prefix="done"))
    print(
        json.dumps(
            {
                "totals": totals,
                "left": left,
                "done": done,
                "sizes": sorted(m["size"] for m in markers(env, "bucket")),
                "pending": env.status()["pending"],
            }
        )
    )
    env.close()


def chain_wait(backend, db, n):
    """Two chained observers; reads every row right after env.wait()."""
    app = percolite.App()
    UPPER, LENGTH = ("doc", "upper"), ("doc", "length")

    @app.observer(CONTENT)
    def upper(tx, row, column):
        tx.set(row, UPPER, tx.get(row, column).upper())

    @app.observer(UPPER)
    def length(tx, row, column):
        time.sleep(0.002)  # the downstream step is the slow one
        tx.set(row, LENGTH, str(len(tx.get(row, column))))

    env = open_store(backend, db, app=app, sync="none")
    env.start_workers(4)
    expected = {}
    for i in range(n):
        text = "word " * (i % 7 + 1) + str(i)
        expected[f"doc:{i:03}"] = [text.upper(), str(len(text))]
        with env.transaction() as tx:
            tx.set(f"doc:{i:03}", CONTENT, text)
    idle = env.wait(timeout=30)
    # Read right after wait() returned, before stopping anything.
    with env.transaction() as tx:
        got = {
            row: [(tx.get(row, UPPER) or b"").decode(), (tx.get(row, LENGTH) or b"").decode()]
            for row in expected
        }
    pending = env.status()["pending"]
    env.stop_workers()
    print(
        json.dumps(
            {
                "idle": idle,
                "pending": pending,
                "wrong": {r: v for r, v in got.items() if v != expected[r]},
            }
        )
    )
    env.close()


def failing_observer(backend, db):
    """An observer that raises until told to stop."""
    app = percolite.App()
    failing = threading.Event()
    failing.set()

    @app.observer(CONTENT, name="fragile", max_attempts=None)  # retried until it is fixed
    def fragile(tx, row, column):
        tx.set(row, ("doc", "partial"), "written before the failure")
        if failing.is_set():
            raise RuntimeError("fragile-observer-boom")
        record_run(tx, row)

    env = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        tx.set("doc:1", CONTENT, "x")
        tx.set("doc:2", CONTENT, "y")
    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    began = time.monotonic()
    deadline = began + 20
    while observer_stats(env)["fragile"]["failures"] < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
    failing_status = env.status()
    elapsed = time.monotonic() - began  # after the count: it bounds the failures counted
    idle_while_failing = env.wait(timeout=0.3)
    with env.transaction() as tx:
        partial = tx.get("doc:1", ("doc", "partial"))
    failing.clear()
    idle = env.wait(timeout=20)
    env.stop_workers()
    stats = observer_stats(env)["fragile"]
    print(
        json.dumps(
            {
                "failing": {
                    "pending": failing_status["pending"],
                    "failures": failing_status["observers"][0]["failures"],
                    "commits": failing_status["observers"][0]["commits"],
                    "last_error": failing_status["observers"][0]["last_error"],
                    "elapsed": elapsed,
                },
                "idle_while_failing": idle_while_failing,
                "partial_while_failing": partial is not None,
                "idle": idle,
                "runs": committed_runs(env),
                "pending": env.status()["pending"],
                "final": {k: stats[k] for k in ("failures", "commits")},
            }
        )
    )
    env.close()


def fair_scheduling(backend, db, n):
    """``n`` runs of ``slow`` (each blocks until released) and one of
    ``quick``, committed in one transaction, on two worker threads."""
    app = percolite.App()
    SLOW, QUICK = ("slow", "in"), ("quick", "in")
    release = threading.Event()
    lock = threading.Lock()
    state = {"now": 0, "started": 0}
    quick_saw_release = []

    @app.observer(SLOW, notify=percolite.STRONG, name="slow")
    def slow(tx, row, column):
        with lock:
            state["now"] += 1
            state["started"] += 1
        try:
            released = release.wait(20)
        finally:
            with lock:
                state["now"] -= 1
        record_run(tx, row, released=released)

    @app.observer(QUICK, notify=percolite.STRONG, name="quick")
    def quick(tx, row, column):
        quick_saw_release.append(release.is_set())
        record_run(tx, row)

    env = open_store(backend, db, app=app, sync="none")
    env.start_workers(2)
    with env.transaction() as tx:
        for i in range(n):
            tx.set(f"a:{i:02}", SLOW, "x")
        tx.set("b:0", QUICK, "x")
    began = time.monotonic()
    deadline = began + 10
    while observer_stats(env)["quick"]["commits"] < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    quick_commits = observer_stats(env)["quick"]["commits"]
    quick_after = time.monotonic() - began
    # quick is done: the freed thread goes back to slow, which now has both.
    while state["now"] < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    with lock:
        slow_during = dict(state)
    slow_commits_during = observer_stats(env)["slow"]["commits"]
    release.set()
    idle = env.wait(timeout=30)
    env.stop_workers()
    stats = observer_stats(env)
    print(
        json.dumps(
            {
                "quick_commits": quick_commits,
                "quick_after": quick_after,
                "quick_saw_release": quick_saw_release,
                "slow_during": slow_during,
                "slow_commits_during": slow_commits_during,
                "idle": idle,
                "runs": committed_runs(env),
                "released": sorted(
                    {m["released"] for i in range(n) for m in markers(env, f"a:{i:02}")}
                ),
                "commits": {name: stats[name]["commits"] for name in ("slow", "quick")},
            }
        )
    )
    env.close()


def conflict_retried_on_one_thread(backend, db):
    """One worker thread; the observer's first run loses a write-write
    conflict (a transaction of its own writes the same cell and commits
    first). Its commit comes back after the thread went to wait for work:
    the retry must still run."""
    app = percolite.App()
    attempts = []

    @app.observer(("in", "q"), notify=percolite.STRONG, name="racer")
    def racer(tx, row, column):
        attempts.append(time.monotonic())
        tx.set("shared", ("out", "q"), f"run {len(attempts)}")
        if len(attempts) == 1:
            env.run(lambda other: other.set("shared", ("out", "q"), "other"))

    env = open_store(backend, db, app=app, sync="full")
    env.start_workers(1)
    env.run(lambda tx: tx.set("r", ("in", "q"), "x"))
    idle = env.wait(timeout=10)
    stats = observer_stats(env)["racer"]
    with env.transaction() as tx:
        value = tx.get("shared", ("out", "q"))
    env.stop_workers()
    print(
        json.dumps(
            {
                "idle": idle,
                "attempts": len(attempts),
                "commits": stats["commits"],
                "conflicts": stats["conflicts"],
                "value": value.decode(),
            }
        )
    )
    env.close()
