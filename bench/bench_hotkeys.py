"""Hot keys: many transactions updating the same counters.

T threads each commit transactions that add +1 to K = 20 keys drawn from a
Zipf(1.1) distribution over 10,000 keys, for a fixed time. Approaches, measured
side by side in one run, same store settings (sync):

- naive:        each transaction reads and writes the counters itself, run
                with env.run (percolite's documented retry on CommitConflict,
                with jittered exponential backoff); conflicts are counted.
- cq-native:    combine queue with the native "sum" (folded in C++, no GIL).
- cq-python:    combine queue with a Python combiner.

Reported: committed updates per second *end to end*: updates committed by the
adders divided by the time until every value is final (for the combine queue:
until the workers have folded every queued update, env.wait()). The final
values are checked against a reference Counter every run; a mismatch fails
the benchmark.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import random
import sys
import threading
import time
from typing import Any

import percolite
from common import (
    format_table,
    machine_info,
    median,
    run_standalone,
    run_threads,
    scratch_dir,
)

NAME = "hotkeys"
KEYS = 10_000
ZIPF_S = 1.1
PER_TRANSACTION = 20
TARGET_THREADS = 4
TARGET_RATIO = 20.0
APPROACHES = ("naive", "cq-native", "cq-python")
COUNTER = ("count", "n")


def zipf_sampler(seed: int):
    keys = [f"key{rank:05d}" for rank in range(1, KEYS + 1)]
    cum = list(itertools.accumulate(1.0 / rank**ZIPF_S for rank in range(1, KEYS + 1)))
    rnd = random.Random(seed)

    def sample() -> list[str]:
        return rnd.choices(keys, cum_weights=cum, k=PER_TRANSACTION)

    return sample


def python_sum(key: str, values: list) -> Any:
    total = sum(values)
    return total or None


def measure(
    approach: str, path: str, threads: int, seconds: float, sync: str, buckets: int
) -> dict:
    app = percolite.App()
    queue = None
    if approach != "naive":
        queue = app.combine_queue(
            "hot", buckets=buckets, combiner="sum" if approach == "cq-native" else python_sum
        )
    env = percolite.open(path, app=app, sync=sync)
    reference: collections.Counter = collections.Counter()
    lock = threading.Lock()
    conflicts = [0]
    try:
        if queue is not None:
            env.start_workers(4)

        def make_operation(index: int):
            sample = zipf_sampler(1000 + index)

            def naive(_: int) -> None:
                keys = collections.Counter(sample())

                def update(tx):
                    for key, n in keys.items():
                        old = int(tx.get(key, COUNTER, b"0"))
                        tx.set(key, COUNTER, str(old + n))

                env.run(update, retries=None)  # the documented way to retry conflicts
                with lock:
                    reference.update(keys)

            def combine(_: int) -> None:
                keys = collections.Counter(sample())
                with env.transaction() as tx:
                    queue.add(tx, keys)
                with lock:
                    reference.update(keys)

            return naive if queue is None else combine

        began = time.perf_counter()
        result = run_threads(make_operation, threads, seconds)
        adding = time.perf_counter() - began
        if queue is not None and not env.wait(timeout=600):
            raise RuntimeError("the combine queue did not drain")
        total = time.perf_counter() - began
        with env.transaction() as tx:
            if queue is None:
                final = {row.decode(): int(v) for row, _, v in tx.scan(columns=[COUNTER])}
            else:
                final = dict(queue.scan(tx))
        expected = {k: v for k, v in reference.items() if v}
        if final != expected:
            raise AssertionError(f"{approach}: final values differ from the reference")
        updates = result.ops * PER_TRANSACTION
        if queue is None:
            conflicts[0] = env.stats()["conflicts"]
        return {
            "approach": approach,
            "threads": threads,
            "transactions": result.ops,
            "updates": updates,
            "adding_seconds": round(adding, 3),
            "total_seconds": round(total, 3),
            "updates_per_s": updates / total,
            "adder_updates_per_s": updates / adding,
            "conflicts": conflicts[0],
            "conflict_rate": conflicts[0] / (conflicts[0] + result.ops) if result.ops else 0.0,
            "exact": True,
        }
    finally:
        env.close()


def add_arguments(parser) -> None:
    parser.add_argument(
        "--hot-threads",
        type=int,
        nargs="+",
        default=[TARGET_THREADS],
        help="adder threads (default: %(default)s)",
    )
    parser.add_argument(
        "--hot-buckets",
        type=int,
        default=16,
        help="combine queue buckets (default: %(default)s)",
    )
    parser.add_argument(
        "--sync",
        default="full",
        choices=percolite.SYNC_MODES,
        help="durability of every approach (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> dict:
    runs: dict[tuple[str, int], list[dict]] = collections.defaultdict(list)
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        n = 0
        for repetition in range(args.repeat):
            for threads in args.hot_threads:
                order = APPROACHES if repetition % 2 == 0 else tuple(reversed(APPROACHES))
                for approach in order:
                    n += 1
                    runs[(approach, threads)].append(
                        measure(
                            approach,
                            str(scratch / f"s{n}"),
                            threads,
                            args.seconds,
                            args.sync,
                            args.hot_buckets,
                        )
                    )
    results = []
    for threads in args.hot_threads:
        row: dict[str, Any] = {"threads": threads}
        for approach in APPROACHES:
            rs = runs[(approach, threads)]
            row[approach] = {
                "median_updates_per_s": median([r["updates_per_s"] for r in rs]),
                "median_adder_updates_per_s": median([r["adder_updates_per_s"] for r in rs]),
                "median_conflict_rate": median([r["conflict_rate"] for r in rs]),
                "runs": rs,
            }
        naive = row["naive"]["median_updates_per_s"]
        row["native_vs_naive"] = row["cq-native"]["median_updates_per_s"] / naive if naive else None
        row["python_vs_naive"] = row["cq-python"]["median_updates_per_s"] / naive if naive else None
        results.append(row)
    target_row = next((r for r in results if r["threads"] == TARGET_THREADS), None)
    return {
        "settings": {
            "keys": KEYS,
            "zipf_s": ZIPF_S,
            "per_transaction": PER_TRANSACTION,
            "seconds": args.seconds,
            "repeat": args.repeat,
            "sync": args.sync,
            "buckets": args.hot_buckets,
        },
        "machine": machine_info(),
        "results": results,
        "target": {
            "description": f"cq-native >= {TARGET_RATIO}x naive at {TARGET_THREADS} threads",
            "ratio": target_row["native_vs_naive"] if target_row else None,
            "met": bool(target_row and target_row["native_vs_naive"] >= TARGET_RATIO),
        },
    }


def format_report(report: dict) -> str:
    rows = []
    for r in report["results"]:
        rows.append(
            [
                r["threads"],
                f"{r['naive']['median_updates_per_s']:,.0f}",
                f"{r['naive']['median_conflict_rate']:.0%}",
                f"{r['cq-native']['median_updates_per_s']:,.0f}",
                f"{r['cq-python']['median_updates_per_s']:,.0f}",
                f"{r['native_vs_naive']:.1f}x",
                f"{r['python_vs_naive']:.1f}x",
            ]
        )
    s = report["settings"]
    target = report["target"]
    verdict = "met" if target["met"] else "NOT met"
    ratio = "-" if target["ratio"] is None else f"{target['ratio']:.1f}x"
    return (
        f"Hot keys: committed updates/s end to end, Zipf({s['zipf_s']}) over {s['keys']:,} keys, "
        f"{s['per_transaction']} per transaction, sync={s['sync']}, median of {s['repeat']}\n\n"
        + format_table(
            [
                "threads",
                "naive",
                "naive conflicts",
                "cq native",
                "cq python",
                "native/naive",
                "python/naive",
            ],
            rows,
        )
        + f"\n\ntarget: {target['description']}: {verdict} ({ratio})"
    )


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
