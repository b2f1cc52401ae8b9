"""The percolite exception hierarchy.

Every error the engine raises is a :class:`percolite.Error`, except bad
arguments, which raise the built-in :class:`TypeError` or :class:`ValueError`.
The C++ core maps its error codes to these classes through one table
(``cpp/bindings/errors.cc``).
"""

from __future__ import annotations

__all__ = [
    "Error",
    "CommitConflict",
    "ClosedError",
    "CorruptionError",
    "StorageError",
    "CallbackError",
    "WorkParked",
    "AppMismatch",
]


class Error(Exception):
    """Base class of percolite's own errors (also: a handle used in a forked
    child, or a transaction used after it committed or aborted)."""


class CommitConflict(Error):
    """A cell this transaction wrote was written by another transaction that
    committed after this one started. Nothing of the transaction was applied;
    run it again (``Env.run`` does this for you)."""


class ClosedError(Error):
    """The store (or the handle the object belongs to) was closed."""


class CorruptionError(Error):
    """The files on disk are not a percolite store of this version, or are damaged."""


class StorageError(Error):
    """The storage layer failed: permissions, a missing directory, disk errors."""


class CallbackError(Error):
    """A user callback (observer, combiner, exporter) raised; ``traceback``
    holds the formatted Python traceback."""

    def __init__(self, message: str, traceback: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback


class WorkParked(Error):
    """Only parked work is left: work whose observer failed on its last
    attempt (``max_attempts``) is recorded in the store and no longer run.
    ``parked`` is how many notifications are parked, ``by_observer`` maps
    each observer's name to its count. See them with ``Env.parked()`` or
    ``percolite status``; run them again with ``Env.retry_parked()`` or
    ``percolite retry`` once the cause is fixed."""

    def __init__(
        self, message: str, parked: int = 0, by_observer: dict[str, int] | None = None
    ) -> None:
        super().__init__(message)
        self.parked = parked
        self.by_observer: dict[str, int] = dict(by_observer or {})


class AppMismatch(Error):
    """The store was bound to another app: a different name, observed
    columns, or queue layouts (combiner, codecs, buckets). ``differences``
    lists them. Open it with the app it was bound to, or with
    ``upgrade=True`` (``percolite.open`` or ``Env.bind``) to record the new
    app deliberately."""

    def __init__(self, message: str, differences: list[str] | None = None) -> None:
        super().__init__(message)
        self.differences: list[str] = list(differences or [])
