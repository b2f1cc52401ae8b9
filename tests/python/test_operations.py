"""Failures recorded in the store, bounded retries and parked work, and the
exit statuses and log records that report them (failures.h, workers.h)."""

from __future__ import annotations

import json
import logging
import os
import sys

import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from _isolated import TESTS_DIR, load_fresh, run_command
from conftest import open_store

CONTENT = ("doc", "content")
OUT = ("doc", "out")


def cli(*args) -> list:
    return [sys.executable, "-m", "percolite", *map(str, args)]


def flaky_app() -> percolite.App:
    return load_fresh("children.flaky_app").app


def load_rows(db, rows) -> None:
    with percolite.open(db, app=flaky_app(), sync="none") as env:
        with env.transaction() as tx:
            for row in rows:
                tx.set(row, CONTENT, "text")


def fast_retries(env: percolite.Env, threads: int = 2) -> None:
    env.start_workers(threads, retry_initial=0.005, retry_max=0.02)


class Toggle:
    """An observer that fails on the rows in ``poison`` and counts the runs
    that committed elsewhere in the row."""

    def __init__(self, poison=()):
        self.poison = set(poison)
        self.calls = 0

    def __call__(self, tx, row, column):
        self.calls += 1
        if row in self.poison:
            raise ValueError(f"poisoned {row.decode()}")
        tx.set(row, OUT, str(int(tx.get(row, OUT, b"0")) + 1))


def make_app(observer, max_attempts=3, name="toggle") -> percolite.App:
    app = percolite.App("ops")
    app.add_observer(CONTENT, observer, name=name, max_attempts=max_attempts)
    return app


def outputs(env) -> dict:
    with env.transaction() as tx:
        return {c.row: int(c.value) for c in tx.scan(columns=[OUT])}


# -- across processes, through the command line --------------------------------


def test_parked_work_is_reported_to_other_processes_and_retried_once_fixed(tmp_path):
    """The issue's scenario: an always-failing observer with max_attempts=3
    makes `percolite worker --until-idle` exit 3; another process's
    `percolite status --json` shows the failures, the traceback and the
    parked work; the WARNING with the traceback reaches the percolite
    logger; after the fix, `percolite retry` and a worker run finish the
    work with exactly one committed run per row."""
    db = tmp_path / "db"
    rows = [f"doc:{i}" for i in range(5)]
    load_rows(db, rows)
    worker = cli("worker", "children.flaky_app:app", "--db", db, "--until-idle", "--threads", 2)
    failed = run_command(worker, timeout=60, cwd=TESTS_DIR)
    assert failed.returncode == 3, failed.stderr
    assert "WARNING percolite.observers" in failed.stderr
    assert "failed (attempt 1), will retry: ValueError: poisoned document" in failed.stderr
    assert "Traceback (most recent call last)" in failed.stderr
    assert "ERROR percolite.observers" in failed.stderr and "is parked" in failed.stderr

    shown = run_command(cli("status", db, "--json"), timeout=30)
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["pending"] == 0 and status["parked"] == 5
    (index,) = [o for o in status["observers"] if o["name"] == "index"]
    assert index["failures"] == 15 and index["parked"] == 5  # 3 attempts of 5 rows
    assert index["last_error_type"] == "ValueError"
    assert index["last_error_message"].startswith("poisoned document doc:")
    assert 'raise ValueError(f"poisoned document' in index["last_error"]
    assert index["first_failure_unix"] <= index["last_failure_unix"]
    assert sorted(r["row"] for r in status["parked_work"]) == rows
    for record in status["parked_work"]:
        assert record["attempts"] == 3 and record["parked"] is True
        assert record["error"]["message"] == f"poisoned document {record['row']}"
        assert "flaky_app.py" in record["error"]["traceback"]
        # The runner's own frame is left out: the traceback starts at the observer.
        assert "percolite/_app.py" not in record["error"]["traceback"]
    text = run_command(cli("status", db), timeout=30)
    assert "parked:  5 (notifications and queue keys)" in text.stdout
    assert "  observer 'index': 5 notifications parked after ValueError, such as" in text.stdout
    assert text.stdout.count("Traceback (most recent call last)") == 1
    assert f"run it again: percolite retry --db {db}\n" in text.stdout
    details = run_command(cli("status", db, "--verbose"), timeout=30)
    assert "parked: observer 'index' on row 'doc:0' column 'doc:content' after 3" in details.stdout
    assert details.stdout.count("Traceback (most recent call last)") == 5

    retried = run_command(cli("retry", db), timeout=30)
    assert retried.returncode == 0, retried.stderr
    assert "retried 5 parked items" in retried.stdout
    fixed = run_command(worker, timeout=60, cwd=TESTS_DIR, env={**os.environ, "FLAKY_FIXED": "1"})
    assert fixed.returncode == 0, fixed.stderr
    with percolite.open(db, create=False) as env:
        with env.transaction() as tx:
            runs = {c.row.decode(): int(c.value) for c in tx.scan(columns=[("obs", "runs")])}
        assert runs == {row: 1 for row in rows}
        assert env.parked() == [] and env.status()["pending"] == 0
        # History stays: 15 failed runs, 5 parkings; the work records are gone.
        assert env.failures()["index"]["failures"] == 15
    again = run_command(cli("retry", db), timeout=30)
    assert again.returncode == 1 and "nothing is parked" in again.stderr


