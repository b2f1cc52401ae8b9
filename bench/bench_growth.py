"""Growth: peak memory and file size as the data grows, and reclaimed queues.

Issue 7, workload 5, in two parts:

* **Sizes.** The phrasecount application (``percolite.phrasecount.cli.run``,
  SQLite sink, ``--pc-threads`` threads) indexes ``--sizes`` synthetic
  documents (``percolite.phrasecount.reference.synthetic_corpus(n, seed=0)``,
  written as files first; a smaller corpus is a prefix of a larger one). Each
  size runs in a child process of its own, on a fresh store, so its peak RSS
  is its own: ``ru_maxrss`` of that child (``os.wait4``). While it runs the
  child's ``/proc/<pid>/status`` is sampled for the peaks of ``RssAnon``
  (heap: Python objects, C++ buffers) and ``RssFile`` (file pages mapped in,
  mostly LMDB's map). Reported: peak RSS, ``data.mdb`` size, the sink's size,
  the time taken. Target: peak RSS at the largest size at most 1.25x that at
  the smallest (10k and 100k documents by default).
* **Drain.** One store, ``--rounds`` rounds; each round queues
  ``--drain-updates`` updates (+1 to ``--drain-keys`` keys, transactions of
  1000) to a combine queue with the native sum whose change observer adds one
  export-queue entry per changed key (the phrasecount pattern; the exporter
  discards them), then lets the workers drain both queues. Every round
  leaves the same data (the same keys, larger counts), so once consumed queue
  entries are reclaimed (LMDB reuses freed pages) ``data.mdb`` stops growing.
  Reported: the file size after each round; target: no growth from round 2
  to the last round.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import percolite
from common import (
    REPO_ROOT,
    OptionGroup,
    format_table,
    log,
    machine_info,
    run_standalone,
    same_filesystem,
    scratch_dir,
)

NAME = "growth"
RSS_TARGET = 1.25  # peak RSS at the largest size / at the smallest, at most
DOCS_PER_DIRECTORY = 100
SAMPLE_SECONDS = 0.2
DRAIN_TRANSACTION = 1000
MIB = 1 << 20

# Runs in the child: index the given directories, print the summary as JSON.
CHILD = """
import json, sys
from percolite.phrasecount.cli import run
settings = json.loads(sys.argv[1])
summary = run(settings["paths"], settings["db"], threads=settings["threads"], progress=False)
print(json.dumps({
    "documents": summary.documents,
    "unique_documents": summary.unique_documents,
    "phrases": summary.phrases,
    "phrase_updates": summary.phrase_updates,
    "seconds": summary.elapsed,
}))
"""


# -- sizes ------------------------------------------------------------------------
def write_corpus(directory: Path, documents: int) -> list[Path]:
    """The synthetic corpus as files, DOCS_PER_DIRECTORY per directory;
    returns the directories in order."""
    from percolite.phrasecount.reference import synthetic_corpus

    folders = []
    for index, document in enumerate(synthetic_corpus(documents, seed=0)):
        folder = directory / f"{index // DOCS_PER_DIRECTORY:05d}"
        if index % DOCS_PER_DIRECTORY == 0:
            folder.mkdir(parents=True)
            folders.append(folder)
        (folder / f"{index:06d}.txt").write_text(document.content, encoding="utf-8")
    return folders


def _status_kib(pid: int) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/<pid>/status`` ({} once the process is gone)."""
    fields = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                name, _, rest = line.partition(":")
                if rest.strip().endswith("kB"):
                    fields[name] = int(rest.split()[0])
    except (OSError, ValueError):
        return {}
    return fields


