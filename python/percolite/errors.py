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
    "SinkUnavailable",
    "SinkRefused",
    "SinkOwnedByOtherStore",
    "SinkBusy",
    "WorkParked",
    "SinkBlocked",
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


class SinkUnavailable(Error):
    """Raise it (or a subclass) from an exporter to say that the sink is
    down, not that the entries are bad: the batch waits and is retried
    whole, with backoff, for as long as it takes; nothing is parked and these
    attempts do not count toward ``max_attempts``. Connection errors,
    time-outs (``OSError``), a locked SQLite database and psycopg's
    ``OperationalError`` count as such by default (``transient_errors`` of
    :meth:`percolite.App.export_queue`)."""


class SinkRefused(Error):
    """Raise it (or a subclass) from an exporter to say that the sink
    refuses this store's entries for good, whatever the entries: the
    queue's bucket is blocked at once (no attempts are spent, no key is
    parked, the entries stay queued) and shows as refused in
    :meth:`percolite.Env.status`; :meth:`percolite.Env.wait` raises
    :class:`WorkParked` once nothing else is left. Run it again with
    :meth:`percolite.Env.retry_parked` once the cause is dealt with."""


class SinkOwnedByOtherStore(SinkRefused):
    """A built-in sink refused entries because it belongs to another store:
    a sink records the identity of the store that feeds it beside its seq
    guard (a new store's seqs start low again, so without the identity its
    values would be dropped as stale). ``sink`` describes the sink,
    ``owner`` and ``store`` are the identities of the store it belongs to
    and of the store refused. Nothing of the batch was written. To make the
    sink this store's on purpose (its rows are cleared), use
    :meth:`percolite.Env.take_over_sink` or ``percolite take-over``."""

    def __init__(self, message: str, sink: str = "", owner: str = "", store: str = "") -> None:
        super().__init__(message)
        self.sink = sink
        self.owner = owner
        self.store = store


class SinkBusy(Error):
    """A take-over of a sink found it being written by another call (the
    workers of the store that owns it, most likely) and gave up with
    nothing changed: stop them, then take it over again."""


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


class SinkBlocked(WorkParked):
    """Nothing is left to run but parked work, some of it export queues
    blocked by a sink that refuses this store for good
    (:class:`SinkRefused`, e.g. :class:`SinkOwnedByOtherStore`): their
    entries stay queued. ``blocked`` maps each blocked queue's id to the
    sink's error message. Deal with the cause (for a sink that belongs to
    another store: :meth:`percolite.Env.take_over_sink`), then the queue
    runs again."""

    def __init__(
        self,
        message: str,
        parked: int = 0,
        by_observer: dict[str, int] | None = None,
        blocked: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, parked, by_observer)
        self.blocked: dict[str, str] = dict(blocked or {})
