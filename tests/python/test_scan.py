"""Scans: order, prefix and range bounds, column filters, and read-your-writes
merged with the snapshot, including across the chunks the scan reads in."""

from __future__ import annotations

import itertools
import random

import percolite
import pytest
from conftest import COL, as_tuples, committed_cells
from percolite import _transaction

CHUNK = _transaction._SCAN_CHUNK
COLS = [(b"a", b""), (b"a", b"x"), (b"b", b"q")]


def model_scan(model, prefix=None, start=None, end=None, columns=None):
    """What a scan must return, computed from a dict {(row, (fam, qual)): value}."""
    out = []
    for (row, column), value in sorted(model.items()):
        if prefix is not None and not row.startswith(prefix):
            continue
        if start is not None and row < start:
            continue
        if end is not None and row >= end:
            continue
        if columns is not None and column not in columns:
            continue
        out.append((row, column, value))
    return out


def test_scan_order_is_row_then_family_then_qualifier(env):
    cells = [
        (b"b", (b"a", b"z"), b"1"),
        (b"a", (b"b", b""), b"2"),
        (b"a", (b"a", b"b"), b"3"),
        (b"a", (b"a", b""), b"4"),
        (b"ab", (b"a", b""), b"5"),
        (b"a\x00", (b"a", b""), b"6"),
        (b"a", (b"a\x00", b""), b"7"),
        (b"a", (b"a", b"\x00"), b"8"),
        (b"\xff", (b"\xff", b"\xff"), b"9"),
        (b"\x00", (b"\x00", b"\x00"), b"10"),
    ]
    with env.transaction() as tx:
        for row, col, value in cells:
            tx.set(row, col, value)
    assert committed_cells(env) == sorted(cells)


def test_own_sets_appear_in_scan_in_order(env):
    with env.transaction() as tx:
        for row in (b"b", b"d", b"f"):
            tx.set(row, COL, b"committed-" + row)
    tx = env.transaction()
    tx.set(b"a", COL, b"own-a")
    tx.set(b"c", COL, b"own-c")
    tx.set(b"d", COL, b"own-d")  # overrides the snapshot's value
    tx.set(b"d", ("f", "r"), b"own-d2")  # same row, later column
    tx.set(b"g", COL, b"own-g")
    assert as_tuples(tx.scan()) == [
        (b"a", (b"f", b"q"), b"own-a"),
        (b"b", (b"f", b"q"), b"committed-b"),
        (b"c", (b"f", b"q"), b"own-c"),
        (b"d", (b"f", b"q"), b"own-d"),
        (b"d", (b"f", b"r"), b"own-d2"),
        (b"f", (b"f", b"q"), b"committed-f"),
        (b"g", (b"f", b"q"), b"own-g"),
    ]
    tx.abort()


def test_own_deletes_hide_cells_in_scan(env):
    with env.transaction() as tx:
        for row in (b"a", b"b", b"c", b"d"):
            tx.set(row, COL, row)
    tx = env.transaction()
    tx.delete(b"a", COL)
    tx.delete(b"c", COL)
    tx.delete(b"zz", COL)  # deleting an absent cell shows nothing either
    tx.set(b"e", COL, b"e")
    tx.delete(b"e", COL)
    assert [c.row for c in tx.scan()] == [b"b", b"d"]
    assert [c.row for c in tx.scan(start=b"a", end=b"c")] == [b"b"]
    tx.abort()


def test_scan_by_prefix(env):
    rows = [b"app", b"apple", b"apples", b"applf", b"apq", b"b", b"ap", b"appl\x00", b"appl\xff"]
    with env.transaction() as tx:
        for row in rows:
            tx.set(row, COL, row)
    tx = env.transaction()
    tx.set(b"applesauce", COL, b"own")
    tx.delete(b"apple", COL)
    assert [c.row for c in tx.scan(b"appl")] == [
        b"appl\x00",
        b"apples",
        b"applesauce",
        b"applf",
        b"appl\xff",
    ]
    assert [c.row for c in tx.scan("apple")] == [b"apples", b"applesauce"]
    assert [c.row for c in tx.scan(b"zzz")] == []
    assert [c.row for c in tx.scan(b"\xff")] == []
    assert len(list(tx.scan())) == len(rows)  # -1 deleted, +1 own
    tx.abort()


