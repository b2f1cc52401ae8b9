"""Reads: point look-ups and scans through percolite's transactions, against py-lmdb.

Every read of percolite checks what it reads: each stored record carries a
CRC32C of its key and contents, verified on every read, and every call into
LMDB runs under a guard that turns a fault on damaged pages into an error.
This benchmark measures the read path those checks sit on, so that their
cost shows when two builds are compared (``compare_builds.py``), and puts
py-lmdb's raw reads of the same data beside it for scale.

* **Look-ups**, reads/s: ``--reads-lookups`` random existing keys read one
  by one in one transaction (percolite: ``tx.get(row, column)``; py-lmdb:
  ``txn.get(key)``).
* **Look-ups in bulk**, reads/s: the same keys read in one call
  (percolite: ``tx.get_many(cells)``; py-lmdb: ``cursor.getmulti(keys)``),
  beside the loop for scale: what a Python loop costs per read.
* **Scan**, cells/s: every cell of the store, in key order, in one
  transaction (percolite: ``tx.scan()``; py-lmdb: a cursor over the table).

Both stores hold ``--reads-cells`` cells of ``--reads-value-size`` bytes,
written once before the timing. One thread: percolite's reads come back to
Python through its bindings, and this measures that path whole. The two
systems take turns of 10,000 reads (each in its own transaction, open for
the whole run), so that a busy machine's drift falls on both alike; who
goes first alternates between runs.

Targets (TARGETS), percolite / py-lmdb on the same data: look-ups at least
0.8x, in a loop and in bulk (each against py-lmdb's own form), and the scan
at least 0.6x (about 0.25 microseconds a cell).

Run it alone (``python bench/bench_reads.py``, report in
``bench/results/reads.json``) or through ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import lmdb
import percolite
from common import (
    OptionGroup,
    Plot,
    Table,
    Target,
    chosen,
    format_table,
    format_targets,
    log,
    machine_info,
    median,
    run_order,
    run_standalone,
    scratch_dir,
)

NAME = "reads"
COLUMN = ("c", "v")
SYSTEMS = ("percolite", "lmdb")
SYSTEM_LABELS = {"percolite": "percolite", "lmdb": "py-lmdb"}
OPERATIONS = ("lookups", "lookups_bulk", "scan")
# percolite / py-lmdb, per operation
TARGETS = {"lookups": 0.8, "lookups_bulk": 0.8, "scan": 0.6}
DEFAULT_CELLS, QUICK_CELLS = 200_000, 20_000
DEFAULT_LOOKUPS, QUICK_LOOKUPS = 200_000, 20_000
DEFAULT_VALUE_SIZE = 100
LMDB_MAP_SIZE = 1 << 30
# Reads (keys, or cells of a scan) each system does before the other takes
# its turn: drift on a busy machine then falls on both alike.
SLICE = 10_000


def _row(i: int) -> bytes:
    return b"row%09d" % i


def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only."""
    parser.add_argument(
        "--reads-cells",
        type=int,
        metavar="N",
        help=f"cells in each store (default: {DEFAULT_CELLS:,}; {QUICK_CELLS:,} with --quick)",
    )
    parser.add_argument(
        "--reads-lookups",
        type=int,
        metavar="N",
        help=f"random look-ups per run (default: {DEFAULT_LOOKUPS:,}; "
        f"{QUICK_LOOKUPS:,} with --quick)",
    )
    parser.add_argument(
        "--reads-value-size",
        type=int,
        default=DEFAULT_VALUE_SIZE,
        metavar="BYTES",
        help="bytes of each value (default: %(default)s)",
    )


def _fill_percolite(store: Path, cells: int, value: bytes) -> percolite.Env:
    env = percolite.open(store, sync="none")
    for start in range(0, cells, 10_000):

        def write(tx: Any, start: int = start) -> None:
            for i in range(start, min(cells, start + 10_000)):
                tx.set(_row(i), COLUMN, value)

        env.run(write)
    return env


def _fill_lmdb(store: Path, cells: int, value: bytes) -> lmdb.Environment:
    env = lmdb.open(str(store), sync=False, map_size=LMDB_MAP_SIZE)
    with env.begin(write=True) as txn:
        for i in range(cells):
            txn.put(_row(i), value)
    return env


def _slices(keys: list[bytes]) -> list[list[bytes]]:
    return [keys[i : i + SLICE] for i in range(0, len(keys), SLICE)]


def _cells_in_turns(cells: Iterator[Any]) -> Iterator[int]:
    while count := sum(1 for _ in islice(cells, SLICE)):
        yield count


def _percolite_turns(tx: Any, operation: str, slices: list[list[bytes]]) -> Iterator[int]:
    """``operation`` in turns: each step reads the next slice and yields how
    many it read."""
    if operation == "scan":
        yield from _cells_in_turns(iter(tx.scan()))
        return
    for part in slices:
        if operation == "lookups":
            for key in part:
                if tx.get(key, COLUMN) is None:
                    raise RuntimeError(f"percolite lost {key!r}")
        elif None in tx.get_many([(key, COLUMN) for key in part]):
            raise RuntimeError("percolite lost a key")
        yield len(part)


def _lmdb_turns(txn: Any, operation: str, slices: list[list[bytes]]) -> Iterator[int]:
    if operation == "scan":
        yield from _cells_in_turns(iter(txn.cursor()))
        return
    for part in slices:
        if operation == "lookups":
            for key in part:
                if txn.get(key) is None:
                    raise RuntimeError(f"py-lmdb lost {key!r}")
        elif len(txn.cursor().getmulti(part)) != len(part):
            raise RuntimeError("py-lmdb lost a key")
        yield len(part)


