"""Phrase count end to end: percolite against SQLite and a plain Counter pass.

What is measured: the time to turn a corpus into phrase counts, ``{phrase:
(doc_count, total_count)}`` over the unique documents (identical texts count
once), from reading the documents to the last count being durable, on two
corpora: the built-in one (the docstrings of the standard library, one
document per module, as ``percolite phrasecount`` reads it with no PATH) and
a synthetic corpus of DEFAULT_SYNTHETIC_DOCS documents
(``reference.synthetic_corpus``, Zipf-distributed phrases, its default
fraction of duplicates) written to files first. Three
systems, each in a fresh process, reading the documents itself:

* ``percolite``: the public job, ``percolite.phrasecount.cli.run(paths, db,
  export="sqlite:FILE", threads=T)``: one loader thread (``env.loader``),
  one transaction per document, T worker threads running the indexing
  observer, the combine queue (native sum) and the export queue into a
  SQLite table; the store is ``sync="full"``.
* ``sqlite``: the same job written directly against SQLite (WAL,
  ``synchronous=FULL``): S loader threads, each with its own connection; one
  ``BEGIN IMMEDIATE`` transaction per document that records its location,
  counts a reference to its unique document (by content hash) and, for a new
  unique document, UPSERTs ``(doc_count + 1, total_count + n)`` for each of
  its phrases. The phrases are found before the write lock is taken.
* ``counter``: the floor: read, hash, tokenize (``text.phrases``) and sum
  in a dict, single-threaded, then write the result into a SQLite table
  (WAL, ``synchronous=FULL``) in one bulk transaction: what any system must
  do at least, with nothing incremental about it.

Reported: seconds, documents/s, phrase updates/s (the (phrase, unique
document) pairs added), peak RSS of the process, whether the counts equal
``reference.reference_counts`` of the same documents, and the speed of
percolite relative to the others (ratio of median times; per repetition the
systems run back to back in rotating order). Each repetition also times
reading the corpus alone (``read``: the documents, nothing else, in a fresh
process), and the ratio to SQLite is given on processing time too: each
system's median less the read's median, the work that is not reading,
which both systems share. (Reading the built-in corpus imports every module
of the standard library: much of either system's time, as the ``read`` runs
show.)

Targets, on processing time (the end-to-end ratio is reported beside it):
percolite at least TARGET_RATIOS times as fast as SQLite, one ratio per
corpus, and on FLOOR_CORPUS within FLOOR_FACTOR of the floor (the floor's
processing time / percolite's at least 1 / FLOOR_FACTOR; the floor ratio of
the other corpus is reported too).
"""

from __future__ import annotations

import argparse
import hashlib
import queue
import resource
import sqlite3
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import percolite
from common import (
    OptionGroup,
    Plot,
    Table,
    Target,
    format_range,
    format_tables,
    format_targets,
    in_fresh_process,
    log,
    machine_info,
    median,
    median_or_none,
    open_sqlite,
    pair_ratios,
    peak_rss_mib,
    ratio,
    run_order,
    run_standalone,
    scratch_dir,
)
from percolite.phrasecount import cli, reference
from percolite.phrasecount.corpus import Document, content_id, file_documents, stdlib_documents
from percolite.phrasecount.text import phrases

NAME = "phrasecount"
SYSTEMS = ("percolite", "sqlite", "counter")
LABELS = {"percolite": "percolite", "sqlite": "SQLite", "counter": "Counter floor"}
READ = "read"  # reading the corpus alone, timed in each repetition too
# percolite gets the demo's worker threads; SQLite its own loader threads
# (more only wait longer for its one write lock; see bench/results/notes.md).
DEFAULT_THREADS = cli.DEFAULT_THREADS
DEFAULT_SQLITE_THREADS = 8
DEFAULT_SYNTHETIC_DOCS = 20_000
QUICK_SYNTHETIC_DOCS = 150
# The quick run takes the first modules of the standard library, written to files.
QUICK_BUILTIN_DOCS = 25
SYNTHETIC_SEED = 7
# percolite / SQLite on processing time (the read excluded from both)
TARGET_RATIOS = {"builtin": 3.0, "synthetic": 4.0}
# percolite's processing time at most FLOOR_FACTOR times the floor's, here
FLOOR_CORPUS = "synthetic"
FLOOR_FACTOR = 1.5


