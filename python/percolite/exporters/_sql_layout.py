"""Where the SQL exporters put keys and values: the checks of table and
column names, the mapping of keys and values to columns, the per-key
collapse of a batch, and the SQL of a layout."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, compress
from typing import Any, NamedTuple

from ._common import (
    _SEQ_LIMIT,
    _check_seq,
)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


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


def _names(spec: Any, what: str) -> tuple[Any, ...]:
    if isinstance(spec, str):
        return (_identifier(spec, what),)
    if not isinstance(spec, (tuple, list)) or not spec:
        raise ValueError(
            f"{what} must be a column name or a non-empty tuple of names, not {spec!r}"
        )
    return tuple(_identifier(name, f"{what} column") for name in spec)


_SQL_SCALARS = (int, float, str, bytes)
# Exact types stored as they are (no bool, no subclasses): the fast path of
# _Layout.collapse.
_PLAIN_TYPES = frozenset(_SQL_SCALARS)
_PLAIN_OR_NONE = frozenset((*_SQL_SCALARS, type(None)))
_EXACT = frozenset((int, str, bytes))  # stored as they are, whatever their value
_SEQUENCES = frozenset((tuple, list))  # several columns' cells (list: from JSON)
_KEY, _VALUE, _SEQ = (operator.attrgetter(name) for name in ("key", "value", "seq"))


def _sql_scalar(item: Any, describe: Callable[[], str]) -> Any:
    """``item`` as a value an SQL driver stores: bool as int, bytes-likes as bytes."""
    if isinstance(item, bool):
        return int(item)
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, float) and not math.isfinite(item):
        raise ValueError(
            f"{describe()}: {item!r} is not storable (SQL databases hold no NaN or "
            "infinity the same way); nothing of the batch was written"
        )
    if item is None or isinstance(item, _SQL_SCALARS):
        return item
    raise ValueError(
        f"{describe()}: {type(item).__name__} is not storable; use int, float, str, bytes or None"
    )


def _all_finite(items: Iterable[Any]) -> bool:
    """No float among ``items`` is NaN or infinite (a loop in C)."""
    return all(map(_finite_or_other, items))


def _finite_or_other(item: Any) -> bool:
    return type(item) is not float or math.isfinite(item)


def _cells(entries: Sequence, scalar: bool) -> Iterable:
    """Every value cell of ``entries`` (of the plain path: scalars or tuples)."""
    values = (entry.value for entry in entries if entry.value is not None)
    return values if scalar else chain.from_iterable(values)


def _spread(spec: Any, names: tuple[Any, ...], given: Any, what: str, role: str) -> tuple:
    """The cells of a key (or row key) ``given`` for the column(s) ``spec``
    (a name: a scalar; a tuple of names: a tuple of that length)."""
    if isinstance(spec, str):
        cells: Sequence = (given,)
    elif isinstance(given, (tuple, list)) and len(given) == len(names):
        cells = given
    else:
        raise ValueError(
            f"{what} does not fit the {role} columns {names}: expected a tuple of {len(names)}"
        )
    out = []
    for column, cell in zip(names, cells, strict=True):
        if cell is None:
            raise ValueError(f"{what}: {role} column {column!r} cannot be None")
        out.append(_sql_scalar(cell, lambda c=column: f"{what}, column {c!r}"))
    return tuple(out)


class _Row(NamedTuple):
    key: Any  # as given, for messages
    key_cells: tuple  # one cell per key column
    value_cells: tuple | None  # one cell per value column; None deletes
    seq: int


def _sort_key(cells: tuple[Any, ...]) -> tuple[Any, ...]:
    # A total order even across types: the SQL exporters touch keys in this
    # order, so that concurrent batches lock guard rows in the same order.
    return tuple((type(cell).__name__, cell) for cell in cells)


class _Layout:
    """Where keys and values go: ``key`` and ``columns`` as the user gave them."""

    def __init__(
        self,
        table: Any,
        key: Any,
        columns: Any,
        rows: Any = None,
        seq: Any = "seq",
        makes_rows: bool = True,
    ) -> None:
        self.table = _identifier(table, "table")
        if table.lower() == "excluded":
            raise ValueError(
                "table 'excluded' cannot be used: in an upsert that name is the incoming row"
            )
        self.seq_column = _identifier(seq, "seq")
        if not isinstance(makes_rows, bool):
            raise ValueError(f"makes_rows must be True or False, not {makes_rows!r}")
        self.makes_rows = makes_rows
        self.rows = rows
        self.row_columns = () if rows is None else _names(rows, "rows")
        if self.row_columns and not makes_rows:
            raise ValueError(
                "rows= and makes_rows=False do not go together: a row group's entry "
                "makes and deletes the group's rows"
            )
        if not makes_rows and seq.lower() == "seq":
            raise ValueError(
                "makes_rows=False needs seq= naming this exporter's own seq column: 'seq' "
                "is the one of the exporter that makes the rows"
            )
        # Row groups and shared rows (a seq column of its own) keep a guard
        # row for every key and are applied by the statements of _parts.
        self.is_part = bool(self.row_columns) or seq != "seq" or not makes_rows
        self.guard_table = f"{table}_{seq}"
        self.owner_table = f"{table}_owner" if seq == "seq" else f"{table}_{seq}_owner"
        self.key = key
        self.columns = columns
        self.key_columns = _names(key, "key")
        self.value_columns = _names(columns, "columns")
        every = [*self.key_columns, *self.row_columns, *self.value_columns, seq]
        folded = [name.lower() for name in every]
        for name in every:
            if folded.count(name.lower()) > 1:
                why = "it is the seq column" if name.lower() == seq.lower() else "it appears twice"
                raise ValueError(
                    f"column {name!r} cannot be used: {why} (key={key!r}, "
                    + (f"rows={rows!r}, " if rows is not None else "")
                    + f"columns={columns!r}, seq={seq!r}; names are compared ignoring case)"
                )

    def key_cells(self, key: Any) -> tuple[Any, ...]:
        return _spread(self.key, self.key_columns, key, f"key {key!r}", "key")

    def value_cells(self, key: Any, value: Any) -> tuple[Any, ...]:
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
            for name, cell in zip(columns, cells, strict=True)
        )

    def group_cells(self, key: Any, value: Any) -> tuple[Any, ...]:
        """The rows of a row group's value, each a tuple of its row key's
        cells then its value's cells; ``value`` is a dict ``{row key:
        value}`` or a sequence of ``(row key, value)`` pairs. (A group's rows
        are written under its guard row's lock, so their order does not
        matter.)"""

        if type(value) is dict and isinstance(self.rows, str) and isinstance(self.columns, str):
            # The usual group: row keys of one exact type, values of exact
            # types with nothing to check (no float, no None).
            row_types = set(map(type, value))
            if (
                len(row_types) == 1
                and row_types <= _EXACT
                and set(map(type, value.values())) <= _EXACT
            ):
                return tuple(value.items())

        def bad(why: str) -> ValueError:
            return ValueError(
                f"value of key {key!r} is not a row group for rows={self.rows!r}: {why}"
            )

        if isinstance(value, dict):
            pairs: Iterable[Any] = value.items()
        elif isinstance(value, (tuple, list)):
            pairs = value
        else:
            raise bad(f"expected a dict {{row key: value}} or (row key, value) pairs: {value!r}")
        cells: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise bad(f"{pair!r} is not a (row key, value) pair")
            row_key, row_value = pair
            row_cells = _spread(
                self.rows, self.row_columns, row_key, f"row key {row_key!r} of key {key!r}", "row"
            )
            if row_cells in cells:
                raise bad(f"row key {row_key!r} appears twice")
            if row_value is None:
                raise bad(f"row key {row_key!r} has no value (leave the row out instead)")
            try:
                cells[row_cells] = self.value_cells(key, row_value)
            except ValueError as exc:
                raise ValueError(f"row key {row_key!r}: {exc}") from None
        return tuple((*at, *row) for at, row in cells.items())

    def collapse(self, entries: Iterable[Any]) -> list[Any]:
        """The newest entry of each key, checked and mapped to cells, in key
        order. Raises ValueError for a bad entry before anything is written."""
        if not isinstance(entries, (list, tuple)):
            entries = list(entries)
        rows = self._collapse_groups(entries) if self.row_columns else self._collapse_plain(entries)
        if rows is not None:
            return rows
        newest: dict[Any, Any] = {}
        for entry in entries:
            seq = _check_seq(entry)
            key_cells = self.key_cells(entry.key)
            if entry.value is None:
                value_cells = None
            elif self.row_columns:
                value_cells = self.group_cells(entry.key, entry.value)
            else:
                value_cells = self.value_cells(entry.key, entry.value)
            kept = newest.get(key_cells)
            if kept is None or seq > kept.seq:
                newest[key_cells] = _Row(entry.key, key_cells, value_cells, seq)
        return sorted(newest.values(), key=lambda row: _sort_key(row.key_cells))

    def _collapse_groups(self, entries: Sequence) -> list | None:
        """What :meth:`collapse` returns for a row group's usual batch: one
        key column, keys of one exact type (int, str or bytes), int seqs in
        range; None for any other."""
        if not isinstance(self.key, str):
            return None
        newest: dict[Any, Any] = {}
        for entry in entries:
            key, seq = entry.key, entry.seq
            if type(seq) is not int or not 0 <= seq < _SEQ_LIMIT or type(key) not in _EXACT:
                return None
            kept = newest.get(key)
            if kept is None or seq > kept.seq:
                newest[key] = entry
        if len(set(map(type, newest))) > 1:
            return None
        make, group = tuple.__new__, self.group_cells
        rows = []
        for key in sorted(newest):
            entry = newest[key]
            cells = None if entry.value is None else group(key, entry.value)
            rows.append(make(_Row, (key, (key,), cells, entry.seq)))
        return rows

    def _collapse_plain(self, entries: Sequence) -> list | None:
        """What :meth:`collapse` returns, for the usual batch: one key column,
        keys and cells of exactly int, float, str or bytes (None in values),
        int seqs in range. One tight loop instead of the checks per cell;
        ``None`` when an entry needs the general path (which also names what
        is wrong with it)."""
        if not isinstance(self.key, str) or self.row_columns:
            return None
        scalar = isinstance(self.columns, str)
        width = len(self.value_columns)
        plain, plain_or_none = _PLAIN_TYPES, _PLAIN_OR_NONE
        # Rows are made only for the keys that stay, without _Row's
        # Python-level __new__, which would cost a batch of distinct keys a
        # good part of its time (bench/results/notes.md). An export queue
        # calls with its entries in key order, then seq: while keys keep
        # coming in order (and of one type), the newest of each key is the
        # list's last entry, and neither a dict nor a sort is needed. Out of
        # order, a dict takes over.
        floats = False  # NaN and infinities are refused (by the general path)
        ordered: list[Any] = []
        newest: dict[str, Any] | None = None
        last_key: Any = None
        key_type: Any = None
        for entry in entries:
            key, value, seq = entry.key, entry.value, entry.seq
            if type(seq) is not int or not 0 <= seq < _SEQ_LIMIT or type(key) not in plain:
                return None
            if type(key) is float:
                floats = True
            if value is None:
                pass
            elif scalar:
                if type(value) not in plain:
                    return None
                if type(value) is float:
                    floats = True
            else:
                if type(value) not in _SEQUENCES or len(value) != width:
                    return None
                types = set(map(type, value))
                if not types <= plain_or_none:
                    return None
                if float in types:
                    floats = True
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
        if floats and not (
            _all_finite(entry.key for entry in entries) and _all_finite(_cells(entries, scalar))
        ):
            return None  # the general path names the entry
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
        ``zip``) instead of one Python loop over the entries, which takes a
        fraction of the time of :meth:`collapse` then the rows
        (``bench/results/notes.md``)."""
        # A list: what an export queue sends (percolite.ExportBatch) or a plain one.
        if not isinstance(self.key, str) or not isinstance(entries, list) or not entries:
            return None
        if self.row_columns:
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
        if float in key_types and not _all_finite(keys):
            return None  # collapse names the entry
        if isinstance(self.columns, str):
            types = set(map(type, values))
            if not types <= _PLAIN_TYPES or (float in types and not _all_finite(values)):
                return None
            return list(zip(keys, values, seqs, strict=True))
        width = len(self.value_columns)
        if not set(map(type, values)) <= _SEQUENCES or set(map(len, values)) != {width}:
            return None
        types = set(map(type, chain.from_iterable(values)))
        if not types <= _PLAIN_OR_NONE:
            return None
        if float in types and not _all_finite(chain.from_iterable(values)):
            return None
        cells = [map(operator.itemgetter(i), values) for i in range(width)]
        return list(zip(keys, *cells, seqs, strict=True))

    def key_from_cells(self, cells: Sequence) -> Any:
        return cells[0] if isinstance(self.key, str) else tuple(cells)

    def value_from_cells(self, cells: Sequence) -> Any:
        return cells[0] if isinstance(self.columns, str) else tuple(cells)

    def describe(self) -> str:
        text = f"table={self.table!r} key={self.key!r}"
        if self.rows is not None:
            text += f" rows={self.rows!r}"
        text += f" columns={self.columns!r}"
        if self.seq_column != "seq":
            text += f" seq={self.seq_column!r}"
        if not self.makes_rows:
            text += " makes_rows=False"
        return text


