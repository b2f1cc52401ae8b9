"""First commit: what a process pays once, before its first commit to a store.

LMDB hands out the pages its free list names without asking whether a tree
still uses them, so a damaged free list would let a commit overwrite live
data. Before a process's first commit to a store, percolite therefore walks
the pages that prove the free list sound: the free list, the table list and
every branch page, and the leaf pages (with the first page of each overflow
run) of tables holding values too large for a page. This benchmark times
that walk as a user sees it: a fresh process opens the store and commits one
cell twice; the first commit minus the second is the walk.

Two stores of about ``--first-commit-mb`` megabytes each, one per entry of
SHAPES: small values (no overflow pages: only branch pages are read) and values
larger than a page (every value an overflow run: leaves and runs' first pages
are read). The page cache is warm (the stores were just written); a cold cache
adds the reads from disk. No target: the figure is a once-per-process cost,
reported in milliseconds and per gigabyte of store.

Run it alone (``python bench/bench_first_commit.py``, report in
``bench/results/first_commit.json``) or through ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import percolite
from common import (
    OptionGroup,
    Table,
    chosen,
    format_table,
    log,
    machine_info,
    median,
    run_standalone,
    scratch_dir,
)

NAME = "first_commit"
COLUMN = ("c", "v")
DEFAULT_MB, QUICK_MB = 300, 10
SHAPES = {"small values": 100, "8 KB values": 8000}

# Run in a fresh process: percolite shares one store handle per process, and
# the walk runs once per handle.
_CHILD = """
import json, sys, time
import percolite
with percolite.open(sys.argv[1], create=False) as env:
    seconds = []
    for row in ("first", "second"):
        start = time.perf_counter()
        env.run(lambda tx: tx.set(row, ("c", "v"), b"x"))
        seconds.append(time.perf_counter() - start)
print(json.dumps(seconds))
"""


def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only."""
    parser.add_argument(
        "--first-commit-mb",
        type=int,
        metavar="MB",
        help=f"megabytes of values in each store (default: {DEFAULT_MB}; {QUICK_MB} with --quick)",
    )


def _fill(store: Path, megabytes: int, value_size: int) -> int:
    """Writes about ``megabytes`` of values; returns the data file's size."""
    cells = megabytes * 1_000_000 // value_size
    value = b"v" * value_size
    with percolite.open(store, sync="none") as env:
        for start in range(0, cells, 10_000):

            def write(tx: Any, start: int = start) -> None:
                for i in range(start, min(cells, start + 10_000)):
                    tx.set(b"row%09d" % i, COLUMN, value)

            env.run(write)
    return (store / "data.mdb").stat().st_size


def _first_and_second(store: Path) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(store)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    first, second = json.loads(out.strip().splitlines()[-1])
    return first, second


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Fill both stores once, then time ``args.repeat`` fresh processes on each."""
    megabytes = chosen(args.first_commit_mb, QUICK_MB if args.quick else DEFAULT_MB)
    if megabytes < 1:
        raise ValueError("--first-commit-mb must be positive")
    results: dict[str, Any] = {}
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        for shape, value_size in SHAPES.items():
            store = scratch / shape.replace(" ", "-")
            log(f"{NAME}: writing about {megabytes} MB of {shape}")
            size = _fill(store, megabytes, value_size)
            runs = [_first_and_second(store) for _ in range(args.repeat)]
            walk_ms = median([(first - second) * 1000 for first, second in runs])
            results[shape] = {
                "file_mb": round(size / 1e6, 1),
                "first_ms": [round(first * 1000, 2) for first, _ in runs],
                "second_ms": [round(second * 1000, 2) for _, second in runs],
                "walk_ms": round(walk_ms, 2),
                "walk_ms_per_gb": round(walk_ms / (size / 1e9), 1),
            }
            log(f"{NAME}: {shape}: {walk_ms:.1f} ms for {size / 1e6:.0f} MB")
    return {
        "benchmark": NAME,
        "measures": "a fresh process's first commit minus its second, warm page cache",
        "settings": {"megabytes": megabytes, "repeat": args.repeat, "quick": args.quick},
        "versions": {
            "percolite": percolite.__version__,
            "percolite_module": str(Path(percolite.__file__).parent),
        },
        "machine": machine_info(),
        "results": results,
    }


_HEADERS = ["store", "data file", "first commit", "second commit", "walk", "walk per GB"]


def _rows(report: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            shape,
            f"{r['file_mb']:,.0f} MB",
            f"{median(r['first_ms']):.1f} ms",
            f"{median(r['second_ms']):.1f} ms",
            f"{r['walk_ms']:.1f} ms",
            f"{r['walk_ms_per_gb']:.0f} ms",
        ]
        for shape, r in report["results"].items()
    ]


def _title(settings: dict[str, Any]) -> str:
    return (
        f"A fresh process's first commit, median of {settings['repeat']} processes, warm page cache"
    )


def tables(report: dict[str, Any]) -> list[Table]:
    """The table of ``REPORT.md`` (see ``common.py``)."""
    return [Table(_title(report["settings"]), _HEADERS, _rows(report), [])]


def format_report(report: dict[str, Any]) -> str:
    return "\n".join([_title(report["settings"]), "", format_table(_HEADERS, _rows(report))])


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
