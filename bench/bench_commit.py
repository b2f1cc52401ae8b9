"""Durable single-cell commits per second: percolite's group commit vs py-lmdb.

What is measured: threads that each commit, as fast as they can, one small
durable transaction after another, every one writing a single new key (a
distinct row per transaction, so nothing conflicts). Throughput is committed
transactions per second summed over all threads.

* percolite: ``percolite.open(dir, sync="full")``; each transaction is
  ``with env.transaction() as tx: tx.set(row, ("c", "v"), value)``. With
  ``--backend memory`` the store is ``percolite.open(":memory:",
  backend="memory", sync="full")`` instead: nothing is written to disk, so
  its commits are not durable and the ratio to py-lmdb is no longer like for
  like (py-lmdb still runs, for reference).
* py-lmdb: ``lmdb.open(dir, sync=True, metasync=True, lock=True)``; each
  transaction is ``with env.begin(write=True) as txn: txn.put(key, value)``.

Why: both make every commit durable before it returns, so the cost of a commit
is dominated by the flush to disk. LMDB allows one writer at a time, so with
py-lmdb every transaction pays its own flush however many threads there are.
percolite's writer thread gathers the commits waiting at the same moment into
one LMDB transaction with one flush (group commit), so its throughput should
grow with the number of threads. The target is at least TARGET_RATIO times
py-lmdb's throughput at TARGET_THREADS threads.

How: both stores live in a scratch directory on the filesystem being measured
(by default under ``bench/results/``, the repository's filesystem, since
``/tmp`` may be a different one with a different fsync cost); every run gets a
fresh store, removed right after. Runs of the two systems alternate (and
swap order from one configuration to the next) so that drift on a noisy
machine hits both alike; each configuration is repeated and the medians are
reported, with the ratio percolite / py-lmdb per thread count.

Run it alone (``python bench/bench_commit.py``, report in
``bench/results/commit.json``) or through ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import percolite
from common import (
    REPO_ROOT,
    Operation,
    OptionGroup,
    Plot,
    RunResult,
    Table,
    Target,
    format_range,
    format_table,
    log,
    machine_info,
    median,
    median_or_none,
    pair_ratios,
    run_order,
    run_standalone,
    run_threads,
    same_filesystem,
    scratch_dir,
    spread,
)

NAME = "commit"
TARGET_THREADS = 16
TARGET_RATIO = 4.0
# Runs of one configuration further apart than this mean the machine was busy.
NOISY_SPREAD = 1.5
DEFAULT_VALUE_SIZE = 100
BACKENDS = ("lmdb", "memory")
DEFAULT_BACKEND = "lmdb"
COLUMN = ("c", "v")
LMDB_MAP_SIZE = 1 << 30

SYSTEMS = ("percolite", "lmdb")
SYSTEM_LABELS = {"percolite": "percolite", "lmdb": "py-lmdb"}


def _label(system: str, backend: str) -> str:
    """A system's name in tables and logs: percolite's says its backend
    unless it is the default (reports from before ``--backend`` have none)."""
    label = SYSTEM_LABELS[system]
    if system == "percolite" and backend != DEFAULT_BACKEND:
        label += f" ({backend})"
    return label


def _backend(report: dict[str, Any]) -> str:
    return report["settings"].get("backend", DEFAULT_BACKEND)


def _row(thread_index: int, iteration: int) -> bytes:
    """A key no other transaction of the run writes."""
    return b"t%03d-%012d" % (thread_index, iteration)


def _open_percolite(store: Path, backend: str) -> percolite.Env:
    """The store measured. ``backend=`` is passed only for the memory backend:
    builds from before the backends existed have no such argument, and this
    module also measures them (``compare_builds.py``)."""
    if backend == "lmdb":
        return percolite.open(store, sync="full")
    return percolite.open(":memory:", backend=backend, sync="full")


def _measure_percolite(
    store: Path, threads: int, seconds: float, value: bytes, backend: str = DEFAULT_BACKEND
) -> dict[str, Any]:
    env = _open_percolite(store, backend)
    try:
        before = env.stats()

        def make_operation(thread_index: int) -> Operation:
            def commit_one(iteration: int) -> None:
                with env.transaction() as tx:
                    tx.set(_row(thread_index, iteration), COLUMN, value)

            return commit_one

        result = run_threads(make_operation, threads, seconds)
        after = env.stats()
    finally:
        env.close()
    batches = after["batches"] - before["batches"]
    commits = after["commits"] - before["commits"]
    # How many transactions shared one LMDB commit (one flush) on average.
    commits_per_batch = round(commits / batches, 2) if batches else None
    return {**_record(result), "commits_per_batch": commits_per_batch}


def _measure_lmdb(store: Path, threads: int, seconds: float, value: bytes) -> dict[str, Any]:
    env = lmdb.open(str(store), sync=True, metasync=True, map_size=LMDB_MAP_SIZE, lock=True)
    try:

        def make_operation(thread_index: int) -> Operation:
            def commit_one(iteration: int) -> None:
                with env.begin(write=True) as txn:
                    txn.put(_row(thread_index, iteration), value)

            return commit_one

        result = run_threads(make_operation, threads, seconds)
    finally:
        env.close()
    return _record(result)


def _record(result: RunResult) -> dict[str, Any]:
    """One run as it appears in the JSON report."""
    return {
        "tx_per_s": round(result.per_second, 1),
        "transactions": result.ops,
        "seconds": round(result.seconds, 4),
    }


MEASURE: dict[str, Callable[[Path, int, float, bytes], dict[str, Any]]] = {
    "percolite": _measure_percolite,
    "lmdb": _measure_lmdb,
}


def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only."""
    parser.add_argument(
        "--value-size",
        type=int,
        default=DEFAULT_VALUE_SIZE,
        metavar="BYTES",
        help="bytes of the value written by each transaction (default: %(default)s)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=DEFAULT_BACKEND,
        help="percolite's storage backend: lmdb (a store in the scratch directory) or memory "
        "(':memory:', nothing on disk, not durable); py-lmdb runs either way "
        "(default: %(default)s)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every thread count ``args.repeat`` times for both systems, and
    return the report (settings, every run, medians, ratios, target)."""
    if args.value_size < 0:
        raise ValueError("--value-size must not be negative")
    value = b"v" * args.value_size
    # bench_storage calls run() with a namespace of its own, without a backend.
    backend = getattr(args, "backend", DEFAULT_BACKEND)
    if backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}")
    measure = {**MEASURE, "percolite": functools.partial(_measure_percolite, backend=backend)}
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {
        (system, threads): [] for system in SYSTEMS for threads in args.threads
    }
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        on_repo_filesystem = same_filesystem(scratch, REPO_ROOT)
        for repetition in range(args.repeat):
            for position, threads in enumerate(args.threads):
                for system in run_order(SYSTEMS, repetition + position):
                    store = scratch / f"{system}-{threads}t-{repetition}"
                    measured = measure[system](store, threads, args.seconds, value)
                    shutil.rmtree(store, ignore_errors=True)
                    runs[system, threads].append(measured)
                    log(
                        f"{NAME}: {_label(system, backend):>9} {threads:>3} threads, "
                        f"run {repetition + 1}/{args.repeat}: {measured['tx_per_s']:,.0f} tx/s"
                    )

    results = [_summarise(threads, runs) for threads in args.threads]
    return {
        "benchmark": NAME,
        "measures": "durable single-cell write transactions per second (all threads together)",
        "settings": {
            "threads": list(args.threads),
            "seconds": args.seconds,
            "repeat": args.repeat,
            "value_size": args.value_size,
            "quick": args.quick,
            "store_parent": str(Path(args.dir).resolve()),
            "store_on_repo_filesystem": on_repo_filesystem,
            "backend": backend,
            "percolite": {"sync": "full", "backend": backend},
            "lmdb": {"sync": True, "metasync": True, "lock": True, "map_size": LMDB_MAP_SIZE},
        },
        "versions": {
            "percolite": percolite.__version__,
            "percolite_module": str(Path(percolite.__file__).parent),
            "py_lmdb": lmdb.__version__,
            "py_lmdb_liblmdb": ".".join(map(str, lmdb.version())),
        },
        "machine": machine_info(),
        "results": results,
        "target": _target(results),
    }


def _summarise(threads: int, runs: dict[tuple[str, int], list[dict[str, Any]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"threads": threads}
    for system in SYSTEMS:
        measured = runs[system, threads]
        rates = [run["tx_per_s"] for run in measured]
        summary[system] = {
            "median_tx_per_s": median(rates),
            "spread": spread(rates),
            "runs": measured,
        }
    summary["percolite"]["median_commits_per_batch"] = median_or_none(
        run["commits_per_batch"] for run in runs["percolite", threads]
    )
    baseline = summary["lmdb"]["median_tx_per_s"]
    ratio = summary["percolite"]["median_tx_per_s"] / baseline if baseline else None
    summary["ratio"] = None if ratio is None else round(ratio, 3)
    # Runs of one repetition ran back to back, so their ratios show the spread.
    summary["ratio_per_repetition"] = pair_ratios(
        [run["tx_per_s"] for run in runs["percolite", threads]],
        [run["tx_per_s"] for run in runs["lmdb", threads]],
        3,
    )
    return summary


def _target(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The goal, and whether this run reached it (``None``: not measured)."""
    ratio: float | None = next(
        (r["ratio"] for r in results if r["threads"] == TARGET_THREADS), None
    )
    return {
        "threads": TARGET_THREADS,
        "min_ratio": TARGET_RATIO,
        "ratio": ratio,
        "met": None if ratio is None else ratio >= TARGET_RATIO,
    }


def _rows(report: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            r["threads"],
            f"{r['percolite']['median_tx_per_s']:,.0f}",
            f"{r['lmdb']['median_tx_per_s']:,.0f}",
            "-" if r["ratio"] is None else f"{r['ratio']:.2f}x",
            format_range(r["ratio_per_repetition"]),
            _format_optional(r["percolite"]["median_commits_per_batch"]),
        ]
        for r in report["results"]
    ]