def test_wait_command_exits_3_on_parked_work(tmp_path):
    db = tmp_path / "db"
    load_rows(db, ["doc:1"])
    worker = cli("worker", "children.flaky_app:app", "--db", db, "--until-idle")
    assert run_command(worker, timeout=60, cwd=TESTS_DIR).returncode == 3
    waited = run_command(cli("wait", db, "--quiet"), timeout=30)
    assert waited.returncode == 3
    assert "parked work, 1 in all (1 of observer 'index')" in waited.stderr


def test_retry_command_names_an_observer_with_no_parked_work(tmp_path):
    db = tmp_path / "db"
    load_rows(db, ["doc:1"])
    worker = cli("worker", "children.flaky_app:app", "--db", db, "--until-idle")
    assert run_command(worker, timeout=60, cwd=TESTS_DIR).returncode == 3
    wrong = run_command(cli("retry", db, "--observer", "nosuch"), timeout=30)
    assert wrong.returncode == 1 and "no parked work of 'nosuch'" in wrong.stderr
    right = run_command(cli("retry", db, "--observer", "index"), timeout=30)
    assert right.returncode == 0 and "retried 1 parked item;" in right.stdout


# -- in one process, on every backend -------------------------------------------


def test_wait_raises_work_parked_and_process_reports_it(backend, tmp_path):
    observer = Toggle(poison={b"r1", b"r2"})
    env = open_store(backend, tmp_path / "db", app=make_app(observer), sync="none")
    with env:
        with env.transaction() as tx:
            for row in ("r0", "r1", "r2"):
                tx.set(row, CONTENT, "x")
        fast_retries(env)
        with pytest.raises(percolite.WorkParked) as raised:
            env.wait(timeout=30)
        assert raised.value.parked == 2 and raised.value.by_observer == {"toggle": 2}
        assert "parked work, 2 in all (2 of observer 'toggle')" in str(raised.value)
        assert isinstance(raised.value, percolite.Error)
        env.stop_workers()
        assert observer.calls == 1 + 2 * 3
        assert outputs(env) == {b"r0": 1}
        assert sorted(r["row"] for r in env.parked()) == [b"r1", b"r2"]
        assert env.parked("other") == []
        # process() does not raise: it reports the parked count.
        result = env.process(2)
        assert result["parked"] == 2 and result["idle"] is True and result["runs"] == 0


def test_a_parked_cell_set_again_stays_parked_until_retried(backend, tmp_path):
    """Later notifications of parked work are consumed without a run (the
    work stays parked), and a retry runs it once, with fresh attempts."""
    observer = Toggle(poison={b"r1"})
    env = open_store(backend, tmp_path / "db", app=make_app(observer, max_attempts=2), sync="none")
    with env:
        with env.transaction() as tx:
            tx.set("r1", CONTENT, "x")
        assert env.process(2)["parked"] == 1
        assert observer.calls == 2
        with env.transaction() as tx:
            tx.set("r1", CONTENT, "y")  # a new notification of the parked cell
        result = env.process(2)
        assert observer.calls == 2, "parked work does not run again when notified"
        assert result["parked"] == 1 and env.status()["pending"] == 0
        observer.poison.clear()
        assert env.retry_parked("toggle") == 1
        assert env.process(2)["parked"] == 0
        assert observer.calls == 3 and outputs(env) == {b"r1": 1}
        assert env.retry_parked() == 0  # nothing left to retry


def test_success_after_failures_deletes_the_work_record(backend, tmp_path):
    failures_left = {b"r": 2}

    def flaky(tx, row, column):
        if failures_left[row]:
            failures_left[row] -= 1
            raise RuntimeError("not yet")
        tx.set(row, OUT, "1")

    env = open_store(backend, tmp_path / "db", app=make_app(flaky, max_attempts=3), sync="none")
    with env:
        with env.transaction() as tx:
            tx.set("r", CONTENT, "x")
        fast_retries(env)
        assert env.wait(timeout=30) is True
        assert env._core.work_records(False) == []  # neither parked nor pending
        summary = env.failures()["toggle"]
        assert summary["failures"] == 2 and summary["parked"] == 0
        assert summary["last_error"]["type"] == "RuntimeError"
        assert summary["last_cell"] == {"row": b"r", "family": b"doc", "qualifier": b"content"}


