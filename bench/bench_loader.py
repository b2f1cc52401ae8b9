"""The loader: one Python thread keeping hundreds of durable transactions in flight.

``env.loader(max_in_flight=IN_FLIGHT)`` runs each submitted function in a fresh
transaction on the loader's thread and hands its commit to the group-commit
writer without waiting; each future resolves once its transaction is durable
(``sync="full"``). Measured here, every system durable, in one run with the
systems interleaved:

* **Hot keys through the loader** (the workload of ``bench_hotkeys.py``:
  its PER_TRANSACTION keys per transaction drawn from Zipf(ZIPF_S) over KEYS
  keys; the loader runs cycle through DRAW_POOL draws made before the
  timing, so that the submitting thread's time goes to the loader, not to
  ``random.choices``; ``--loader-inline-draws`` draws in the loop instead),
  one submitting thread for ``--seconds``, ``--loader-in-flight`` in flight:
  ``loader-naive`` (each function reads and rewrites its counters; conflicts
  re-run it with back-off, ``max_retries=None``), ``loader-cq-native``
  (``queue.add`` to a combine queue with the native ``"sum"``, HOT_BUCKETS
  buckets, folded by WORKER_THREADS worker threads), and SQLite (WAL,
  ``synchronous=FULL``, ``BEGIN IMMEDIATE`` + one UPSERT per key,
  ``bench_hotkeys``' own run) at each of ``--loader-sqlite-threads``.
  Beside them, the combine queue as users write it: ``loader-cq-lambda-Nw``
  submits ``lambda tx, b: queue.add(tx, b)`` with a dict drawn fresh in the
  submitting loop (whatever ``--loader-inline-draws`` says), folded by N
  worker threads for each N of ``--loader-user-workers``.
  Updates/s end to end: until every value is final and durable (for the
  combine queue: folded, ``env.wait()``); the load rate (until every future
  resolved) is reported beside it. All the KEYS final values are checked
  against the submitted updates (``exact``).
* **Bulk combine-queue updates**: ``--loader-updates`` updates (random
  KEY_BYTES-byte key, +1) submitted through the loader in transactions of
  ``--loader-tx-keys``, folded by WORKER_THREADS workers
  (``key_codec="bytes"``, ``value_codec="int64"``), timed until folded
  (every folded value checked), against py-lmdb putting as many values in
  transactions of ``--loader-lmdb-batch`` with ``sync=True``
  (``bench_storage``'s run).
* **Latency**: p50/p99 from the ``submit`` call to the future resolving
  (durable) in every loader run.

Targets: combine queue through the loader at least CQ_VS_NAIVE_TARGET times
naive through the loader and CQ_VS_SQLITE_TARGET times SQLite's best (of its
thread counts), end to end; written as users write it, at each worker count,
at least USER_VS_NAIVE_TARGET and USER_VS_SQLITE_TARGET times; bulk updates
end to end at least BULK_TARGET times py-lmdb's puts. Run it alone
(``python bench/bench_loader.py``, report in ``bench/results/loader.json``) or
through ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import random
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

import bench_hotkeys
import bench_storage
import lmdb
import percolite
from common import (
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
    median_or_none,
    pair_ratios,
    percentile,
    ratio,
    run_order,
    run_standalone,
    same_filesystem,
    scratch_dir,
    spread,
)

NAME = "loader"
IN_FLIGHT = 256
WORKER_THREADS = bench_hotkeys.WORKER_THREADS
HOT_BUCKETS = 16
SQLITE_THREADS = (4, 16)
TX_KEYS = 50
DRAW_POOL = 16_384
LMDB_BATCH = 10_000
DEFAULT_UPDATES, QUICK_UPDATES = 500_000, 20_000
KEY_BYTES = bench_storage.KEY_BYTES
DRAIN_TIMEOUT_S = 600.0
CQ_VS_NAIVE_TARGET = 20.0
CQ_VS_SQLITE_TARGET = 5.0
USER_WORKER_THREADS = (2, 4)
USER_VS_NAIVE_TARGET = 25.0
USER_VS_SQLITE_TARGET = 8.0
BULK_TARGET = 0.3

LOADER_APPROACHES = ("loader-naive", "loader-cq-native")
LABELS = {"loader-naive": "loader, naive RMW", "loader-cq-native": "loader, CQ native sum"}
BULK_SYSTEMS = ("loader_cq", "lmdb_put")
BULK_LABELS = {"loader_cq": "combine queue via loader", "lmdb_put": "py-lmdb puts"}


def sqlite_name(threads: int) -> str:
    return f"sqlite-{threads}t"


def user_name(workers: int) -> str:
    """The approach of the combine queue as users write it, with ``workers``."""
    return f"{USER_PREFIX}{workers}w"


USER_PREFIX = "loader-cq-lambda-"


def user_workers(approach: str) -> int | None:
    """The worker threads of a :func:`user_name` approach; None for the others."""
    if not approach.startswith(USER_PREFIX):
        return None
    return int(approach.removeprefix(USER_PREFIX).removesuffix("w"))


def label(approach: str) -> str:
    if approach.startswith("sqlite-"):
        return f"SQLite, {approach.removeprefix('sqlite-').removesuffix('t')} threads"
    workers = user_workers(approach)
    if workers is not None:
        return f"loader, CQ lambda+fresh dicts, {workers} workers"
    return LABELS[approach]


# -- timing a loader --------------------------------------------------------------
class _Submissions:
    """Submits through a loader and times each submission: from the
    ``submit`` call to its future resolving (a done-callback, run on the
    loader's thread), and how long ``submit`` waited for a free slot. Keeps
    floats only, not the futures: holding every future (each with its lock)
    would make the garbage collector, which holds the GIL, part of the
    measurement."""

    def __init__(self, loader: percolite.Loader) -> None:
        self.loader = loader
        self.submitted = 0
        self.latencies: list[float] = []  # seconds, in the order they resolved
        self.waits: list[float] = []
        self.failures: list[BaseException] = []

    def _done(self, called: float, future: Future) -> None:
        self.latencies.append(time.perf_counter() - called)
        if future.exception() is not None:
            self.failures.append(future.exception())

    def submit(self, fn: Any, *args: Any) -> None:
        called = time.perf_counter()
        future = self.loader.submit(fn, *args)
        self.waits.append(time.perf_counter() - called)
        self.submitted += 1
        future.add_done_callback(functools.partial(self._done, called))

    def check(self) -> None:
        """After the loader closed: every submission resolved, none failed
        (leaving the loader's ``with`` block raises the first failure too)."""
        if self.failures:
            raise self.failures[0]
        if len(self.latencies) != self.submitted:
            raise RuntimeError(f"{self.submitted - len(self.latencies)} futures did not resolve")

    def latency(self) -> dict[str, Any]:
        """p50/p99/max ms from the ``submit`` call to the durable result, and
        how long ``submit`` waited for a free slot."""
        total = [value * 1000 for value in self.latencies]
        waited = [value * 1000 for value in self.waits]
        return {
            "p50_ms": round(percentile(total, 0.5), 3),
            "p99_ms": round(percentile(total, 0.99), 3),
            "max_ms": round(max(total), 3),
            "submit_wait_p50_ms": round(percentile(waited, 0.5), 3),
            "submit_wait_p99_ms": round(percentile(waited, 0.99), 3),
        }


def _thread_cpu_seconds(name: str) -> float | None:
    """CPU time so far of this process's live thread called ``name`` (Linux;
    ``None`` elsewhere or when there is no such thread)."""
    thread = next((t for t in threading.enumerate() if t.name == name), None)
    if thread is None or thread.native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{thread.native_id}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # utime and stime, fields 14 and 15 of stat(5) (the list starts at field 3).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Cpu:
    """CPU use over an interval: the whole process, the loader's thread, and
    the submitting thread (the caller)."""

    def __init__(self) -> None:
        self.process = time.process_time()
        self.submitter = time.thread_time()
        self.wall = time.perf_counter()
        self.loader: float | None = None

    def loader_started(self) -> None:
        self.loader = _thread_cpu_seconds("percolite-loader")

    def until_now(self, loader_thread_alive: bool) -> dict[str, Any]:
        wall = time.perf_counter() - self.wall
        loader = _thread_cpu_seconds("percolite-loader") if loader_thread_alive else None
        busy = None if loader is None or self.loader is None else loader - self.loader
        return {
            "wall_seconds": round(wall, 4),
            "process_cores": round((time.process_time() - self.process) / wall, 3),
            "loader_thread_busy": None if busy is None else round(busy / wall, 3),
            "submitter_busy": round((time.thread_time() - self.submitter) / wall, 3),
        }


# -- hot keys ---------------------------------------------------------------------
class _Run(NamedTuple):
    """What :func:`_load_and_drain` saw: the submissions, the clock at the
    start, when every future had resolved and when the store was idle, the
    loader's CPU, and the store's counters before, after loading and at the end."""

    submissions: Any
    began: float
    loaded: float
    finished: float
    load_cpu: Any
    before: dict
    load_stats: dict
    after: dict


def _load_and_drain(
    env: percolite.Env,
    in_flight: int,
    submit_all: Callable[[Any, float], None],
    not_drained: Callable[[], str],
    max_retries: int | None = 1000,
) -> _Run:
    """One timed run: ``submit_all(submissions, began)`` submits through a
    loader of ``in_flight``, which is flushed; then the workers drain the
    store (RuntimeError with ``not_drained()`` after DRAIN_TIMEOUT_S)."""
    before = env.stats()
    with env.loader(in_flight, max_retries=max_retries) as loader:
        cpu = _Cpu()
        cpu.loader_started()
        submissions = _Submissions(loader)
        began = time.perf_counter()
        submit_all(submissions, began)
        loader.flush()
        loaded = time.perf_counter()
        load_cpu = cpu.until_now(loader_thread_alive=True)
    submissions.check()
    load_stats = env.stats()
    if not env.wait(timeout=DRAIN_TIMEOUT_S):
        raise RuntimeError(not_drained())
    finished = time.perf_counter()
    return _Run(submissions, began, loaded, finished, load_cpu, before, load_stats, env.stats())


def measure_loader_hotkeys(
    approach: str, store: Path | str, seconds: float, seed: int, in_flight: int, inline_draws: bool
) -> dict[str, Any]:
    """One hot-keys run through a loader (``approach``: one of
    LOADER_APPROACHES or a :func:`user_name`) on the store at ``store`` (a
    path, or a URI such as a PostgreSQL one): ``seconds`` of submissions, then
    until every value is final; what it did, its latency and whether the
    final values are exact."""
    app = percolite.App()
    queue = app.combine_queue("hot", buckets=HOT_BUCKETS, combiner="sum")
    env = percolite.open(store, app=app, sync="full")
    counter = bench_hotkeys.COUNTER

    def naive(tx: percolite.Transaction, keys: dict[str, int]) -> None:
        for key, n in keys.items():
            tx.set(key, counter, str(int(tx.get(key, counter, b"0")) + n))

    workers = user_workers(approach)
    if approach not in LOADER_APPROACHES and workers is None:
        raise ValueError(f"unknown loader approach {approach!r}")
    fn: Callable[..., None] = naive if approach == "loader-naive" else queue.add
    if workers is not None:  # as users write it: a lambda, a dict drawn for each call
        fn = lambda tx, b: queue.add(tx, b)  # noqa: E731
        inline_draws = True
    try:
        if approach != "loader-naive":
            env.start_workers(WORKER_THREADS if workers is None else workers)
        sample = bench_hotkeys.zipf_sampler(seed)
        # Plain dicts: CombineQueue.add encodes an exact dict (or list of pairs)
        # in C++; a Counter, a dict subclass, goes through Python encoding.
        pool = [] if inline_draws else [dict(sample()) for _ in range(DRAW_POOL)]
        drawn: list[dict[str, int]] = []  # inline draws: untracked by the GC

        def submit_all(submissions: _Submissions, began: float) -> None:
            deadline = began + seconds
            if inline_draws:
                while time.perf_counter() < deadline:
                    keys = dict(sample())
                    submissions.submit(fn, keys)
                    drawn.append(keys)
            else:
                size, index = len(pool), 0
                while time.perf_counter() < deadline:
                    submissions.submit(fn, pool[index % size])
                    index += 1

        run = _load_and_drain(
            env,
            in_flight,
            submit_all,
            lambda: f"the combine queue did not drain in {DRAIN_TIMEOUT_S:g} s",
            max_retries=None,
        )
        submissions, began, loaded, finished = run.submissions, run.began, run.loaded, run.finished
        load_cpu, before, load_stats, after = run.load_cpu, run.before, run.load_stats, run.after
        with env.transaction() as tx:
            if approach == "loader-naive":
                final = {row.decode(): int(value) for row, _c, value in tx.scan(columns=[counter])}
            else:
                final = dict(queue.scan(tx))
    finally:
        env.close()
    transactions = submissions.submitted
    expected = _sum_draws(drawn) if inline_draws else _sum_pool(pool, transactions)
    updates = sum(expected.values())
    wrong = sorted(k for k in final.keys() | expected.keys() if final.get(k) != expected.get(k))
    batches = load_stats["batches"] - before["batches"]
    return {
        "transactions": transactions,
        "updates": updates,
        "load_seconds": round(loaded - began, 4),
        "total_seconds": round(finished - began, 4),
        "load_updates_per_s": round(updates / (loaded - began), 1),
        "updates_per_s": round(updates / (finished - began), 1),
        "conflicts": after["conflicts"] - before["conflicts"],
        "conflicts_per_transaction": round(
            (after["conflicts"] - before["conflicts"]) / transactions, 4
        ),
        "batches": batches,
        "store_commits": load_stats["commits"] - before["commits"],
        "transactions_per_batch": round(transactions / batches, 3) if batches else None,
        "cpu": load_cpu,
        "latency": submissions.latency(),
        "exact": not wrong,
        "wrong_keys": len(wrong),
        "wrong_example": wrong[:3],
    }


def _sum_draws(draws: list[dict[str, int]]) -> collections.Counter:
    total: collections.Counter = collections.Counter()
    for keys in draws:
        total.update(keys)
    return total


def _sum_pool(pool: list[dict[str, int]], submitted: int) -> collections.Counter:
    """The updates of ``submitted`` transactions taken from ``pool`` in turn."""
    rounds, rest = divmod(submitted, len(pool))
    total = _sum_draws(pool[:rest])
    if rounds:
        for key, n in _sum_draws(pool).items():
            total[key] += rounds * n
    return total


def _measure_sqlite(threads: int, store: Path, seconds: float, seed: int) -> dict[str, Any]:
    """``bench_hotkeys``' SQLite run (same transactions, same check)."""
    measured = bench_hotkeys.MEASURE["sqlite"](store, threads, seconds, seed)
    measured["load_updates_per_s"] = measured["updates_per_s"]  # final when committed
    return measured


# -- bulk combine-queue updates ---------------------------------------------------
def _keys(updates: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(KEY_BYTES) for _ in range(updates)]


def _measure_loader_bulk(
    store: Path, keys: list[bytes], tx_keys: int, in_flight: int
) -> dict[str, Any]:
    app = percolite.App("loader_bench")
    queue = app.combine_queue("sums", combiner="sum", key_codec="bytes", value_codec="int64")
    transactions = [
        [(key, 1) for key in keys[start : start + tx_keys]]
        for start in range(0, len(keys), tx_keys)
    ]
    env = percolite.open(store, app=app, sync="full")
    try:
        env.start_workers(WORKER_THREADS)

        def submit_all(submissions: _Submissions, _began: float) -> None:
            for pairs in transactions:
                submissions.submit(queue.add, pairs)

        run = _load_and_drain(
            env,
            in_flight,
            submit_all,
            lambda: f"the updates were not folded: {env.status(queues=False)}",
        )
        submissions, began, loaded, finished = run.submissions, run.began, run.loaded, run.finished
        load_cpu, before, load_stats, after = run.load_cpu, run.before, run.load_stats, run.after
        env.stop_workers()
        with env.transaction() as tx:
            folded = dict(queue.scan(tx))
    finally:
        env.close()
    expected = collections.Counter(keys)
    if folded != dict(expected):
        wrong = sum(1 for k in folded.keys() | expected.keys() if folded.get(k) != expected[k])
        raise RuntimeError(f"{wrong} of {len(expected)} folded values differ from the updates")
    batches = load_stats["batches"] - before["batches"]
    return {
        "operations": len(keys),
        "transactions": len(transactions),
        "per_s": round(len(keys) / (finished - began), 1),
        "seconds": round(finished - began, 4),
        "load_per_s": round(len(keys) / (loaded - began), 1),
        "load_seconds": round(loaded - began, 4),
        "batches": batches,
        "store_commits": load_stats["commits"] - before["commits"],
        "transactions_per_batch": round(len(transactions) / batches, 3) if batches else None,
        "drain_commits": after["commits"] - load_stats["commits"],
        "conflicts": after["conflicts"] - before["conflicts"],
        "cpu": load_cpu,
        "latency": submissions.latency(),
        "exact": True,
    }


def _measure_lmdb_bulk(store: Path, keys: list[bytes], batch: int) -> dict[str, Any]:
    batches = [keys[start : start + batch] for start in range(0, len(keys), batch)]
    measured = bench_storage.measure_lmdb_put(store, batches)
    return {**measured, "transactions": len(batches)}


# -- the run ----------------------------------------------------------------------
def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only (prefixed: ``run.py`` shares one parser)."""
    parser.add_argument(
        "--loader-in-flight",
        type=int,
        default=IN_FLIGHT,
        metavar="N",
        help="the loader's max_in_flight (default: %(default)s)",
    )
    parser.add_argument(
        "--loader-sqlite-threads",
        type=int,
        nargs="+",
        default=list(SQLITE_THREADS),
        metavar="N",
        help="SQLite hot-key runs, one per thread count; the best is the baseline "
        f"(default: {' '.join(map(str, SQLITE_THREADS))})",
    )
    parser.add_argument(
        "--loader-inline-draws",
        action="store_true",
        help="hot keys: draw each transaction's keys in the submitting loop (as bench_hotkeys "
        f"does) instead of cycling through {DRAW_POOL:,} draws made before the timing",
    )
    parser.add_argument(
        "--loader-user-workers",
        type=int,
        nargs="*",
        default=list(USER_WORKER_THREADS),
        metavar="N",
        help="hot keys as users write them (a lambda, fresh dicts): one run per worker-thread "
        f"count, none without N (default: {' '.join(map(str, USER_WORKER_THREADS))})",
    )
    parser.add_argument(
        "--loader-updates",
        type=int,
        default=None,
        metavar="N",
        help=f"bulk combine-queue updates and py-lmdb puts per run (default: {DEFAULT_UPDATES}; "
        f"--quick: {QUICK_UPDATES})",
    )
    parser.add_argument(
        "--loader-tx-keys",
        type=int,
        default=TX_KEYS,
        metavar="N",
        help="bulk combine-queue updates per loader transaction (default: %(default)s)",
    )
    parser.add_argument(
        "--loader-lmdb-batch",
        type=int,
        default=LMDB_BATCH,
        metavar="N",
        help="py-lmdb puts per write transaction (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    in_flight = args.loader_in_flight
    sqlite_threads = sorted(set(args.loader_sqlite_threads))
    workers = sorted(set(args.loader_user_workers))
    updates = chosen(args.loader_updates, QUICK_UPDATES if args.quick else DEFAULT_UPDATES)
    tx_keys, lmdb_batch = args.loader_tx_keys, args.loader_lmdb_batch
    if min(in_flight, updates, tx_keys, lmdb_batch, *sqlite_threads, *workers) < 1:
        raise ValueError(
            "--loader-in-flight, --loader-sqlite-threads, --loader-user-workers, "
            "--loader-updates, --loader-tx-keys and --loader-lmdb-batch must be positive"
        )
    approaches = [
        *LOADER_APPROACHES,
        *(user_name(n) for n in workers),
        *(sqlite_name(t) for t in sqlite_threads),
    ]
    hot_runs: dict[str, list[dict[str, Any]]] = {a: [] for a in approaches}
    bulk_runs: dict[str, list[dict[str, Any]]] = {s: [] for s in BULK_SYSTEMS}
    load_before = machine_info()["load_average"]
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        on_repo_filesystem = same_filesystem(scratch, REPO_ROOT)
        for repetition in range(args.repeat):
            seed = 1000 * repetition + 17
            for approach in run_order(approaches, repetition):
                store = scratch / f"{approach}-{repetition}"
                if approach.startswith("sqlite-"):
                    threads = int(approach.removeprefix("sqlite-").removesuffix("t"))
                    measured = _measure_sqlite(threads, store, args.seconds, seed)
                else:
                    measured = measure_loader_hotkeys(
                        approach, store, args.seconds, seed, in_flight, args.loader_inline_draws
                    )
                shutil.rmtree(store, ignore_errors=True)
                hot_runs[approach].append(measured)
                log(
                    f"{NAME}: hot keys, {label(approach):>22}, run {repetition + 1}/"
                    f"{args.repeat}: {measured['updates_per_s']:,.0f} updates/s end to end, "
                    f"exact={measured['exact']}"
                )
            keys = _keys(updates, seed=repetition)
            for system in run_order(BULK_SYSTEMS, repetition):
                store = scratch / f"{system}-{repetition}"
                if system == "loader_cq":
                    measured = _measure_loader_bulk(store, keys, tx_keys, in_flight)
                else:
                    measured = _measure_lmdb_bulk(store, keys, lmdb_batch)
                shutil.rmtree(store, ignore_errors=True)
                bulk_runs[system].append(measured)
                log(
                    f"{NAME}: bulk, {BULK_LABELS[system]:>24}, run {repetition + 1}/"
                    f"{args.repeat}: {measured['per_s']:,.0f}/s"
                )
    machine = machine_info()
    machine["load_average"] = load_before
    return {
        "benchmark": NAME,
        "measures": "one thread with a loader: hot-key updates/s end to end vs naive through "
        "the loader and SQLite; bulk combine-queue updates/s vs py-lmdb puts; submit -> "
        "durable latency",
        "settings": {
            "in_flight": in_flight,
            "seconds": args.seconds,
            "repeat": args.repeat,
            "quick": args.quick,
            "hotkeys": {
                "approaches": approaches,
                "sqlite_threads": sqlite_threads,
                "keys": bench_hotkeys.KEYS,
                "zipf_s": bench_hotkeys.ZIPF_S,
                "per_transaction": bench_hotkeys.PER_TRANSACTION,
                "combine_queue": {"buckets": HOT_BUCKETS, "worker_threads": WORKER_THREADS},
                "user_worker_threads": workers,
                "naive_max_retries": None,
                "draws": "inline" if args.loader_inline_draws else f"pool of {DRAW_POOL}",
            },
            "bulk": {
                "updates": updates,
                "tx_keys": tx_keys,
                "lmdb_batch": lmdb_batch,
                "key_bytes": KEY_BYTES,
                "value_bytes": len(bench_storage.VALUE),
                "worker_threads": WORKER_THREADS,
            },
            "store_parent": str(Path(args.dir).resolve()),
            "store_on_repo_filesystem": on_repo_filesystem,
            "percolite": {"sync": "full"},
            "lmdb": {"sync": True, "metasync": True},
            "sqlite": {"journal_mode": "WAL", "synchronous": "FULL"},
        },
        "versions": {
            "percolite": percolite.__version__,
            "percolite_module": str(Path(percolite.__file__).parent),
            "py_lmdb": lmdb.__version__,
            "sqlite": sqlite3.sqlite_version,
        },
        "machine": machine,
        "load_average_after": machine_info()["load_average"],
        "hotkeys": _summarise_hotkeys(approaches, hot_runs),
        "bulk": _summarise_bulk(bulk_runs),
    }


def _latency_summary(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    if not runs or "latency" not in runs[0]:
        return None
    return {
        name: median([run["latency"][name] for run in runs])
        for name in ("p50_ms", "p99_ms", "max_ms", "submit_wait_p50_ms", "submit_wait_p99_ms")
    }


def _summarise_hotkeys(
    approaches: list[str], runs: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for approach in approaches:
        measured = runs[approach]
        results[approach] = {
            "median_updates_per_s": median([r["updates_per_s"] for r in measured]),
            "median_load_updates_per_s": median([r["load_updates_per_s"] for r in measured]),
            "median_conflicts_per_transaction": median(
                [r["conflicts_per_transaction"] for r in measured]
            ),
            "median_transactions_per_batch": median_or_none(
                r.get("transactions_per_batch") for r in measured
            ),
            "latency": _latency_summary(measured),
            "exact": all(r["exact"] for r in measured),
            "runs": measured,
        }
    sqlite = [a for a in approaches if a.startswith("sqlite-")]
    best = max(sqlite, key=lambda a: results[a]["median_updates_per_s"], default=None)

    def versus(field: str, baseline: str | None) -> float | None:
        if baseline is None:
            return None
        value = ratio(results["loader-cq-native"][field], results[baseline][field])
        return None if value is None else round(value, 3)

    def user_versus(approach: str, baseline: str | None) -> float | None:
        if baseline is None:
            return None
        value = ratio(
            results[approach]["median_updates_per_s"], results[baseline]["median_updates_per_s"]
        )
        return None if value is None else round(value, 3)

    return {
        "results": results,
        "sqlite_best": best,
        "cq_vs_naive": versus("median_updates_per_s", "loader-naive"),
        "cq_vs_sqlite_best": versus("median_updates_per_s", best),
        "cq_load_vs_naive": versus("median_load_updates_per_s", "loader-naive"),
        "cq_load_vs_sqlite_best": versus("median_load_updates_per_s", best),
        # The combine queue as users write it, by approach: end to end vs
        # naive and vs the best SQLite.
        "user": {
            a: {"vs_naive": user_versus(a, "loader-naive"), "vs_sqlite_best": user_versus(a, best)}
            for a in approaches
            if user_workers(a) is not None
        },
    }


def _summarise_bulk(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    results = {
        system: {
            "median_per_s": median([r["per_s"] for r in measured]),
            "spread": spread([r["per_s"] for r in measured]),
            "runs": measured,
        }
        for system, measured in runs.items()
    }
    ours = results["loader_cq"]
    ours["median_load_per_s"] = median([r["load_per_s"] for r in ours["runs"]])
    ours["latency"] = _latency_summary(ours["runs"])
    baseline = results["lmdb_put"]["median_per_s"]
    return {
        "results": results,
        "ratio": round(ours["median_per_s"] / baseline, 4),
        "load_ratio": round(ours["median_load_per_s"] / baseline, 4),
        "ratio_per_repetition": pair_ratios(
            [run["per_s"] for run in ours["runs"]],
            [run["per_s"] for run in results["lmdb_put"]["runs"]],
            4,
        ),
    }


# -- output -----------------------------------------------------------------------
def _ms(latency: dict[str, float] | None, name: str) -> str:
    return "-" if latency is None else f"{latency[name]:.1f}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def tables(report: dict[str, Any]) -> list[Table]:
    settings = report["settings"]
    hot_settings, bulk_settings = settings["hotkeys"], settings["bulk"]
    hot = report["hotkeys"]
    results = hot["results"]
    approaches = hot_settings["approaches"]
    in_flight = settings["in_flight"]
    repeat = f"median of {settings['repeat']} x {settings['seconds']:g} s"
    hot_table = Table(
        title=(
            f"Hot keys through one loader thread ({in_flight} in flight): updates/s, "
            f"{hot_settings['per_transaction']} keys per transaction from "
            f"Zipf({hot_settings['zipf_s']}) over {hot_settings['keys']:,} keys, durable, "
            f"{repeat}"
        ),
        headers=[
            "approach",
            "end to end",
            "load",
            "conflicts/tx",
            "tx/group commit",
            "p50 ms",
            "p99 ms",
            "exact",
        ],
        rows=[
            [
                label(a),
                f"{results[a]['median_updates_per_s']:,.0f}",
                f"{results[a]['median_load_updates_per_s']:,.0f}",
                f"{results[a]['median_conflicts_per_transaction']:.3f}",
                _fraction(results[a]["median_transactions_per_batch"]),
                _ms(results[a]["latency"], "p50_ms"),
                _ms(results[a]["latency"], "p99_ms"),
                "yes" if results[a]["exact"] else "NO",
            ]
            for a in approaches
        ],
        notes=[
            f"Keys drawn: {hot_settings.get('draws', 'inline')} (loader runs; SQLite threads draw "
            "inline). End to end: until every value is final and durable (combine queue: folded by "
            f"{hot_settings['combine_queue']['worker_threads']} workers); load: until every "
            "future resolved (for SQLite the same). Latency: submit() call -> future resolved "
            "(durable); for the combine queue, the adding transaction's commit, not the fold. "
            f"CQ native / naive: {_times(hot['cq_vs_naive'])} end to end "
            f"({_times(hot['cq_load_vs_naive'])} load); CQ native / best SQLite "
            f"({label(hot['sqlite_best']) if hot['sqlite_best'] else '-'}): "
            f"{_times(hot['cq_vs_sqlite_best'])} ({_times(hot['cq_load_vs_sqlite_best'])} load)."
            + "".join(
                f" {label(a)}: {_times(v['vs_naive'])} naive, {_times(v['vs_sqlite_best'])} "
                "best SQLite."
                for a, v in hot.get("user", {}).items()
            ),
            "CQ lambda+fresh dicts: `loader.submit(lambda tx, b: queue.add(tx, b), batch)` with "
            "a dict drawn for each call, as users write it, folded by the workers named.",
        ],
    )
    bulk = report["bulk"]
    bulk_results = bulk["results"]
    baseline = bulk_results["lmdb_put"]["median_per_s"]
    ours = bulk_results["loader_cq"]
    bulk_table = Table(
        title=(
            f"Bulk: {bulk_settings['updates']:,} random {bulk_settings['key_bytes']}-byte keys, "
            f"durable: combine-queue updates through the loader ({bulk_settings['tx_keys']} per "
            f"transaction) vs py-lmdb puts ({bulk_settings['lmdb_batch']:,} per transaction), "
            f"median of {settings['repeat']}"
        ),
        headers=["system", "per second", "vs py-lmdb puts", "load per second", "spread"],
        rows=[
            [
                BULK_LABELS["loader_cq"],
                f"{ours['median_per_s']:,.0f}",
                f"{bulk['ratio']:.3f}x",
                f"{ours['median_load_per_s']:,.0f}",
                _fraction(ours["spread"]),
            ],
            [
                BULK_LABELS["lmdb_put"],
                f"{baseline:,.0f}",
                "1.000x",
                "-",
                _fraction(bulk_results["lmdb_put"]["spread"]),
            ],
        ],
        notes=[
            "Combine queue: native sum, folded by "
            f"{bulk_settings['worker_threads']} workers; per second end to end (until every "
            "update is folded and durable), load: until every future resolved "
            f"(p50 {_ms(ours['latency'], 'p50_ms')} ms, p99 {_ms(ours['latency'], 'p99_ms')} ms "
            "submit -> durable). py-lmdb: sync=True, metasync=True. Spread: fastest / slowest."
        ],
    )
    cpu_rows = []
    for approach in approaches:
        if approach.startswith("loader-"):
            cpu_rows.append(_cpu_row(label(approach), results[approach]["runs"]))
    cpu_rows.append(_cpu_row(BULK_LABELS["loader_cq"], ours["runs"]))
    cpu_table = Table(
        title="Where the loader runs' time goes, while loading (medians)",
        headers=[
            "run",
            "process cores",
            "loader thread busy",
            "submitter busy",
            "group commits/s",
            "tx/group commit",
        ],
        rows=cpu_rows,
        notes=[
            "Cores of CPU per wall second until every future resolved: the whole process, the "
            "loader's thread (runs the functions and the loader loop), the submitting thread. "
            "A loader thread near 1.0 would be the bottleneck (it holds the GIL while it "
            "runs); well below it, the time goes to the writer and worker threads (C++), the "
            "syncs, or other processes on the CPUs."
        ],
    )
    return [hot_table, bulk_table, cpu_table]


def _cpu_row(name: str, runs: list[dict[str, Any]]) -> list[str]:
    per_second = [r["batches"] / r["cpu"]["wall_seconds"] for r in runs]
    return [
        name,
        _fraction(median_or_none([r["cpu"]["process_cores"] for r in runs])),
        _fraction(median_or_none([r["cpu"]["loader_thread_busy"] for r in runs])),
        _fraction(median_or_none([r["cpu"]["submitter_busy"] for r in runs])),
        f"{median(per_second):,.0f}",
        _fraction(median_or_none([r["transactions_per_batch"] for r in runs])),
    ]


def plots(report: dict[str, Any]) -> list[Plot]:
    hot = report["hotkeys"]
    approaches = report["settings"]["hotkeys"]["approaches"]
    results = hot["results"]
    return [
        Plot(
            name="hotkeys",
            title="Hot keys, one thread with a loader vs SQLite threads (updates/s)",
            x_label="",
            y_label="updates/s",
            x=[
                label(a).replace("loader, ", "loader\n").replace("SQLite, ", "SQLite\n")
                for a in approaches
            ],
            series={
                "end to end": [results[a]["median_updates_per_s"] for a in approaches],
                "load": [results[a]["median_load_updates_per_s"] for a in approaches],
            },
            kind="bar",
        )
    ]


def _user_why(
    report: dict[str, Any], approach: str, native: float | None, target: float
) -> str:
    """Why the lambda form falls short, from this run's figures: it does the
    native form's work plus Python of its own, under the interpreter's lock."""
    results = report["hotkeys"]["results"]
    cpus = (report.get("machine") or {}).get("cpus", "?")

    def busy(name: str, what: str) -> str:
        runs = results.get(name, {}).get("runs") or []
        return _fraction(median_or_none([r["cpu"][what] for r in runs if r.get("cpu")]))

    native_text = "-" if native is None else f"{native:.2f}x"
    why = (
        "the lambda form does the native form's work plus, for each transaction, a dict of "
        "keys drawn in Python, holding the interpreter's lock (the lambda itself costs "
        "nothing measurable: with pooled dicts it runs at the native rate): its submitting "
        f"thread was busy {busy(approach, 'submitter_busy')} of a core against "
        f"{busy('loader-cq-native', 'submitter_busy')} for the native form, with the process "
        f"at {busy(approach, 'process_cores')} cores of the machine's {cpus}. "
        f"The native form reached {native_text} in the same run"
    )
    if native is not None and native < target:
        why += ", itself below the target: the lambda form cannot pass it here"
    elif native:
        why += f": the target asks the lambda form for {target / native:.0%} of the native rate"
    return why + " (bench/results/notes.md, \"Loader: the lambda form\")."


def targets(report: dict[str, Any]) -> list[Target]:
    hot, bulk = report["hotkeys"], report["bulk"]
    in_flight = report["settings"]["in_flight"]
    best = hot["sqlite_best"]
    best_text = label(best) if best else "SQLite"
    return [
        Target(
            f"loader: hot keys, CQ native / naive, one thread, {in_flight} in flight, end to end",
            hot["cq_vs_naive"],
            CQ_VS_NAIVE_TARGET,
        ),
        Target(
            f"loader: hot keys, CQ native (one thread) / best SQLite ({best_text}), end to end",
            hot["cq_vs_sqlite_best"],
            CQ_VS_SQLITE_TARGET,
        ),
        *(
            target
            for approach, versus in hot.get("user", {}).items()
            for target in (
                Target(
                    f"loader: hot keys, CQ lambda+fresh dicts, {user_workers(approach)} workers "
                    "/ naive, one thread, end to end",
                    versus["vs_naive"],
                    USER_VS_NAIVE_TARGET,
                    _user_why(report, approach, hot["cq_vs_naive"], USER_VS_NAIVE_TARGET),
                ),
                Target(
                    f"loader: hot keys, CQ lambda+fresh dicts, {user_workers(approach)} workers "
                    f"/ best SQLite ({best_text}), end to end",
                    versus["vs_sqlite_best"],
                    USER_VS_SQLITE_TARGET,
                    _user_why(report, approach, hot["cq_vs_sqlite_best"], USER_VS_SQLITE_TARGET),
                ),
            )
        ),
        Target(
            f"loader: CQ updates ({report['settings']['bulk']['tx_keys']} per transaction), "
            "folded, / py-lmdb batched puts",
            bulk["ratio"],
            BULK_TARGET,
        ),
    ]


def format_report(report: dict[str, Any]) -> str:
    text = format_tables(tables(report)) + "\n\n" + format_targets(targets(report))
    results = report["hotkeys"]["results"]
    wrong = [label(a) for a, r in results.items() if not r["exact"]]
    if wrong:
        text += f"\nerror: final values differ from the submitted updates: {', '.join(wrong)}"
    return text


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
