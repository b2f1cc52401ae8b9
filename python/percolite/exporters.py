"""Built-in exporters for the export queue: SQLite, PostgreSQL, JSON Lines.

The export queue calls an exporter as ``exporter(entries)``, where ``entries``
is a list of :class:`SequencedExport` ``(key, value, seq)`` ordered by key,
then seq; ``value is None`` means the key was deleted.
Delivery is **at least once**: a batch may come again (possibly with more
entries), two processes may export the same batch at the same time, and an old
batch may arrive after a newer one. An exporter that raises leaves its batch
queued, to be retried later.

Every exporter here is therefore idempotent through a **seq guard**: for each
key it remembers the highest seq it applied (deleted keys included) and skips
an entry whose seq is not higher. (SQLite keeps it in the row's ``seq`` and,
for deleted keys, in a guard table; PostgreSQL in a guard row per key.)
Within one call only the newest entry of each key matters, so calls collapse
the batch per key first. Full description, table layouts and how to write
your own: ``docs/exporters.md``.

Thread and process safety: one exporter object may be called from several
threads at once, and each worker process builds its own. Connections are
opened lazily, per process (a forked child never touches its parent's
connections: it opens its own), and pooled per object so that threads do
not share one. ``close()`` closes the connections of the calling process;
later calls raise :class:`percolite.ClosedError`.
"""

from __future__ import annotations

import errno
import json
import math
import operator
import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain, compress
from typing import Any, Callable, NamedTuple

from ._export import SequencedExport
from .errors import ClosedError

# SequencedExport is here too, for those who write or test an exporter.
__all__ = ["SQLite", "Postgres", "JSONLines", "SequencedExport"]

_SEQ_LIMIT = 1 << 63  # seq fits a signed 64-bit column
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_POSTGRES_MAX_IDENTIFIER = 63  # bytes; longer names are silently truncated by the server


# ---------------------------------------------------------------------------
# Fork safety: objects whose locks must be new in a forked child (a lock held
# by another thread at fork time would never be released there).

_FORK_AWARE: weakref.WeakSet = weakref.WeakSet()


def _renew_locks_after_fork() -> None:
    for obj in list(_FORK_AWARE):
        obj._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_after_fork)

# Connections a forked child inherited. Closing them in the child would end
# the parent's session (PostgreSQL) or touch the parent's locks (SQLite), so
# the child keeps them referenced and never uses or finalizes them.
_INHERITED_CONNECTIONS: list = []


