"""Misuse and bad input: each raises one specific exception whose message names
what was wrong, and nothing is written."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

import children.bad_input
import percolite
import pytest
from _isolated import run_child
from conftest import COL, committed_cells, open_store

# -- bad arguments to a transaction ----------------------------------------------

BAD_CALLS = [
    # (id, call, exception, message pattern)
    (
        "int-row-set",
        lambda tx: tx.set(1, COL, b"v"),
        TypeError,
        r"row must be bytes or str, not int",
    ),
    ("int-row-get", lambda tx: tx.get(1, COL), TypeError, r"row must be bytes or str, not int"),
    (
        "int-row-delete",
        lambda tx: tx.delete(7, COL),
        TypeError,
        r"row must be bytes or str, not int",
    ),
    (
        "none-row",
        lambda tx: tx.set(None, COL, b"v"),
        TypeError,
        r"row must be bytes or str, not NoneType",
    ),
    (
        "none-value",
        lambda tx: tx.set(b"r", COL, None),
        TypeError,
        r"value must be bytes or str, not NoneType",
    ),
    (
        "int-value",
        lambda tx: tx.set(b"r", COL, 5),
        TypeError,
        r"value must be bytes or str, not int",
    ),
    ("empty-row-set", lambda tx: tx.set(b"", COL, b"v"), ValueError, r"row must not be empty"),
    ("empty-str-row-set", lambda tx: tx.set("", COL, b"v"), ValueError, r"row must not be empty"),
    ("empty-row-get", lambda tx: tx.get(b"", COL), ValueError, r"row must not be empty"),
    ("empty-row-delete", lambda tx: tx.delete(b"", COL), ValueError, r"row must not be empty"),
    (
        "empty-family-set",
        lambda tx: tx.set(b"r", (b"", b"q"), b"v"),
        ValueError,
        r"column family must not be empty",
    ),
    (
        "empty-family-delete",
        lambda tx: tx.delete(b"r", ("", "q")),
        ValueError,
        r"column family must not be empty",
    ),
    (
        "empty-family-get",
        lambda tx: tx.get(b"r", ("", "")),
        ValueError,
        r"column family must not be empty",
    ),
    (
        "column-1-tuple",
        lambda tx: tx.set(b"r", ("f",), b"v"),
        TypeError,
        r"column must be a \(family, qualifier\) tuple.*1 item",
    ),
    (
        "column-3-tuple",
        lambda tx: tx.set(b"r", ("f", "q", "x"), b"v"),
        TypeError,
        r"column must be a \(family, qualifier\) tuple.*3 item",
    ),
    (
        "column-str",
        lambda tx: tx.set(b"r", "fq", b"v"),
        TypeError,
        r"column must be a \(family, qualifier\) tuple.*str",
    ),
    (
        "column-list",
        lambda tx: tx.set(b"r", ["f", "q"], b"v"),
        TypeError,
        r"column must be a \(family, qualifier\) tuple.*list",
    ),
    (
        "column-none",
        lambda tx: tx.delete(b"r", None),
        TypeError,
        r"column must be a \(family, qualifier\) tuple.*NoneType",
    ),
    (
        "family-int",
        lambda tx: tx.set(b"r", (1, b"q"), b"v"),
        TypeError,
        r"column family must be bytes or str, not int",
    ),
    (
        "qualifier-none",
        lambda tx: tx.set(b"r", (b"f", None), b"v"),
        TypeError,
        r"column qualifier must be bytes or str, not NoneType",
    ),
    (
        "scan-prefix-int",
        lambda tx: list(tx.scan(5)),
        TypeError,
        r"prefix must be bytes or str, not int",
    ),
    (
        "scan-start-int",
        lambda tx: list(tx.scan(start=5)),
        TypeError,
        r"start must be bytes or str, not int",
    ),
    (
        "scan-end-int",
        lambda tx: list(tx.scan(end=5.0)),
        TypeError,
        r"end must be bytes or str, not float",
    ),
    (
        "scan-bad-column",
        lambda tx: list(tx.scan(columns=["fq"])),
        TypeError,
        r"column must be a \(family, qualifier\) tuple",
    ),
    (
        "scan-columns-bare-tuple",
        lambda tx: list(tx.scan(columns=("f", "q"))),
        TypeError,
        r"column must be a \(family, qualifier\) tuple",
    ),
    (
        "scan-prefix-and-range",
        lambda tx: list(tx.scan(b"a", start=b"b")),
        ValueError,
        r"either prefix or start/end",
    ),
    (
        "get-many-not-pairs",
        lambda tx: tx.get_many([b"r"]),
        TypeError,
        r"get_many takes \(row, column\) pairs",
    ),
    (
        "get-many-int-row",
        lambda tx: tx.get_many([(3, COL)]),
        TypeError,
        r"row must be bytes or str, not int",
    ),
]


@pytest.mark.parametrize(
    "call, exc, message", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_argument_raises_and_writes_nothing(env, call, exc, message):
    tx = env.transaction()
    with pytest.raises(exc, match=message) as info:
        call(tx)
    assert not isinstance(info.value, percolite.Error)
    # The transaction is still usable, and nothing was buffered by the bad call.
    assert tx.state == "active"
    assert list(tx.scan()) == []
    tx.commit()
    assert tx.commit_ts is None  # it wrote nothing
    assert committed_cells(env) == []


def test_bad_argument_leaves_earlier_writes_of_the_transaction_alone(env):
    tx = env.transaction()
    tx.set(b"good", COL, b"v")
    with pytest.raises(TypeError, match="value"):
        tx.set(b"bad", COL, None)
    with pytest.raises(ValueError, match="row"):
        tx.set(b"", COL, b"v")
    tx.commit()
    assert committed_cells(env) == [(b"good", (b"f", b"q"), b"v")]


def test_column_constructor_validates():
    with pytest.raises(ValueError, match="column family must not be empty"):
        percolite.Column("", "q")
    with pytest.raises(TypeError, match="column family must be bytes or str, not int"):
        percolite.Column(1, "q")
    with pytest.raises(TypeError, match="column qualifier must be bytes or str, not NoneType"):
        percolite.Column("f", None)
    assert percolite.Column("f") == (b"f", b"")


# -- ended transactions -------------------------------------------------------------


def _ended_uses(tx):
    return [
        lambda: tx.get(b"r", COL),
        lambda: tx.get_many([(b"r", COL)]),
        lambda: tx.set(b"r", COL, b"v"),
        lambda: tx.delete(b"r", COL),
        lambda: list(tx.scan()),
        lambda: tx.commit(),
    ]


@pytest.mark.parametrize("ending", ["committed", "aborted", "conflicted"])
def test_using_an_ended_transaction_raises(env, ending):
    tx = env.transaction()
    tx.set(b"mine", COL, b"v")
    if ending == "committed":
        tx.commit()
    elif ending == "aborted":
        tx.abort()
    else:
        with env.transaction() as other:
            other.set(b"mine", COL, b"theirs")
        with pytest.raises(percolite.CommitConflict):
            tx.commit()
    before = committed_cells(env)
    word = "committed" if ending == "committed" else "aborted"
    for use in _ended_uses(tx):
        with pytest.raises(percolite.Error, match=f"already {word}") as info:
            use()
        assert not isinstance(info.value, percolite.ClosedError)
    tx.abort()  # idempotent, never raises
    assert tx.state == ("committed" if ending == "committed" else "aborted")
    assert committed_cells(env) == before


def test_context_manager_on_an_ended_transaction_does_not_commit_again(env):
    tx = env.transaction()
    tx.set(b"r", COL, b"v")
    tx.commit()
    ts = tx.commit_ts
    with tx:
        pass
    assert tx.commit_ts == ts


# -- closed stores --------------------------------------------------------------


def test_env_transaction_after_close_raises_closed_error(backend, store_path):
    env = open_store(backend, store_path, sync="none")
    env.close()
    env.close()  # idempotent
    assert env.closed
    with pytest.raises(percolite.ClosedError, match="closed") as info:
        env.transaction()
    assert env.path in str(info.value)
    with pytest.raises(percolite.ClosedError, match="closed"):
        env.stats()
    with pytest.raises(percolite.ClosedError):
        env.run(lambda tx: None)
    assert isinstance(percolite.ClosedError("x"), percolite.Error)


def test_transaction_begun_before_close_raises_closed_error(backend, store_path):
    env = open_store(backend, store_path, sync="none")
    persistent = env.capabilities["persistent"]
    with env.transaction() as tx:
        tx.set(b"kept", COL, b"v")
    reader = env.transaction()
    writer = env.transaction()
    writer.set(b"lost", COL, b"v")
    env.close()
    assert writer.state == "closed"  # close aborts unfinished transactions
    for tx in (reader, writer):
        for use in _ended_uses(tx):
            with pytest.raises(percolite.ClosedError, match="closed"):
                use()
        tx.abort()  # still never raises
    if persistent:  # a memory store is gone with its handle: nothing to reopen
        with open_store(backend, store_path, sync="none") as env2:
            assert committed_cells(env2) == [(b"kept", (b"f", b"q"), b"v")]


def test_context_manager_closes_the_env(backend, store_path):
    with open_store(backend, store_path, sync="none") as env:
        assert not env.closed
    assert env.closed
    with pytest.raises(percolite.ClosedError):
        env.transaction()


# -- opening ------------------------------------------------------------------


def test_second_open_of_the_same_path_shares_the_store(store_path):
    """lmdb only: each open of ":memory:" is a private store (test_backends)."""
    first = percolite.open(store_path, sync="none")
    second = percolite.open(str(store_path) + "/", sync="none")  # another spelling
    assert second is not first
    assert first.path == second.path == os.path.realpath(store_path)
    with first.transaction() as tx:
        tx.set(b"from-first", COL, b"1")
    with second.transaction() as tx:
        assert tx.get(b"from-first", COL) == b"1"
        tx.set(b"from-second", COL, b"2")
    # Conflicts are detected across the two handles.
    t1, t2 = first.transaction(), second.transaction()
    t1.set(b"x", COL, b"1")
    t2.set(b"x", COL, b"2")
    t1.commit()
    with pytest.raises(percolite.CommitConflict):
        t2.commit()
    # Closing one handle leaves the other working.
    first.close()
    assert second.transaction().get(b"from-second", COL) == b"2"
    with second.transaction() as tx:
        tx.set(b"after", COL, b"3")
    assert [c[0] for c in committed_cells(second)] == [
        b"after",
        b"from-first",
        b"from-second",
        b"x",
    ]
    second.close()


def test_second_open_with_a_different_sync_raises_value_error(store_path):
    """lmdb only: handles on one path share a store (and its sync mode)."""
    with percolite.open(store_path, sync="none") as env:
        with pytest.raises(
            ValueError, match=r"already open in this process with sync='none'.*sync='full'"
        ):
            percolite.open(store_path)
        with pytest.raises(ValueError, match="sync='meta'"):
            percolite.open(store_path, sync="meta")
        with env.transaction() as tx:  # the refused open did not disturb it
            tx.set(b"r", COL, b"v")
    # Once every handle is closed, another sync mode is fine.
    with percolite.open(store_path, sync="meta") as env:
        assert committed_cells(env) == [(b"r", (b"f", b"q"), b"v")]


@pytest.mark.parametrize("sync", ["fast", "", "FULL", None, 1])
def test_bad_sync_value_raises_value_error(backend, store_path, sync):
    with pytest.raises(ValueError, match="sync must be one of 'full', 'meta', 'none'"):
        open_store(backend, store_path, sync=sync)
    assert not store_path.exists()


def test_other_bad_open_arguments(backend, store_path):
    with pytest.raises(TypeError, match="path must be str or os.PathLike, not int"):
        percolite.open(3, backend=backend)
    with pytest.raises(ValueError, match="mode"):
        open_store(backend, store_path, mode=0o1777)
    with pytest.raises(ValueError, match="map_size"):
        open_store(backend, store_path, map_size=1000)
    with pytest.raises(ValueError, match="max_readers"):
        open_store(backend, store_path, max_readers=0)
    with pytest.raises(TypeError, match="mode must be an int"):
        open_store(backend, store_path, mode="0600")
    assert not store_path.exists()


def test_bad_run_arguments(env):
    with pytest.raises(ValueError, match="retries must be >= 0 or None"):
        env.run(lambda tx: None, retries=-1)
    with pytest.raises(TypeError, match="fn must be callable, not str"):
        env.run("not callable")
    assert committed_cells(env) == []


# lmdb only from here on: a store directory on disk (paths, files, permissions).


def test_open_with_create_false_on_missing_path_raises_storage_error(store_path):
    with pytest.raises(percolite.StorageError, match=r"no such directory") as info:
        percolite.open(store_path, create=False)
    assert str(store_path) in str(info.value)
    assert not store_path.exists()


def test_open_of_a_file_raises_storage_error(tmp_path):
    path = tmp_path / "a-file"
    path.write_bytes(b"not a store")
    with pytest.raises(percolite.StorageError, match=r"is a file, not a directory") as info:
        percolite.open(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == b"not a store"


def test_open_with_a_missing_parent_raises_storage_error(tmp_path):
    with pytest.raises(percolite.StorageError, match="creating store directory"):
        percolite.open(tmp_path / "no" / "such" / "parent")


def test_store_directory_and_files_are_private_by_default(store_path):
    old = os.umask(0)  # the modes must not rely on the umask to be private
    try:
        env = percolite.open(store_path, sync="none")
    finally:
        os.umask(old)
    try:
        with env.transaction() as tx:
            tx.set(b"r", COL, b"v")
        assert stat.S_IMODE(os.stat(store_path).st_mode) == 0o700
        files = sorted(os.listdir(store_path))
        assert files  # the data and lock files
        for name in files:
            assert stat.S_IMODE(os.stat(store_path / name).st_mode) == 0o600, name
    finally:
        env.close()


def test_store_mode_argument_sets_directory_and_file_modes(store_path):
    old = os.umask(0)
    try:
        env = percolite.open(store_path, sync="none", mode=0o640)
    finally:
        os.umask(old)
    env.close()
    assert stat.S_IMODE(os.stat(store_path).st_mode) == 0o750
    for name in os.listdir(store_path):
        assert stat.S_IMODE(os.stat(store_path / name).st_mode) == 0o640, name


# -- read-only directories (as an unprivileged user) --------------------------------


@pytest.fixture
def read_only_dir():
    """A fresh directory under /tmp that others may traverse, holding a 0o555
    subdirectory (not under tmp_path: pytest makes that 0o700)."""
    top = tempfile.mkdtemp(prefix="percolite-ro-", dir="/tmp")
    os.chmod(top, 0o755)
    ro = os.path.join(top, "ro")
    os.mkdir(ro)
    os.chmod(ro, 0o555)
    yield ro
    os.chmod(ro, 0o755)
    shutil.rmtree(top)


def test_open_inside_a_read_only_directory_raises_storage_error(read_only_dir):
    target = os.path.join(read_only_dir, "store")
    out = run_child(
        children.bad_input.open_in_read_only_directory, read_only_dir, target, timeout=30
    )
    assert "StorageError:" in out
    assert target in out and "permission denied" in out.lower()
    assert not os.path.exists(target)


def test_open_of_a_read_only_directory_raises_storage_error(read_only_dir):
    out = run_child(
        children.bad_input.open_in_read_only_directory, read_only_dir, read_only_dir, timeout=30
    )
    assert "StorageError:" in out
    assert read_only_dir in out and "permission denied" in out.lower()
    assert os.listdir(read_only_dir) == []


# -- the bad-input table of entry points beyond transactions ----------------------


def _store_snapshot(path) -> dict:
    return {
        name: (path / name).read_bytes()
        for name in sorted(os.listdir(path))
        if name not in ("lock.mdb", "waiting")  # reader slots and wake-ups change
    }


ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    ("open-nul", lambda env, d, q: percolite.open(str(d / "a\0b")), ValueError, r"NUL byte"),
    (
        "open-create-str",
        lambda env, d, q: percolite.open(d / "c", create="no"),
        TypeError,
        r"create must be True or False, not str",
    ),
    (
        "open-upgrade-int",
        lambda env, d, q: percolite.open(d / "c", upgrade=1),
        TypeError,
        r"upgrade must be True or False, not int",
    ),
    (
        "wait-nan",
        lambda env, d, q: env.wait(timeout=float("nan")),
        ValueError,
        r"timeout must be >= 0 or None, not nan",
    ),
    ("wait-negative", lambda env, d, q: env.wait(timeout=-1), ValueError, r"timeout must be >= 0"),
    (
        "wait-str",
        lambda env, d, q: env.wait(timeout="1"),
        TypeError,
        r"timeout must be a number or None, not str",
    ),
    (
        "run-backoff",
        lambda env, d, q: env.run(q["never"], backoff=-1),
        ValueError,
        r"backoff must be a finite number >= 0, not -1",
    ),
    (
        "run-max-backoff-nan",
        lambda env, d, q: env.run(q["never"], max_backoff=float("nan")),
        ValueError,
        r"max_backoff must be a finite number >= 0",
    ),
    (
        "run-retries-float",
        lambda env, d, q: env.run(q["never"], retries=1.5),
        TypeError,
        r"retries must be an int or None, not float",
    ),
    (
        "run-retries-negative",
        lambda env, d, q: env.run(q["never"], retries=-1),
        ValueError,
        r"retries must be >= 0",
    ),
    (
        "cq-add-no-tx",
        lambda env, d, q: q["cq"].add(None, {"a": 1}),
        TypeError,
        r"combine queue 'cq': add needs a percolite.Transaction",
    ),
    (
        "cq-get-no-tx",
        lambda env, d, q: q["cq"].get("tx", "a"),
        TypeError,
        r"combine queue 'cq': get needs a percolite.Transaction",
    ),
    (
        "eq-add-no-tx",
        lambda env, d, q: q["eq"].add(None, "a", 1),
        TypeError,
        r"export queue 'eq': add needs a percolite.Transaction",
    ),
    (
        "retry-parked-int",
        lambda env, d, q: env.retry_parked(42),
        TypeError,
        r"retry_parked: observer must be a name",
    ),
    ("bind-str", lambda env, d, q: env.bind("app"), TypeError, r"app must be a percolite.App"),
    (
        "start-workers-lease",
        lambda env, d, q: env.start_workers(1, lease_seconds=0),
        ValueError,
        r"lease_seconds must be > 0",
    ),
    (
        "start-workers-half-static",
        lambda env, d, q: env.start_workers(1, worker_index=0),
        ValueError,
        r"give worker_index and worker_count together",
    ),
    # open(): every argument, checked before anything is created
    ("open-path-int", lambda env, d, q: percolite.open(5), TypeError, r"path must be str or os"),
    (
        "open-mode-str",
        lambda env, d, q: percolite.open(d / "c", mode="600"),
        TypeError,
        r"mode must be an int, not str",
    ),
    (
        "open-mode-range",
        lambda env, d, q: percolite.open(d / "c", mode=0o7777),
        ValueError,
        r"mode must be a permission mask between 0 and 0o777",
    ),
    (
        "open-map-size-small",
        lambda env, d, q: percolite.open(d / "c", map_size=10),
        ValueError,
        r"map_size must be at least 1 MiB, not 10",
    ),
    (
        "open-map-size-float",
        lambda env, d, q: percolite.open(d / "c", map_size=1e9),
        TypeError,
        r"map_size must be an int, not float",
    ),
    (
        "open-map-size-huge",
        lambda env, d, q: percolite.open(d / "c", map_size=2**70),
        ValueError,
        r"map_size must be at most 256 TiB",
    ),
    (
        "open-max-readers-0",
        lambda env, d, q: percolite.open(d / "c", max_readers=0),
        ValueError,
        r"max_readers must be between 1 and 65536, not 0",
    ),
    (
        "open-restored-str",
        lambda env, d, q: percolite.open(d / "c", restored="yes"),
        TypeError,
        r"restored must be True or False, not str",
    ),
    (
        "open-sync-upper",
        lambda env, d, q: percolite.open(d / "c", sync="FULL"),
        ValueError,
        r"sync must be one of 'full', 'meta', 'none', not 'FULL'",
    ),
    (
        "open-app-int",
        lambda env, d, q: percolite.open(d / "c", app=5),
        TypeError,
        r"app must be a percolite.App, not int",
    ),
    (
        "open-backend-int",
        lambda env, d, q: percolite.open(d / "c", backend=5),
        TypeError,
        r"backend must be a str or None, not int",
    ),
    (
        "open-backend-unknown",
        lambda env, d, q: percolite.open(d / "c", backend="sqlite"),
        ValueError,
        r"unknown backend 'sqlite'",
    ),
    # the handle's own calls
    (
        "process-timeout-str",
        lambda env, d, q: env.process(timeout="x"),
        TypeError,
        r"timeout must be a number or None, not str",
    ),
    (
        "status-queues-str",
        lambda env, d, q: env.status(queues="yes"),
        TypeError,
        r"status: queues must be True or False, not str",
    ),
    (
        "wait-progress-str",
        lambda env, d, q: env.wait(timeout=0, progress="maybe"),
        ValueError,
        r"progress must be True, False or 'auto', not 'maybe'",
    ),
    (
        "process-progress-int",
        lambda env, d, q: env.process(progress=5),
        ValueError,
        r"progress must be True, False or 'auto', not 5",
    ),
    (
        "parked-int",
        lambda env, d, q: env.parked(5),
        TypeError,
        r"parked: observer must be a name \(str\) or None, not int",
    ),
    (
        "retry-parked-queue-int",
        lambda env, d, q: env.retry_parked(queue=5),
        TypeError,
        r"retry_parked: queue must be a name",
    ),
    (
        "retry-parked-unknown-queue",
        lambda env, d, q: env.retry_parked(queue="nope"),
        ValueError,
        r"no queue named 'nope'",
    ),
    (
        "loader-zero",
        lambda env, d, q: env.loader(max_in_flight=0),
        ValueError,
        r"max_in_flight must be >= 1, not 0",
    ),
    (
        "loader-float",
        lambda env, d, q: env.loader(max_in_flight=2.5),
        TypeError,
        r"max_in_flight must be an int, not float",
    ),
    (
        "start-workers-zero",
        lambda env, d, q: env.start_workers(0),
        ValueError,
        r"threads must be at least 1, not 0",
    ),
    (
        "start-workers-str",
        lambda env, d, q: env.start_workers("4"),
        TypeError,
        r"threads must be an int, not str",
    ),
    (
        "start-workers-count-zero",
        lambda env, d, q: env.start_workers(1, worker_index=0, worker_count=0),
        ValueError,
        r"worker_index must be in range\(worker_count\)",
    ),
    # queues: keys and values through their codecs, transactions of the right store
    (
        "cq-add-key-type",
        lambda env, d, q: q["cq"].add(env.transaction(), {5: 1}),
        TypeError,
        r"combine queue 'cq': key 5: expected str, not int",
    ),
    (
        "cq-add-value-too-big",
        lambda env, d, q: q["cq"].add(env.transaction(), {"a": 2**70}),
        ValueError,
        r"combine queue 'cq': value 1180591620717411303424 for key 'a'.*signed 64-bit",
    ),
    (
        "cq-add-value-none",
        lambda env, d, q: q["cq"].add(env.transaction(), {"a": None}),
        TypeError,
        r"combine queue 'cq': value None for key 'a': expected int",
    ),
    (
        "cq-get-key-type",
        lambda env, d, q: q["cq"].get(env.transaction(), 5),
        TypeError,
        r"combine queue 'cq': key 5: expected str, not int",
    ),
    (
        "cq-add-ended-tx",
        lambda env, d, q: q["cq"].add(q["ended"](env), {"a": 1}),
        percolite.Error,
        r"the transaction was already committed",
    ),
    (
        "cq-of-another-app",
        lambda env, d, q: q["other_cq"].add(env.transaction(), {"a": 1}),
        ValueError,
        r"combine queue 'ocq': add: the store is bound to app 'bad', which has no queue named "
        r"'ocq': what you add would never be processed there",
    ),
    (
        "cq-declared-otherwise",
        lambda env, d, q: q["cq_elsewhere"].add(env.transaction(), {"a": 1}),
        ValueError,
        r"which declares another queue named 'cq'",
    ),
    (
        "eq-add-nan",
        lambda env, d, q: q["eq"].add(env.transaction(), "a", float("nan")),
        TypeError,
        r"export queue 'eq': value nan for key 'a': expected int, not float",
    ),
    (
        "eq-of-another-app",
        lambda env, d, q: q["other_eq"].add(env.transaction(), "a", 1),
        ValueError,
        r"export queue 'oeq': add: the store is bound to app 'bad', which has no queue",
    ),
    (
        "counter-add-str",
        lambda env, d, q: q["counter"].add(env.transaction(), "x"),
        TypeError,
        r"sharded counter 'hits': amount must be an int, not str",
    ),
    (
        "counter-add-too-big",
        lambda env, d, q: q["counter"].add(env.transaction(), 2**64),
        ValueError,
        r"sharded counter 'hits': amount 18446744073709551616 does not fit",
    ),
    (
        "counter-add-no-tx",
        lambda env, d, q: q["counter"].add(None, 1),
        TypeError,
        r"sharded counter 'hits': add needs a percolite.Transaction, not NoneType",
    ),
    # transactions used after they ended, and handles after close
    (
        "tx-set-after-commit",
        lambda env, d, q: q["ended"](env).set("r", COL, "v"),
        percolite.Error,
        r"the transaction was already committed",
    ),
    (
        "closed-env-transaction",
        lambda env, d, q: q["closed"](d).transaction(),
        percolite.ClosedError,
        r"closed",
    ),
    # declarations
    ("app-name-int", lambda env, d, q: percolite.App(5), TypeError, r"app's name must be a str"),
    (
        "cq-buckets-zero",
        lambda env, d, q: percolite.App().combine_queue("q", buckets=0),
        ValueError,
        r"buckets must be between 1 and 999999, not 0",
    ),
    (
        "cq-unknown-combiner",
        lambda env, d, q: percolite.App().combine_queue("q", combiner="avg"),
        ValueError,
        r"combiner must be one of 'sum', 'max', 'min', 'last' or a callable, not 'avg'",
    ),
    (
        "cq-unknown-codec",
        lambda env, d, q: percolite.App().combine_queue("q", value_codec="int128"),
        ValueError,
        r"value_codec must be one of .* not 'int128'",
    ),
    (
        "cq-id-reserved-character",
        lambda env, d, q: percolite.App().combine_queue("a:b"),
        ValueError,
        r"combine queue id 'a:b' contains a character the layout reserves",
    ),
    (
        "eq-exporter-not-callable",
        lambda env, d, q: percolite.App().export_queue("e", 5),
        TypeError,
        r"export queue 'e': the exporter must be callable, not int",
    ),
    (
        "counter-shards-zero",
        lambda env, d, q: percolite.ShardedCounter("c", shards=0),
        ValueError,
        r"sharded counter 'c': shards must be between 1 and 65536, not 0",
    ),
    (
        "codec-unknown",
        lambda env, d, q: percolite.codecs.get_codec("int65"),
        ValueError,
        r"codec must be one of .* not 'int65'",
    ),
    (
        "codec-int64-too-big",
        lambda env, d, q: percolite.codecs.get_codec("int64").encode(2**64),
        ValueError,
        r"18446744073709551616 does not fit in a signed 64-bit integer",
    ),
    # percolite.check
    (
        "check-path-int",
        lambda env, d, q: percolite.check(5),
        TypeError,
        r"path must be str or os.PathLike, not int",
    ),
    (
        "check-timeout-negative",
        lambda env, d, q: percolite.check(d / "db", timeout=-1),
        ValueError,
        r"timeout must be >= 0 or None, not -1",
    ),
    (
        "check-timeout-zero",
        lambda env, d, q: percolite.check(d / "db", timeout=0),
        ValueError,
        r"timeout must be > 0 or None",
    ),
    (
        "check-no-store",
        lambda env, d, q: percolite.check(d / "nope"),
        percolite.StorageError,
        r"no such directory, and create is off",
    ),
]


def _ended(env):
    tx = env.transaction()
    tx.commit()
    return tx


def _closed(directory):
    other = percolite.open(":memory:")
    other.close()
    return other


@pytest.mark.parametrize(
    "call, error, pattern",
    [pytest.param(c, e, p, id=i) for i, c, e, p in ENTRY_POINT_CASES],
)
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    app, other, elsewhere = percolite.App("bad"), percolite.App("other"), percolite.App("else")
    objects = {
        "cq": app.combine_queue("cq", key_codec="str", value_codec="int64"),
        "eq": app.export_queue("eq", lambda entries: None, key_codec="str", value_codec="int64"),
        "other_cq": other.combine_queue("ocq"),
        "other_eq": other.export_queue("oeq", lambda entries: None),
        "cq_elsewhere": elsewhere.combine_queue("cq", key_codec="str", value_codec="float64"),
        "counter": percolite.ShardedCounter("hits", shards=4),
        "never": lambda tx: pytest.fail("fn ran despite bad options"),
        "ended": _ended,
        "closed": _closed,
    }
    store = tmp_path / "db"
    with percolite.open(store, app=app, sync="none") as env:
        with env.transaction() as tx:
            tx.set("row", COL, "v")
        before = _store_snapshot(store)
        entries_before = sorted(os.listdir(tmp_path))
        with pytest.raises(error, match=pattern):
            call(env, tmp_path, objects)
        assert sorted(os.listdir(tmp_path)) == entries_before, "nothing was created"
    assert _store_snapshot(store) == before or committed_cells_same(store)


def committed_cells_same(store) -> bool:
    with percolite.open(store, sync="none") as env:
        with env.transaction() as tx:
            return [(c.row, tuple(c.column), c.value) for c in tx.scan()] == [
                (b"row", (b"f", b"q"), b"v")
            ]


@pytest.mark.parametrize(
    "codec, data",
    [
        ("int64", b"abc"),
        ("float64", b""),
        ("int64s:2", b"\x00" * 9),
        ("json", b"{"),
        ("str", b"\xff"),
    ],
)
def test_codecs_refuse_bytes_they_did_not_write(codec, data):
    with pytest.raises(ValueError):
        percolite.codecs.get_codec(codec).decode(data)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), [1.0, float("nan")]])
def test_json_codec_refuses_nan_and_infinity(value):
    with pytest.raises(ValueError, match="not JSON compliant"):
        percolite.codecs.get_codec("json").encode(value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), (1, float("-inf"))])
def test_sql_exporters_refuse_nan_and_infinity_before_writing(tmp_path, value):
    from percolite._export import SequencedExport as E
    from percolite.exporters import SQLite

    columns = ("a", "b") if isinstance(value, tuple) else "value"
    sink = SQLite(tmp_path / "out.sqlite", "t", columns=columns)
    good = (1, 2) if isinstance(value, tuple) else 1.5
    sink([E("ok", good, 1)])
    with pytest.raises(ValueError, match="is not storable"):
        sink([E("a", good, 2), E("k", value, 3)])
    import sqlite3

    with sqlite3.connect(tmp_path / "out.sqlite") as db:
        assert [r[0] for r in db.execute("SELECT key FROM t ORDER BY key")] == ["ok"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["scan", "{db}", "--limit", "-1"], "--limit must be an int >= 0, not '-1'"),
        (["wait", "{db}", "--timeout", "nan"], "--timeout must be a number of seconds >= 0"),
        (["phrasecount", "--threads", "0", "--db", "{db}"], "--threads must be an int >= 1"),
        (["phrasecount", "--processes", "-1", "--db", "{db}"], "--processes must be an int >= 0"),
        (["worker", "badmod:app", "--db", "{db}"], "importing 'badmod' raised RuntimeError: boom"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, argv, message):
    import sys

    from _isolated import run_command

    db = tmp_path / "db"
    with percolite.open(db, sync="none"):
        pass
    (tmp_path / "badmod.py").write_text("raise RuntimeError('boom')\n")
    args = [a.format(db=db) for a in argv]
    result = run_command([sys.executable, "-m", "percolite", *args], cwd=tmp_path, timeout=30)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"percolite: {message}"] or (
        len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    )
