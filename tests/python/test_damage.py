"""Damaged stores: never a crash, never a hang, never silent loss.

One populated store, 120 copies of it damaged in seeded ways (truncation,
zeroed or random pages, meta pages swapped or damaged, scattered bytes, an
empty data file). Each copy is opened and read back whole in a child
process, which then commits sets and deletes across it. A copy may be
refused with percolite's error, or read back exactly as written; what reads
back differently must be reported damaged by ``percolite check``. No copy
may kill the process or hang it, reading or writing."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import children.damage
import percolite
import pytest
from _isolated import run_child_json, run_command, start_child
from children import damage

PAGE = 4096
COPIES = 120
READ_TIMEOUT = 60


def _pages(raw: bytearray) -> int:
    return len(raw) // PAGE


def _newest_meta(raw: bytearray) -> int:
    """The meta page (0 or 1) with the larger transaction id."""
    txnid = [
        int.from_bytes(raw[p * PAGE + 16 + 128 : p * PAGE + 16 + 136], "little") for p in (0, 1)
    ]
    return 0 if txnid[0] >= txnid[1] else 1


def _damage(raw: bytearray, kind: str, rng: random.Random) -> bytearray:
    pages = _pages(raw)
    if kind == "truncated":
        return raw[: rng.choice([0, rng.randrange(1, PAGE * 2), rng.randrange(PAGE * 2, len(raw))])]
    if kind == "zeroed pages":
        for page in rng.sample(range(2, pages), rng.randint(1, 4)):
            raw[page * PAGE : (page + 1) * PAGE] = bytes(PAGE)
    elif kind == "random pages":
        for page in rng.sample(range(2, pages), rng.randint(1, 4)):
            raw[page * PAGE : (page + 1) * PAGE] = rng.randbytes(PAGE)
    elif kind == "metas swapped":
        raw[0:PAGE], raw[PAGE : 2 * PAGE] = raw[PAGE : 2 * PAGE], raw[0:PAGE]
    elif kind == "newest meta damaged":
        at = _newest_meta(raw) * PAGE
        start = at + rng.randrange(16, 16 + 136)
        raw[start : start + 8] = rng.randbytes(8)
    elif kind == "scattered bytes":
        for _ in range(rng.randint(1, 40)):
            raw[rng.randrange(2 * PAGE, len(raw))] = rng.randrange(256)
    elif kind == "a run of bytes":
        start = rng.randrange(2 * PAGE, len(raw) - 64)
        raw[start : start + rng.randint(8, 64)] = rng.randbytes(64)[: rng.randint(8, 64)]
    elif kind == "page headers":
        for page in rng.sample(range(2, pages), rng.randint(1, 8)):
            raw[page * PAGE : page * PAGE + 16] = rng.randbytes(16)
    return raw


KINDS = [
    "truncated",
    "zeroed pages",
    "random pages",
    "metas swapped",
    "newest meta damaged",
    "scattered bytes",
    "a run of bytes",
    "page headers",
]


def _find_all(raw: bytearray, needle: bytes) -> list[int]:
    found, at = [], raw.find(needle)
    while at >= 0:
        found.append(at)
        at = raw.find(needle, at + 1)
    return found


def _read(copy, write: bool = True) -> dict:
    """Reads (then, with ``write``, writes) ``copy`` in a child; the outcome,
    or how the child died."""
    proc = start_child(children.damage.read, copy, write=write, timeout=READ_TIMEOUT)
    try:
        out, err = proc.communicate(timeout=READ_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"outcome": "hang"}
    if proc.returncode < 0:
        return {"outcome": "killed", "signal": signal.Signals(-proc.returncode).name}
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"outcome": "other", "message": err.strip()[-800:]}
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    original = tmp_path_factory.mktemp("damage") / "db"
    digest = damage.populate(original)
    return original, digest


def test_the_intact_store_reads_back_and_checks_clean(populated):
    original, digest = populated
    assert _read(original, write=False) == {"outcome": "read", "digest": digest}
    report = percolite.check(original)
    assert report["ok"], report


def test_damaged_copies_are_refused_or_read_back_exactly_never_a_crash(populated, tmp_path):
    original, digest = populated
    raw = bytearray((original / "data.mdb").read_bytes())
    copies = []
    for seed in range(COPIES):
        kind = KINDS[seed % len(KINDS)]
        copy = tmp_path / f"copy{seed:03}"
        shutil.copytree(original, copy)
        (copy / "data.mdb").write_bytes(_damage(bytearray(raw), kind, random.Random(seed)))
        copies.append((seed, kind, copy))

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        outcomes = list(pool.map(lambda c: _read(c[2]), copies))

    tally, bad = Counter(), []
    for (seed, kind, copy), outcome in zip(copies, outcomes, strict=True):
        what = outcome["outcome"]
        if outcome.get("write", "ok").startswith("other"):
            what = "other"
        if what == "read" and outcome["digest"] != digest:
            report = percolite.check(copy)
            what = "differs, check reports it" if not report["ok"] else "differs, check clean"
        tally[what] += 1
        if what in ("killed", "hang", "other", "differs, check clean"):
            bad.append((seed, kind, outcome))
    summary = ", ".join(f"{n} {what}" for what, n in sorted(tally.items()))
    print(summary)
    assert not bad, f"{summary}\nseed, kind, outcome: {bad}"
    # The damage is real: most copies are refused, and every kind was tried.
    assert tally["refused"] >= COPIES // 2, summary


def test_a_read_that_faults_is_an_error_and_the_handle_refuses_until_reopened(populated, tmp_path):
    """The size of an overflow value lives in its leaf node: set to 4 GiB,
    reading the value runs off the end of the file (SIGBUS) or the map
    (SIGSEGV) inside the checksum. That is CorruptionError, the process lives
    on, the handle refuses further work, and a reopened store reads on."""
    original, _ = populated
    copy = tmp_path / "db"
    shutil.copytree(original, copy)
    raw = bytearray((copy / "data.mdb").read_bytes())
    key = b"big000\x00\x01doc\x00\x01meta\x00\x01"
    # Every leaf node of the key (F_BIGDATA set): pages LMDB copied on write
    # keep older versions of it, so the live one is among them.
    nodes = [at for at in _find_all(raw, key) if raw[at - 4] & 1]
    assert nodes
    for at in nodes:
        raw[at - 8 : at - 4] = b"\xff\xff\xff\xff"  # mn_lo, mn_hi: the value's size
    (copy / "data.mdb").write_bytes(raw)
    out = run_child_json(children.damage.fault_then_reuse, copy, b"big000", b"doc00001")
    assert out["read"].startswith("CorruptionError"), out
    assert "pages are damaged" in out["read"] and (
        "SIGBUS" in out["read"] or "SIGSEGV" in out["read"]
    )
    assert (
        out["again"].startswith("CorruptionError")
        and "unusable after reading damaged" in out["again"]
    )
    expected = next(v for r, _, v in damage.contents() if r == b"doc00001")
    assert bytes.fromhex(out["reopened"]) == expected
    report = percolite.check(copy)
    assert not report["ok"] and "faulted" in " ".join(report["problems"]), report


@pytest.mark.parametrize("damage_to", ["newest lowered", "older raised"])
def test_a_data_file_that_went_back_in_time_is_refused_unless_restored(
    populated, tmp_path, damage_to
):
    """With the newest meta page's transaction id damaged lower, or the
    older one's damaged higher, LMDB takes the older meta page and would
    serve the store without its last commit. The durable mark, stored after
    each durable commit, holds a later commit timestamp than the snapshot
    LMDB serves: refused, untouched. restored=True opens it (a backup put
    back on purpose)."""
    original, _ = populated
    copy = tmp_path / "db"
    shutil.copytree(original, copy)
    raw = bytearray((copy / "data.mdb").read_bytes())
    newest = _newest_meta(raw)
    if damage_to == "newest lowered":
        txnid_at, txnid = newest * PAGE + 16 + 128, 1
    else:
        # Readers take the meta page the txnid's parity names: keep the older page's.
        txnid_at, txnid = (1 - newest) * PAGE + 16 + 128, (1 << 40) | (1 - newest)
    raw[txnid_at : txnid_at + 8] = txnid.to_bytes(8, "little")
    (copy / "data.mdb").write_bytes(raw)
    with pytest.raises(percolite.CorruptionError, match="went back in time.*restored=True\\)"):
        percolite.open(copy)
    assert (copy / "data.mdb").read_bytes() == raw
    out = _read(copy)
    assert out["outcome"] == "refused" and "went back in time" in out["message"]
    assert "percolite restored" in out["message"]
    result = run_command([sys.executable, "-m", "percolite", "restored", copy], timeout=60)
    assert result.returncode == 0 and "accepted as restored" in result.stdout, result.stderr
    with percolite.open(copy) as env, env.transaction() as tx:
        rows = sum(1 for _ in tx.scan())
    # The last commit was percolite's own (metrics flushed at close): the
    # older transaction still holds every cell.
    assert rows == len(damage.contents())
    with percolite.open(copy) as env, env.transaction() as tx:  # the mark starts again
        assert sum(1 for _ in tx.scan()) == rows


def test_damage_found_by_a_read_stops_every_later_write_until_restored(populated, tmp_path):
    """Writing over damaged pages can make things worse, or corrupt the
    writer's memory inside LMDB before anything faults. So once a read finds
    a bad checksum, the store records it (the file 'damaged'), and every
    later handle refuses commits, while reads of what is intact go on;
    restored=True, after a copy is put in place, clears it."""
    original, _ = populated
    copy = tmp_path / "db"
    shutil.copytree(original, copy)
    row, col, value = next(c for c in damage.contents() if len(c[2]) >= 40)
    raw = bytearray((copy / "data.mdb").read_bytes())
    for at in _find_all(raw, value):  # the live record and any older copies of its page
        raw[at + 20] ^= 0xFF
    (copy / "data.mdb").write_bytes(raw)
    with percolite.open(copy) as env, env.transaction() as tx:
        with pytest.raises(percolite.CorruptionError, match="fails its checksum"):
            tx.get(row, col)
    assert (copy / "damaged").exists()
    with percolite.open(copy) as env:  # a new handle (and any other process) knows
        intact = next(c for c in damage.contents() if c[0] != row)
        with env.transaction() as tx:
            assert tx.get(intact[0], intact[1]) == intact[2]
        with pytest.raises(percolite.CorruptionError, match="was found damaged.*restored=True"):
            env.run(lambda tx: tx.set("new", damage.DOC, "v"))
    assert not percolite.check(copy)["ok"]
    shutil.copy(original / "data.mdb", copy / "data.mdb")  # the backup put back
    with percolite.open(copy, restored=True) as env:
        env.run(lambda tx: tx.set("new", damage.DOC, "v"))
    assert not (copy / "damaged").exists()
    assert percolite.check(copy)["ok"]


def _u64(raw: bytearray, at: int) -> int:
    return int.from_bytes(raw[at : at + 8], "little")


def _free_entries(raw: bytearray) -> list[tuple[int, int]]:
    """Where each entry of the newest snapshot's free list is stored: its key
    (a transaction id) and its value (a page count, then the pages). The
    populated store's free list is one leaf page of several entries."""
    meta = _newest_meta(raw) * PAGE + 16
    page = _u64(raw, meta + 24 + 40) * PAGE  # the free tree's root
    assert int.from_bytes(raw[page + 10 : page + 12], "little") & 2, "a one-page free list"
    lower = int.from_bytes(raw[page + 12 : page + 14], "little")
    entries = []
    for slot in range(page + 16, page + lower, 2):
        node = page + int.from_bytes(raw[slot : slot + 2], "little")
        key_size = int.from_bytes(raw[node + 6 : node + 8], "little")
        entries.append((node + 8, node + 8 + key_size))
    return entries


