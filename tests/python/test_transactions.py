"""Snapshot-isolation semantics of one store in one process.

Tests taking ``env`` or ``backend`` run on every backend; the ones at the end
reopen a store, which only a persistent backend can."""

from __future__ import annotations

import sys

import children.transactions
import percolite
import pytest
from _isolated import run_child
from conftest import COL, as_tuples, committed_cells, open_store

A = ("acct", "a")
B = ("acct", "b")


# -- snapshots and own writes -------------------------------------------------


def test_snapshot_excludes_commits_after_begin(env):
    with env.transaction() as tx:
        tx.set("r", COL, "v1")
    reader = env.transaction()
    with env.transaction() as tx:
        tx.set("r", COL, "v2")
        tx.set("new", COL, "x")
    assert reader.get("r", COL) == b"v1"
    assert reader.get("new", COL) is None
    assert [c.row for c in reader.scan()] == [b"r"]
    reader.abort()
    fresh = env.transaction()
    assert fresh.get("r", COL) == b"v2"
    assert fresh.get("new", COL) == b"x"
    fresh.abort()


def test_start_ts_names_the_snapshot(env):
    first = env.transaction()
    with env.transaction() as tx:
        tx.set("r", COL, "v")
    second = env.transaction()
    assert second.start_ts >= tx.commit_ts > first.start_ts
    first.abort()
    second.abort()


def test_get_sees_own_set_and_delete(env):
    with env.transaction() as tx:
        tx.set("kept", COL, "old")
        tx.set("gone", COL, "old")
    tx = env.transaction()
    tx.set("kept", COL, "new")
    tx.set("added", COL, "")
    tx.delete("gone", COL)
    assert tx.get("kept", COL) == b"new"
    assert tx.get("added", COL) == b""  # empty value is a value, not "absent"
    assert tx.get("gone", COL) is None
    assert tx.get("gone", COL, default=b"dflt") == b"dflt"
    assert tx.get_many([("kept", COL), ("gone", COL), ("added", COL)]) == [b"new", None, b""]
    # Not visible to others before commit.
    other = env.transaction()
    assert other.get("kept", COL) == b"old"
    assert other.get("gone", COL) == b"old"
    assert other.get("added", COL) is None
    other.abort()
    tx.commit()
    assert committed_cells(env) == [(b"added", (b"f", b"q"), b""), (b"kept", (b"f", b"q"), b"new")]


def test_set_after_delete_and_delete_after_set_in_one_transaction(env):
    with env.transaction() as tx:
        tx.set("a", COL, "1")
    with env.transaction() as tx:
        tx.delete("a", COL)
        tx.set("a", COL, "2")
        tx.set("b", COL, "3")
        tx.delete("b", COL)
        assert tx.get("a", COL) == b"2"
        assert tx.get("b", COL) is None
    assert committed_cells(env) == [(b"a", (b"f", b"q"), b"2")]


def test_column_and_tuple_and_str_and_bytes_are_interchangeable(env):
    with env.transaction() as tx:
        tx.set("row", percolite.Column("doc", "content"), "hello")
        tx.set(b"row", (b"doc", b"other"), b"x")
    tx = env.transaction()
    assert tx.get(b"row", ("doc", "content")) == b"hello"
    assert tx.get("row", percolite.Column(b"doc", b"content")) == b"hello"
    cells = list(tx.scan())
    assert cells[0] == percolite.Cell(b"row", percolite.Column("doc", "content"), b"hello")
    assert isinstance(cells[0].column, percolite.Column)
    assert (cells[0].column.family, cells[0].column.qualifier) == (b"doc", b"content")
    assert cells[1] == (b"row", (b"doc", b"other"), b"x")
    assert cells[0].column == (b"doc", b"content")
    tx.abort()


def test_str_means_utf8(env):
    with env.transaction() as tx:
        tx.set("zeilé", ("fämily", "quälifier"), "välue ✓")
    tx = env.transaction()
    assert tx.get("zeilé".encode(), ("fämily".encode(), "quälifier".encode())) == "välue ✓".encode()
    (cell,) = tx.scan()
    assert cell.row == "zeilé".encode()
    tx.abort()


# -- write skew -----------------------------------------------------------------


def test_write_skew_is_allowed(env):
    with env.transaction() as tx:
        tx.set("bank", A, "50")
        tx.set("bank", B, "50")
    t1 = env.transaction()
    t2 = env.transaction()
    # Invariant each one checks: a + b >= 100 after withdrawing 50 from one account.
    for t in (t1, t2):
        assert int(t.get("bank", A)) + int(t.get("bank", B)) == 100
    t1.set("bank", A, "0")
    t2.set("bank", B, "0")
    t1.commit()
    t2.commit()  # reads never conflict: plain snapshot isolation
    assert t1.state == t2.state == "committed"
    assert t2.commit_ts > t1.commit_ts
    tx = env.transaction()
    assert (tx.get("bank", A), tx.get("bank", B)) == (b"0", b"0")
    tx.abort()


