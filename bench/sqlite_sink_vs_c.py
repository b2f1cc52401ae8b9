"""The SQLite export sink against SQLite's C API, side by side.

``bench/sqlite_c_upsert.cc`` (built here with the system compiler against
libsqlite3: ``apt-get install libsqlite3-dev``, which scripts/bootstrap.sh
installs) upserts ROWS rows (key ``k%09d``, an int value, seq) into a new
table in batches of BATCH, one ``BEGIN IMMEDIATE`` transaction each, WAL,
``synchronous=FULL``: what percolite.exporters.SQLite does at best. Beside it,
in rotating order, each round on fresh files:

* **native sink**: the same batches applied by the export queue's native path
  (the exporter's ``_native_sink``), from queued bytes, in one thread;
* **python sink**: the same batches handed to the exporter (its Python path);
* **queue native** / **queue python**: the whole export queue (``sync="full"``
  store, one worker thread) draining ROWS queued entries into the sink,
  natively and with ``PERCOLITE_NATIVE_SINKS=0``.

Reports rows/s (median of the rounds) and each one's ratio to the C program
of the same round. ``python bench/sqlite_sink_vs_c.py [--rows N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import percolite
from common import BENCH_DIR, RESULTS_DIR, scratch_dir
from percolite.exporters import SequencedExport, SQLite

BATCH = 1024
STORE = "5" * 32  # the owner of the sinks alone
TABLE = "t"


def build_c(scratch: Path) -> Path:
    binary = scratch / "sqlite_c_upsert"
    compiler = os.environ.get("CXX", "c++")
    source = BENCH_DIR / "sqlite_c_upsert.cc"
    subprocess.run([compiler, "-O2", "-o", binary, source, "-lsqlite3"], check=True)
    return binary


def key(i: int) -> str:
    return f"k{i:09d}"


def run_c(binary: Path, path: Path, rows: int) -> float:
    out = subprocess.run(
        [binary, path, str(rows), str(BATCH)], check=True, capture_output=True, text=True
    )
    return float(json.loads(out.stdout)["rows_per_s"])


def set_up(path: Path) -> SQLite:
    """A sink whose tables and owner exist, as after a queue's first batch
    (k000000000 holds seq 0 already: the timed batches leave it as it is)."""
    sink = SQLite(path, TABLE)
    batch = percolite.ExportBatch([SequencedExport(key(0), 0, 0)])
    batch.queue, batch.store, batch.epoch = "out", STORE, 1
    sink(batch)
    return sink


def run_native_sink(path: Path, rows: int) -> float:
    sink = set_up(path)
    native, why = sink._native_sink(("str", 0), ("int64", 0))
    assert native is not None, why
    batches = [
        [
            (key(i).encode(), b"\x01" + i.to_bytes(8, "big", signed=True), i)
            for i in range(start, min(rows, start + BATCH))
        ]
        for start in range(0, rows, BATCH)
    ]
    began = time.perf_counter()
    for batch in batches:
        assert native.deliver(batch, STORE, 1) == (True, None, None)
    seconds = time.perf_counter() - began
    assert len(sink.rows()) == rows
    sink.close()
    return rows / seconds


def run_python_sink(path: Path, rows: int) -> float:
    sink = set_up(path)
    batches = [
        [SequencedExport(key(i), i, i) for i in range(start, min(rows, start + BATCH))]
        for start in range(0, rows, BATCH)
    ]
    began = time.perf_counter()
    for batch in batches:
        sink(batch)
    seconds = time.perf_counter() - began
    assert len(sink.rows()) == rows
    sink.close()
    return rows / seconds


def run_queue(path: Path, rows: int, native: bool) -> float:
    if native:
        os.environ.pop("PERCOLITE_NATIVE_SINKS", None)
    else:
        os.environ["PERCOLITE_NATIVE_SINKS"] = "0"
    sink = SQLite(path.with_suffix(".sqlite"), TABLE)
    app = percolite.App("sink_bench")
    queue = app.export_queue("out", sink, value_codec="int64", buckets=16, batch_size=BATCH)
    os.environ.pop("PERCOLITE_NATIVE_SINKS", None)
    assert (queue.delivery == "native") == native, queue.delivery
    with percolite.open(path, app=app, sync="full") as env:
        for start in range(0, rows, 1000):
            with env.transaction() as tx:
                for i in range(start, min(rows, start + 1000)):
                    queue.add(tx, key(i), i)
        began = time.perf_counter()
        assert env.process(1, timeout=600)["idle"]
        seconds = time.perf_counter() - began
    assert len(sink.rows()) == rows
    sink.close()
    return rows / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-queue", action="store_true", help="the sinks alone only")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "sqlite_sink.json")
    parser.add_argument(
        "--scratch",
        type=Path,
        default=RESULTS_DIR,
        help="where the files go (default: %(default)s; on a tmpfs such as /dev/shm, "
        "fsync costs nothing and the comparison is of CPU time)",
    )
    args = parser.parse_args(argv)
    with scratch_dir(args.scratch, "sqlite-sink-") as scratch:
        binary = build_c(scratch)
        systems: dict[str, Callable[[Path], float]] = {
            "c api": lambda p: run_c(binary, p, args.rows),
            "native sink": lambda p: run_native_sink(p, args.rows),
            "python sink": lambda p: run_python_sink(p, args.rows),
        }
        if not args.no_queue:
            systems["queue native"] = lambda p: run_queue(p, args.rows, True)
            systems["queue python"] = lambda p: run_queue(p, args.rows, False)
        names = list(systems)
        rates: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                path = scratch / f"{round_}-{name.replace(' ', '-')}"
                rates[name].append(systems[name](path))
                print(f"round {round_}: {name}: {rates[name][-1]:,.0f} rows/s", file=sys.stderr)
    report = {
        "rows": args.rows,
        "batch": BATCH,
        "rounds": args.rounds,
        "rows_per_s": {name: round(statistics.median(r), 1) for name, r in rates.items()},
        "ratio_to_c": {
            name: round(statistics.median(a / c for a, c in zip(r, rates["c api"], strict=True)), 3)
            for name, r in rates.items()
        },
    }
    print(f"{'system':<14}{'rows/s':>12}{'x C API':>10}")
    for name in names:
        print(f"{name:<14}{report['rows_per_s'][name]:>12,.0f}{report['ratio_to_c'][name]:>10.2f}")
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
