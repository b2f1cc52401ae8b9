"""The postgresql backend: hot keys, hand-written SQL, worker groups, wake-ups.

Every system runs on one temporary PostgreSQL server started for the run
(``tests/python/_postgres.py``, Unix socket, ``fsync`` and
``synchronous_commit`` on: every commit durable), each store in a schema of
its own, in one run with the systems interleaved:

* **Hot keys through the loader** (``bench_loader``'s workload and code:
  ``bench_hotkeys``' PER_TRANSACTION keys per transaction drawn from
  Zipf(ZIPF_S) over KEYS keys, one submitting thread, ``bench_loader``'s
  IN_FLIGHT in flight, ``--seconds`` of submissions): naive read-modify-write
  (conflicts re-run with back-off) against the combine queue with the native
  ``sum`` folded by ``bench_loader``'s WORKER_THREADS worker threads, end to
  end (until every value is final) and checked exact.
* **Hand-written SQL**: ``INSERT ... ON CONFLICT (k) DO UPDATE SET v = v +
  excluded.v`` of the same draws, one transaction per draw (keys sorted, so
  transactions never deadlock), psycopg with its pipelined ``executemany``,
  from each of ``--postgresql-sql-threads`` client threads.
* **Worker groups**: a backlog of ``--postgresql-backlog`` transactions of combine
  queue updates, loaded with no workers running, then folded by each of
  GROUPS worker groups (``percolite worker pg_app:app --processes 1
  --threads GROUP_THREADS --until-idle``, started together, as on separate
  machines); timed until the last exits, values checked.
* **Wake-ups**: ``--postgresql-pings`` commits, PING_INTERVAL_S seconds
  apart, on one handle to a column an observer watches through another
  handle (its workers learn of them by LISTEN/NOTIFY): time from the
  committing call to the observer's start, p50 and p99.

Targets: the combine queue at least CQ_VS_NAIVE_TARGET times naive
read-modify-write on PostgreSQL, end to end, and at least
CQ_VS_SQL_TARGET times the best of the hand-written upserts (1 or 4
client threads) on the same server.
Run it alone (``python bench/bench_postgresql.py``, report in
``bench/results/postgresql.json``) or through ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bench_hotkeys
import bench_loader
import percolite
from common import (
    REPO_ROOT,
    OptionGroup,
    Table,
    Target,
    chosen,
    format_tables,
    format_targets,
    log,
    machine_info,
    median,
    percentile,
    ratio,
    run_order,
    run_standalone,
    scratch_dir,
)

NAME = "postgresql"
APPROACHES = ("loader-naive", "loader-cq-native")
DEFAULT_SQL_THREADS = (1, 4)
DEFAULT_BACKLOG, QUICK_BACKLOG = 2_000, 200
DEFAULT_PINGS, QUICK_PINGS = 200, 30
GROUPS = (1, 2, 3)
GROUP_THREADS = 4  # worker threads of each worker group
PING_INTERVAL_S = 0.01
CQ_VS_NAIVE_TARGET = 5.0
CQ_VS_SQL_TARGET = 3.0
BENCH_DIR = Path(__file__).resolve().parent


def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only."""
    parser.add_argument(
        "--postgresql-sql-threads",
        type=int,
        nargs="+",
        metavar="N",
        help=f"client threads of the hand-written SQL (default: {DEFAULT_SQL_THREADS})",
    )
    parser.add_argument(
        "--postgresql-backlog",
        type=int,
        metavar="N",
        help=f"transactions of {bench_hotkeys.PER_TRANSACTION} updates the worker groups fold "
        f"(default: {DEFAULT_BACKLOG:,})",
    )
    parser.add_argument(
        "--postgresql-pings",
        type=int,
        metavar="N",
        help=f"wake-ups timed (default: {DEFAULT_PINGS})",
    )


@contextlib.contextmanager
def _server(scratch: Path) -> Iterator[Any]:
    sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))
    import _postgres  # the tests' temporary server

    with _postgres.temporary_postgres(scratch, durable=True) as server:
        yield server


def _measure_sql(dsn: str, threads: int, seconds: float, seed: int, table: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v bigint NOT NULL)")
    upsert = (
        f"INSERT INTO {table} (k, v) VALUES (%s, %s) "
        f"ON CONFLICT (k) DO UPDATE SET v = {table}.v + excluded.v"
    )
    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)
    errors: list[str] = []

    def client(index: int) -> None:
        sample = bench_hotkeys.zipf_sampler(seed * 100 + index)
        try:
            with psycopg.connect(dsn) as db:
                barrier.wait()
                deadline = time.perf_counter() + seconds
                while time.perf_counter() < deadline:
                    rows = sorted(dict(sample()).items())
                    with db.transaction(), db.cursor() as cursor:
                        cursor.executemany(upsert, rows)
                    counts[index] += sum(n for _k, n in rows)
        except Exception as e:  # reported in the result
            errors.append(repr(e))

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    with psycopg.connect(dsn) as db:
        stored = db.execute(f"SELECT coalesce(sum(v), 0) FROM {table}").fetchone()[0]
    updates = sum(counts)
    return {
        "threads": threads,
        "updates": updates,
        "seconds": round(elapsed, 3),
        "updates_per_s": round(updates / elapsed, 1),
        "exact": not errors and stored == updates,
        "errors": errors[:3],
    }


