"""Export throughput into SQLite and PostgreSQL, and notification latency.

What is measured (issue 5; issue 7 workload 4), with ``sync="full"``:

* **Throughput**, entries per second. ``--export-entries`` entries (distinct
  keys, int values) are queued up front with ``eq.add`` in transactions of
  PRELOAD_TRANSACTION; then ``env.process(threads)`` (``--export-threads``)
  starts the workers and waits until nothing is pending. The time is from the
  start of the workers until they are idle: the queue is empty and every entry
  is in the sink. The sink is then read back and must equal the reference
  (every key with its value). Beside it, **sink alone**: the same exporter
  called directly, in one thread, with the same batches (BATCH_SIZE entries, in
  key order), without percolite; the ratio of the two is what percolite's queue
  costs on top of the sink.
* **Latency** (workload 4), p50/p99/max in ms, from the moment ``commit()`` is
  called: commit -> exported row visible in the sink (the exporter is wrapped:
  the time is taken when the sink call returned, i.e. when its transaction is
  committed and the row is visible to other connections; at the end every row
  is read back from the sink) and commit -> observer start (an observer that
  records when it first starts). ``--export-latency-commits`` single-entry
  commits spaced out (``common.COMMIT_GAP_S``), so the system is otherwise
  idle, and then again **under load**: ``--export-load-threads`` threads keep
  adding export entries (transactions of LOAD_TRANSACTION) at
  ``--export-load-fraction`` of the throughput measured above for that sink, so
  the workers are busy but the queue does not grow without bound.

The sinks (``--export-sinks``): ``percolite.exporters.SQLite`` (a file in the
scratch directory) and ``percolite.exporters.Postgres`` against a temporary
PostgreSQL server (``tests/python/_postgres.py``, started only when
``postgres`` is among the sinks; durable, ``fsync=on``, unless
``--export-pg-fast``). Both live on the filesystem being measured. No targets:
the issues ask for the numbers. Run it alone (``python bench/bench_export.py``,
report in ``bench/results/export.json``) or through ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import percolite
from common import (
    COMMIT_GAP_S,
    REPO_ROOT,
    OptionGroup,
    Plot,
    Table,
    Target,
    chosen,
    format_tables,
    format_targets,
    log,
    machine_info,
    median,
    percentile,
    run_standalone,
    same_filesystem,
    scratch_dir,
)
from percolite.exporters import Postgres, SequencedExport, SQLite

NAME = "export"
SINKS = ("sqlite", "postgres")
SINK_LABELS = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
PRELOAD_TRANSACTION = 1000  # entries per queueing transaction
LOAD_TRANSACTION = 100  # entries per transaction of the background load
BATCH_SIZE = 1024  # the export queue's default
BUCKETS = 16
LATENCY_TIMEOUT = 120.0
DEFAULT_ENTRIES, QUICK_ENTRIES = 200_000, 5000
DEFAULT_EXPORT_THREADS, QUICK_EXPORT_THREADS = (1, 4), (4,)
DEFAULT_LATENCY_COMMITS, QUICK_LATENCY_COMMITS = 300, 20
PING = ("bench", "ping")  # the observed column of the latency app


# -- the application --------------------------------------------------------
class TimedSink:
    """The exporter of the benchmark's queue: calls the current sink, then
    notes when each key first became visible there (the sink call returned,
    so its transaction committed)."""

    def __init__(self) -> None:
        self.sink: Callable[[list], Any] | None = None
        self.visible: dict[str, float] = {}
        self.calls = 0

    def __call__(self, entries: list[SequencedExport]) -> None:
        assert self.sink is not None, "no sink chosen"
        self.sink(entries)
        now = time.monotonic()
        self.calls += 1
        for entry in entries:
            self.visible.setdefault(entry.key, now)


observer_started: dict[bytes, float] = {}
timed_sink = TimedSink()
app = percolite.App("export_bench")
queue = app.export_queue(
    "exported", timed_sink, buckets=BUCKETS, value_codec="int64", batch_size=BATCH_SIZE
)


@app.observer(PING)
def _record_start(tx: percolite.Transaction, row: bytes, column: Any) -> None:
    observer_started.setdefault(row, time.monotonic())


def _key(prefix: str, index: int) -> str:
    return f"{prefix}{index:09d}"


# -- sinks -----------------------------------------------------------------------
class Sinks:
    """Makes a fresh sink (a new SQLite file, a new PostgreSQL table) per run."""

    def __init__(self, scratch: Path, postgres_dsn: str | None) -> None:
        self.scratch = scratch
        self.postgres_dsn = postgres_dsn
        self.count = 0

    @contextmanager
    def fresh(self, sink: str) -> Iterator[Any]:
        self.count += 1
        table = f"exported_{self.count}"
        if sink == "sqlite":
            exporter: Any = SQLite(self.scratch / f"sink-{self.count}.sqlite", table)
        else:
            assert self.postgres_dsn is not None
            exporter = Postgres(self.postgres_dsn, table)
        try:
            yield exporter
        finally:
            if sink == "postgres":
                exporter.close()
                import psycopg

                with psycopg.connect(self.postgres_dsn, autocommit=True) as conn:
                    # Dropped, so that the server stays small from run to run.
                    conn.execute(f'DROP TABLE IF EXISTS "{table}", "{table}_seq"')
            else:
                exporter.close()


# -- throughput --------------------------------------------------------------------
def _preload(env: percolite.Env, entries: int) -> dict[str, int]:
    reference = {}
    for start in range(0, entries, PRELOAD_TRANSACTION):
        with env.transaction() as tx:
            for index in range(start, min(entries, start + PRELOAD_TRANSACTION)):
                key = _key("k", index)
                queue.add(tx, key, index)
                reference[key] = index
    return reference


def measure_throughput(store: Path, sink: Any, entries: int, threads: int) -> dict[str, Any]:
    """Queue ``entries`` entries, then time the workers until all are exported."""
    timed_sink.sink, timed_sink.visible, timed_sink.calls = sink, {}, 0
    env = percolite.open(store, app=app, sync="full")
    try:
        reference = _preload(env, entries)
        began = time.perf_counter()
        done = env.process(threads, timeout=600)
        seconds = time.perf_counter() - began
        if not done["idle"]:
            raise RuntimeError(f"export did not finish: {env.status()}")
        with env.transaction() as tx:
            left = queue.depth(tx)  # (env.status()["queues"] is always empty: a bug)
    finally:
        env.close()
    exported = sink.rows()
    if left or exported != reference:
        raise RuntimeError(
            f"sink differs from the reference: {len(exported)} rows of {len(reference)}, "
            f"{left} entries still queued"
        )
    return {
        "entries_per_s": round(entries / seconds, 1),
        "seconds": round(seconds, 4),
        "exporter_calls": timed_sink.calls,
        "processing_commits": done["commits"],
        "conflicts": done["conflicts"],
        "failures": done["failures"],
    }


def measure_sink_alone(sink: Any, entries: int) -> dict[str, Any]:
    """The same batches handed to the exporter directly, in one thread."""
    batches = [
        [
            SequencedExport(_key("k", i), i, i)
            for i in range(start, min(entries, start + BATCH_SIZE))
        ]
        for start in range(0, entries, BATCH_SIZE)
    ]
    began = time.perf_counter()
    for batch in batches:
        sink(batch)
    seconds = time.perf_counter() - began
    if len(sink.rows()) != entries:
        raise RuntimeError("the sink lost rows")
    return {"entries_per_s": round(entries / seconds, 1), "seconds": round(seconds, 4)}


# -- latency -----------------------------------------------------------------------
class BackgroundLoad:
    """Threads adding export entries at a fixed total rate (entries/s), in
    transactions of LOAD_TRANSACTION entries: an open-loop load, so the
    workers stay busy without the queue growing when the rate is below the
    export throughput."""

    def __init__(self, env: percolite.Env, threads: int, rate: float) -> None:
        self.env, self.threads, self.rate = env, threads, rate
        self.stop = threading.Event()
        self.added = [0] * threads
        self.errors: list[BaseException] = []
        self.workers = [
            threading.Thread(target=self._run, args=(index,), daemon=True)
            for index in range(threads)
        ]
        self.began = self.ended = 0.0

    def _run(self, index: int) -> None:
        interval = LOAD_TRANSACTION * self.threads / self.rate  # seconds per transaction
        next_at = time.monotonic() + random.uniform(0, interval)
        batch = 0
        try:
            while not self.stop.is_set():
                delay = next_at - time.monotonic()
                if delay > 0 and self.stop.wait(delay):
                    break
                with self.env.transaction() as tx:
                    for item in range(LOAD_TRANSACTION):
                        queue.add(tx, f"load{index:02d}-{batch:07d}-{item:03d}", item)
                self.added[index] += LOAD_TRANSACTION
                batch += 1
                next_at += interval
        except BaseException as error:  # raised by stop_and_check
            self.errors.append(error)

    def __enter__(self) -> BackgroundLoad:
        self.began = time.monotonic()
        for thread in self.workers:
            thread.start()
        time.sleep(0.5)  # let the queue reach its steady state
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop.set()
        for thread in self.workers:
            thread.join()
        self.ended = time.monotonic()
        if self.errors and exc_info[0] is None:
            raise self.errors[0]

    def achieved(self) -> float:
        return sum(self.added) / (self.ended - self.began) if self.ended > self.began else 0.0


def _spaced_commits(
    env: percolite.Env, commits: int, kind: str, tag: str
) -> tuple[list[str], list[float], list[float]]:
    """Single-entry commits, COMMIT_GAP_S apart; returns keys, commit() call
    times and commit durations."""
    keys, called, durations = [], [], []
    for index in range(commits):
        key = _key(f"{tag}-{kind}-", index)
        tx = env.transaction()
        try:
            if kind == "export":
                queue.add(tx, key, index)
            else:
                tx.set(key, PING, "x")
            began = time.monotonic()
            tx.commit()
            durations.append(time.monotonic() - began)
        finally:
            tx.abort()
        keys.append(key)
        called.append(began)
        time.sleep(random.uniform(*COMMIT_GAP_S))
    return keys, called, durations


def _wait_for(seen: dict, keys: list, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(key in seen for key in keys):
        if time.monotonic() > deadline:
            missing = sum(1 for key in keys if key not in seen)
            raise RuntimeError(f"{missing} of {len(keys)} commits never reached their target")
        time.sleep(0.01)


def _latency_record(
    kind: str, seen: dict, keys: list, called: list, durations: list
) -> dict[str, Any]:
    lookup = [key.encode() for key in keys] if kind == "observer" else keys
    ms = [(seen[key] - start) * 1000 for key, start in zip(lookup, called, strict=True)]
    return {
        "commits": len(ms),
        "p50_ms": round(percentile(ms, 0.5), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "max_ms": round(max(ms), 3),
        "commit_p50_ms": round(median(durations) * 1000, 3),
    }


def measure_latency(
    store: Path, sink: Any, commits: int, workers: int, load_threads: int, load_rate: float | None
) -> dict[str, Any]:
    """Commit -> exported row and commit -> observer start, idle (``load_rate``
    None) or under a background load of ``load_rate`` entries/s."""
    timed_sink.sink, timed_sink.visible, timed_sink.calls = sink, {}, 0
    observer_started.clear()
    tag = "idle" if load_rate is None else "load"
    results: dict[str, Any] = {}
    env = percolite.open(store, app=app, sync="full")
    try:
        env.start_workers(workers)
        load = BackgroundLoad(env, load_threads, load_rate) if load_rate else None
        with load or nullcontext():
            for kind, seen in (("export", timed_sink.visible), ("observer", observer_started)):
                keys, called, durations = _spaced_commits(env, commits, kind, tag)
                wanted = [key.encode() for key in keys] if kind == "observer" else keys
                _wait_for(seen, wanted, LATENCY_TIMEOUT)
                results[kind] = _latency_record(kind, seen, keys, called, durations)
        if load is not None:
            results["load_entries_per_s"] = round(load.achieved(), 1)
            results["load_target_entries_per_s"] = round(load_rate or 0.0, 1)
        if not env.wait(timeout=LATENCY_TIMEOUT):
            raise RuntimeError("the workers did not catch up with the load")
    finally:
        env.close()
    exported = sink.rows()
    missing = [key for key in timed_sink.visible if key not in exported]
    if missing:
        raise RuntimeError(f"{len(missing)} exported keys are not visible in the sink")
    return results


# -- the benchmark ------------------------------------------------------------------
def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only (prefixed: ``run.py`` shares one parser)."""
    parser.add_argument(
        "--export-entries",
        type=int,
        default=None,
        metavar="N",
        help=f"entries exported per throughput run (default: {DEFAULT_ENTRIES}; "
        f"--quick: {QUICK_ENTRIES})",
    )
    parser.add_argument(
        "--export-threads",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help=f"worker threads of the throughput runs (default: "
        f"{' '.join(map(str, DEFAULT_EXPORT_THREADS))}; --quick: "
        f"{' '.join(map(str, QUICK_EXPORT_THREADS))})",
    )
    parser.add_argument(
        "--export-sinks",
        nargs="+",
        choices=SINKS,
        default=list(SINKS),
        metavar="SINK",
        help=f"sinks to measure (default: {' '.join(SINKS)}; postgres starts a temporary "
        "PostgreSQL server)",
    )
    parser.add_argument(
        "--export-latency-commits",
        type=int,
        default=None,
        metavar="N",
        help=f"spaced-out commits per latency measurement (default: {DEFAULT_LATENCY_COMMITS}; "
        f"--quick: {QUICK_LATENCY_COMMITS})",
    )
    parser.add_argument(
        "--export-latency-workers",
        type=int,
        default=4,
        metavar="N",
        help="worker threads during the latency runs (default: %(default)s)",
    )
    parser.add_argument(
        "--export-load-threads",
        type=int,
        default=2,
        metavar="N",
        help="threads adding the background load (default: %(default)s)",
    )
    parser.add_argument(
        "--export-load-fraction",
        type=float,
        default=0.5,
        metavar="F",
        help="background load as a fraction of the measured throughput (default: %(default)s)",
    )
    parser.add_argument(
        "--export-pg-fast",
        action="store_true",
        help="run PostgreSQL with fsync=off, synchronous_commit=off (as the tests do)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    entries = chosen(args.export_entries, QUICK_ENTRIES if args.quick else DEFAULT_ENTRIES)
    commits = chosen(
        args.export_latency_commits,
        QUICK_LATENCY_COMMITS if args.quick else DEFAULT_LATENCY_COMMITS,
    )
    export_threads = list(
        chosen(args.export_threads, QUICK_EXPORT_THREADS if args.quick else DEFAULT_EXPORT_THREADS)
    )
    if (
        entries < 1
        or commits < 1
        or min(export_threads) < 1
        or args.export_latency_workers < 1
        or args.export_load_threads < 1
        or not 0 < args.export_load_fraction <= 1
    ):
        raise ValueError(
            "--export-entries, --export-latency-commits and the thread counts must be "
            "positive, --export-load-fraction in (0, 1]"
        )
    sinks_wanted = [sink for sink in SINKS if sink in args.export_sinks]
    settings = {
        "entries": entries,
        "sinks": sinks_wanted,
        "export_threads": export_threads,
        "repeat": args.repeat,
        "latency_commits": commits,
        "latency_workers": args.export_latency_workers,
        "load_threads": args.export_load_threads,
        "load_fraction": args.export_load_fraction,
        "load_transaction": LOAD_TRANSACTION,
        "preload_transaction": PRELOAD_TRANSACTION,
        "batch_size": BATCH_SIZE,
        "buckets": BUCKETS,
        "sync": "full",
        "quick": args.quick,
        "store_parent": str(Path(args.dir).resolve()),
    }
    report: dict[str, Any] = {
        "benchmark": NAME,
        "measures": "export queue throughput into SQLite and PostgreSQL (entries/s, end to "
        "end) and commit -> visible row / observer start latency, idle and under load",
        "settings": settings,
        "versions": _versions(),
        "machine": machine_info(),
        "sinks": {},
    }
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        settings["store_on_repo_filesystem"] = same_filesystem(scratch, REPO_ROOT)
        os.chmod(scratch, 0o755)  # the PostgreSQL server user must reach its data
        with _postgres_if(scratch, "postgres" in sinks_wanted, not args.export_pg_fast) as server:
            if server is not None:
                settings["postgres"] = server.settings()
            sinks = Sinks(scratch, server.dsn if server else None)
            for sink in sinks_wanted:
                report["sinks"][sink] = _measure_sink(
                    sink, sinks, scratch, entries, export_threads, commits, args
                )
    return report


@contextmanager
def _postgres_if(scratch: Path, wanted: bool, durable: bool) -> Iterator[Any]:
    if not wanted:
        yield None
        return
    sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))
    import _postgres  # the tests' temporary server, with durability on

    with _postgres.temporary_postgres(scratch, durable=durable) as server:
        yield server


