"""Misuse of transactions and of the store handle: bad arguments, ended
transactions, closed stores, bad options of env.run. Each raises one specific
exception whose message names what was wrong, and nothing is written."""

from __future__ import annotations

import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from conftest import COL, committed_cells, open_store

# -- bad arguments to a transaction ----------------------------------------------

BAD_CALLS = [
    # (id, call, exception, message pattern)
    (
        "int-row-set",
        lambda tx: tx.set(1, COL, b"v"),
        TypeError,
        r"row must be bytes or str, not int",
    ),
    ("int-row-get", lambda tx: tx.get(1, COL), TypeError, r"row must be bytes or str, not int"),
    (
        "int-row-delete",
        lambda tx: tx.delete(7, COL),
        TypeError,
        r"row must be bytes or str, not int",
    ),
    (
        "none-row",
        lambda tx: tx.set(None, COL, b"v"),
        TypeError,
        r"row must be bytes or str, not NoneType",
    ),
    (
        "none-value",
        lambda tx: tx.set(b"r", COL, None),
        TypeError,
        r"value must be bytes or str, not NoneType",
    ),
    (
        "int-value",
        lambda tx: tx.set(b"r", COL, 5),
        TypeError,
        r"value must be bytes or str, not int",
    ),
    ("empty-row-set", lambda tx: tx.set(b"", COL, b"v"), ValueError, r"row must not be empty"),
    ("empty-str-row-set", lambda tx: tx.set("", COL, b"v"), ValueError, r"row must not be empty"),
    ("empty-row-get", lambda tx: tx.get(b"", COL), ValueError, r"row must not be empty"),
    ("empty-row-delete", lambda tx: tx.delete(b"", COL), ValueError, r"row must not be empty"),
    (
        "empty-family-set",
        lambda tx: tx.set(b"r", (b"", b"q"), b"v"),
        ValueError,
        r"column family must not be empty",
    ),
    (
        "empty-family-delete",
        lambda tx: tx.delete(b"r", ("", "q")),
        ValueError,
        r"column family must not be empty",
    ),
    (
        "empty-family-get",
        lambda tx: tx.get(b"r", ("", "")),
        ValueError,
        r"column family must not be empty",
    ),
    (
        "column-1-tuple",
        lambda tx: tx.set(b"r", ("f",), b"v"),
        TypeError,
        r"column must be a \(family, qualifier\) tuple.*1 item",
    ),
    (
        "column-3-tuple",
        lambda tx: tx.set(b"r", ("f", "q", "x"), b"v"),
        TypeError,
        r"column must be a \(family, qualifier\) tuple.*3 item",
    ),
    (
        "column-str",
        lambda tx: tx.set(b"r", "fq", b"v"),
        TypeError,
        r"column must be a \(family, qualifier\) tuple.*str",
    ),
    (
        "column-list",
        lambda tx: tx.set(b"r", ["f", "q"], b"v"),
        TypeError,
        r"column must be a \(family, qualifier\) tuple.*list",
    ),
    (
        "column-none",
        lambda tx: tx.delete(b"r", None),
        TypeError,
        r"column must be a \(family, qualifier\) tuple.*NoneType",
    ),
    (
        "family-int",
        lambda tx: tx.set(b"r", (1, b"q"), b"v"),
        TypeError,
        r"column family must be bytes or str, not int",
    ),
    (
        "qualifier-none",
        lambda tx: tx.set(b"r", (b"f", None), b"v"),
        TypeError,
        r"column qualifier must be bytes or str, not NoneType",
    ),
    (
        "scan-prefix-int",
        lambda tx: list(tx.scan(5)),
        TypeError,
        r"prefix must be bytes or str, not int",
    ),
    (
        "scan-start-int",
        lambda tx: list(tx.scan(start=5)),
        TypeError,
        r"start must be bytes or str, not int",
    ),
    (
        "scan-end-int",
        lambda tx: list(tx.scan(end=5.0)),
        TypeError,
        r"end must be bytes or str, not float",
    ),
    (
        "scan-bad-column",
        lambda tx: list(tx.scan(columns=["fq"])),
        TypeError,
        r"column must be a \(family, qualifier\) tuple",
    ),
    (
        "scan-columns-bare-tuple",
        lambda tx: list(tx.scan(columns=("f", "q"))),
        TypeError,
        r"column must be a \(family, qualifier\) tuple",
    ),
    (
        "scan-prefix-and-range",
        lambda tx: list(tx.scan(b"a", start=b"b")),
        ValueError,
        r"either prefix or start/end",
    ),
    (
        "get-many-not-pairs",
        lambda tx: tx.get_many([b"r"]),
        TypeError,
        r"get_many takes \(row, column\) pairs",
    ),
    (
        "get-many-int-row",
        lambda tx: tx.get_many([(3, COL)]),
        TypeError,
        r"row must be bytes or str, not int",
    ),
]


