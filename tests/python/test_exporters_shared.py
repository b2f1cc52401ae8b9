"""Row groups (``rows=``: one entry replaces a group of rows) and shared rows
(``seq=`` and ``makes_rows=False``: several export queues write disjoint
columns of one table's rows), in the SQLite and PostgreSQL exporters.

Both keep the seq guard's contract: per key, the state of the entry with the
highest seq, whatever order, repetition or threads the batches come in.
"""

from __future__ import annotations

import random
import threading

import pytest
from percolite._export import SequencedExport as E


def groups(target, name="links", **options):
    return target.exporter(name, key="source", rows="target", columns="anchor", **options)


def shared(target, name="pages"):
    """The exporter that makes the rows, and one that only fills a column."""
    maker = target.exporter(name, key="uri", columns=("domain", "incount"), seq="in_seq")
    joiner = target.exporter(name, key="uri", columns="outcount", seq="out_seq", makes_rows=False)
    return maker, joiner


def table_rows(target, table, columns, order):
    return target.sql(f'SELECT {columns} FROM "{target.table_name(table)}" ORDER BY {order}')


# --- Row groups ----------------------------------------------------------------


def test_a_group_entry_replaces_the_groups_rows(target):
    exporter = groups(target)
    exporter([E("a", {"x": "to x", "y": "to y"}, 1), E("b", [("x", "from b")], 2)])
    assert exporter.rows() == {"a": {"x": "to x", "y": "to y"}, "b": {"x": "from b"}}
    exporter([E("a", {"y": "now", "z": "new"}, 3)])
    assert exporter.rows() == {"a": {"y": "now", "z": "new"}, "b": {"x": "from b"}}
    exporter([E("a", None, 4), E("b", {}, 5)])
    assert exporter.rows() == {}
    exporter([E("b", {"q": "back"}, 6)])
    assert table_rows(target, "links", "target, source, anchor, seq", "target") == [
        ("q", "b", "back", 6)
    ]


def test_rows_a_group_keeps_are_updated_in_place(target):
    """A group's new entry updates the rows it keeps (their anchor and seq)
    rather than deleting and inserting them again: on SQLite a kept row
    keeps its rowid. Rows it no longer has go; new rows come."""
    exporter = groups(target)
    exporter([E("a", {"x": "1", "y": "2", "z": "3"}, 1), E("b", {"x": "4"}, 1)])
    table = target.table_name("links")
    if target.kind == "sqlite":
        before = dict(target.sql(f'SELECT target, rowid FROM "{table}" WHERE source = \'a\''))
    exporter([E("a", {"x": "changed", "y": "2", "w": "new"}, 2)])
    assert exporter.rows() == {"a": {"x": "changed", "y": "2", "w": "new"}, "b": {"x": "4"}}
    assert table_rows(target, "links", "target, source, seq", "source, target") == [
        ("w", "a", 2),
        ("x", "a", 2),
        ("y", "a", 2),
        ("x", "b", 1),
    ]
    if target.kind == "sqlite":
        after = dict(target.sql(f'SELECT target, rowid FROM "{table}" WHERE source = \'a\''))
        assert (after["x"], after["y"]) == (before["x"], before["y"])


def test_large_batches_of_groups_and_shared_rows_apply_whole(target):
    """Batches past one statement's worth of rows (SQLite inserts up to
    1,024 rows a statement): 3,001 group rows, a key given twice in one
    batch (its newer entry wins), then 2,500 shared rows, made and filled,
    and a batch that replaces and deletes some of them."""
    exporter = groups(target)
    links = {f"s{i:04d}": {f"t{j}": f"{i}-{j}" for j in range(3)} for i in range(1000)}
    batch = [E(source, rows, 1) for source, rows in links.items()]
    batch.insert(500, E("s0499", {"only": "older"}, 0))
    batch.append(E("extra", {"e": "e"}, 1))
    exporter(batch)
    links["extra"] = {"e": "e"}
    assert exporter.rows() == links
    exporter([E(f"s{i:04d}", {"u": str(i)} if i % 2 else None, 2) for i in range(1000)])
    expected = {f"s{i:04d}": {"u": str(i)} for i in range(1, 1000, 2)}
    assert exporter.rows() == {**expected, "extra": {"e": "e"}}
    maker, joiner = shared(target)
    joiner([E(f"u{i:04d}", i * 2, 1) for i in range(2500)])
    maker([E(f"u{i:04d}", ("d", i), 1) for i in range(2500)])
    rows = table_rows(target, "pages", "uri, domain, incount, outcount", "uri")
    assert rows == [(f"u{i:04d}", "d", i, i * 2) for i in range(2500)]
    maker([E(f"u{i:04d}", ("e", -i) if i % 3 else None, 2) for i in range(2500)])
    rows = table_rows(target, "pages", "uri, domain, incount, outcount", "uri")
    assert rows == [(f"u{i:04d}", "e", -i, i * 2) for i in range(2500) if i % 3]


