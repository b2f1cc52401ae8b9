"""Notifications and observers: the delivery contract of design.md section 4.

Everything that starts workers runs in a child interpreter with a timeout
(``_isolated.run_isolated``), so a deadlock fails the test instead of hanging
the suite. Observers count their runs with side effects written in their own
transaction, so only runs that committed are counted: a counter cell, and one
marker cell with a unique qualifier per run (two committed runs leave two
markers even if they raced on the counter).
"""

from __future__ import annotations

import textwrap

import percolite
import pytest
from _isolated import run_isolated_json

# Shared by the child programs below: imports, and counting committed runs.
PRELUDE = """
import json, os, sys, threading, time, uuid
import percolite

CONTENT = ("doc", "content")
RUNS = ("obs", "runs")

def record_run(tx, row, **extra):
    # Side effects in the observer's own transaction: only committed runs count.
    tx.set(row, RUNS, str(int(tx.get(row, RUNS, b"0")) + 1))
    tx.set(row, ("obs", "run:" + uuid.uuid4().hex), json.dumps(extra))

def committed_runs(env):
    # {row: [counter, markers]} for every row an observer committed a run for.
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
    # The extra data each committed run of ``row`` recorded.
    with env.transaction() as tx:
        return [
            json.loads(value)
            for r, column, value in tx.scan(prefix=row)
            if r == row.encode() and column.family == b"obs"
            and column.qualifier.startswith(b"run:")
        ]

def observer_stats(env):
    return {o["name"]: o for o in env.status()["observers"]}
"""


def child(code: str, timeout: float = 60, **params):
    return run_isolated_json(PRELUDE + textwrap.dedent(code), timeout=timeout, **params)


# -- strong notifications -----------------------------------------------------


@pytest.mark.parametrize("when", ["before_workers", "while_workers_run"])
def test_strong_at_most_one_committed_run_per_notification_with_8_threads(tmp_path, when):
    result = child(
        """
        app = percolite.App()

        @app.observer(CONTENT, notify=percolite.STRONG)
        def index(tx, row, column):
            tx.get(row, column)
            record_run(tx, row)

        env = percolite.open(DB, app=app, sync="none")
        rows = [f"doc:{i:04}" for i in range(N)]

        def load():
            for start in range(0, N, 20):
                with env.transaction() as tx:
                    for row in rows[start:start + 20]:
                        tx.set(row, CONTENT, "some words " + row)

        if WHEN == "before_workers":
            load()
            totals = env.process(threads=8, timeout=40)
        else:
            env.start_workers(8)
            load()
            idle = env.wait(timeout=40)
            env.stop_workers()
            totals = dict(env.status()["observers"][0], idle=idle)
            del totals["family"], totals["qualifier"]
        print(json.dumps({
            "runs": committed_runs(env), "totals": totals,
            "pending": env.status()["pending"], "rows": rows,
        }))
        env.close()
        """,
        DB=tmp_path / "db",
        N=400,
        WHEN=when,
    )
    assert result["totals"]["idle"] is True
    assert result["pending"] == 0
    assert result["totals"]["failures"] == 0
    runs = result["runs"]
    assert sorted(runs) == result["rows"], "every notified row gets a committed run"
    duplicated = {row: counts for row, counts in runs.items() if counts != [1, 1]}
    assert duplicated == {}, "at most one committed run per notification"
    assert result["totals"]["commits"] == 400


def test_strong_sets_before_a_run_collapse_into_one_run(tmp_path):
    result = child(
        """
        app = percolite.App()

        @app.observer(CONTENT)
        def index(tx, row, column):
            record_run(tx, row, seen=tx.get(row, column).decode())

        env = percolite.open(DB, app=app, sync="none")
        for i in range(5):
            with env.transaction() as tx:
                tx.set("doc:1", CONTENT, f"version {i}")
        pending_before = env.status()["pending"]
        totals = env.process(threads=4, timeout=20)
        print(json.dumps({
            "pending_before": pending_before, "totals": totals,
            "runs": committed_runs(env), "markers": markers(env, "doc:1"),
            "pending_after": env.status()["pending"],
        }))
        env.close()
        """,
        DB=tmp_path / "db",
    )
    assert result["pending_before"] == 1, "five sets of one cell are one notification"
    assert result["runs"] == {"doc:1": [1, 1]}
    assert result["markers"] == [{"seen": "version 4"}], "the one run sees the newest value"
    assert result["totals"]["commits"] == 1
    assert result["pending_after"] == 0