@pytest.mark.parametrize(
    "call, exc, message", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_argument_raises_and_writes_nothing(env, call, exc, message):
    tx = env.transaction()
    with pytest.raises(exc, match=message) as info:
        call(tx)
    assert not isinstance(info.value, percolite.Error)
    # The transaction is still usable, and nothing was buffered by the bad call.
    assert tx.state == "active"
    assert list(tx.scan()) == []
    tx.commit()
    assert tx.commit_ts is None  # it wrote nothing
    assert committed_cells(env) == []


def test_bad_argument_leaves_earlier_writes_of_the_transaction_alone(env):
    tx = env.transaction()
    tx.set(b"good", COL, b"v")
    with pytest.raises(TypeError, match="value"):
        tx.set(b"bad", COL, None)
    with pytest.raises(ValueError, match="row"):
        tx.set(b"", COL, b"v")
    tx.commit()
    assert committed_cells(env) == [(b"good", (b"f", b"q"), b"v")]


def test_column_constructor_validates():
    with pytest.raises(ValueError, match="column family must not be empty"):
        percolite.Column("", "q")
    with pytest.raises(TypeError, match="column family must be bytes or str, not int"):
        percolite.Column(1, "q")
    with pytest.raises(TypeError, match="column qualifier must be bytes or str, not NoneType"):
        percolite.Column("f", None)
    assert percolite.Column("f") == (b"f", b"")


# -- ended transactions -------------------------------------------------------------


def _ended_uses(tx):
    return [
        lambda: tx.get(b"r", COL),
        lambda: tx.get_many([(b"r", COL)]),
        lambda: tx.set(b"r", COL, b"v"),
        lambda: tx.delete(b"r", COL),
        lambda: list(tx.scan()),
        lambda: tx.commit(),
    ]


@pytest.mark.parametrize("ending", ["committed", "aborted", "conflicted"])
def test_using_an_ended_transaction_raises(env, ending):
    tx = env.transaction()
    tx.set(b"mine", COL, b"v")
    if ending == "committed":
        tx.commit()
    elif ending == "aborted":
        tx.abort()
    else:
        with env.transaction() as other:
            other.set(b"mine", COL, b"theirs")
        with pytest.raises(percolite.CommitConflict):
            tx.commit()
    before = committed_cells(env)
    word = "committed" if ending == "committed" else "aborted"
    for use in _ended_uses(tx):
        with pytest.raises(percolite.Error, match=f"already {word}") as info:
            use()
        assert not isinstance(info.value, percolite.ClosedError)
    tx.abort()  # idempotent, never raises
    assert tx.state == ("committed" if ending == "committed" else "aborted")
    assert committed_cells(env) == before


def test_context_manager_on_an_ended_transaction_does_not_commit_again(env):
    tx = env.transaction()
    tx.set(b"r", COL, b"v")
    tx.commit()
    ts = tx.commit_ts
    with tx:
        pass
    assert tx.commit_ts == ts


# -- closed stores --------------------------------------------------------------


def test_env_transaction_after_close_raises_closed_error(backend, store_path):
    env = open_store(backend, store_path, sync="none")
    env.close()
    env.close()  # idempotent
    assert env.closed
    with pytest.raises(percolite.ClosedError, match="closed") as info:
        env.transaction()
    assert env.path in str(info.value)
    with pytest.raises(percolite.ClosedError, match="closed"):
        env.stats()
    with pytest.raises(percolite.ClosedError):
        env.run(lambda tx: None)
    assert isinstance(percolite.ClosedError("x"), percolite.Error)


def test_transaction_begun_before_close_raises_closed_error(backend, store_path):
    env = open_store(backend, store_path, sync="none")
    persistent = env.capabilities["persistent"]
    with env.transaction() as tx:
        tx.set(b"kept", COL, b"v")
    reader = env.transaction()
    writer = env.transaction()
    writer.set(b"lost", COL, b"v")
    env.close()
    assert writer.state == "closed"  # close aborts unfinished transactions
    for tx in (reader, writer):
        for use in _ended_uses(tx):
            with pytest.raises(percolite.ClosedError, match="closed"):
                use()
        tx.abort()  # still never raises
    if persistent:  # a memory store is gone with its handle: nothing to reopen
        with open_store(backend, store_path, sync="none") as env2:
            assert committed_cells(env2) == [(b"kept", (b"f", b"q"), b"v")]


def test_context_manager_closes_the_env(backend, store_path):
    with open_store(backend, store_path, sync="none") as env:
        assert not env.closed
    assert env.closed
    with pytest.raises(percolite.ClosedError):
        env.transaction()


# -- env.run -------------------------------------------------------------------


def test_bad_run_arguments(env):
    with pytest.raises(ValueError, match="retries must be >= 0 or None"):
        env.run(lambda tx: None, retries=-1)
    with pytest.raises(TypeError, match="fn must be callable, not str"):
        env.run("not callable")
    assert committed_cells(env) == []


# -- bad input to env.run and to ended transactions and closed stores ----------

ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    (
        "run-backoff",
        lambda env, d, q: env.run(q["never"], backoff=-1),
        ValueError,
        r"backoff must be a finite number >= 0, not -1",
    ),
    (
        "run-max-backoff-nan",
        lambda env, d, q: env.run(q["never"], max_backoff=float("nan")),
        ValueError,
        r"max_backoff must be a finite number >= 0",
    ),
    (
        "run-retries-float",
        lambda env, d, q: env.run(q["never"], retries=1.5),
        TypeError,
        r"retries must be an int or None, not float",
    ),
    (
        "run-retries-negative",
        lambda env, d, q: env.run(q["never"], retries=-1),
        ValueError,
        r"retries must be >= 0",
    ),
    # transactions used after they ended, and handles after close
    (
        "tx-set-after-commit",
        lambda env, d, q: q["ended"](env).set("r", COL, "v"),
        percolite.Error,
        r"the transaction was already committed",
    ),
    (
        "closed-env-transaction",
        lambda env, d, q: q["closed"](d).transaction(),
        percolite.ClosedError,
        r"closed",
    ),
]


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)