def test_group_table_is_keyed_by_row_key_then_key_with_an_index_on_the_key(target):
    exporter = groups(target)
    exporter([E("a", {"x": "1"}, 1)])
    table = target.table_name("links")
    if target.kind == "sqlite":
        keys = [
            r[1]
            for r in sorted(target.sql(f'PRAGMA table_info("{table}")'), key=lambda r: r[5])
            if r[5]
        ]
        indexed = {r[1] for r in target.sql(f'PRAGMA index_list("{table}")')}
    else:
        keys = [
            r[0]
            for r in target.sql(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
                " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass(?)"
                " AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
                (f'"{table}"',),
            )
        ]
        indexed = {
            r[0]
            for r in target.sql("SELECT indexname FROM pg_indexes WHERE tablename = ?", (table,))
        }
    assert keys == ["target", "source"]
    assert f"{table}_seq_group" in indexed


def test_group_redelivered_or_older_changes_nothing(target):
    exporter = groups(target)
    new = [E("a", {"x": "new"}, 10)]
    exporter(new)
    exporter(new)
    exporter([E("a", {"old": "old", "x": "old"}, 5), E("a", None, 7)])
    assert exporter.rows() == {"a": {"x": "new"}}
    exporter([E("a", None, 11)])
    exporter(new)  # an older group never comes back
    assert exporter.rows() == {}


def test_a_batch_applies_the_newest_group_of_each_key(target):
    exporter = groups(target)
    exporter([E("a", {"x": "3"}, 3), E("a", {"y": "9"}, 9), E("a", {"z": "4"}, 4)])
    assert exporter.rows() == {"a": {"y": "9"}}


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("text", "expected a dict"),
        ([("x", "1", "extra")], "is not a \\(row key, value\\) pair"),
        ([("x", "1"), ("x", "2")], "row key 'x' appears twice"),
        ({"x": None}, "row key 'x' has no value"),
        ({None: "1"}, "row column 'target' cannot be None"),
        ({"x": ("1", "2")}, "does not fit the columns"),
    ],
)
def test_a_bad_group_raises_and_writes_nothing(target, value, match):
    exporter = groups(target)
    exporter([E("a", {"x": "1"}, 1)])
    with pytest.raises(ValueError, match=match):
        exporter([E("b", {"y": "2"}, 2), E("c", value, 3)])
    assert exporter.rows() == {"a": {"x": "1"}}


def test_groups_with_tuple_row_keys_and_several_columns(target):
    exporter = target.exporter("cells", key="sheet", rows=("row", "col"), columns=("text", "size"))
    exporter([E("s", {(1, 2): ("a", 1.5), (2, 1): ("b", None)}, 1)])
    assert exporter.rows() == {"s": {(1, 2): ("a", 1.5), (2, 1): ("b", None)}}


