"""Transactions: snapshot isolation with write-write conflict detection.

The contract lives in ``cpp/include/percolite/transaction.h``; in short:

* a transaction reads one snapshot (everything committed before it began)
  plus its own writes;
* writes are buffered and applied atomically at commit;
* commit raises :class:`~percolite.CommitConflict` when another transaction
  that committed after this one began wrote (set or deleted) a cell this one
  writes. Nothing of a failed transaction is applied;
* reads never conflict, so *write skew* is possible: two transactions that
  each read both of two cells and each write a different one can both commit.
  When an invariant spans cells, make every transaction that could break it
  write one common cell (Fluo's advice, and Percolator's).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

from . import _core
from ._cells import BytesLike, Cell, Column
from ._frames import Scan

if TYPE_CHECKING:
    from ._app import App

__all__ = ["Transaction"]

ColumnLike = tuple[BytesLike, BytesLike]
D = TypeVar("D")

_SCAN_CHUNK = 512

# percolite's own rows (failure records) begin with these bytes; scans skip
# them unless asked for rows inside them.
_SYSTEM = _core.SYSTEM_ROW_PREFIX
_SYSTEM_END = _SYSTEM[:-1] + bytes([_SYSTEM[-1] + 1])


def _as_bytes(value: BytesLike) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _user_ranges(prefix: Any, start: Any, end: Any) -> list[tuple[Any, Any, Any]]:
    """The (prefix, start, end) scans that cover what was asked for, less
    percolite's own rows, unless the request lies inside them."""
    if prefix is not None:
        if not isinstance(prefix, (str, bytes, bytearray, memoryview)):
            return [(prefix, None, None)]  # the core names the bad type
        wanted = _as_bytes(prefix)
        if not _SYSTEM.startswith(wanted) or wanted == _SYSTEM:
            return [(prefix, None, None)]  # disjoint from, or inside, the system rows
        after = _SYSTEM_END if len(wanted) < len(_SYSTEM) else None
        upper = wanted[:-1] + bytes([wanted[-1] + 1]) if wanted else None
        return [(None, wanted or None, _SYSTEM), (None, after, upper)]
    for bound in (start, end):
        if bound is not None and not isinstance(bound, (str, bytes, bytearray, memoryview)):
            return [(None, start, end)]
    low = b"" if start is None else _as_bytes(start)
    high = None if end is None else _as_bytes(end)
    if low >= _SYSTEM or (high is not None and high <= _SYSTEM) or low >= _SYSTEM_END:
        return [(None, start, end)]
    return [(None, start, _SYSTEM), (None, _SYSTEM_END, end)]