def test_write_skew_is_documented():
    module_doc = sys.modules[percolite.Transaction.__module__].__doc__ or ""
    docs = (percolite.Transaction.__doc__ or "") + module_doc
    assert "write skew" in docs.lower()


# -- write-write conflicts --------------------------------------------------------


def test_commit_conflict_is_a_percolite_error():
    assert issubclass(percolite.CommitConflict, percolite.Error)
    assert issubclass(percolite.Error, Exception)


@pytest.mark.parametrize("existed", [True, False], ids=["cell-existed", "cell-absent"])
def test_set_after_concurrent_delete_conflicts_and_applies_nothing(env, existed):
    if existed:
        with env.transaction() as tx:
            tx.set("x", COL, "orig")
    setter = env.transaction()
    deleter = env.transaction()
    deleter.delete("x", COL)
    deleter.set("d-side", COL, "d")
    deleter.commit()
    assert deleter.commit_ts is not None

    setter.set("s1", COL, "1")
    setter.set("x", COL, "from-setter")
    setter.set("s2", ("other", ""), "2")
    setter.delete("zz", COL)
    with pytest.raises(percolite.CommitConflict, match=r"commit conflict on row b'x'") as info:
        setter.commit()
    assert isinstance(info.value, percolite.Error)
    assert setter.state == "aborted"
    assert setter.commit_ts is None
    assert committed_cells(env) == [(b"d-side", (b"f", b"q"), b"d")]


@pytest.mark.parametrize("existed", [True, False], ids=["cell-existed", "cell-absent"])
def test_delete_after_concurrent_set_conflicts_and_applies_nothing(env, existed):
    if existed:
        with env.transaction() as tx:
            tx.set("x", COL, "orig")
            tx.set("keep", COL, "k")
    deleter = env.transaction()
    setter = env.transaction()
    setter.set("x", COL, "from-setter")
    setter.commit()

    deleter.delete("x", COL)
    deleter.delete("keep", COL)
    deleter.set("d1", COL, "1")
    deleter.set("zz", COL, "2")
    with pytest.raises(percolite.CommitConflict, match=r"row b'x'"):
        deleter.commit()
    assert deleter.state == "aborted"
    expected = [(b"x", (b"f", b"q"), b"from-setter")]
    if existed:
        expected.insert(0, (b"keep", (b"f", b"q"), b"k"))
    assert committed_cells(env) == expected


def test_delete_conflicts_even_after_many_later_commits(env):
    """The deleter's tombstone must survive tombstone collection while an older
    snapshot that writes the cell is still open."""
    with env.transaction() as tx:
        tx.set("x", COL, "orig")
    old = env.transaction()
    with env.transaction() as tx:
        tx.delete("x", COL)
    for i in range(50):  # each commit runs tombstone collection
        with env.transaction() as tx:
            tx.set(f"other{i}", COL, "v")
            tx.delete(f"other{i}", COL)
    old.set("x", COL, "resurrected")
    with pytest.raises(percolite.CommitConflict):
        old.commit()
    tx = env.transaction()
    assert tx.get("x", COL) is None
    assert list(tx.scan()) == []
    tx.abort()


def test_tombstones_are_collected_once_no_reader_needs_them(env):
    with env.transaction() as tx:
        for i in range(20):
            tx.set(b"r%02d" % i, COL, b"v")
    with env.transaction() as tx:
        for i in range(20):
            tx.delete(b"r%02d" % i, COL)
    for i in range(5):  # later commits collect what no open snapshot can need
        with env.transaction() as tx:
            tx.set(b"other", COL, b"%d" % i)
    assert env.stats()["tombstones_collected"] == 20
    assert committed_cells(env) == [(b"other", (b"f", b"q"), b"4")]


def test_disjoint_writers_do_not_conflict(env):
    t1 = env.transaction()
    t2 = env.transaction()
    t1.set("r", ("f", "a"), "1")
    t2.set("r", ("f", "b"), "2")
    t1.commit()
    t2.commit()
    assert [v for _, _, v in committed_cells(env)] == [b"1", b"2"]


def test_conflict_with_the_same_value_still_conflicts(env):
    t1 = env.transaction()
    t2 = env.transaction()
    t1.set("r", COL, "same")
    t2.set("r", COL, "same")
    t1.commit()
    with pytest.raises(percolite.CommitConflict):
        t2.commit()


def test_reads_alone_never_conflict(env):
    with env.transaction() as tx:
        tx.set("r", COL, "1")
    reader = env.transaction()
    assert reader.get("r", COL) == b"1"
    with env.transaction() as tx:
        tx.set("r", COL, "2")
    reader.set("elsewhere", COL, "x")
    reader.commit()
    assert reader.state == "committed"


