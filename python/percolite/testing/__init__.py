"""Testing percolite applications.

:func:`run_until_idle` runs an app's observers, combine-queue folds and
exporters one at a time in the calling thread until nothing is pending:
deterministic, with no worker threads and no sleeping, so a test reads the
results right after it::

    import percolite
    from percolite.testing import run_until_idle

    def test_lengths(percolite_app_env):
        env = percolite_app_env(app)
        env.run(lambda tx: tx.set("doc1", ("doc", "text"), "hello"))
        run_until_idle(env)
        with env.transaction() as tx:
            assert tx.get("doc1", ("doc", "length")) == b"5"

Installing percolite registers a pytest plugin (no conftest needed) with
two fixtures:

* ``percolite_env``: a fresh store with no app, closed and removed after
  the test;
* ``percolite_app_env``: a factory, ``percolite_app_env(app) -> Env``, that
  opens a fresh store bound to ``app``; each is closed and removed after the
  test.

Both open in-memory stores (``backend="memory"``); the marker
``@pytest.mark.percolite(backend="lmdb")`` or the command-line option
``--percolite-backend=lmdb`` opens LMDB stores in a temporary directory
instead (with ``sync="none"``: tests need no durability).

:func:`simulate` runs an app over a load under a seeded, single-threaded
scheduler that overlaps transactions and injects faults (:class:`Faults`:
failing observers and exporters, conflicts, crashes, delays); the same seed
gives the same trace and final store in any process, and :func:`seeds`
labels parametrized cases with their seeds for replaying.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._app import App
from .._args import check_int
from .._env import Env
from ._run import BACKENDS, RunSummary, StuckError, run_until_idle
from ._simulation import Faults, Simulation, simulate

__all__ = [
    "run_until_idle",
    "RunSummary",
    "StuckError",
    "simulate",
    "Simulation",
    "Faults",
    "seeds",
    "BACKENDS",
    "AppEnvFactory",
]

AppEnvFactory = Callable[[App], Env]
"""The type of the ``percolite_app_env`` fixture, for annotated tests:
``def test_it(percolite_app_env: AppEnvFactory) -> None``."""


def seeds(n: int, start: int = 0) -> list[Any]:
    """``n`` seeds for ``@pytest.mark.parametrize("seed", seeds(n))``, each
    labelled ``seed=N`` in pytest's report, so that a failing case names the
    seed that ``simulate(..., seed=N)`` replays."""
    import pytest

    check_int("n", n, 0)
    check_int("start", start, 0)
    return [pytest.param(seed, id=f"seed={seed}") for seed in range(start, start + n)]
