"""The SQLite exporter."""

from __future__ import annotations

import _sqlite3
import contextlib
import functools
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import Any

from .. import _core
from .._args import check_file_mode, check_parent_directory, check_positive_seconds
from ..errors import SinkBusy
from ._common import DEFAULT_FILE_MODE, ForkSafeLock, _create_missing
from ._sql import _SQLExporter
from ._sql_layout import _Layout, _quote

_SEQ = operator.attrgetter("seq")
_LAST = operator.itemgetter(-1)
_FILE_LOCKS: dict[str, ForkSafeLock] = {}
_FILE_LOCKS_LOCK = threading.Lock()


# Rows per INSERT statement of _insert_rows, largest first.
_STATEMENT_ROWS = (1024, 256, 64, 16, 4, 1)


@functools.lru_cache(maxsize=64)
def _values_clause(statement: str) -> tuple[str, str, str]:
    """``INSERT ... VALUES (?, ...) tail`` as its head (to ``VALUES ``),
    its one row of placeholders and its tail: the parts of the same
    statement over several rows."""
    start = statement.index(" VALUES (") + len(" VALUES ")
    end = statement.index(")", start) + 1
    return statement[:start], statement[start:end], statement[end:]


def _file_lock(path: str) -> ForkSafeLock:
    """The lock the SQLite exporters of this process take to write ``path``."""
    with _FILE_LOCKS_LOCK:
        return _FILE_LOCKS.setdefault(path, ForkSafeLock())