@dataclass(frozen=True)
class Corpus:
    """Where a run reads its documents: ``paths`` (files and directories),
    or, when empty, the built-in standard-library corpus."""

    name: str
    description: str
    paths: tuple[str, ...]


def read_documents(paths: Iterable[str]) -> Iterator[Document]:
    """The documents every system reads: the files at ``paths``, or the
    built-in corpus when there are none (what ``cli.run`` reads)."""
    paths = list(paths)
    if not paths:
        return stdlib_documents()
    return file_documents(paths, lambda problem: None)


def _digest(counts: Iterable[tuple[str, int, int]]) -> str:
    """A fingerprint of ``(phrase, doc_count, total_count)`` rows, whatever their order."""
    hasher = hashlib.sha256()
    for phrase, doc_count, total_count in sorted(counts):
        hasher.update(f"{phrase}\t{doc_count}\t{total_count}\n".encode("utf-8", "surrogatepass"))
    return hasher.hexdigest()


# -- the three systems; each runs in a fresh child process -------------------
def _run_percolite(paths: tuple[str, ...], work: Path, threads: int) -> dict[str, Any]:
    sink = work / "phrases.sqlite"
    began = time.perf_counter()
    summary = cli.run(
        list(paths), work / "store", export=f"sqlite:{sink}", threads=threads, progress=False
    )
    elapsed = time.perf_counter() - began
    with sqlite3.connect(sink) as connection:
        rows = connection.execute("SELECT phrase, doc_count, total_count FROM phrase_counts")
        digest = _digest(rows)
    return {"seconds": elapsed, "documents": summary.documents, "digest": digest}


SQLITE_PHRASE_TABLE = """
CREATE TABLE phrase_counts (
    phrase TEXT PRIMARY KEY, doc_count INTEGER NOT NULL, total_count INTEGER NOT NULL
)"""
SQLITE_SCHEMA = f"""
CREATE TABLE locations (location TEXT PRIMARY KEY, content_id TEXT NOT NULL);
CREATE TABLE documents (content_id TEXT PRIMARY KEY, refs INTEGER NOT NULL, content TEXT NOT NULL);
{SQLITE_PHRASE_TABLE};
"""
SQLITE_UPSERT = (
    "INSERT INTO phrase_counts VALUES (?, ?, ?) ON CONFLICT(phrase) DO UPDATE SET "
    "doc_count = doc_count + excluded.doc_count, total_count = total_count + excluded.total_count"
)


def _sqlite_load(connection: sqlite3.Connection, document: Document) -> None:
    """Point ``document.location`` at its content in one transaction (the
    same rules as ``phrasecount.app.load``): a unique document gaining its
    first reference adds its phrases, one losing its last subtracts them."""
    cid = content_id(document.content)
    counts = phrases(document.content)  # before the write lock: it is pure Python work
    connection.execute("BEGIN IMMEDIATE")
    try:
        row = connection.execute(
            "SELECT content_id FROM locations WHERE location = ?", (document.location,)
        ).fetchone()
        old = None if row is None else row[0]
        if old != cid:
            connection.execute(
                "INSERT OR REPLACE INTO locations VALUES (?, ?)", (document.location, cid)
            )
            if old is not None:
                _sqlite_drop_reference(connection, old)
            refs = connection.execute(
                "SELECT refs FROM documents WHERE content_id = ?", (cid,)
            ).fetchone()
            if refs is None:
                connection.execute(
                    "INSERT INTO documents VALUES (?, 1, ?)", (cid, document.content)
                )
                connection.executemany(
                    SQLITE_UPSERT, ((phrase, 1, n) for phrase, n in counts.items())
                )
            else:
                connection.execute(
                    "UPDATE documents SET refs = refs + 1 WHERE content_id = ?", (cid,)
                )
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def _sqlite_drop_reference(connection: sqlite3.Connection, cid: str) -> None:
    refs, content = connection.execute(
        "SELECT refs, content FROM documents WHERE content_id = ?", (cid,)
    ).fetchone()
    if refs > 1:
        connection.execute("UPDATE documents SET refs = refs - 1 WHERE content_id = ?", (cid,))
        return
    connection.execute("DELETE FROM documents WHERE content_id = ?", (cid,))
    counts = phrases(content)
    connection.executemany(SQLITE_UPSERT, ((phrase, -1, -n) for phrase, n in counts.items()))
    connection.execute("DELETE FROM phrase_counts WHERE doc_count = 0")


