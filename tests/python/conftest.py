"""Shared fixtures and helpers for the percolite Python tests.

Tests that could hang (threads, several processes, close while others run,
fork) run their body in a child interpreter through ``_isolated.run_child``
(the code is in the ``children`` package), so a deadlock fails that one test
after a timeout instead of freezing the suite.
"""

from __future__ import annotations

import percolite
import pytest
from _postgres import postgres_dsn  # noqa: F401 - a session fixture: a real PostgreSQL server

__all__ = ["COL", "as_tuples", "committed_cells"]

# A column most tests write to.
COL = ("f", "q")


@pytest.fixture
def store_path(tmp_path):
    """A path for a new store (the directory does not exist yet)."""
    return tmp_path / "store"


@pytest.fixture
def env(store_path):
    """A fresh store opened with ``sync="none"``; closed after the test."""
    handle = percolite.open(store_path, sync="none")
    yield handle
    handle.close()


def as_tuples(cells):
    """Cells as plain ``(row, (family, qualifier), value)`` tuples, easy to compare."""
    return [(c.row, tuple(c.column), c.value) for c in cells]


def committed_cells(env):
    """Every committed cell of the store, as ``as_tuples`` gives them."""
    tx = env.transaction()
    try:
        return as_tuples(tx.scan())
    finally:
        tx.abort()
