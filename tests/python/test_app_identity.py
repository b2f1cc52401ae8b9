"""The app a store was bound to is recorded in it: another app is refused
with AppMismatch, unless upgrade=True records it deliberately."""

from __future__ import annotations

import logging
import sys

import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from _isolated import TESTS_DIR, run_command
from conftest import open_store

CONTENT = ("doc", "content")


def app_a(linger: float = 0.0, max_attempts: int | None = 10, name: str = "index") -> percolite.App:
    app = percolite.App("a")
    app.add_observer(CONTENT, lambda tx, row, column: None, name=name, max_attempts=max_attempts)
    app.combine_queue("counts", buckets=4, linger=linger, max_attempts=max_attempts)
    return app


def app_b() -> percolite.App:
    app = percolite.App("b")
    app.add_observer(("doc", "other"), lambda tx, row, column: None, notify=percolite.WEAK)
    app.combine_queue("counts", buckets=8, value_codec="float64")
    return app


def test_another_app_is_refused_naming_the_differences(tmp_path):
    db = tmp_path / "db"
    with percolite.open(db, app=app_a()):
        pass
    with pytest.raises(percolite.AppMismatch) as raised:
        percolite.open(db, app=app_b())
    assert raised.value.differences == [
        "the app is named 'b', not 'a'",
        "column doc:content (strong) is observed by the recorded app, not by this one",
        "column doc:other (weak) is observed by this app, not by the recorded one",
        "combine queue 'counts': buckets 4 -> 8, value_codec 'int64' -> 'float64'",
    ]
    assert "pass upgrade=True" in str(raised.value)
    # Nothing changed: app A still opens, and still observes its column.
    with percolite.open(db, app=app_a()) as env:
        with env.transaction() as tx:
            tx.set("r", CONTENT, "x")
        assert env.status()["pending"] == 1
    # Without an app, any tool opens it.
    with percolite.open(db) as env:
        assert env.status()["pending"] == 1


def test_upgrade_records_the_new_app_and_drops_notifications_no_one_observes(tmp_path):
    db = tmp_path / "db"
    with percolite.open(db, app=app_a()) as env:
        with env.transaction() as tx:
            for i in range(3):
                tx.set(f"r{i}", CONTENT, "x")
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    logging.getLogger("percolite").addHandler(handler)
    try:
        with percolite.open(db, app=app_b(), upgrade=True) as env:
            assert env.status()["pending"] == 0
            assert env.wait(timeout=5) is True
    finally:
        logging.getLogger("percolite").removeHandler(handler)
    assert [r.levelname for r in records] == ["WARNING"]
    assert "dropped 3 pending notifications" in records[0].getMessage()
    # Now B is the recorded app, and A is the one refused.
    with percolite.open(db, app=app_b()):
        pass
    with pytest.raises(percolite.AppMismatch, match="the app is named 'a', not 'b'"):
        percolite.open(db, app=app_a())


def test_settings_that_change_nothing_stored_are_not_compared(backend, tmp_path):
    with open_store(backend, tmp_path / "db", app=app_a()) as env:
        env.bind(app_a(linger=2.0, max_attempts=None, name="renamed"))
        with pytest.raises(percolite.AppMismatch):
            env.bind(app_b())
        env.bind(app_b(), upgrade=True)
        assert env.app.name == "b"
        with pytest.raises(TypeError, match="app must be a percolite.App"):
            env.bind("app")


def test_what_the_bound_app_adds_in_this_process_is_recorded(tmp_path):
    db = tmp_path / "db"
    app = app_a()
    with percolite.open(db, app=app):
        app.add_observer(("doc", "extra"), lambda tx, row, column: None)
    with pytest.raises(percolite.AppMismatch, match="doc:extra"):
        percolite.open(db, app=app_a())
    with percolite.open(db, app=app):
        pass


def test_a_worker_with_another_app_exits_1_naming_it(tmp_path):
    db = tmp_path / "db"
    with percolite.open(db, app=app_a()):
        pass
    worker = [sys.executable, "-m", "percolite", "worker", "children.flaky_app:app", "--db", db]
    result = run_command([*worker, "--until-idle"], timeout=60, cwd=TESTS_DIR)
    assert result.returncode == 1
    assert "is bound to app 'a'; app 'flaky' differs" in result.stderr


# -- notebook habits: declaring again, rebinding ---------------------------------


def test_declaring_again_with_the_same_settings_is_harmless_and_takes_the_new_code():
    app = percolite.App("nb")
    seen = []

    def first(tx, row, column):
        seen.append("old")

    app.add_observer(CONTENT, first, name="index")

    def second(tx, row, column):
        seen.append("new")

    app.add_observer(CONTENT, second, name="index")  # the cell run again, edited
    cq = app.combine_queue("counts", buckets=4)
    assert app.combine_queue("counts", buckets=4) is not cq  # the new one replaces it
    with percolite.open(":memory:", app=app) as env:
        with env.transaction() as tx:
            tx.set("r", CONTENT, "x")
        env.process(1)
    assert seen == ["new"]


def test_declaring_again_with_other_settings_names_them_and_how_to_replace():
    app = percolite.App("nb")
    app.add_observer(CONTENT, lambda tx, row, column: None, name="index")
    with pytest.raises(ValueError, match=r"notify 'STRONG' -> 'WEAK'.*app.remove_observer"):
        app.add_observer(CONTENT, lambda tx, row, column: None, name="index", notify=percolite.WEAK)
    app.combine_queue("counts", buckets=4)
    with pytest.raises(ValueError, match=r"buckets 4 -> 8.*app.remove_queue\('counts'\)"):
        app.combine_queue("counts", buckets=8)
    with pytest.raises(ValueError, match=r"combiner 'sum' -> 'max'"):
        app.combine_queue("counts", buckets=4, combiner="max")
    app.remove_queue("counts")
    assert app.combine_queue("counts", buckets=8).buckets == 8
    app.remove_observer(CONTENT)
    assert app.observers == []
    with pytest.raises(KeyError, match="no observer for column"):
        app.remove_observer(CONTENT)


def test_bind_restarts_running_workers_with_the_new_app(tmp_path):
    seen = []
    old, new = percolite.App("a"), percolite.App("a")
    old.add_observer(CONTENT, lambda tx, row, column: seen.append("old"), name="index")
    new.add_observer(CONTENT, lambda tx, row, column: seen.append("new"), name="index")
    with percolite.open(tmp_path / "db", app=old, sync="none") as env:
        env.start_workers(2)
        env.bind(new)  # same record: no upgrade needed
        assert env.workers_running and env.app is new
        with env.transaction() as tx:
            tx.set("r", CONTENT, "x")
        assert env.wait(timeout=30)
    assert seen == ["new"]


def test_bind_refuses_while_a_loader_is_open(tmp_path):
    with percolite.open(tmp_path / "db", app=app_a(), sync="none") as env:
        with env.loader() as loader:
            with pytest.raises(percolite.Error, match="a loader of this handle is open"):
                env.bind(app_a())
            loader.submit(lambda tx: tx.set("r", ("f", "q"), "v")).result()
        env.bind(app_a())  # closed: fine


# -- bad input: what is not an app ---------------------------------------------

ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    ("bind-str", lambda env, d, q: env.bind("app"), TypeError, r"app must be a percolite.App"),
    (
        "open-app-int",
        lambda env, d, q: percolite.open(d / "c", app=5),
        TypeError,
        r"app must be a percolite.App, not int",
    ),
    ("app-name-int", lambda env, d, q: percolite.App(5), TypeError, r"app's name must be a str"),
]


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)
