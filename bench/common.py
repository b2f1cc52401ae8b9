"""Helpers shared by the benchmarks in ``bench/``.

Every benchmark module (``bench_*.py``) exposes the same small interface so that
``bench/run.py`` can run them all:

* ``NAME``: short name; the report is written to ``<out>/<NAME>.json``;
* ``add_arguments(parser)``: options of its own (the common ones are added by
  :func:`add_common_arguments`);
* ``run(args) -> dict``: measure, and return a JSON-serialisable report;
* ``format_report(report) -> str``: the human-readable table of that report.

and, optionally, what ``run.py`` puts into ``REPORT.md`` (all three read
only the report, so the markdown and plots can be rebuilt from the JSON files
alone with ``run.py --report-only``):

* ``tables(report) -> list[Table]``: the tables of ``REPORT.md`` (without it,
  the module's ``format_report`` text goes there as a preformatted block);
* ``plots(report) -> list[Plot]``: charts, drawn to ``<NAME>-<plot name>.png``;
* ``targets(report) -> list[Target]``: the module's goals, each a measured
  ratio against the ratio it should reach, gathered into the targets table.

This module holds what they share: a multi-threaded timing loop
(:func:`run_threads`), scratch store directories on the repository's filesystem
(:func:`scratch_dir`), the order of interleaved runs (:func:`run_order`),
medians, percentiles and ratios of repeated runs, tables, JSON output and a
description of the machine the numbers come from.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

DEFAULT_THREADS = (1, 4, 16)
DEFAULT_SECONDS = 2.0
DEFAULT_REPEAT = 3
QUICK_SECONDS = 0.2
QUICK_REPEAT = 1
# Latency benchmarks pause between their commits for a time drawn uniformly
# from this range (seconds): spaced out, the latency measured is that of an
# idle system, not of a queue.
COMMIT_GAP_S = (0.005, 0.015)


class OptionGroup(Protocol):
    """Where a benchmark adds its options: a parser or an argument group."""

    def add_argument(self, *names: str, **settings: Any) -> Any: ...


# One operation of a worker thread; it gets its own iteration number, which
# makes unique keys cheap to build.
Operation = Callable[[int], None]


# -- command line ----------------------------------------------------------
def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options every benchmark understands. ``--out`` is left to the
    caller: a file for one benchmark, a directory for ``run.py``."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"tiny run ({QUICK_SECONDS} s per run, {QUICK_REPEAT} repetition) for smoke tests",
    )
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=list(DEFAULT_THREADS),
        metavar="N",
        help=f"thread counts to measure (default: {' '.join(map(str, DEFAULT_THREADS))})",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"duration of each timed run (default: {DEFAULT_SECONDS}, --quick: {QUICK_SECONDS})",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"repetitions of each configuration (default: {DEFAULT_REPEAT}, "
        f"--quick: {QUICK_REPEAT})",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=RESULTS_DIR,
        help="parent directory of the scratch stores, removed afterwards; keep it on the "
        "filesystem you want to measure (default: %(default)s)",
    )


_Value = TypeVar("_Value")


def chosen(value: _Value | None, default: _Value) -> _Value:
    """An option's value, or ``default`` when it was not given (options whose
    default depends on ``--quick`` default to ``None``)."""
    return default if value is None else value


def finish_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill in the defaults that depend on ``--quick`` and check ranges."""
    if args.seconds is None:
        args.seconds = QUICK_SECONDS if args.quick else DEFAULT_SECONDS
    if args.repeat is None:
        args.repeat = QUICK_REPEAT if args.quick else DEFAULT_REPEAT
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if any(n < 1 for n in args.threads):
        parser.error("--threads must be positive")


# -- timing ----------------------------------------------------------------
@dataclass
class RunResult:
    """What one timed run did: ``ops`` operations completed in ``seconds``."""

    ops: int
    seconds: float
    latencies: list[float] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


