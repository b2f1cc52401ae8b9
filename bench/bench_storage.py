"""Raw storage floor: percolite's combine queue and commits against py-lmdb.

Issue 7, workload 3: py-lmdb batched random puts and one durable commit per
transaction, measured in the same run as percolite, so that percolite's
overhead reads as a fraction of what LMDB itself can do.

* **py-lmdb batched random puts**, puts/s: ``--storage-updates`` puts of random
  KEY_BYTES-byte keys with the value VALUE, ``--storage-batch`` puts per write
  transaction (``txn.put`` in a loop), each transaction durable (``sync=True,
  metasync=True``). ``putmulti`` (the same puts through ``Cursor.putmulti``) is
  reported beside it, for information.
* **Combine-queue throughput**, updates/s end to end: the same number of
  updates ``(random KEY_BYTES-byte key, +1)`` to a combine queue with the
  native ``"sum"`` (``key_codec="bytes"``, ``value_codec="int64"``, default
  buckets), queued by ``--storage-adders`` threads in transactions of
  ``--storage-batch`` updates (``cq.add(tx, pairs)``, ``sync="full"``) while
  ``--storage-workers`` worker threads fold them. The time runs from the first
  add until every update is folded (``env.wait()`` idle); the folded values are
  then read back and must sum to the number of updates, one key per distinct
  key. The time at which the last add committed is reported too (add rate).
* **Durable single-cell commits**, at each of COMMIT_THREADS threads:
  ``bench_commit.py``'s measurement, called from here (same code, same
  settings).

Targets: combine-queue updates/s at least COMBINE_TARGET times py-lmdb
batched random puts; percolite's durable commits at least ``bench_commit``'s
TARGET_RATIO times py-lmdb's one commit per transaction at its TARGET_THREADS
threads (the target of ``bench_commit.py``, measured again here).
Run it alone (``python bench/bench_storage.py``, report in
``bench/results/storage.json``) or through ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import bench_commit
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
    pair_ratios,
    run_order,
    run_standalone,
    same_filesystem,
    scratch_dir,
    spread,
)

NAME = "storage"
KEY_BYTES = 8
VALUE = b"\x01" * 8
LMDB_MAP_SIZE = 1 << 30
COMBINE_TARGET = 0.2
COMMIT_THREADS = [1, 16]
DEFAULT_UPDATES, QUICK_UPDATES = 500_000, 20_000
DEFAULT_BATCH, QUICK_BATCH = 10_000, 2000
SYSTEMS = ("lmdb_put", "lmdb_putmulti", "combine_queue")
SYSTEM_LABELS = {
    "lmdb_put": "py-lmdb puts",
    "lmdb_putmulti": "py-lmdb putmulti",
    "combine_queue": "combine queue",
}


def _batches(updates: int, batch: int, seed: int) -> list[list[bytes]]:
    """Random 8-byte keys, ``batch`` per transaction (made outside the timing)."""
    rng = random.Random(seed)
    keys = [rng.randbytes(KEY_BYTES) for _ in range(updates)]
    return [keys[start : start + batch] for start in range(0, updates, batch)]


def _open_lmdb(store: Path) -> lmdb.Environment:
    return lmdb.open(str(store), sync=True, metasync=True, map_size=LMDB_MAP_SIZE, lock=True)


def measure_lmdb_put(store: Path, batches: list[list[bytes]], **_: Any) -> dict[str, Any]:
    env = _open_lmdb(store)
    try:
        began = time.perf_counter()
        for keys in batches:
            with env.begin(write=True) as txn:
                for key in keys:
                    txn.put(key, VALUE)
        seconds = time.perf_counter() - began
    finally:
        env.close()
    return _record(batches, seconds)


def measure_lmdb_putmulti(store: Path, batches: list[list[bytes]], **_: Any) -> dict[str, Any]:
    env = _open_lmdb(store)
    try:
        began = time.perf_counter()
        for keys in batches:
            with env.begin(write=True) as txn:
                txn.cursor().putmulti([(key, VALUE) for key in keys])
        seconds = time.perf_counter() - began
    finally:
        env.close()
    return _record(batches, seconds)


def measure_combine_queue(
    store: Path, batches: list[list[bytes]], *, adders: int, workers: int
) -> dict[str, Any]:
    app = percolite.App("storage_bench")
    queue = app.combine_queue("sums", combiner="sum", key_codec="bytes", value_codec="int64")
    updates = [[(key, 1) for key in keys] for keys in batches]
    env = percolite.open(store, app=app, sync="full")
    try:
        before = env.stats()
        env.start_workers(workers)
        errors: list[BaseException] = []

        def add(index: int) -> None:
            try:
                for pairs in updates[index::adders]:
                    with env.transaction() as tx:
                        queue.add(tx, pairs)
            except BaseException as error:  # re-raised below
                errors.append(error)

        threads = [threading.Thread(target=add, args=(i,), daemon=True) for i in range(adders)]
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        added = time.perf_counter() - began
        if errors:
            raise errors[0]
        if not env.wait(timeout=600):
            raise RuntimeError(f"the updates were not folded: {env.status(queues=False)}")
        seconds = time.perf_counter() - began
        stats = env.stats()
        env.stop_workers()
        with env.transaction() as tx:
            folded = dict(queue.scan(tx))
    finally:
        env.close()
    total = sum(len(keys) for keys in batches)
    distinct = len({key for keys in batches for key in keys})
    if len(folded) != distinct or sum(folded.values()) != total:
        raise RuntimeError(
            f"folded {len(folded)} keys summing to {sum(folded.values())}, "
            f"expected {distinct} keys summing to {total}"
        )
    return {
        **_record(batches, seconds),
        "add_seconds": round(added, 4),
        "adds_per_s": round(total / added, 1),
        "store_commits": stats["commits"] - before["commits"],
        "store_batches": stats["batches"] - before["batches"],
        "conflicts": stats["conflicts"] - before["conflicts"],
        "tombstones_collected": stats["tombstones_collected"] - before["tombstones_collected"],
    }


def _record(batches: list[list[bytes]], seconds: float) -> dict[str, Any]:
    total = sum(len(keys) for keys in batches)
    return {"per_s": round(total / seconds, 1), "operations": total, "seconds": round(seconds, 4)}


MEASURE = {
    "lmdb_put": measure_lmdb_put,
    "lmdb_putmulti": measure_lmdb_putmulti,
    "combine_queue": measure_combine_queue,
}


def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only (prefixed: ``run.py`` shares one parser)."""
    parser.add_argument(
        "--storage-updates",
        type=int,
        default=None,
        metavar="N",
        help=f"puts / combine-queue updates per run (default: {DEFAULT_UPDATES}; "
        f"--quick: {QUICK_UPDATES})",
    )
    parser.add_argument(
        "--storage-batch",
        type=int,
        default=None,
        metavar="N",
        help=f"puts or updates per write transaction (default: {DEFAULT_BATCH}; "
        f"--quick: {QUICK_BATCH})",
    )
    parser.add_argument(
        "--storage-adders",
        type=int,
        default=2,
        metavar="N",
        help="threads queueing combine-queue updates (default: %(default)s)",
    )
    parser.add_argument(
        "--storage-workers",
        type=int,
        default=4,
        metavar="N",
        help="worker threads folding the combine queue (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    updates = chosen(args.storage_updates, QUICK_UPDATES if args.quick else DEFAULT_UPDATES)
    batch = chosen(args.storage_batch, QUICK_BATCH if args.quick else DEFAULT_BATCH)
    adders, workers = args.storage_adders, args.storage_workers
    if updates < 1 or batch < 1 or adders < 1 or workers < 1:
        raise ValueError(
            "--storage-updates, --storage-batch, --storage-adders and --storage-workers "
            "must be positive"
        )
    runs: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        on_repo_filesystem = same_filesystem(scratch, REPO_ROOT)
        for repetition in range(args.repeat):
            batches = _batches(updates, batch, seed=repetition)
            for system in run_order(SYSTEMS, repetition, mirror=True):
                store = scratch / f"{system}-{repetition}"
                measured = MEASURE[system](store, batches, adders=adders, workers=workers)
                shutil.rmtree(store, ignore_errors=True)
                runs[system].append(measured)
                log(
                    f"{NAME}: {SYSTEM_LABELS[system]:>16}, run {repetition + 1}/{args.repeat}: "
                    f"{measured['per_s']:,.0f}/s"
                )
        commits = bench_commit.run(
            argparse.Namespace(
                threads=COMMIT_THREADS,
                seconds=args.seconds,
                repeat=args.repeat,
                quick=args.quick,
                dir=scratch,
                value_size=bench_commit.DEFAULT_VALUE_SIZE,
            )
        )

    results = {
        system: {
            "median_per_s": median([run["per_s"] for run in measured]),
            "spread": spread([run["per_s"] for run in measured]),
            "runs": measured,
        }
        for system, measured in runs.items()
    }
    baseline = results["lmdb_put"]["median_per_s"]
    ratio = results["combine_queue"]["median_per_s"] / baseline
    return {
        "benchmark": NAME,
        "measures": "combine-queue updates/s end to end (until folded) vs py-lmdb batched "
        "random puts/s; durable single-cell commits vs py-lmdb one commit per transaction",
        "settings": {
            "updates": updates,
            "batch": batch,
            "key_bytes": KEY_BYTES,
            "value_bytes": len(VALUE),
            "adders": adders,
            "workers": workers,
            "repeat": args.repeat,
            "quick": args.quick,
            "store_parent": str(Path(args.dir).resolve()),
            "store_on_repo_filesystem": on_repo_filesystem,
            "percolite": {"sync": "full", "combiner": "sum", "buckets": 64},
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
        "combine_ratio": round(ratio, 4),
        "combine_ratio_per_repetition": pair_ratios(
            [run["per_s"] for run in runs["combine_queue"]],
            [run["per_s"] for run in runs["lmdb_put"]],
            4,
        ),
        "durable_commits": commits,
    }


# -- output --------------------------------------------------------------------------
def tables(report: dict[str, Any]) -> list[Table]:
    """The tables of ``REPORT.md`` (see ``common.py``): the batched writes,
    then ``bench_commit``'s table of the durable commits measured here."""
    settings = report["settings"]
    results = report["results"]
    baseline = results["lmdb_put"]["median_per_s"]
    adds = median([run["adds_per_s"] for run in results["combine_queue"]["runs"]])
    writes = Table(
        title=(
            f"Raw storage floor: {settings['updates']:,} random {settings['key_bytes']}-byte "
            f"keys, {settings['batch']:,} per durable write transaction, median of "
            f"{settings['repeat']}"
        ),
        headers=["system", "per second", "vs py-lmdb puts", "spread"],
        rows=[
            [
                SYSTEM_LABELS[system],
                f"{results[system]['median_per_s']:,.0f}",
                f"{results[system]['median_per_s'] / baseline:.3f}x",
                "-" if results[system]["spread"] is None else f"{results[system]['spread']:.2f}",
            ]
            for system in SYSTEMS
        ],
        notes=[
            f"combine queue: native sum, {settings['adders']} adder threads, "
            f"{settings['workers']} worker threads; updates folded per second, end to end "
            f"(until every update is folded); queued at {adds:,.0f}/s. py-lmdb: sync=True, "
            "metasync=True; spread = fastest / slowest run."
        ],
    )
    commits = bench_commit.tables(report["durable_commits"])
    for table in commits:
        table.title = f"Storage floor: {table.title}"
    return [writes, *commits]


def plots(report: dict[str, Any]) -> list[Plot]:
    results = report["results"]
    commits = report["durable_commits"]["results"]
    return [
        Plot(
            name="writes",
            title="Batched random writes, durable (puts or updates per second)",
            x_label="",
            y_label="per second",
            x=[SYSTEM_LABELS[system] for system in SYSTEMS],
            series={"median": [results[system]["median_per_s"] for system in SYSTEMS]},
            kind="bar",
        ),
        Plot(
            name="commits",
            title="Durable single-cell commits per second",
            x_label="threads",
            y_label="transactions/s",
            x=[r["threads"] for r in commits],
            series={
                label: [r[system]["median_tx_per_s"] for r in commits]
                for system, label in (("percolite", "percolite"), ("lmdb", "py-lmdb"))
            },
            kind="bar",
        ),
    ]


def targets(report: dict[str, Any]) -> list[Target]:
    """Combine queue vs py-lmdb puts, and the durable commits' target."""
    commit_target = report["durable_commits"]["target"]
    return [
        Target(
            "storage: combine-queue updates/s / py-lmdb batched random puts/s",
            report["combine_ratio"],
            COMBINE_TARGET,
        ),
        Target(
            f"storage: durable commits at {commit_target['threads']} threads / py-lmdb "
            "one commit per transaction",
            commit_target["ratio"],
            commit_target["min_ratio"],
        ),
    ]


def format_report(report: dict[str, Any]) -> str:
    return format_tables(tables(report)) + "\n\n" + format_targets(targets(report))


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