def test_four_threads_of_group_batches_end_at_the_newest_groups(target):
    rng = random.Random(11)
    entries = []
    for seq in range(1, 601):
        source = f"s{rng.randrange(30)}"
        if rng.random() < 0.15:
            value = None
        else:
            value = {f"t{rng.randrange(12)}": f"{seq}" for _ in range(rng.randrange(5))}
        entries.append(E(source, value, seq))
    newest = {}
    for entry in entries:
        newest[entry.key] = entry.value
    expected = {key: value for key, value in newest.items() if value}
    batches = [entries[i : i + 25] for i in range(0, len(entries), 25)]
    rng.shuffle(batches)
    exporter = groups(target)
    shares = [batches[i::4] for i in range(4)]

    def deliver(share):
        for batch in share + share[:3]:  # some batches twice
            exporter(batch)

    threads = [threading.Thread(target=deliver, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert exporter.rows() == expected


# --- Shared rows ---------------------------------------------------------------


def test_two_exporters_write_their_own_columns_of_one_row(target):
    maker, joiner = shared(target)
    maker([E("a", ("d", 3), 1)])
    joiner([E("a", 7, 1)])  # seqs of the two queues are independent
    maker([E("a", ("d", 4), 2)])
    assert table_rows(target, "pages", "uri, domain, incount, outcount", "uri") == [
        ("a", "d", 4, 7)
    ]
    assert maker.rows() == {"a": ("d", 4)}
    assert joiner.rows() == {"a": 7}


def test_the_joining_exporter_never_makes_a_row_and_its_values_wait(target):
    maker, joiner = shared(target)
    joiner([E("a", 5, 10), E("b", 6, 11)])  # before the table has any row
    assert table_rows(target, "pages", "uri", "uri") == []
    maker([E("a", ("d", 1), 1)])
    assert table_rows(target, "pages", "uri, incount, outcount, out_seq", "uri") == [
        ("a", 1, 5, 10)
    ]
    maker([E("a", None, 2)])  # the row goes; the joiner's value is kept
    joiner([E("a", 8, 12)])
    assert table_rows(target, "pages", "uri", "uri") == []
    maker([E("a", ("d", 2), 3), E("b", ("e", 1), 4)])
    assert table_rows(target, "pages", "uri, incount, outcount", "uri") == [
        ("a", 2, 8),
        ("b", 1, 6),
    ]


def test_rows_made_before_the_joiner_came_are_filled_when_it_comes(target):
    maker, joiner = shared(target)
    maker([E("a", ("d", 1), 1), E("b", ("d", 2), 2)])
    joiner([E("b", 9, 1)])
    assert table_rows(target, "pages", "uri, incount, outcount", "uri") == [
        ("a", 1, None),
        ("b", 2, 9),
    ]


def test_joiner_entries_keep_the_seq_guard(target):
    maker, joiner = shared(target)
    maker([E("a", ("d", 1), 1)])
    joiner([E("a", 5, 10)])
    joiner([E("a", 4, 9), E("a", 3, 8)])  # older: ignored
    joiner([E("a", None, 11)])  # None empties the columns
    assert table_rows(target, "pages", "outcount, out_seq", "uri") == [(None, 11)]
    joiner([E("a", 6, 10)])
    assert table_rows(target, "pages", "outcount, out_seq", "uri") == [(None, 11)]


def test_maker_entries_keep_the_seq_guard_and_leave_the_joiners_columns(target):
    maker, joiner = shared(target)
    maker([E("a", ("d", 1), 5)])
    joiner([E("a", 2, 1)])
    maker([E("a", ("old", 0), 4), E("a", None, 3)])
    maker([E("a", ("d", 9), 6)])
    assert table_rows(target, "pages", "domain, incount, outcount", "uri") == [("d", 9, 2)]
    maker([E("a", None, 7)])
    maker([E("a", ("late", 1), 6)])  # older than the deletion: no row
    assert table_rows(target, "pages", "uri", "uri") == []


def test_taking_over_clears_each_exporters_own_part(target):
    maker, joiner = shared(target)
    maker([E("a", ("d", 1), 1)])
    joiner([E("a", 2, 1), E("b", 3, 2)])
    taken = joiner.take_over("other-store")
    assert taken["rows_cleared"] == 1
    assert table_rows(target, "pages", "uri, incount, outcount", "uri") == [("a", 1, None)]
    taken = maker.take_over("other-store")
    assert taken["rows_cleared"] == 1
    assert table_rows(target, "pages", "uri", "uri") == []


def test_shared_rows_from_threads_end_at_the_newest_values(target):
    rng = random.Random(5)
    maker_entries, joiner_entries = [], []
    for seq in range(1, 401):
        key = f"u{rng.randrange(25)}"
        maker_entries.append(E(key, None if rng.random() < 0.3 else ("d", seq), seq))
        key = f"u{rng.randrange(25)}"
        joiner_entries.append(E(key, seq, seq))
    made = {e.key: e.value for e in maker_entries}
    filled = {e.key: e.value for e in joiner_entries}
    expected = sorted(
        (key, value[1], filled.get(key)) for key, value in made.items() if value is not None
    )
    maker, joiner = shared(target)
    work = [(maker, maker_entries[i : i + 20]) for i in range(0, 400, 20)]
    work += [(joiner, joiner_entries[i : i + 20]) for i in range(0, 400, 20)]
    rng.shuffle(work)

    def deliver(share):
        for exporter, batch in share:
            exporter(batch)

    threads = [threading.Thread(target=deliver, args=(work[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert table_rows(target, "pages", "uri, incount, outcount", "uri") == expected


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rows": "to", "makes_rows": False, "seq": "s2"}, "do not go together"),
        ({"makes_rows": False}, "needs seq= naming"),
        ({"seq": "value"}, "column 'value' cannot be used: it is the seq column"),
        ({"seq": "bad name"}, "seq must be an SQL identifier"),
        ({"rows": "key"}, "column 'key' cannot be used: it appears twice"),
        ({"makes_rows": 1, "seq": "s2"}, "makes_rows must be True or False"),
    ],
)
def test_bad_layouts_are_refused_at_construction(target, options, match):
    with pytest.raises(ValueError, match=match):
        target.exporter("t", **options)