def _headers(backend: str) -> list[str]:
    return [
        "threads",
        f"{_label('percolite', backend)} tx/s",
        "py-lmdb tx/s",
        "ratio",
        "ratio range",
        "commits/batch",
    ]


def _title(settings: dict[str, Any]) -> str:
    backend = settings.get("backend", DEFAULT_BACKEND)
    kind = "Durable single-cell" if backend == "lmdb" else "Single-cell"
    title = (
        f"{kind} commits per second, median of {_runs(settings['repeat'])} "
        f"of {settings['seconds']:g} s, {settings['value_size']}-byte values"
    )
    if backend != "lmdb":
        title += f"; percolite on the {backend} backend (not durable), py-lmdb durable"
    return title


def tables(report: dict[str, Any]) -> list[Table]:
    """The table of ``REPORT.md`` (see ``common.py``)."""
    headers = _headers(_backend(report))
    return [Table(_title(report["settings"]), headers, _rows(report), _noisy(report))]


def plots(report: dict[str, Any]) -> list[Plot]:
    results = report["results"]
    return [
        Plot(
            name="throughput",
            title="Durable single-cell commits/s",
            x_label="threads",
            y_label="transactions/s",
            x=[r["threads"] for r in results],
            series={
                _label(system, _backend(report)): [r[system]["median_tx_per_s"] for r in results]
                for system in SYSTEMS
            },
            log_y=True,
        )
    ]