class Transaction:
    """A snapshot-isolation transaction; get one from :meth:`Env.transaction`.

    Use it as a context manager: a clean exit commits, an exception aborts::

        with env.transaction() as tx:
            n = int(tx.get("counter", ("stats", "n"), b"0"))
            tx.set("counter", ("stats", "n"), str(n + 1))

    A transaction may be used from several threads, one call at a time
    (calls are serialised). Rows and families must be non-empty; qualifiers
    and values may be empty. ``str`` arguments mean UTF-8; values come back
    as ``bytes``.
    """

    __slots__ = ("_tx", "_app", "__weakref__")

    def __init__(self, core_transaction: Any, app: Any = None) -> None:
        self._tx = core_transaction
        self._app = app

    @property
    def app(self) -> App | None:
        """The :class:`percolite.App` bound to the store when the transaction
        began (None for none, and in an observer's transaction): a queue's
        ``add`` checks that the queue belongs to it."""
        return self._app

    @property
    def core(self) -> _core.Transaction:
        """The compiled transaction underneath (``percolite._core``), for
        percolite's own modules; its methods are internal and may change in
        any release."""
        return self._tx

    # -- reads ------------------------------------------------------------
    # get is the core's own, bound to this class below (bind_surface_get):
    # a look-up is a few hundred nanoseconds, and a Python frame in between
    # would add a tenth. These are its signatures.
    if TYPE_CHECKING:

        @overload
        def get(self, row: BytesLike, column: ColumnLike) -> bytes | None: ...
        @overload
        def get(self, row: BytesLike, column: ColumnLike, default: D) -> bytes | D: ...
        def get(self, row: BytesLike, column: ColumnLike, default: Any = None) -> Any:
            """The value of the cell in this transaction's view, or ``default``."""

    def get_many(
        self, cells: Iterable[tuple[BytesLike, ColumnLike]], default: Any = None
    ) -> list[Any]:
        """Values of many ``(row, column)`` cells at once, in the order given;
        ``default`` where a cell has no value."""
        values = self._tx.get_many(list(cells))
        if default is not None:
            values = [default if v is None else v for v in values]
        return values

    def scan(
        self,
        prefix: BytesLike | None = None,
        *,
        start: BytesLike | None = None,
        end: BytesLike | None = None,
        columns: Sequence[ColumnLike] | None = None,
    ) -> Scan:
        """Iterate cells in order (row, then family, then qualifier).

        Either all rows starting with ``prefix`` (every row when omitted), or
        the rows ``start <= row < end`` (either bound may be omitted).
        ``columns`` keeps only those columns. The scan sees this transaction's
        own writes, and reads the snapshot in chunks, so it can be stopped early
        cheaply. percolite's own rows (failure records, whose names begin with
        ``percolite._core.SYSTEM_ROW_PREFIX``) are left out unless the
        prefix or start asked for lies among them.

        Returns a :class:`percolite.Scan`: an iterator of
        :class:`percolite.Cell`, lazy as a generator (iterating it runs at
        generator speed: the wrapper costs nothing per cell), whose
        ``to_pandas()`` makes the cells a DataFrame (columns ``row``,
        ``family``, ``qualifier``, ``value``) when pandas is installed
        (``pip install 'percolite[pandas]'``)::

            frame = tx.scan(prefix="doc:").to_pandas()
        """
        return Scan(self._scan(prefix, start, end, columns))

    def _scan(
        self,
        prefix: BytesLike | None,
        start: BytesLike | None,
        end: BytesLike | None,
        columns: Sequence[ColumnLike] | None,
    ) -> Iterator[Cell]:
        if prefix is not None and (start is not None or end is not None):
            raise ValueError("scan takes either prefix or start/end, not both")
        if columns is not None:
            if isinstance(columns, (bytes, str)) or not hasattr(columns, "__iter__"):
                raise TypeError(
                    "columns must be a list of (family, qualifier) tuples, "
                    f"not {type(columns).__name__}"
                )
            columns = list(columns)  # each item is checked by the core
        scan_cells = self._tx.scan_cells
        for part_prefix, part_start, part_end in _user_ranges(prefix, start, end):
            if part_end is not None and part_start is not None and part_start >= part_end:
                continue
            resume = None
            while True:
                # Cells come made, a list a chunk: yield from hands them on at C speed.
                cells, resume, done = scan_cells(
                    part_prefix, part_start, part_end, columns, resume, _SCAN_CHUNK, Cell, Column
                )
                yield from cells
                if done:
                    break

    # -- writes -----------------------------------------------------------
    def set(self, row: BytesLike, column: ColumnLike, value: BytesLike) -> None:
        """Buffer a write of ``value`` to the cell; applied at commit."""
        self._tx.set(row, column, value)

    def delete(self, row: BytesLike, column: ColumnLike) -> None:
        """Buffer a delete of the cell; applied at commit. Deleting conflicts
        with concurrent writes of the same cell exactly as setting does."""
        self._tx.delete(row, column)

    def set_weak_notification(self, row: BytesLike, column: ColumnLike) -> None:
        """Notify the WEAK observer of ``column`` for ``row`` when this
        transaction commits. Never conflicts; delivered at least once."""
        self._tx.set_weak_notification(row, column)

    # -- ending -----------------------------------------------------------
    def commit(self) -> None:
        """Apply the buffered writes atomically, or raise
        :class:`~percolite.CommitConflict` and apply nothing. Blocks until the
        commit is durable under the store's ``sync`` mode."""
        self._tx.commit()

    def abort(self) -> None:
        """Discard the buffered writes and release the snapshot. Idempotent."""
        self._tx.abort()

    @property
    def start_ts(self) -> int:
        """The timestamp naming this transaction's snapshot."""
        return self._tx.start_ts

    @property
    def commit_ts(self) -> int | None:
        """The commit timestamp once committed; ``None`` before, and for a
        transaction that wrote nothing (it commits without touching the store)."""
        return self._tx.commit_ts

    @property
    def state(self) -> str:
        """``"active"``, ``"committed"``, ``"aborted"``, or ``"closed"``
        (aborted because its store was closed)."""
        return self._tx.state

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self._tx.abort()
        elif self._tx.state in ("active", "closed"):
            self._tx.commit()  # raises ClosedError if the store closed meanwhile

    def __repr__(self) -> str:
        return f"<percolite.Transaction start_ts={self.start_ts} {self.state}>"


_core.bind_surface_get(Transaction, "_tx")
