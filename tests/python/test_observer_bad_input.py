"""Bad input around observers and workers: the errors users get, and that
nothing is lost or left broken after them."""

from __future__ import annotations

import children.observer_bad_input
import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from _isolated import run_child_json
from conftest import open_store

CONTENT = ("doc", "content")


def _noop(tx, row, column):  # pragma: no cover - never run
    pass


# -- registering observers ---------------------------------------------------


def test_registering_an_observer_while_workers_run_raises(backend, tmp_path):
    result = run_child_json(
        children.observer_bad_input.register_while_workers_run, backend, db=tmp_path / "db"
    )
    assert result["refused"] is not None, "registering while workers run must raise"
    name, is_percolite_error, message = result["refused"]
    assert is_percolite_error, f"expected percolite.Error, got {name}: {message}"
    assert "late" in message, "the message names the refused observer"
    assert len(result["observers_while_running"]) == 1, "the refused observer is not registered"
    assert len(result["observers"]) == 2
    assert result["idle"] is True
    assert result["outputs"] == ["1", "1"]


@pytest.mark.parametrize(
    "second",
    [("doc", "content"), percolite.Column("doc", "content"), (b"doc", b"content")],
    ids=["tuple", "Column", "bytes"],
)
def test_a_second_observer_for_the_same_column_raises_value_error(second):
    app = percolite.App()
    app.add_observer(CONTENT, _noop, name="first")

    def other(tx, row, column):  # pragma: no cover - never run
        pass

    with pytest.raises(ValueError, match="first"):
        app.add_observer(second, other)
    with pytest.raises(ValueError):
        app.observer(second, notify=percolite.WEAK)(other)
    assert [o.name for o in app.observers] == ["first"]


@pytest.mark.parametrize("fn", [42, "index", None, object()], ids=repr)
def test_a_non_callable_observer_raises_type_error(fn):
    app = percolite.App()
    with pytest.raises(TypeError, match="callable"):
        app.add_observer(CONTENT, fn)
    with pytest.raises(TypeError, match="callable"):
        app.observer(CONTENT)(fn)
    assert app.observers == []


def test_a_bare_observer_decorator_raises_instead_of_registering_nothing():
    app = percolite.App()
    with pytest.raises(TypeError, match=r"write @app.observer\(\(family, qualifier\)\)"):

        @app.observer
        def count(tx, row, column):  # pragma: no cover - never registered
            pass

    assert app.observers == []


def test_an_observer_with_the_wrong_arity_raises_type_error_naming_it():
    app = percolite.App()

    def takes_only_tx(tx):  # pragma: no cover - never run
        pass

    def takes_four(tx, row, column, extra):  # pragma: no cover - never run
        pass

    with pytest.raises(TypeError, match="takes_only_tx"):
        app.observer(CONTENT)(takes_only_tx)
    with pytest.raises(TypeError, match="takes_four"):
        app.add_observer(CONTENT, takes_four)
    with pytest.raises(TypeError, match="named_one"):
        app.add_observer(CONTENT, lambda tx: None, name="named_one")
    assert app.observers == []

    # Signatures that accept three positional arguments are fine.
    class Callable:
        def __call__(self, tx, row, column):  # pragma: no cover - never run
            pass

    app.add_observer(("a", "1"), lambda *args: None)
    app.add_observer(("a", "2"), lambda tx, row, column, extra=None: None)
    app.add_observer(("a", "3"), Callable())
    assert len(app.observers) == 3


def test_bad_column_and_notify_arguments():
    app = percolite.App()
    with pytest.raises(TypeError):
        app.add_observer("doc:content", _noop)
    with pytest.raises(TypeError):
        app.add_observer(("doc", "content", "extra"), _noop)
    with pytest.raises(ValueError):
        app.add_observer(("", "content"), _noop)
    with pytest.raises(ValueError, match="notify"):
        app.add_observer(CONTENT, _noop, notify=3)
    assert app.observers == []


# -- the environment -----------------------------------------------------------


def test_open_with_an_app_that_is_not_an_app_raises_type_error(backend, tmp_path):
    with pytest.raises(TypeError, match="App"):
        open_store(backend, tmp_path / "db", app=object())
    with pytest.raises(TypeError):
        open_store(backend, tmp_path / "db", app=[_noop])