def _column_types(
    layout: _Layout, rows: list[Any], types: dict[str, Any], untyped: str | None
) -> list | None:
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

    def __init__(
        self,
        layout: _Layout,
        mark: str,
        seq_type: str,
        small_rows: tuple[str, frozenset[str]] = ("", frozenset()),
    ) -> None:
        self.seq_type = seq_type
        # (clause, types): the clause ends the CREATE TABLE of a table whose
        # columns past the key all have one of the types (rows small and of
        # fixed size), e.g. SQLite's WITHOUT ROWID.
        self.small_rows_clause, self.small_types = small_rows
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
        # The owner: one row, the store the sink belongs to (a sink belongs to one store).
        owner = _quote(layout.owner_table)
        self.owner = owner
        self.create_owner = (
            f"CREATE TABLE IF NOT EXISTS {owner} (store TEXT NOT NULL, epoch BIGINT NOT NULL)"
        )
        self.select_owner = f"SELECT store, epoch FROM {owner}"
        self.clear_owner = f"DELETE FROM {owner}"
        self.insert_owner = f"INSERT INTO {owner} (store, epoch) VALUES ({mark}, {mark})"
        self.any_row = f"SELECT 1 FROM {table} LIMIT 1"
        self.count_rows = f"SELECT count(*) FROM {table}"
        self.clear_rows = f"DELETE FROM {table}"
        self.clear_guards = f"DELETE FROM {guard}"
        # A new epoch: every row the sink holds is older than its entries.
        self.age_rows = f"UPDATE {table} SET seq = -1"
        match = " AND ".join(f"{name} = {mark}" for name in keys)
        self.delete = f"DELETE FROM {table} WHERE {match} AND seq < {mark}"
        self.select = f"SELECT {key_list}, {', '.join(values)} FROM {table} ORDER BY {key_list}"

    def create_guard(self, key_types: list[Any]) -> str:
        return self._create(self.guard, self._key_definitions(key_types), small=True)

    def create_main(self, types: list[Any]) -> str:
        width = len(self.layout.key_columns)
        value_types = types[width:]
        values = [
            f"{_quote(name)} {sql_type}".rstrip()
            for name, sql_type in zip(self.layout.value_columns, value_types, strict=False)
        ]
        small = len(value_types) == len(self.layout.value_columns) and all(
            sql_type in self.small_types for sql_type in value_types
        )
        return self._create(self.table, self._key_definitions(types[:width]) + values, small=small)

    def _key_definitions(self, key_types: list[Any]) -> list[Any]:
        return [
            f"{_quote(name)} {sql_type} NOT NULL"
            for name, sql_type in zip(self.layout.key_columns, key_types, strict=True)
        ]

    def _create(self, table: str, columns: list[Any], *, small: bool) -> str:
        key_list = ", ".join(_quote(name) for name in self.layout.key_columns)
        return (
            f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(columns)}, "
            f"seq {self.seq_type} NOT NULL, PRIMARY KEY ({key_list}))"
            + (self.small_rows_clause if small else "")
        )

    def rows_from(self, records: Iterable[Any]) -> dict[str, Any]:
        layout, width = self.layout, len(self.layout.key_columns)
        return {
            layout.key_from_cells(record[:width]): layout.value_from_cells(record[width:])
            for record in records
        }