def measure_size(scratch: Path, folders: list[Path], documents: int, threads: int) -> dict:
    """One child process indexes the first ``documents`` documents on a fresh store."""
    directories = folders[: -(-documents // DOCS_PER_DIRECTORY)]
    db = scratch / f"phrasecount-{documents}"
    settings = {"paths": [str(d) for d in directories], "db": str(db), "threads": threads}
    peaks = {"RssAnon": 0, "RssFile": 0, "VmRSS": 0}
    with tempfile.TemporaryFile(mode="w+") as output:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(settings)], stdout=output, cwd=REPO_ROOT
        )
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            for name, kib in _status_kib(child.pid).items():
                if name in peaks:
                    peaks[name] = max(peaks[name], kib)
            time.sleep(SAMPLE_SECONDS)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        output.seek(0)
        text = output.read()
    if child.returncode != 0:
        raise RuntimeError(f"phrasecount of {documents} documents exited {child.returncode}")
    summary = json.loads(text.strip().splitlines()[-1])
    if summary["documents"] != documents:
        raise RuntimeError(f"indexed {summary['documents']} documents of {documents}")
    sink = Path(str(db) + ".phrases.sqlite")
    return {
        **summary,
        "seconds": round(summary["seconds"], 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "peak_rss_anon_mib": round(peaks["RssAnon"] / 1024, 1),
        "peak_rss_file_mib": round(peaks["RssFile"] / 1024, 1),
        "data_mdb_mib": round((db / "data.mdb").stat().st_size / MIB, 1),
        "sink_mib": round(sink.stat().st_size / MIB, 1) if sink.exists() else None,
    }


# -- drain ------------------------------------------------------------------------
def measure_drain(store: Path, rounds: int, updates: int, keys: int, workers: int) -> dict:
    exported = [0]

    def discard(entries: list) -> None:
        exported[0] += len(entries)

    app = percolite.App("growth_drain")
    counts = app.combine_queue("counts", buckets=16, key_codec="str", value_codec="int64")
    changes = app.export_queue("changes", discard, value_codec="int64")

    @counts.on_change
    def _export(tx: percolite.Transaction, batch: list) -> None:
        for change in batch:
            changes.add(tx, change.key, change.new)

    rng = random.Random(0)
    sizes = []
    env = percolite.open(store, app=app, sync="full")
    try:
        for round_index in range(rounds):
            for start in range(0, updates, DRAIN_TRANSACTION):
                count = min(DRAIN_TRANSACTION, updates - start)
                pairs = [(f"key{rng.randrange(keys):08d}", 1) for _ in range(count)]
                with env.transaction() as tx:
                    counts.add(tx, pairs)
            done = env.process(workers, timeout=600)
            with env.transaction() as tx:
                left = counts.depth(tx) + changes.depth(tx)
                total = sum(value for _, value in counts.scan(tx))
            if not done["idle"] or left:
                raise RuntimeError(f"round {round_index + 1} did not drain: {left} entries left")
            if total != updates * (round_index + 1):
                raise RuntimeError(f"the counts sum to {total} after round {round_index + 1}")
            file = store / "data.mdb"
            sizes.append(
                {
                    "round": round_index + 1,
                    "data_mdb_mib": round(file.stat().st_size / MIB, 2),
                    "allocated_mib": round(file.stat().st_blocks * 512 / MIB, 2),
                    "exported_entries": exported[0],
                }
            )
            log(f"{NAME}: drain round {round_index + 1}: data.mdb {sizes[-1]['data_mdb_mib']} MiB")
    finally:
        env.close()
    return {"rounds": sizes}


# -- the benchmark ------------------------------------------------------------------
def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only."""
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[10_000, 50_000, 100_000],
        metavar="DOCS",
        help="corpus sizes, in documents (default: %(default)s; --quick: 100 200)",
    )
    parser.add_argument(
        "--pc-threads",
        type=int,
        default=4,
        help="phrasecount loader and worker threads (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="drain rounds (default: %(default)s; --quick: 3)"
    )
    parser.add_argument(
        "--drain-updates",
        type=int,
        default=200_000,
        help="combine-queue updates per drain round (default: %(default)s; --quick: 5000)",
    )
    parser.add_argument(
        "--drain-keys",
        type=int,
        default=20_000,
        help="distinct keys of the drain rounds (default: %(default)s; --quick: 500)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [100, 200] if args.quick else sorted(set(args.sizes))
    rounds = 3 if args.quick else args.rounds
    updates = 5000 if args.quick else args.drain_updates
    keys = 500 if args.quick else args.drain_keys
    if min(sizes) < 1 or rounds < 2 or updates < 1 or keys < 1:
        raise ValueError("sizes, updates and keys must be positive, and rounds at least 2")
    settings = {
        "sizes": sizes,
        "pc_threads": args.pc_threads,
        "corpus": "synthetic_corpus(n, seed=0), one file each",
        "sink": "SQLite",
        "rounds": rounds,
        "drain_updates": updates,
        "drain_keys": keys,
        "drain_transaction": DRAIN_TRANSACTION,
        "sync": "full",
        "quick": args.quick,
        "store_parent": str(Path(args.dir).resolve()),
    }
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        settings["store_on_repo_filesystem"] = same_filesystem(scratch, REPO_ROOT)
        log(f"{NAME}: writing {max(sizes):,} documents")
        folders = write_corpus(scratch / "corpus", max(sizes))
        measured = []
        for documents in sizes:
            measured.append(measure_size(scratch, folders, documents, args.pc_threads))
            log(
                f"{NAME}: {documents:,} documents: peak RSS {measured[-1]['peak_rss_mib']} MiB, "
                f"data.mdb {measured[-1]['data_mdb_mib']} MiB, {measured[-1]['seconds']} s"
            )
        drain = measure_drain(scratch / "drain", rounds, updates, keys, args.pc_threads)
    return {
        "benchmark": NAME,
        "measures": "peak RSS and data.mdb size of phrasecount per corpus size; data.mdb "
        "size after each round of filling and draining the queues",
        "settings": settings,
        "versions": {
            "percolite": percolite.__version__,
            "percolite_module": str(Path(percolite.__file__).parent),
        },
        "machine": machine_info(),
        "sizes": measured,
        "drain": drain,
    }


def targets(report: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(target, measured ratio, target ratio), met when measured >= target:
    the "at most" goals are written as their inverse."""
    smallest, largest = report["sizes"][0], report["sizes"][-1]
    rounds = report["drain"]["rounds"]
    return [
        (
            f"peak RSS at {smallest['documents']:,} docs / at {largest['documents']:,} docs "
            f"(at most {RSS_TARGET:g}x growth)",
            round(smallest["peak_rss_mib"] / largest["peak_rss_mib"], 3),
            round(1 / RSS_TARGET, 3),
        ),
        (
            f"data.mdb after drain round 2 / after round {rounds[-1]['round']} (no growth)",
            round(rounds[1]["data_mdb_mib"] / rounds[-1]["data_mdb_mib"], 3),
            1.0,
        ),
    ]


def format_report(report: dict[str, Any]) -> str:
    size_rows = [
        [
            f"{r['documents']:,}",
            f"{r['phrases']:,}",
            r["peak_rss_mib"],
            r["peak_rss_anon_mib"],
            r["peak_rss_file_mib"],
            r["data_mdb_mib"],
            r["sink_mib"],
            r["seconds"],
        ]
        for r in report["sizes"]
    ]
    drain_rows = [
        [r["round"], r["data_mdb_mib"], r["allocated_mib"]] for r in report["drain"]["rounds"]
    ]
    settings = report["settings"]
    verdicts = [
        f"target: {name}: {measured:.3f}, needs >= {wanted:g}: "
        f"{'met' if measured >= wanted else 'NOT met'}"
        for name, measured, wanted in targets(report)
    ]
    return "\n".join(
        [
            f"Phrasecount per corpus size (synthetic documents, SQLite sink, "
            f"{settings['pc_threads']} threads); sizes in MiB",
            "",
            format_table(
                [
                    "documents",
                    "phrases",
                    "peak RSS",
                    "anon peak",
                    "file peak",
                    "data.mdb",
                    "sink",
                    "seconds",
                ],
                size_rows,
            ),
            "",
            f"data.mdb after each round of {settings['drain_updates']:,} combine-queue updates "
            f"over {settings['drain_keys']:,} keys, drained (with their export entries)",
            "",
            format_table(["round", "data.mdb MiB", "allocated MiB"], drain_rows),
            "",
            *verdicts,
        ]
    )


def plot(report: dict[str, Any], path: Path) -> None:
    """Peak RSS and data.mdb per size; data.mdb per drain round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    documents = [r["documents"] for r in report["sizes"]]
    for field, label in (
        ("peak_rss_mib", "peak RSS"),
        ("peak_rss_anon_mib", "anon RSS peak"),
        ("data_mdb_mib", "data.mdb"),
    ):
        left.plot(documents, [r[field] for r in report["sizes"]], marker="o", label=label)
    left.set_xlabel("documents")
    left.set_ylabel("MiB")
    left.set_title("Phrasecount growth")
    left.legend()
    rounds = report["drain"]["rounds"]
    right.plot([r["round"] for r in rounds], [r["data_mdb_mib"] for r in rounds], marker="o")
    right.set_xlabel("round")
    right.set_ylabel("data.mdb MiB")
    right.set_ylim(bottom=0)
    right.set_title("Fill and drain the queues")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