def _run_sqlite(paths: tuple[str, ...], work: Path, threads: int) -> dict[str, Any]:
    path = work / "phrasecount.sqlite"
    began = time.perf_counter()
    setup = open_sqlite(path)
    setup.executescript(SQLITE_SCHEMA)
    work_queue: queue.Queue = queue.Queue(maxsize=4 * threads)
    errors: list[BaseException] = []
    connections = [open_sqlite(path) for _ in range(threads)]

    def loader(connection: sqlite3.Connection) -> None:
        while (document := work_queue.get()) is not None:
            if errors:
                continue  # take the rest off the queue so that the feeder never blocks
            try:
                _sqlite_load(connection, document)
            except BaseException as error:  # re-raised once the feeder stops
                errors.append(error)

    loaders = [
        threading.Thread(target=loader, args=(connection,), daemon=True)
        for connection in connections
    ]
    for thread in loaders:
        thread.start()
    seen: set[str] = set()
    try:
        for document in read_documents(paths):
            if errors:
                break
            if document.location not in seen:  # like cli.run: a location once
                seen.add(document.location)
                work_queue.put(document)
    finally:
        for _ in loaders:
            work_queue.put(None)
        for thread in loaders:
            thread.join()
        for connection in connections:
            connection.close()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    try:
        digest = _digest(setup.execute("SELECT phrase, doc_count, total_count FROM phrase_counts"))
    finally:
        setup.close()
    return {"seconds": elapsed, "documents": len(seen), "digest": digest}


def _run_counter(paths: tuple[str, ...], work: Path, threads: int) -> dict[str, Any]:
    began = time.perf_counter()
    seen: set[str] = set()
    unique: set[str] = set()
    totals: dict[str, list[int]] = {}
    for document in read_documents(paths):
        if document.location in seen:
            continue
        seen.add(document.location)
        cid = content_id(document.content)
        if cid in unique:
            continue
        unique.add(cid)
        for phrase, n in phrases(document.content).items():
            counts = totals.get(phrase)
            if counts is None:
                totals[phrase] = [1, n]
            else:
                counts[0] += 1
                counts[1] += n
    connection = open_sqlite(work / "phrases.sqlite")
    try:
        connection.execute(SQLITE_PHRASE_TABLE)
        connection.execute("BEGIN IMMEDIATE")
        connection.executemany(
            "INSERT INTO phrase_counts VALUES (?, ?, ?)",
            ((phrase, d, t) for phrase, (d, t) in totals.items()),
        )
        connection.execute("COMMIT")
    finally:
        connection.close()
    elapsed = time.perf_counter() - began
    with sqlite3.connect(work / "phrases.sqlite") as connection:
        rows = connection.execute("SELECT phrase, doc_count, total_count FROM phrase_counts")
        digest = _digest(rows)
    return {"seconds": elapsed, "documents": len(seen), "digest": digest}


def _run_read(paths: tuple[str, ...], work: Path, threads: int) -> dict[str, Any]:
    """Only what every system does first: read the documents, a location once."""
    began = time.perf_counter()
    seen: set[str] = set()
    for document in read_documents(paths):
        seen.add(document.location)
    elapsed = time.perf_counter() - began
    return {"seconds": elapsed, "documents": len(seen), "digest": None}