def test_strong_set_during_a_run_causes_exactly_one_more_run(tmp_path):
    result = child(
        """
        app = percolite.App()
        started, release = threading.Event(), threading.Event()

        @app.observer(CONTENT)
        def index(tx, row, column):
            value = tx.get(row, column).decode()
            first = not started.is_set()
            if first:
                started.set()
                assert release.wait(20), "the test never released the observer"
            record_run(tx, row, seen=value, first=first)

        env = percolite.open(DB, app=app, sync="none")
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
        print(json.dumps({
            "idle": idle and idle_again, "pending_during": pending_during,
            "runs": committed_runs(env), "markers": markers(env, "doc:1"),
            "stats": observer_stats(env)["index"]["commits"],
        }))
        env.close()
        """,
        DB=tmp_path / "db",
    )
    assert result["idle"] is True
    assert result["pending_during"] == 1
    assert result["runs"] == {"doc:1": [2, 2]}, "exactly one more run after a set during a run"
    seen = sorted((m["first"], m["seen"]) for m in result["markers"])
    assert seen == [(False, "new"), (True, "old")]
    assert result["stats"] == 2


def test_deleting_an_observed_column_does_not_notify(tmp_path):
    result = child(
        """
        app = percolite.App()

        @app.observer(CONTENT)
        def index(tx, row, column):
            record_run(tx, row, value=None if tx.get(row, column) is None else "set")

        env = percolite.open(DB, app=app, sync="none")
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
        print(json.dumps({
            "commits": [first["commits"], second["commits"], third["commits"]],
            "pending": [pending_after_delete, pending_after_set],
            "runs": committed_runs(env),
        }))
        env.close()
        """,
        DB=tmp_path / "db",
    )
    assert result["pending"] == [0, 1]
    assert result["commits"] == [1, 0, 1]
    assert result["runs"] == {"doc:1": [2, 2]}


def test_strong_notification_survives_reopen_without_workers(tmp_path):
    """Notifications are stored: committed without workers anywhere, they run later."""
    app = percolite.App()

    @app.observer(("doc", "content"), name="index")
    def index(tx, row, column):  # pragma: no cover - never runs in this process
        raise AssertionError("no workers in the test process")

    with percolite.open(tmp_path / "db", app=app, sync="none") as env:
        with env.transaction() as tx:
            for i in range(10):
                tx.set(f"doc:{i}", ("doc", "content"), "x")
    with percolite.open(tmp_path / "db", sync="none") as env:
        # A process without the app still creates notifications (stored columns).
        with env.transaction() as tx:
            tx.set("doc:late", ("doc", "content"), "y")
            tx.set("doc:late", ("doc", "other"), "not observed")
        status = env.status()
    assert status["pending"] == 11
    assert [(o["name"], o["pending"]) for o in status["observers"]] == [("index", 11)]
    result = child(
        """
        app = percolite.App()

        @app.observer(CONTENT)
        def index(tx, row, column):
            record_run(tx, row)

        env = percolite.open(DB, app=app, sync="none")
        totals = env.process(threads=2, timeout=20)
        print(json.dumps({"runs": committed_runs(env), "pending": env.status()["pending"]}))
        env.close()
        """,
        DB=tmp_path / "db",
    )
    assert result["pending"] == 0
    assert sorted(result["runs"]) == sorted([f"doc:{i}" for i in range(10)] + ["doc:late"])
    assert all(counts == [1, 1] for counts in result["runs"].values())