def test_max_attempts_none_retries_forever(backend, tmp_path):
    observer = Toggle(poison={b"r"})
    env = open_store(backend, tmp_path / "db", app=make_app(observer, None), sync="none")
    with env:
        with env.transaction() as tx:
            tx.set("r", CONTENT, "x")
        fast_retries(env)
        assert env.wait(timeout=1.0) is False  # still pending, never parked
        assert observer.calls > 5 and env.parked() == []
        assert env.status()["pending"] == 1


def test_failures_are_logged_warning_then_error(backend, tmp_path):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(level=logging.DEBUG)
    logger = logging.getLogger("percolite")
    logger.addHandler(handler)
    try:
        observer = Toggle(poison={b"r"})
        app = make_app(observer, max_attempts=2)
        with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
            with env.transaction() as tx:
                tx.set("r", CONTENT, "x")
            env.process(1)
    finally:
        logger.removeHandler(handler)
    levels = [(r.name, r.levelname) for r in records]
    assert levels == [
        ("percolite.observers", "WARNING"),
        ("percolite.observers", "ERROR"),
    ]
    warning, error = (r.getMessage() for r in records)
    assert "observer 'toggle' on row 'r' column 'doc:content' failed (attempt 1)" in warning
    assert "Traceback (most recent call last)" in warning and "ValueError: poisoned r" in warning
    assert "failed on its last attempt (2) and is parked" in error


def test_scans_leave_out_percolites_own_rows(backend, tmp_path):
    observer = Toggle(poison={b"r"})
    with open_store(backend, tmp_path / "db", app=make_app(observer, 1), sync="none") as env:
        with env.transaction() as tx:
            tx.set("r", CONTENT, "x")
            tx.set(b"\x00a", OUT, "a user row before percolite's")
        env.process(1)
        with env.transaction() as tx:
            rows = [c.row for c in tx.scan()]
            own = [c.row for c in tx.scan(prefix=percolite._core.SYSTEM_ROW_PREFIX)]
        assert rows == [b"\x00a", b"r"]
        assert own and all(r.startswith(percolite._core.SYSTEM_ROW_PREFIX) for r in own)


@pytest.mark.parametrize(
    "value, error, words",
    [
        (0, ValueError, "between 1 and"),
        (-1, ValueError, "between 1 and"),
        (percolite._core.MAX_ATTEMPTS_LIMIT + 1, ValueError, "between 1 and"),
        (2.5, TypeError, "not float"),
        ("3", TypeError, "not str"),
        (True, TypeError, "not bool"),
    ],
)
def test_bad_max_attempts_is_refused(value, error, words):
    app = percolite.App()
    with pytest.raises(error, match=f"max_attempts must be.*{words}"):
        app.observer(CONTENT, max_attempts=value)
    with pytest.raises(error, match=f"max_attempts must be.*{words}"):
        app.add_observer(CONTENT, lambda tx, row, column: None, max_attempts=value)
    assert app.observers == []


def test_retry_parked_refuses_unknown_observers_and_bad_types(backend, tmp_path):
    with open_store(backend, tmp_path / "db", app=make_app(Toggle()), sync="none") as env:
        with pytest.raises(ValueError, match="no observer named 'nosuch'"):
            env.retry_parked("nosuch")
        with pytest.raises(TypeError, match="observer must be a name"):
            env.retry_parked([1])
        assert env.retry_parked("toggle") == 0
        assert env.retry_parked() == 0


# -- bad input to status, parked and retry_parked ------------------------------

ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    (
        "retry-parked-int",
        lambda env, d, q: env.retry_parked(42),
        TypeError,
        r"retry_parked: observer must be a name",
    ),
    (
        "status-queues-str",
        lambda env, d, q: env.status(queues="yes"),
        TypeError,
        r"status: queues must be True or False, not str",
    ),
    (
        "parked-int",
        lambda env, d, q: env.parked(5),
        TypeError,
        r"parked: observer must be a name \(str\) or None, not int",
    ),
    (
        "retry-parked-queue-int",
        lambda env, d, q: env.retry_parked(queue=5),
        TypeError,
        r"retry_parked: queue must be a name",
    ),
    (
        "retry-parked-unknown-queue",
        lambda env, d, q: env.retry_parked(queue="nope"),
        ValueError,
        r"no queue named 'nope'",
    ),
]


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)


# -- poison keys in queues --------------------------------------------------------


