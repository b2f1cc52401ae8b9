"""The check behind each feature's table of bad input to its entry points
(``ENTRY_POINT_CASES`` beside that feature's tests): the call raises one
specific exception whose message names what was wrong, and nothing is
written or created.

A case is ``(id, call, exception, message pattern)``; ``call(env, tmp_path,
objects)`` gets an lmdb store bound to app ``"bad"`` (one cell written), the
test's directory, and the objects the calls misuse: ``cq`` and ``eq`` (a
combine and an export queue of the store's app, str keys, int64 values),
``other_cq`` and ``other_eq`` (queues of another app), ``cq_elsewhere`` (a
queue named like ``cq`` but declared otherwise), ``counter`` (a sharded
counter), ``never`` (a function that must not run), ``ended(env)`` (a
committed transaction) and ``closed(tmp_path)`` (a closed store)."""

from __future__ import annotations

import os

import percolite
import pytest
from conftest import COL

__all__ = ["entry_point_params", "refuses_bad_input"]


def _store_snapshot(path) -> dict:
    return {
        name: (path / name).read_bytes()
        for name in sorted(os.listdir(path))
        if name not in ("lock.mdb", "waiting")  # reader slots and wake-ups change
    }


def _ended(env):
    tx = env.transaction()
    tx.commit()
    return tx


def _closed(directory):
    other = percolite.open(":memory:")
    other.close()
    return other


def entry_point_params(cases) -> list:
    """``cases`` as the parameters ``call, error, pattern`` of a test, each
    with its case's id."""
    return [pytest.param(c, e, p, id=i) for i, c, e, p in cases]


def refuses_bad_input(tmp_path, call, error, pattern) -> None:
    """Runs one case (see the module docstring) and checks that it raised
    ``error`` matching ``pattern`` and changed nothing."""
    app, other, elsewhere = percolite.App("bad"), percolite.App("other"), percolite.App("else")
    objects = {
        "cq": app.combine_queue("cq", key_codec="str", value_codec="int64"),
        "eq": app.export_queue("eq", lambda entries: None, key_codec="str", value_codec="int64"),
        "other_cq": other.combine_queue("ocq"),
        "other_eq": other.export_queue("oeq", lambda entries: None),
        "cq_elsewhere": elsewhere.combine_queue("cq", key_codec="str", value_codec="float64"),
        "counter": percolite.ShardedCounter("hits", shards=4),
        "never": lambda tx: pytest.fail("fn ran despite bad options"),
        "ended": _ended,
        "closed": _closed,
    }
    store = tmp_path / "db"
    with percolite.open(store, app=app, sync="none") as env:
        with env.transaction() as tx:
            tx.set("row", COL, "v")
        before = _store_snapshot(store)
        entries_before = sorted(os.listdir(tmp_path))
        with pytest.raises(error, match=pattern):
            call(env, tmp_path, objects)
        assert sorted(os.listdir(tmp_path)) == entries_before, "nothing was created"
    assert _store_snapshot(store) == before or committed_cells_same(store)


def committed_cells_same(store) -> bool:
    with percolite.open(store, sync="none") as env:
        with env.transaction() as tx:
            return [(c.row, tuple(c.column), c.value) for c in tx.scan()] == [
                (b"row", (b"f", b"q"), b"v")
            ]