def run_threads(
    make_operation: Callable[[int], Operation],
    threads: int,
    seconds: float,
    *,
    record_latency: bool = False,
) -> RunResult:
    """Run ``threads`` threads that each repeat one operation for ``seconds``.

    ``make_operation(thread_index)`` is called up front, outside the timed
    window, and returns the thread's operation, which is then called with
    ``0, 1, 2, ...``. All threads start together; when the time is up each
    finishes the operation it is in. The run lasts from the common start until
    the last thread stops, so operations that straddle the deadline are counted
    along with the time they took. With ``record_latency`` the duration of every
    operation (seconds) is kept too. An exception in a worker stops the run and
    is raised here.
    """
    operations = [make_operation(index) for index in range(threads)]
    start_line = threading.Barrier(threads + 1)
    stop = threading.Event()
    counts = [0] * threads
    start_times = [0.0] * threads
    end_times = [0.0] * threads
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    clock = time.perf_counter

    def worker(index: int) -> None:
        operation = operations[index]
        own_latencies = latencies[index]
        done = 0
        start_times[index] = clock()
        try:
            start_line.wait()
            start_times[index] = clock()
            while not stop.is_set():
                if record_latency:
                    began = clock()
                    operation(done)
                    own_latencies.append(clock() - began)
                else:
                    operation(done)
                done += 1
        except BaseException as error:  # re-raised by the main thread
            errors.append(error)
            stop.set()
        finally:
            counts[index] = done
            end_times[index] = clock()

    workers = [
        threading.Thread(target=worker, args=(index,), name=f"bench-worker-{index}", daemon=True)
        for index in range(threads)
    ]
    for thread in workers:
        thread.start()
    released = False
    try:
        start_line.wait()
        released = True
        stop.wait(seconds)
    finally:
        # Also on Ctrl-C: release the workers and wait for them, so that no
        # store is closed or removed under a running operation.
        if not released:
            start_line.abort()
        stop.set()
        for thread in workers:
            thread.join()
    if errors:
        raise errors[0]
    return RunResult(
        ops=sum(counts),
        seconds=max(end_times) - min(start_times),
        latencies=[value for own in latencies for value in own],
    )


# -- repetitions and statistics --------------------------------------------
_Item = TypeVar("_Item")


def run_order(items: Sequence[_Item], turn: int, *, mirror: bool = False) -> list[_Item]:
    """The order in which to measure ``items`` (systems, approaches, builds)
    side by side in repetition ``turn`` (0, 1, 2, ...).

    They take turns going first, so that drift on a busy machine (a cache
    warming up, another process starting) does not always favour the same
    one: ``items`` rotated left by ``turn``, so that each goes first once
    every ``len(items)`` turns; or, with ``mirror``, alternately as given and
    reversed. For two items both are the same alternation."""
    if mirror:
        return list(items) if turn % 2 == 0 else list(reversed(items))
    shift = turn % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


def median(values: Iterable[float]) -> float:
    """The median; benchmarks report it because it ignores a stray slow run."""
    return float(statistics.median(values))


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not ``None`` (a figure some runs
    could not measure), or ``None`` when no run measured it."""
    present = [value for value in values if value is not None]
    return median(present) if present else None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (``q`` in [0, 1]): a value that
    was measured, not one interpolated between two."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 1:
        raise ValueError(f"percentile: q must be in [0, 1], not {q!r}")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def spread(rates: Sequence[float]) -> float | None:
    """How far the repetitions of one configuration disagree: the fastest
    over the slowest (three decimals; 1.0: all alike), ``None`` when the
    slowest is 0."""
    return round(max(rates) / min(rates), 3) if min(rates) > 0 else None


def pair_ratios(
    numerators: Sequence[float], denominators: Sequence[float], digits: int
) -> list[float | None]:
    """The ratio of each pair of runs made back to back (the n-th numerator
    over the n-th denominator), rounded to ``digits``; ``None`` where the
    denominator is 0. Drift hits both runs of a pair alike, so these show
    the noise of the ratio of the medians."""
    return [
        None if (value := ratio(ours, theirs)) is None else round(value, digits)
        for ours, theirs in zip(numerators, denominators, strict=True)
    ]


def format_range(ratios: Sequence[float | None]) -> str:
    """The lowest and highest of ``ratios`` (those of single repetitions) as
    ``LO-HIx``, ``-`` when none was measured."""
    known = [value for value in ratios if value is not None]
    return f"{min(known):.2f}-{max(known):.2f}x" if known else "-"


_Result = TypeVar("_Result")


def in_fresh_process(fn: Callable[..., _Result], *args: Any) -> _Result:
    """``fn(*args)`` in a process of its own, spawned (not forked: it starts
    clean, with none of this process's heap, threads or stores); ``fn`` and
    ``args`` must pickle."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


# -- scratch stores --------------------------------------------------------
@contextlib.contextmanager
def scratch_dir(parent: Path, prefix: str) -> Iterator[Path]:
    """A fresh directory under ``parent`` (created if needed), removed with
    everything in it on exit. The name ends in ``.tmp`` so that git ignores
    it under ``bench/results/``."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def same_filesystem(a: Path, b: Path) -> bool:
    """Whether two existing paths are on one filesystem (fsync costs differ
    between filesystems, so stores being compared must share one)."""
    return os.stat(a).st_dev == os.stat(b).st_dev


# -- the SQLite baselines ----------------------------------------------------
SQLITE_BUSY_TIMEOUT_S = 60.0


def open_sqlite(path: Path) -> sqlite3.Connection:
    """A connection with the durability percolite's ``sync="full"`` gives:
    write-ahead log, ``synchronous=FULL`` (every commit flushed to disk
    before it returns), a long busy timeout so that writers queue instead of
    failing, and no implicit transactions (callers say ``BEGIN IMMEDIATE``).
    It may be handed to another thread, as long as one thread uses it at a
    time."""
    connection = sqlite3.connect(
        path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    return connection


def peak_rss_mib() -> float | None:
    """Peak resident memory of this process so far, MiB (``None`` where it
    cannot be read); it never goes down, so measure the biggest job last or in
    a child process. On Linux it is ``VmHWM`` of ``/proc/self/status``, the
    high-water mark since this program was exec'd: ``ru_maxrss`` survives
    exec, so in a child (``subprocess``, ``multiprocessing`` with spawn) it
    would include the RSS of the parent it was forked from."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- what a benchmark contributes to REPORT.md -----------------------------
@dataclass
class Table:
    """One table of a report: ``rows`` hold display values (formatted
    strings or numbers), one per header; ``notes`` are sentences printed
    under it (method, settings, warnings)."""

    title: str
    headers: list[str]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)


