"""``percolite webindex load PATH... --db DB [--export TARGET] [--base-url URL]``
and the queries ``percolite webindex top|inlinks|domains``.

``load`` reads the pages of the PATHs (directories of HTML files, link
records, WARC files) from one thread through a loader
(:meth:`percolite.Env.loader`), lets the workers (in a worker process of
their own by default) diff the links, fold the counts and export them, then
prints a summary with the top pages read back from the query database.
Running it again on a directory loads only the files that changed, and
removes the pages whose file is gone; link records and WARC files add or
replace pages and remove none.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple, TextIO
from urllib.parse import urlsplit

import percolite
from percolite._cli import at_least, store_argument
from percolite._env import TARGET_VARIABLE, shared_target, shown_target
from percolite._progress import Progress

from .inputs import Page, Problem, ProblemKind, pages_of

__all__ = ["run", "load_into", "main", "Summary", "default_export", "add_arguments"]

APP_SPEC = "percolite.webindex.app:app"
DEFAULT_THREADS = 4
DEFAULT_PROCESSES = 1
# Pages go in batches, one transaction each: a transaction's fixed cost
# (begin, commit, its future) was most of the loader's time per page.
PAGES_PER_TRANSACTION = 32
LOADER_IN_FLIGHT = 16


class Summary(NamedTuple):
    pages: int  # pages read in this run
    loaded: int  # pages new or changed
    removed: int  # pages whose file is gone
    uris: int  # known URIs in the query database
    domains: int
    inlinks: int
    elapsed: float
    problems: collections.Counter[ProblemKind]
    missing: list[str]
    examples: list[Problem]  # the first problems of each kind
    top: list[tuple[Any, ...]]
    peak_rss_mib: float


def default_export(db: str | os.PathLike[str]) -> str:
    """The query database beside the store: ``sqlite:<db>.webindex.sqlite``."""
    backend, target = shared_target(db)
    if backend != "lmdb":
        raise ValueError(
            f"{shown_target(db)} is not a directory: name the query database, --export sqlite:FILE"
        )
    path = Path(target).absolute()
    return "sqlite:" + str(path.with_name(path.name + ".webindex.sqlite"))


class _Problems:
    def __init__(self) -> None:
        self.counts: collections.Counter[ProblemKind] = collections.Counter()
        self.examples: list[Problem] = []
        self.missing: list[str] = []

    def __call__(self, problem: Problem) -> None:
        self.counts[problem.kind] += 1
        if problem.kind is ProblemKind.MISSING_PATH:
            self.missing.append(problem.location)
        if self.counts[problem.kind] <= 3:
            self.examples.append(problem)


def _prefix(path: str) -> str | None:
    """A directory's absolute path with a trailing separator; None for a file."""
    return os.path.abspath(path).rstrip(os.sep) + os.sep if os.path.isdir(path) else None


def _sources(
    paths: Sequence[str],
    base_url: str | None,
    problems: _Problems,
    known: dict[str, tuple[str, str]] | None = None,
):
    """The pages of each PATH; bad arguments raise now.
    ``known``: the files loaded before (not parsed again when unchanged)."""
    if not paths:
        raise ValueError("no PATH: name directories of HTML files, link records or WARC files")
    if base_url is not None and urlsplit(base_url).scheme not in ("http", "https"):
        raise ValueError(
            f"--base-url must be an http(s) URL such as https://example.org/docs/, not {base_url!r}"
        )
    return [pages_of(path, base_url, problems, known) for path in paths]