def _measure(
    stores: dict[str, Any], slices: list[list[bytes]], turn: int
) -> dict[str, dict[str, float]]:
    """Reads per second of each system and operation, the systems taking
    turns slice by slice (``run_order`` decides who goes first)."""
    rates: dict[str, dict[str, float]] = {system: {} for system in SYSTEMS}
    with stores["percolite"].transaction() as tx, stores["lmdb"].begin() as txn:
        for operation in OPERATIONS:
            turns = {
                "percolite": _percolite_turns(tx, operation, slices),
                "lmdb": _lmdb_turns(txn, operation, slices),
            }
            seconds = dict.fromkeys(SYSTEMS, 0.0)
            counts = dict.fromkeys(SYSTEMS, 0)
            active = run_order(SYSTEMS, turn)
            while active:
                for system in list(active):
                    begin = time.perf_counter()
                    count = next(turns[system], 0)
                    seconds[system] += time.perf_counter() - begin
                    if count:
                        counts[system] += count
                    else:
                        active.remove(system)
            for system in SYSTEMS:
                rates[system][operation] = counts[system] / seconds[system]
    return rates


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Fill both stores once, then measure each ``args.repeat`` times,
    alternating which goes first; return the report."""
    cells = chosen(args.reads_cells, QUICK_CELLS if args.quick else DEFAULT_CELLS)
    lookups = chosen(args.reads_lookups, QUICK_LOOKUPS if args.quick else DEFAULT_LOOKUPS)
    if cells < 1 or lookups < 1 or args.reads_value_size < 0:
        raise ValueError(
            "--reads-cells and --reads-lookups must be positive, --reads-value-size not negative"
        )
    value = b"v" * args.reads_value_size
    rng = random.Random(7)
    keys = [_row(rng.randrange(cells)) for _ in range(lookups)]
    runs: dict[str, list[dict[str, float]]] = {system: [] for system in SYSTEMS}
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        log(f"{NAME}: writing {cells:,} cells to each store")
        stores = {
            "percolite": _fill_percolite(scratch / "percolite", cells, value),
            "lmdb": _fill_lmdb(scratch / "lmdb", cells, value),
        }
        slices = _slices(keys)
        try:
            for repetition in range(args.repeat):
                measured_by_system = _measure(stores, slices, repetition)
                for system in SYSTEMS:
                    measured = measured_by_system[system]
                    runs[system].append({k: round(v, 1) for k, v in measured.items()})
                    log(
                        f"{NAME}: {SYSTEM_LABELS[system]:>9} run {repetition + 1}/{args.repeat}: "
                        f"{measured['lookups']:,.0f} look-ups/s, "
                        f"{measured['lookups_bulk']:,.0f} in bulk, {measured['scan']:,.0f} cells/s"
                    )
        finally:
            for store in stores.values():
                store.close()
    results = {
        operation: {
            **{
                system: {
                    "median_per_s": median([r[operation] for r in runs[system]]),
                    "runs": [r[operation] for r in runs[system]],
                }
                for system in SYSTEMS
            }
        }
        for operation in OPERATIONS
    }
    for operation in OPERATIONS:
        ours = results[operation]["percolite"]["median_per_s"]
        theirs = results[operation]["lmdb"]["median_per_s"]
        results[operation]["ratio"] = round(ours / theirs, 3) if theirs else None
    return {
        "benchmark": NAME,
        "measures": "random look-ups (one by one, and in bulk) and a full scan per second, "
        "one thread, one transaction",
        "settings": {
            "cells": cells,
            "lookups": lookups,
            "value_size": args.reads_value_size,
            "repeat": args.repeat,
            "quick": args.quick,
        },
        "versions": {
            "percolite": percolite.__version__,
            "percolite_module": str(Path(percolite.__file__).parent),
            "py_lmdb": lmdb.__version__,
        },
        "machine": machine_info(),
        "results": results,
    }


_HEADERS = ["read", "percolite /s", "py-lmdb /s", "percolite / py-lmdb"]
_LABELS = {
    "lookups": "random look-ups",
    "lookups_bulk": "random look-ups, bulk",
    "scan": "full scan (cells)",
}


def _rows(report: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for operation in OPERATIONS:
        result = report["results"][operation]
        ratio = result["ratio"]
        rows.append(
            [
                _LABELS[operation],
                f"{result['percolite']['median_per_s']:,.0f}",
                f"{result['lmdb']['median_per_s']:,.0f}",
                "-" if ratio is None else f"{ratio:.2f}x",
            ]
        )
    return rows


def _title(settings: dict[str, Any]) -> str:
    return (
        f"Reads in one transaction, one thread, median of {settings['repeat']} runs: "
        f"{settings['cells']:,} cells of {settings['value_size']} bytes, "
        f"{settings['lookups']:,} random look-ups"
    )


def tables(report: dict[str, Any]) -> list[Table]:
    """The table of ``REPORT.md`` (see ``common.py``)."""
    return [Table(_title(report["settings"]), _HEADERS, _rows(report), [])]


def plots(report: dict[str, Any]) -> list[Plot]:
    return []


_TARGET_NAMES = {
    "lookups": "reads: random look-ups, tx.get in a loop / py-lmdb txn.get",
    "lookups_bulk": "reads: random look-ups in bulk, tx.get_many / py-lmdb getmulti",
    "scan": "reads: full scan, tx.scan() / a py-lmdb cursor walk",
}


def targets(report: dict[str, Any]) -> list[Target]:
    return [
        Target(_TARGET_NAMES[operation], report["results"][operation]["ratio"], needed)
        for operation, needed in TARGETS.items()
    ]


def format_report(report: dict[str, Any]) -> str:
    table = "\n".join([_title(report["settings"]), "", format_table(_HEADERS, _rows(report))])
    return table + "\n\n" + format_targets(targets(report))


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