class _Pool:
    """Connections of one exporter in the current process: a thread takes an
    idle one or opens a new one, and gives it back when its call succeeded
    (after a failure the connection is closed: it may be broken)."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._idle: list = []
        self._pid = os.getpid()
        self._closed = False
        _FORK_AWARE.add(self)

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


# ---------------------------------------------------------------------------
# Argument checks and the mapping of keys and values to columns, shared by the
# SQL exporters.


def _identifier(name: Any, what: str) -> str:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ValueError(
            f"{what} must be an SQL identifier matching [A-Za-z_][A-Za-z0-9_]*, not {name!r}"
        )
    return name


def _quote(name: str) -> str:
    # Names are restricted to [A-Za-z0-9_], so quoting only keeps keywords
    # (key, value, order, ...) usable and the case as given.
    return f'"{name}"'


def _names(spec: Any, what: str) -> tuple:
    if isinstance(spec, str):
        return (_identifier(spec, what),)
    if not isinstance(spec, (tuple, list)) or not spec:
        raise ValueError(
            f"{what} must be a column name or a non-empty tuple of names, not {spec!r}"
        )
    return tuple(_identifier(name, f"{what} column") for name in spec)


def _check_seq(entry: Any) -> int:
    seq = entry.seq
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < _SEQ_LIMIT:
        raise ValueError(f"seq must be an int in [0, 2**63), not {seq!r} (key {entry.key!r})")
    return seq


_SQL_SCALARS = (int, float, str, bytes)
# Exact types stored as they are (no bool, no subclasses): the fast path of
# _Layout.collapse.
_PLAIN_TYPES = frozenset(_SQL_SCALARS)
_PLAIN_OR_NONE = frozenset((*_SQL_SCALARS, type(None)))
_KEY, _VALUE, _SEQ = (operator.attrgetter(name) for name in ("key", "value", "seq"))


def _sql_scalar(item: Any, describe: Callable[[], str]) -> Any:
    """``item`` as a value an SQL driver stores: bool as int, bytes-likes as bytes."""
    if isinstance(item, bool):
        return int(item)
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    if item is None or isinstance(item, _SQL_SCALARS):
        return item
    raise ValueError(
        f"{describe()}: {type(item).__name__} is not storable; use int, float, str, bytes or None"
    )


class _Row(NamedTuple):
    key: Any  # as given, for messages
    key_cells: tuple  # one cell per key column
    value_cells: tuple | None  # one cell per value column; None deletes
    seq: int


def _sort_key(cells: tuple) -> tuple:
    # A total order even across types: the SQL exporters touch keys in this
    # order, so that concurrent batches lock guard rows in the same order.
    return tuple((type(cell).__name__, cell) for cell in cells)


class _Layout:
    """Where keys and values go: ``key`` and ``columns`` as the user gave them."""

    def __init__(self, table: Any, key: Any, columns: Any) -> None:
        self.table = _identifier(table, "table")
        if table.lower() == "excluded":
            raise ValueError(
                "table 'excluded' cannot be used: in an upsert that name is the incoming row"
            )
        self.guard_table = f"{table}_seq"
        self.key = key
        self.columns = columns
        self.key_columns = _names(key, "key")
        self.value_columns = _names(columns, "columns")
        every = [*self.key_columns, *self.value_columns, "seq"]
        folded = [name.lower() for name in every]
        for name in every:
            if folded.count(name.lower()) > 1:
                why = "it is the seq column" if name.lower() == "seq" else "it appears twice"
                raise ValueError(
                    f"column {name!r} cannot be used: {why} "
                    f"(key={key!r}, columns={columns!r}; names are compared ignoring case)"
                )

    def key_cells(self, key: Any) -> tuple:
        if isinstance(self.key, str):
            cells: Sequence = (key,)
        elif isinstance(key, (tuple, list)) and len(key) == len(self.key_columns):
            cells = key
        else:
            raise ValueError(
                f"key {key!r} does not fit the key columns {self.key_columns}: "
                f"expected a tuple of {len(self.key_columns)}"
            )
        out = []
        for column, cell in zip(self.key_columns, cells):
            if cell is None:
                raise ValueError(f"key {key!r}: key column {column!r} cannot be None")
            out.append(_sql_scalar(cell, lambda c=column: f"key {key!r}, column {c!r}"))
        return tuple(out)

    def value_cells(self, key: Any, value: Any) -> tuple:
        columns = self.value_columns

        def mismatch(expected: str) -> ValueError:
            return ValueError(
                f"value {value!r} of key {key!r} does not fit the columns {columns}: {expected}"
            )

        if isinstance(self.columns, str):
            if isinstance(value, (tuple, list, dict)):
                raise mismatch("expected one scalar (pass columns=(...) to spread it)")
            cells: Sequence = (value,)
        elif isinstance(value, dict):
            if set(value) != set(columns):
                raise mismatch(f"expected a dict with exactly the keys {columns}")
            cells = [value[name] for name in columns]
        elif isinstance(value, (tuple, list)):
            if len(value) != len(columns):
                raise mismatch(f"expected {len(columns)} items, got {len(value)}")
            cells = value
        else:
            raise mismatch(f"expected a tuple, list or dict of {len(columns)}")
        return tuple(
            _sql_scalar(cell, lambda c=name: f"value {value!r} of key {key!r}, column {c!r}")
            for name, cell in zip(columns, cells)
        )

    def collapse(self, entries: Iterable) -> list:
        """The newest entry of each key, checked and mapped to cells, in key
        order. Raises ValueError for a bad entry before anything is written."""
        if not isinstance(entries, (list, tuple)):
            entries = list(entries)
        rows = self._collapse_plain(entries)
        if rows is not None:
            return rows
        newest: dict = {}
        for entry in entries:
            seq = _check_seq(entry)
            key_cells = self.key_cells(entry.key)
            value_cells = None if entry.value is None else self.value_cells(entry.key, entry.value)
            kept = newest.get(key_cells)
            if kept is None or seq > kept.seq:
                newest[key_cells] = _Row(entry.key, key_cells, value_cells, seq)
        return sorted(newest.values(), key=lambda row: _sort_key(row.key_cells))

    def _collapse_plain(self, entries: Sequence) -> list | None:
        """What :meth:`collapse` returns, for the usual batch: one key column,
        keys and cells of exactly int, float, str or bytes (None in values),
        int seqs in range. One tight loop instead of the checks per cell;
        ``None`` when an entry needs the general path (which also names what
        is wrong with it)."""
        if not isinstance(self.key, str):
            return None
        scalar = isinstance(self.columns, str)
        width = len(self.value_columns)
        plain, plain_or_none = _PLAIN_TYPES, _PLAIN_OR_NONE
        # Rows are made only for the keys that stay, without _Row's
        # Python-level __new__ (a batch of 60,000 entries with distinct keys:
        # 120 ms instead of 170). An export queue calls with its entries in
        # key order, then seq: while keys keep coming in order (and of one
        # type), the newest of each key is the list's last entry, and neither
        # a dict nor a sort is needed. Out of order, a dict takes over.
        ordered: list = []
        newest: dict | None = None
        last_key: Any = None
        key_type: Any = None
        for entry in entries:
            key, value, seq = entry.key, entry.value, entry.seq
            if type(seq) is not int or not 0 <= seq < _SEQ_LIMIT or type(key) not in plain:
                return None
            if value is None:
                pass
            elif scalar:
                if type(value) not in plain:
                    return None
            elif not (
                type(value) is tuple
                and len(value) == width
                and plain_or_none.issuperset(map(type, value))
            ):
                return None
            if newest is None:
                same_type = type(key) is key_type
                if ordered and same_type and key == last_key:
                    if seq > ordered[-1].seq:
                        ordered[-1] = entry
                    continue
                if not ordered or (same_type and key > last_key):
                    ordered.append(entry)
                    last_key, key_type = key, type(key)
                    continue
                # Out of order, another type, or NaN (false both ways).
                newest = {e.key: e for e in ordered}
            kept = newest.get(key)
            if kept is None or seq > kept.seq:
                newest[key] = entry
        if newest is not None:
            if len({type(key) for key in newest}) > 1:
                keys = sorted(newest, key=lambda key: _sort_key((key,)))
            else:
                keys = sorted(newest)
            ordered = [newest[key] for key in keys]
        make = tuple.__new__
        rows = []
        for entry in ordered:
            key, value = entry.key, entry.value
            cells = None if value is None else (value,) if scalar else value
            rows.append(make(_Row, (key, (key,), cells, entry.seq)))
        return rows

    def sorted_values(self, entries: Any) -> list | None:
        """The rows ``(key, *value_cells, seq)`` of the newest entry of each
        key, in key order, for the batch an export queue usually sends: a
        list in key order then seq, one key column, keys of one plain type,
        plain cells, no deletions. ``None`` for any other batch (then
        :meth:`collapse` checks it, names what is wrong, and handles
        deletions). Every check is a loop in C (``map``, ``compress``,
        ``zip``) instead of one Python loop over the entries: 65,536 phrase
        count entries in 41 ms instead of 110 (collapse, then the rows)."""
        if not isinstance(self.key, str) or type(entries) is not list or not entries:
            return None
        try:
            keys = list(map(_KEY, entries))
            values = list(map(_VALUE, entries))
            seqs = list(map(_SEQ, entries))
        except AttributeError:
            return None
        key_types = set(map(type, keys))
        if len(key_types) != 1 or not key_types <= _PLAIN_TYPES:
            return None
        if set(map(type, seqs)) != {int} or min(seqs) < 0 or max(seqs) >= _SEQ_LIMIT:
            return None
        if not all(map(operator.lt, keys, keys[1:])):
            # A key repeats: only in a run, seqs going up (keep each run's
            # last entry). Anything else, NaN keys too, takes the dict path.
            repeats = list(map(operator.eq, keys, keys[1:]))
            if not all(map(operator.or_, repeats, map(operator.lt, keys, keys[1:]))):
                return None
            if not all(compress(map(operator.lt, seqs, seqs[1:]), repeats)):
                return None
            last = list(map(operator.not_, repeats))
            last.append(True)
            keys = list(compress(keys, last))
            values = list(compress(values, last))
            seqs = list(compress(seqs, last))
        if isinstance(self.columns, str):
            if not set(map(type, values)) <= _PLAIN_TYPES:
                return None
            return list(zip(keys, values, seqs))
        width = len(self.value_columns)
        if set(map(type, values)) != {tuple} or set(map(len, values)) != {width}:
            return None
        if not set(map(type, chain.from_iterable(values))) <= _PLAIN_OR_NONE:
            return None
        cells = [map(operator.itemgetter(i), values) for i in range(width)]
        return list(zip(keys, *cells, seqs))

    def key_from_cells(self, cells: Sequence) -> Any:
        return cells[0] if isinstance(self.key, str) else tuple(cells)

    def value_from_cells(self, cells: Sequence) -> Any:
        return cells[0] if isinstance(self.columns, str) else tuple(cells)

    def describe(self) -> str:
        return f"table={self.table!r} key={self.key!r} columns={self.columns!r}"


def _column_types(layout: _Layout, rows: list, types: dict, untyped: str | None) -> list | None:
    """SQL types for the key and value columns of a new main table, from the
    Python types of the first non-None cell of each column in ``rows``; None
    when ``rows`` only deletes (the table can wait for a batch with values).
    A column that is None in every row gets ``untyped`` (or ValueError)."""
    upserts = [row for row in rows if row.value_cells is not None]
    if not upserts:
        return None
    key_types = [types[type(cell)] for cell in upserts[0].key_cells]
    value_types = []
    for index, name in enumerate(layout.value_columns):
        cells = (row.value_cells[index] for row in upserts)
        first = next((cell for cell in cells if cell is not None), None)
        if first is not None:
            value_types.append(types[type(first)])
        elif untyped is not None:
            value_types.append(untyped)
        else:
            raise ValueError(
                f"cannot choose a type for column {name!r} of table {layout.table!r}: it is "
                "None in every entry of this batch; create the table yourself"
            )
    return key_types + value_types


class _Statements:
    """The SQL of one layout; ``mark`` is the driver's placeholder."""

    def __init__(self, layout: _Layout, mark: str, seq_type: str) -> None:
        self.seq_type = seq_type
        table, guard = _quote(layout.table), _quote(layout.guard_table)
        keys = [_quote(name) for name in layout.key_columns]
        values = [_quote(name) for name in layout.value_columns]
        key_list = ", ".join(keys)
        self.layout = layout
        self.table, self.guard = table, guard
        # The guard: insert the key's seq, or raise it, but never lower it.
        # It changed one row exactly when this entry is newer than every entry
        # applied before for that key, deleted or not.
        self.guard_upsert = (
            f"INSERT INTO {guard} ({key_list}, seq) VALUES ({', '.join([mark] * (len(keys) + 1))})"
            f" ON CONFLICT ({key_list}) DO UPDATE SET seq = excluded.seq"
            f" WHERE excluded.seq > {guard}.seq"
        )
        # The main table keeps its own seq condition as a second line of
        # defence (e.g. a guard table created after the main table was filled).
        columns = [*keys, *values, "seq"]
        self.upsert = (
            f"INSERT INTO {table} ({', '.join(columns)})"
            f" VALUES ({', '.join([mark] * len(columns))})"
            f" ON CONFLICT ({key_list}) DO UPDATE SET "
            + ", ".join(f"{name} = excluded.{name}" for name in [*values, "seq"])
            + f" WHERE excluded.seq > {table}.seq"
        )
        match = " AND ".join(f"{name} = {mark}" for name in keys)
        self.delete = f"DELETE FROM {table} WHERE {match} AND seq < {mark}"
        self.select = f"SELECT {key_list}, {', '.join(values)} FROM {table} ORDER BY {key_list}"

    def create_guard(self, key_types: list) -> str:
        return self._create(self.guard, self._key_definitions(key_types))

    def create_main(self, types: list) -> str:
        width = len(self.layout.key_columns)
        values = [
            f"{_quote(name)} {sql_type}".rstrip()
            for name, sql_type in zip(self.layout.value_columns, types[width:])
        ]
        return self._create(self.table, self._key_definitions(types[:width]) + values)

    def _key_definitions(self, key_types: list) -> list:
        return [
            f"{_quote(name)} {sql_type} NOT NULL"
            for name, sql_type in zip(self.layout.key_columns, key_types)
        ]

    def _create(self, table: str, columns: list) -> str:
        key_list = ", ".join(_quote(name) for name in self.layout.key_columns)
        return (
            f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(columns)}, "
            f"seq {self.seq_type} NOT NULL, PRIMARY KEY ({key_list}))"
        )

    def rows_from(self, records: Iterable) -> dict:
        layout, width = self.layout, len(self.layout.key_columns)
        return {
            layout.key_from_cells(record[:width]): layout.value_from_cells(record[width:])
            for record in records
        }


