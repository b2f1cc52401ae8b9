"""Notification latency and idle cost of the worker pool.

Measures, with sync="full":
- commit -> observer start latency (p50, p99) when the workers run in the
  committing process (local hand-off) and in another process (found through
  the notify table after an inotify wake-up). Latency is counted from the
  moment commit() is called, so it includes the durable commit itself; the
  commit's own duration is reported beside it. Commits are spaced out
  (``common.COMMIT_GAP_S``) so this is the latency of an idle system, not of
  a queue.
- CPU used by an idle worker pool (IDLE_THREADS threads, nothing to do) over
  a few seconds, as a percentage of one core.
- Observer throughput: runs/s of the same observer (one cell written per
  run) over a backlog of notifications committed before the workers start,
  timed from ``start_workers(T)`` until idle, for several T. A worker hands
  each run's commit to the group-commit writer and goes on with the next
  notification, so runs are not bound by T / (commit latency). Beside it,
  the same number of one-cell transactions committed through
  ``env.loader()`` from one thread: what the writer takes when nothing else
  runs.

CLOCK_MONOTONIC is system-wide on Linux, so times compare across processes.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import notify_app
import percolite
from common import (
    COMMIT_GAP_S,
    Table,
    format_tables,
    machine_info,
    median,
    percentile,
    run_standalone,
    scratch_dir,
)

HERE = Path(__file__).resolve().parent
IDLE_THREADS = 4  # the idle worker pool whose CPU use is measured
DEFAULT_RUN_THREADS = (1, 4, 16)


def measure_latency(db: str, commits: int, remote: bool) -> dict:
    env = percolite.open(db, app=notify_app.app, sync="full")
    worker = None
    try:
        if remote:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "percolite",
                    "worker",
                    "notify_app:app",
                    "--db",
                    db,
                    "--threads",
                    "2",
                ],
                cwd=HERE,
            )
            time.sleep(1.0)  # let it start and scan
        else:
            env.start_workers(2)
        called, durations = [], []
        for i in range(commits):
            with env.transaction() as tx:
                tx.set(f"r{i:06d}", notify_app.COLUMN, "x")
                t0 = time.monotonic()
                tx.commit()
                durations.append(time.monotonic() - t0)
            called.append(t0)
            time.sleep(random.uniform(*COMMIT_GAP_S))
        if not env.wait(timeout=60):
            raise RuntimeError("observers did not finish")
        with env.transaction() as tx:
            started = {row: float(value) for row, _, value in tx.scan(columns=[notify_app.STARTED])}
        latencies = [started[f"r{i:06d}".encode()] - called[i] for i in range(commits)]
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        env.close()
    ms = [x * 1000 for x in latencies]
    return {
        "commits": commits,
        "p50_ms": round(percentile(ms, 0.5), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "max_ms": round(max(ms), 3),
        "commit_p50_ms": round(median(durations) * 1000, 3),
    }


def measure_idle_cpu(db: str, seconds: float) -> dict:
    env = percolite.open(db, app=notify_app.app, sync="full")
    try:
        env.start_workers(IDLE_THREADS)
        time.sleep(0.5)
        cpu0, wall0 = time.process_time(), time.monotonic()
        time.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    finally:
        env.close()
    return {
        "seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 4),
        "cpu_percent_of_one_core": round(100 * cpu / wall, 3),
    }


def measure_throughput(db: str, runs: int, threads: list[int]) -> dict:
    """Observer runs/s over a backlog of ``runs`` notifications, per thread
    count, and the loader's commits/s of as many one-cell transactions."""

    def write(tx: percolite.Transaction, row: str) -> None:
        tx.set(row, notify_app.COLUMN, "x")

    by_threads = {}
    loader_rates = []
    for n, count in enumerate(threads):
        path = f"{db}-{n}"
        env = percolite.open(path, app=notify_app.app, sync="full")
        try:
            began = time.perf_counter()
            with env.loader() as loader:  # no workers yet: the notifications wait
                for i in range(runs):
                    loader.submit(write, f"r{i:06d}")
            loader_rates.append(runs / (time.perf_counter() - began))
            began = time.perf_counter()
            env.start_workers(count)
            if not env.wait(timeout=600):
                raise RuntimeError(f"{runs} observer runs did not finish in 600 s")
            seconds = time.perf_counter() - began
            with env.transaction() as tx:
                done = sum(1 for _ in tx.scan(prefix="r", columns=[notify_app.STARTED]))
            if done != runs:
                raise RuntimeError(f"{done} of {runs} observer runs committed")
        finally:
            env.close()
        by_threads[str(count)] = {"seconds": round(seconds, 3), "runs_per_s": round(runs / seconds)}
    loader = median(loader_rates)
    for r in by_threads.values():
        r["of_loader"] = round(r["runs_per_s"] / loader, 3)
    return {"runs": runs, "threads": by_threads, "loader_commits_per_s": round(loader)}


