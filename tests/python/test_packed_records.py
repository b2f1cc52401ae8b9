"""Packed combine-queue records (cpp/src/queues/queue_rows.h, docs/storage.md):
one record per bucket an add touches, depths that count updates, stores of
format percolite/4 (single-entry records) read and retagged, and
``percolite check`` on packed records. The core's own tests of runs over
packed records are in tests/cpp/test_packed_records.cc."""

from __future__ import annotations

import struct

import percolite
from percolite._queue_rows import packed_entries
from percolite.testing import run_until_idle


def _app():
    app = percolite.App("packed")
    cq = app.combine_queue("cq", buckets=1, key_codec="bytes")
    return app, cq


def _records(tx):
    """(family, qualifier, value) of every cell of the queue's entry row."""
    return [(c[0], c[1], v) for _, c, v in tx.scan(prefix=b"cq:u:")]


def test_an_add_of_many_updates_writes_one_record_and_depth_counts_updates(tmp_path):
    app, cq = _app()
    with percolite.open(tmp_path / "db", app=app) as env:
        with env.transaction() as tx:
            cq.add(tx, [(f"k{i % 20}".encode(), i) for i in range(50)])
        with env.transaction() as tx:
            records = _records(tx)
            assert [(family, len(qualifier)) for family, qualifier, _ in records] == [(b"U", 12)]
            entries = packed_entries(records[0][2])
            assert [key for key, _ in entries] == [f"k{i % 20}".encode() for i in range(50)]
            assert cq.depth(tx) == 50
        assert env.queue_depths() == {"cq": 50}
        assert env.status()["queues"] == {"cq": 50}
        run_until_idle(env)
        with env.transaction() as tx:
            assert dict(cq.scan(tx)) == {f"k{k}".encode(): sum(range(k, 50, 20)) for k in range(20)}
            assert _records(tx) == []
            assert cq.depth(tx) == 0
    assert percolite.check(tmp_path / "db")["ok"]


def _stamp(commit_ts: int, index: int) -> bytes:
    return struct.pack(">QI", commit_ts, index)


def test_a_store_of_format_4_is_retagged_and_its_single_entry_records_fold(tmp_path):
    import lmdb

    path = tmp_path / "db"
    app, cq = _app()
    with percolite.open(path, app=app) as env:
        # Records as format 4 stored them: stamp + key in family "u", the
        # value as it is. Stamps of early commits: older than any to come.
        with env.transaction() as tx:
            for i, (key, value) in enumerate([(b"a", 1), (b"b", 2), (b"", 4), (b"a", 8)]):
                tx.set(b"cq:u:000000", (b"u", _stamp(1, i) + key), struct.pack(">q", value))
    raw = lmdb.open(str(path), max_dbs=8, subdir=True)
    with raw.begin(write=True) as txn:
        meta = raw.open_db(b"meta", txn=txn)
        assert txn.get(b"format", db=meta) == b"percolite/5"
        txn.put(b"format", b"percolite/4", db=meta)
    raw.close()
    with percolite.open(path, app=app) as env:
        with env.transaction() as tx:
            assert cq.depth(tx) == 4
            cq.add(tx, [(b"a", 16), (b"c", 32), (b"", 64)])
        with env.transaction() as tx:
            assert sorted(family for family, _, _ in _records(tx)) == [b"U"] + [b"u"] * 4
            assert cq.depth(tx) == 7
        run_until_idle(env)
        with env.transaction() as tx:
            assert dict(cq.scan(tx)) == {b"a": 25, b"b": 2, b"c": 32, b"": 68}
            assert _records(tx) == []
    raw = lmdb.open(str(path), max_dbs=8, subdir=True, readonly=True)
    with raw.begin() as txn:
        assert txn.get(b"format", db=raw.open_db(b"meta", txn=txn)) == b"percolite/5"
    raw.close()
    assert percolite.check(path)["ok"]


def test_check_reports_a_packed_record_that_does_not_decode(tmp_path):
    path = tmp_path / "db"
    app, cq = _app()
    with percolite.open(path, app=app) as env:
        with env.transaction() as tx:
            cq.add(tx, [(b"a", 1), (b"b", 2)])
        with env.transaction() as tx:
            [(family, qualifier, value)] = _records(tx)
        with env.transaction() as tx:
            tx.set(b"cq:u:000000", (family, qualifier), value[:-3])  # cut short
    report = percolite.check(path)
    assert not report["ok"]
    assert any(
        "packed queue record" in problem and "truncated" in problem
        for problem in report["problems"]
    ), report["problems"]