def load_backlog(uri: str, backlog: int, seed: int) -> dict[str, int]:
    """``backlog`` transactions of ``bench_hotkeys``' draws added to
    ``pg_app``'s combine queue at ``uri`` through a loader, no worker
    running; returns the values they must fold into."""
    sys.path.insert(0, str(BENCH_DIR))
    import pg_app

    sample = bench_hotkeys.zipf_sampler(seed)
    draws = [dict(sample()) for _ in range(backlog)]
    expected: dict[str, int] = {}
    for draw in draws:
        for key, n in draw.items():
            expected[key] = expected.get(key, 0) + n
    with percolite.open(uri, app=pg_app.app) as env, env.loader() as loader:
        for draw in draws:
            loader.submit(pg_app.hot.add, draw)
    return expected


def _measure_groups(uri: str, groups: int, backlog: int, seed: int) -> dict[str, Any]:
    sys.path.insert(0, str(BENCH_DIR))
    import pg_app

    expected = load_backlog(uri, backlog, seed)
    command = [sys.executable, "-m", "percolite", "worker", "pg_app:app"]
    command += ["--processes", "1", "--threads", str(GROUP_THREADS), "--until-idle"]
    child_env = {**os.environ, "PERCOLITE_DB": uri}
    began = time.perf_counter()
    children = [
        subprocess.Popen(command, cwd=BENCH_DIR, env=child_env, stdout=subprocess.DEVNULL)
        for _ in range(groups)
    ]
    codes = [child.wait(timeout=600) for child in children]
    elapsed = time.perf_counter() - began
    with percolite.open(uri, app=pg_app.app) as env, env.transaction() as tx:
        final = dict(pg_app.hot.scan(tx))
    updates = sum(expected.values())
    return {
        "groups": groups,
        "updates": updates,
        "seconds": round(elapsed, 3),
        "updates_per_s": round(updates / elapsed, 1),
        "exact": final == expected and codes == [0] * groups,
    }


