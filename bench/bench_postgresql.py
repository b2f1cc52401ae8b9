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
* **The export sink**: ``--postgresql-sink-rows`` rows (key ``k%09d``, an
  int value, a seq) written in batches of SINK_BATCH, one transaction each,
  in rotating order: by hand (psycopg's pipelined ``executemany`` of an
  ``INSERT ... ON CONFLICT DO UPDATE ... WHERE excluded.seq > seq``, what a
  user writes without percolite); by ``percolite.exporters.Postgres`` called
  directly (its Python path: owner check, guard table, then the upserts);
  by its native path alone (the same batches from queued bytes, one
  statement each); and by a whole export queue (a ``sync="full"`` LMDB store
  with the rows queued beforehand, drained by one worker thread) delivering
  natively and with ``PERCOLITE_NATIVE_SINKS=0``.
* **Wake-ups**: ``--postgresql-pings`` commits, PING_INTERVAL_S seconds
  apart, on one handle to a column an observer watches through another
  handle (its workers learn of them by LISTEN/NOTIFY): time from the
  committing call to the observer's start, p50 and p99.

Targets: the combine queue at least CQ_VS_NAIVE_TARGET times naive
read-modify-write on PostgreSQL, end to end, and at least
CQ_VS_SQL_TARGET times the best of the hand-written upserts (1 or 4
client threads) on the same server; the export sink's native path at least
SINK_VS_SQL_TARGET times the hand-written upserts of the same rows (it
also checks the owner and keeps the guard table).
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
SINK_SYSTEMS = ("sql", "python sink", "native sink", "queue python", "queue native")
DEFAULT_SINK_ROWS, QUICK_SINK_ROWS = 100_000, 3_000
SINK_BATCH = 1024
SINK_STORE = "5" * 32  # the owner of the sinks written directly
SINK_VS_SQL_TARGET = 1.0
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
        "--postgresql-sink-rows",
        type=int,
        metavar="N",
        help=f"rows each export-sink system writes (default: {DEFAULT_SINK_ROWS:,}; "
        f"{QUICK_SINK_ROWS:,} with --quick)",
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


def _sink_key(i: int) -> str:
    return f"k{i:09d}"


def _sink_ranges(rows: int) -> list[range]:
    return [range(start, min(rows, start + SINK_BATCH)) for start in range(0, rows, SINK_BATCH)]


def _sink_set_up(dsn: str, table: str) -> Any:
    """An exporter whose tables and owner exist, as after a queue's first
    batch (k000000000 holds seq 0: the timed batches leave it as it is)."""
    from percolite.exporters import Postgres, SequencedExport

    sink = Postgres(dsn, table)
    batch = percolite.ExportBatch([SequencedExport(_sink_key(0), 0, 0)])
    batch.queue, batch.store, batch.epoch = "out", SINK_STORE, 1
    sink(batch)
    return sink


def _sink_by_hand(dsn: str, table: str, rows: int) -> float:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, value bigint, seq bigint)")
    upsert = (
        f"INSERT INTO {table} (key, value, seq) VALUES (%s, %s, %s) ON CONFLICT (key) DO UPDATE"
        f" SET value = excluded.value, seq = excluded.seq WHERE excluded.seq > {table}.seq"
    )
    with psycopg.connect(dsn) as db:
        began = time.perf_counter()
        for batch in _sink_ranges(rows):
            with db.transaction(), db.cursor() as cursor:
                cursor.executemany(upsert, [(_sink_key(i), i, i) for i in batch])
        seconds = time.perf_counter() - began
        written = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    if written != rows:
        raise RuntimeError(f"by hand: {written} rows of {rows}")
    return rows / seconds


def _sink_python(dsn: str, table: str, rows: int) -> float:
    from percolite.exporters import SequencedExport

    sink = _sink_set_up(dsn, table)
    batches = []
    for batch in _sink_ranges(rows):
        entries = percolite.ExportBatch(SequencedExport(_sink_key(i), i, i) for i in batch)
        entries.queue, entries.store, entries.epoch = "out", SINK_STORE, 1
        batches.append(entries)
    began = time.perf_counter()
    for entries in batches:
        sink(entries)
    seconds = time.perf_counter() - began
    _sink_check(sink, rows)
    return rows / seconds


def _sink_native(dsn: str, table: str, rows: int) -> float:
    sink = _sink_set_up(dsn, table)
    native, why = sink._native_sink(("str", 0), ("int64", 0))
    assert native is not None, why
    batches = [
        [(_sink_key(i).encode(), b"\x01" + i.to_bytes(8, "big", signed=True), i) for i in batch]
        for batch in _sink_ranges(rows)
    ]
    began = time.perf_counter()
    for batch in batches:
        if native.deliver(batch, SINK_STORE, 1) != (True, None, None):
            raise RuntimeError("the native sink did not apply a batch")
    seconds = time.perf_counter() - began
    _sink_check(sink, rows)
    return rows / seconds


def _sink_queue(dsn: str, table: str, rows: int, store: Path, native: bool) -> float:
    from percolite.exporters import Postgres

    if not native:
        os.environ["PERCOLITE_NATIVE_SINKS"] = "0"
    try:
        sink = Postgres(dsn, table)
        app = percolite.App("pg_sink_bench")
        queue = app.export_queue(
            "out", sink, value_codec="int64", buckets=16, batch_size=SINK_BATCH
        )
    finally:
        os.environ.pop("PERCOLITE_NATIVE_SINKS", None)
    assert (queue.delivery == "native") == native, queue.delivery
    with percolite.open(store, app=app, sync="full") as env:
        for batch in _sink_ranges(rows):
            with env.transaction() as tx:
                for i in batch:
                    queue.add(tx, _sink_key(i), i)
        began = time.perf_counter()
        if not env.process(1, timeout=600)["idle"]:
            raise RuntimeError(f"the export queue did not drain: {env.status()}")
        seconds = time.perf_counter() - began
    _sink_check(sink, rows)
    return rows / seconds


