"""percolite: embedded incremental processing on one machine.

Percolator-style snapshot-isolation transactions with conflict detection, on
LMDB, from Python. Start with :func:`open`::

    import percolite

    with percolite.open("my.db") as env:
        with env.transaction() as tx:
            tx.set("doc:1", ("doc", "content"), "hello world")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import codecs, exporters, testing
from ._app import App
from ._cells import Cell, Column
from ._check import check
from ._combine import Change, CombineQueue
from ._counters import ShardedCounter
from ._env import SYNC_MODES, Env, open
from ._export import ExportBatch, ExportQueue, SequencedExport
from ._frames import Failures, ParkedWork, Scan
from ._loader import Loader
from ._observer import STRONG, WEAK, NotificationType, ObserverTransaction
from ._transaction import Transaction
from ._workers import run_workers
from .errors import (
    AppMismatch,
    CallbackError,
    ClosedError,
    CommitConflict,
    CorruptionError,
    Error,
    SinkBlocked,
    SinkBusy,
    SinkOwnedByOtherStore,
    SinkRefused,
    SinkUnavailable,
    StorageError,
    WorkParked,
)

__version__ = "0.1.0"

__all__ = [
    "open",
    "check",
    "App",
    "NotificationType",
    "STRONG",
    "WEAK",
    "ObserverTransaction",
    "CombineQueue",
    "Change",
    "ExportBatch",
    "ExportQueue",
    "SequencedExport",
    "ShardedCounter",
    "codecs",
    "exporters",
    "testing",
    "ui",
    "Env",
    "Loader",
    "Transaction",
    "Column",
    "Cell",
    "Scan",
    "Failures",
    "ParkedWork",
    "SYNC_MODES",
    "run_workers",
    "Error",
    "CommitConflict",
    "ClosedError",
    "CorruptionError",
    "StorageError",
    "CallbackError",
    "SinkBlocked",
    "SinkBusy",
    "SinkOwnedByOtherStore",
    "SinkRefused",
    "SinkUnavailable",
    "WorkParked",
    "AppMismatch",
]

if TYPE_CHECKING:
    from . import ui


def __getattr__(name: str) -> Any:
    # percolite.ui (the console, on http.server) is imported when first
    # used: most programs never serve it, and it adds a tenth to import time.
    if name == "ui":
        import importlib

        return importlib.import_module(".ui", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
