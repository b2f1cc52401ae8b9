"""Byte strings of any length and content round-trip exactly:
rows beyond LMDB's 511-byte key limit, every byte value, empty and large values."""

from __future__ import annotations

import os
import random

import percolite
import pytest
from conftest import COL, as_tuples, committed_cells
from percolite import _transaction

CHUNK = _transaction._SCAN_CHUNK
ALL_BYTES = bytes(range(256))


@pytest.mark.parametrize("length", [1, 479, 480, 481, 511, 512, 600, 5000, 100_000])
def test_long_row_round_trips_via_get_and_scan(env, length):
    row = bytes((i * 7 + 3) % 256 for i in range(length))
    neighbours = [row[:-1] + bytes([(row[-1] - 1) % 256]), row + b"\x00", row[: length // 2]]
    neighbours = [r for r in neighbours if r and r != row]
    with env.transaction() as tx:
        tx.set(row, COL, b"value")
        for i, other in enumerate(neighbours):
            tx.set(other, COL, b"n%d" % i)
    tx = env.transaction()
    assert tx.get(row, COL) == b"value"
    expected = sorted(
        [(row, (b"f", b"q"), b"value")]
        + [(r, (b"f", b"q"), b"n%d" % i) for i, r in enumerate(neighbours)]
    )
    assert as_tuples(tx.scan()) == expected
    assert as_tuples(tx.scan(row)) == [c for c in expected if c[0].startswith(row)]
    assert as_tuples(tx.scan(start=row)) == [c for c in expected if c[0] >= row]
    assert as_tuples(tx.scan(end=row)) == [c for c in expected if c[0] < row]
    tx.abort()


def test_long_family_and_qualifier_round_trip(env):
    family = b"F" * 3000
    qualifier = ALL_BYTES * 20
    with env.transaction() as tx:
        tx.set(b"r", (family, qualifier), b"v1")
        tx.set(b"r", (family, qualifier + b"\x00"), b"v2")
        tx.set(b"r", (family, b""), b"v0")
    tx = env.transaction()
    assert tx.get(b"r", (family, qualifier)) == b"v1"
    assert as_tuples(tx.scan()) == [
        (b"r", (family, b""), b"v0"),
        (b"r", (family, qualifier), b"v1"),
        (b"r", (family, qualifier + b"\x00"), b"v2"),
    ]
    tx.abort()


def test_many_long_rows_sharing_a_long_prefix_scan_in_exact_order(env):
    """Rows whose encoded keys agree beyond LMDB's key limit (so the store keys
    them by hash) must still scan in byte order, across scan chunks, merged
    with own writes."""
    rng = random.Random(7)
    common = b"P" * 700
    suffixes = {
        bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))) for _ in range(CHUNK + 300)
    }
    model = {}
    with env.transaction() as tx:
        for s in suffixes:
            row = common + s
            tx.set(row, COL, s)
            model[row] = s
        # Neighbours outside the group, before and after it.
        for row in (b"P" * 699, b"P" * 699 + b"Q", b"O" + b"P" * 800, b"Q"):
            tx.set(row, COL, b"out")
            model[row] = b"out"
    tx = env.transaction()
    rows_in_group = sorted(r for r in model if r.startswith(common))
    for row in rng.sample(rows_in_group, 40):
        tx.delete(row, COL)
        del model[row]
    for i in range(60):
        row = common + bytes(rng.randrange(256) for _ in range(rng.randint(1, 7)))
        tx.set(row, COL, b"own%d" % i)
        model[row] = b"own%d" % i
    expected = [(r, (b"f", b"q"), model[r]) for r in sorted(model)]
    assert as_tuples(tx.scan()) == expected
    assert as_tuples(tx.scan(common)) == [c for c in expected if c[0].startswith(common)]
    lo, hi = sorted(rng.sample(sorted(model), 2))
    assert as_tuples(tx.scan(start=lo, end=hi)) == [c for c in expected if lo <= c[0] < hi]
    for row in rng.sample(sorted(model), 20):
        assert tx.get(row, COL) == model[row]
    tx.commit()
    assert committed_cells(env) == expected


def test_long_row_conflicts_like_a_short_one(env):
    row = b"x" * 5000
    with env.transaction() as tx:
        tx.set(row, COL, b"0")
    t1 = env.transaction()
    t2 = env.transaction()
    t1.delete(row, COL)
    t2.set(row, COL, b"2")
    t2.set(row + b"y", COL, b"other")  # a distinct long key with the same hashed prefix
    t1.commit()
    with pytest.raises(percolite.CommitConflict):
        t2.commit()
    assert committed_cells(env) == []


