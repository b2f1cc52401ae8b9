"""Opening a store: :func:`open` and :class:`Env`."""

from __future__ import annotations

import os
import random
import time
from typing import Any, Callable, TypeVar

from . import _core
from ._transaction import Transaction
from .errors import CommitConflict

__all__ = ["open", "Env", "SYNC_MODES"]

T = TypeVar("T")

SYNC_MODES = ("full", "meta", "none")

_DEFAULT_MAP_SIZE = 1 << 30


def open(  # noqa: A001 - mirrors lmdb.open / sqlite3.connect
    path: str | os.PathLike,
    *,
    sync: str = "full",
    create: bool = True,
    mode: int = 0o600,
    map_size: int = _DEFAULT_MAP_SIZE,
    max_readers: int = 2046,
) -> Env:
    """Open (creating it by default) the percolite store in directory ``path``.

    ``sync`` chooses durability: ``"full"`` (default) makes every commit
    durable; ``"meta"`` may lose the last commits on an OS crash but never
    corrupts; ``"none"`` leaves flushing to the OS (fast, for tests and
    scratch data; a process crash alone loses nothing).

    The directory is created with ``mode`` plus search permission where it
    grants read (``0o600`` gives ``0o700``); the files get ``mode``.
    ``map_size`` is the initial size of the memory map; it grows by itself.
    ``max_readers`` bounds transactions open at once across processes.

    Opening a path that this process has open already returns a new handle
    on the same store (with the same ``sync``, else ``ValueError``). A store
    opened before ``os.fork()`` cannot be used in the child: open it there
    again, or use the ``spawn``/``forkserver`` start methods.
    """
    if sync not in SYNC_MODES:
        raise ValueError(f"sync must be one of {', '.join(map(repr, SYNC_MODES))}, not {sync!r}")
    try:
        fspath = os.fspath(path)
    except TypeError:
        raise TypeError(f"path must be str or os.PathLike, not {type(path).__name__}") from None
    if isinstance(fspath, bytes):
        fspath = os.fsdecode(fspath)
    for name, value in (("mode", mode), ("map_size", map_size), ("max_readers", max_readers)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= mode <= 0o777:
        raise ValueError(f"mode must be a permission mask between 0 and 0o777, not {mode:#o}")
    if map_size < 1 << 20:
        raise ValueError(f"map_size must be at least 1 MiB, not {map_size}")
    if not 1 <= max_readers <= 1 << 16:
        raise ValueError(f"max_readers must be between 1 and 65536, not {max_readers}")
    core = _core.Env.open(fspath, sync, bool(create), mode, map_size, max_readers)
    return Env(core, sync=sync)


class Env:
    """An open percolite store. Create it with :func:`percolite.open`.

    Thread-safe: share one ``Env`` between threads. Use it as a context
    manager, or call :meth:`close`, which aborts this handle's unfinished
    transactions (waiting for commits already under way) and closes the store
    when it is the last handle in the process. Using a closed handle raises
    :class:`~percolite.ClosedError`.
    """

    def __init__(self, core: Any, *, sync: str) -> None:
        self._core = core
        self._sync = sync

    @property
    def path(self) -> str:
        """The real path of the store's directory."""
        return self._core.path

    @property
    def sync(self) -> str:
        return self._sync

    @property
    def closed(self) -> bool:
        return self._core.closed

    def transaction(self) -> Transaction:
        """Begin a transaction on a snapshot of everything committed so far."""
        return Transaction(self._core.begin())

    def run(
        self,
        fn: Callable[[Transaction], T],
        *,
        retries: int | None = 1000,
        backoff: float = 0.001,
        max_backoff: float = 0.1,
    ) -> T:
        """Run ``fn(tx)`` in a fresh transaction and commit it, retrying on
        :class:`~percolite.CommitConflict`; return what ``fn`` returned.

        Retries wait a random time up to ``backoff * 2**attempt`` seconds,
        capped at ``max_backoff`` ("full jitter"), so colliding writers spread
        out. After ``retries`` retries the last conflict is raised;
        ``retries=None`` retries until it commits. Any other exception aborts
        the transaction and propagates at once. ``fn`` may run several times:
        keep side effects outside percolite out of it.
        """
        if retries is not None and retries < 0:
            raise ValueError(f"retries must be >= 0 or None, not {retries}")
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        attempt = 0
        while True:
            tx = self.transaction()
            try:
                result = fn(tx)
                if tx.state in ("active", "closed"):
                    tx.commit()  # raises ClosedError if the store closed meanwhile
                return result
            except CommitConflict:
                if retries is not None and attempt >= retries:
                    raise
                attempt += 1
                time.sleep(random.uniform(0, min(max_backoff, backoff * 2 ** min(attempt, 30))))
            finally:
                tx.abort()

    def stats(self) -> dict:
        """Counters of this process's commits: ``commits``, ``conflicts``,
        ``batches`` (group commits), ``tombstones_collected``, ``map_size``,
        ``map_growths``."""
        return self._core.stats()

    def close(self) -> None:
        """Close this handle; idempotent."""
        self._core.close()

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<percolite.Env {self.path!r} sync={self._sync!r} {state}>"
