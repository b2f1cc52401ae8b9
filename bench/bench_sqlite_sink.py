"""The SQLite export sink against SQLite's C API, side by side.

``bench/sqlite_c_upsert.cc`` (built here with the system compiler against
libsqlite3: ``apt-get install libsqlite3-dev``, which scripts/bootstrap.sh
installs) upserts ``--sink-rows`` rows (key ``k%09d``, an int value, seq)
into a new table in batches of BATCH, one ``BEGIN IMMEDIATE`` transaction
each, WAL, ``synchronous=FULL``: what percolite.exporters.SQLite does at
best. Beside it, in rotating order, each round on fresh files:

* **native sink**: the same batches applied by the export queue's native path
  (the exporter's ``_native_sink``), from queued bytes, in one thread;
* **python sink**: the same batches handed to the exporter (its Python path);
* **queue native** / **queue python**: the whole export queue (``sync="full"``
  store, one worker thread) draining the same rows, queued beforehand, into
  the sink, natively and with ``PERCOLITE_NATIVE_SINKS=0``.

Reports rows/s (median of the rounds) and each one's ratio to the C program
of the same round (median of the rounds' ratios).

Target (TARGET): the native sink at least 0.8x the C program's rows/s.

Run it alone (``python bench/bench_sqlite_sink.py``, report in
``bench/results/sqlite_sink.json``) or through ``bench/run.py``.
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
from typing import Any

import percolite
from common import (
    BENCH_DIR,
    OptionGroup,
    Table,
    Target,
    chosen,
    format_table,
    format_targets,
    log,
    machine_info,
    run_order,
    run_standalone,
    scratch_dir,
)
from percolite.exporters import SequencedExport, SQLite

NAME = "sqlite_sink"
SYSTEMS = ("c api", "native sink", "python sink", "queue native", "queue python")
TARGET = 0.8  # the native sink / the C program
DEFAULT_ROWS, QUICK_ROWS = 100_000, 3_000
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


def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only."""
    parser.add_argument(
        "--sink-rows",
        type=int,
        metavar="N",
        help=f"rows upserted by each system in a round (default: {DEFAULT_ROWS:,}; "
        f"{QUICK_ROWS:,} with --quick)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``args.repeat`` rounds, each system once per round on fresh files,
    the order rotating; return the report."""
    rows = chosen(args.sink_rows, QUICK_ROWS if args.quick else DEFAULT_ROWS)
    if rows < 1:
        raise ValueError("--sink-rows must be positive")
    with scratch_dir(args.dir, "sqlite-sink-") as scratch:
        binary = build_c(scratch)
        systems: dict[str, Callable[[Path], float]] = {
            "c api": lambda p: run_c(binary, p, rows),
            "native sink": lambda p: run_native_sink(p, rows),
            "python sink": lambda p: run_python_sink(p, rows),
            "queue native": lambda p: run_queue(p, rows, True),
            "queue python": lambda p: run_queue(p, rows, False),
        }
        rates: dict[str, list[float]] = {name: [] for name in SYSTEMS}
        for round_ in range(args.repeat):
            for name in run_order(SYSTEMS, round_):
                path = scratch / f"{round_}-{name.replace(' ', '-')}"
                rates[name].append(round(systems[name](path), 1))
                rate = rates[name][-1]
                log(f"{NAME}: round {round_ + 1}/{args.repeat}: {name}: {rate:,.0f} rows/s")
    return {
        "benchmark": NAME,
        "measures": "rows/s upserted into SQLite (WAL, synchronous=FULL, one transaction per "
        f"batch of {BATCH}): the export sink's paths against SQLite's C API",
        "settings": {"rows": rows, "batch": BATCH, "repeat": args.repeat, "quick": args.quick},
        "versions": {"percolite": percolite.__version__},
        "machine": machine_info(),
        "results": {
            name: {
                "median_rows_per_s": statistics.median(rates[name]),
                "runs": rates[name],
                "ratio_to_c": round(
                    statistics.median(
                        a / c for a, c in zip(rates[name], rates["c api"], strict=True)
                    ),
                    3,
                ),
            }
            for name in SYSTEMS
        },
    }


_HEADERS = ["system", "rows/s", "x the C API"]
_LABELS = {
    "c api": "SQLite's C API (sqlite_c_upsert.cc)",
    "native sink": "native sink, alone",
    "python sink": "Python sink, alone",
    "queue native": "export queue, native delivery",
    "queue python": "export queue, Python delivery",
}


def _rows(report: dict[str, Any]) -> list[list[Any]]:
    results = report["results"]
    return [
        [
            _LABELS[name],
            f"{results[name]['median_rows_per_s']:,.0f}",
            f"{results[name]['ratio_to_c']:.2f}x",
        ]
        for name in SYSTEMS
    ]


def _title(settings: dict[str, Any]) -> str:
    return (
        f"Upserts into SQLite, rows/s, median of {settings['repeat']} rotating rounds: "
        f"{settings['rows']:,} rows in batches of {settings['batch']:,}, WAL, "
        "synchronous=FULL, one transaction per batch"
    )


_NOTES = [
    "Alone: the batches handed to the sink by one thread, no store. Export queue: the same "
    "rows queued in a store (sync=full) beforehand, drained by one worker thread, from the "
    "workers' start until idle. Ratios: the median of the rounds' ratios to the C program "
    "of the same round."
]


def tables(report: dict[str, Any]) -> list[Table]:
    """The table of ``REPORT.md`` (see ``common.py``)."""
    return [Table(_title(report["settings"]), _HEADERS, _rows(report), _NOTES)]


def targets(report: dict[str, Any]) -> list[Target]:
    return [
        Target(
            "sqlite sink: native sink / the same upserts through SQLite's C API, one thread",
            report["results"]["native sink"]["ratio_to_c"],
            TARGET,
        )
    ]


def format_report(report: dict[str, Any]) -> str:
    table = "\n".join([_title(report["settings"]), "", format_table(_HEADERS, _rows(report))])
    return table + "\n\n" + format_targets(targets(report))


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