def _first_free_page_at(raw: bytearray) -> int:
    """Where the first page number of the newest snapshot's free list is stored."""
    _key, entry = _free_entries(raw)[0]
    assert _u64(raw, entry) >= 1
    return entry + 8


def test_check_finds_a_free_list_naming_a_page_in_use_and_writes_stop(populated, tmp_path):
    """LMDB's free list is reached by no entry, so only a walk of the pages
    sees it. A free list naming a page still in use makes the next commit
    overwrite that page (or fault): check finds it, and from then on the
    store refuses commits."""
    original, _ = populated
    copy = tmp_path / "db"
    shutil.copytree(original, copy)
    raw = bytearray((copy / "data.mdb").read_bytes())
    main_root = _u64(raw, _newest_meta(raw) * PAGE + 16 + 72 + 40)
    at = _first_free_page_at(raw)
    raw[at : at + 8] = main_root.to_bytes(8, "little")  # a free page: the table list's root
    (copy / "data.mdb").write_bytes(raw)
    report = percolite.check(copy)
    assert not report["ok"]
    assert f"the free list names page {main_root}, which is in use" in report["problems"], report
    with percolite.open(copy) as env:
        with pytest.raises(percolite.CorruptionError, match="was found damaged"):
            env.run(lambda tx: tx.set("new", damage.DOC, "v"))