def test_wait_on_a_closed_env_raises_closed_error(backend, tmp_path):
    app = percolite.App()
    app.add_observer(CONTENT, _noop)
    env = open_store(backend, tmp_path / "db", app=app, sync="none")
    with env.transaction() as tx:
        tx.set("doc:1", CONTENT, "pending")
    env.close()
    with pytest.raises(percolite.ClosedError):
        env.wait()
    with pytest.raises(percolite.ClosedError):
        env.wait(timeout=0.1)
    with pytest.raises(percolite.ClosedError):
        env.status()
    env.stop_workers()  # idempotent, even closed
    env.close()  # idempotent


def test_start_workers_on_a_closed_env_raises_closed_error(backend, tmp_path):
    app = percolite.App()
    app.add_observer(CONTENT, _noop)
    env = open_store(backend, tmp_path / "db", app=app, sync="none")
    env.close()
    with pytest.raises(percolite.ClosedError):
        env.start_workers(1)
    assert env.workers_running is False


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"threads": 0}, ValueError),
        ({"threads": -3}, ValueError),
        ({"threads": 2.0}, TypeError),
        ({"threads": True}, TypeError),
        ({"worker_index": 2, "worker_count": 2}, ValueError),
        ({"worker_index": -1, "worker_count": 2}, ValueError),
        ({"worker_count": 0}, ValueError),
        ({"retry_initial": 0.0}, ValueError),
        ({"retry_initial": 1.0, "retry_max": 0.5}, ValueError),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else v.__name__,
)
def test_start_workers_with_bad_arguments_raises(backend, tmp_path, kwargs, error):
    app = percolite.App()
    app.add_observer(CONTENT, _noop)
    with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
        try:
            with pytest.raises(error):
                env.start_workers(**kwargs)
            assert env.workers_running is False
            assert env.status()["workers"]["running"] is False
        finally:
            env.stop_workers()


def test_starting_workers_twice_raises(backend, tmp_path):
    result = run_child_json(
        children.observer_bad_input.start_workers_twice, backend, db=tmp_path / "db"
    )
    assert result["second"] is not None, "a second start_workers must raise"
    assert result["running"] is True, "the first workers keep running"


# -- bad input to wait, process and start_workers ------------------------------

ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    (
        "wait-nan",
        lambda env, d, q: env.wait(timeout=float("nan")),
        ValueError,
        r"timeout must be >= 0 or None, not nan",
    ),
    ("wait-negative", lambda env, d, q: env.wait(timeout=-1), ValueError, r"timeout must be >= 0"),
    (
        "wait-str",
        lambda env, d, q: env.wait(timeout="1"),
        TypeError,
        r"timeout must be a number or None, not str",
    ),
    (
        "start-workers-lease",
        lambda env, d, q: env.start_workers(1, lease_seconds=0),
        ValueError,
        r"lease_seconds must be > 0",
    ),
    (
        "start-workers-half-static",
        lambda env, d, q: env.start_workers(1, worker_index=0),
        ValueError,
        r"give worker_index and worker_count together",
    ),
    (
        "process-timeout-str",
        lambda env, d, q: env.process(timeout="x"),
        TypeError,
        r"timeout must be a number or None, not str",
    ),
    (
        "start-workers-zero",
        lambda env, d, q: env.start_workers(0),
        ValueError,
        r"threads must be at least 1, not 0",
    ),
    (
        "start-workers-str",
        lambda env, d, q: env.start_workers("4"),
        TypeError,
        r"threads must be an int, not str",
    ),
    (
        "start-workers-count-zero",
        lambda env, d, q: env.start_workers(1, worker_index=0, worker_count=0),
        ValueError,
        r"worker_index must be in range\(worker_count\)",
    ),
]


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)


# -- an observer that misuses its transaction ---------------------------------
# (commit: tx.commit(), abort: tx.abort(), with: tx.__enter__(); see
# children.observer_bad_input.MISUSES)


@pytest.mark.parametrize("misuse", ["commit", "abort", "with"])
def test_an_observer_that_commits_its_own_transaction_is_a_counted_failure(
    backend, tmp_path, misuse
):
    result = run_child_json(
        children.observer_bad_input.misusing_observer, backend, db=tmp_path / "db", misuse=misuse
    )
    assert result["failures"] >= 3
    assert "Traceback" in result["last_error"]
    assert "percolite" in result["last_error"]
    assert result["pending_while_failing"] == 1, "the notification is not lost"
    assert result["words_while_failing"] is False, "the failed run's writes are not committed"
    assert result["idle"] is True
    assert result["words"] == "3"
    assert result["commits"] == 1
    assert result["pending"] == 0
