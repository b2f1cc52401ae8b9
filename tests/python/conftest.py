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

__all__ = ["BACKENDS", "COL", "as_tuples", "committed_cells", "open_store"]

# A column most tests write to.
COL = ("f", "q")


@pytest.fixture
def store_path(tmp_path):
    """A path for a new store (the directory does not exist yet)."""
    return tmp_path / "store"


# The conformance tests run on every backend percolite has: a test that takes
# the ``env`` or ``backend`` fixture runs once per backend, so a new backend
# is tested as soon as the core lists it.
BACKENDS = tuple(percolite._core.BACKENDS)


@pytest.fixture(params=BACKENDS)
def backend(request):
    """The name of a backend; tests taking it run once per backend."""
    return request.param


def open_store(backend, path, **options):
    """Open a store of ``backend``: the lmdb store at ``path``, or a new
    private memory store."""
    target = ":memory:" if backend == "memory" else path
    return percolite.open(target, backend=backend, **options)


@pytest.fixture
def env(store_path, backend):
    """A fresh store of each backend opened with ``sync="none"``; closed after the test."""
    handle = open_store(backend, store_path, sync="none")
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
