"""``percolite phrasecount [PATH ...] --db DIR [--export TARGET]``.

Loads documents (files and directories, or, with no PATH, the docstrings of
the Python standard library) from one thread through a loader
(:meth:`percolite.Env.loader`), lets the workers (in a worker process of
their own by default) fold phrase counts through the combine queue and
export them, then prints a summary with the top phrases read back from the
sink. Running it again only processes what changed.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import percolite
from percolite._cli import at_least, store_argument
from percolite._env import TARGET_VARIABLE, shared_target, shown_target
from percolite._progress import Progress

from .corpus import (
    CONTENT_ID_BYTES,
    Document,
    Problem,
    ProblemKind,
    content_id,
    file_documents,
    stdlib_documents,
)

__all__ = ["run", "main", "Summary", "default_export", "add_arguments"]

APP_SPEC = "percolite.phrasecount.app:app"
STDLIB_PREFIX = "stdlib:"


class Summary(NamedTuple):
    """What a run of the job did, and the top phrases of the sink after it."""

    documents: int  # locations read in this run
    loaded: int  # locations whose content was new or changed
    removed: int  # locations gone since the last run
    unique_documents: int  # unique documents in the store after the run
    phrases: int  # phrases in the sink
    phrase_updates: int  # (phrase, document) pairs added or subtracted in this run
    elapsed: float
    problems: list[str]
    missing: list[str]  # PATH arguments that do not exist
    top: list[tuple[str, int, int]]  # [(phrase, doc_count, total_count)]
    peak_rss_mib: float


# Worker threads (in each worker process). The workers hand their commits to
# the writer and go on, so runs do not wait for their group commit, and
# threads beyond a few only take the interpreter from the export (fewer were
# no faster either). Measured by bench/bench_phrasecount.py --pc-threads; the
# figures that chose it are in bench/results/notes.md.
DEFAULT_THREADS = 8

# Worker processes beside the one that reads and loads the documents (0: the
# workers run in that process). Reading is Python work that holds the
# interpreter's lock, and so is the observers' and the exporter's: in one
# process they take turns on one core. In a worker process of their own they
# use another: the documents load sooner and a small corpus takes less time,
# a large one the same (bench/results/notes.md).
DEFAULT_PROCESSES = 1

# The documents are loaded from one thread through a loader. It has at most
# LOADER_IN_FLIGHT transactions in flight, and at most LOADER_IN_FLIGHT_CHARS
# characters of document text (a larger document waits until it is alone):
# memory stays bounded whatever the files' sizes. More in flight loads no
# faster, far fewer loads slower, and either way one loader thread beats
# threads calling env.run (bench/results/notes.md). The whole job still ends
# when the workers have indexed, folded and exported the last document:
# loading faster leaves them a larger backlog, not less work.
LOADER_IN_FLIGHT = 256
LOADER_IN_FLIGHT_CHARS = 32 * 1024 * 1024


def default_export(db: str | os.PathLike[str]) -> str:
    """The sink beside the store: ``sqlite:<db>.phrases.sqlite`` for a store
    directory; for a postgresql:// store, the table ``phrase_counts`` in the
    store's own schema of the same database."""
    backend, target = shared_target(db)
    if backend == "postgresql":
        conninfo, schema, _shown = percolite._core.parse_postgresql_target(target)
        separator = "&" if "?" in conninfo else "?"
        return f"{conninfo}{separator}options=-csearch_path%3D{schema}"
    path = Path(target).absolute()
    return "sqlite:" + str(path.with_name(path.name + ".phrases.sqlite"))


def _scope(paths: Sequence[str]) -> list[tuple[str, bool]]:
    """(location or prefix, is_prefix) pairs covering what this run reads."""
    if not paths:
        return [(STDLIB_PREFIX, True)]
    out = []
    for p in paths:
        absolute = os.path.abspath(p)
        if os.path.isdir(absolute):
            out.append((absolute.rstrip(os.sep) + os.sep, True))
        else:
            out.append((absolute, False))
    return out


def _start_worker_processes(db: str, processes: int, threads: int) -> subprocess.Popen:
    # The store goes in the environment: a URI's password stays off command lines.
    command = [sys.executable, "-m", "percolite", "worker", APP_SPEC]
    command += ["--processes", str(processes), "--threads", str(threads)]
    env = dict(os.environ, **{TARGET_VARIABLE: db})
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)