class _SQLExporter:
    """What the SQL exporters share; a subclass sets the class attributes and
    provides ``_connect`` and ``_exists``."""

    _types: dict  # Python type -> SQL type of a created column
    _untyped: str | None  # type of a value column with no value yet; None refuses
    _mark: str  # the driver's placeholder
    _seq_type: str

    def _set_up(self, table: Any, key: Any, columns: Any, create: bool) -> None:
        self._layout = _Layout(table, key, columns)
        self._sql = _Statements(self._layout, self._mark, self._seq_type)
        self.create = bool(create)
        self._tables_ready = False  # both tables known to exist
        self._pool = _Pool(self._connect)

    def _connect(self) -> Any:
        raise NotImplementedError

    def _exists(self, handle: Any, table: str) -> bool:
        raise NotImplementedError

    @property
    def table(self) -> str:
        """The main table."""
        return self._layout.table

    @property
    def guard_table(self) -> str:
        """The guard table, ``<table>_seq``: the highest seq applied per key."""
        return self._layout.guard_table

    @property
    def key(self) -> Any:
        """The key column name, or the tuple of them."""
        return self._layout.key

    @property
    def columns(self) -> Any:
        """The value column name, or the tuple of them."""
        return self._layout.columns

    def _ensure_tables(self, handle: Any, rows: list) -> bool:
        """Creates what is missing (or raises when ``create`` is false), in
        the call's transaction; returns whether the main table exists now
        (the caller records that once the transaction committed). A batch of
        deletes only creates the guard table: there is nothing to delete yet,
        and no value to choose the column types from."""
        layout, sql = self._layout, self._sql
        missing = [
            name for name in (layout.guard_table, layout.table) if not self._exists(handle, name)
        ]
        if missing and not self.create:
            raise RuntimeError(f"{self!r}: table {missing[0]!r} does not exist and create=False")
        if layout.guard_table in missing:
            handle.execute(sql.create_guard([self._types[type(c)] for c in rows[0].key_cells]))
        if layout.table in missing:
            column_types = _column_types(layout, rows, self._types, self._untyped)
            if column_types is None:
                return False
            handle.execute(sql.create_main(column_types))
        return True

    def close(self) -> None:
        """Closes this process's connections; later calls raise ClosedError."""
        self._pool.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _positive(number: Any, name: str) -> float:
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not number > 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {number!r}")
    return number