NAME = "notify"


def add_arguments(parser) -> None:
    """Options of this benchmark only."""
    parser.add_argument(
        "--commits",
        type=int,
        default=300,
        help="spaced-out commits per latency measurement (default: %(default)s)",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=5.0,
        help="how long the idle pool is watched (default: %(default)s)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=5000,
        help="notifications queued for the observer throughput (default: %(default)s)",
    )
    parser.add_argument(
        "--run-threads",
        type=int,
        nargs="+",
        default=list(DEFAULT_RUN_THREADS),
        help="worker threads for the observer throughput "
        f"(default: {' '.join(map(str, DEFAULT_RUN_THREADS))})",
    )


def run(args: argparse.Namespace) -> dict:
    commits = 20 if args.quick else args.commits
    idle_seconds = 0.5 if args.quick else args.idle_seconds
    if args.runs < 1:
        raise ValueError(f"--runs must be positive, not {args.runs}")
    runs = 1000 if args.quick else args.runs
    for threads in args.run_threads:
        if threads < 1:
            raise ValueError(f"--run-threads must be positive, not {threads}")
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        return {
            "settings": {
                "commits": commits,
                "idle_seconds": idle_seconds,
                "sync": "full",
                "runs": runs,
                "run_threads": args.run_threads,
            },
            "machine": machine_info(),
            "local": measure_latency(os.path.join(scratch, "local"), commits, remote=False),
            "two_processes": measure_latency(os.path.join(scratch, "remote"), commits, remote=True),
            "idle": measure_idle_cpu(os.path.join(scratch, "idle"), idle_seconds),
            "throughput": measure_throughput(
                os.path.join(scratch, "throughput"), runs, args.run_threads
            ),
        }


def tables(report: dict) -> list[Table]:
    """The table of ``REPORT.md`` (see ``common.py``)."""
    rows = [
        [name, r["p50_ms"], r["p99_ms"], r["max_ms"], r["commit_p50_ms"]]
        for name, r in (
            ("one process", report["local"]),
            ("two processes", report["two_processes"]),
        )
    ]
    idle = report["idle"]
    out = [
        Table(
            "Commit -> observer start latency, ms (sync=full; from the commit() call)",
            ["workers in", "p50", "p99", "max", "commit p50"],
            rows,
            [
                f"idle worker pool ({IDLE_THREADS} threads): "
                f"{idle['cpu_percent_of_one_core']}% of one core"
                f" ({idle['cpu_seconds']} s CPU in {idle['seconds']} s)"
            ],
        )
    ]
    throughput = report.get("throughput")  # older reports have none
    if throughput:
        out.append(
            Table(
                f"Observer throughput over a backlog of {throughput['runs']:,} notifications"
                " (sync=full; one cell written per run)",
                ["worker threads", "seconds", "runs/s", "of the loader's commits/s"],
                [
                    [t, r["seconds"], r["runs_per_s"], r["of_loader"]]
                    for t, r in throughput["threads"].items()
                ],
                [
                    "the loader: the same number of one-cell transactions from one thread,"
                    f" {throughput['loader_commits_per_s']:,} commits/s"
                ],
            )
        )
    return out


def format_report(report: dict) -> str:
    return format_tables(tables(report))


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
