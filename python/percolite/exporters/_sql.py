"""The base class of the SQL exporters (SQLite, PostgreSQL): the tables a
call ensures, the owner check, the take-over, and the writes of row groups
and shared rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._common import (
    ADOPT,
    APPLY,
    NEW_EPOCH,
    UNCHECKED,
    _check_store,
    _claim,
    _log_adopted,
    _Pool,
)
from ._sql_layout import _column_types, _Layout, _Statements
from ._sql_parts import _part_types, _PartStatements


def _run_many(handle: Any, statement: str, params: list[Any]) -> None:
    """Runs ``statement`` once for each row of ``params`` (none: nothing)."""
    if params:
        handle.executemany(statement, params)


class _SQLExporter:
    """What the SQL exporters share; a subclass sets the class attributes and
    provides ``_connect`` and ``_exists``."""

    _types: dict  # Python type -> SQL type of a created column
    _untyped: str | None  # type of a value column with no value yet; None refuses
    _mark: str  # the driver's placeholder
    _seq_type: str
    # How a call reads the owner row: locked against a take-over going on,
    # where write transactions may run side by side.
    _owner_lock = ""
    # The clause that ends the CREATE TABLE of a plain layout's table whose
    # columns past the key are all of these types (_Statements); none here.
    _small_rows: tuple[str, frozenset[str]] = ("", frozenset())

    def _set_up(self, layout: _Layout, create: bool) -> None:
        self._layout = layout
        if self._layout.is_part:
            self._sql: Any = _PartStatements(self._layout, self._mark, self._seq_type)
        else:
            self._sql = _Statements(self._layout, self._mark, self._seq_type, self._small_rows)
        self.create: bool = bool(create)
        self._tables_ready = False  # both tables known to exist
        self._owner_ready = False  # the owner table known to exist
        self._pool = _Pool(self._connect)
        # The native paths of export queues feeding this sink (_native_sink).
        self._native_sinks: list[Any] = []

    def _connect(self) -> Any:
        raise NotImplementedError

    def _exists(self, handle: Any, table: str) -> bool:
        raise NotImplementedError

    def _index_exists(self, handle: Any, index: str) -> bool:
        return self._exists(handle, index)

    def _column_names(self, handle: Any, table: str) -> set[str]:
        """The names of the columns of ``table``, lower-cased."""
        raise NotImplementedError

    def _install_fill(self, handle: Any) -> bool:
        """For an exporter that does not make rows: installs, when missing,
        the trigger that fills its columns of a row being inserted from its
        guard table; returns whether it installed it."""
        raise NotImplementedError

    @property
    def table(self) -> str:
        """The main table."""
        return self._layout.table

    @property
    def guard_table(self) -> str:
        """The guard table, ``<table>_<seq column>`` (``<table>_seq``): the
        highest seq applied per key."""
        return self._layout.guard_table

    @property
    def key(self) -> Any:
        """The key column name, or the tuple of them."""
        return self._layout.key

    @property
    def columns(self) -> Any:
        """The value column name, or the tuple of them."""
        return self._layout.columns

    @property
    def rows_key(self) -> Any:
        """The row key column name (or tuple) of a row group; None otherwise."""
        return self._layout.rows

    @property
    def seq_column(self) -> str:
        """This exporter's seq column in the table."""
        return self._layout.seq_column

    @property
    def makes_rows(self) -> bool:
        """Whether this exporter's entries insert and delete rows (False: it
        fills its columns of rows another exporter makes)."""
        return self._layout.makes_rows

    def _ensure_tables(self, handle: Any, rows: list[Any]) -> bool:
        """Creates what is missing (or raises when ``create`` is false), in
        the call's transaction; returns whether the main table exists now
        (the caller records that once the transaction committed). A batch of
        deletes only creates the guard table: there is nothing to delete yet,
        and no value to choose the column types from."""
        layout, sql = self._layout, self._sql
        if layout.is_part:
            return self._ensure_part_tables(handle, rows)
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

    def _ensure_part_tables(self, handle: Any, rows: list[Any]) -> bool:
        """:meth:`_ensure_tables` of row groups and shared rows: makes the
        guard table, the main table or this exporter's missing columns in
        it, and (when it does not make rows) the trigger that fills them."""
        layout, sql = self._layout, self._sql
        types = _part_types(layout, rows, self._types, self._untyped)

        def typed(names: tuple[Any, ...]) -> list[Any] | None:
            if all(name in types for name in names):
                return [types[name] for name in names]
            return None

        def refuse(what: str) -> RuntimeError:
            return RuntimeError(f"{self!r}: {what} does not exist and create=False")

        if not self._exists(handle, layout.guard_table):
            if not self.create:
                raise refuse(f"table {layout.guard_table!r}")
            kept = () if layout.makes_rows else layout.value_columns
            guard_types = typed((*layout.key_columns, *kept))
            if guard_types is None:
                raise ValueError(
                    f"cannot choose types for the columns of table {layout.guard_table!r}: "
                    "they are None in every entry of this batch; create the table yourself"
                )
            handle.execute(sql.create_part_guard(guard_types))
        if not self._exists(handle, layout.table):
            if not self.create:
                raise refuse(f"table {layout.table!r}")
            if typed((*layout.key_columns, *layout.row_columns, *layout.value_columns)) is None:
                return False  # no value to choose the types from yet
            handle.execute(sql.create_part_main(types))
        else:
            present = self._column_names(handle, layout.table)
            for name in (*layout.value_columns, layout.seq_column):
                if name.lower() in present:
                    continue
                if not self.create:
                    raise refuse(f"column {name!r} of table {layout.table!r}")
                if name == layout.seq_column:
                    handle.execute(sql.add_column(name, self._seq_type))
                elif name in types:
                    handle.execute(sql.add_column(name, types[name]))
                else:
                    return False  # no value to choose its type from yet
        # Checked first: CREATE INDEX IF NOT EXISTS would lock the table
        # even when the index exists (against writers, on PostgreSQL).
        if layout.row_columns and self.create and not self._index_exists(handle, sql.group_index):
            handle.execute(sql.create_group_index())
        if not layout.makes_rows and self._install_fill(handle):
            handle.execute(sql.fill_rows)
        return True

    # Cells of the fixed codecs (percolite.codecs.native_layout) as the
    # native paths bind them: what the exporters store for their values.
    _NATIVE_CELLS = {"str": "text", "bytes": "blob", "int64": "int64", "float64": "float64"}

    def _native_cells(
        self, key_layout: Any, value_layout: Any
    ) -> tuple[list[list[str]] | None, str]:
        """The cells a native path binds for keys and values of the fixed
        codecs ``key_layout`` and ``value_layout``, or ``(None, why)`` when
        they do not fit this exporter's columns (or its layout is one the
        exporter applies itself)."""
        if self._layout.is_part:
            return None, "row groups and shared rows are applied by the exporter"
        cells = []
        for role, layout, spec, names in (
            ("key", key_layout, self._layout.key, self._layout.key_columns),
            ("value", value_layout, self._layout.columns, self._layout.value_columns),
        ):
            name, length = layout
            if name == "int64s":
                if isinstance(spec, str) or len(names) != length:
                    return None, (
                        f"the {role} codec int64s:{length} does not fit the {role} column(s) "
                        f"{names}"
                    )
                cells.append(["int64"] * length)
            elif not isinstance(spec, str):
                return None, f"the {role} codec {name} does not fit the {role} columns {names}"
            else:
                cells.append([self._NATIVE_CELLS[name]])
        return cells, ""

    def _made_native(self, make: Any, spec: dict[str, Any]) -> tuple[Any, str]:
        """``make(spec)`` (a ``_core`` native-sink factory), kept to be
        closed with this exporter, and ``"native"``; or None and why the
        core refused it."""
        try:
            sink = make(spec)
        except ValueError as exc:
            return None, str(exc)
        self._native_sinks.append(sink)
        return sink, "native"

    def _guard_params(self, rows: list[Any]) -> list[tuple[Any, ...]]:
        """The parameters of the guard upserts of row groups and shared rows."""
        if self._layout.makes_rows:
            return [(*row.key_cells, row.seq) for row in rows]
        empty = (None,) * len(self._layout.value_columns)
        return [(*row.key_cells, row.seq, *(row.value_cells or empty)) for row in rows]

    def _insert_rows(self, handle: Any, statement: str, params: list[Any]) -> None:
        """Runs ``statement``, an ``INSERT ... VALUES (one row)``, for each
        row of ``params``, in order."""
        _run_many(handle, statement, params)

    def _write_part(self, handle: Any, rows: list[Any]) -> None:
        """Writes the main table for ``rows`` of a row group or shared-row
        layout: entries newer than their guard rows, which the caller
        raised in its transaction."""
        layout, sql = self._layout, self._sql
        if layout.row_columns:
            # The group's rows are upserted, then the rows it no longer has
            # (an older seq) deleted: a row kept from the group's last entry
            # is updated in place, not deleted and inserted again in every
            # index (a re-crawled page keeps most of its links).
            inserts: list[tuple[Any, ...]] = []
            for row in rows:
                if row.value_cells:
                    tail = (*row.key_cells, row.seq)
                    inserts += [cells + tail for cells in row.value_cells]
            self._insert_rows(handle, sql.insert_row, inserts)
            _run_many(handle, sql.delete_group, [(*row.key_cells, row.seq) for row in rows])
        elif layout.makes_rows:
            deletes = [row.key_cells for row in rows if row.value_cells is None]
            _run_many(handle, sql.delete_row, deletes)
            upserts = [
                (*row.key_cells, *row.value_cells, row.seq)
                for row in rows
                if row.value_cells is not None
            ]
            self._insert_rows(handle, sql.upsert_row, upserts)
        else:
            empty = (None,) * len(layout.value_columns)
            updates = [(*(row.value_cells or empty), row.seq, *row.key_cells) for row in rows]
            _run_many(handle, sql.update_row, updates)

    @property
    def owner_table(self) -> str:
        """The owner table, ``<table>_owner``: the store the sink belongs to."""
        return self._layout.owner_table

    def _owner(self, handle: Any) -> tuple[str, int] | None:
        """The store the sink belongs to, read in the caller's transaction
        (the owner table is made when missing)."""
        if not self._owner_ready:
            self._create_owner(handle)
        row = handle.execute(self._sql.select_owner + self._owner_lock).fetchone()
        return None if row is None else (row[0], int(row[1]))

    def _create_owner(self, handle: Any) -> None:
        """Makes the owner table when it is missing."""
        handle.execute(self._sql.create_owner)

    def _check_owner(self, handle: Any, entries: Any) -> None:
        """In the call's write transaction, before anything is written:
        refuses another store's entries, records the owner of a sink that
        has none, and ages the rows when the owner's epoch moved on
        (``_common._claim``). The caller sets ``_owner_ready`` once its
        transaction committed."""
        if not getattr(entries, "store", None):
            return
        sql = self._sql
        decision = _claim(self._owner(handle), entries, repr(self))
        if decision in (APPLY, UNCHECKED):
            return
        # Changing the owner: one writer at a time, deciding again under the lock.
        self._lock_owner(handle)
        decision = _claim(self._owner(handle), entries, repr(self))
        if decision in (APPLY, UNCHECKED):
            return
        if decision == ADOPT:
            if self._exists(handle, self.table) and handle.execute(sql.any_row).fetchone():
                _log_adopted(self, entries.store)
        elif decision == NEW_EPOCH:
            self._forget_seqs(handle)
        handle.execute(sql.clear_owner)
        handle.execute(sql.insert_owner, (entries.store, entries.epoch))

    def _lock_owner(self, handle: Any) -> None:
        """Takes the lock that orders changes of the owner, until the
        caller's transaction ends (a database whose write transactions are
        already serial needs none)."""

    def _forget_seqs(self, handle: Any) -> None:
        if self._exists(handle, self.table) and self._has_seq_column(handle):
            handle.execute(self._sql.age_rows)
        if self._exists(handle, self.guard_table):
            handle.execute(self._sql.clear_guards)

    def _take_over_in(self, handle: Any, store: str, epoch: int) -> dict[str, Any]:
        """The take-over's statements, in the caller's write transaction."""
        sql = self._sql
        self._lock_owner(handle)
        previous = self._owner(handle)
        cleared = 0
        if self._exists(handle, self.table) and self._has_seq_column(handle):
            cleared = int(handle.execute(sql.count_rows).fetchone()[0])
            handle.execute(sql.clear_rows)
        if self._exists(handle, self.guard_table):
            handle.execute(sql.clear_guards)
        handle.execute(sql.clear_owner)
        handle.execute(sql.insert_owner, (store, epoch))
        return {
            "sink": repr(self),
            "previous_owner": None if previous is None else previous[0],
            "owner": store,
            "epoch": epoch,
            "rows_cleared": cleared,
        }

    def take_over(self, store: str, epoch: int = 1) -> dict[str, Any]:
        """Makes this sink belong to store ``store`` (an identity, as
        :attr:`percolite.Env.identity` gives it) from epoch ``epoch``: in
        one transaction, deletes every row of the table and of its guard
        table (another store's exports) and records the new owner. Returns
        what it did: ``{"sink", "previous_owner", "owner", "epoch",
        "rows_cleared"}``. When another call is writing the sink (perhaps
        another store's workers), raises :class:`percolite.SinkBusy` after
        a short wait (SQLite: ``timeout``), with nothing changed."""
        store, epoch = _check_store(store, epoch)
        done = self._in_write_transaction(lambda handle: self._take_over_in(handle, store, epoch))
        self._owner_ready = True
        return dict(done)

    def _has_seq_column(self, handle: Any) -> bool:
        """Whether the main table has this exporter's seq column (shared rows
        add theirs at their first batch)."""
        if not self._layout.is_part:
            return True
        return self._layout.seq_column.lower() in self._column_names(handle, self.table)

    def _in_write_transaction(self, work: Callable[[Any], Any]) -> Any:
        """``work(handle)`` in a write transaction of its own, committed when
        it returns; raises SinkBusy when another call holds the sink."""
        raise NotImplementedError

    def _read_owner(self, handle: Any) -> dict[str, Any] | None:
        if not self._exists(handle, self.owner_table):
            return None
        row = handle.execute(self._sql.select_owner).fetchone()
        return None if row is None else {"store": row[0], "epoch": int(row[1])}

    def close(self) -> None:
        """Closes this process's connections (those of the export queues'
        native paths too); later calls raise ClosedError."""
        for sink in list(self._native_sinks):
            sink.close()
        self._pool.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
