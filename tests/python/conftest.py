"""Shared fixtures and helpers for the percolite Python tests.

Tests that could hang (threads, several processes, close while others run,
fork) run their body in a child interpreter through ``_isolated.run_child``
(the code is in the ``children`` package), so a deadlock fails that one test
after a timeout instead of freezing the suite.
"""

from __future__ import annotations

import os

import percolite
import pytest
from _postgres import (  # noqa: F401 - fixtures: real servers
    postgres_dsn,
    postgres_server,
    primary_and_standby,
)
from _sql_targets import PostgresTarget, SQLiteTarget
from children import POSTGRES_VARIABLE, open_store, store_target

__all__ = ["BACKENDS", "COL", "as_tuples", "committed_cells", "open_store", "store_target"]

# A column most tests write to.
COL = ("f", "q")


@pytest.fixture(params=["sqlite", "postgres"])
def target(request, tmp_path):
    """A test of the SQL exporters taking it runs against SQLite and against
    PostgreSQL (``_sql_targets``)."""
    if request.param == "sqlite":
        made = SQLiteTarget(tmp_path)
    else:
        made = PostgresTarget(request.getfixturevalue("postgres_dsn"))
    yield made
    for exporter in made.made:
        exporter.close()


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
    """The name of a backend; tests taking it run once per backend (for
    postgresql, on the server PERCOLITE_TEST_POSTGRES names, or else on the
    session's temporary server, whose URI is put there for child processes)."""
    if request.param == "postgresql" and not os.environ.get(POSTGRES_VARIABLE):
        os.environ[POSTGRES_VARIABLE] = request.getfixturevalue("postgres_server").uri
    return request.param


def pytest_collection_modifyitems(items):
    """Marks every test that runs once per backend ``conformance``: with
    ``PERCOLITE_TEST_POSTGRES=postgresql://...`` in the environment, ``pytest
    -m conformance -k postgresql`` runs the backend contract's tests against
    that server (each in a schema of its own) instead of a temporary one."""
    for item in items:
        if "backend" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.conformance)


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