def _sink_check(sink: Any, rows: int) -> None:
    written = sink.rows()
    sink.close()
    if written != {_sink_key(i): i for i in range(rows)}:
        raise RuntimeError(f"{sink!r}: {len(written)} rows, not the {rows} written")


def _measure_sink(dsn: str, system: str, rows: int, scratch: Path, name: str) -> float:
    """Rows/s ``system`` (one of SINK_SYSTEMS) writes into a new table
    ``name``, dropped afterwards with its guard and owner tables."""
    import psycopg

    try:
        if system == "sql":
            return _sink_by_hand(dsn, name, rows)
        if system == "python sink":
            return _sink_python(dsn, name, rows)
        if system == "native sink":
            return _sink_native(dsn, name, rows)
        return _sink_queue(dsn, name, rows, scratch / name, system == "queue native")
    finally:
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(f"DROP TABLE IF EXISTS {name}, {name}_seq, {name}_owner")


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
    sink_rows = chosen(
        args.postgresql_sink_rows, QUICK_SINK_ROWS if args.quick else DEFAULT_SINK_ROWS
    )
    if sink_rows < 1:
        raise ValueError("--postgresql-sink-rows must be positive")
    sink: dict[str, list[float]] = {system: [] for system in SINK_SYSTEMS}
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
            for system in run_order(SINK_SYSTEMS, repetition):
                name = f"sink_{system.replace(' ', '_')}_{repetition}"
                rate = _measure_sink(server.dsn, system, sink_rows, scratch, name)
                sink[system].append(round(rate, 1))
                log(f"{NAME}: sink, {system}: {rate:,.0f} rows/s")
            latency.append(_measure_pings(f"{server.uri}&schema=pings_{repetition}", pings))
            log(f"{NAME}: wake-ups: {latency[-1]}")
        settings = server.settings()

    def med(runs: list[dict[str, Any]], field: str) -> float:
        return median([run[field] for run in runs])

    summary = {
        "hot": {a: med(hot[a], "updates_per_s") for a in APPROACHES},
        "sql": {str(t): med(sql[t], "updates_per_s") for t in sql_threads},
        "groups": {str(n): med(groups[n], "updates_per_s") for n in GROUPS},
        "sink": {system: median(sink[system]) for system in SINK_SYSTEMS},
        # The median of each repetition's ratio: the two ran side by side.
        "native_sink_vs_sql": median(
            [ratio(n, h) for n, h in zip(sink["native sink"], sink["sql"], strict=True)]
        ),
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
            "sink_rows": sink_rows,
            "sink_batch": SINK_BATCH,
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
            "sink": sink,
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
    sql_rate = s["sink"]["sql"]
    sink = Table(
        f"Export into PostgreSQL (durable), rows/s, median of {settings['repeat']} rotating "
        f"rounds: {settings['sink_rows']:,} rows in batches of {settings['sink_batch']:,}, "
        "one transaction per batch",
        ["system", "rows/s", "x by hand"],
        [
            [_SINK_LABELS[system], f"{rate:,.0f}", f"{ratio(rate, sql_rate):.2f}x"]
            for system, rate in s["sink"].items()
        ],
        [
            "By hand: psycopg's pipelined executemany of INSERT ... ON CONFLICT DO UPDATE "
            "... WHERE excluded.seq > seq, no guard or owner table. Alone: the batches handed "
            "to the sink by one thread, no store. Export queue: the rows queued in a store "
            "(sync=full) beforehand, drained by one worker thread until idle."
        ],
    )
    return [hot, groups, sink, wake]


_SINK_LABELS = {
    "sql": "by hand (psycopg executemany upsert)",
    "python sink": "percolite.exporters.Postgres, alone",
    "native sink": "its native path, alone",
    "queue python": "export queue, Python delivery",
    "queue native": "export queue, native delivery",
}


def _cq_vs_sql_why(summary: dict[str, Any]) -> str:
    """What bounds the combine queue against hand-written SQL, from the
    run's figures: the folding, once the records of a group commit are
    joined (one per bucket, not one per transaction)."""
    folded = summary.get("groups", {}).get("1")
    loaded = summary.get("hot", {}).get("loader-cq-native")
    if not (folded and loaded):
        return ""
    return (
        f"the folds bound it: one worker group folded a backlog at {folded:,.0f} updates/s "
        f"on this server, and the loader ran at {loaded:,.0f} end to end; the server's row "
        "operations per update are already a share of a row, since a group commit's "
        "updates to one bucket are one record "
        '(bench/results/notes.md, "PostgreSQL: where a hot-key update\'s time goes").'
    )


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
            _cq_vs_sql_why(report["summary"]),
        ),
        Target(
            "postgresql: export sink, native path / the same upserts by hand (psycopg)",
            report["summary"].get("native_sink_vs_sql"),
            SINK_VS_SQL_TARGET,
        ),
    ]


def format_report(report: dict[str, Any]) -> str:
    return "\n".join([format_tables(tables(report)), format_targets(targets(report))])


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