def load_into(
    env: percolite.Env,
    paths: Sequence[str],
    base_url: str | None = None,
    *,
    progress: Any = False,
    stream: TextIO | None = None,
    on_problem: Any = None,
) -> tuple[int, int, int]:
    """Loads the pages of ``paths`` into ``env`` (bound to the webindex app)
    and removes the pages of files gone from its directories; returns
    ``(pages read, new or changed, removed)``. The workers do the rest."""
    from . import app as wi

    problems = on_problem or _Problems()
    _sources(paths, base_url, _Problems())  # bad arguments raise before the store is read
    known: dict[str, tuple[str, str]] = {}
    with env.transaction() as tx:
        for prefix in dict.fromkeys(filter(None, map(_prefix, paths))):
            known.update(wi.loaded_digests(tx, prefix))
    sources = _sources(paths, base_url, problems, known)
    loading = Progress("pages read", enabled=progress, stream=stream or sys.stderr, unit="page")
    try:
        read, loaded, seen_files = _load(env, itertools.chain.from_iterable(sources), loading)
    finally:
        loading.close()
    removed = _remove_missing(env, known, seen_files)
    return read, loaded, removed


def _load(env: percolite.Env, pages: Iterator[Page], progress: Progress):
    from . import app as wi

    counts = {"read": 0, "loaded": 0}
    lock = threading.Lock()
    failed = threading.Event()
    seen_files: set[str] = set()
    # A URI read twice in one run: the later page wins, so its batch waits
    # for the earlier one's transaction (the loader commits in any order).
    in_flight: dict[str, Future] = {}
    batch: dict[str, Page] = {}

    def finished(future: Future) -> None:
        if future.exception() is not None:
            failed.set()
            return
        with lock:
            counts["loaded"] += future.result()

    def submit() -> None:
        future = loader.submit(wi.load_batch, list(batch.values()))
        for url in batch:
            in_flight[url] = future
        future.add_done_callback(finished)
        batch.clear()

    with env.loader(max_in_flight=LOADER_IN_FLIGHT) as loader:
        for page in pages:
            if failed.is_set():
                break
            counts["read"] += 1
            if page.unchanged:  # loaded before with these bytes: nothing to do
                seen_files.add(page.file)
                progress.advance(1, loaded=counts["loaded"])
                continue
            if page.url in batch:
                submit()
            earlier = in_flight.get(page.url)
            if earlier is not None and not earlier.done():
                try:
                    earlier.result()
                except Exception:
                    break  # leaving the loader's with block raises it
            if page.file is not None:
                seen_files.add(page.file)
            batch[page.url] = page
            if len(batch) >= PAGES_PER_TRANSACTION:
                submit()
            progress.advance(1, loaded=counts["loaded"])
        if batch and not failed.is_set():
            submit()
    return counts["read"], counts["loaded"], seen_files


def _remove_missing(env: percolite.Env, loaded: Iterable[str], seen: set[str]) -> int:
    """Removes the files ``loaded`` before this run (under its directories)
    that it did not see; returns how many."""
    from . import app as wi

    gone = [f for f in loaded if f not in seen]
    if not gone:
        return 0
    with env.loader(max_in_flight=LOADER_IN_FLIGHT) as loader:
        futures = [
            loader.submit(wi.unload_files, gone[i : i + PAGES_PER_TRANSACTION])
            for i in range(0, len(gone), PAGES_PER_TRANSACTION)
        ]
    return sum(f.result() for f in futures)


def _raise_failures(env: percolite.Env) -> None:
    for observer in env.status(queues=False)["observers"]:
        if observer["failures"] and observer["pending"]:
            raise percolite.Error(
                f"{observer['name']} keeps failing: {observer['last_error'] or ''}".rstrip()
            )


