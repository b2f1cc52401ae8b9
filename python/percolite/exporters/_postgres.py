"""The PostgreSQL exporter (psycopg 3, imported when an exporter is made)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from .. import _core
from .._args import check_positive_seconds
from ..errors import SinkBusy
from ._sql import _SQLExporter
from ._sql_layout import _Layout, _quote

_POSTGRES_MAX_IDENTIFIER = 63  # bytes; longer names are silently truncated by the server


def _hide_password(dsn: str) -> str:
    return _core.hide_password(dsn)


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

    The layout, the guard table ``<table>_seq``, the owner table
    ``<table>_owner`` (a sink belongs to one store), ``key``, ``columns``,
    ``rows``, ``seq``, ``makes_rows`` and ``create`` are as for
    :class:`SQLite`; created column types are BIGINT,
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
    call, so the batch stays queued. ``connect_timeout`` is in seconds (per
    host). What the DSN leaves out is set as for a store on PostgreSQL: TCP
    keepalives and ``tcp_user_timeout``, so that a server that vanished is
    noticed in about 10 s, and ``target_session_attrs=read-write`` when the
    DSN names several hosts (the sink follows a failover to the new primary).
    Raises ImportError at construction when psycopg is not installed.
    """

    _types = {int: "BIGINT", float: "DOUBLE PRECISION", str: "TEXT", bytes: "BYTEA"}
    _untyped = None
    _mark = "%s"
    _seq_type = "BIGINT"
    _owner_lock = " FOR SHARE"

    def __init__(
        self,
        dsn: str,
        table: str,
        *,
        key: Any = "key",
        columns: Any = "value",
        rows: Any = None,
        seq: str = "seq",
        makes_rows: bool = True,
        create: bool = True,
        connect_timeout: float = 5,
    ) -> None:
        self._psycopg = _import_psycopg()
        if not isinstance(dsn, str):
            raise ValueError(f"dsn must be a str, not {type(dsn).__name__}")
        self._dsn = dsn
        self.safe_dsn: str = _hide_password(dsn)
        try:
            given = self._psycopg.conninfo.conninfo_to_dict(dsn)
        except self._psycopg.Error as exc:
            raise ValueError(f"bad PostgreSQL DSN {self.safe_dsn!r}: {exc}") from None
        self.connect_timeout: float = check_positive_seconds(connect_timeout, "connect_timeout")
        # As a store's connections: a vanished server noticed in seconds,
        # and with several hosts, the one that takes writes.
        options = {
            name: value
            for name, value in _core.postgresql_connect_defaults().items()
            if name not in given
        }
        options["connect_timeout"] = max(1, math.ceil(self.connect_timeout))
        if "," in str(given.get("host", "")) and "target_session_attrs" not in given:
            options["target_session_attrs"] = "read-write"
        self._connect_options = options
        self._set_up(_Layout(table, key, columns, rows, seq, makes_rows), create)
        fill = self._sql.fill_name if self._layout.is_part else ""
        longest = max(self.owner_table, fill, key=len)
        if len(longest.encode()) > _POSTGRES_MAX_IDENTIFIER:
            raise ValueError(
                f"table name {table!r} is too long: PostgreSQL names have at most "
                f"{_POSTGRES_MAX_IDENTIFIER} bytes, and the exporter's table {longest!r} "
                "is longer"
            )

    def _connect(self) -> Any:
        psycopg = self._psycopg
        try:
            return psycopg.connect(self._dsn, **self._connect_options)
        except psycopg.OperationalError as exc:
            cause = str(exc).strip() or type(exc).__name__
            raise ConnectionError(
                f"cannot connect to PostgreSQL at {self.safe_dsn!r}: {cause}"
            ) from exc

    def connect(self) -> Any:
        """A new psycopg connection to the sink's database, with the
        exporter's connection settings, for queries of your own (close it
        when done); ConnectionError, naming the server (password hidden),
        when it cannot be reached."""
        return self._connect()

    def check(self) -> None:
        """Connects now (for CLIs that want to fail fast): raises what a call
        would raise for an unreachable server."""
        with self._pool.connection() as conn:
            conn.execute("SELECT 1")
            conn.rollback()

    def __call__(self, entries: Iterable[Any]) -> None:
        """Applies ``entries`` (a list of :class:`SequencedExport`) in one
        PostgreSQL transaction, each only if its seq is newer than the guard's."""
        rows = self._layout.collapse(entries)
        if not rows:
            return
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            if self._layout.is_part and not self._layout.row_columns:
                self._lock_shared_rows(cursor)
            self._check_owner(cursor, entries)
            has_main = self._tables_ready or self._ensure_tables(cursor, rows)
            applied = self._raise_guards(cursor, rows)
            if self._layout.is_part:
                if has_main:
                    self._write_part(cursor, applied)
            else:
                self._write_rows(cursor, applied, has_main)
        self._tables_ready = has_main
        self._owner_ready = self._owner_ready or bool(getattr(entries, "store", None))

    def _write_rows(self, cursor: Any, applied: list[Any], has_main: bool) -> None:
        """Writes the main table for ``applied`` (entries whose guard rose)
        of a one-row-per-key layout."""
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

    # The array type a native path binds each cell's items as.
    _NATIVE_ARRAYS = {"text": "text[]", "blob": "bytea[]", "int64": "int8[]", "float64": "float8[]"}
    # The types (pg_type oids) a key column may have for the native path:
    # those that compare with its cells exactly (text and varchar; bytea;
    # bigint, integer, smallint and numeric; double precision). A REAL or
    # CHAR(n) key would match other keys than the exporter's.
    _NATIVE_KEY_TYPES = {
        "text": (25, 1043),
        "blob": (17,),
        "int64": (20, 23, 21, 1700),
        "float64": (701,),
    }

    def _native_statements(self, cells: list[list[str]]) -> dict[str, str]:
        """The statements of the native path, which applies a batch as
        :meth:`__call__` does, in one transaction of two statements:
        ``raise`` raises the guard of every key (taking the guard rows'
        locks, in key order) and returns whether the sink belongs to the
        batch's store and epoch (else it writes nothing; ``raise_unowned``,
        for entries of no store, does not check) and the seqs of the
        entries whose guard rose; ``write`` then upserts or deletes the rows
        of just those entries (a second statement, so that it sees every
        row an earlier batch of those keys committed while ``raise`` waited
        for its locks). Their parameters: the store and epoch, then one
        array per key cell and value cell, the seqs and whether each key
        has a value. ``raise`` also says whether the key columns of both
        tables have types that compare exactly with the cells (else it
        writes nothing either)."""
        layout = self._layout
        table, guard = _quote(layout.table), _quote(layout.guard_table)
        keys = [_quote(name) for name in layout.key_columns]
        values = [_quote(name) for name in layout.value_columns]
        key_list = ", ".join(keys)
        # The batch's columns are named by position: k0.., v0.., seq s,
        # present p; the statements' own names start with percolite_, so
        # that they do not hide a table of the sink's.
        ks = [f"k{i}" for i in range(len(keys))]
        vs = [f"v{i}" for i in range(len(values))]
        arrays = [
            f"${number}::{self._NATIVE_ARRAYS[cell]}"
            for number, cell in enumerate([*cells[0], *cells[1]], start=3)
        ]
        arrays += [f"${len(arrays) + 3}::int8[]", f"${len(arrays) + 4}::bool[]"]
        batch = (
            f"percolite_batch AS (SELECT * FROM unnest({', '.join(arrays)})"
            f" AS percolite_batch({', '.join([*ks, *vs, 's', 'p'])})"
        )

        # One look-up by (table, column) in the catalog's index per key column.
        fit = " AND ".join(
            f"coalesce((SELECT atttypid IN ({', '.join(map(str, self._NATIVE_KEY_TYPES[cell]))})"
            f" FROM pg_attribute WHERE attrelid = to_regclass('{relation}')"
            f" AND attname = '{name}' AND NOT attisdropped), false)"
            for name, cell in zip(layout.key_columns, cells[0], strict=True)
            for relation in (table, guard)
        )

        def raise_guards(ok: str) -> str:
            return (
                f"WITH percolite_fit AS (SELECT {fit} AS fit),"
                " percolite_ok AS (SELECT (SELECT fit FROM percolite_fit)"
                f" AND ({ok}) AS yes), {batch} WHERE (SELECT yes FROM percolite_ok)),"
                f" percolite_raised AS (INSERT INTO {guard} ({key_list}, seq)"
                f" SELECT {', '.join(ks)}, s FROM percolite_batch"
                f" ON CONFLICT ({key_list}) DO UPDATE SET seq = excluded.seq"
                f" WHERE excluded.seq > {guard}.seq RETURNING seq)"
                " SELECT (SELECT yes FROM percolite_ok),"
                " (SELECT array_agg(seq) FROM percolite_raised),"
                " (SELECT fit FROM percolite_fit)"
            )

        # Locked as __call__ reads it: a take-over waits for this batch.
        owned = (
            "SELECT coalesce(count(*) = 1 AND bool_and(store = $1 AND epoch = $2), false)"
            f" FROM ({self._sql.select_owner}{self._owner_lock}) AS o"
        )
        row_key = " AND ".join(
            f"percolite_row.{key} = percolite_batch.{k}" for k, key in zip(ks, keys, strict=True)
        )
        updates = ", ".join(f"{name} = excluded.{name}" for name in [*values, "seq"])
        write = (
            f"WITH {batch}),"
            f" percolite_upserted AS (INSERT INTO {table} ({', '.join([*keys, *values, 'seq'])})"
            f" SELECT {', '.join([*ks, *vs, 's'])} FROM percolite_batch WHERE p"
            f" ON CONFLICT ({key_list}) DO UPDATE SET {updates}"
            f" WHERE excluded.seq > {table}.seq)"
            f" DELETE FROM {table} AS percolite_row USING percolite_batch"
            f" WHERE NOT percolite_batch.p AND {row_key} AND percolite_row.seq < percolite_batch.s"
        )
        return {
            "raise": raise_guards(owned),
            "raise_unowned": raise_guards("SELECT true"),
            "write": write,
        }

    def _native_sink(self, key_layout: Any, value_layout: Any) -> tuple[Any, str]:
        """For an export queue whose keys and values have the fixed codecs
        ``key_layout`` and ``value_layout`` (``codecs.native_layout``): the
        core's native path to this sink, which applies each batch from its
        bytes, without Python (:meth:`_native_statements`), on libpq
        connections of its own, and hands back to this exporter any batch
        it is not sure to apply the same way (tables or owner not set up,
        another store's entries, a NaN, a value the server refuses, key
        columns of other types); ``(None, why)`` when the layout does not
        fit."""
        cells, why = self._native_cells(key_layout, value_layout)
        if cells is None:
            return None, why
        # Its sessions are named in pg_stat_activity unless the DSN names them.
        connect = [
            ("dbname", self._dsn),
            ("client_encoding", "UTF8"),
            ("fallback_application_name", "percolite native sink"),
        ]
        connect += [(name, str(value)) for name, value in self._connect_options.items()]
        spec = {
            "connect": connect,
            "name": repr(self),
            "key_cells": cells[0],
            "value_cells": cells[1],
            **self._native_statements(cells),
        }
        return self._made_native(_core.postgres_sink, spec)

    def _in_write_transaction(self, work: Callable[[Any], Any]) -> Any:
        # Waits a bounded time (lock_timeout) for the owner row, which every
        # call holds FOR SHARE.
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '2s'")
            try:
                return work(cursor)
            except self._psycopg.errors.LockNotAvailable as exc:
                raise SinkBusy(
                    f"{self!r} is being written by another call (another store's workers?): "
                    "stop them, then take the sink over again; nothing was changed"
                ) from exc

    def owner(self) -> dict[str, Any] | None:
        """The store this sink belongs to, ``{"store", "epoch"}``, or None
        when it has none yet (no entries of a store came yet)."""
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            return self._read_owner(cursor)

    def _lock_shared_rows(self, cursor: Any) -> None:
        """Shared rows: a call that fills columns runs alone, calls that
        make rows side by side, until the transaction ends. Else a row being
        inserted (its trigger reading the guard table) and an update of its
        filled columns (which does not see that row yet) would miss each
        other. Taken first, before any other lock, so it cannot deadlock."""
        take = (
            "pg_advisory_xact_lock_shared" if self._layout.makes_rows else "pg_advisory_xact_lock"
        )
        lock_name = f"percolite.exporters {self.table} shared rows"
        cursor.execute(f"SELECT {take}(hashtext(%s))", (lock_name,))

    def _lock_owner(self, cursor: Any) -> None:
        # Two calls adopting a new sink at once would each insert an owner.
        lock_name = f"percolite.exporters {self.table} owner"
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock_name,))

    def _raise_guards(self, cursor: Any, rows: list[Any]) -> list[Any]:
        """Runs the guard upsert of every row (pipelined); returns the rows
        whose guard changed, which are the ones to apply."""
        cursor.executemany(
            self._sql.guard_upsert + " RETURNING seq", self._guard_params(rows), returning=True
        )
        applied = []
        for row in rows:  # one result per row: a returned seq means the guard changed
            if cursor.fetchone() is not None:
                applied.append(row)
            cursor.nextset()
        return applied

    def _ensure_tables(self, cursor: Any, rows: list[Any]) -> bool:
        # Concurrent CREATE TABLE IF NOT EXISTS can fail in PostgreSQL: one
        # creator at a time, until this transaction ends.
        self._lock_creation(cursor)
        return super()._ensure_tables(cursor, rows)

    def _create_owner(self, cursor: Any) -> None:
        # As for the main table (_ensure_tables), and no lock once it exists.
        if not self._exists(cursor, self.owner_table):
            self._lock_creation(cursor)
            super()._create_owner(cursor)

    def _lock_creation(self, cursor: Any) -> None:
        """Until this transaction ends, the only call creating tables."""
        lock_name = f"percolite.exporters {self.table}"
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock_name,))

    def _exists(self, cursor: Any, table: str) -> bool:
        cursor.execute("SELECT to_regclass(%s)", (_quote(table),))
        return cursor.fetchone()[0] is not None

    def _column_names(self, cursor: Any, table: str) -> set[str]:
        cursor.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s)"
            " AND attnum > 0 AND NOT attisdropped",
            (_quote(table),),
        )
        return {str(row[0]).lower() for row in cursor.fetchall()}

    def _install_fill(self, cursor: Any) -> bool:
        layout, sql = self._layout, self._sql
        name = sql.fill_name
        cursor.execute(
            "SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND tgname = %s",
            (_quote(layout.table), name),
        )
        if cursor.fetchone() is not None:
            return False
        guard = _quote(layout.guard_table)
        match = " AND ".join(f"kept.{_quote(k)} = NEW.{_quote(k)}" for k in layout.key_columns)
        assign = " ".join(
            f"NEW.{_quote(column)} := kept_row.{_quote(column)};" for column in layout.value_columns
        )
        # The body is plain SQL text: every name in it passed _identifier.
        cursor.execute(
            f"CREATE OR REPLACE FUNCTION {_quote(name)}() RETURNS trigger"
            " LANGUAGE plpgsql AS $fill$"
            f" DECLARE kept_row record; BEGIN"
            f" SELECT * INTO kept_row FROM {guard} AS kept WHERE {match};"
            f" IF FOUND THEN {assign} NEW.{_quote(layout.seq_column)} := kept_row.seq; END IF;"
            f" RETURN NEW; END $fill$"
        )
        cursor.execute(
            f"CREATE TRIGGER {_quote(name)} BEFORE INSERT ON {_quote(layout.table)}"
            f" FOR EACH ROW EXECUTE FUNCTION {_quote(name)}()"
        )
        return True

    def rows(self) -> dict[str, Any]:
        """The main table as ``{key: value}`` (tuple keys and values for
        several columns, in column order); {} before the table exists. For
        a row group, ``{key: {row key: value}}``; for an exporter that does
        not make rows, the rows that have its values."""
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            if not self._exists(cursor, self.table):
                return {}
            cursor.execute(self._sql.select)
            return self._sql.rows_from(cursor.fetchall())

    def __repr__(self) -> str:
        return f"<percolite.exporters.Postgres {self.safe_dsn!r} {self._layout.describe()}>"
