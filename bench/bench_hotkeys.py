"""Hot keys: many threads committing updates to the same few counters.

What is measured: T threads (``--hot-threads``, default DEFAULT_THREADS) each
commit, for a fixed time, one transaction after another; each transaction adds
1 to PER_TRANSACTION keys drawn from a Zipf(ZIPF_S) distribution over KEYS keys
(a key drawn twice gets 2), so a handful of keys are in nearly every
transaction. Five
ways of keeping those counts, all with every commit durable before it returns:

* ``naive``: each transaction reads and rewrites the counters itself
  (``tx.get`` + ``tx.set``), run with ``env.run(..., retries=None)``,
  percolite's documented retry of ``CommitConflict`` with jittered backoff;
* ``sharded``: each key is a ``percolite.ShardedCounter`` with SHARDS shards
  (exact mode): ``counter.add(tx, n)`` read-modify-writes one random shard,
  again under ``env.run``;
* ``cq-native``: ``queue.add(tx, updates)`` on a combine queue with the
  native ``"sum"`` combiner (folded in C++, without the GIL) and
  WORKER_THREADS worker threads in the same process;
* ``cq-python``: the same with a Python combiner, ``sum(values) or None``;
* ``sqlite``: SQLite in its own file, WAL, ``synchronous=FULL``, one
  connection per thread with a busy timeout; each transaction is ``BEGIN
  IMMEDIATE``, one UPSERT per key, ``COMMIT``.

Reported: committed updates per second *end to end*: updates committed by the
threads divided by the time until every value is final (for the combine
queue: until the workers have folded every queued update, ``env.wait()``);
conflicts (aborted commits retried, per committed transaction; for SQLite the
"database is locked" errors retried after the busy timeout); and whether every
final value equals the sum of the updates the threads committed (checked after
every run, for all KEYS keys).

No target: with every commit durable, each of T threads is in every other
group commit, so combine queue / naive is bounded by about T/2 times the
ratio of their group commits' costs (the report's note works it out), and a
target of 20x at 4 threads could not be met by any commit path. The hot-key
targets are the loader's (``bench_loader``): one Python thread keeping
hundreds of transactions in flight, as users are advised to load.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import random
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import percolite
from common import (
    Operation,
    OptionGroup,
    Plot,
    Table,
    Target,
    format_tables,
    format_targets,
    log,
    machine_info,
    median,
    median_or_none,
    open_sqlite,
    ratio,
    run_order,
    run_standalone,
    run_threads,
    scratch_dir,
)

NAME = "hotkeys"
KEYS = 10_000
ZIPF_S = 1.1
PER_TRANSACTION = 20
SHARDS = 8
BUCKETS = 16  # of the combine queues
WORKER_THREADS = 4
DEFAULT_THREADS = (1, 2, 4, 8)
QUICK_THREADS = (1, 4)
DRAIN_TIMEOUT_S = 600.0
COUNTER = ("count", "n")

APPROACHES = ("naive", "sharded", "cq-native", "cq-python", "sqlite")
LABELS = {
    "naive": "naive RMW",
    "sharded": f"sharded ({SHARDS})",
    "cq-native": "CQ native sum",
    "cq-python": "CQ Python sum",
    "sqlite": "SQLite",
}

KEY_NAMES = [f"key{rank:05d}" for rank in range(1, KEYS + 1)]
_ZIPF_CUMULATIVE = list(itertools.accumulate(1.0 / rank**ZIPF_S for rank in range(1, KEYS + 1)))


def zipf_sampler(seed: int) -> Callable[[], collections.Counter]:
    """Draws of one transaction: ``{key: times drawn}``, K draws in all."""
    rng = random.Random(seed)

    def sample() -> collections.Counter:
        return collections.Counter(
            rng.choices(KEY_NAMES, cum_weights=_ZIPF_CUMULATIVE, k=PER_TRANSACTION)
        )

    return sample


def python_sum(key: str, values: list) -> Any:
    """The Python combiner: what the native ``"sum"`` does, in Python."""
    return sum(values) or None


class _Committed:
    """What the threads committed, one Counter per thread (no lock needed)."""

    def __init__(self, threads: int) -> None:
        self.per_thread = [collections.Counter() for _ in range(threads)]

    def expected(self) -> dict[str, int]:
        total: collections.Counter = collections.Counter()
        for counts in self.per_thread:
            total.update(counts)
        return {key: n for key, n in total.items() if n}


# Each approach: (store directory, threads, seconds, seed) -> measured run.
def _measure_naive(store: Path, threads: int, seconds: float, seed: int) -> dict[str, Any]:
    env = percolite.open(store, sync="full")
    try:
        committed = _Committed(threads)

        def make_operation(index: int) -> Operation:
            sample, mine = zipf_sampler(seed + index), committed.per_thread[index]

            def update(tx: percolite.Transaction, keys: collections.Counter) -> None:
                for key, n in keys.items():
                    tx.set(key, COUNTER, str(int(tx.get(key, COUNTER, b"0")) + n))

            def operation(_: int) -> None:
                keys = sample()
                env.run(lambda tx: update(tx, keys), retries=None)
                mine.update(keys)

            return operation

        began = time.perf_counter()
        result = run_threads(make_operation, threads, seconds)
        elapsed = time.perf_counter() - began
        batches = env.stats()["batches"]
        with env.transaction() as tx:
            final = {row.decode(): int(value) for row, _c, value in tx.scan(columns=[COUNTER])}
        conflicts = env.stats()["conflicts"]
    finally:
        env.close()
    return _record(result.ops, elapsed, elapsed, conflicts, final, committed.expected(), batches)


def _measure_sharded(store: Path, threads: int, seconds: float, seed: int) -> dict[str, Any]:
    env = percolite.open(store, sync="full")
    try:
        counters = {
            key: percolite.ShardedCounter(key, SHARDS, rng=random.Random(seed + rank))
            for rank, key in enumerate(KEY_NAMES)
        }
        committed = _Committed(threads)

        def make_operation(index: int) -> Operation:
            sample, mine = zipf_sampler(seed + index), committed.per_thread[index]

            def update(tx: percolite.Transaction, keys: collections.Counter) -> None:
                for key, n in keys.items():
                    counters[key].add(tx, n)

            def operation(_: int) -> None:
                keys = sample()
                env.run(lambda tx: update(tx, keys), retries=None)
                mine.update(keys)

            return operation

        began = time.perf_counter()
        result = run_threads(make_operation, threads, seconds)
        elapsed = time.perf_counter() - began
        batches = env.stats()["batches"]
        with env.transaction() as tx:
            final = {key: counter.get(tx) for key, counter in counters.items()}
        conflicts = env.stats()["conflicts"]
    finally:
        env.close()
    final = {key: n for key, n in final.items() if n}
    return _record(result.ops, elapsed, elapsed, conflicts, final, committed.expected(), batches)


def _measure_combine_queue(
    combiner: Any, store: Path, threads: int, seconds: float, seed: int
) -> dict[str, Any]:
    app = percolite.App()
    queue = app.combine_queue("hot", buckets=BUCKETS, combiner=combiner)
    env = percolite.open(store, app=app, sync="full")
    try:
        env.start_workers(WORKER_THREADS)
        committed = _Committed(threads)

        def make_operation(index: int) -> Operation:
            sample, mine = zipf_sampler(seed + index), committed.per_thread[index]

            def operation(_: int) -> None:
                keys = sample()
                with env.transaction() as tx:
                    queue.add(tx, keys)
                mine.update(keys)

            return operation

        began = time.perf_counter()
        result = run_threads(make_operation, threads, seconds)
        adding = time.perf_counter() - began
        batches = env.stats()["batches"]  # while adding (bucket runs commit in them too)
        if not env.wait(timeout=DRAIN_TIMEOUT_S):
            raise RuntimeError(f"the combine queue did not drain in {DRAIN_TIMEOUT_S:g} s")
        elapsed = time.perf_counter() - began
        with env.transaction() as tx:
            final = dict(queue.scan(tx))
        # Only the bucket processors can conflict: adders never collide.
        conflicts = env.stats()["conflicts"]
    finally:
        env.close()
    return _record(result.ops, adding, elapsed, conflicts, final, committed.expected(), batches)


SQLITE_UPSERT = "INSERT INTO counts VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET n = n + excluded.n"


def _measure_sqlite(store: Path, threads: int, seconds: float, seed: int) -> dict[str, Any]:
    store.mkdir(parents=True, exist_ok=True)
    path = store / "counts.sqlite"
    setup = open_sqlite(path)
    setup.execute("CREATE TABLE counts (key TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    connections = [open_sqlite(path) for _ in range(threads)]
    busy = [0] * threads
    try:
        committed = _Committed(threads)

        def make_operation(index: int) -> Operation:
            sample, mine = zipf_sampler(seed + index), committed.per_thread[index]
            connection = connections[index]

            def operation(_: int) -> None:
                keys = sample()
                while True:
                    try:
                        connection.execute("BEGIN IMMEDIATE")
                        break
                    except sqlite3.OperationalError as error:
                        # Only after the busy timeout: counted like a conflict.
                        if "locked" not in str(error):
                            raise
                        busy[index] += 1
                try:
                    connection.executemany(SQLITE_UPSERT, keys.items())
                    connection.execute("COMMIT")
                except BaseException:
                    connection.rollback()
                    raise
                mine.update(keys)

            return operation

        began = time.perf_counter()
        result = run_threads(make_operation, threads, seconds)
        elapsed = time.perf_counter() - began
        final = dict(setup.execute("SELECT key, n FROM counts WHERE n != 0"))
    finally:
        for connection in connections:
            connection.close()
        setup.close()
    return _record(result.ops, elapsed, elapsed, sum(busy), final, committed.expected())


MEASURE: dict[str, Callable[[Path, int, float, int], dict[str, Any]]] = {
    "naive": _measure_naive,
    "sharded": _measure_sharded,
    "cq-native": lambda *a: _measure_combine_queue("sum", *a),
    "cq-python": lambda *a: _measure_combine_queue(python_sum, *a),
    "sqlite": _measure_sqlite,
}


def _record(
    transactions: int,
    adding: float,
    elapsed: float,
    conflicts: int,
    final: dict[str, int],
    expected: dict[str, int],
    batches: int | None = None,
) -> dict[str, Any]:
    """One run as it appears in the JSON report. ``batches``: the group
    commits (each one sync) while the threads committed; None for SQLite,
    where every transaction syncs on its own."""
    updates = transactions * PER_TRANSACTION
    wrong = sorted(
        key for key in final.keys() | expected.keys() if final.get(key) != expected.get(key)
    )
    return {
        "transactions": transactions,
        "updates": updates,
        "adding_seconds": round(adding, 4),
        "total_seconds": round(elapsed, 4),
        "updates_per_s": round(updates / elapsed, 1) if elapsed > 0 else 0.0,
        "conflicts": conflicts,
        "conflicts_per_transaction": round(conflicts / transactions, 4) if transactions else 0.0,
        "batches": batches,
        "transactions_per_batch": round(transactions / batches, 3) if batches else None,
        "exact": not wrong,
        "wrong_keys": len(wrong),
        "wrong_example": wrong[:3],
    }


def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only."""
    parser.add_argument(
        "--hot-threads",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help=f"committing threads (default: {' '.join(map(str, DEFAULT_THREADS))}; "
        f"--quick: {' '.join(map(str, QUICK_THREADS))})",
    )
    parser.add_argument(
        "--hot-approaches",
        nargs="+",
        choices=APPROACHES,
        default=list(APPROACHES),
        metavar="NAME",
        help=f"approaches to measure (default: all of {', '.join(APPROACHES)})",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every (approach, threads) ``args.repeat`` times, interleaved,
    and return the report."""
    thread_counts = args.hot_threads or list(QUICK_THREADS if args.quick else DEFAULT_THREADS)
    if any(n < 1 for n in thread_counts):
        raise ValueError("--hot-threads must be positive")
    approaches = [a for a in APPROACHES if a in args.hot_approaches]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = collections.defaultdict(list)
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        for repetition in range(args.repeat):
            for position, threads in enumerate(thread_counts):
                for approach in run_order(approaches, repetition + position):
                    store = scratch / f"{approach}-{threads}t-{repetition}"
                    seed = 1000 * repetition + 100 * threads
                    measured = MEASURE[approach](store, threads, args.seconds, seed)
                    runs[approach, threads].append(measured)
                    log(
                        f"{NAME}: {approach:>9} {threads} threads, run {repetition + 1}/"
                        f"{args.repeat}: {measured['updates_per_s']:,.0f} updates/s, "
                        f"{measured['conflicts']} conflicts, exact={measured['exact']}"
                    )
    results = [_summarise(threads, approaches, runs) for threads in thread_counts]
    return {
        "benchmark": NAME,
        "measures": "committed counter updates per second, end to end (until every value is final)",
        "settings": {
            "threads": thread_counts,
            "approaches": approaches,
            "keys": KEYS,
            "zipf_s": ZIPF_S,
            "per_transaction": PER_TRANSACTION,
            "shards": SHARDS,
            "combine_queue": {"buckets": BUCKETS, "worker_threads": WORKER_THREADS},
            "seconds": args.seconds,
            "repeat": args.repeat,
            "quick": args.quick,
            "percolite": {"sync": "full"},
            "sqlite": {
                "version": sqlite3.sqlite_version,
                "journal_mode": "WAL",
                "synchronous": "FULL",
                "transaction": "BEGIN IMMEDIATE; one UPSERT per key; COMMIT",
            },
        },
        "versions": {"percolite": percolite.__version__, "sqlite": sqlite3.sqlite_version},
        "machine": machine_info(),
        "results": results,
    }


def _summarise(
    threads: int, approaches: list[str], runs: dict[tuple[str, int], list[dict[str, Any]]]
) -> dict[str, Any]:
    summary: dict[str, Any] = {"threads": threads}
    for approach in approaches:
        measured = runs[approach, threads]
        summary[approach] = {
            "median_updates_per_s": median([r["updates_per_s"] for r in measured]),
            "median_conflicts_per_transaction": median(
                [r["conflicts_per_transaction"] for r in measured]
            ),
            "median_transactions_per_batch": median_or_none(
                [r.get("transactions_per_batch") for r in measured]
            ),
            "exact": all(r["exact"] for r in measured),
            "runs": measured,
        }

    def versus(approach: str, baseline: str) -> float | None:
        if approach not in summary or baseline not in summary:
            return None
        value = ratio(
            summary[approach]["median_updates_per_s"], summary[baseline]["median_updates_per_s"]
        )
        return None if value is None else round(value, 3)

    summary["native_vs_naive"] = versus("cq-native", "naive")
    summary["native_vs_sqlite"] = versus("cq-native", "sqlite")
    summary["sharded_vs_naive"] = versus("sharded", "naive")
    return summary


def _rate(result: dict[str, Any], approach: str) -> str:
    return f"{result[approach]['median_updates_per_s']:,.0f}" if approach in result else "-"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def tables(report: dict[str, Any]) -> list[Table]:
    settings = report["settings"]
    approaches = settings["approaches"]
    results = report["results"]
    throughput = Table(
        title=(
            f"Hot keys: committed updates/s end to end, {settings['per_transaction']} keys per "
            f"transaction from Zipf({settings['zipf_s']}) over {settings['keys']:,} keys, "
            f"durable commits, median of {settings['repeat']} x {settings['seconds']:g} s"
        ),
        headers=["threads"]
        + [LABELS[a] for a in approaches]
        + ["native/naive", "native/SQLite", "sharded/naive"],
        rows=[
            [r["threads"]]
            + [_rate(r, a) for a in approaches]
            + [_times(r["native_vs_naive"]), _times(r["native_vs_sqlite"])]
            + [_times(r["sharded_vs_naive"])]
            for r in results
        ],
        notes=[
            "Combine queue rates include draining the queue (until every value is final); "
            f"sharded = {SHARDS} shards per key; SQLite = WAL, synchronous=FULL."
        ],
    )
    conflicts = Table(
        title="Hot keys: conflicts per committed transaction (median) and exact final values",
        headers=["threads"] + [LABELS[a] for a in approaches] + ["all exact"],
        rows=[
            [r["threads"]]
            + [f"{r[a]['median_conflicts_per_transaction']:.3f}" for a in approaches]
            + ["yes" if all(r[a]["exact"] for a in approaches) else "NO"]
            for r in results
        ],
        notes=[
            "naive/sharded: commits aborted by a conflict and retried; combine queue: bucket "
            "processor conflicts (adders never conflict); SQLite: 'database is locked' after "
            "the busy timeout."
        ],
    )
    grouped = [a for a in approaches if a != "sqlite"]
    batching = Table(
        title="Hot keys: the threads' transactions per group commit (median; one sync each)",
        headers=["threads"] + [LABELS[a] for a in grouped],
        rows=[
            [r["threads"]]
            + [_per_batch(r[a].get("median_transactions_per_batch")) for a in grouped]
            for r in results
        ],
        notes=[
            "Every commit is durable before it returns, and with sync='full' a group commit "
            "is confirmed by the next one's sync, so each thread is in every other group "
            "commit: at most about T/2 of their transactions per sync. Naive transactions all "
            "write the hottest keys, so about one fits per sync and the rest conflict. Hence "
            "native/naive is at most about T/2 x (naive's time per group commit / native's): "
            "2x at 4 threads for group commits of equal cost, and 20x needs 40 or more threads "
            "unless a native group commit costs far less than a naive one. Combine queue "
            "columns count the adding transactions only (bucket runs commit in the same group "
            "commits)."
        ],
    )
    return [throughput, conflicts, batching]


def _per_batch(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plots(report: dict[str, Any]) -> list[Plot]:
    approaches = report["settings"]["approaches"]
    results = report["results"]
    return [
        Plot(
            name="throughput",
            title="Hot keys: committed updates/s (end to end)",
            x_label="threads",
            y_label="updates/s",
            x=[r["threads"] for r in results],
            series={LABELS[a]: [r[a]["median_updates_per_s"] for r in results] for a in approaches},
            log_y=True,
        )
    ]


def targets(report: dict[str, Any]) -> list[Target]:
    """None: the hot-key targets are bench_loader's (see the module docstring)."""
    return []


def format_report(report: dict[str, Any]) -> str:
    text = format_tables(tables(report)) + "\n\n" + format_targets(targets(report))
    wrong = [
        f"{LABELS[a]} at {r['threads']} threads"
        for r in report["results"]
        for a in report["settings"]["approaches"]
        if not r[a]["exact"]
    ]
    if wrong:
        text += f"\nerror: final values differ from the committed updates: {', '.join(wrong)}"
    return text


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
