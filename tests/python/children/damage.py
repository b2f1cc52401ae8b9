"""Children of test_damage.py: the populated store every damaged copy starts
from, and the reader that opens a copy and reads all of it back."""

from __future__ import annotations

import hashlib
import json
import random

import percolite

DOC = ("doc", "text")
META = ("doc", "meta")


def contents() -> list[tuple[bytes, tuple[str, str], bytes]]:
    """The cells of the populated store, in the order they are written:
    small values, values large enough for LMDB's overflow pages, and rows
    longer than LMDB's key limit (stored under a hashed key)."""
    rng = random.Random(2024)
    cells = []
    for i in range(2400):
        cells.append((f"doc{i:05}".encode(), DOC, rng.randbytes(rng.randint(1, 160))))
    for i in range(60):
        cells.append((f"big{i:03}".encode(), META, rng.randbytes(rng.randint(3000, 9000))))
    for i in range(20):
        cells.append((b"L" * 600 + str(i).encode(), META, rng.randbytes(40)))
    return cells


def app() -> percolite.App:
    """An app observing DOC, so the store holds pending notifications too."""
    made = percolite.App("damage")

    @made.observer(DOC)
    def index(tx, row, col):
        pass

    return made


def populate(path) -> str:
    """Writes contents() in 40 transactions, each durable (so the store's
    durable mark is kept), leaving every notification pending. Returns the
    digest a reader of the intact store prints."""
    cells = contents()
    with percolite.open(path, app=app()) as env:
        for start in range(0, len(cells), len(cells) // 40 + 1):
            chunk = cells[start : start + len(cells) // 40 + 1]

            def write(tx, chunk=chunk):
                for row, col, value in chunk:
                    tx.set(row, col, value)

            env.run(write)
    return _digest(sorted(cells), sum(1 for _, col, _ in cells if col == DOC))


def _digest(cells, notifications: int) -> str:
    h = hashlib.sha256()
    for row, (family, qualifier), value in cells:
        for part in (row, family.encode(), qualifier.encode(), value):
            h.update(len(part).to_bytes(4, "big") + part)
    h.update(notifications.to_bytes(8, "big"))
    return h.hexdigest()


def read(path, write: bool = True) -> None:
    """Opens the store at ``path`` (never creating one) and reads it all
    back: a scan of every cell, a look-up of every cell the store was
    written with, and a walk of the pending notifications; then, on a handle
    of its own, commits sets and deletes across the store. Prints one JSON
    line: the read's outcome and, when everything read, the digest, and the
    write's outcome."""
    outcome = _read_all(path)
    if write:
        outcome["write"] = _write_some(path)
    print(json.dumps(outcome))


def _write_some(path) -> str:
    cells = contents()

    def write(tx):
        for i, (row, col, _) in enumerate(cells[::15]):
            if i % 3:
                tx.set(row, col, b"rewritten")
            else:
                tx.delete(row, col)

    try:
        with percolite.open(path, create=False) as env:
            env.run(write, retries=0)
        return "ok"
    except percolite.Error as e:
        return type(e).__name__
    except Exception as e:  # anything but percolite's errors is a bug the test reports
        return f"other: {type(e).__name__}: {e}"


def _read_all(path) -> dict:
    try:
        with percolite.open(path, create=False) as env:
            with env.transaction() as tx:
                scanned = [
                    (bytes(row), (bytes(f).decode(), bytes(q).decode()), bytes(value))
                    for row, (f, q), value in tx.scan()
                ]
                looked_up = [tx.get(row, col) for row, col, _ in contents()]
            notifications, after = 0, b""
            while True:
                chunk = env._core.scan_notifications(after, 512)
                notifications += len(chunk)
                if len(chunk) < 512:
                    break
                after = chunk[-1][4]
        same_lookups = looked_up == [value for _, _, value in contents()]
        digest = _digest(scanned, notifications) if same_lookups else "look-ups differ"
        return {"outcome": "read", "digest": digest}
    except percolite.Error as e:
        return {"outcome": "refused", "error": type(e).__name__, "message": str(e)}
    except Exception as e:  # anything but percolite's errors is a bug the test reports
        return {"outcome": "other", "error": type(e).__name__, "message": str(e)}


def free_list_sweep(original, workdir, at: int) -> None:
    """For each page X but the meta pages: a copy of ``original`` whose
    first free page (its number stored at byte ``at``) is X, written to
    (through percolite only) and then read back whole. Prints, per X, the
    write's outcome and the read's."""
    import pathlib
    import shutil

    raw = bytearray((pathlib.Path(original) / "data.mdb").read_bytes())
    outcomes = {}
    for page in range(2, len(raw) // 4096):
        copy = pathlib.Path(workdir) / f"free{page}"
        shutil.copytree(original, copy)
        raw[at : at + 8] = page.to_bytes(8, "little")
        (copy / "data.mdb").write_bytes(raw)
        try:
            with percolite.open(copy, create=False) as env:
                env.run(lambda tx: tx.set(b"new", DOC, b"v"), retries=0)
            write = "ok"
        except percolite.Error as e:
            write = f"{type(e).__name__}: {e}"
        outcomes[page] = (write, _read_all(copy))
        shutil.rmtree(copy)
    print(json.dumps(outcomes))


def fault_then_reuse(path, row: bytes, elsewhere: bytes) -> None:
    """Reads ``row`` (whose value's size field was damaged, so reading it
    runs off the end of the map), then uses the same handle again, then
    reopens the store and reads ``elsewhere``. Prints what each step did."""
    steps = {}
    env = percolite.open(path, create=False)
    for step, action in (
        ("read", lambda: env.transaction().get(row, META)),
        ("again", lambda: env.transaction()),
    ):
        try:
            action()
            steps[step] = "ok"
        except percolite.Error as e:
            steps[step] = f"{type(e).__name__}: {e}"
    env.close()
    with percolite.open(path, create=False) as reopened, reopened.transaction() as tx:
        steps["reopened"] = tx.get(elsewhere, DOC).hex()
    print(json.dumps(steps))
