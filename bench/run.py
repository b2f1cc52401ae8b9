"""Run percolite's benchmarks; write JSON reports, REPORT.md and PNG plots.

Usage: ``python bench/run.py [--quick] [--only NAME ...] [--out DIR]
[--report-only]``. Each benchmark's tables go to stdout as it finishes, then
the table of targets; progress goes to stderr. ``DIR`` (default
``bench/results/``) gets ``<name>.json`` per benchmark, ``summary.json`` (the
targets, the files written), ``REPORT.md`` and the plots
(``<name>-<plot>.png``). ``REPORT.md`` covers every registered benchmark with
a JSON report in ``DIR``: the ones just run and, from earlier runs, the
others (each section says when it was measured). ``--report-only`` measures
nothing and rebuilds ``REPORT.md``, the plots and ``summary.json`` from the
JSON files in ``DIR``. See ``bench/README.md``.

To add a benchmark, write ``bench/bench_<name>.py`` with the interface
described in ``common.py`` (``NAME``, ``add_arguments``, ``run``,
``format_report``, and optionally ``tables``, ``plots``, ``targets``) and list
it in ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import bench_commit
import bench_export
import bench_first_commit
import bench_growth
import bench_hotkeys
import bench_loader
import bench_notify
import bench_phrasecount
import bench_postgresql
import bench_reads
import bench_simulation
import bench_sqlite_sink
import bench_storage
import bench_webindex
from common import RESULTS_DIR, add_common_arguments, finish_arguments, log, write_json
from report import SUMMARY_NAME, format_targets_table, write_report

BENCHMARKS: tuple[ModuleType, ...] = (
    bench_commit,
    bench_notify,
    bench_hotkeys,
    bench_storage,
    bench_reads,
    bench_first_commit,
    bench_loader,
    bench_export,
    bench_sqlite_sink,
    bench_phrasecount,
    bench_growth,
    bench_simulation,
    bench_postgresql,
    bench_webindex,
)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
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
        help="directory of the JSON reports, REPORT.md and the plots (default: %(default)s)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: rebuild REPORT.md, the plots and summary.json from the JSON in --out",
    )
    args = parser.parse_args(argv)
    finish_arguments(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if not args.report_only:
        for benchmark in BENCHMARKS:
            if benchmark.NAME not in args.only:
                continue
            log(f"== {benchmark.NAME}")
            report = benchmark.run(args)
            print(benchmark.format_report(report), flush=True)
            print(flush=True)
            path = args.out / f"{benchmark.NAME}.json"
            write_json(path, report)
            log(f"wrote {path}")

    reports = load_reports(args.out)
    markdown, pictures, targets = write_report(args.out, BENCHMARKS, reports)
    write_json(
        args.out / SUMMARY_NAME,
        {
            "benchmarks": {
                name: {
                    "json": f"{name}.json",
                    "measured_utc": (report.get("machine") or {}).get("time_utc"),
                }
                for name, report in reports.items()
            },
            "targets": [
                {
                    "name": target.name,
                    "measured_ratio": target.measured,
                    "target_ratio": target.target,
                    "met": target.met,
                }
                for target in targets
            ],
            "report": markdown.name,
            "plots": [picture.name for picture in pictures],
        },
    )
    log(f"wrote {markdown} and {len(pictures)} plots")
    print(format_targets_table(targets), flush=True)
    return 0


def load_reports(out: Path) -> dict[str, dict[str, Any]]:
    """``{NAME: report}`` for every registered benchmark with a JSON file in ``out``."""
    reports = {}
    for benchmark in BENCHMARKS:
        path = out / f"{benchmark.NAME}.json"
        if path.exists():
            reports[benchmark.NAME] = json.loads(path.read_text(encoding="utf-8"))
    return reports


if __name__ == "__main__":
    sys.exit(main())
