"""With sync="full", no reader in any process sees a commit before it is
durable, and a failed write leaves nothing half-reported.

A child process commits with its durable writes (fsync, fdatasync, writes
through O_DSYNC descriptors) held or failed by a shim it loads with
LD_PRELOAD (sync_gate/sync_gate.cc, built here with the C++ compiler the
project builds with); the test process reads the same store meanwhile.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import children.durability
import percolite
import pytest
from _isolated import finish_child, start_child

COL = ("f", "q")
SHIM_SOURCE = Path(__file__).parent / "sync_gate" / "sync_gate.cc"


@pytest.fixture(scope="module")
def sync_gate(tmp_path_factory):
    """The shim, built once for this module's tests."""
    compiler = shutil.which("c++") or shutil.which("g++")
    assert compiler, "a C++ compiler is needed (scripts/bootstrap.sh installs g++)"
    library = tmp_path_factory.mktemp("sync_gate") / "sync_gate.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(SHIM_SOURCE), "-ldl"],
        check=True,
        timeout=120,
    )
    return library


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.005)


def read_cell(env):
    """The cell in a snapshot begun now (a read needs no lock a writer holds)."""
    tx = env.transaction()
    try:
        return tx.get("r", COL)
    finally:
        tx.abort()


def start_committer(
    tmp_path, sync_gate, scenario=children.durability.commit_when_told, extra=(), **gates
):
    db = tmp_path / "db"
    percolite.open(db, sync="full").close()  # created before any write is gated
    environment = {"LD_PRELOAD": str(sync_gate)}
    for name, value in gates.items():
        environment[f"PERCOLITE_TEST_{name.upper()}"] = str(value)
    opened, go = tmp_path / "opened", tmp_path / "go"
    child = start_child(
        scenario,
        db,
        opened,
        go,
        *extra,
        timeout=60,
        environment=environment,
    )
    wait_for(opened)
    return db, go, child


# A commit makes at least two durable writes (its data pages, then the page
# that makes them current): hold the first, then let it pass and hold the next.
@pytest.mark.parametrize("passed", [0, 1])
def test_a_commit_is_invisible_to_other_processes_until_it_is_durable(tmp_path, sync_gate, passed):
    hold, held = tmp_path / "hold", tmp_path / "held"
    db, go, child = start_committer(
        tmp_path, sync_gate, hold_sync=hold, sync_pass=passed, sync_held=held
    )
    reader = percolite.open(db, sync="full")  # opened first: opening takes the writer's lock
    try:
        hold.touch()  # from now on the child's durable writes wait
        go.touch()
        wait_for(held)  # one of the commit's durable writes waits now
        # At least 100 reads and a second: counted, so a slow machine reads as often.
        deadline = time.monotonic() + 1.0
        reads = 0
        while reads < 100 or time.monotonic() < deadline:
            assert read_cell(reader) is None, "a reader saw a commit that was not durable yet"
            reads += 1
    finally:
        hold.unlink()
    assert finish_child(child, timeout=60).splitlines() == ["committed"]
    assert read_cell(reader) == b"durable"
    reader.close()


def test_a_failed_sync_shows_nothing_and_makes_the_handle_unusable(tmp_path, sync_gate):
    fail = tmp_path / "fail"
    db, go, child = start_committer(tmp_path, sync_gate, fail_sync=fail)
    reader = percolite.open(db, sync="full")
    fail.touch()  # from now on the child's durable writes fail with EIO
    go.touch()
    lines = finish_child(child, timeout=60).splitlines()
    assert lines[0].startswith("commit failed: StorageError: ")
    assert lines[1].startswith("then: StorageError: ")
    assert "unusable after a failed write to disk" in lines[1]
    assert "open it again" in lines[1]
    assert read_cell(reader) is None  # nothing of the failed commit is visible
    reader.run(lambda tx: tx.set("r", COL, b"after"))  # the store itself works
    assert read_cell(reader) == b"after"
    reader.close()


def test_a_loader_future_resolves_only_after_its_sync(tmp_path, sync_gate):
    hold, held, checked = tmp_path / "hold", tmp_path / "held", tmp_path / "checked"
    db, go, child = start_committer(
        tmp_path,
        sync_gate,
        scenario=children.durability.load_when_told,
        extra=(held, checked),
        hold_sync=hold,
        sync_held=held,
    )
    hold.touch()
    go.touch()
    try:
        wait_for(checked)
    finally:
        hold.unlink()
    assert finish_child(child, timeout=60).splitlines() == [
        "while held: done=False",
        "then: done",
    ]


def test_a_worker_goes_on_while_its_commit_waits_for_the_sync(tmp_path, sync_gate):
    """One worker thread runs every pending notification while the first
    run's commit is held before its sync (each commit goes to the writer, the
    worker to the next notification), and no reader sees any of their writes
    until the syncs pass."""
    hold, checked = tmp_path / "hold", tmp_path / "checked"
    db, go, child = start_committer(
        tmp_path,
        sync_gate,
        scenario=children.durability.observe_when_told,
        extra=(checked, 20),
        hold_sync=hold,
    )
    reader = percolite.open(db, sync="full")
    hold.touch()
    go.touch()
    try:
        deadline = time.monotonic() + 30
        while not checked.exists():
            assert time.monotonic() < deadline, "the child never reported its runs"
            tx = reader.transaction()
            try:
                seen = list(tx.scan(columns=[("f", "out")]))
            finally:
                tx.abort()
            assert seen == [], "a reader saw an observer's write before its sync"
            time.sleep(0.005)
    finally:
        hold.unlink()
    assert finish_child(child, timeout=60).splitlines() == [
        "runs while held: 20",
        "committing while held: 20",  # env.status()["workers"]: every run's commit is out
        "then: 20 written",
    ]
    reader.close()