def run(
    paths: Sequence[str],
    db: str | os.PathLike[str],
    *,
    export: str | None = None,
    base_url: str | None = None,
    threads: int = DEFAULT_THREADS,
    processes: int = DEFAULT_PROCESSES,
    progress: Any = "auto",
    stream: TextIO | None = None,
) -> Summary:
    """Loads ``paths`` into the store ``db``, waits until the query
    database is current, and returns a :class:`Summary`."""
    from . import app as wi

    stream = stream or sys.stderr
    began = time.perf_counter()
    db = os.fspath(db)
    try:
        backend, shared = shared_target(db)
    except ValueError as e:
        raise ValueError(f"--db {shown_target(db)}: {e}") from None
    if backend == "lmdb" and os.path.exists(shared) and not os.path.isdir(shared):
        raise ValueError(f"--db {db}: is a file, not a store directory")
    # Bad arguments raise before anything is made; the store is opened
    # before the query database is: a server that cannot be reached is
    # named as the store's.
    _sources(paths, base_url, _Problems())
    target = export or (default_export(shared) if backend == "lmdb" else None)
    if target is not None:
        wi.open_sink(target).check()
    problems = _Problems()
    env = percolite.open(db, app=wi.app)
    worker_proc = None
    try:
        if target is None:
            raise ValueError(
                f"--db {shown_target(db)}: name the query database: --export sqlite:FILE "
                "or postgresql://..."
            )
        wi.set_export(target)
        if processes > 0:
            worker_proc = _start_worker_processes(db, processes, threads)
        else:
            env.start_workers(threads)
        read, loaded, removed = load_into(
            env, paths, base_url, progress=progress, stream=stream, on_problem=problems
        )
        working = Progress(
            "notifications done", enabled=progress, stream=stream, unit="notification"
        )
        try:
            while not env.wait(timeout=0.2):
                if worker_proc is not None and worker_proc.poll() is not None:
                    raise percolite.Error(
                        f"the worker processes exited early (status {worker_proc.returncode})"
                    )
            working.remaining(0)
        finally:
            working.close()
        _raise_failures(env)
    finally:
        if worker_proc is not None:
            _stop_worker_processes(worker_proc)
        env.close()
        wi.close_export()
    tables = wi.read_counts(target)
    rss = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    return Summary(
        pages=read,
        loaded=loaded,
        removed=removed,
        uris=tables["webindex_pages"],
        domains=tables["webindex_domains"],
        inlinks=tables["webindex_inlinks"],
        elapsed=time.perf_counter() - began,
        problems=problems.counts,
        missing=problems.missing,
        examples=problems.examples,
        top=wi.read_top(target, 10),
        peak_rss_mib=rss / 1024,
    )


def _start_worker_processes(db: str, processes: int, threads: int) -> subprocess.Popen:
    # The store goes in the environment: a URI's password stays off command lines.
    command = [sys.executable, "-m", "percolite", "worker", APP_SPEC]
    command += ["--processes", str(processes), "--threads", str(threads)]
    return subprocess.Popen(
        command, stdout=subprocess.DEVNULL, env=dict(os.environ, **{TARGET_VARIABLE: db})
    )


def _stop_worker_processes(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # forwarded to each worker process
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="webindex_command", required=True, metavar="COMMAND")
    load = commands.add_parser(
        "load",
        help="load pages and keep the query database current",
        description="Loads the pages of the PATHs (directories of HTML files, link records, "
        "WARC files) into the store (made when missing), lets worker processes count the links "
        "and export them, and prints a summary. Running it again on a directory loads only "
        "what changed.",
    )
    load.add_argument("paths", nargs="+", metavar="PATH", help="directories, .jsonl, .warc(.gz)")
    store_argument(load, creates=True)
    _export_argument(load)
    load.add_argument(
        "--base-url",
        metavar="URL",
        help="the URL of each directory PATH: a file's URL is URL/ followed by its relative "
        "path (needed for directories; http:// for a tree of host directories)",
    )
    load.add_argument("--threads", type=at_least(1), default=DEFAULT_THREADS, metavar="T")
    load.add_argument("--processes", type=at_least(0), default=DEFAULT_PROCESSES, metavar="N")
    load.add_argument("--quiet", action="store_true", help="no progress display")
    load.set_defaults(func=main)

    top = commands.add_parser("top", help="the pages with the most inbound links")
    _query_arguments(top)
    top.add_argument("--domain", metavar="D", help="only the pages of domain D")
    top.add_argument("-n", type=at_least(1), default=10, help="how many (default: 10)")
    top.set_defaults(func=_top)

    inlinks = commands.add_parser("inlinks", help="the pages linking to a URI")
    inlinks.add_argument("uri", metavar="URI")
    _query_arguments(inlinks)
    inlinks.set_defaults(func=_inlinks)

    domains = commands.add_parser("domains", help="the domains with the most inbound links")
    _query_arguments(domains)
    domains.add_argument("-n", type=at_least(1), default=10, help="how many (default: 10)")
    domains.set_defaults(func=_domains)