def _require_directory(path: str) -> None:
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            errno.ENOENT, f"the directory {directory!r} of {path!r} does not exist", path
        )


# ---------------------------------------------------------------------------
# SQLite


class SQLite(_SQLExporter):
    """Exports into table ``table`` of the SQLite database file ``path``.

    The table has the key column(s), the value column(s) and ``seq INTEGER
    NOT NULL``, with the key column(s) as primary key. ``key`` names one key
    column (a str) or several (a tuple: keys are then tuples of that length).
    ``columns`` names one value column (values are scalars) or several
    (values are tuples or lists of that length, or dicts with exactly those
    names). A None value deletes the row. Cells are int, float, str, bytes or
    None (bool is stored as int).

    A row's ``seq`` is the highest seq applied for its key; the guard table
    ``<table>_seq`` (key columns, ``seq``) holds it for deleted keys, until
    a newer value brings the row back. When ``create`` is
    true, missing tables are created on first use, with column types from the
    first entries (int INTEGER, float REAL, str TEXT, bytes BLOB; a value
    column that is None in all of them gets no declared type). Existing
    tables are used as they are. Each call is one ``BEGIN IMMEDIATE``
    transaction; ``timeout`` is the busy timeout in seconds. The database is
    switched to WAL mode.

    Raises at construction: FileNotFoundError when the directory of ``path``
    does not exist, ValueError for a bad name. Raises from a call (the batch
    stays queued): ValueError for an entry that does not fit the columns,
    ``sqlite3.Error`` from the database.
    """

    _types = {int: "INTEGER", float: "REAL", str: "TEXT", bytes: "BLOB"}
    _untyped = ""  # SQLite columns may go without a declared type
    _mark = "?"
    _seq_type = "INTEGER"
    _CHUNK = 1024  # batch rows per statement that writes the user's tables (see _apply)

    def __init__(
        self,
        path: Any,
        table: str,
        *,
        key: Any = "key",
        columns: Any = "value",
        create: bool = True,
        timeout: float = 30.0,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        if os.fspath(path) == ":memory:":
            raise ValueError(
                "SQLite needs a file: every connection to ':memory:' is a new database"
            )
        _require_directory(self.path)
        self.timeout = float(_positive(timeout, "timeout"))
        self._set_up(table, key, columns, create)
        # Calls of one process take turns here rather than in SQLite's busy
        # handler, which sleeps in steps of milliseconds while it waits.
        self._lock = threading.Lock()
        _FORK_AWARE.add(self)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
        )
        try:
            self._switch_to_wal(conn)
            # The batch table (temp.percolite_batch) lives in memory, not in
            # a temporary file written and deleted on every call.
            conn.execute("PRAGMA temp_store=MEMORY")
        except BaseException:
            conn.close()
            raise
        return conn

    def _switch_to_wal(self, conn: sqlite3.Connection) -> None:
        # Changing the journal mode does not wait for the busy timeout: when
        # several processes open a new file at once, all but one get "database
        # is locked" at once. Retry until the timeout instead.
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.005)

    def __call__(self, entries: Iterable) -> None:
        """Applies ``entries`` (a list of :class:`SequencedExport`) in one
        SQLite transaction, each only if its seq is newer than the guard's."""
        layout = self._layout
        # The usual batch, once the tables exist, needs no rows (sorted_values).
        values = layout.sorted_values(entries) if self._tables_ready else None
        rows = None if values is not None else layout.collapse(entries)
        if not (values or rows):
            return
        with self._lock, self._pool.connection() as conn:
            conn.execute("BEGIN IMMEDIATE")  # one writer at a time, across processes
            try:
                has_main = True
                if values is None or not self._upsert_values(conn, values):
                    rows = rows or layout.collapse(entries)
                    has_main = self._tables_ready or self._ensure_tables(conn, rows)
                    self._apply(conn, rows, has_main)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        self._tables_ready = has_main

    def _upsert_values(self, conn: sqlite3.Connection, values: list) -> bool:
        """Upserts rows of :meth:`_Layout.sorted_values` (values only, one
        per key) with the seq guard, inside the caller's write transaction,
        when the guard table is empty (see :meth:`_apply`); False, with
        nothing written, when it is not."""
        sql = self._batch_sql()
        if conn.execute(sql["any_guard"]).fetchone() is not None:
            return False
        conn.executemany(sql["upsert_rows"], values)
        return True

    def _apply(self, conn: sqlite3.Connection, rows: list, has_main: bool) -> None:
        """Applies the batch inside the caller's write transaction. A batch
        of values only, with no guard rows about, is upserted row by row with
        the seq guard in one executemany. Any other is applied set-wise: the
        rows go to a temporary table in one executemany, then statements
        drop the stale ones (a guard or main-table seq >= theirs), upsert the
        values (dropping their keys' guard rows), delete the deleted keys'
        rows and raise their guard rows. Same result as checking row by row,
        without a Python loop of statements. Only deleted keys have guard
        rows: a key with a row is guarded by the row's seq, so a value costs
        one B-tree write, not two.

        The statements that write the user's tables take the batch
        ``_CHUNK`` rows at a time: SQLite keeps a copy of every page a
        statement changes until the statement ends (its statement journal,
        in memory here), so one statement over the whole batch would hold
        about two pages per row of a large table (45 MiB for 16,384 rows of a
        1.5 million row table), and chunks hold at most ``_CHUNK`` rows' worth
        (7 MiB), in the same time."""
        sql = self._batch_sql()
        # The usual batch has no deletions and the guard table is empty (this
        # transaction holds the write lock, so no guard row appears
        # meanwhile): then only the seq guard of each key's row matters, and
        # the rows go straight to the table in one executemany (each row its
        # own statement, so the statement journal stays small). Sink alone,
        # with the in-order collapse, new phrase rows in batches of 65,536:
        # 240,000 in 0.95 s instead of 1.09, 840,000 in 4.6 s instead of 5.1.
        deletions = any(row.value_cells is None for row in rows)
        guarded = conn.execute(sql["any_guard"]).fetchone() is not None
        if has_main and not deletions and not guarded:
            conn.executemany(
                sql["upsert_rows"], [(*row.key_cells, *row.value_cells, row.seq) for row in rows]
            )
            return
        width = len(self._layout.value_columns)
        conn.execute(sql["create"])
        conn.execute(sql["clear"])
        conn.executemany(
            sql["insert"],
            [
                (
                    n,
                    *row.key_cells,
                    *(row.value_cells or (None,) * width),
                    row.seq,
                    row.value_cells is not None,
                )
                for n, row in enumerate(rows, 1)
            ],
        )
        # Statements that cannot match are skipped.
        if guarded:
            conn.execute(sql["drop_stale"])
        if has_main and deletions:
            conn.execute(sql["drop_stale_deletions"])
        # Each batch row has its own key, so chunks are independent.
        for low in range(0, len(rows), self._CHUNK):
            chunk = (low, low + self._CHUNK)  # the rows low < $n <= high
            if has_main:
                conn.execute(sql["upsert"], chunk)
                if guarded:
                    conn.execute(sql["clear_guards"], chunk)
                if deletions:
                    conn.execute(sql["delete"], chunk)
            if deletions:
                conn.execute(sql["raise_guards"], chunk)
        conn.execute(sql["clear"])

    def _batch_sql(self) -> dict:
        cached = getattr(self, "_batch_statements", None)
        if cached is not None:
            return cached
        layout = self._layout
        table, guard = _quote(layout.table), _quote(layout.guard_table)
        keys = [_quote(name) for name in layout.key_columns]
        values = [_quote(name) for name in layout.value_columns]
        key_list = ", ".join(keys)
        batch = "temp.percolite_batch"
        # The batch's own names are quoted, with a character user tables and
        # columns cannot have ([A-Za-z0-9_] only), so they never clash (a
        # table named b once shadowed the alias b in the subqueries).
        n, present, b = '"$n"', '"$present"', '"$b"'  # b: the batch's alias
        columns = [f"{n} INTEGER PRIMARY KEY", *keys, *values, "seq", present]
        in_chunk = f"{n} > ? AND {n} <= ?"
        same_key = " AND ".join(f"{guard}.{k} = {b}.{k}" for k in keys)
        same_key_main = " AND ".join(f"{table}.{k} = {b}.{k}" for k in keys)
        row_columns = ", ".join([*keys, *values, "seq"])
        insert_rows = f"INSERT INTO {table} ({row_columns})"
        # A row replaces the key's row only when its seq is newer.
        newer_wins = (
            f" ON CONFLICT ({key_list}) DO UPDATE SET "
            + ", ".join(f"{name} = excluded.{name}" for name in [*values, "seq"])
            + f" WHERE excluded.seq > {table}.seq"
        )
        self._batch_statements = {
            "create": f"CREATE TEMP TABLE IF NOT EXISTS percolite_batch ({', '.join(columns)})",
            "clear": f"DELETE FROM {batch}",
            "any_guard": f"SELECT 1 FROM {guard} LIMIT 1",
            "insert": f"INSERT INTO {batch} VALUES ({', '.join('?' * len(columns))})",
            "drop_stale": (
                f"DELETE FROM {batch} AS {b} WHERE EXISTS (SELECT 1 FROM {guard}"
                f" WHERE {same_key} AND {guard}.seq >= {b}.seq)"
            ),
            # Deletions older than the key's row in the main table are stale too.
            "drop_stale_deletions": (
                f"DELETE FROM {batch} AS {b} WHERE NOT {present} AND EXISTS (SELECT 1 FROM {table}"
                f" WHERE {same_key_main} AND {table}.seq >= {b}.seq)"
            ),
            # A key with a row needs no tombstone: the row's seq is its guard.
            "clear_guards": (
                f"DELETE FROM {guard} WHERE ({key_list}) IN"
                f" (SELECT {key_list} FROM {batch} WHERE {present} AND {in_chunk})"
            ),
            "raise_guards": (
                f"INSERT INTO {guard} ({key_list}, seq) SELECT {key_list}, seq FROM {batch}"
                f" WHERE NOT {present} AND {in_chunk} ON CONFLICT ({key_list})"
                f" DO UPDATE SET seq = excluded.seq WHERE excluded.seq > {guard}.seq"
            ),
            "upsert_rows": (
                f"{insert_rows} VALUES ({', '.join('?' * (len(keys) + len(values) + 1))})"
                f"{newer_wins}"
            ),
            "upsert": (
                f"{insert_rows}"
                f" SELECT {row_columns} FROM {batch}"
                f" WHERE {present} AND {in_chunk}{newer_wins}"
            ),
            # Row values and IN let SQLite look each deleted key up in the
            # primary key (a correlated EXISTS would scan the whole table).
            # The guard already passed, so these rows are older than the batch.
            "delete": (
                f"DELETE FROM {table} WHERE ({key_list}) IN"
                f" (SELECT {key_list} FROM {batch} WHERE NOT {present} AND {in_chunk})"
            ),
        }
        return self._batch_statements

    def _exists(self, conn: sqlite3.Connection, table: str) -> bool:
        found = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE"
        return conn.execute(found, (table,)).fetchone() is not None

    def rows(self) -> dict:
        """The main table as ``{key: value}`` (tuple keys and values for
        several columns, in column order); {} before the table exists."""
        with self._pool.connection() as conn:
            if not self._exists(conn, self.table):
                return {}
            return self._sql.rows_from(conn.execute(self._sql.select))

    def __repr__(self) -> str:
        return f"<percolite.exporters.SQLite {self.path!r} {self._layout.describe()}>"