RUN = {
    "percolite": _run_percolite,
    "sqlite": _run_sqlite,
    "counter": _run_counter,
    READ: _run_read,
}


def _child(system: str, paths: tuple[str, ...], work: str, threads: int) -> dict[str, Any]:
    """One measurement, in a process of its own (fresh heap, own peak RSS)."""
    Path(work).mkdir(parents=True)
    measured = RUN[system](paths, Path(work), threads)
    measured["peak_rss_mib"] = peak_rss_mib()
    if system == "percolite" and measured["peak_rss_mib"] is not None:
        # Its workers ran in a worker process (the demo's default), a child
        # this process waited for: their peaks add up. (ru_maxrss keeps the
        # peak of the process it was forked from, this one early in the run:
        # a little too much, never too little.)
        worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        measured["peak_rss_mib"] += worker
    return measured


def _measure_in_child(system: str, corpus: Corpus, work: Path, threads: int) -> dict[str, Any]:
    return in_fresh_process(_child, system, corpus.paths, str(work), threads)


# -- corpora -------------------------------------------------------------------
def _write_files(documents: Iterable[Document], directory: Path) -> None:
    """One UTF-8 file per document, in document order (file names sort so)."""
    directory.mkdir(parents=True)
    for number, document in enumerate(documents):
        data = document.content.encode("utf-8")
        (directory / f"doc{number:06d}.txt").write_bytes(data)


def _encodable(documents: Iterable[Document]) -> Iterator[Document]:
    """The documents that can be a UTF-8 file (docstrings may hold lone surrogates)."""
    for document in documents:
        try:
            document.content.encode("utf-8")
        except UnicodeEncodeError:
            continue
        yield document


def _corpora(args: argparse.Namespace, scratch: Path) -> list[Corpus]:
    corpora = []
    if "builtin" in args.pc_corpora:
        if args.quick:
            sample = scratch / "builtin-sample"
            _write_files(islice(_encodable(stdlib_documents()), QUICK_BUILTIN_DOCS), sample)
            corpora.append(
                Corpus(
                    "builtin",
                    f"the first {QUICK_BUILTIN_DOCS} standard-library modules' docstrings, "
                    "as files (--quick)",
                    (str(sample),),
                )
            )
        else:
            corpora.append(
                Corpus("builtin", "the standard library's docstrings (built-in corpus)", ())
            )
    if "synthetic" in args.pc_corpora:
        count = args.pc_synthetic_docs or (
            QUICK_SYNTHETIC_DOCS if args.quick else DEFAULT_SYNTHETIC_DOCS
        )
        directory = scratch / "synthetic"
        _write_files(reference.synthetic_corpus(count, SYNTHETIC_SEED), directory)
        corpora.append(
            Corpus(
                "synthetic",
                f"synthetic_corpus({count:,}, seed={SYNTHETIC_SEED}), one file per document",
                (str(directory),),
            )
        )
    return corpora


def _expected(corpus: Corpus) -> dict[str, Any]:
    """What every system must produce, from ``reference.reference_counts``."""
    documents = list(read_documents(corpus.paths))
    counts = reference.reference_counts(documents)
    return {
        "documents": len({document.location for document in documents}),
        "unique_documents": len({content_id(document.content) for document in documents}),
        "phrases": len(counts),
        "phrase_updates": sum(doc_count for doc_count, _total in counts.values()),
        "digest": _digest((phrase, d, t) for phrase, (d, t) in counts.items()),
    }


