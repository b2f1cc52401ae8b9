"""Simulation: a seeded simulation of an app against the same app on LMDB.

``percolite.testing.simulate`` runs an app's loads, observers, folds and
exporters in one thread under a seeded scheduler. Tests sweep it over many
seeds, so it has to be at least as fast as running the app for real. Both
runs here take the same app and the same ``--sim-loads`` load transactions
(one document each): words counted by a combine queue (native sum) whose
changes an export queue sends to a sink keeping totals behind a seq guard.

* ``simulation``: ``simulate(app, loads, seed=1)`` on the memory backend,
  WORKERS virtual workers, no faults;
* ``lmdb``: the same app on LMDB (``sync="full"``) with WORKERS real worker
  threads, the loads submitted through ``env.loader()`` from one thread,
  until ``env.wait()`` returns.

Each run ends when every count is exported; both sinks must equal the
expected totals. Target: the simulation at least as fast (ratio lmdb
seconds / simulation seconds >= 1). Run it alone (``python
bench/bench_simulation.py``, report in ``bench/results/simulation.json``)
or through ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import percolite
from common import (
    OptionGroup,
    Table,
    Target,
    chosen,
    format_table,
    format_targets,
    log,
    machine_info,
    median,
    ratio,
    run_order,
    run_standalone,
    scratch_dir,
)
from percolite.testing import simulate

NAME = "simulation"
TEXT = ("doc", "text")
DEFAULT_LOADS, QUICK_LOADS = 10_000, 500
SYSTEMS = ("simulation", "lmdb")
WORKERS = 4  # virtual workers of the simulation, worker threads on LMDB


def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only."""
    parser.add_argument(
        "--sim-loads",
        type=int,
        metavar="N",
        help=f"load transactions (default: {DEFAULT_LOADS:,}; {QUICK_LOADS:,} with --quick)",
    )


def _app(totals: dict[str, int]) -> percolite.App:
    app = percolite.App("simulated-totals")
    counts = app.combine_queue("counts", buckets=8, combiner="sum", value_codec="int64")
    applied: dict[str, int] = {}

    @app.export_queue("deltas", buckets=2, value_codec="int64")
    def send(entries: list[Any]) -> None:
        for entry in entries:
            if entry.seq <= applied.get(entry.key, -1):
                continue
            applied[entry.key] = entry.seq
            totals[entry.key] = totals.get(entry.key, 0) + entry.value

    @counts.on_change
    def changed(tx: Any, changes: list[Any]) -> None:
        for change in changes:
            send.add(tx, change.key, (change.new or 0) - (change.old or 0))

    @app.observer(TEXT)
    def split(tx: Any, row: bytes, col: Any) -> None:
        counts.add(tx, {word: 1 for word in tx.get(row, col).decode().split()})

    return app


def _documents(n: int) -> list[str]:
    return [f"w{i % 97} w{i % 89} w{(i * 7) % 1009} w{i % 13} w{i % 2}" for i in range(n)]


def _expected(documents: list[str]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for document in documents:
        for word in set(document.split()):
            totals[word] = totals.get(word, 0) + 1
    return totals


def _load(tx: Any, i: int, document: str) -> None:
    tx.set(f"doc{i:06}", TEXT, document)


def _simulation(documents: list[str], _store: Path) -> dict[str, int]:
    totals: dict[str, int] = {}
    loads = [lambda tx, i=i, d=d: _load(tx, i, d) for i, d in enumerate(documents)]
    with simulate(_app(totals), loads, seed=1, workers=WORKERS):
        pass
    return totals


def _lmdb(documents: list[str], store: Path) -> dict[str, int]:
    totals: dict[str, int] = {}
    with percolite.open(store, app=_app(totals)) as env:
        env.start_workers(WORKERS)
        with env.loader(max_in_flight=256) as loader:
            for i, document in enumerate(documents):
                loader.submit(_load, i, document)
        env.wait()
    return totals


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time both runs ``args.repeat`` times, alternating which goes first."""
    loads = chosen(args.sim_loads, QUICK_LOADS if args.quick else DEFAULT_LOADS)
    if loads < 1:
        raise ValueError("--sim-loads must be positive")
    documents = _documents(loads)
    expected = _expected(documents)
    runners = {"simulation": _simulation, "lmdb": _lmdb}
    seconds: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        for repetition in range(args.repeat):
            for system in run_order(SYSTEMS, repetition):
                start = time.perf_counter()
                totals = runners[system](documents, scratch / f"{system}-{repetition}")
                elapsed = time.perf_counter() - start
                if totals != expected:
                    raise RuntimeError(f"{system}: the exported totals are wrong")
                seconds[system].append(round(elapsed, 3))
                log(f"{NAME}: {system:>10} run {repetition + 1}/{args.repeat}: {elapsed:.2f} s")
    results = {
        system: {"median_seconds": median(seconds[system]), "runs": seconds[system]}
        for system in SYSTEMS
    }
    return {
        "benchmark": NAME,
        "measures": "seconds to load, fold and export every count",
        "settings": {"loads": loads, "repeat": args.repeat, "quick": args.quick},
        "versions": {
            "percolite": percolite.__version__,
            "percolite_module": str(Path(percolite.__file__).parent),
        },
        "machine": machine_info(),
        "results": results,
        "ratio": ratio(results["lmdb"]["median_seconds"], results["simulation"]["median_seconds"]),
    }


_HEADERS = ["run", "seconds (median)", "loads/s"]


def _rows(report: dict[str, Any]) -> list[list[Any]]:
    loads = report["settings"]["loads"]
    labels = {
        "simulation": "simulate(), memory, 4 virtual workers",
        "lmdb": "LMDB sync=full, 4 worker threads, loader",
    }
    return [
        [
            labels[system],
            f"{report['results'][system]['median_seconds']:.2f}",
            f"{loads / report['results'][system]['median_seconds']:,.0f}",
        ]
        for system in SYSTEMS
    ]


def _title(settings: dict[str, Any]) -> str:
    return (
        f"{settings['loads']:,} load transactions through one app, "
        f"median of {settings['repeat']} runs"
    )


def tables(report: dict[str, Any]) -> list[Table]:
    """The table of ``REPORT.md`` (see ``common.py``)."""
    return [Table(_title(report["settings"]), _HEADERS, _rows(report), [])]


def targets(report: dict[str, Any]) -> list[Target]:
    return [
        Target(
            "simulation: LMDB with real workers seconds / simulation seconds",
            report["ratio"],
            1.0,
            "the simulation takes every step in one thread, one at a time (that is what "
            "makes a seed replay exactly): a transaction begun and committed on the memory "
            "backend for each observer run and each fold, where the real run's worker "
            "threads commit in groups, without the interpreter's lock, on both cores. Of "
            "the simulation's time, 38% is the core beginning and finishing those runs and "
            "most of the rest the scheduler's and the app's Python; no one step dominates. "
            "It also folds far more often: it interleaves every run, so a fold often finds "
            "a document's few updates (10,000 loads: 20,597 runs in 61,216 steps). When the "
            "target was set (d29ca0b) the real run took 8.04 s against the simulation's "
            "0.95 s; the real run has since become about 19 times faster "
            '(bench/results/notes.md, "Simulation: where its time goes").',
        )
    ]


def format_report(report: dict[str, Any]) -> str:
    return "\n".join(
        [
            _title(report["settings"]),
            "",
            format_table(_HEADERS, _rows(report)),
            "",
            format_targets(targets(report)),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