# ---------------------------------------------------------------------------
# PostgreSQL

_DSN_SECRETS = [
    (re.compile(r"(://[^:/@?#]*:)[^@/?#]*@"), r"\1***@"),  # URL user:password@
    (re.compile(r"([?&]password=)[^&#]*"), r"\1***"),  # URL ?password=
    (re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)"), r"\1***"),  # key=value
]


def _hide_password(dsn: str) -> str:
    for pattern, replacement in _DSN_SECRETS:
        dsn = pattern.sub(replacement, dsn)
    return dsn


def _import_psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise ImportError(
            'percolite.exporters.Postgres needs psycopg 3: pip install "psycopg[binary]" '
            '(or pip install "percolite[postgres]")'
        ) from exc
    return psycopg


class Postgres(_SQLExporter):
    """Exports into table ``table`` of the PostgreSQL database at ``dsn``
    (a libpq connection string or URL), through psycopg 3.

    The layout, the guard table ``<table>_seq``, ``key``, ``columns`` and
    ``create`` are as for :class:`SQLite`; created column types are BIGINT,
    DOUBLE PRECISION, TEXT and BYTEA, and ``seq BIGINT NOT NULL``. A value
    column that is None in every entry of the batch that would create the
    table has no type to take: that call raises ValueError (create the table
    yourself). Names are quoted, so they keep their case; use lower case to
    match tables created with unquoted SQL. ``table`` is looked up on the
    ``search_path``.

    Each call is one transaction. The guard upsert locks the guard row of
    each key (keys are taken in a fixed order, so concurrent batches do not
    deadlock): writers of one key, in any thread or process, are serialized.

    Connections are opened on first use, per process, and are not tested at
    construction; :meth:`check` connects now. An unreachable server raises
    ConnectionError naming the DSN (password hidden) and the cause, from the
    call, so the batch stays queued. ``connect_timeout`` is in seconds.
    Raises ImportError at construction when psycopg is not installed.
    """

    _types = {int: "BIGINT", float: "DOUBLE PRECISION", str: "TEXT", bytes: "BYTEA"}
    _untyped = None
    _mark = "%s"
    _seq_type = "BIGINT"

    def __init__(
        self,
        dsn: str,
        table: str,
        *,
        key: Any = "key",
        columns: Any = "value",
        create: bool = True,
        connect_timeout: float = 5,
    ) -> None:
        self._psycopg = _import_psycopg()
        if not isinstance(dsn, str):
            raise ValueError(f"dsn must be a str, not {type(dsn).__name__}")
        self._dsn = dsn
        self.safe_dsn = _hide_password(dsn)
        try:
            self._psycopg.conninfo.conninfo_to_dict(dsn)
        except self._psycopg.Error as exc:
            raise ValueError(f"bad PostgreSQL DSN {self.safe_dsn!r}: {exc}") from None
        self.connect_timeout = _positive(connect_timeout, "connect_timeout")
        self._set_up(table, key, columns, create)
        if len(self.guard_table.encode()) > _POSTGRES_MAX_IDENTIFIER:
            raise ValueError(
                f"table name {table!r} is too long: PostgreSQL names have at most "
                f"{_POSTGRES_MAX_IDENTIFIER} bytes, and the guard table adds '_seq'"
            )

    def _connect(self) -> Any:
        psycopg = self._psycopg
        try:
            return psycopg.connect(
                self._dsn, connect_timeout=max(1, math.ceil(self.connect_timeout))
            )
        except psycopg.OperationalError as exc:
            cause = str(exc).strip() or type(exc).__name__
            raise ConnectionError(
                f"cannot connect to PostgreSQL at {self.safe_dsn!r}: {cause}"
            ) from exc

    def check(self) -> None:
        """Connects now (for CLIs that want to fail fast): raises what a call
        would raise for an unreachable server."""
        with self._pool.connection() as conn:
            conn.execute("SELECT 1")
            conn.rollback()

    def __call__(self, entries: Iterable) -> None:
        """Applies ``entries`` (a list of :class:`SequencedExport`) in one
        PostgreSQL transaction, each only if its seq is newer than the guard's."""
        rows = self._layout.collapse(entries)
        if not rows:
            return
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            has_main = self._tables_ready or self._ensure_tables(cursor, rows)
            applied = self._raise_guards(cursor, rows)
            upserts = [
                (*row.key_cells, *row.value_cells, row.seq)
                for row in applied
                if row.value_cells is not None
            ]
            deletes = [(*row.key_cells, row.seq) for row in applied if row.value_cells is None]
            if upserts:
                cursor.executemany(self._sql.upsert, upserts)
            if deletes and has_main:
                cursor.executemany(self._sql.delete, deletes)
        self._tables_ready = has_main

    def _raise_guards(self, cursor: Any, rows: list) -> list:
        """Runs the guard upsert of every row (pipelined); returns the rows
        whose guard changed, which are the ones to apply."""
        cursor.executemany(
            self._sql.guard_upsert + " RETURNING seq",
            [(*row.key_cells, row.seq) for row in rows],
            returning=True,
        )
        applied = []
        for row in rows:  # one result per row: a returned seq means the guard changed
            if cursor.fetchone() is not None:
                applied.append(row)
            cursor.nextset()
        return applied

    def _ensure_tables(self, cursor: Any, rows: list) -> bool:
        # Concurrent CREATE TABLE IF NOT EXISTS can fail in PostgreSQL: one
        # creator at a time, until this transaction ends.
        lock_name = f"percolite.exporters {self.table}"
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock_name,))
        return super()._ensure_tables(cursor, rows)

    def _exists(self, cursor: Any, table: str) -> bool:
        cursor.execute("SELECT to_regclass(%s)", (_quote(table),))
        return cursor.fetchone()[0] is not None

    def rows(self) -> dict:
        """The main table as ``{key: value}`` (tuple keys and values for
        several columns, in column order); {} before the table exists."""
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            if not self._exists(cursor, self.table):
                return {}
            cursor.execute(self._sql.select)
            return self._sql.rows_from(cursor.fetchall())

    def __repr__(self) -> str:
        return f"<percolite.exporters.Postgres {self.safe_dsn!r} {self._layout.describe()}>"