@dataclass
class Plot:
    """A chart: one value per ``x`` for each of ``series`` (``None``: not
    measured). ``kind`` is ``"line"`` (numeric x, e.g. threads) or
    ``"bar"`` (grouped bars, categorical x). ``name`` becomes part of the PNG
    file name, so keep it short and file-safe."""

    name: str
    title: str
    x_label: str
    y_label: str
    x: list[Any]
    series: dict[str, list[float | None]]
    kind: str = "line"
    log_y: bool = False


@dataclass
class Target:
    """A goal: ``measured`` (a ratio of two systems measured side by side,
    ``None`` if the run did not measure it) should be at least ``target``.
    ``why``: what bounds the figure, with the measurements that show it,
    printed under a verdict of NOT met (a target missed without a reason
    says so)."""

    name: str
    measured: float | None
    target: float
    why: str = ""

    @property
    def met(self) -> bool | None:
        return None if self.measured is None else self.measured >= self.target


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or ``None`` when either is missing or the
    denominator is zero."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def format_tables(tables: Sequence[Table]) -> str:
    """Tables as plain text, each under its title, for ``format_report``."""
    parts = []
    for table in tables:
        text = f"{table.title}\n\n{format_table(table.headers, table.rows)}"
        if table.notes:
            text += "\n" + "\n".join(table.notes)
        parts.append(text)
    return "\n\n".join(parts)


def format_ratio(value: float) -> str:
    """A ratio with two decimals, three below 1 (0.946 is not 0.95)."""
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"


def format_targets(targets: Sequence[Target]) -> str:
    """One line per target: ``target: NAME: met (1.23x, needs >= 1x)``."""
    lines = []
    for target in targets:
        if target.met is None:
            verdict = "not measured"
        else:
            verdict = f"{'met' if target.met else 'NOT met'} ({format_ratio(target.measured)}x"
            verdict += f", needs >= {target.target:g}x)"
        lines.append(f"target: {target.name}: {verdict}")
        if target.met is False and target.why:
            lines.append(f"  why: {target.why}")
    return "\n".join(lines)


# -- reporting -------------------------------------------------------------
def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: the first column left-aligned, the others right."""
    cells = [[str(h) for h in headers]] + [[str(value) for value in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        parts = [
            value.ljust(width) if i == 0 else value.rjust(width)
            for i, (value, width) in enumerate(zip(row, widths, strict=False))
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(cells[0]), rule] + [line(row) for row in cells[1:]])


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON, creating the folder; a reader never
    sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(partial, path)


def log(message: str) -> None:
    """Progress on stderr, so stdout keeps only the report."""
    print(message, file=sys.stderr, flush=True)


def _git_revision() -> str | None:
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return described.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    """Where and when the numbers were taken, for the JSON reports."""
    return {
        "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git": _git_revision(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        # Other work on the machine skews the numbers; this says how busy it was.
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "command": _command_line(),
    }


def _command_line() -> str:
    """The command that is measuring, as typed from the repository's root, so
    a reader of the report can run it again."""
    script = Path(sys.argv[0])
    with contextlib.suppress(ValueError):
        script = script.resolve().relative_to(Path(__file__).resolve().parent.parent)
    return " ".join(shlex.quote(part) for part in [".venv/bin/python", str(script), *sys.argv[1:]])


def run_standalone(benchmark: Any, argv: list[str] | None = None) -> int:
    """``main`` of a benchmark module run on its own: its options plus the
    common ones and ``--out FILE``; prints the report and writes the JSON."""
    parser = argparse.ArgumentParser(description=(benchmark.__doc__ or "").split("\n\n")[0])
    add_common_arguments(parser)
    benchmark.add_arguments(parser)
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR / f"{benchmark.NAME}.json",
        help="JSON report to write (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    finish_arguments(parser, args)
    report = benchmark.run(args)
    print(benchmark.format_report(report))
    write_json(args.out, report)
    log(f"wrote {args.out}")
    return 0