def test_rows_longer_than_the_lmdb_key_limit_are_notified(tmp_path):
    result = child(
        """
        app = percolite.App()
        BUCKET = ("q", "bucket")

        @app.observer(CONTENT)
        def index(tx, row, column):
            record_run(tx, row, length=len(row))

        @app.observer(BUCKET, notify=percolite.WEAK)
        def drain(tx, row, column):
            record_run(tx, row, length=len(row))

        env = percolite.open(DB, app=app, sync="none")
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
        print(json.dumps({"pending_before": pending_before, "idle": idle,
                          "runs": committed_runs(env), "rows": rows,
                          "lengths": [m["length"] for r in rows for m in markers(env, r)]}))
        env.close()
        """,
        DB=tmp_path / "db",
    )
    assert result["pending_before"] == 3
    assert result["idle"] is True
    assert result["runs"] == {row: [1, 1] for row in result["rows"]}
    assert result["lengths"] == [len(row) for row in result["rows"]]


# -- weak notifications -------------------------------------------------------


def test_weak_notifications_are_delivered_at_least_once(tmp_path):
    result = child(
        """
        app = percolite.App()
        BUCKET = ("q", "bucket")

        @app.observer(BUCKET, notify=percolite.WEAK)
        def drain(tx, row, column):
            record_run(tx, row)

        env = percolite.open(DB, app=app, sync="none")
        rows = [f"bucket:{i:03}" for i in range(N)]
        # Half notified before the workers start, half while they run; some
        # transactions carry writes, some only the notification.
        for i, row in enumerate(rows[: N // 2]):
            with env.transaction() as tx:
                tx.set_weak_notification(row, BUCKET)
                if i % 2:
                    tx.set(row, ("q", "data"), "x")
        env.start_workers(4)
        for i, row in enumerate(rows[N // 2:]):
            with env.transaction() as tx:
                tx.set_weak_notification(row, BUCKET)
                tx.set_weak_notification(row, BUCKET)  # twice in one transaction
                if i % 2:
                    tx.set(row, ("q", "data"), "x")
        idle = env.wait(timeout=30)
        env.stop_workers()
        print(json.dumps({"idle": idle, "rows": rows, "runs": committed_runs(env),
                          "pending": env.status()["pending"]}))
        env.close()
        """,
        DB=tmp_path / "db",
        N=200,
    )
    assert result["idle"] is True
    assert result["pending"] == 0
    runs = result["runs"]
    missing = sorted(set(result["rows"]) - set(runs))
    assert missing == [], "every weakly notified row gets at least one committed run"
    assert all(counts[0] >= 1 and counts[0] == counts[1] for counts in runs.values())


def test_weak_notifications_of_one_cell_coalesce_before_a_run(tmp_path):
    result = child(
        """
        app = percolite.App()
        BUCKET = ("q", "bucket")

        @app.observer(BUCKET, notify=percolite.WEAK)
        def drain(tx, row, column):
            record_run(tx, row)

        env = percolite.open(DB, app=app, sync="none")
        for i in range(4):
            with env.transaction() as tx:
                tx.set_weak_notification("bucket:1", BUCKET)
        pending_before = env.status()["pending"]
        totals = env.process(threads=4, timeout=20)
        print(json.dumps({"pending_before": pending_before, "totals": totals,
                          "runs": committed_runs(env), "pending": env.status()["pending"]}))
        env.close()
        """,
        DB=tmp_path / "db",
    )
    assert result["pending_before"] == 1
    assert result["runs"] == {"bucket:1": [1, 1]}
    assert result["totals"]["commits"] == 1
    assert result["pending"] == 0


def test_weak_notification_never_collides_with_the_running_observer(tmp_path):
    result = child(
        """
        app = percolite.App()
        BUCKET = ("q", "bucket")
        started, release = threading.Event(), threading.Event()

        @app.observer(BUCKET, notify=percolite.WEAK)
        def drain(tx, row, column):
            # Reads and writes other cells of the row (and another row).
            tx.set(row, ("q", "cursor"), str(int(tx.get(row, ("q", "cursor"), b"0")) + 1))
            tx.set("summary", ("q", "last"), row)
            if not started.is_set():
                started.set()
                assert release.wait(20), "the test never released the observer"
            record_run(tx, row)

        env = percolite.open(DB, app=app, sync="none")
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
        print(json.dumps({"idle": idle, "conflicts": conflicts, "runs": committed_runs(env),
                          "observer_conflicts": stats["conflicts"],
                          "failures": stats["failures"]}))
        env.close()
        """,
        DB=tmp_path / "db",
    )
    assert result["conflicts"] == [], "setting a weak notification never collides"
    assert result["observer_conflicts"] == 0
    assert result["failures"] == 0
    assert result["idle"] is True
    counter, markers = result["runs"]["bucket:1"]
    assert counter == markers
    assert counter >= 2, "a notification set during a run is delivered again after it"