# -- the benchmark -------------------------------------------------------------
def add_arguments(parser: OptionGroup) -> None:
    """Options of this benchmark only."""
    parser.add_argument(
        "--pc-corpora",
        nargs="+",
        choices=tuple(TARGET_RATIOS),
        default=list(TARGET_RATIOS),
        metavar="NAME",
        help="corpora to count: builtin, synthetic (default: both)",
    )
    parser.add_argument(
        "--pc-synthetic-docs",
        type=int,
        default=None,
        metavar="N",
        help=f"documents of the synthetic corpus (default: {DEFAULT_SYNTHETIC_DOCS:,}; "
        f"--quick: {QUICK_SYNTHETIC_DOCS})",
    )
    parser.add_argument(
        "--pc-repeat",
        type=int,
        default=None,
        metavar="N",
        help="repetitions of this benchmark (default: --repeat); a full-size percolite run of "
        "the synthetic corpus takes minutes",
    )
    parser.add_argument(
        "--pc-threads",
        type=int,
        default=DEFAULT_THREADS,
        metavar="N",
        help="percolite's worker threads (default: %(default)s, the demo's)",
    )
    parser.add_argument(
        "--pc-sqlite-threads",
        type=int,
        default=DEFAULT_SQLITE_THREADS,
        metavar="N",
        help="SQLite's loader threads, one connection each (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Count every corpus with every system ``--pc-repeat`` times; return the report."""
    if args.pc_threads < 1:
        raise ValueError(f"--pc-threads must be positive, not {args.pc_threads}")
    if args.pc_sqlite_threads < 1:
        raise ValueError(f"--pc-sqlite-threads must be positive, not {args.pc_sqlite_threads}")
    if args.pc_synthetic_docs is not None and args.pc_synthetic_docs < 1:
        raise ValueError("--pc-synthetic-docs must be positive")
    repeat = args.repeat if args.pc_repeat is None else args.pc_repeat
    if repeat < 1:
        raise ValueError("--pc-repeat must be at least 1")
    results = []
    with scratch_dir(args.dir, f"{NAME}-") as scratch:
        for corpus in _corpora(args, scratch):
            expected = _expected(corpus)
            log(
                f"{NAME}: {corpus.name}: {expected['documents']:,} documents, "
                f"{expected['phrase_updates']:,} phrase updates"
            )
            runs: dict[str, list[dict[str, Any]]] = {system: [] for system in (*SYSTEMS, READ)}
            for repetition in range(repeat):
                for system in run_order((*SYSTEMS, READ), repetition):
                    work = scratch / f"{corpus.name}-{system}-{repetition}"
                    threads = args.pc_sqlite_threads if system == "sqlite" else args.pc_threads
                    measured = _measure_in_child(system, corpus, work, threads)
                    runs[system].append(_record(measured, expected))
                    exact = "" if system == READ else f", exact={runs[system][-1]['exact']}"
                    log(
                        f"{NAME}: {corpus.name} {system:>9} run {repetition + 1}/{repeat}: "
                        f"{measured['seconds']:.2f} s{exact}"
                    )
            results.append(_summarise(corpus, expected, runs))
    return {
        "benchmark": NAME,
        "measures": "phrase counts of a corpus, end to end (read to durable counts)",
        "settings": {
            "corpora": list(args.pc_corpora),
            "threads": args.pc_threads,
            "sqlite_threads": args.pc_sqlite_threads,
            "repeat": repeat,
            "quick": args.quick,
            "percolite": {
                "sync": "full",
                "export": "SQLite table",
                "processes": cli.DEFAULT_PROCESSES,
            },
            "sqlite": {
                "version": sqlite3.sqlite_version,
                "journal_mode": "WAL",
                "synchronous": "FULL",
                "transaction": "BEGIN IMMEDIATE per document; one UPSERT per distinct phrase",
            },
        },
        "versions": {"percolite": percolite.__version__, "sqlite": sqlite3.sqlite_version},
        "machine": machine_info(),
        "results": results,
    }


def _record(measured: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    seconds = measured["seconds"]
    return {
        "seconds": round(seconds, 3),
        "documents": measured["documents"],
        "docs_per_s": round(expected["documents"] / seconds, 1),
        "phrase_updates_per_s": round(expected["phrase_updates"] / seconds, 1),
        "peak_rss_mib": None
        if measured["peak_rss_mib"] is None
        else round(measured["peak_rss_mib"], 1),
        "exact": measured["digest"] == expected["digest"]
        and measured["documents"] == expected["documents"],
    }


def _summarise(
    corpus: Corpus, expected: dict[str, Any], runs: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "corpus": corpus.name,
        "description": corpus.description,
        **{key: value for key, value in expected.items() if key != "digest"},
    }
    for system in SYSTEMS:
        measured = runs[system]
        summary[system] = {
            "median_seconds": median([r["seconds"] for r in measured]),
            "median_docs_per_s": median([r["docs_per_s"] for r in measured]),
            "median_phrase_updates_per_s": median([r["phrase_updates_per_s"] for r in measured]),
            "median_peak_rss_mib": median_or_none(r["peak_rss_mib"] for r in measured),
            "exact": all(r["exact"] for r in measured),
            "runs": measured,
        }
    seconds = {system: summary[system]["median_seconds"] for system in SYSTEMS}
    read = median([r["seconds"] for r in runs[READ]])
    summary["read_median_seconds"] = read
    summary["read_runs"] = [r["seconds"] for r in runs[READ]]
    # Speed ratios: how many times faster percolite was (> 1: percolite faster).
    summary["percolite_vs_sqlite"] = _rounded(ratio(seconds["sqlite"], seconds["percolite"]))
    summary["percolite_vs_sqlite_processing"] = _rounded(
        _processing_ratio(seconds["sqlite"], seconds["percolite"], read)
    )
    summary["percolite_vs_counter"] = _rounded(ratio(seconds["counter"], seconds["percolite"]))
    summary["percolite_vs_counter_processing"] = _rounded(
        _processing_ratio(seconds["counter"], seconds["percolite"], read)
    )
    summary["percolite_vs_sqlite_per_repetition"] = pair_ratios(
        [run["seconds"] for run in runs["sqlite"]],
        [run["seconds"] for run in runs["percolite"]],
        3,
    )
    summary["target_ratio"] = TARGET_RATIOS[corpus.name]
    return summary


def _processing_ratio(theirs: float, ours: float, read: float) -> float | None:
    """theirs / ours with the read taken from both; None when either is all read."""
    if ours <= read or theirs <= read:
        return None
    return ratio(theirs - read, ours - read)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def tables(report: dict[str, Any]) -> list[Table]:
    settings = report["settings"]
    results = report["results"]
    systems = Table(
        title=(
            f"Phrase count end to end, percolite {settings['threads']} worker threads, "
            f"SQLite {settings.get('sqlite_threads', settings['threads'])} loader threads, "
            f"durable commits, median of {settings['repeat']}"
        ),
        headers=[
            "corpus",
            "system",
            "seconds",
            "documents/s",
            "phrase updates/s",
            "peak RSS MiB",
            "exact",
        ],
        rows=[
            [
                r["corpus"],
                LABELS[system],
                f"{r[system]['median_seconds']:.2f}",
                f"{r[system]['median_docs_per_s']:,.0f}",
                f"{r[system]['median_phrase_updates_per_s']:,.0f}",
                "-"
                if r[system]["median_peak_rss_mib"] is None
                else f"{r[system]['median_peak_rss_mib']:,.0f}",
                "yes" if r[system]["exact"] else "NO",
            ]
            for r in results
            for system in SYSTEMS
        ],
        notes=[
            f"{r['corpus']}: {r['description']}: {r['documents']:,} documents "
            f"({r['unique_documents']:,} unique), {r['phrases']:,} phrases, "
            f"{r['phrase_updates']:,} phrase updates; reading the corpus alone takes "
            f"{r['read_median_seconds']:.2f} s (median)."
            for r in results
        ],
    )
    ratios = Table(
        title="Phrase count: percolite's speed relative to the others (ratio of median times)",
        headers=[
            "corpus",
            "vs SQLite, processing",
            "target",
            "vs SQLite, end to end",
            "per repetition",
            "vs floor, processing",
            "vs floor, end to end",
            "floor vs SQLite, processing",
        ],
        rows=[
            [
                r["corpus"],
                _times(r["percolite_vs_sqlite_processing"]),
                f">= {r['target_ratio']:g}x",
                _times(r["percolite_vs_sqlite"]),
                format_range(r["percolite_vs_sqlite_per_repetition"]),
                _times(r.get("percolite_vs_counter_processing")),
                _times(r["percolite_vs_counter"]),
                _times(_floor_vs_sqlite(r)),
            ]
            for r in results
        ],
        notes=[
            "processing: each median less the median time to read the corpus alone; "
            "end to end: the medians as they are; per repetition: end to end; "
            "vs floor: the floor's time / percolite's (1.0 would be percolite at the floor); "
            "floor vs SQLite: SQLite's processing time / the floor's, what a single-threaded "
            "pass doing only the work every system must do gains over SQLite (percolite "
            "exceeds it only by tokenizing on both cores)"
        ],
    )
    return [systems, ratios]


def _floor_vs_sqlite(result: dict[str, Any]) -> float | None:
    """SQLite's processing time / the floor's, for one corpus's results."""
    return _rounded(
        _processing_ratio(
            result["sqlite"]["median_seconds"],
            result["counter"]["median_seconds"],
            result["read_median_seconds"],
        )
    )


def plots(report: dict[str, Any]) -> list[Plot]:
    results = report["results"]
    return [
        Plot(
            name="docs-per-s",
            title="Phrase count end to end: documents/s (median)",
            x_label="corpus",
            y_label="documents/s",
            x=[r["corpus"] for r in results],
            series={LABELS[s]: [r[s]["median_docs_per_s"] for r in results] for s in SYSTEMS},
            kind="bar",
            log_y=True,
        )
    ]


def _vs_sqlite_why(result: dict[str, Any] | None, needed: float) -> str:
    """Why percolite / SQLite falls short on a corpus: how far the floor
    itself (the work every system must do, in one thread) is ahead of SQLite."""
    floor = None if result is None else _floor_vs_sqlite(result)
    if floor is None:
        return ""
    why = (
        f"the floor (read, find the phrases, sum them in a dict, write the result in one "
        f"bulk SQLite transaction, in one thread) is itself {floor:.2f}x SQLite on processing "
        "time"
    )
    if floor < needed:
        mine = result.get("percolite_vs_counter_processing") if result else None
        why += (
            f", below the target: percolite would have to do that work {needed / floor:.2f}x "
            "faster than a pass doing nothing else; it gains on the floor only by tokenizing "
            "on both cores"
        )
        if mine is not None:
            why += f", and is at {mine:.2f}x of the floor's speed"
    return why + "."


def targets(report: dict[str, Any]) -> list[Target]:
    measured = {r["corpus"]: r["percolite_vs_sqlite_processing"] for r in report["results"]}
    floor = {r["corpus"]: r.get("percolite_vs_counter_processing") for r in report["results"]}
    by_corpus = {r["corpus"]: r for r in report["results"]}
    return [
        *(
            Target(
                f"phrase count: percolite / SQLite on processing time, {corpus} corpus",
                measured.get(corpus),
                needed,
                _vs_sqlite_why(by_corpus.get(corpus), needed),
            )
            for corpus, needed in TARGET_RATIOS.items()
        ),
        Target(
            f"phrase count: floor / percolite on processing time, {FLOOR_CORPUS} corpus "
            f"(percolite within {FLOOR_FACTOR:g}x of the floor)",
            floor.get(FLOOR_CORPUS),
            round(1 / FLOOR_FACTOR, 3),
        ),
    ]


def format_report(report: dict[str, Any]) -> str:
    text = format_tables(tables(report)) + "\n\n" + format_targets(targets(report))
    wrong = [
        f"{LABELS[system]} on {r['corpus']}"
        for r in report["results"]
        for system in SYSTEMS
        if not r[system]["exact"]
    ]
    if wrong:
        text += f"\nerror: counts differ from reference_counts: {', '.join(wrong)}"
    return text


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