# ---------------------------------------------------------------------------
# JSON Lines


def _freeze(item: Any) -> Any:
    """Lists (at any depth) as tuples, so that a key read back is hashable."""
    if isinstance(item, list):
        return tuple(_freeze(part) for part in item)
    return item


def _json_line(key: Any, value: Any, seq: int) -> bytes:
    try:
        text = json.dumps({"key": key, "value": value, "seq": seq}, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"entry of key {key!r} is not JSON: {exc} (value {value!r})") from None
    return text.encode("utf-8") + b"\n"


def _read_lines(data: bytes, last_seq: dict, state: dict | None = None) -> None:
    """Applies the complete lines of ``data`` to ``last_seq`` (key -> highest
    seq) and to ``state`` (key -> value of that seq) when given. A line that
    is not a JSON entry is a torn write from a crashed call: that call did not
    return, so its batch was delivered again and the line is ignored."""
    for line in data.split(b"\n"):
        try:
            record = json.loads(line)
            key, value, seq = _freeze(record["key"]), record["value"], record["seq"]
            hash(key)
        except (ValueError, TypeError, KeyError):
            continue
        if isinstance(seq, bool) or not isinstance(seq, int):
            continue
        if seq > last_seq.get(key, -1):
            last_seq[key] = seq
            if state is not None:
                state[key] = value


