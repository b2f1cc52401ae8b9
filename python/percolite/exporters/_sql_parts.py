"""The SQL of row groups and shared rows, for the SQL exporters.

A **row group** (``rows=``): an entry's key names a group of rows, its value
is the group's rows ``{row key: value}``, which replace the group's rows
(None or no rows: the group has none). The table's primary key is the row
key column(s) then the key column(s), with an index on the key column(s);
each row has the seq of its group's entry.

**Shared rows** (``seq=`` naming a seq column of the exporter's own): several
exporters write disjoint columns of one table's rows, each with its seq
column and its guard table ``<table>_<seq>``. The one that makes rows
(``makes_rows=True``) inserts and deletes them; the others
(``makes_rows=False``) only update their columns of rows that exist, and
keep their last values in their guard table, from which a trigger fills
their columns when a row is inserted. So a row that comes back has the
values the others exported while it was gone, and their values never bring
a row back.

Every key has a guard row here (its highest seq applied). A call applies
only the entries newer than their key's guard row, and raises it: SQLite
reads the batch's guard rows first (its writers take turns), PostgreSQL
learns them from the guard upserts that changed a row (which lock it).
"""

from __future__ import annotations

from typing import Any

from ._sql_layout import _Layout, _quote, _Statements


class _PartStatements(_Statements):
    """The statements of a row-group or shared-row layout, applied to the
    entries that passed the guard."""

    def __init__(self, layout: _Layout, mark: str, seq_type: str) -> None:
        super().__init__(layout, mark, seq_type)
        table, guard = _quote(layout.table), _quote(layout.guard_table)
        keys = [_quote(name) for name in layout.key_columns]
        rows = [_quote(name) for name in layout.row_columns]
        values = [_quote(name) for name in layout.value_columns]
        seq = _quote(layout.seq_column)
        key_list = ", ".join(keys)
        self.seq = seq
        own = [*values, seq]  # the columns this exporter writes in a shared row

        def marks(count: int) -> str:
            return ", ".join([mark] * count)

        kept = [] if layout.makes_rows else values  # a joining part keeps its values
        self.guard_upsert = (
            f"INSERT INTO {guard} ({', '.join([*keys, 'seq', *kept])})"
            f" VALUES ({marks(len(keys) + 1 + len(kept))})"
            f" ON CONFLICT ({key_list}) DO UPDATE SET "
            + ", ".join(f"{name} = excluded.{name}" for name in ["seq", *kept])
            + f" WHERE excluded.seq > {guard}.seq"
        )
        match = " AND ".join(f"{name} = {mark}" for name in keys)

        def insert(columns: list[str], conflict: list[str], update: list[str]) -> str:
            return (
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks(len(columns))})"
                f" ON CONFLICT ({', '.join(conflict)}) DO UPDATE SET "
                + ", ".join(f"{name} = excluded.{name}" for name in update)
            )

        if layout.row_columns:
            # The group's rows are written (upserts), then its older rows go.
            self.delete_group = f"DELETE FROM {table} WHERE {match} AND {seq} < {mark}"
            # A row's parameters: its cells (row key, value), then the group's.
            self.insert_row = insert([*rows, *values, *keys, seq], [*rows, *keys], own)
            self.select = (
                f"SELECT {key_list}, {', '.join(rows)}, {', '.join(values)} FROM {table}"
                f" ORDER BY {key_list}, {', '.join(rows)}"
            )
        elif layout.makes_rows:
            self.delete_row = f"DELETE FROM {table} WHERE {match}"
            self.upsert_row = insert([*keys, *own], keys, own)
        else:
            self.update_row = (
                f"UPDATE {table} SET "
                + ", ".join(f"{name} = {mark}" for name in own)
                + f" WHERE {match}"
            )
        if not layout.row_columns:
            self.select = (
                f"SELECT {key_list}, {', '.join(values)} FROM {table}"
                f" WHERE {seq} IS NOT NULL ORDER BY {key_list}"
            )
        # A new epoch: every row this exporter wrote is older than its entries.
        self.age_rows = f"UPDATE {table} SET {seq} = -1 WHERE {seq} IS NOT NULL"
        if not layout.makes_rows:
            # A take-over empties this exporter's columns; the rows are not its own.
            self.count_rows = f"SELECT count(*) FROM {table} WHERE {seq} IS NOT NULL"
            self.clear_rows = (
                f"UPDATE {table} SET "
                + ", ".join(f"{name} = NULL" for name in own)
                + f" WHERE {seq} IS NOT NULL"
            )
            # Rows the other exporter made before this one's trigger existed.
            same_key = " AND ".join(f"{guard}.{name} = {table}.{name}" for name in keys)
            self.fill_rows = (
                f"UPDATE {table} SET ({', '.join(own)}) = (SELECT {', '.join([*values, 'seq'])}"
                f" FROM {guard} WHERE {same_key})"
                f" WHERE EXISTS (SELECT 1 FROM {guard} WHERE {same_key})"
            )
        # The guard rows of a batch's keys, given as (key cells, ...) rows.
        self.guard_seqs = (
            f"SELECT {key_list}, seq FROM {guard} WHERE ({key_list}) IN (VALUES {{rows}})"
        )
        self.fill_name = f"{layout.table}_{layout.seq_column}_fill"
        self.group_index = f"{layout.table}_{layout.seq_column}_group"

    def create_part_guard(self, types: list[Any]) -> str:
        """The guard table: key columns, seq and (for a joining part) the
        value columns; ``types`` has one SQL type per key then value column."""
        layout = self.layout
        width = len(layout.key_columns)
        columns = self._key_definitions(types[:width])
        if not layout.makes_rows:
            columns += [
                f"{_quote(name)} {sql_type}".rstrip()
                for name, sql_type in zip(layout.value_columns, types[width:], strict=True)
            ]
        key_list = ", ".join(_quote(name) for name in layout.key_columns)
        return (
            f"CREATE TABLE IF NOT EXISTS {self.guard} ({', '.join(columns)}, "
            f"seq {self.seq_type} NOT NULL, PRIMARY KEY ({key_list}))"
        )

    def create_part_main(self, types: dict[str, Any]) -> str:
        """The main table, with
        ``types`` mapping each key, row key and value column to its SQL type."""
        layout = self.layout
        keys = [*layout.row_columns, *layout.key_columns]
        columns = [f"{_quote(name)} {types[name]} NOT NULL" for name in keys]
        columns += [f"{_quote(name)} {types[name]}".rstrip() for name in layout.value_columns]
        columns.append(f"{self.seq} {self.seq_type}")
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table} ({', '.join(columns)}, "
            f"PRIMARY KEY ({', '.join(_quote(name) for name in keys)}))"
        )

    def create_group_index(self) -> str:
        """A row group's index on its key columns (for replacing a group)."""
        layout = self.layout
        index = _quote(self.group_index)
        return (
            f"CREATE INDEX IF NOT EXISTS {index} ON {self.table}"
            f" ({', '.join(_quote(name) for name in layout.key_columns)})"
        )

    def add_column(self, name: str, sql_type: str) -> str:
        return f"ALTER TABLE {self.table} ADD COLUMN {_quote(name)} {sql_type}".rstrip()

    def rows_from(self, records: Any) -> dict[str, Any]:
        layout = self.layout
        if not layout.row_columns:
            return super().rows_from(records)
        keys, rows = len(layout.key_columns), len(layout.row_columns)
        groups: dict[Any, dict[Any, Any]] = {}
        for record in records:
            key = layout.key_from_cells(record[:keys])
            row_cells = record[keys : keys + rows]
            row_key = row_cells[0] if isinstance(layout.rows, str) else tuple(row_cells)
            groups.setdefault(key, {})[row_key] = layout.value_from_cells(record[keys + rows :])
        return groups


def _part_types(layout: _Layout, rows: list[Any], types: dict, untyped: str | None) -> dict:
    """SQL types of the key, row key and value columns, from the first
    non-None cell of each in ``rows`` (entries collapsed by the layout);
    a column with none gets ``untyped``, or is left out when that is None."""
    found: dict[str, Any] = {}
    for row in rows:
        for name, cell in zip(layout.key_columns, row.key_cells, strict=True):
            found.setdefault(name, types[type(cell)])
        if row.value_cells is None:
            continue
        width = len(layout.row_columns)
        records = row.value_cells if width else [row.value_cells]
        for record in records:
            row_cells, cells = record[:width], record[width:]
            for name, cell in zip(layout.row_columns, row_cells, strict=True):
                found.setdefault(name, types[type(cell)])
            for name, cell in zip(layout.value_columns, cells, strict=True):
                if cell is not None:
                    found.setdefault(name, types[type(cell)])
    if untyped is not None:
        for name in layout.value_columns:
            found.setdefault(name, untyped)
    return found