def _export_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--export",
        metavar="TARGET",
        help="the query database: sqlite:FILE or a postgresql:// URI (default: "
        "sqlite:DB.webindex.sqlite beside a store directory)",
    )


def _query_arguments(parser: argparse.ArgumentParser) -> None:
    _export_argument(parser)
    parser.add_argument("--db", metavar="DB", help="the store whose default query database to read")


def _query_target(args: argparse.Namespace) -> str:
    if args.export:
        return args.export
    if args.db:
        return default_export(args.db)
    raise ValueError(
        "name the query database: --export sqlite:FILE or postgresql://..., or --db DB"
    )


def _top(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from . import app as wi

    out = out or sys.stdout
    rows = wi.read_top(_query_target(args), args.n, args.domain)
    print(f"{'incount':>8} {'outcount':>8}  uri", file=out)
    for uri, incount, outcount, has_content in rows:
        print(f"{incount:8,} {outcount:8,}  {uri}{'' if has_content else '  (no page)'}", file=out)
    return 0


def _inlinks(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from . import app as wi
    from .links import normalize

    out = out or sys.stdout
    uri = normalize(args.uri) or args.uri
    rows = wi.read_inlinks(_query_target(args), uri)
    print(f"{len(rows):,} {'page links' if len(rows) == 1 else 'pages link'} to {uri}", file=out)
    for from_uri, anchor in rows:
        print(f"  {from_uri}  {anchor!r}", file=out)
    return 0


def _domains(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from . import app as wi

    out = out or sys.stdout
    print(f"{'pages':>8} {'incount':>8}  domain", file=out)
    for domain, pages, incount in wi.read_domains(_query_target(args), args.n):
        print(f"{pages:8,} {incount:8,}  {domain}", file=out)
    return 0


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    summary = run(
        args.paths,
        args.db,
        export=args.export,
        base_url=args.base_url,
        threads=args.threads,
        processes=args.processes,
        progress=False if args.quiet else "auto",
    )
    print_summary(summary, out)
    return 1 if summary.missing else 0


def print_summary(s: Summary, out: TextIO, errors: TextIO | None = None) -> None:
    errors = errors or sys.stderr
    for problem in s.examples:
        if problem.kind is ProblemKind.MISSING_PATH:
            print(f"percolite webindex: error: {problem}", file=errors)
        elif problem.kind is not ProblemKind.NOT_HTML:
            print(f"percolite webindex: {problem.kind.value}: {problem}", file=errors)
    rate = s.pages / s.elapsed if s.elapsed else 0.0
    print(
        f"pages: {s.pages:,} read, {s.loaded:,} new or changed, {s.removed:,} removed; "
        f"known URIs: {s.uris:,}; domains: {s.domains:,}; links: {s.inlinks:,}",
        file=out,
    )
    if s.problems:
        counted = ", ".join(
            f"{n:,} {kind.value}"
            for kind, n in sorted(s.problems.items(), key=lambda item: item[0].value)
        )
        print(f"skipped or repaired: {counted}", file=out)
    print(
        f"elapsed: {s.elapsed:.1f} s ({rate:,.0f} pages/s); peak RSS {s.peak_rss_mib:,.0f} MiB",
        file=out,
    )
    if s.top:
        print("top pages (inbound links):", file=out)
        for uri, incount, _outcount, _has in s.top:
            print(f"  {incount:7,}  {uri}", file=out)