def test_all_byte_values_round_trip(env):
    rows = [bytes([b]) for b in range(256)] + [
        ALL_BYTES,
        b"\x00",
        b"\x00\x00",
        b"\x00\x01",
        b"\xff\x00",
    ]
    rows = sorted(set(rows))
    with env.transaction() as tx:
        for row in rows:
            tx.set(row, (ALL_BYTES, ALL_BYTES[::-1]), row + ALL_BYTES)
        tx.set(b"value", COL, ALL_BYTES)
    tx = env.transaction()
    for row in rows:
        assert tx.get(row, (ALL_BYTES, ALL_BYTES[::-1])) == row + ALL_BYTES
    assert tx.get(b"value", COL) == ALL_BYTES
    expected = sorted(
        [(row, (ALL_BYTES, ALL_BYTES[::-1]), row + ALL_BYTES) for row in rows]
        + [(b"value", (b"f", b"q"), ALL_BYTES)]
    )
    assert as_tuples(tx.scan()) == expected
    assert as_tuples(tx.scan(b"\x00")) == [c for c in expected if c[0].startswith(b"\x00")]
    assert as_tuples(tx.scan(start=b"\x00\x01", end=b"\x01")) == [
        c for c in expected if b"\x00\x01" <= c[0] < b"\x01"
    ]
    tx.abort()


def test_empty_value_and_empty_qualifier(env):
    with env.transaction() as tx:
        tx.set(b"r", (b"f", b""), b"")
    tx = env.transaction()
    assert tx.get(b"r", (b"f", b"")) == b""
    assert tx.get(b"r", (b"f", b""), default=b"absent") == b""
    assert as_tuples(tx.scan()) == [(b"r", (b"f", b""), b"")]
    assert tx.get(b"r", (b"f", b"x")) is None
    tx.abort()


def test_large_value_round_trips(env):
    big = os.urandom(5 * 1024 * 1024)
    with env.transaction() as tx:
        tx.set(b"big", COL, big)
        tx.set(b"small", COL, b"s")
    tx = env.transaction()
    assert tx.get(b"big", COL) == big
    assert as_tuples(tx.scan()) == [(b"big", (b"f", b"q"), big), (b"small", (b"f", b"q"), b"s")]
    tx.abort()


def test_bytearray_and_memoryview_are_taken_as_bytes(env):
    """cpp/bindings/module.cc: "bytes, bytearray and memoryview are taken as they are"."""
    data = ALL_BYTES * 4
    with env.transaction() as tx:
        tx.set(bytearray(b"r1"), (bytearray(b"f"), b"q"), bytearray(data))
        tx.set(b"r2", COL, memoryview(data)[10:300])
        tx.set(memoryview(b"r3"), (memoryview(b"f"), memoryview(b"q")), b"v")
    tx = env.transaction()
    assert tx.get(b"r1", COL) == data
    assert tx.get(memoryview(b"r2"), COL) == data[10:300]
    assert as_tuples(tx.scan()) == [
        (b"r1", (b"f", b"q"), data),
        (b"r2", (b"f", b"q"), data[10:300]),
        (b"r3", (b"f", b"q"), b"v"),
    ]
    tx.abort()


def test_values_come_back_as_bytes(env):
    with env.transaction() as tx:
        tx.set("r", COL, "text")
    tx = env.transaction()
    assert type(tx.get("r", COL)) is bytes
    (cell,) = tx.scan()
    assert type(cell.row) is bytes and type(cell.value) is bytes
    assert all(type(part) is bytes for part in cell.column)
    tx.abort()


def test_store_grows_past_its_initial_map_size(store_path):
    """The map grows by itself: no MapFull for users.
    lmdb only: a memory store has no map."""
    env = percolite.open(store_path, sync="none", map_size=1 << 20)
    value = os.urandom(256 * 1024)
    for i in range(16):  # 4 MiB into a 1 MiB map
        with env.transaction() as tx:
            tx.set(b"r%02d" % i, COL, value)
    tx = env.transaction()
    assert [c.row for c in tx.scan()] == [b"r%02d" % i for i in range(16)]
    assert all(c.value == value for c in tx.scan())
    tx.abort()
    assert env.stats()["map_size"] > 1 << 20
    env.close()