def test_weak_observer_that_renotifies_itself_runs_again_until_done(tmp_path):
    """The queue pattern: a run handles a batch and re-notifies its own cell
    while work remains; the re-notification survives the run's commit."""
    result = child(
        """
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

        env = percolite.open(DB, app=app, sync="none")
        with env.transaction() as tx:
            for i in range(95):
                tx.set(f"item:{i:03}", ("item", "value"), str(i))
            tx.set_weak_notification("bucket", BUCKET)
        totals = env.process(threads=2, timeout=30)
        with env.transaction() as tx:
            left = sum(1 for _ in tx.scan(prefix="item:"))
            done = sorted(int(value) for _, _, value in tx.scan(prefix="done"))
        print(json.dumps({"totals": totals, "left": left, "done": done,
                          "sizes": sorted(m["size"] for m in markers(env, "bucket")),
                          "pending": env.status()["pending"]}))
        env.close()
        """,
        DB=tmp_path / "db",
    )
    assert result["totals"]["idle"] is True
    assert result["totals"]["failures"] == 0
    assert result["left"] == 0
    assert result["done"] == list(range(95))
    assert result["sizes"] == [5] + [10] * 9
    assert result["pending"] == 0


# -- chains -------------------------------------------------------------------


def test_wait_returns_only_after_the_downstream_observer_finished(tmp_path):
    result = child(
        """
        app = percolite.App()
        UPPER, LENGTH = ("doc", "upper"), ("doc", "length")

        @app.observer(CONTENT)
        def upper(tx, row, column):
            tx.set(row, UPPER, tx.get(row, column).upper())

        @app.observer(UPPER)
        def length(tx, row, column):
            time.sleep(0.002)  # the downstream step is the slow one
            tx.set(row, LENGTH, str(len(tx.get(row, column))))

        env = percolite.open(DB, app=app, sync="none")
        env.start_workers(4)
        expected = {}
        for i in range(N):
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
        print(json.dumps({"idle": idle, "pending": pending,
                          "wrong": {r: v for r, v in got.items() if v != expected[r]}}))
        env.close()
        """,
        DB=tmp_path / "db",
        N=100,
    )
    assert result["idle"] is True
    assert result["pending"] == 0
    assert result["wrong"] == {}, "wait() returned before the chain's last observer finished"


# -- failing observers -------------------------------------------------------


def test_failing_observer_is_retried_with_backoff_and_reported(tmp_path):
    result = child(
        """
        app = percolite.App()
        failing = threading.Event()
        failing.set()

        @app.observer(CONTENT)
        def fragile(tx, row, column):
            tx.set(row, ("doc", "partial"), "written before the failure")
            if failing.is_set():
                raise RuntimeError("fragile-observer-boom")
            record_run(tx, row)

        env = percolite.open(DB, app=app, sync="none")
        with env.transaction() as tx:
            tx.set("doc:1", CONTENT, "x")
            tx.set("doc:2", CONTENT, "y")
        env.start_workers(2, retry_initial=0.01, retry_max=0.2)
        began = time.monotonic()
        deadline = began + 20
        while observer_stats(env)["fragile"]["failures"] < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
        elapsed = time.monotonic() - began
        failing_status = env.status()
        idle_while_failing = env.wait(timeout=0.3)
        with env.transaction() as tx:
            partial = tx.get("doc:1", ("doc", "partial"))
        failing.clear()
        idle = env.wait(timeout=20)
        env.stop_workers()
        stats = observer_stats(env)["fragile"]
        print(json.dumps({
            "failing": {
                "pending": failing_status["pending"],
                "failures": failing_status["observers"][0]["failures"],
                "commits": failing_status["observers"][0]["commits"],
                "last_error": failing_status["observers"][0]["last_error"],
                "elapsed": elapsed,
            },
            "idle_while_failing": idle_while_failing,
            "partial_while_failing": partial is not None,
            "idle": idle, "runs": committed_runs(env), "pending": env.status()["pending"],
            "final": {k: stats[k] for k in ("failures", "commits")},
        }))
        env.close()
        """,
        DB=tmp_path / "db",
    )
    failing = result["failing"]
    assert failing["pending"] == 2, "a failing observer's notifications stay pending"
    assert failing["commits"] == 0
    assert failing["failures"] >= 6
    # Backoff: 2 notifications retried after 10 ms doubling to 200 ms fail a
    # few dozen times a second at most; blind retries would fail thousands.
    assert failing["failures"] <= 2 * 20 * max(1.0, failing["elapsed"])
    assert "fragile-observer-boom" in failing["last_error"]
    assert "Traceback" in failing["last_error"]
    assert "RuntimeError" in failing["last_error"]
    assert result["idle_while_failing"] is False
    assert result["partial_while_failing"] is False, "a failed run's writes are aborted"
    # Once the observer stops raising, the work is done exactly once.
    assert result["idle"] is True
    assert result["pending"] == 0
    assert result["runs"] == {"doc:1": [1, 1], "doc:2": [1, 1]}
    assert result["final"]["commits"] == 2
    assert result["final"]["failures"] >= failing["failures"]