def _stop_worker_processes(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # forwarded to each worker process
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run(
    paths: Sequence[str],
    db: str | os.PathLike[str],
    *,
    export: str | None = None,
    threads: int = DEFAULT_THREADS,
    processes: int = DEFAULT_PROCESSES,
    progress: Any = "auto",
    stream: TextIO | None = None,
) -> Summary:
    """Index ``paths`` (or the standard library's docstrings) into ``db`` and
    export the counts; see the module docstring. ``threads`` worker threads
    run the observers in each of ``processes`` worker processes (with 0, in
    this process); the documents are loaded from the calling thread. Raises
    ValueError for bad arguments before touching anything."""
    from . import app as pc  # imported on use: `percolite --help` stays light

    stream = stream or sys.stderr
    began = time.perf_counter()
    db = os.fspath(db)
    try:
        backend, shared = shared_target(db)  # worker processes share it; the sink is named after it
    except ValueError as e:
        raise ValueError(f"--db {shown_target(db)}: {e}") from None
    if backend == "lmdb" and os.path.exists(shared) and not os.path.isdir(shared):
        raise ValueError(f"--db {db}: is a file, not a store directory")
    for name, value, least in (("threads", threads, 1), ("processes", processes, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"--{name} must be an int >= {least}, not {value!r}")
    target = export or default_export(shared)
    sink = pc.set_export(target)

    if paths:
        documents, problems, missing = _files(paths)
    else:
        documents, problems, missing = stdlib_documents(), [], []

    # The store first: a server that cannot be reached is named as the store's.
    try:
        env = percolite.open(db, app=pc.app)
    except percolite.AppMismatch as e:
        # Made by another version of this app: its counts sit in another
        # layout (the phrase queue's buckets, say), which binding this one
        # would not move, so its totals would go wrong.
        raise ValueError(
            f"--db {shown_target(db)}: made by another version of phrasecount "
            f"({'; '.join(e.differences)}); its counts cannot be carried over: "
            "index into a new --db, or delete this store and its sink"
        ) from None
    worker_proc = None
    try:
        check = getattr(sink, "check", None)
        if check is not None:
            check()  # an unreachable sink fails now, not in the workers
        if export is None:
            _own_default_sink(env, sink, target, stream)
        if processes > 0:
            worker_proc = _start_worker_processes(db, processes, threads)
        else:
            env.start_workers(threads)
        loading = Progress("documents read", enabled=progress, stream=stream, unit="doc")
        try:
            # Only a scope that holds documents already can lose some; for a
            # first load, what was read need not be remembered.
            scope = _scope(paths)
            remember = _any_loaded(env, scope)
            read, seen, loaded, new_unique = _load(env, documents, loading, remember=remember)
        finally:
            loading.close()
        removed = 0 if seen is None else _remove_missing(env, scope, seen)
        working = Progress(
            "notifications done", enabled=progress, stream=stream, unit="notification"
        )
        try:
            looked = 0.0
            while not env.wait(timeout=0.2):
                if worker_proc is not None and worker_proc.poll() is not None:
                    raise percolite.Error(
                        f"the worker processes exited early (status {worker_proc.returncode})"
                    )
                # Counting the pending notifications takes a scan of them: twice a second.
                if working.enabled and time.monotonic() - looked >= 0.5:
                    working.remaining(env.status(queues=False)["pending"])
                    looked = time.monotonic()
            working.remaining(0)
        finally:
            working.close()
        _raise_failures(env)
        with env.transaction() as tx:
            unique = sum(1 for _ in tx.scan(prefix="doc:", columns=[pc.REFS]))
            phrase_updates = sum(
                int(tx.get("doc:" + new_unique[i : i + CONTENT_ID_BYTES].hex(), pc.NPHRASES, b"0"))
                for i in range(0, len(new_unique), CONTENT_ID_BYTES)
            )
    finally:
        if worker_proc is not None:
            _stop_worker_processes(worker_proc)
        env.close()
    top, n_phrases = pc.read_top(target, 10)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss = max(rss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return Summary(
        documents=read,
        loaded=loaded,
        removed=removed,
        unique_documents=unique,
        phrases=n_phrases,
        phrase_updates=phrase_updates,
        elapsed=time.perf_counter() - began,
        problems=problems,
        missing=missing,
        top=top,
        peak_rss_mib=rss / 1024,
    )


def _own_default_sink(env: percolite.Env, sink: Any, target: str, stream: TextIO) -> None:
    """The sink beside the store belongs to the store (a sink belongs to
    one store). A new, empty store takes over a sink that is not its own
    (the store was deleted and made anew, the sink left behind, or a sink
    made before sinks knew their store), and says so when that cleared
    rows; a store that holds documents refuses another store's sink, naming
    the command to run."""
    from . import app as pc

    owner, identity = sink.owner(), env.identity
    if identity is None or (owner is not None and owner["store"] == identity["store"]):
        return
    with env.transaction() as tx:
        empty = not pc.has_locations(tx)
    if not empty:
        if owner is None:
            return  # adopted at the first export, with a warning (exporters.md)
        raise percolite.SinkOwnedByOtherStore(
            f"{target[len('sqlite:') :] if target.startswith('sqlite:') else 'the sink'} "
            f"belongs to store {owner['store']}, not to this one ({identity['store']}): "
            "to make it this store's (its counts are cleared), run `percolite take-over "
            f"percolite.phrasecount.app:app export --db {shown_target(env.path)}`",
            sink=repr(sink),
            owner=owner["store"],
            store=identity["store"],
        )
    done = env.take_over_sink("export")
    if done["rows_cleared"]:
        print(
            f"percolite phrasecount: the store is new and its sink held another store's "
            f"counts ({done['rows_cleared']:,} rows): taken over, counted afresh",
            file=stream,
        )


def _files(paths: Sequence[str]) -> tuple[Iterable[Document], list, list]:
    """Documents, the problems list (filled while they are read) and the
    missing PATHs (known at once)."""
    problems: list[Problem] = []
    documents = file_documents(paths, problems.append)
    missing = [p.location for p in problems if p.kind is ProblemKind.MISSING_PATH]
    return documents, problems, missing


def _any_loaded(env: percolite.Env, scope: list[tuple[str, bool]]) -> bool:
    """Whether the store holds a location in ``scope``."""
    from . import app as pc

    with env.transaction() as tx:
        return any(
            pc.has_locations(tx, where) if is_prefix else pc.is_loaded(tx, where)
            for where, is_prefix in scope
        )


def _load(
    env: percolite.Env, documents: Iterable[Document], progress: Progress, *, remember: bool
) -> tuple[int, set[str] | None, int, bytearray]:
    """Loads documents through one loader (:meth:`percolite.Env.loader`), one
    transaction per location, with at most ``LOADER_IN_FLIGHT`` of them and
    ``LOADER_IN_FLIGHT_CHARS`` characters of text in flight (the documents
    come once per location). Returns how many were read; the set of their
    locations if ``remember``, else None; how many were loaded (new or
    changed); and the content ids that became unique documents, as their
    digests one after another (``CONTENT_ID_BYTES`` each: 3 MB for 100,000
    documents, where a set of the ids took 19). An id becomes unique at most
    once in a run: loading only adds references."""
    from . import app as pc

    seen: set[str] | None = set() if remember else None
    counts = {"read": 0, "loaded": 0}
    new_unique = bytearray()
    failed = threading.Event()
    # Guards the counts and the text in flight: a callback runs on the
    # loader's thread, or on this one when its future is already done.
    room = threading.Condition()
    chars_in_flight = [0]

    def finished(cid: str, chars: int, future: Future) -> None:
        outcome = None if future.exception() is not None else future.result()
        with room:
            chars_in_flight[0] -= chars
            room.notify()
            if outcome is None:
                failed.set()  # leaving the loader's with block raises the first failure
            elif outcome != pc.UNCHANGED:
                counts["loaded"] += 1
                if outcome == pc.FIRST_REFERENCE:
                    new_unique.extend(bytes.fromhex(cid))

    with env.loader(max_in_flight=LOADER_IN_FLIGHT) as loader:
        for doc in documents:
            if failed.is_set():
                break
            counts["read"] += 1
            if seen is not None:
                seen.add(doc.location)
            cid = content_id(doc.content)
            chars = len(doc.content)
            with room:  # a big document waits until the text in flight leaves room for it
                while chars_in_flight[0] and chars_in_flight[0] + chars > LOADER_IN_FLIGHT_CHARS:
                    room.wait()
                chars_in_flight[0] += chars
            future = loader.submit(pc.load, doc.location, doc.content, cid)
            future.add_done_callback(functools.partial(finished, cid, chars))
            progress.advance(1, loaded=counts["loaded"])
    return counts["read"], seen, counts["loaded"], new_unique


def _remove_missing(env: percolite.Env, scope: list[tuple[str, bool]], seen: set[str]) -> int:
    """Unloads the locations in ``scope`` that this run did not read, through
    a loader as well; returns how many there were."""
    from . import app as pc

    gone = []
    for location_or_prefix, is_prefix in scope:
        with env.transaction() as tx:
            if is_prefix:
                known = pc.locations(tx, location_or_prefix)
            else:
                known = [location_or_prefix] if pc.is_loaded(tx, location_or_prefix) else []
        gone += [location for location in known if location not in seen]
    gone = list(dict.fromkeys(gone))  # scopes may overlap (a file under a PATH directory)
    if not gone:
        return 0
    with env.loader(max_in_flight=LOADER_IN_FLIGHT) as loader:
        futures = [loader.submit(pc.unload, location) for location in gone]
    return sum(future.result() for future in futures)


def _raise_failures(env: percolite.Env) -> None:
    for observer in env.status(queues=False)["observers"]:
        if observer["failures"] and observer["pending"]:
            raise percolite.Error(
                f"{observer['name']} keeps failing: {observer['last_error'] or ''}".rstrip()
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="files or directories to read (default: the docstrings of the running Python's "
        "standard library)",
    )
    store_argument(parser, creates=True)
    parser.add_argument(
        "--export",
        metavar="TARGET",
        help="where the counts go: sqlite:FILE or a postgresql:// URI (default: beside the "
        "store: sqlite:DB.phrases.sqlite, or the table phrase_counts in a postgresql store's "
        "schema)",
    )
    parser.add_argument(
        "--threads",
        type=at_least(1),
        default=DEFAULT_THREADS,
        metavar="T",
        help=f"worker threads, per worker process (default: {DEFAULT_THREADS}); documents "
        f"are loaded from one thread, up to {LOADER_IN_FLIGHT} transactions in flight",
    )
    parser.add_argument(
        "--processes",
        type=at_least(0),
        default=DEFAULT_PROCESSES,
        metavar="N",
        help="worker processes beside the one that loads; 0 runs the workers in the loading "
        f"process (default: {DEFAULT_PROCESSES})",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress display (default: progress bars on terminals, with tqdm installed)",
    )


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    summary = run(
        args.paths,
        args.db,
        export=args.export,
        threads=args.threads,
        processes=args.processes,
        progress=False if args.quiet else "auto",
    )
    print_summary(summary, out)
    return 1 if summary.missing else 0


def print_summary(s: Summary, out: TextIO, errors: TextIO | None = None) -> None:
    """The summary on ``out``; skipped files and missing PATHs on ``errors``
    (standard error by default)."""
    errors = errors or sys.stderr
    for problem in s.problems:
        if problem.kind is ProblemKind.MISSING_PATH:
            print(f"percolite phrasecount: error: {problem}", file=errors)
        else:
            print(f"percolite phrasecount: skipped {problem}", file=errors)
    rate = s.documents / s.elapsed if s.elapsed else 0.0
    updates = s.phrase_updates / s.elapsed if s.elapsed else 0.0
    print(
        f"documents: {s.documents:,} read, {s.loaded:,} new or changed, {s.removed:,} removed; "
        f"unique documents: {s.unique_documents:,}; phrases: {s.phrases:,}",
        file=out,
    )
    print(
        f"elapsed: {s.elapsed:.1f} s ({rate:,.0f} documents/s, "
        f"{updates:,.0f} phrase updates/s); peak RSS {s.peak_rss_mib:,.0f} MiB",
        file=out,
    )
    if s.top:
        print("top phrases (documents, occurrences):", file=out)
        for phrase, doc_count, total_count in s.top:
            print(f"  {doc_count:6,} {total_count:7,}  {phrase}", file=out)