@contextlib.contextmanager
def _committed(conn: sqlite3.Connection) -> Iterator[None]:
    """Commits the write transaction the caller began when the block ends
    well; rolls it back when it raises."""
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class SQLite(_SQLExporter):
    """Exports into table ``table`` of the SQLite database file ``path``.

    The table has the key column(s), the value column(s) and ``seq INTEGER
    NOT NULL``, with the key column(s) as primary key. ``key`` names one key
    column (a str) or several (a tuple: keys are then tuples of that length).
    ``columns`` names one value column (values are scalars) or several
    (values are tuples or lists of that length, or dicts with exactly those
    names). A None value deletes the row. Cells are int, float, str, bytes or
    None (bool is stored as int).

    The sink belongs to one store: the table ``<table>_owner`` records the
    identity and epoch of the store that feeds it, and entries of another
    store are refused with :class:`percolite.SinkOwnedByOtherStore`, until
    :meth:`take_over`; entries of a later epoch of the owner (a copy of the
    store, restored) win over every row, whatever their seq. Called directly
    with a plain list, the exporter checks nothing.

    A row's ``seq`` is the highest seq applied for its key; the guard table
    ``<table>_seq`` (key columns, ``seq``) holds it for deleted keys, until
    a newer value brings the row back. When ``create`` is
    true, missing tables are created on first use, with column types from the
    first entries (int INTEGER, float REAL, str TEXT, bytes BLOB; a value
    column that is None in all of them gets no declared type). Existing
    tables are used as they are. A database file the exporter creates gets
    permissions ``mode`` (default ``0o600``, owner-only like the store,
    whatever the umask; SQLite gives its ``-wal`` and ``-shm`` files the
    same). Each call is one ``BEGIN IMMEDIATE``
    transaction; ``timeout`` is the busy timeout in seconds. The database is
    switched to WAL mode. SQLite takes one writer at a time, so the export
    queues whose exporters write one database take turns in each worker
    pool, by ``exclusive_sink`` (``"sqlite:"`` and the file's real path),
    rather than hold threads that would wait for each other's writes.

    ``rows`` makes the table hold row groups: an entry's value is the
    group's rows ``{row key: value}``, which replace the group's rows.
    ``seq`` names this exporter's seq column, for shared rows: several
    exporters writing disjoint columns of one table, one making the rows
    (``makes_rows=True``), the others filling their columns of rows that
    exist (``makes_rows=False``). See ``docs/exporters.md``, "Row groups and
    shared rows".

    Raises at construction: FileNotFoundError when the directory of ``path``
    does not exist, ValueError for a bad name. Raises from a call (the batch
    stays queued): ValueError for an entry that does not fit the columns,
    ``sqlite3.Error`` from the database.
    """

    _types = {int: "INTEGER", float: "REAL", str: "TEXT", bytes: "BLOB"}
    _untyped = ""  # SQLite columns may go without a declared type
    _mark = "?"
    _seq_type = "INTEGER"
    # A table of numbers past its key is one B-tree in key order (WITHOUT
    # ROWID), not a rowid table beside an index of its key: half the file,
    # and a batch, applied in key order, rewrites half the pages. Not for
    # TEXT or BLOB values, whose rows may be large.
    _small_rows = (" WITHOUT ROWID", frozenset({"INTEGER", "REAL"}))
    _CHUNK = 1024  # batch rows per statement that writes the user's tables (see _apply)

    def __init__(
        self,
        path: Any,
        table: str,
        *,
        key: Any = "key",
        columns: Any = "value",
        rows: Any = None,
        seq: str = "seq",
        makes_rows: bool = True,
        create: bool = True,
        timeout: float = 30.0,
        mode: int = DEFAULT_FILE_MODE,
    ) -> None:
        self.mode: int = check_file_mode(mode)
        self.path: str = os.path.abspath(os.fspath(path))
        if os.fspath(path) == ":memory:":
            raise ValueError(
                "SQLite needs a file: every connection to ':memory:' is a new database"
            )
        check_parent_directory(self.path)
        if os.path.isdir(self.path):
            raise IsADirectoryError(
                f"{self.path!r} is a directory: name an SQLite database file in it"
            )
        self.timeout: float = float(check_positive_seconds(timeout, "timeout"))
        self._set_up(_Layout(table, key, columns, rows, seq, makes_rows), create)
        real_path = os.path.realpath(self.path)
        self.exclusive_sink: str = "sqlite:" + real_path
        # Calls of one process take turns here rather than in SQLite's busy
        # handler, which sleeps in steps of milliseconds while it waits: one
        # lock per file, for the exporters of several queues writing it.
        self._lock = _file_lock(real_path)

    def _connect(self) -> sqlite3.Connection:
        # A new file gets exactly `mode`; SQLite gives its -wal and -shm files
        # the database file's permissions. An existing file is left unopened:
        # closing a descriptor of it would drop this process's SQLite locks.
        _create_missing(self.path, self.mode)
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

    def __call__(self, entries: Iterable[Any]) -> None:
        """Applies ``entries`` (a list of :class:`SequencedExport`) in one
        SQLite transaction, each only if its seq is newer than the guard's."""
        layout = self._layout
        if layout.is_part:
            self._call_part(entries)
            return
        # The usual batch, once the tables exist, needs no rows (sorted_values).
        values = layout.sorted_values(entries) if self._tables_ready else None
        rows = None if values is not None else layout.collapse(entries)
        if not (values or rows):
            return
        with self._lock, self._pool.connection() as conn:
            conn.execute("BEGIN IMMEDIATE")  # one writer at a time, across processes
            with _committed(conn):
                self._check_owner(conn, entries)
                has_main = True
                if values is None or not self._upsert_values(conn, values):
                    rows = rows or layout.collapse(entries)
                    has_main = self._tables_ready or self._ensure_tables(conn, rows)
                    self._apply(conn, rows, has_main)
        self._tables_ready = has_main
        self._owner_ready = self._owner_ready or bool(getattr(entries, "store", None))

    def _call_part(self, entries: Iterable[Any]) -> None:
        """:meth:`__call__` for row groups and shared rows."""
        layout = self._layout
        # The usual batch of shared rows needs no rows (sorted_values).
        values = layout.sorted_values(entries) if self._tables_ready else None
        rows = None if values is not None else layout.collapse(entries)
        if not (values or rows):
            return
        with self._lock, self._pool.connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            with _committed(conn):
                self._check_owner(conn, entries)
                has_main = True
                if values is not None:
                    self._write_values(conn, values)
                else:
                    has_main = self._tables_ready or self._ensure_tables(conn, rows)
                    rows = self._newer(conn, rows, lambda row: row.key_cells, _SEQ)
                    self._insert_rows(conn, self._sql.guard_upsert, self._guard_params(rows))
                    if has_main:
                        self._write_part(conn, rows)
        self._tables_ready = has_main
        self._owner_ready = self._owner_ready or bool(getattr(entries, "store", None))

    def _write_values(self, conn: sqlite3.Connection, values: list[Any]) -> None:
        """:meth:`_write_part` for rows of :meth:`_Layout.sorted_values`
        ``(key, *value_cells, seq)`` of shared rows (one key column, no
        deletions), with the guards, in fewer Python steps."""
        sql = self._sql
        values = self._newer(conn, values, lambda row: row[:1], _LAST)
        if self._layout.makes_rows:
            self._insert_rows(conn, sql.guard_upsert, [(row[0], row[-1]) for row in values])
            self._insert_rows(conn, sql.upsert_row, values)
        else:
            guards = [(row[0], row[-1], *row[1:-1]) for row in values]
            self._insert_rows(conn, sql.guard_upsert, guards)
            conn.executemany(sql.update_row, [(*row[1:], row[0]) for row in values])

    def _insert_rows(self, conn: sqlite3.Connection, statement: str, params: list[Any]) -> None:
        """Runs ``statement``, an ``INSERT ... VALUES (one row)``, for each
        row of ``params``, in order, as statements of up to 1,024 rows
        (``VALUES (...), (...), ...``; fewer where SQLite's limit on
        variables says so): each enters SQLite once, where
        ``executemany`` enters it once per row and takes the interpreter's
        lock back between rows, waiting for it while other threads run
        Python, with the database's write lock held. Same rows, same order,
        same conflicts, so the same result (a failing row fails the
        caller's transaction either way)."""
        if not params:
            return
        head, one, tail = _values_clause(statement)
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(params[0])
        at = 0
        # Statements of a few fixed sizes (powers of 4), so that the
        # connection's statement cache keeps a handful per layout rather
        # than one of every size a batch happens to end with.
        for rows in _STATEMENT_ROWS:
            statements = (len(params) - at) // rows
            if statements == 0 or (rows > limit and rows > 1):
                continue
            sql = f"{head}{', '.join([one] * rows)}{tail}"
            for _ in range(statements):
                conn.execute(sql, list(chain.from_iterable(params[at : at + rows])))
                at += rows

    # Keys per statement that reads guard rows (SQLite allows 32,766 parameters).
    _GUARD_CHUNK = 500

    def _newer(self, conn: sqlite3.Connection, rows: list[Any], key: Any, seq: Any) -> list[Any]:
        """The rows (one per key) whose seq is above their key's guard row,
        read in the caller's write transaction (so no other writer moves the
        guards meanwhile): the entries to apply. ``key(row)`` gives a row's
        key cells, ``seq(row)`` its seq."""
        statement = self._sql.guard_seqs
        width = len(self._layout.key_columns)
        one = "(" + ", ".join("?" * width) + ")"
        applied: dict[tuple[Any, ...], int] = {}
        for low in range(0, len(rows), self._GUARD_CHUNK):
            chunk = rows[low : low + self._GUARD_CHUNK]
            query = statement.format(rows=", ".join([one] * len(chunk)))
            found = conn.execute(query, [cell for row in chunk for cell in key(row)])
            applied.update((tuple(record[:width]), record[width]) for record in found)
        return [row for row in rows if seq(row) > applied.get(tuple(key(row)), -1)]

    def _in_write_transaction(self, work: Callable[[Any], Any]) -> Any:
        # Waits up to `timeout` for the write lock (SinkBusy after that).
        with self._lock, self._pool.connection() as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise SinkBusy(
                    f"{self!r} is locked by another writer (another store's workers?) for "
                    f"over {self.timeout} s: stop them, then take the sink over again; "
                    "nothing was changed"
                ) from exc
            with _committed(conn):
                return work(conn)

    def check(self) -> None:
        """Opens the database now (for command-line tools that want to fail
        fast): raises ValueError naming the file when it exists but is not
        an SQLite database (a missing file is made by the first call)."""
        if not os.path.exists(self.path):
            return
        try:
            with self._pool.connection() as conn:  # a read: no turn on the write lock
                conn.execute("PRAGMA schema_version").fetchone()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):
                raise  # locked, busy: a call would wait and retry
            raise ValueError(f"{self.path}: not an SQLite database ({exc})") from exc

    def owner(self) -> dict[str, Any] | None:
        """The store this sink belongs to, ``{"store", "epoch"}``, or None
        when it has none yet (no entries of a store came yet)."""
        with self._pool.connection() as conn:
            return self._read_owner(conn)

    def _upsert_values(self, conn: sqlite3.Connection, values: list[Any]) -> bool:
        """Upserts rows of :meth:`_Layout.sorted_values` (values only, one
        per key) with the seq guard, inside the caller's write transaction,
        when the guard table is empty (see :meth:`_apply`); False, with
        nothing written, when it is not."""
        sql = self._batch_sql()
        if conn.execute(sql["any_guard"]).fetchone() is not None:
            return False
        conn.executemany(sql["upsert_rows"], values)
        return True

    def _apply(self, conn: sqlite3.Connection, rows: list[Any], has_main: bool) -> None:
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
        about two pages per row of a large table, and chunks hold at most
        ``_CHUNK`` rows' worth, in the same time (``bench/results/notes.md``)."""
        sql = self._batch_sql()
        # The usual batch has no deletions and the guard table is empty (this
        # transaction holds the write lock, so no guard row appears
        # meanwhile): then only the seq guard of each key's row matters, and
        # the rows go straight to the table in one executemany (each row its
        # own statement, so the statement journal stays small): a faster sink
        # than the general path below (bench/results/notes.md).
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

    def _batch_sql(self) -> dict[str, Any]:
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

    def _native_sink(self, key_layout: Any, value_layout: Any) -> tuple[Any, str]:
        """For an export queue whose keys and values have the fixed codecs
        ``key_layout`` and ``value_layout`` (``codecs.native_layout``): the
        core's native path to this sink, which applies the queue's batches
        from their bytes, without Python, as :meth:`__call__` would, and
        hands back to it any batch it is not sure to apply the same way
        (tables or owner not set up, another store's entries, a NaN);
        ``(None, why)`` when the layout does not fit (then every batch is
        this exporter's, which raises the error). The sink uses the SQLite
        library that the ``sqlite3`` module loaded: a second copy's file
        locks would not see the first's."""
        cells, why = self._native_cells(key_layout, value_layout)
        if cells is None:
            return None, why
        layout = self._layout
        sql = self._batch_sql()
        table, guard = _quote(layout.table), _quote(layout.guard_table)
        match = " AND ".join(f"{_quote(name)} = ?" for name in layout.key_columns)
        spec = {
            "library": _sqlite3.__file__,
            "path": self.path,
            "name": repr(self),
            "timeout": self.timeout,
            "key_cells": cells[0],
            "value_cells": cells[1],
            "select_owner": self._sql.select_owner,
            "any_guard": sql["any_guard"],
            "upsert": sql["upsert_rows"],
            "guard_seq": f"SELECT seq FROM {guard} WHERE {match}",
            "clear_guard": f"DELETE FROM {guard} WHERE {match}",
            "row_seq": f"SELECT seq FROM {table} WHERE {match}",
            "delete_row": f"DELETE FROM {table} WHERE {match}",
            "raise_guard": self._sql.guard_upsert,
        }
        return self._made_native(_core.sqlite_sink, spec)

    def _exists(self, conn: sqlite3.Connection, table: str) -> bool:
        found = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE"
        return conn.execute(found, (table,)).fetchone() is not None

    def _index_exists(self, conn: sqlite3.Connection, index: str) -> bool:
        found = "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ? COLLATE NOCASE"
        return conn.execute(found, (index,)).fetchone() is not None

    def _column_names(self, conn: sqlite3.Connection, table: str) -> set[str]:
        found = conn.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
        return {str(row[1]).lower() for row in found}

    def _install_fill(self, conn: sqlite3.Connection) -> bool:
        layout, sql = self._layout, self._sql
        trigger = sql.fill_name
        found = "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = ? COLLATE NOCASE"
        if conn.execute(found, (trigger,)).fetchone() is not None:
            return False
        table, guard = _quote(layout.table), _quote(layout.guard_table)
        keys = [_quote(name) for name in layout.key_columns]
        own = [*(_quote(name) for name in layout.value_columns), _quote(layout.seq_column)]
        kept = [*(_quote(name) for name in layout.value_columns), "seq"]
        new_key = " AND ".join(f"{guard}.{name} = NEW.{name}" for name in keys)
        conn.execute(
            f"CREATE TRIGGER {_quote(trigger)} AFTER INSERT ON {table} BEGIN"
            f" UPDATE {table} SET ({', '.join(own)}) ="
            f" (SELECT {', '.join(kept)} FROM {guard} WHERE {new_key})"
            f" WHERE {' AND '.join(f'{name} = NEW.{name}' for name in keys)}"
            f" AND EXISTS (SELECT 1 FROM {guard} WHERE {new_key}); END"
        )
        return True

    def rows(self) -> dict[str, Any]:
        """The main table as ``{key: value}`` (tuple keys and values for
        several columns, in column order); {} before the table exists. For
        a row group, ``{key: {row key: value}}``; for an exporter that does
        not make rows, the rows that have its values."""
        with self._pool.connection() as conn:
            if not self._exists(conn, self.table):
                return {}
            return self._sql.rows_from(conn.execute(self._sql.select))

    def __repr__(self) -> str:
        return f"<percolite.exporters.SQLite {self.path!r} {self._layout.describe()}>"
