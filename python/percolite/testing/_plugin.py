"""The pytest plugin of percolite.testing, registered through the ``pytest11``
entry point: the ``percolite_env`` and ``percolite_app_env`` fixtures, the
``percolite`` marker and the ``--percolite-backend`` option."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .. import _env
from .._app import App
from ._run import BACKENDS

_OPTION = "--percolite-backend"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("percolite")
    group.addoption(
        _OPTION,
        choices=BACKENDS,
        default=None,
        help="the backend percolite_env and percolite_app_env open (default: memory)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "percolite(backend): the backend percolite_env and percolite_app_env open "
        f"for this test, one of {', '.join(map(repr, BACKENDS))}",
    )


def _marked_backend(item: pytest.Item) -> str | None:
    """The backend the ``percolite`` marker names for ``item`` (None: no
    marker, or one without ``backend``); UsageError for a marker that is wrong."""
    marker = item.get_closest_marker("percolite")
    if marker is None:
        return None
    unknown = set(marker.kwargs) - {"backend"}
    if marker.args or unknown:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.percolite takes only backend=..., e.g. "
            f"@pytest.mark.percolite(backend='lmdb'); got {marker.args!r} {marker.kwargs!r}"
        )
    backend = marker.kwargs.get("backend")
    if backend is not None and backend not in BACKENDS:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.percolite(backend={backend!r}): the backend must be "
            f"one of {', '.join(map(repr, BACKENDS))}"
        )
    return None if backend is None else str(backend)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # a wrong marker is an error even on a test with no store
        _marked_backend(item)


def _backend(request: pytest.FixtureRequest) -> str:
    marked = _marked_backend(request.node)
    return marked or str(request.config.getoption(_OPTION) or "memory")


class _Stores:
    """The stores a test opened, closed and removed when it ends."""

    def __init__(self, backend: str, directories: pytest.TempPathFactory) -> None:
        self.backend = backend
        self.directories = directories
        self.opened: list[tuple[_env.Env, Path | None]] = []

    def open(self, app: App | None) -> _env.Env:
        directory = None
        if self.backend == "memory":
            env = _env.open(backend="memory", app=app)
        else:
            directory = self.directories.mktemp("percolite")
            env = _env.open(directory / "store", sync="none", app=app)
        self.opened.append((env, directory))
        return env

    def close(self) -> None:
        for env, directory in reversed(self.opened):
            env.close()
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def percolite_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_env.Env]:
    """A fresh percolite store with no app (in memory unless the
    ``percolite`` marker or ``--percolite-backend`` says ``"lmdb"``),
    closed and removed after the test: for tests of plain transactions, or
    to bind an app later (``env.bind(app)``; cells written before that set
    no notifications, since no app observed them)."""
    stores = _Stores(_backend(request), tmp_path_factory)
    try:
        yield stores.open(None)
    finally:
        stores.close()


@pytest.fixture
def percolite_app_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[App], _env.Env]]:
    """A factory: ``percolite_app_env(app)`` opens a fresh store bound to
    ``app`` (of the kind ``percolite_env`` opens); every store it opened is
    closed and removed after the test."""
    stores = _Stores(_backend(request), tmp_path_factory)

    def open_bound(app: Any) -> _env.Env:
        if not isinstance(app, App):
            raise TypeError(f"percolite_app_env needs a percolite.App, not {type(app).__name__}")
        return stores.open(app)

    try:
        yield open_bound
    finally:
        stores.close()
