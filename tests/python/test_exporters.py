"""The built-in SQL exporters (percolite.exporters): SQLite and PostgreSQL
(JSON Lines: test_exporters_jsonlines.py).

The export queue delivers at least once, possibly out of order and from
several threads and processes at once; every exporter
must end in the state "per key, the entry with the highest seq". The exporters
are called directly here with lists of SequencedExport. PostgreSQL tests run
against a real temporary server (``_postgres.py``), never a mock.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sqlite3
import threading
import time
from contextlib import closing

import children.exporters
import percolite.exporters
import pytest
from _export_histories import batches_of, export_from_processes, highest_seqs, history, reference
from _isolated import run_child
from _sql_targets import TABLE_NUMBERS, SQLiteTarget
from percolite._export import SequencedExport as E
from percolite.errors import ClosedError


def guard_seqs(target, exporter):
    """The guard table as {key: seq} (single key column)."""
    rows = target.sql(f'SELECT "{exporter.key}", seq FROM "{exporter.guard_table}"')
    return dict(rows)


def applied_seqs(target, exporter):
    """The highest seq applied per key, deleted keys included: the larger of
    the key's main-table seq and its guard seq (single key column). SQLite
    keeps guard rows for deleted keys only; PostgreSQL for every key."""
    applied = guard_seqs(target, exporter)
    if target.column_types(exporter.table):
        for key, seq in target.sql(f'SELECT "{exporter.key}", seq FROM "{exporter.table}"'):
            applied[key] = max(seq, applied.get(key, seq))
    return applied


# --- SQLite and PostgreSQL: one behaviour, two databases ---------------------


def test_upsert_then_delete(target):
    exporter = target.exporter()
    exporter([E("a", "x", 1), E("b", "y", 2)])
    assert exporter.rows() == {"a": "x", "b": "y"}
    exporter([E("a", "z", 3)])
    assert exporter.rows() == {"a": "z", "b": "y"}
    exporter([E("b", None, 4)])
    assert exporter.rows() == {"a": "z"}
    assert target.sql(f'SELECT key, value, seq FROM "{exporter.table}"') == [("a", "z", 3)]
    assert applied_seqs(target, exporter) == {"a": 3, "b": 4}, "the guard remembers deleted keys"


def test_guard_rows_sqlite_keeps_deleted_keys_postgres_every_key(target):
    exporter = target.exporter()
    exporter([E("a", "x", 1), E("b", "y", 2)])
    exporter([E("b", None, 3)])
    if target.kind == "sqlite":
        # A key with a row is guarded by the row's seq: one B-tree write per
        # entry. Only a deleted key needs a guard row, until it comes back.
        assert guard_seqs(target, exporter) == {"b": 3}
        exporter([E("b", "back", 4)])
        assert guard_seqs(target, exporter) == {}
    else:
        # The guard row is also the row lock concurrent batches take in order.
        assert guard_seqs(target, exporter) == {"a": 1, "b": 3}
        exporter([E("b", "back", 4)])
        assert guard_seqs(target, exporter) == {"a": 1, "b": 4}
    assert exporter.rows() == {"a": "x", "b": "back"}
    exporter([E("a", None, 1), E("b", None, 2), E("b", "stale", 3)])  # older than the rows
    assert exporter.rows() == {"a": "x", "b": "back"}
    assert applied_seqs(target, exporter) == {"a": 1, "b": 4}


def test_tuple_keys_and_tuple_list_or_dict_values_fill_columns(target):
    exporter = target.exporter(key=("user", "day"), columns=("clicks", "score", "note"))
    exporter(
        [
            E(("ann", 1), (3, 1.5, "hi"), 1),
            E(("ann", 2), [4, 2.5, None], 2),
            E(("bob", 1), {"note": "yo", "clicks": 5, "score": 0.5}, 3),
        ]
    )
    assert exporter.rows() == {
        ("ann", 1): (3, 1.5, "hi"),
        ("ann", 2): (4, 2.5, None),
        ("bob", 1): (5, 0.5, "yo"),
    }
    query = f'SELECT "user", day, clicks, score, note, seq FROM "{exporter.table}" ORDER BY seq'
    assert target.sql(query)[2] == ("bob", 1, 5, 0.5, "yo", 3)
    exporter([E(("ann", 1), None, 4), E(("bob", 1), (6, 0.0, ""), 5)])
    assert exporter.rows() == {("ann", 2): (4, 2.5, None), ("bob", 1): (6, 0.0, "")}


def test_created_columns_take_their_types_from_the_first_values(target):
    exporter = target.exporter(key=("name", "n"), columns=("i", "f", "s", "b"))
    exporter([E(("k", 1), (1, 2.0, "three", b"\x00four"), 7)])
    types = target.column_types(exporter.table)
    if target.kind == "sqlite":
        expected = ["TEXT", "INTEGER", "INTEGER", "REAL", "TEXT", "BLOB", "INTEGER"]
    else:
        expected = ["TEXT", "BIGINT", "BIGINT", "DOUBLE PRECISION", "TEXT", "BYTEA", "BIGINT"]
    assert types == dict(zip(["name", "n", "i", "f", "s", "b", "seq"], expected, strict=True))
    assert exporter.rows() == {("k", 1): (1, 2.0, "three", b"\x00four")}


def _has_rowid(target, table):
    """Whether a SQLite table has rowids (a WITHOUT ROWID table has none)."""
    try:
        target.sql(f'SELECT rowid FROM "{table}" LIMIT 1')
    except sqlite3.OperationalError:
        return False
    return True


def test_sqlite_tables_of_numbers_are_made_without_rowid(tmp_path):
    """A table whose columns past the key are numbers is one B-tree in key
    order (WITHOUT ROWID); one with a TEXT, BLOB or untyped value column
    stays a rowid table, as their rows may be large. Both work the same."""
    target = SQLiteTarget(tmp_path)
    numbers = target.exporter("numbers", columns=("n", "x"))
    texts = target.exporter("texts", columns=("n", "s"))
    blobs = target.exporter("blobs")
    untyped = target.exporter("untyped", columns=("n", "u"))
    for exporter, value in (
        (numbers, (1, 2.5)),
        (texts, (1, "a")),
        (blobs, b"\x00"),
        (untyped, (1, None)),
    ):
        exporter([E("a", value, 1), E("b", value, 2)])
        exporter([E("a", None, 3)])
        assert exporter.rows() == {"b": value}, exporter.table
    assert not _has_rowid(target, "numbers") and not _has_rowid(target, "numbers_seq")
    assert _has_rowid(target, "texts") and _has_rowid(target, "blobs")
    assert _has_rowid(target, "untyped")
    assert not _has_rowid(target, "texts_seq")  # a guard row is a key and a seq


def test_existing_tables_are_used_as_they_are(target):
    name = target.table_name("mine")
    target.sql(
        f"CREATE TABLE {name} (id TEXT PRIMARY KEY, total INTEGER, "
        f"seq BIGINT NOT NULL, extra TEXT DEFAULT 'kept')"
    )
    exporter = target.exporter("mine", key="id", columns="total")
    exporter([E("a", 5, 1), E("b", 6, 2)])
    assert target.sql(f"SELECT id, total, extra FROM {name} ORDER BY id") == [
        ("a", 5, "kept"),
        ("b", 6, "kept"),
    ]
    assert exporter.guard_table == f"{name}_seq"
    assert applied_seqs(target, exporter) == {"a": 1, "b": 2}


def test_create_false_refuses_a_missing_table_and_writes_nothing(target):
    exporter = target.exporter(create=False)
    with pytest.raises(RuntimeError, match="does not exist and create=False"):
        exporter([E("a", 1, 1)])
    assert exporter.rows() == {}
    assert target.column_types(exporter.guard_table) == {}


def test_redelivered_batch_changes_nothing(target):
    exporter = target.exporter()
    batch = [E("a", "a1", 1), E("b", "b2", 2), E("c", None, 3)]
    exporter(batch)
    exporter([E("b", "b5", 5)])
    state = exporter.rows()
    exporter(batch)
    exporter(batch + [E("d", "d6", 6)])  # redelivered with more entries
    assert exporter.rows() == {**state, "d": "d6"}
    assert exporter.rows()["b"] == "b5"
    assert applied_seqs(target, exporter) == {"a": 1, "b": 5, "c": 3, "d": 6}


def test_older_batch_after_newer_one_is_ignored(target):
    exporter = target.exporter()
    exporter([E("a", "new", 10), E("b", "new", 11)])
    exporter([E("a", "old", 4), E("b", "old", 5), E("c", "old", 6)])
    assert exporter.rows() == {"a": "new", "b": "new", "c": "old"}
    exporter([E("a", "same seq", 10)])  # not newer: ignored
    assert exporter.rows()["a"] == "new"


def test_older_batch_after_a_delete_does_not_bring_the_row_back(target):
    exporter = target.exporter()
    exporter([E("a", "v1", 1), E("b", "v2", 2)])
    exporter([E("a", None, 8)])
    exporter([E("a", "v1", 1), E("a", "v5", 5), E("b", "v2", 2)])
    assert exporter.rows() == {"b": "v2"}
    exporter([E("a", "v9", 9)])  # a newer value does
    assert exporter.rows() == {"a": "v9", "b": "v2"}


def test_deletes_before_any_value_are_remembered(target):
    exporter = target.exporter()
    exporter([E("a", None, 5)])  # no value yet to type the columns: only the guard table
    assert exporter.rows() == {}
    assert applied_seqs(target, exporter) == {"a": 5}
    exporter([E("a", 3, 4), E("b", 2, 6)])
    assert exporter.rows() == {"b": 2}
    assert target.column_types(exporter.table)["value"] in ("INTEGER", "BIGINT")


def test_batch_collapses_to_the_newest_entry_per_key(target):
    exporter = target.exporter()
    # Out of seq order on purpose: the highest seq wins, not the last entry.
    exporter([E("a", "a3", 3), E("a", "a9", 9), E("a", "a5", 5), E("b", "b1", 1), E("b", None, 2)])
    assert exporter.rows() == {"a": "a9"}
    assert target.sql(f'SELECT key, seq FROM "{exporter.table}"') == [("a", 9)]
    assert applied_seqs(target, exporter) == {"a": 9, "b": 2}


def test_batch_in_any_key_order_collapses_like_a_sorted_one(target):
    # Queues hand batches over sorted by key; callers may not. An unsorted
    # batch (a key repeating after others, keys going down) must give what
    # the same entries give sorted.
    rng = random.Random(11)
    entries = [
        E(f"k{rng.randrange(30):02}", rng.choice([None, "x", "y"]), seq) for seq in range(200)
    ]
    shuffled = rng.sample(entries, len(entries))
    assert shuffled != sorted(shuffled, key=lambda e: (e.key, e.seq))
    unsorted_sink, sorted_sink = target.exporter("unsorted"), target.exporter("in_order")
    unsorted_sink(shuffled)
    sorted_sink(sorted(entries, key=lambda e: (e.key, e.seq)))
    assert unsorted_sink.rows() == sorted_sink.rows() == reference(entries)
    assert applied_seqs(target, unsorted_sink) == highest_seqs(entries)
    assert applied_seqs(target, sorted_sink) == highest_seqs(entries)


@pytest.mark.parametrize("order", ["any", "key_then_seq", "key_only", "in_order_then_not"])
@pytest.mark.parametrize("mixed_keys", [False, True])
@pytest.mark.parametrize("columns", ["value", ("x", "y")])
def test_fast_collapse_gives_the_rows_of_the_checked_one(tmp_path, columns, mixed_keys, order):
    # collapse() takes a fast loop for batches of plain keys and cells (with
    # no dict while keys come in order, as an export queue sends them); it
    # must give exactly the rows of the path that checks every cell: newest
    # seq per key whatever the order, deletions, keys of mixed types in the
    # same total order.
    rng = random.Random(5)
    scalar = isinstance(columns, str)

    def value() -> object:
        if rng.random() < 0.2:
            return None
        cells = [
            rng.choice([rng.randrange(-5, 5), f"s{rng.randrange(9)}", 0.5, b"b"]) for _ in "xy"
        ]
        return cells[0] if scalar else (cells[0], rng.choice([cells[1], None]))

    keys = [f"k{i}" for i in range(30)]
    if mixed_keys:
        keys += [*range(12), b"raw"]
    seqs = rng.sample(range(1, 10_000), 400)
    entries = [E(rng.choice(keys), value(), seq) for seq in seqs]
    by_key = percolite.exporters._sort_key
    if order == "key_then_seq":
        entries.sort(key=lambda e: (by_key((e.key,)), e.seq))
    elif order == "key_only":  # a key's entries in any seq order
        entries.sort(key=lambda e: by_key((e.key,)))
    elif order == "in_order_then_not":
        head = sorted(entries[:200], key=lambda e: (by_key((e.key,)), e.seq))
        entries = head + entries[200:]
    layout = percolite.exporters.SQLite(tmp_path / "c.sqlite", "t", columns=columns)._layout
    fast = layout.collapse(entries)
    assert layout._collapse_plain(entries) == fast  # the fast loop took this batch
    layout._collapse_plain = lambda entries: None  # every entry through the checks
    assert layout.collapse(entries) == fast
    assert [type(row) for row in fast] == [percolite.exporters._Row] * len(fast)
    assert {row.key: row.seq for row in fast} == highest_seqs(entries)


@pytest.mark.parametrize("repeats", [False, True])
@pytest.mark.parametrize("columns", ["value", ("x", "y")])
def test_sorted_values_give_the_rows_of_the_checked_collapse(tmp_path, columns, repeats):
    # SQLite takes the usual batch (key order then seq, values only) through
    # sorted_values: the rows must be those of the checked collapse, and any
    # other batch must be left to it (None).
    rng = random.Random(8)
    scalar = isinstance(columns, str)

    def value() -> object:
        cells = [
            rng.choice([rng.randrange(-5, 5), f"s{rng.randrange(9)}", 0.5, b"b"]) for _ in "xy"
        ]
        return cells[0] if scalar else (cells[0], rng.choice([cells[1], None]))

    keys = [f"k{i:03}" for i in range(300)]
    chosen = [rng.choice(keys) for _ in range(400)] if repeats else rng.sample(keys, 200)
    entries = sorted(
        (
            E(key, value(), seq)
            for key, seq in zip(chosen, rng.sample(range(1, 10_000), 400), strict=False)
        ),
        key=lambda e: (e.key, e.seq),
    )
    layout = percolite.exporters.SQLite(tmp_path / "s.sqlite", "t", columns=columns)._layout
    fast = layout.sorted_values(entries)
    # What an export queue sends takes the same path (an ExportBatch is a
    # list: a check of the exact type once sent every queue's batch the slow way).
    batch = percolite.ExportBatch(entries)
    batch.queue, batch.store, batch.epoch = "q", "0" * 32, 1
    assert layout.sorted_values(batch) == fast
    layout._collapse_plain = lambda entries: None  # every entry through the checks
    checked = [(*row.key_cells, *row.value_cells, row.seq) for row in layout.collapse(entries)]
    assert fast == checked
    assert len(fast) == len(set(chosen))
    # Batches it leaves to collapse: a deletion, keys out of order, a key's
    # seqs going down, keys of two types, a bool cell, a seq out of range,
    # entries that are not a list.
    middle = len(entries) // 2
    other = {
        "deletion": entries[:middle]
        + [E(entries[middle].key, None, 10_001)]
        + entries[middle + 1 :],
        "key order": entries[::-1],
        "seq order": entries + [E(entries[-1].key, entries[-1].value, entries[-1].seq - 1)],
        "key types": entries + [E(7, entries[0].value, 1)],
        "bool": entries + [E("zz", True if scalar else (True, 1), 1)],
        "seq range": entries + [E("zz", entries[0].value, 2**63)],
        "tuple": tuple(entries),
    }
    for why, batch in other.items():
        assert layout.sorted_values(batch) is None, why


def test_value_that_does_not_fit_the_columns_raises_and_writes_nothing(target):
    exporter = target.exporter(columns=("x", "y"))
    exporter([E("a", (1, 2), 1)])
    for bad, why in [((1, 2, 3), "expected 2 items"), ({"x": 1}, "exactly the keys"), (7, "")]:
        with pytest.raises(ValueError) as raised:
            exporter([E("b", (3, 4), 2), E("zz", bad, 3)])
        message = str(raised.value)
        assert "'zz'" in message and repr(bad) in message and "('x', 'y')" in message
        assert why in message
    assert exporter.rows() == {"a": (1, 2)}, "nothing of a refused batch is applied"
    scalar = target.exporter("scalar")
    with pytest.raises(ValueError, match=r"value \[1, 2\] of key 'k'.*\('value',\)"):
        scalar([E("k", [1, 2], 1)])
    with pytest.raises(ValueError, match="set is not storable"):
        scalar([E("k", {1}, 1)])


def test_key_that_does_not_fit_the_key_columns_raises(target):
    exporter = target.exporter(key=("a", "b"))
    with pytest.raises(ValueError, match=r"key 'flat' does not fit the key columns \('a', 'b'\)"):
        exporter([E("flat", 1, 1)])
    with pytest.raises(ValueError, match="cannot be None"):
        exporter([E(("x", None), 1, 1)])
    with pytest.raises(ValueError, match="seq must be an int"):
        exporter([E(("x", 1), 1, -1)])
    with pytest.raises(ValueError, match="seq must be an int"):
        exporter([E(("x", 1), 1, 2**63)])
    assert exporter.rows() == {}


@pytest.mark.parametrize(
    "table, options, match",
    [
        ("bad-name", {}, "table must be an SQL identifier"),
        ('t"; DROP TABLE x; --', {}, "table must be an SQL identifier"),
        ("t", {"key": ("a", "1b")}, "key column must be an SQL identifier"),
        ("t", {"key": ()}, "non-empty tuple"),
        ("t", {"columns": 5}, "columns must be a column name"),
        ("t", {"columns": ("x", "X")}, "'x' cannot be used: it appears twice"),
        ("t", {"key": "k", "columns": ("k",)}, "'k' cannot be used: it appears twice"),
        ("t", {"columns": "seq"}, "'seq' cannot be used: it is the seq column"),
    ],
)
def test_bad_names_are_refused_at_construction(target, table, options, match):
    with pytest.raises(ValueError, match=match):
        target.exporter(table, **options)


def test_keywords_and_mixed_case_are_usable_names(target):
    exporter = target.exporter("Order", key=("select", "from"), columns=("Group", "where"))
    exporter([E((1, 2), ("g", "w"), 1)])
    assert exporter.rows() == {(1, 2): ("g", "w")}


def test_column_names_like_the_exporters_own_are_usable(target):
    # The SQLite exporter's batch table has columns of its own ("$n",
    # "$present"); a user column named present once clashed with them.
    exporter = target.exporter("b", key=("n", "percolite_batch"), columns=("present", "seq_"))
    exporter([E((1, "x"), (True, 2), 1), E((2, "y"), (False, 3), 2)])
    exporter([E((2, "y"), None, 3)])
    assert exporter.rows() == {(1, "x"): (1, 2)}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), (1, float("-inf"))])
def test_sql_exporters_refuse_nan_and_infinity_before_writing(tmp_path, value):
    from percolite.exporters import SQLite

    columns = ("a", "b") if isinstance(value, tuple) else "value"
    sink = SQLite(tmp_path / "out.sqlite", "t", columns=columns)
    good = (1, 2) if isinstance(value, tuple) else 1.5
    sink([E("ok", good, 1)])
    with pytest.raises(ValueError, match="is not storable"):
        sink([E("a", good, 2), E("k", value, 3)])
    with sqlite3.connect(tmp_path / "out.sqlite") as db:
        assert [r[0] for r in db.execute("SELECT key FROM t ORDER BY key")] == ["ok"]


def test_closed_exporter_refuses_calls(target):
    exporter = target.exporter()
    exporter([E("a", 1, 1)])
    with exporter:
        pass
    with pytest.raises(ClosedError):
        exporter([E("a", 2, 2)])
    assert target.sql(f'SELECT value FROM "{exporter.table}"') == [(1,)]


def test_four_threads_end_at_the_reference_state(target):
    rng = random.Random(4)
    entries = history(rng)
    batches = batches_of(rng, entries, 80)
    exporter = target.exporter()
    errors = []

    def export(share):
        try:
            for batch in share:
                exporter(batch)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=export, args=(batches[i::4],), daemon=True) for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "an export thread hangs"
    assert errors == []
    assert exporter.rows() == reference(entries)
    assert applied_seqs(target, exporter) == highest_seqs(entries)


def test_two_processes_end_at_the_reference_state(target, tmp_path):
    rng = random.Random(2)
    entries = history(rng)
    batches = batches_of(rng, entries, 120)
    exporter = target.exporter()
    shares = [batches[0::2], batches[1::2]]
    export_from_processes(tmp_path, target.kind, target.location, exporter.table, shares)
    assert exporter.rows() == reference(entries)
    assert applied_seqs(target, exporter) == highest_seqs(entries)


def test_forked_child_and_parent_export_at_once_on_their_own_connections(target, tmp_path):
    rng = random.Random(7)
    entries = history(rng)
    batches = batches_of(rng, entries, 60)
    exporter = target.exporter()
    shares = [batches[:5], batches[5::2], batches[6::2]]
    batches_file = tmp_path / "batches.json"
    batches_file.write_text(json.dumps(shares))
    run_child(
        children.exporters.export_across_fork,
        target.kind,
        target.location,
        exporter.table,
        batches_file,
        timeout=60,
    )
    assert exporter.rows() == reference(entries)


# --- Arguments checked at construction ---------------------------------------


def test_sqlite_in_a_missing_directory_fails_at_construction(tmp_path):
    path = tmp_path / "missing" / "export.sqlite"
    with pytest.raises(FileNotFoundError, match="missing") as raised:
        percolite.exporters.SQLite(path, "t")
    assert raised.value.filename == str(path)
    with pytest.raises(ValueError, match="table must be an SQL identifier.*, not ''"):
        percolite.exporters.SQLite(tmp_path / "x.sqlite", "")
    with pytest.raises(ValueError, match=":memory:"):
        percolite.exporters.SQLite(":memory:", "t")
    with pytest.raises(ValueError, match="timeout"):
        percolite.exporters.SQLite(tmp_path / "x.sqlite", "t", timeout=0)


def test_sqlite_uses_wal_and_has_a_useful_repr(tmp_path):
    with percolite.exporters.SQLite(tmp_path / "e.sqlite", "t", key=("a", "b")) as exporter:
        exporter([E((1, 2), 3, 1)])
        assert repr(exporter) == (
            f"<percolite.exporters.SQLite {str(tmp_path / 'e.sqlite')!r}"
            " table='t' key=('a', 'b') columns='value'>"
        )
    with closing(sqlite3.connect(tmp_path / "e.sqlite")) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


# --- PostgreSQL only ---------------------------------------------------------


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://exporter:hunter2@127.0.0.1:{port}/db",
        "host=127.0.0.1 port={port} user=exporter password=hunter2 dbname=db",
    ],
)
def test_unreachable_postgres_raises_from_the_call_naming_the_dsn(dsn):
    dsn = dsn.format(port=free_port())
    exporter = percolite.exporters.Postgres(dsn, "t", connect_timeout=2)  # does not connect
    started = time.monotonic()
    for attempt in (lambda: exporter([E("a", 1, 1)]), exporter.check):
        with pytest.raises(ConnectionError) as raised:
            attempt()
        message = str(raised.value)
        assert "cannot connect to PostgreSQL" in message and "127.0.0.1" in message
        assert "refused" in message, "the cause is named"
        assert "hunter2" not in message and "***" in message
    assert "hunter2" not in repr(exporter)
    assert time.monotonic() - started < 10
    exporter.close()


def test_postgres_refuses_a_bad_dsn_and_a_long_table_name():
    with pytest.raises(ValueError, match="bad PostgreSQL DSN") as raised:
        percolite.exporters.Postgres("host=x password=hunter2 nonsense", "t")
    assert "hunter2" not in str(raised.value)
    with pytest.raises(ValueError, match="too long"):
        percolite.exporters.Postgres("host=x", "t" * 60)


@pytest.mark.parametrize("table", ["excluded", "EXCLUDED"])
def test_the_upserts_own_name_is_refused_as_a_table(tmp_path, table):
    # A table named excluded once took the place of the incoming row in the
    # upserts' seq condition, so newer values were silently not applied.
    match = "table 'excluded' cannot be used"
    with pytest.raises(ValueError, match=match):
        percolite.exporters.SQLite(tmp_path / "x.sqlite", table)
    with pytest.raises(ValueError, match=match):
        percolite.exporters.Postgres("host=x", table)


def test_postgres_check_connects_to_a_live_server(postgres_dsn):
    with percolite.exporters.Postgres(postgres_dsn, "unused") as exporter:
        exporter.check()
        assert exporter.rows() == {}


def test_postgres_refuses_to_guess_the_type_of_a_column_without_values(postgres_dsn):
    table = f"t{next(TABLE_NUMBERS)}"
    with percolite.exporters.Postgres(postgres_dsn, table, columns=("x", "y")) as exporter:
        with pytest.raises(ValueError, match="cannot choose a type for column 'y'"):
            exporter([E("a", (1, None), 1)])
        exporter([E("a", (1, None), 1), E("b", (2, "y"), 2)])
        assert exporter.rows() == {"a": (1, None), "b": (2, "y")}


def test_postgres_without_psycopg_says_how_to_install_it():
    out = run_child(children.exporters.postgres_without_psycopg, timeout=30)
    assert 'pip install "psycopg[binary]"' in out


def test_sqlite_processes_switching_a_new_file_to_wal_at_once(tmp_path):
    # Regression: "PRAGMA journal_mode=WAL" does not wait for the busy timeout;
    # processes opening a new file at the same time got "database is locked".
    run_child(children.exporters.new_sqlite_file_race, tmp_path, 8, 4, timeout=60)


def test_a_new_sqlite_exporter_keeps_the_locks_of_open_connections(tmp_path):
    """Regression: a new connection of an exporter opened and closed the
    database file outside SQLite, which drops every POSIX lock the process
    holds on it. Another process closing its connection then took the file
    as unused, checkpointed and deleted the WAL that this process's
    connections were using: a corrupt database, seen after workers were
    killed mid-load."""
    path = tmp_path / "out.sqlite"
    first = percolite.exporters.SQLite(path, "t")
    second = percolite.exporters.SQLite(path, "u")
    try:
        first([E("a", "1", 1)])
        with closing(sqlite3.connect(path)) as held:
            held.execute("SELECT count(*) FROM t").fetchall()
            second([E("b", "2", 1)])  # opens a connection of its own
            run_child(children.exporters.read_then_close, str(path), timeout=60)
            assert os.path.exists(f"{path}-wal"), "another process deleted the WAL in use"
            assert held.execute("SELECT * FROM u").fetchall() == [("b", "2", 1)]
        assert first.rows() == {"a": "1"} and second.rows() == {"b": "2"}
    finally:
        first.close()
        second.close()


def test_sqlite_guard_rows_for_every_key_still_guard(tmp_path):
    """Tables written before the SQLite exporter kept guard rows for deleted
    keys only have a guard row for every key; they keep working."""
    path = tmp_path / "earlier.sqlite"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE t (key TEXT PRIMARY KEY, value TEXT, seq INTEGER NOT NULL)")
        db.execute("CREATE TABLE t_seq (key TEXT PRIMARY KEY, seq INTEGER NOT NULL)")
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", [("a", "a5", 5), ("b", "b6", 6)])
        db.executemany("INSERT INTO t_seq VALUES (?, ?)", [("a", 5), ("b", 6), ("c", 7)])
    exporter = percolite.exporters.SQLite(path, "t")
    try:
        exporter([E("a", "old", 4), E("b", "b8", 8), E("c", "old", 7), E("d", None, 1)])
        assert exporter.rows() == {"a": "a5", "b": "b8"}
        exporter([E("c", "c9", 9), E("d", "old", 1)])
        assert exporter.rows() == {"a": "a5", "b": "b8", "c": "c9"}
        with closing(sqlite3.connect(path)) as db:
            guard = dict(db.execute("SELECT key, seq FROM t_seq"))
        assert guard == {"a": 5, "d": 1}
    finally:
        exporter.close()


def test_sqlite_batches_of_many_chunks_end_at_the_reference_state(tmp_path, monkeypatch):
    """The statements that write the tables take a batch a chunk of rows at a
    time (to bound SQLite's statement journal). With chunks of 3 rows, whole
    histories and shuffled batches, deletions and stale entries included,
    end where the entries one by one would."""
    monkeypatch.setattr(percolite.exporters.SQLite, "_CHUNK", 3)
    rng = random.Random(9)
    entries = history(rng, keys=40, commits=300)
    target = SQLiteTarget(tmp_path)
    exporter = target.exporter()
    try:
        exporter(entries[: len(entries) // 2])  # up to 40 keys: about 14 chunks
        for batch in batches_of(rng, entries, 30):
            exporter(batch)
        exporter(entries)
        assert exporter.rows() == reference(entries)
        assert applied_seqs(target, exporter) == highest_seqs(entries)
    finally:
        exporter.close()


# -- exported files are owner-only ---------------------------------------------


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o777


@pytest.mark.parametrize("mode", [None, 0o640])
def test_exported_files_get_the_exporter_mode_whatever_the_umask(tmp_path, mode):
    from percolite.exporters import JSONLines, SQLite

    previous = os.umask(0o022)
    try:
        extra = {} if mode is None else {"mode": mode}
        sqlite = SQLite(tmp_path / "out.sqlite", "t", **extra)
        sqlite([E("k", 1, 1)])
        lines = JSONLines(tmp_path / "out.jsonl", **extra)
        lines([E("k", 1, 1)])
    finally:
        os.umask(previous)
    expected = 0o600 if mode is None else mode
    for name in ("out.sqlite", "out.sqlite-wal", "out.sqlite-shm", "out.jsonl"):
        if (tmp_path / name).exists():
            assert _mode(tmp_path / name) == expected, name
    assert _mode(tmp_path / "out.sqlite") == expected


def test_a_directory_is_refused_as_an_sqlite_file(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory: name an SQLite database file"):
        percolite.exporters.SQLite(tmp_path, "t")


def test_sqlite_check_refuses_a_file_that_is_not_a_database(tmp_path):
    missing = percolite.exporters.SQLite(tmp_path / "new.sqlite", "t")
    missing.check()  # made by the first call, not by the check
    assert not (tmp_path / "new.sqlite").exists()
    missing([E("k", "v", 1)])
    missing.check()
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    exporter = percolite.exporters.SQLite(notes, "t")
    with pytest.raises(ValueError, match=r"notes.txt: not an SQLite database \(file is not a"):
        exporter.check()
    assert notes.read_text() == "my notes\n"


@pytest.mark.parametrize(
    "mode, error", [(0o1000, ValueError), ("600", TypeError), (True, TypeError)]
)
def test_a_bad_export_file_mode_is_refused(tmp_path, mode, error):
    from percolite.exporters import JSONLines, SQLite

    with pytest.raises(error, match="mode must be"):
        SQLite(tmp_path / "out.sqlite", "t", mode=mode)
    with pytest.raises(error, match="mode must be"):
        JSONLines(tmp_path / "out.jsonl", mode=mode)
    assert not (tmp_path / "out.sqlite").exists() and not (tmp_path / "out.jsonl").exists()
