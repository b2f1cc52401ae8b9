"""Notifications and observers: the delivery contract (percolite/notifications.h).

Every test but one runs on every backend (``backend``). Everything that
starts workers runs in a child interpreter with a timeout
(``_isolated.run_child_json``; the code is in children/notifications.py), so
a deadlock fails the test instead of hanging the suite. Observers count their
runs with side effects written in their own transaction, so only runs that
committed are counted: a counter cell, and one marker cell with a unique
qualifier per run (two committed runs leave two markers even if they raced on
the counter).
"""

from __future__ import annotations

import children.notifications
import percolite
import pytest
from _isolated import run_child_json


def child(scenario, backend: str, timeout: float = 60, **params):
    """Runs ``scenario`` (of children/notifications.py) on a store of ``backend``
    with ``params``; returns its JSON."""
    return run_child_json(scenario, backend, timeout=timeout, **params)


# -- strong notifications -----------------------------------------------------


@pytest.mark.parametrize("when", ["before_workers", "while_workers_run"])
def test_strong_at_most_one_committed_run_per_notification_with_8_threads(backend, tmp_path, when):
    result = child(
        children.notifications.strong_once, backend, db=tmp_path / "db", n=400, when=when
    )
    assert result["totals"]["idle"] is True
    assert result["pending"] == 0
    assert result["totals"]["failures"] == 0
    runs = result["runs"]
    assert sorted(runs) == result["rows"], "every notified row gets a committed run"
    duplicated = {row: counts for row, counts in runs.items() if counts != [1, 1]}
    assert duplicated == {}, "at most one committed run per notification"
    assert result["totals"]["commits"] == 400


def test_strong_sets_before_a_run_collapse_into_one_run(backend, tmp_path):
    result = child(children.notifications.strong_sets_collapse, backend, db=tmp_path / "db")
    assert result["pending_before"] == 1, "five sets of one cell are one notification"
    assert result["runs"] == {"doc:1": [1, 1]}
    assert result["markers"] == [{"seen": "version 4"}], "the one run sees the newest value"
    assert result["totals"]["commits"] == 1
    assert result["pending_after"] == 0


def test_strong_set_during_a_run_causes_exactly_one_more_run(backend, tmp_path):
    result = child(children.notifications.strong_set_during_a_run, backend, db=tmp_path / "db")
    assert result["idle"] is True
    assert result["pending_during"] == 1
    assert result["runs"] == {"doc:1": [2, 2]}, "exactly one more run after a set during a run"
    seen = sorted((m["first"], m["seen"]) for m in result["markers"])
    assert seen == [(False, "new"), (True, "old")]
    assert result["stats"] == 2


def test_deleting_an_observed_column_does_not_notify(backend, tmp_path):
    result = child(children.notifications.delete_does_not_notify, backend, db=tmp_path / "db")
    assert result["pending"] == [0, 1]
    assert result["commits"] == [1, 0, 1]
    assert result["runs"] == {"doc:1": [2, 2]}


def test_strong_notification_survives_reopen_without_workers(tmp_path):
    """Notifications are stored: committed without workers anywhere, they run
    later, in another process (lmdb only: a store shared across processes)."""
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
    result = run_child_json(children.notifications.run_stored_notifications, db=tmp_path / "db")
    assert result["pending"] == 0
    assert sorted(result["runs"]) == sorted([f"doc:{i}" for i in range(10)] + ["doc:late"])
    assert all(counts == [1, 1] for counts in result["runs"].values())


def test_rows_longer_than_the_lmdb_key_limit_are_notified(backend, tmp_path):
    result = child(children.notifications.long_rows, backend, db=tmp_path / "db")
    assert result["pending_before"] == 3
    assert result["idle"] is True
    assert result["runs"] == {row: [1, 1] for row in result["rows"]}
    assert result["lengths"] == [len(row) for row in result["rows"]]


