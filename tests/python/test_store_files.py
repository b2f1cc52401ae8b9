"""The store's files are checked before they are mapped: damaged or
truncated data files, symbolic links and directories that hold no store are
refused with a clear error and left untouched. Opening a store directory:
handles on one path share its store, the files are private, and bad
arguments, paths and permissions are refused before anything is created."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile

import children.store_files
import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from _isolated import run_child, run_command
from conftest import committed_cells, open_store

COL = ("f", "q")


def make_store(path, rows: int = 300) -> None:
    with percolite.open(path, sync="none") as env:
        with env.transaction() as tx:
            for i in range(rows):
                tx.set(f"row{i:05}", COL, "v" * 200)


def snapshot(directory) -> dict:
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@pytest.mark.parametrize("create", [True, False])
def test_an_empty_data_file_is_refused_and_left_alone(tmp_path, create):
    store = tmp_path / "db"
    store.mkdir()
    (store / "data.mdb").write_bytes(b"")
    with pytest.raises(percolite.CorruptionError, match="data.mdb is empty"):
        percolite.open(store, create=create)
    assert (store / "data.mdb").read_bytes() == b""


def test_a_truncated_data_file_is_refused_naming_the_sizes(tmp_path):
    store = tmp_path / "db"
    make_store(store)
    data = store / "data.mdb"
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    before = snapshot(store)
    with pytest.raises(
        percolite.CorruptionError, match=r"data.mdb is truncated: .* the file holds"
    ):
        percolite.open(store)
    assert snapshot(store) == before


@pytest.mark.parametrize("damage", ["zeroed metas", "random", "short"])
def test_a_data_file_without_a_valid_meta_page_is_refused(tmp_path, damage):
    store = tmp_path / "db"
    make_store(store)
    data = store / "data.mdb"
    raw = bytearray(data.read_bytes())
    if damage == "zeroed metas":
        raw[: 2 * 4096] = bytes(2 * 4096)
    elif damage == "random":
        raw = bytearray(os.urandom(len(raw)))
    else:
        raw = raw[:100]
    data.write_bytes(bytes(raw))
    with pytest.raises(percolite.CorruptionError, match="data.mdb"):
        percolite.open(store)
    assert data.read_bytes() == bytes(raw)


@pytest.mark.parametrize("page", [0, 1])
def test_one_damaged_meta_page_is_named(tmp_path, page):
    """LMDB needs both meta pages; with one damaged it used to say only
    'File is not an LMDB file'."""
    store = tmp_path / "db"
    make_store(store)
    data = store / "data.mdb"
    raw = bytearray(data.read_bytes())
    raw[page * 4096 : page * 4096 + 64] = bytes(64)
    data.write_bytes(bytes(raw))
    with pytest.raises(
        percolite.CorruptionError, match=f"damaged meta page \\(page {page}; the other"
    ):
        percolite.open(store)
    assert data.read_bytes() == bytes(raw)


def test_a_format_tag_of_damaged_bytes_is_corruption_not_a_decode_error(tmp_path):
    """The store's format tag is quoted in the error: bytes that are not
    UTF-8 used to surface as UnicodeDecodeError."""
    import lmdb

    store = tmp_path / "db"
    make_store(store, rows=5)
    with lmdb.open(str(store), max_dbs=16) as raw:
        with raw.begin(write=True) as txn:
            txn.put(b"format", b"percolite/\xff\xfe", db=raw.open_db(b"meta", txn=txn))
    with pytest.raises(percolite.CorruptionError, match=r"format is 'percolite/\\xff\\xfe'"):
        percolite.open(store)


@pytest.mark.parametrize("name", ["data.mdb", "lock.mdb", "durable-txn", "damaged"])
def test_a_symbolic_link_in_the_store_is_refused_and_its_target_untouched(tmp_path, name):
    store = tmp_path / "db"
    make_store(store)
    target = tmp_path / "precious.txt"
    target.write_text("do not touch")
    if (store / name).exists():  # durable-txn: sync="full" commits only; damaged: on damage
        os.replace(store / name, tmp_path / "moved")
    (store / name).symlink_to(target)
    with pytest.raises(percolite.StorageError, match=f"'{store / name}' is a symbolic link"):
        percolite.open(store)
    assert target.read_text() == "do not touch"


def test_a_dangling_link_target_is_not_created(tmp_path):
    store = tmp_path / "db"
    store.mkdir()
    target = tmp_path / "elsewhere" / "data.mdb"
    (store / "data.mdb").symlink_to(target)
    with pytest.raises(percolite.StorageError, match="is a symbolic link"):
        percolite.open(store)
    assert not target.exists() and not target.parent.exists()


def test_a_linked_store_directory_is_fine(tmp_path):
    make_store(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with percolite.open(tmp_path / "link") as env:
        with env.transaction() as tx:
            assert tx.get("row00007", COL) == b"v" * 200


def test_create_false_needs_a_store_not_just_a_directory(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    with pytest.raises(percolite.StorageError, match="no percolite store there"):
        percolite.open(plain, create=False)
    assert sorted(os.listdir(plain)) == ["notes.txt"]
    for command in (["status"], ["scan"], ["wait"], ["retry"]):
        result = run_command([sys.executable, "-m", "percolite", *command, plain], timeout=30)
        assert result.returncode == 2, (command, result.stderr)
        assert "not a percolite store: the directory holds none" in result.stderr
    assert sorted(os.listdir(plain)) == ["notes.txt"], "no command created a store"


def test_a_store_written_now_keeps_opening(tmp_path):
    store = tmp_path / "db"
    make_store(store, rows=3000)
    for _ in range(3):
        with percolite.open(store, create=False) as env:
            with env.transaction() as tx:
                assert sum(1 for _ in tx.scan()) == 3000


# -- percolite check ------------------------------------------------------------


def damage_pages(data, seed: int = 5) -> None:
    """Random bytes over half the pages after the meta pages (the metas stay valid)."""
    import random

    raw = bytearray(data.read_bytes())
    rng = random.Random(seed)
    for page in range(4, len(raw) // 4096):
        if rng.random() < 0.5:
            raw[page * 4096 + 16 : page * 4096 + 400] = rng.randbytes(384)
    data.write_bytes(bytes(raw))


def test_check_reports_a_clean_store_clean(tmp_path):
    store = tmp_path / "db"
    make_store(store, rows=2000)
    report = percolite.check(store)
    assert report["ok"] is True and report["problems"] == []
    assert report["counts"]["cells"] == 2000
    result = run_command([sys.executable, "-m", "percolite", "check", store], timeout=60)
    assert result.returncode == 0 and result.stdout.strip().endswith("clean")


def test_check_reports_damaged_pages_without_dying(tmp_path):
    store = tmp_path / "db"
    make_store(store, rows=2000)
    damage_pages(store / "data.mdb")
    report = percolite.check(store)  # this process survives whatever the walk meets
    assert report["ok"] is False and report["problems"]
    result = run_command([sys.executable, "-m", "percolite", "check", store], timeout=60)
    assert result.returncode == 1 and "damaged" in result.stdout


def test_check_without_a_store_is_a_usage_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(percolite.StorageError, match="no percolite store there"):
        percolite.check(tmp_path / "empty")
    result = run_command([sys.executable, "-m", "percolite", "check", tmp_path / "empty"])
    assert result.returncode == 2 and "not a percolite store" in result.stderr
    assert os.listdir(tmp_path / "empty") == []


def test_a_store_whose_table_list_lost_a_table_is_refused_not_recreated_empty(tmp_path):
    """Opening used to create any table it did not find, so a store whose
    pages lost the entry of its data table opened empty, silently. Now only
    a new store gets tables; in an existing one a missing table is damage."""
    import lmdb

    store = tmp_path / "db"
    make_store(store, rows=50)
    with lmdb.open(str(store), max_dbs=16) as raw:
        with raw.begin(write=True) as txn:
            txn.drop(raw.open_db(b"ack", txn=txn), delete=True)  # as if its entry were lost
    before = (store / "data.mdb").read_bytes()  # lock.mdb's reader table may change
    with pytest.raises(percolite.CorruptionError, match="its table 'ack' is missing"):
        percolite.open(store)
    assert (store / "data.mdb").read_bytes() == before
    report = percolite.check(store)
    assert report["ok"] is False and "table 'ack' is missing" in report["problems"][0]


def test_check_finds_a_table_shorter_than_its_bookkeeping(tmp_path):
    """Damaged pages often make a B-tree look shorter without any error:
    check compares what the walk finds with the entry count the store
    records. Zeroing the data table's leaf pages after its first does that."""
    store = tmp_path / "db"
    make_store(store, rows=3000)
    report = percolite.check(store)
    assert report["ok"], report
    damage_pages(store / "data.mdb", seed=11)
    report = percolite.check(store)
    assert report["ok"] is False, report


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
        children.store_files.open_in_read_only_directory, read_only_dir, target, timeout=30
    )
    assert "StorageError:" in out
    assert target in out and "permission denied" in out.lower()
    assert not os.path.exists(target)


def test_open_of_a_read_only_directory_raises_storage_error(read_only_dir):
    out = run_child(
        children.store_files.open_in_read_only_directory, read_only_dir, read_only_dir, timeout=30
    )
    assert "StorageError:" in out
    assert read_only_dir in out and "permission denied" in out.lower()
    assert os.listdir(read_only_dir) == []


# -- bad input to percolite.open and percolite.check ---------------------------

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


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)