def targets(report: dict[str, Any]) -> list[Target]:
    target = report["target"]
    percolite_label = _label("percolite", _backend(report))
    name = f"commit: {percolite_label} / py-lmdb at {target['threads']} threads"
    return [Target(name, target["ratio"], target["min_ratio"])]


def _noisy(report: dict[str, Any]) -> list[str]:
    noisy = [
        f"{_label(system, _backend(report))} at {r['threads']} threads"
        for r in report["results"]
        for system in SYSTEMS
        if r[system]["spread"] is None or r[system]["spread"] > NOISY_SPREAD
    ]
    if not noisy:
        return []
    return [
        f"warning: runs differ by more than {NOISY_SPREAD:g}x ({', '.join(noisy)}); "
        "the machine was busy, so rerun before trusting these numbers"
    ]


def format_report(report: dict[str, Any]) -> str:
    """The report as a table of medians, followed by the verdict on the target."""
    target = report["target"]
    if target["met"] is None:
        verdict = "not measured"
    else:
        verdict = f"{'met' if target['met'] else 'NOT met'} ({target['ratio']:.2f}x)"
    lines = [
        _title(report["settings"]),
        "",
        format_table(_headers(_backend(report)), _rows(report)),
        "",
        f"target: {_label('percolite', _backend(report))} >= {target['min_ratio']:g}x py-lmdb at "
        f"{target['threads']} threads: {verdict}",
        *_noisy(report),
    ]
    return "\n".join(lines)


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def _format_optional(number: float | None) -> str:
    return "-" if number is None else f"{number:.1f}"


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