def test_a_damaged_free_list_stops_the_first_commit_unchecked(populated, tmp_path):
    """Without any check run, a process's first commit proves the free list
    sound before LMDB hands out a page from it. The first free page is
    changed to each page of the file in turn: every change is refused with
    the store read back exactly as it was (the one "change" to the page it
    already named commits)."""
    original, digest = populated
    raw = (original / "data.mdb").read_bytes()
    at = _first_free_page_at(bytearray(raw))
    named = _u64(bytearray(raw), at)
    out = run_child_json(children.damage.free_list_sweep, original, tmp_path, at, timeout=300)
    assert len(out) == len(raw) // PAGE - 2, "one variant per page but the meta pages"
    for page, (write, read) in out.items():
        if int(page) == named:
            assert write == "ok", (page, write)
        else:
            assert write.startswith("CorruptionError: ") and "was found damaged" in write, (
                page,
                write,
            )
            assert read == {"outcome": "read", "digest": digest}, (page, read)


def test_a_table_record_hiding_overflow_pages_stops_the_first_commit(populated, tmp_path):
    """Before its first commit a process reads only the leaves of tables
    whose record counts overflow pages (other leaves are claimed from their
    branch pages unread). A record that hides its table's overflow pages
    leaves them unaccounted for, which stops the commit as any damage does."""
    original, _ = populated
    copy = tmp_path / "db"
    shutil.copytree(original, copy)
    raw = bytearray((copy / "data.mdb").read_bytes())
    page = _u64(raw, _newest_meta(raw) * PAGE + 16 + 72 + 40) * PAGE  # the table list
    assert int.from_bytes(raw[page + 10 : page + 12], "little") & 2, "a one-page table list"
    lower = int.from_bytes(raw[page + 12 : page + 14], "little")
    for slot in range(page + 16, page + lower, 2):
        node = page + int.from_bytes(raw[slot : slot + 2], "little")
        key_size = int.from_bytes(raw[node + 6 : node + 8], "little")
        if raw[node + 8 : node + 8 + key_size] == b"data":
            record = node + 8 + key_size
            break
    assert _u64(raw, record + 24) > 0, "the data table has overflow pages"
    raw[record + 24 : record + 32] = bytes(8)
    (copy / "data.mdb").write_bytes(raw)
    with percolite.open(copy) as env:
        with pytest.raises(percolite.CorruptionError, match="pages are neither in use nor free"):
            env.run(lambda tx: tx.set("new", damage.DOC, "v"))
    assert not percolite.check(copy)["ok"]


