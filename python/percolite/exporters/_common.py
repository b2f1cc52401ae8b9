"""What every exporter of this package shares: connection pools and locks
that are safe across fork(), and the check of an entry's seq. Their
argument checks are percolite's (``percolite._args``)."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import ClosedError, SinkOwnedByOtherStore, SinkUnavailable

_SEQ_LIMIT = 1 << 63  # seq fits a signed 64-bit column

# A sink belongs to one store. Each built-in sink records the identity and
# epoch of the store that feeds it (an ExportBatch says which store sent it)
# beside its seq guard, and decides what to do with a batch by this rule.
APPLY, ADOPT, NEW_EPOCH, UNCHECKED = "apply", "adopt", "new epoch", "unchecked"


def _claim(owner: tuple[str, int] | None, entries: Any, sink: str) -> str:
    """What a sink that recorded ``owner`` (store identity, epoch; None:
    none yet) does with ``entries``: UNCHECKED when they come from no store
    (the exporter called directly: nothing is checked or recorded); ADOPT
    when the sink has no owner yet (a new sink, or one made before sinks
    knew their store): the batch's store becomes it; APPLY for its owner's
    entries; NEW_EPOCH for its owner's entries of a later epoch (a copy of
    the store, restored): what the sink holds counts as older than them.
    Raises SinkOwnedByOtherStore for another store's entries, and
    SinkUnavailable for an earlier epoch's (a run begun before the store
    was opened as restored: retried, with the new epoch)."""
    store = getattr(entries, "store", None)
    if not store:
        return UNCHECKED
    epoch = entries.epoch
    if owner is None:
        return ADOPT
    if owner[0] != store:
        queue = getattr(entries, "queue", "?")
        raise SinkOwnedByOtherStore(
            f"{sink} belongs to store {owner[0]} (epoch {owner[1]}); these entries of export "
            f"queue {queue!r} come from store {store}, so the sink refuses them and nothing "
            "was written. A sink takes one store's entries: give this store its own sink, or, "
            f"if the old store is gone for good, take the sink over (its rows are cleared): "
            f"env.take_over_sink({queue!r}) or `percolite take-over MODULE:APP {queue} "
            "--db DB`",
            sink=sink,
            owner=owner[0],
            store=store,
        )
    if epoch > owner[1]:
        return NEW_EPOCH
    if epoch < owner[1]:
        raise SinkUnavailable(
            f"{sink} holds epoch {owner[1]} of store {store}; these entries come from epoch "
            f"{epoch}, a run begun before the store was opened as restored: retried"
        )
    return APPLY


def _log_adopted(sink: Any, store: str) -> None:
    """A sink that held rows but no owner was adopted (``_claim``: ADOPT)."""
    logging.getLogger("percolite.exporters").warning(
        "%r had rows but no owner (it was made before sinks knew their store): store %s "
        "now owns it; entries of any other store will be refused",
        sink,
        store,
    )


def _check_store(store: Any, epoch: Any) -> tuple[str, int]:
    """A take-over's target: a store identity and an epoch, checked."""
    if not isinstance(store, str) or not store:
        raise ValueError(f"take_over: store must be a store identity (str), not {store!r}")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise ValueError(f"take_over: epoch must be an int >= 1, not {epoch!r}")
    return store, epoch


# Fork safety: a lock held by another thread at fork time would never be
# released in the forked child, so every ForkSafeLock is new there.

_FORK_SAFE_LOCKS: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


class ForkSafeLock:
    """A mutex (use it in ``with``) that is released in a forked child,
    whichever thread of the parent held it at the fork."""

    __slots__ = ("_lock", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _FORK_SAFE_LOCKS.add(self)

    def renew(self) -> None:
        """A new, released lock in place of this one: for a forked child,
        whose only thread (the one that forked) did not hold it."""
        self._lock = threading.Lock()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def _renew_locks_after_fork() -> None:
    for lock in list(_FORK_SAFE_LOCKS):
        lock.renew()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_after_fork)

# Connections a forked child inherited. Closing them in the child would end
# the parent's session (PostgreSQL) or touch the parent's locks (SQLite), so
# the child keeps them referenced and never uses or finalizes them.
_INHERITED_CONNECTIONS: list[Any] = []


class _Pool:
    """Connections of one exporter in the current process: a thread takes an
    idle one or opens a new one, and gives it back when its call succeeded
    (after a failure the connection is closed: it may be broken)."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._lock = ForkSafeLock()
        self._idle: list[Any] = []
        self._pid = os.getpid()
        self._closed = False

    def _adopt_process(self) -> None:
        # Called with _lock held: in a forked child, forget the parent's connections.
        if self._pid != os.getpid():
            _INHERITED_CONNECTIONS.extend(self._idle)
            self._idle = []
            self._pid = os.getpid()

    @contextmanager
    def connection(self) -> Iterator[Any]:
        with self._lock:
            if self._closed:
                raise ClosedError("the exporter was closed")
            self._adopt_process()
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        pid = os.getpid()
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if not self._closed and self._pid == pid:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._adopt_process()
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _check_seq(entry: Any) -> int:
    seq = entry.seq
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < _SEQ_LIMIT:
        raise ValueError(f"seq must be an int in [0, 2**63), not {seq!r} (key {entry.key!r})")
    return seq


# Exported files are created owner-only, like the store, whatever the umask.
DEFAULT_FILE_MODE = 0o600


def _open_created(path: str, flags: int, mode: int) -> int:
    """Opens ``path`` (``os.open`` ``flags``), creating it with exactly
    ``mode`` (not masked by the umask) when it does not exist yet."""
    _create_missing(path, mode)
    return os.open(path, flags)


def _create_missing(path: str, mode: int) -> None:
    """Creates the empty file ``path`` with exactly ``mode`` when it does not
    exist; never opens an existing one. (Closing any descriptor of a file
    drops every POSIX lock this process holds on it, those of its SQLite
    connections too: another process could then take the file for its own,
    checkpoint and delete the WAL in use here, and corrupt the database.)"""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