# -- context manager, commit_ts ------------------------------------------------


def test_context_manager_commits_on_clean_exit(env):
    with env.transaction() as tx:
        tx.set("r", COL, "v")
        assert tx.state == "active"
        assert tx.commit_ts is None
    assert tx.state == "committed"
    assert isinstance(tx.commit_ts, int)
    assert committed_cells(env) == [(b"r", (b"f", b"q"), b"v")]


def test_context_manager_aborts_on_exception(env):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with env.transaction() as tx:
            tx.set("r", COL, "v")
            tx.set("s", COL, "w")
            raise Boom()
    assert tx.state == "aborted"
    assert tx.commit_ts is None
    assert committed_cells(env) == []


def test_context_manager_after_explicit_commit_or_abort(env):
    with env.transaction() as tx:
        tx.set("r", COL, "v")
        tx.commit()
    assert tx.state == "committed"
    with env.transaction() as tx2:
        tx2.set("s", COL, "w")
        tx2.abort()
    assert tx2.state == "aborted"
    assert committed_cells(env) == [(b"r", (b"f", b"q"), b"v")]


def test_commit_ts_unique_and_increasing(env):
    seen = []
    for i in range(20):
        with env.transaction() as tx:
            tx.set(f"r{i % 3}", COL, str(i))
        seen.append(tx.commit_ts)
    assert all(isinstance(ts, int) for ts in seen)
    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)
    later = env.transaction()
    assert later.start_ts >= seen[-1]
    later.abort()


def test_commit_ts_none_for_read_only_transaction(env):
    with env.transaction() as tx:
        tx.set("r", COL, "v")
    before = tx.commit_ts
    with env.transaction() as ro:
        assert ro.get("r", COL) == b"v"
        list(ro.scan())
    assert ro.state == "committed"
    assert ro.commit_ts is None
    with env.transaction() as tx:
        tx.set("r", COL, "w")
    assert tx.commit_ts > before


def test_aborted_transaction_applies_nothing(env):
    tx = env.transaction()
    tx.set("r", COL, "v")
    tx.abort()
    tx.abort()  # idempotent
    assert tx.state == "aborted"
    assert committed_cells(env) == []


# -- Env.run ----------------------------------------------------------------------


def test_run_returns_result_and_commits(env):
    def fn(tx):
        tx.set("r", COL, "v")
        return ("result", tx)

    result, tx = env.run(fn)
    assert result == "result"
    assert tx.state == "committed"
    assert tx.commit_ts is not None
    assert committed_cells(env) == [(b"r", (b"f", b"q"), b"v")]


def test_run_retries_on_conflict(env):
    calls = []

    def fn(tx):
        calls.append(tx.start_ts)
        value = int(tx.get("ctr", COL, b"0"))
        if len(calls) == 1:
            with env.transaction() as other:  # a concurrent writer sneaks in
                other.set("ctr", COL, "10")
        tx.set("ctr", COL, str(value + 1))
        return value + 1

    assert env.run(fn, backoff=0) == 11
    assert len(calls) == 2
    assert calls[1] > calls[0]
    tx = env.transaction()
    assert tx.get("ctr", COL) == b"11"
    tx.abort()


def test_run_gives_up_after_retries(env):
    calls = []

    def always_conflicts(tx):
        calls.append(1)
        tx.get("ctr", COL)
        with env.transaction() as other:
            other.set("ctr", COL, str(len(calls)))
        tx.set("ctr", COL, "mine")
        tx.set("side", COL, "effect")

    with pytest.raises(percolite.CommitConflict):
        env.run(always_conflicts, retries=2, backoff=0)
    assert len(calls) == 3
    tx = env.transaction()
    assert tx.get("ctr", COL) == b"3"
    assert tx.get("side", COL) is None
    tx.abort()


def test_run_does_not_retry_other_exceptions(env):
    calls = []

    def fails(tx):
        calls.append(1)
        tx.set("r", COL, "v")
        raise KeyError("nope")

    with pytest.raises(KeyError):
        env.run(fails)
    assert calls == [1]
    assert committed_cells(env) == []


def test_run_accepts_fn_that_commits_itself(env):
    def fn(tx):
        tx.set("r", COL, "v")
        tx.commit()
        return tx.commit_ts

    assert isinstance(env.run(fn), int)
    assert committed_cells(env) == [(b"r", (b"f", b"q"), b"v")]


# -- closing under a transaction ----------------------------------------------------