def test_a_poison_key_parks_only_itself_in_a_combine_queue(backend, tmp_path):
    """A combiner that fails on one key: after max_attempts the last attempt
    splits the batch until the key is alone and parks it; every other key
    folds exactly; the parked key's updates, old and new, stay queued until
    it is retried, then fold in order."""
    app = percolite.App("cq")
    poison = {"bad"}

    def combiner(key, values):
        if key in poison:
            raise ValueError(f"cannot combine {key}")
        return sum(values)

    counts = app.combine_queue("counts", buckets=2, combiner=combiner, max_attempts=2)
    keys = [f"k{i:02}" for i in range(40)] + ["bad"]
    with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
        for _ in range(3):
            with env.transaction() as tx:
                counts.add(tx, {key: 1 for key in keys})
        fast_retries(env)
        with pytest.raises(percolite.WorkParked, match="1 key of combine queue 'counts'"):
            env.wait(timeout=30)
        env.stop_workers()
        with env.transaction() as tx:
            values = {key: counts.get(tx, key) for key in keys}
        assert values == {**{key: 3 for key in keys[:-1]}, "bad": None}
        (record,) = env.parked()
        assert record["queue"] == "counts" and record["key"] == "bad"
        assert record["observer"] == "combine queue counts" and record["attempts"] == 2
        # Since the bucket's first failed run, not since the parking.
        assert record["first_failure_unix"] < record["last_failure_unix"]
        assert record["error"]["type"] == "ValueError"
        assert record["error"]["message"] == "cannot combine bad"
        assert "raise ValueError" in record["error"]["traceback"]
        assert env.failures()["combine queue counts"]["parked"] == 1
        # Later updates of the parked key wait with the others; other keys go on.
        with env.transaction() as tx:
            counts.add(tx, {"bad": 5, "k00": 1})
        assert env.process(2)["parked"] == 1
        with env.transaction() as tx:
            assert counts.get(tx, "k00") == 4 and counts.get(tx, "bad") is None
        poison.clear()
        assert env.retry_parked(queue="counts") == 1
        assert env.process(2)["parked"] == 0
        with env.transaction() as tx:
            assert counts.get(tx, "bad") == 8
        with env.transaction() as tx:
            assert counts.depth(tx) == 0


def test_a_poison_key_parks_only_itself_in_an_export_queue(backend, tmp_path):
    app = percolite.App("eq")
    exported = []
    calls = []

    def exporter(entries):
        calls.append(len(entries))
        if any(e.key == "bad" for e in entries):
            raise RuntimeError("the sink refuses 'bad'")
        exported.extend((e.key, e.value) for e in entries)

    out = app.export_queue("out", exporter, buckets=1, max_attempts=3)
    keys = [f"k{i:03}" for i in range(100)] + ["bad"]
    with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
        with env.transaction() as tx:
            for n, key in enumerate(keys):
                out.add(tx, key, n)
        fast_retries(env)
        with pytest.raises(percolite.WorkParked, match="1 key of export queue 'out'"):
            env.wait(timeout=30)
        env.stop_workers()
        assert sorted(exported) == [(key, n) for n, key in enumerate(keys[:-1])]
        # Two failed runs of all 101, then halving: about 2 calls per level.
        assert len(calls) <= 2 + 2 * 8, calls
        (record,) = env.parked()
        assert record["key"] == "bad" and record["queue"] == "out"
        assert record["error"]["message"] == "the sink refuses 'bad'"
        with env.transaction() as tx:
            assert out.depth(tx) == 1  # the parked entry stays queued


def test_queue_max_attempts_is_checked(tmp_path):
    app = percolite.App()
    with pytest.raises(ValueError, match="combine queue 'c': max_attempts must be between 1"):
        app.combine_queue("c", max_attempts=0)
    with pytest.raises(TypeError, match="export queue 'e': max_attempts must be an int"):
        app.export_queue("e", lambda entries: None, max_attempts="x")
    with pytest.raises(TypeError, match="export queue 'd': max_attempts must be an int"):
        app.export_queue("d", max_attempts=1.0)
    assert app._queues == {}
    with percolite.open(tmp_path / "db", app=app) as env:
        with pytest.raises(ValueError, match="no queue named 'nosuch'"):
            env.retry_parked(queue="nosuch")


def test_a_parked_queue_key_is_logged_at_error_once_committed(backend, tmp_path):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    app = percolite.App("cq")

    def combiner(key, values):
        if key == "bad":
            raise ValueError("cannot combine bad")
        return sum(values)

    counts = app.combine_queue("counts", buckets=1, combiner=combiner, max_attempts=2)
    handler = Keep(level=logging.DEBUG)
    logging.getLogger("percolite").addHandler(handler)
    try:
        with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
            with env.transaction() as tx:
                counts.add(tx, {"good": 1, "bad": 1})
            assert env.process(1)["parked"] == 1
    finally:
        logging.getLogger("percolite").removeHandler(handler)
    errors = [r.getMessage() for r in records if r.levelname == "ERROR"]
    assert len(errors) == 1, errors
    assert (
        "combine queue counts key 'bad' failed on its last attempt (2) and is parked" in errors[0]
    )
    assert "ValueError: cannot combine bad" in errors[0]
