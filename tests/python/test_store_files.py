"""The store's files are checked before they are mapped: damaged or
truncated data files, symbolic links and directories that hold no store are
refused with a clear error and left untouched."""

from __future__ import annotations

import os
import sys

import percolite
import pytest
from _isolated import run_command

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