def test_run_raises_closed_error_when_store_closes_during_fn(tmp_path, backend):
    """Regression: env.run returned fn's result without committing when the
    store was closed while fn ran, so a caller counted a commit that never
    happened."""
    path = tmp_path / "db"
    env = open_store(backend, path, sync="none")
    persistent = env.capabilities["persistent"]
    began = []

    def fn(tx):
        began.append(tx)
        tx.set("r", COL, "v")
        env.close()
        return "result"

    with pytest.raises(percolite.ClosedError):
        env.run(fn)
    assert [(tx.state, tx.commit_ts) for tx in began] == [("closed", None)]
    if persistent:  # a memory store is gone with its handle: nothing to reopen
        with open_store(backend, path, sync="none") as again, again.transaction() as tx:
            assert tx.get("r", COL) is None


def test_with_block_raises_closed_error_when_store_closes_inside(tmp_path, backend):
    """Regression: leaving a `with env.transaction()` block whose store was
    closed inside it silently committed nothing."""
    env = open_store(backend, tmp_path / "db", sync="none")
    with pytest.raises(percolite.ClosedError):
        with env.transaction() as tx:
            tx.set("r", COL, "v")
            env.close()
    assert tx.state == "closed"


# -- persistence (lmdb only: a store reopened by path, on-disk format) ----------------


def test_reopen_persistence(store_path):
    env = percolite.open(store_path)  # default sync="full"
    with env.transaction() as tx:
        tx.set("r1", COL, "v1")
        tx.set("r2", ("g", ""), b"\x00\xff")
    with env.transaction() as tx:
        tx.delete("r1", COL)
        tx.set("r3", COL, "v3")
    last_ts = tx.commit_ts
    env.close()
    assert env.closed

    env = percolite.open(store_path, create=False)
    tx = env.transaction()
    assert tx.start_ts >= last_ts
    assert tx.get("r1", COL) is None
    assert as_tuples(tx.scan()) == [
        (b"r2", (b"g", b""), b"\x00\xff"),
        (b"r3", (b"f", b"q"), b"v3"),
    ]
    tx.abort()
    with env.transaction() as tx:
        tx.set("r4", COL, "v4")
    assert tx.commit_ts > last_ts  # the timestamp counter persisted too
    env.close()


def test_reopen_in_another_process_sees_commits(store_path):
    with percolite.open(store_path) as env:
        with env.transaction() as tx:
            tx.set("persisted", COL, "yes")
    out = run_child(children.transactions.print_persisted, store_path, timeout=30)
    assert out.strip() == "b'yes'"


def test_a_store_of_another_format_is_refused_naming_both(tmp_path):
    import lmdb

    path = tmp_path / "db"
    percolite.open(path).close()
    raw = lmdb.open(str(path), max_dbs=8, subdir=True)
    with raw.begin(write=True) as txn:
        meta = raw.open_db(b"meta", txn=txn)
        assert txn.get(b"format", db=meta) == b"percolite/5"
        txn.put(b"format", b"percolite/2", db=meta)  # queue entries keyed by key, then stamp
    raw.close()
    with pytest.raises(
        percolite.CorruptionError, match="format is 'percolite/2'.*reads 'percolite/5'"
    ):
        percolite.open(path)


def test_a_store_of_the_format_before_checksums_is_upgraded_on_open(tmp_path):
    """Format 3 wrote records without the checksum that format 4 ends each
    one with: opening such a store adds them, in one LMDB transaction."""
    import lmdb

    path = tmp_path / "db"
    app = percolite.App("upgrade")

    @app.observer(("doc", "text"))
    def noop(tx, row, col):
        pass

    with percolite.open(path, app=app) as env:
        with env.transaction() as tx:
            for i in range(300):
                tx.set(f"r{i:04}", ("doc", "text"), f"value {i}")
            tx.set("x" * 700, COL, "a long row")  # stored under a hashed key
        expected = {(r, c): v for r, c, v in env.transaction().scan()}
        pending = env.status()["pending"]
    assert pending == 300
    raw = lmdb.open(str(path), max_dbs=8, subdir=True)
    with raw.begin(write=True) as txn:
        for table in (b"data", b"notify", b"ack"):
            db = raw.open_db(table, txn=txn)
            for key, record in list(txn.cursor(db=db)):
                txn.put(key, record[:-4], db=db)  # the record as format 3 wrote it
        txn.put(b"format", b"percolite/3", db=raw.open_db(b"meta", txn=txn))
    raw.close()
    with percolite.open(path, app=app) as env:
        assert {(r, c): v for r, c, v in env.transaction().scan()} == expected
        assert env.status()["pending"] == 300
    assert percolite.check(path)["ok"]
    raw = lmdb.open(str(path), max_dbs=8, subdir=True, readonly=True)
    with raw.begin() as txn:
        assert txn.get(b"format", db=raw.open_db(b"meta", txn=txn)) == b"percolite/5"
    raw.close()