def _damage_free_list(raw: bytearray, how: str) -> None:
    entries = _free_entries(raw)
    (key, entry), (other_key, _) = entries[0], entries[1]
    if how == "pages out of order":  # the same pages, two of them swapped
        assert _u64(raw, entry) >= 2
        first, second = raw[entry + 8 : entry + 16], raw[entry + 16 : entry + 24]
        raw[entry + 8 : entry + 16], raw[entry + 16 : entry + 24] = second, first
    elif how == "count wrapping":  # 8 * (count + 1) wraps round to the true size
        raw[entry : entry + 8] = ((_u64(raw, entry) + 2**61) % 2**64).to_bytes(8, "little")
    elif how == "keys swapped":
        mine, theirs = raw[key : key + 8], raw[other_key : other_key + 8]
        raw[key : key + 8], raw[other_key : other_key + 8] = theirs, mine


@pytest.mark.parametrize("how", ["pages out of order", "count wrapping", "keys swapped"])
def test_a_free_list_out_of_lmdbs_order_stops_the_first_commit(populated, tmp_path, how):
    """LMDB keeps each free-list entry's pages in decreasing order and takes a
    run of pages by checking only its ends, so pages out of order (every one
    still free) can hand out a page in use; an entry's count that wraps round
    to its size read past it; swapped keys leak pages. A fresh process's
    first commit is refused for each, and the store reads back as it was."""
    original, digest = populated
    copy = tmp_path / "db"
    shutil.copytree(original, copy)
    raw = bytearray((copy / "data.mdb").read_bytes())
    _damage_free_list(raw, how)
    (copy / "data.mdb").write_bytes(raw)
    assert _read(copy) == {"outcome": "read", "digest": digest, "write": "CorruptionError"}
    reason = (copy / "damaged").read_text()
    expected = {
        "pages out of order": "pages are out of order",
        "count wrapping": "holds a damaged free-list entry",
        "keys swapped": "transaction ids are out of order",
    }[how]
    assert expected in reason, reason
    assert not percolite.check(copy)["ok"]


def test_damage_another_process_found_stops_handles_already_open(populated, tmp_path):
    """The damage mark is how processes tell each other: a handle opened
    before another process recorded damage refuses commits once the mark is
    there, and check reports the mark even when its walk finds nothing."""
    original, _ = populated
    copy = tmp_path / "db"
    shutil.copytree(original, copy)
    with percolite.open(copy) as env:
        env.run(lambda tx: tx.set("before", damage.DOC, "v"))
        # What a process that found damage writes (a read that failed its checksum, say).
        (copy / "damaged").write_text("row 'doc00001' column 'doc:text' fails its checksum")
        deadline = time.monotonic() + 5
        while True:
            try:
                env.run(lambda tx: tx.set("after", damage.DOC, "v"), retries=0)
            except percolite.CorruptionError as e:
                assert "fails its checksum" in str(e)
                break
            assert time.monotonic() < deadline, "commits went on past the mark"
            time.sleep(0.005)
    report = percolite.check(copy)
    assert not report["ok"]
    assert "found damaged earlier (row 'doc00001'" in report["problems"][0]
    assert "percolite restored DIR" in report["problems"][0]
    with percolite.open(copy, restored=True) as env:  # the mark goes with a restore
        env.run(lambda tx: tx.set("after", damage.DOC, "v"))
    assert percolite.check(copy)["ok"]