def test_scan_prefix_of_high_bytes(env):
    rows = [b"\xfe", b"\xff", b"\xff\x00", b"\xff\xff", b"\xff\xff\xff", b"\xfe\xff"]
    with env.transaction() as tx:
        for row in rows:
            tx.set(row, COL, b"v")
    tx = env.transaction()
    assert [c.row for c in tx.scan(b"\xff")] == [b"\xff", b"\xff\x00", b"\xff\xff", b"\xff\xff\xff"]
    assert [c.row for c in tx.scan(b"\xff\xff")] == [b"\xff\xff", b"\xff\xff\xff"]
    assert [c.row for c in tx.scan(b"\xfe")] == [b"\xfe", b"\xfe\xff"]
    tx.abort()


def test_scan_by_start_and_end(env):
    rows = [b"a", b"a\x00", b"b", b"ba", b"c", b"d"]
    with env.transaction() as tx:
        for row in rows:
            tx.set(row, COL, row)
    tx = env.transaction()
    tx.set(b"bb", COL, b"own")
    assert [c.row for c in tx.scan(start=b"b", end=b"c")] == [b"b", b"ba", b"bb"]
    assert [c.row for c in tx.scan(start=b"a\x00", end=b"b")] == [b"a\x00"]
    assert [c.row for c in tx.scan(start=b"ba")] == [b"ba", b"bb", b"c", b"d"]
    assert [c.row for c in tx.scan(end=b"b")] == [b"a", b"a\x00"]
    assert [c.row for c in tx.scan(start="c", end="c")] == []
    assert [c.row for c in tx.scan(start=b"d", end=b"a")] == []
    tx.abort()


def test_scan_with_columns_filter(env):
    with env.transaction() as tx:
        for row in (b"r1", b"r2"):
            for col in COLS:
                tx.set(row, col, row + col[0] + col[1])
    tx = env.transaction()
    tx.set(b"r0", (b"b", b"q"), b"own")
    tx.set(b"r0", (b"c", b""), b"own-unwanted")
    tx.delete(b"r2", (b"b", b"q"))
    wanted = [("b", "q"), percolite.Column("a", "")]
    got = as_tuples(tx.scan(columns=wanted))
    assert got == [
        (b"r0", (b"b", b"q"), b"own"),
        (b"r1", (b"a", b""), b"r1a"),
        (b"r1", (b"b", b"q"), b"r1bq"),
        (b"r2", (b"a", b""), b"r2a"),
    ]
    assert as_tuples(tx.scan(b"r1", columns=[(b"a", b"x")])) == [(b"r1", (b"a", b"x"), b"r1ax")]
    assert as_tuples(tx.scan(start=b"r2", columns=[(b"a", b"x")])) == [
        (b"r2", (b"a", b"x"), b"r2ax")
    ]
    assert list(tx.scan(columns=[(b"nope", b"")])) == []
    tx.abort()


def test_scan_can_stop_early(env):
    with env.transaction() as tx:
        for i in range(3 * CHUNK):
            tx.set(b"r%05d" % i, COL, b"v")
    tx = env.transaction()
    first = list(itertools.islice(tx.scan(), 3))
    assert [c.row for c in first] == [b"r00000", b"r00001", b"r00002"]
    tx.set(b"new", COL, b"v")
    tx.commit()
    assert tx.state == "committed"


# -- a model check across chunk boundaries -----------------------------------


def _populate(env, rng, n_rows):
    model = {}
    with env.transaction() as tx:
        for i in range(n_rows):
            row = b"r%05d" % (i * 10)
            for col in rng.sample(COLS, rng.randint(1, len(COLS))):
                value = b"c%d" % rng.randrange(1000)
                tx.set(row, col, value)
                model[(row, col)] = value
    return model