def _measure_pings(uri: str, pings: int) -> dict[str, Any]:
    column = ("bench", "ping")
    app = percolite.App("pg-pings")
    waited: list[float] = []

    @app.observer(column)
    def started(tx: Any, row: bytes, col: Any) -> None:
        waited.append(time.time() - float(tx.get(row, col)))

    with percolite.open(uri, app=app) as reader, percolite.open(uri) as writer:
        reader.start_workers(2)
        time.sleep(0.5)  # the scanner listens
        for i in range(pings):
            writer.run(lambda tx, i=i: tx.set(f"p{i:05}", column, repr(time.time())))
            time.sleep(PING_INTERVAL_S)
        deadline = time.monotonic() + 60
        while len(waited) < pings and time.monotonic() < deadline:
            time.sleep(0.05)
        reader.wait(timeout=60)
    waited.sort()
    return {
        "pings": pings,
        "observed": len(waited),
        "p50_ms": round(1000 * percentile(waited, 0.50), 2),
        "p99_ms": round(1000 * percentile(waited, 0.99), 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement ``args.repeat`` times on one server, interleaved."""
    sql_threads = tuple(chosen(args.postgresql_sql_threads, list(DEFAULT_SQL_THREADS)))
    backlog = chosen(args.postgresql_backlog, QUICK_BACKLOG if args.quick else DEFAULT_BACKLOG)
    pings = chosen(args.postgresql_pings, QUICK_PINGS if args.quick else DEFAULT_PINGS)
    in_flight = bench_loader.IN_FLIGHT
    hot: dict[str, list[dict[str, Any]]] = {approach: [] for approach in APPROACHES}
    sql: dict[int, list[dict[str, Any]]] = {threads: [] for threads in sql_threads}
    groups: dict[int, list[dict[str, Any]]] = {n: [] for n in GROUPS}
    latency: list[dict[str, Any]] = []
    with scratch_dir(args.dir, f"{NAME}-") as scratch, _server(scratch) as server:
        for repetition in range(args.repeat):
            seed = repetition + 1
            for approach in run_order(APPROACHES, repetition):
                uri = f"{server.uri}&schema=hot_{approach.split('-')[-1]}_{repetition}"
                result = bench_loader.measure_loader_hotkeys(
                    approach, uri, args.seconds, seed, in_flight, False
                )
                if not result["exact"]:
                    raise RuntimeError(f"{approach}: the final values are wrong")
                hot[approach].append(result)
                log(
                    f"{NAME}: {approach} run {repetition + 1}/{args.repeat}: "
                    f"{result['updates_per_s']:,.0f} updates/s"
                )
            for threads in sql_threads:
                result = _measure_sql(
                    server.dsn, threads, args.seconds, seed, f"sql_{threads}_{repetition}"
                )
                if not result["exact"]:
                    raise RuntimeError(f"SQL at {threads} threads: {result['errors']}")
                sql[threads].append(result)
                log(f"{NAME}: SQL x{threads}: {result['updates_per_s']:,.0f} updates/s")
            for n in GROUPS:
                uri = f"{server.uri}&schema=groups_{n}_{repetition}"
                result = _measure_groups(uri, n, backlog, seed)
                if not result["exact"]:
                    raise RuntimeError(f"{n} worker groups: the folded values are wrong")
                groups[n].append(result)
                log(f"{NAME}: {n} group(s): {result['updates_per_s']:,.0f} updates/s")
            latency.append(_measure_pings(f"{server.uri}&schema=pings_{repetition}", pings))
            log(f"{NAME}: wake-ups: {latency[-1]}")
        settings = server.settings()

    def med(runs: list[dict[str, Any]], field: str) -> float:
        return median([run[field] for run in runs])

    summary = {
        "hot": {a: med(hot[a], "updates_per_s") for a in APPROACHES},
        "sql": {str(t): med(sql[t], "updates_per_s") for t in sql_threads},
        "groups": {str(n): med(groups[n], "updates_per_s") for n in GROUPS},
        "p50_ms": med(latency, "p50_ms"),
        "p99_ms": med(latency, "p99_ms"),
    }
    cq = summary["hot"]["loader-cq-native"]
    summary["cq_vs_naive"] = ratio(cq, summary["hot"]["loader-naive"])
    summary["cq_vs_best_sql"] = ratio(cq, max(summary["sql"].values()))
    return {
        "benchmark": NAME,
        "measures": "updates/s end to end, durable, on one PostgreSQL server",
        "settings": {
            "seconds": args.seconds,
            "repeat": args.repeat,
            "in_flight": in_flight,
            "sql_threads": list(sql_threads),
            "backlog": backlog,
            "pings": pings,
            "server": settings,
        },
        "versions": {
            "percolite": percolite.__version__,
            "percolite_module": str(Path(percolite.__file__).parent),
        },
        "machine": machine_info(),
        "runs": {
            "hot": hot,
            "sql": {str(t): sql[t] for t in sql_threads},
            "groups": {str(n): groups[n] for n in GROUPS},
            "latency": latency,
        },
        "summary": summary,
    }


def tables(report: dict[str, Any]) -> list[Table]:
    """The tables of ``REPORT.md`` (see ``common.py``)."""
    s, settings = report["summary"], report["settings"]
    hot_runs = report["runs"]["hot"]
    rows = []
    for approach, label in (
        ("loader-naive", "loader, naive read-modify-write"),
        ("loader-cq-native", "loader, combine queue (native sum)"),
    ):
        p99 = median([run["latency"]["p99_ms"] for run in hot_runs[approach]])
        rows.append([label, f"{s['hot'][approach]:,.0f}", f"{p99:.1f}"])
    for threads, rate in s["sql"].items():
        rows.append([f"SQL INSERT ... ON CONFLICT, {threads} client thread(s)", f"{rate:,.0f}", ""])
    hot = Table(
        f"Hot keys on PostgreSQL (durable), updates/s end to end, median of {settings['repeat']}",
        ["system", "updates/s", "submit -> durable p99 ms"],
        rows,
        [
            f"combine queue / naive: {s['cq_vs_naive']:.1f}x; "
            f"combine queue / best SQL: {s['cq_vs_best_sql']:.2f}x"
        ],
    )
    groups = Table(
        f"Worker groups folding {settings['backlog']:,} transactions of combine-queue updates",
        ["groups", "updates/s"],
        [[n, f"{rate:,.0f}"] for n, rate in s["groups"].items()],
        [],
    )
    wake = Table(
        f"Wake-ups across handles (LISTEN/NOTIFY), {settings['pings']} commits",
        ["p50 ms", "p99 ms"],
        [[f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}"]],
        [],
    )
    return [hot, groups, wake]


def targets(report: dict[str, Any]) -> list[Target]:
    return [
        Target(
            "postgresql: hot keys, combine queue / naive read-modify-write, end to end",
            report["summary"]["cq_vs_naive"],
            CQ_VS_NAIVE_TARGET,
        ),
        Target(
            "postgresql: hot keys, combine queue / the best hand-written INSERT ... ON CONFLICT",
            report["summary"].get("cq_vs_best_sql"),
            CQ_VS_SQL_TARGET,
        ),
    ]


def format_report(report: dict[str, Any]) -> str:
    return "\n".join([format_tables(tables(report)), format_targets(targets(report))])


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