class JSONLines:
    """Appends one JSON object per entry to the file ``path``:
    ``{"key": ..., "value": ..., "seq": ...}`` (a deleted key has value
    null), for inspection and simple pipelines. Keys and values must be JSON
    (tuples are written as lists).

    The seq guard is the file itself: under an exclusive ``flock`` a call
    reads what was appended since this object last looked (other objects and
    processes append too), then appends only the entries whose seq is higher
    than the highest seq of that key in the file, then flushes and fsyncs.
    :meth:`load` reads the current state back.

    Raises FileNotFoundError at construction when the directory of ``path``
    does not exist; ValueError from a call for an entry that is not JSON.
    """

    def __init__(self, path: Any) -> None:
        self.path = os.path.abspath(os.fspath(path))
        _require_directory(self.path)
        self._lock = threading.Lock()  # one call of this object at a time
        self._offset = 0  # how far this object has read the file
        self._file_id: tuple | None = None  # (device, inode) read so far
        self._last_seq: dict = {}  # key -> highest seq in the file up to _offset
        self._closed = False
        _FORK_AWARE.add(self)

    def __call__(self, entries: Iterable) -> None:
        """Appends the newest entry of each key in ``entries`` (a list of
        :class:`SequencedExport`) whose seq is higher than the file's for that key."""
        newest: dict = {}
        for entry in entries:
            seq = _check_seq(entry)
            line = _json_line(entry.key, entry.value, seq)
            key = _freeze(json.loads(line)["key"])  # the key as load() will see it
            try:
                kept = newest.get(key)
            except TypeError:
                raise ValueError(f"key {entry.key!r} cannot be a dict key once read back") from None
            if kept is None or seq > kept[0]:
                newest[key] = (seq, line)
        if not newest:
            return
        import fcntl  # POSIX only: imported here so the module loads everywhere

        with self._lock:
            if self._closed:
                raise ClosedError("the exporter was closed")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released by close
                torn = self._catch_up(fd)
                fresh = {
                    key: line
                    for key, (seq, line) in newest.items()
                    if seq > self._last_seq.get(key, -1)
                }
                if not fresh:
                    return
                data = (b"\n" if torn else b"") + b"".join(fresh.values())
                _write_all(fd, data)
                os.fsync(fd)
                _read_lines(data, self._last_seq)
                self._offset += len(data)
            finally:
                os.close(fd)

    def _catch_up(self, fd: int) -> bool:
        """Reads what others appended; returns whether the file ends in a torn line."""
        info = os.fstat(fd)
        if self._file_id != (info.st_dev, info.st_ino) or info.st_size < self._offset:
            self._file_id = (info.st_dev, info.st_ino)  # a new or replaced file
            self._offset, self._last_seq = 0, {}
        data = os.pread(fd, info.st_size - self._offset, self._offset)
        _read_lines(data, self._last_seq)
        self._offset += len(data)
        return self._offset > 0 and os.pread(fd, 1, self._offset - 1) != b"\n"

    @staticmethod
    def load(path: Any) -> dict:
        """The state the file at ``path`` describes: ``{key: value}`` with,
        per key, the value of its highest seq; deleted keys are absent; keys
        that were tuples or lists come back as tuples. Raises
        FileNotFoundError when the file does not exist."""
        import fcntl

        with open(path, "rb") as file:
            fcntl.flock(file.fileno(), fcntl.LOCK_SH)  # no half-written call
            data = file.read()
        state: dict = {}
        _read_lines(data, {}, state)
        return {key: value for key, value in state.items() if value is not None}

    def rows(self) -> dict:
        """:meth:`load` of this file; {} before the first export."""
        try:
            return self.load(self.path)
        except FileNotFoundError:
            return {}

    def close(self) -> None:
        """Later calls raise ClosedError (each call opens and closes the file
        itself, so there is nothing else to release)."""
        self._closed = True

    def __enter__(self) -> JSONLines:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<percolite.exporters.JSONLines {self.path!r}>"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