def _measure_sink(
    sink: str,
    sinks: Sinks,
    scratch: Path,
    entries: int,
    export_threads: list[int],
    commits: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    label = SINK_LABELS[sink]
    runs: dict[str, list[dict[str, Any]]] = {str(t): [] for t in export_threads}
    alone: list[dict[str, Any]] = []
    for repetition in range(args.repeat):
        # Interleave: percolite at each thread count, then the sink alone.
        for threads in export_threads:
            store = scratch / f"{sink}-{threads}t-{repetition}"
            with sinks.fresh(sink) as exporter:
                measured = measure_throughput(store, exporter, entries, threads)
            runs[str(threads)].append(measured)
            log(
                f"{NAME}: {label} {threads} threads, run {repetition + 1}/{args.repeat}: "
                f"{measured['entries_per_s']:,.0f} entries/s"
            )
        with sinks.fresh(sink) as exporter:
            alone.append(measure_sink_alone(exporter, entries))
        log(f"{NAME}: {label} alone: {alone[-1]['entries_per_s']:,.0f} entries/s")

    throughput = {
        threads: {
            "median_entries_per_s": median([r["entries_per_s"] for r in measured]),
            "runs": measured,
        }
        for threads, measured in runs.items()
    }
    alone_rate = median([r["entries_per_s"] for r in alone])
    for summary in throughput.values():
        summary["fraction_of_sink_alone"] = round(summary["median_entries_per_s"] / alone_rate, 3)
    # The load runs at a fraction of what the workers of the latency runs can export.
    reference_rate = _throughput_near(throughput, args.export_latency_workers)
    load_rate = args.export_load_fraction * reference_rate
    latency = {}
    for mode, rate in (("idle", None), ("load", load_rate)):
        with sinks.fresh(sink) as exporter:
            latency[mode] = measure_latency(
                scratch / f"{sink}-latency-{mode}",
                exporter,
                commits,
                args.export_latency_workers,
                args.export_load_threads,
                rate,
            )
        log(
            f"{NAME}: {label} latency {mode}: export p50 {latency[mode]['export']['p50_ms']} ms, "
            f"observer p50 {latency[mode]['observer']['p50_ms']} ms"
        )
    return {
        "throughput": throughput,
        "sink_alone": {"median_entries_per_s": alone_rate, "runs": alone},
        "latency": latency,
    }


def _throughput_near(throughput: dict[str, Any], threads: int) -> float:
    """The median throughput measured with the thread count closest to ``threads``."""
    closest = min(throughput, key=lambda t: (abs(int(t) - threads), -int(t)))
    return float(throughput[closest]["median_entries_per_s"])


def _versions() -> dict[str, Any]:
    import sqlite3

    versions = {
        "percolite": percolite.__version__,
        "percolite_module": str(Path(percolite.__file__).parent),
        "sqlite": sqlite3.sqlite_version,
    }
    try:
        import psycopg

        versions["psycopg"] = psycopg.__version__
    except ImportError:
        pass
    return versions


# -- output --------------------------------------------------------------------------
def tables(report: dict[str, Any]) -> list[Table]:
    """The tables of ``REPORT.md`` (see ``common.py``): export throughput, and
    the notification latency of issue 7's workload 4."""
    settings = report["settings"]
    sinks = report["sinks"]
    throughput = Table(
        title=(
            f"Export throughput, entries/s: {settings['entries']:,} entries queued, then "
            f"exported from the workers' start until idle (sync=full, median of "
            f"{settings['repeat']})"
        ),
        headers=["sink", "worker threads", "entries/s", "sink alone", "fraction of sink alone"],
        rows=[
            [
                SINK_LABELS[sink],
                threads,
                f"{summary['median_entries_per_s']:,.0f}",
                f"{measured['sink_alone']['median_entries_per_s']:,.0f}",
                f"{summary['fraction_of_sink_alone']:.2f}",
            ]
            for sink, measured in sinks.items()
            for threads, summary in measured["throughput"].items()
        ],
        notes=[
            "sink alone: the same exporter called directly in one thread with the same "
            f"batches ({settings['batch_size']} entries), without percolite. Every run's "
            "sink is read back and compared with the entries queued."
        ],
    )
    latency_rows = []
    for sink, measured in sinks.items():
        for mode, result in measured["latency"].items():
            system = "idle" if mode == "idle" else _load_label(result)
            for kind, what in (("export", "exported row visible"), ("observer", "observer start")):
                r = result[kind]
                latency_rows.append(
                    [
                        SINK_LABELS[sink],
                        system,
                        what,
                        f"{r['p50_ms']:.1f}",
                        f"{r['p99_ms']:.1f}",
                        f"{r['max_ms']:.1f}",
                        f"{r['commit_p50_ms']:.1f}",
                    ]
                )
    latency = Table(
        title=(
            "Notification latency, ms from the commit() call (workload 4): commit -> "
            "exported row visible in the sink and commit -> observer start"
        ),
        headers=["sink", "system", "commit ->", "p50", "p99", "max", "commit() p50"],
        rows=latency_rows,
        notes=[
            f"{settings['latency_commits']} single-entry commits per line, 5-15 ms apart, "
            f"sync=full, {settings['latency_workers']} worker threads. Under load: "
            f"{settings['load_threads']} threads add export entries (transactions of "
            f"{settings['load_transaction']}) at {settings['load_fraction']:g} of the measured "
            "throughput of that sink; the rate reached is in the system column."
        ],
    )
    return [throughput, latency]


def _load_label(result: dict[str, Any]) -> str:
    rate = result.get("load_entries_per_s")
    return "under load" if rate is None else f"load {rate:,.0f}/s"


def plots(report: dict[str, Any]) -> list[Plot]:
    """Throughput per sink (with the sink alone), and latency p50/p99."""
    sinks = report["sinks"]
    thread_counts = list(dict.fromkeys(t for m in sinks.values() for t in m["throughput"]))
    throughput = Plot(
        name="throughput",
        title="Export throughput (entries/s)",
        x_label="sink",
        y_label="entries/s",
        x=[SINK_LABELS[sink] for sink in sinks],
        series={
            **{
                f"{threads} worker{'s' if threads != '1' else ''}": [
                    m["throughput"][threads]["median_entries_per_s"]
                    if threads in m["throughput"]
                    else None
                    for m in sinks.values()
                ]
                for threads in thread_counts
            },
            "sink alone": [m["sink_alone"]["median_entries_per_s"] for m in sinks.values()],
        },
        kind="bar",
    )
    cases = [(sink, mode) for sink, m in sinks.items() for mode in m["latency"]]
    latency = Plot(
        name="latency",
        title="Latency from commit() (ms)",
        x_label="sink, system",
        y_label="ms",
        x=[f"{SINK_LABELS[sink]} {mode}" for sink, mode in cases],
        series={
            f"{label} {quantile}": [
                sinks[sink]["latency"][mode][kind][f"{quantile}_ms"] for sink, mode in cases
            ]
            for kind, label in (("export", "row"), ("observer", "observer"))
            for quantile in ("p50", "p99")
        },
        kind="bar",
        log_y=True,
    )
    return [throughput, latency]


def targets(report: dict[str, Any]) -> list[Target]:
    """Issue 5 and workload 4 ask for numbers, not ratios: no targets."""
    return []


def format_report(report: dict[str, Any]) -> str:
    text = format_tables(tables(report))
    goals = format_targets(targets(report))
    return f"{text}\n\n{goals}" if goals else text


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
