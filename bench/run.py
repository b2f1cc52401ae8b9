"""Run percolite's benchmarks and write one JSON report per benchmark.

Usage: ``python bench/run.py [--quick] [--only NAME ...] [--out DIR]``; the
tables go to stdout, progress to stderr, ``DIR/<name>.json`` (default
``bench/results/``) gets each report. See ``bench/README.md``.

To add a benchmark, write ``bench/bench_<name>.py`` with the interface
described in ``common.py`` (``NAME``, ``add_arguments``, ``run``,
``format_report``) and list it in ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType

import bench_commit
import bench_hotkeys
import bench_notify
from common import RESULTS_DIR, add_common_arguments, finish_arguments, log, write_json

BENCHMARKS: tuple[ModuleType, ...] = (bench_commit, bench_notify, bench_hotkeys)


def main(argv: list[str] | None = None) -> int:
    names = [benchmark.NAME for benchmark in BENCHMARKS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser)
    for benchmark in BENCHMARKS:
        # One group per benchmark; argparse refuses two benchmarks defining one option.
        benchmark.add_arguments(parser.add_argument_group(f"{benchmark.NAME} benchmark"))
    parser.add_argument(
        "--only",
        nargs="+",
        choices=names,
        default=names,
        metavar="NAME",
        help=f"benchmarks to run (default: all of {', '.join(names)})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR,
        help="directory of the JSON reports, one <name>.json each (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    finish_arguments(parser, args)

    for benchmark in BENCHMARKS:
        if benchmark.NAME not in args.only:
            continue
        report = benchmark.run(args)
        print(benchmark.format_report(report), flush=True)
        print(flush=True)
        path = args.out / f"{benchmark.NAME}.json"
        write_json(path, report)
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