# -- weak notifications -------------------------------------------------------


def test_weak_notifications_are_delivered_at_least_once(backend, tmp_path):
    result = child(children.notifications.weak_at_least_once, backend, db=tmp_path / "db", n=200)
    assert result["idle"] is True
    assert result["pending"] == 0
    runs = result["runs"]
    missing = sorted(set(result["rows"]) - set(runs))
    assert missing == [], "every weakly notified row gets at least one committed run"
    assert all(counts[0] >= 1 and counts[0] == counts[1] for counts in runs.values())


def test_weak_notifications_of_one_cell_coalesce_before_a_run(backend, tmp_path):
    result = child(children.notifications.weak_coalesce, backend, db=tmp_path / "db")
    assert result["pending_before"] == 1
    assert result["runs"] == {"bucket:1": [1, 1]}
    assert result["totals"]["commits"] == 1
    assert result["pending"] == 0


def test_weak_notification_never_collides_with_the_running_observer(backend, tmp_path):
    result = child(children.notifications.weak_never_collides, backend, db=tmp_path / "db")
    assert result["conflicts"] == [], "setting a weak notification never collides"
    assert result["observer_conflicts"] == 0
    assert result["failures"] == 0
    assert result["idle"] is True
    counter, markers = result["runs"]["bucket:1"]
    assert counter == markers
    assert counter >= 2, "a notification set during a run is delivered again after it"


def test_weak_observer_that_renotifies_itself_runs_again_until_done(backend, tmp_path):
    """The queue pattern: a run handles a batch and re-notifies its own cell
    while work remains; the re-notification survives the run's commit."""
    result = child(children.notifications.weak_renotifies_itself, backend, db=tmp_path / "db")
    assert result["totals"]["idle"] is True
    assert result["totals"]["failures"] == 0
    assert result["left"] == 0
    assert result["done"] == list(range(95))
    assert result["sizes"] == [5] + [10] * 9
    assert result["pending"] == 0


# -- chains -------------------------------------------------------------------


def test_wait_returns_only_after_the_downstream_observer_finished(backend, tmp_path):
    result = child(children.notifications.chain_wait, backend, db=tmp_path / "db", n=100)
    assert result["idle"] is True
    assert result["pending"] == 0
    assert result["wrong"] == {}, "wait() returned before the chain's last observer finished"


# -- failing observers -------------------------------------------------------


def test_failing_observer_is_retried_with_backoff_and_reported(backend, tmp_path):
    result = child(children.notifications.failing_observer, backend, db=tmp_path / "db")
    failing = result["failing"]
    assert failing["pending"] == 2, "a failing observer's notifications stay pending"
    assert failing["commits"] == 0
    assert failing["failures"] >= 6
    # Backoff: 2 notifications retried after 10 ms doubling to 200 ms fail a
    # few dozen times a second at most; blind retries would fail thousands.
    # (A retry waits at least half its delay, jittered: about 10 a second
    # each at most. The child times the count after reading it; a slow
    # machine only makes the failures fewer.)
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


def test_a_conflict_is_retried_though_its_commit_came_back_to_an_idle_pool(backend, tmp_path):
    """A run's commit goes to the writer and the worker thread goes on
    (workers.h "Committing"); when it comes back as a conflict, the retry is
    scheduled then, and the thread, already waiting for work, must wake for
    it: the wait ends within its timeout, after one conflict and one commit."""
    result = child(
        children.notifications.conflict_retried_on_one_thread, backend, db=tmp_path / "db"
    )
    assert result == {
        "idle": True,
        "attempts": 2,
        "commits": 1,
        "conflicts": 1,
        "value": "run 2",
    }


# -- scheduling across observers ------------------------------------------------


def test_a_blocked_observer_does_not_starve_another_observer(backend, tmp_path):
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
    result = child(children.notifications.fair_scheduling, backend, db=tmp_path / "db", n=12)
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