def _interleave_own_writes(tx, model, rng, n_rows):
    """Sets between, on and beyond committed cells; deletes at and around the
    chunk boundaries and one long run of consecutive deletes."""
    model = dict(model)
    keys = sorted(model)
    for i in range(n_rows * 10 + 200):
        if rng.random() < 0.15:
            row = b"r%05d" % i
            col = rng.choice(COLS)
            value = b"own%d" % i
            tx.set(row, col, value)
            model[(row, col)] = value
    boundaries = [CHUNK * k + d for k in range(1, len(keys) // CHUNK + 1) for d in (-1, 0, 1)]
    run = range(CHUNK + 100, min(len(keys), 2 * CHUNK + 250))  # longer than a chunk
    for index in [*boundaries, *run, *rng.sample(range(len(keys)), 100)]:
        if index < len(keys):
            row, col = keys[index]
            tx.delete(row, col)
            model.pop((row, col), None)
    for _ in range(50):  # deletes of absent cells
        row, col = b"r%05d" % rng.randrange(n_rows * 10), rng.choice(COLS)
        if (row, col) not in model:
            tx.delete(row, col)
    return model


@pytest.mark.parametrize("seed", [1, 2])
def test_scan_merges_own_writes_across_chunks_like_a_model(env, seed):
    rng = random.Random(seed)
    n_rows = 1200  # ~2400 committed cells: several chunks
    committed = _populate(env, rng, n_rows)
    assert len(committed) > 3 * CHUNK
    tx = env.transaction()
    model = _interleave_own_writes(tx, committed, rng, n_rows)

    assert as_tuples(tx.scan()) == model_scan(model)
    for prefix in (b"r0", b"r01", b"r005"):
        assert as_tuples(tx.scan(prefix)) == model_scan(model, prefix=prefix)
    for start, end in [(b"r00500", b"r09000"), (None, b"r06000"), (b"r03333", None)]:
        assert as_tuples(tx.scan(start=start, end=end)) == model_scan(model, start=start, end=end)
    cols = [COLS[2]]
    assert as_tuples(tx.scan(columns=cols)) == model_scan(model, columns=cols)
    assert as_tuples(tx.scan(b"r0", columns=COLS[:2])) == model_scan(
        model, prefix=b"r0", columns=COLS[:2]
    )
    tx.commit()
    assert committed_cells(env) == model_scan(model)  # and it committed exactly that


def test_scan_of_only_own_writes_longer_than_a_chunk(env):
    tx = env.transaction()
    model = {}
    for i in range(3 * CHUNK + 7):
        row = b"own%06d" % i
        tx.set(row, COL, b"%d" % i)
        model[(row, (b"f", b"q"))] = b"%d" % i
    assert as_tuples(tx.scan()) == model_scan(model)
    assert as_tuples(tx.scan(b"own0010")) == model_scan(model, prefix=b"own0010")
    tx.abort()


def test_scan_where_own_writes_follow_a_long_snapshot(env):
    with env.transaction() as tx:
        for i in range(2 * CHUNK + 1):
            tx.set(b"a%05d" % i, COL, b"s")
    tx = env.transaction()
    for i in range(CHUNK + 3):
        tx.set(b"b%05d" % i, COL, b"o")
    tx.set(b"0first", COL, b"o")
    rows = [c.row for c in tx.scan()]
    assert rows[0] == b"0first"
    assert rows[1 : 2 * CHUNK + 2] == [b"a%05d" % i for i in range(2 * CHUNK + 1)]
    assert rows[2 * CHUNK + 2 :] == [b"b%05d" % i for i in range(CHUNK + 3)]
    tx.abort()


def test_scan_where_everything_in_the_snapshot_is_deleted(env):
    with env.transaction() as tx:
        for i in range(2 * CHUNK + 5):
            tx.set(b"r%05d" % i, COL, b"s")
    tx = env.transaction()
    for i in range(2 * CHUNK + 5):
        tx.delete(b"r%05d" % i, COL)
    tx.set(b"r%05d" % CHUNK, COL, b"back")
    assert as_tuples(tx.scan()) == [(b"r%05d" % CHUNK, (b"f", b"q"), b"back")]
    tx.commit()
    assert committed_cells(env) == [(b"r%05d" % CHUNK, (b"f", b"q"), b"back")]