# -- scheduling across observers ------------------------------------------------


def test_a_blocked_observer_does_not_starve_another_observer(tmp_path):
    """Fair scheduling (workers.h "Scheduling"): ready notifications wait per
    observer and a free thread serves the observer with the fewest runs
    going. Two worker threads; observer ``slow`` has 12 notifications and
    every run blocks until the test releases it; observer ``quick`` has one.
    All 13 are committed in ONE transaction, so they reach the pool in one
    hand-off, ``slow``'s first: the transaction's writes go out in key order
    and its rows "a:.." sort before quick's "b:0".

    Under the former single FIFO, both threads would take slow's first two
    notifications, block in them, and quick's notification would wait behind
    the other ten until a slow run returned (20 s, when its wait times out):
    the 10 s deadline below would fail. With fair scheduling, at most one
    thread is in ``slow`` while ``quick`` has work, so ``quick`` commits at
    once, while ``slow``'s event is still unset. Then, alone with work,
    ``slow`` gets both threads; once released, all its runs commit."""
    result = child(
        """
        app = percolite.App()
        SLOW, QUICK = ("slow", "in"), ("quick", "in")
        release = threading.Event()
        lock = threading.Lock()
        state = {"now": 0, "started": 0}
        quick_saw_release = []

        @app.observer(SLOW, notify=percolite.STRONG)
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

        @app.observer(QUICK, notify=percolite.STRONG)
        def quick(tx, row, column):
            quick_saw_release.append(release.is_set())
            record_run(tx, row)

        env = percolite.open(DB, app=app, sync="none")
        env.start_workers(2)
        with env.transaction() as tx:
            for i in range(N):
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
        print(json.dumps({
            "quick_commits": quick_commits, "quick_after": quick_after,
            "quick_saw_release": quick_saw_release, "slow_during": slow_during,
            "slow_commits_during": slow_commits_during, "idle": idle,
            "runs": committed_runs(env),
            "released": sorted({m["released"] for i in range(N)
                                for m in markers(env, f"a:{i:02}")}),
            "commits": {name: stats[name]["commits"] for name in ("slow", "quick")},
        }))
        env.close()
        """,
        DB=tmp_path / "db",
        N=12,
    )
    assert result["quick_commits"] == 1, (
        f"quick did not commit within 10 s while slow was blocked: {result}"
    )
    assert result["quick_saw_release"] == [False], "quick ran while slow's event was unset"
    assert result["slow_commits_during"] == 0, "no slow run had returned yet"
    assert result["slow_during"]["now"] == 2, "alone with work, slow gets both threads"
    assert result["idle"] is True
    expected = {f"a:{i:02}": [1, 1] for i in range(12)}
    expected["b:0"] = [1, 1]
    assert result["runs"] == expected
    assert result["released"] == [True], "every slow run ended by the release, none timed out"
    assert result["commits"] == {"slow": 12, "quick": 1}
