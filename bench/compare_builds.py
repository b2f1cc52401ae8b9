"""Compare the installed percolite build with a baseline revision, side by side.

Both builds are measured in one run, interleaved: the same benchmark command
runs once on the current build (A: the ``percolite`` installed in the Python
running this script, normally ``.venv``) and once on the baseline (B: the same
command with ``PYTHONPATH`` pointing at a build of the baseline revision), A B
then B A and so on, ``--repeat`` pairs (DEFAULT_REPEAT), so that drift on a
busy machine hits both alike. Every command is a fresh process of one of the
benchmark modules in ``bench/`` (their own code, one repetition each), and the
percolite each one imported is checked against the build it was meant to
measure.

Figures (percolite's only; the modules' py-lmdb and SQLite runs are ignored):

* ``bench_commit.py``: durable single-cell commits/s at each of
  COMMIT_THREADS threads (``sync="full"``);
* ``bench_storage.py``: combine-queue updates/s, end to end (its own commit
  runs are cut to STORAGE_COMMIT_SECONDS: the commit figures come from
  ``bench_commit.py``);
* ``bench_reads.py``: random look-ups/s and scanned cells/s in one
  transaction (the read path every checksum and fault guard sits on);
* ``bench_hotkeys.py``: combine queue with the native sum, HOTKEYS_THREADS
  threads, updates/s;
* ``bench_phrasecount.py``: the phrase count of the built-in corpus, seconds
  (lower is better, so its ratio is baseline seconds / current seconds).

Each figure gets the medians of A and B, the ratio of the medians as current
speed / baseline speed, the ratios of the single pairs (min / median / max) and
whether the ratio reaches ``--threshold`` (DEFAULT_THRESHOLD). Beside them, the
current build's commits/s on the in-memory backend (``bench_commit.py --backend
memory``, current build only: older builds have no memory backend).

The baseline is named by ``--baseline REV`` (built once with pip into
``bench/results/tmp/compare-builds/``, reused afterwards), by
``--baseline-site DIR`` (an existing ``pip install --target`` directory), or
``--self`` (the current build against itself: checks the method and shows the
noise). A table goes to stdout, progress to stderr, everything measured to
``--out`` (default ``bench/results/compare.json``). See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    BENCH_DIR,
    REPO_ROOT,
    RESULTS_DIR,
    format_table,
    log,
    machine_info,
    median,
    pair_ratios,
    run_order,
    scratch_dir,
    write_json,
)

DEFAULT_OUT = RESULTS_DIR / "compare.json"
DEFAULT_CACHE = RESULTS_DIR / "tmp" / "compare-builds"
DEFAULT_REPEAT, QUICK_REPEAT = 5, 3
DEFAULT_SECONDS, QUICK_SECONDS = 2.0, 0.5
DEFAULT_THRESHOLD = 0.95
COMMIT_THREADS = (1, 16)
HOTKEYS_THREADS = 4
# bench_storage also measures commits; this script takes those from bench_commit.
STORAGE_COMMIT_SECONDS = 0.1
RUN_TIMEOUT_S = 1800.0

PROBE = (
    "import json, os, percolite, percolite._core as core; print(json.dumps({"
    "'module': os.path.dirname(os.path.abspath(percolite.__file__)), "
    "'core': os.path.abspath(core.__file__), 'version': percolite.__version__}))"
)


# -- what is measured ------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    """One benchmark command; ``figures`` reads percolite's numbers from its
    JSON report. ``baseline``: whether it runs on the baseline build too."""

    name: str
    script: str
    options: Callable[[argparse.Namespace], list[str]]
    figures: Callable[[dict[str, Any]], dict[str, float]]
    baseline: bool = True


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    measurement: str
    unit: str
    lower_is_better: bool = False


def _commit_options(args: argparse.Namespace) -> list[str]:
    threads = [str(n) for n in COMMIT_THREADS]
    return ["--threads", *threads, "--seconds", f"{args.seconds:g}", "--repeat", "1"]


def _commit_figures(prefix: str) -> Callable[[dict[str, Any]], dict[str, float]]:
    def figures(report: dict[str, Any]) -> dict[str, float]:
        return {
            f"{prefix}_{r['threads']}t": r["percolite"]["median_tx_per_s"]
            for r in report["results"]
        }

    return figures


def _storage_figures(report: dict[str, Any]) -> dict[str, float]:
    return {"storage_combine_queue": report["results"]["combine_queue"]["median_per_s"]}


def _reads_figures(report: dict[str, Any]) -> dict[str, float]:
    results = report["results"]
    return {f"reads_{op}": results[op]["percolite"]["median_per_s"] for op in ("lookups", "scan")}


def _hotkeys_figures(report: dict[str, Any]) -> dict[str, float]:
    (result,) = [r for r in report["results"] if r["threads"] == HOTKEYS_THREADS]
    if not result["cq-native"]["exact"]:
        raise RuntimeError("hotkeys: the combine queue's final values were wrong")
    return {f"hotkeys_native_{HOTKEYS_THREADS}t": result["cq-native"]["median_updates_per_s"]}


def _phrasecount_figures(report: dict[str, Any]) -> dict[str, float]:
    (result,) = [r for r in report["results"] if r["corpus"] == "builtin"]
    if not result["percolite"]["exact"]:
        raise RuntimeError("phrasecount: percolite's counts differ from the reference")
    return {"phrasecount_builtin": result["percolite"]["median_seconds"]}


def _quick(args: argparse.Namespace) -> list[str]:
    return ["--quick"] if args.quick else []


MEASUREMENTS = (
    Measurement(
        "commit",
        "bench_commit.py",
        lambda args: _commit_options(args) + _quick(args),
        _commit_figures("commit"),
    ),
    Measurement(
        "memory",
        "bench_commit.py",
        lambda args: _commit_options(args) + ["--backend", "memory"] + _quick(args),
        _commit_figures("memory_commit"),
        baseline=False,
    ),
    Measurement(
        "storage",
        "bench_storage.py",
        lambda args: ["--repeat", "1", "--seconds", f"{STORAGE_COMMIT_SECONDS:g}"] + _quick(args),
        _storage_figures,
    ),
    Measurement(
        "reads",
        "bench_reads.py",
        lambda args: ["--repeat", "1"] + _quick(args),
        _reads_figures,
    ),
    Measurement(
        "hotkeys",
        "bench_hotkeys.py",
        lambda args: (
            [
                *("--hot-approaches", "cq-native", "--hot-threads", str(HOTKEYS_THREADS)),
                *("--seconds", f"{args.seconds:g}", "--repeat", "1"),
            ]
            + _quick(args)
        ),
        _hotkeys_figures,
    ),
    Measurement(
        "phrasecount",
        "bench_phrasecount.py",
        lambda args: ["--pc-corpora", "builtin", "--repeat", "1"] + _quick(args),
        _phrasecount_figures,
    ),
)
MEASUREMENT_NAMES = tuple(m.name for m in MEASUREMENTS)

FIGURES = (
    *(
        Figure(f"commit_{n}t", f"commits, {n} thread{'s' * (n > 1)}", "commit", "tx/s")
        for n in COMMIT_THREADS
    ),
    Figure("storage_combine_queue", "storage: combine queue", "storage", "updates/s"),
    Figure("reads_lookups", "reads: random look-ups", "reads", "reads/s"),
    Figure("reads_scan", "reads: full scan", "reads", "cells/s"),
    Figure(
        f"hotkeys_native_{HOTKEYS_THREADS}t",
        f"hotkeys: CQ native, {HOTKEYS_THREADS} threads",
        "hotkeys",
        "updates/s",
    ),
    Figure(
        "phrasecount_builtin",
        "phrase count, built-in corpus",
        "phrasecount",
        "seconds",
        lower_is_better=True,
    ),
)
MEMORY_FIGURES = tuple(
    Figure(f"memory_commit_{n}t", f"commits, {n} thread{'s' * (n > 1)}", "memory", "tx/s")
    for n in COMMIT_THREADS
)


# -- the two builds ------------------------------------------------------------------
@dataclass
class Side:
    """One build: the environment its commands run in and what they import."""

    key: str  # "current" or "baseline"
    letter: str  # "A" or "B"
    env: dict[str, str]
    probe: dict[str, Any]

    def core_stamp(self) -> tuple[int, int]:
        """When and how big the extension module is: reinstalling changes it."""
        status = os.stat(self.probe["core"])
        return status.st_mtime_ns, status.st_size


def _git(*argv: str) -> str:
    completed = subprocess.run(
        ["git", *argv], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        raise SystemExit(f"git {' '.join(argv)}: {completed.stderr.strip()}")
    return completed.stdout.strip()


def _utc(seconds: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(
        time.time() if seconds is None else seconds, datetime.UTC
    )
    return moment.isoformat(timespec="seconds")


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def build_baseline(rev: str, cache: Path, rebuild: bool) -> tuple[Path, dict[str, Any]]:
    """The site directory holding the baseline's percolite, built once per
    commit and Python version under ``cache`` (``src/``: the revision's files
    from ``git archive``; ``site/``: ``pip install --target``)."""
    try:
        commit = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except SystemExit:
        raise SystemExit(f"compare: {rev!r} names no commit of {REPO_ROOT}") from None
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    home = cache / f"{commit[:12]}-{tag}"
    site, marker = home / "site", home / "built.json"
    if marker.exists() and not rebuild:
        info = json.loads(marker.read_text(encoding="utf-8"))
        if info.get("commit") == commit and (site / "percolite").is_dir():
            log(f"compare: baseline {rev} ({commit[:12]}): reusing the build in {site}")
            return site, info
    shutil.rmtree(home, ignore_errors=True)
    source = home / "src"
    source.mkdir(parents=True)
    log(f"compare: building baseline {rev} ({commit[:12]}) into {site}; later runs reuse it")
    began = time.perf_counter()
    archive = subprocess.Popen(
        ["git", "archive", "--format=tar", commit], cwd=REPO_ROOT, stdout=subprocess.PIPE
    )
    assert archive.stdout is not None
    untar = subprocess.run(["tar", "-x", "-C", str(source)], stdin=archive.stdout, check=False)
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        raise SystemExit(f"compare: could not extract {commit} with git archive")
    pip = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps"]
    built = subprocess.run(
        [*pip, "--target", str(site), str(source)], capture_output=True, text=True, check=False
    )
    if built.returncode != 0:
        raise SystemExit(
            f"compare: building {rev} failed (pip exited {built.returncode}):\n"
            f"{_tail(built.stdout)}\n{_tail(built.stderr)}"
        )
    info = {
        "rev": rev,
        "commit": commit,
        "committed": _git("show", "-s", "--format=%cI", commit),
        "subject": _git("show", "-s", "--format=%s", commit),
        "python": sys.executable,
        "built_utc": _utc(),
        "build_seconds": round(time.perf_counter() - began, 1),
    }
    write_json(marker, info)
    log(f"compare: built {rev} in {info['build_seconds']:.0f} s")
    return site, info


def _probe(env: dict[str, str]) -> dict[str, Any]:
    """Which percolite a command run with ``env`` imports (run from ``bench/``,
    where the benchmark scripts run)."""
    completed = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        cwd=BENCH_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise SystemExit(f"compare: cannot import percolite:\n{_tail(completed.stderr)}")
    return json.loads(completed.stdout)


def _inside(path: str, directory: Path) -> bool:
    return Path(path).resolve().is_relative_to(directory.resolve())


def make_sides(args: argparse.Namespace) -> tuple[Side, Side | None, dict[str, Any]]:
    """The current build, the baseline (None when no measurement needs it),
    and what the report says about the baseline."""
    plain = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    current = Side("current", "A", plain, _probe(plain))
    needs_baseline = any(m.baseline for m in MEASUREMENTS if m.name in args.only)
    if args.self_baseline:
        itself = Side("baseline", "B", plain, current.probe) if needs_baseline else None
        return current, itself, {"self": True, "percolite_module": current.probe["module"]}
    described: dict[str, Any]
    if args.baseline_site is not None:
        site = args.baseline_site.resolve()
        described = {"site": str(site)}
    elif not needs_baseline:
        return current, None, {"rev": args.baseline}
    else:
        site, info = build_baseline(args.baseline, args.cache, args.rebuild)
        described = {**info, "site": str(site)}
    env = {**plain, "PYTHONPATH": str(site)}
    baseline = Side("baseline", "B", env, _probe(env))
    if not _inside(baseline.probe["module"], site):
        raise SystemExit(
            f"compare: the baseline imports percolite from {baseline.probe['module']}, "
            f"not from {site}"
        )
    if _inside(current.probe["module"], site):
        raise SystemExit(f"compare: the current build imports percolite from {site}")
    described["percolite_module"] = baseline.probe["module"]
    return current, baseline, described


def _current_revision(current: Side) -> dict[str, Any]:
    core = Path(current.probe["core"])
    return {
        "git": _git("describe", "--always", "--dirty"),
        "head": _git("rev-parse", "HEAD"),
        "percolite_module": current.probe["module"],
        "version": current.probe["version"],
        # The installed build may be older than the checkout: when it was installed.
        "core_modified_utc": _utc(core.stat().st_mtime),
        "python": sys.executable,
    }


# -- running -------------------------------------------------------------------------
def plan(args: argparse.Namespace, has_baseline: bool) -> list[tuple[int, Measurement, str]]:
    """(repetition, measurement, side) in the order they run: per repetition
    every measurement, its two sides back to back, which side goes first
    alternating from one repetition to the next for each measurement (a count
    of pairs across measurements would give an even number of measurements
    the same order in every repetition)."""
    steps = []
    for repetition in range(args.repeat):
        for measurement in MEASUREMENTS:
            if measurement.name not in args.only:
                continue
            if not (measurement.baseline and has_baseline):
                steps.append((repetition, measurement, "current"))
                continue
            order = run_order(("current", "baseline"), repetition)
            steps.extend((repetition, measurement, side) for side in order)
    return steps


def run_one(
    args: argparse.Namespace, measurement: Measurement, side: Side, repetition: int, scratch: Path
) -> dict[str, Any]:
    """One benchmark command in a child process; its figures and report."""
    out = scratch / f"{measurement.name}-{side.key}-{repetition}.json"
    options = [*measurement.options(args), "--out", str(out), "--dir", str(scratch)]
    load = list(os.getloadavg())
    began = time.perf_counter()
    try:
        completed = subprocess.run(
            [sys.executable, str(BENCH_DIR / measurement.script), *options],
            env=side.env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise SystemExit(f"compare: {measurement.script} ran past {RUN_TIMEOUT_S:g} s") from error
    wall = time.perf_counter() - began
    if completed.returncode != 0:
        raise SystemExit(
            f"compare: {measurement.script} on the {side.key} build exited "
            f"{completed.returncode}:\n{_tail(completed.stderr)}"
        )
    report = json.loads(out.read_text(encoding="utf-8"))
    out.unlink()
    imported = (report.get("versions") or {}).get("percolite_module")
    if imported is not None and Path(imported).resolve() != Path(side.probe["module"]).resolve():
        raise SystemExit(
            f"compare: {measurement.script} on the {side.key} build imported percolite from "
            f"{imported}, expected {side.probe['module']}"
        )
    return {
        "repetition": repetition,
        "measurement": measurement.name,
        "side": side.key,
        "command": [measurement.script, *measurement.options(args)],
        "wall_seconds": round(wall, 2),
        "load_average_before": load,
        # From the report where it records it, else from the probe of that environment.
        "percolite_module": imported or side.probe["module"],
        "module_checked_in_report": imported is not None,
        "figures": measurement.figures(report),
        "report": report,
    }


def _describe(figures: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:,.2f}" for key, value in figures.items())


# -- summary ---------------------------------------------------------------------
def _values(runs: list[dict[str, Any]], figure: Figure, side: str) -> list[float]:
    return [
        run["figures"][figure.key]
        for run in runs
        if run["side"] == side and run["measurement"] == figure.measurement
    ]


def _speed(figure: Figure, value: float) -> float:
    """Bigger is faster: rates as they are, times inverted."""
    return 1.0 / value if figure.lower_is_better else value


def summarise(
    figure: Figure, runs: list[dict[str, Any]], threshold: float
) -> dict[str, Any] | None:
    current = _values(runs, figure, "current")
    if not current:
        return None
    summary: dict[str, Any] = {
        "label": figure.label,
        "unit": figure.unit,
        "lower_is_better": figure.lower_is_better,
        "current": {"median": median(current), "runs": current},
    }
    baseline = _values(runs, figure, "baseline")
    if not baseline:
        return summary
    pairs = pair_ratios(
        [_speed(figure, value) for value in current],
        [_speed(figure, value) for value in baseline],
        4,
    )
    ratio = _speed(figure, median(current)) / _speed(figure, median(baseline))
    summary.update(
        baseline={"median": median(baseline), "runs": baseline},
        ratio=round(ratio, 4),
        pair_ratios=pairs,
        pair_ratio_min=min(pairs),
        pair_ratio_median=round(median(pairs), 4),
        pair_ratio_max=max(pairs),
        ok=ratio >= threshold,
    )
    return summary


def summarise_memory(runs: list[dict[str, Any]], lmdb: dict[str, Any]) -> dict[str, Any]:
    memory = {}
    for figure, lmdb_figure in zip(MEMORY_FIGURES, FIGURES, strict=False):
        values = _values(runs, figure, "current")
        if not values:
            continue
        ours = lmdb.get(lmdb_figure.key)
        lmdb_median = ours["current"]["median"] if ours else None
        memory[figure.key] = {
            "label": f"{figure.label}, memory backend",
            "unit": figure.unit,
            "current": {"median": median(values), "runs": values},
            "current_lmdb_median": lmdb_median,
            "memory_vs_lmdb": round(median(values) / lmdb_median, 3) if lmdb_median else None,
        }
    return memory


def _number(value: float, figure_unit: str) -> str:
    return f"{value:,.2f}" if figure_unit == "seconds" else f"{value:,.0f}"


def format_report(report: dict[str, Any]) -> str:
    settings, baseline = report["settings"], report["revisions"]["baseline"]
    if baseline.get("self"):
        against = "itself (--self)"
    elif baseline.get("commit"):
        against = f"baseline {baseline['rev']} ({baseline['commit'][:12]})"
    else:
        against = f"the baseline in {baseline.get('site')}"
    threshold = settings["threshold"]
    lines = [
        f"percolite {report['revisions']['current']['git']} (installed build) against "
        f"{against}: medians of {settings['repeat']} interleaved "
        f"{'pair' if settings['repeat'] == 1 else 'pairs'}"
        + (", --quick" if settings["quick"] else ""),
        "",
    ]
    rows = []
    for figure in FIGURES:
        summary = report["figures"].get(figure.key)
        if summary is None:
            continue
        unit = figure.unit + (" (lower is better)" if figure.lower_is_better else "")
        row = [figure.label, unit, _number(summary["current"]["median"], figure.unit)]
        if "ratio" in summary:
            row += [
                _number(summary["baseline"]["median"], figure.unit),
                f"{summary['ratio']:.3f}",
                f"{summary['pair_ratio_min']:.3f} / {summary['pair_ratio_median']:.3f} / "
                f"{summary['pair_ratio_max']:.3f}",
                "yes" if summary["ok"] else "NO",
            ]
        else:
            row += ["-", "-", "-", "-"]
        rows.append(row)
    if rows:
        headers = ["figure", "unit", "current", "baseline", "ratio", "pairs min / med / max"]
        lines += [format_table(headers + [f">= {threshold:g}"], rows), ""]
        lines.append(
            "ratio = current speed / baseline speed, from the medians (for seconds: baseline "
            "/ current); pairs: the same ratio for each pair of runs back to back."
        )
    memory = report["memory_backend"]
    if memory:
        memory_rows = [
            [
                figure.label,
                "-" if m["current_lmdb_median"] is None else f"{m['current_lmdb_median']:,.0f}",
                f"{m['current']['median']:,.0f}",
                "-" if m["memory_vs_lmdb"] is None else f"{m['memory_vs_lmdb']:,.1f}x",
            ]
            for figure in MEMORY_FIGURES
            if (m := memory.get(figure.key)) is not None
        ]
        lines += [
            "",
            "Memory backend, current build only (the baseline has none); commits/s, "
            "percolite.open(':memory:'), nothing written to disk",
            "",
            format_table(["figure", "lmdb tx/s", "memory tx/s", "memory / lmdb"], memory_rows),
        ]
    lines.append("")
    verdicts = [s for s in report["figures"].values() if "ok" in s]
    if verdicts:
        below = [f"{s['label']} ({s['ratio']:.3f})" for s in verdicts if not s["ok"]]
        lines.append(
            f"all {len(verdicts)} figures >= {threshold:g}: "
            + ("yes" if not below else f"NO, below: {', '.join(below)}")
        )
    if settings["quick"]:
        lines.append(
            "--quick: the modules' small sizes (phrase count of the first standard-library "
            "modules, few storage updates); a smoke run, not a measurement"
        )
    start, end = report["machine"]["load_average"], report["load_average_end"]
    cpus = report["machine"]["cpus"] or 1
    if start and end:
        lines.append(
            f"load average {start[0]:.2f} before the runs, {end[0]:.2f} after them "
            f"({cpus} CPUs); {report['wall_seconds']:.0f} s in all"
        )
        # Only the load before: the benchmarks' own threads count in the one after.
        if start[0] > cpus / 2:
            lines.append(
                "warning: the machine was busy before the runs started; the ratios are "
                "noisy (see the pair ranges)"
            )
    return "\n".join(lines)


# -- command line ----------------------------------------------------------------
def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Run it with the Python whose percolite is the current build "
        "(.venv/bin/python after make install).",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--baseline",
        metavar="REV",
        help="git revision to compare with; built once into --cache and reused",
    )
    which.add_argument(
        "--baseline-site",
        type=Path,
        metavar="DIR",
        help="an existing 'pip install --target DIR' of the baseline (nothing is built)",
    )
    which.add_argument(
        "--self",
        dest="self_baseline",
        action="store_true",
        help="compare the current build with itself (no build; shows the method's noise)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"pairs of runs per measurement (default: {DEFAULT_REPEAT}; --quick: {QUICK_REPEAT})",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"duration of each timed commit and hotkeys run (default: {DEFAULT_SECONDS:g}; "
        f"--quick: {QUICK_SECONDS:g})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: the modules' --quick sizes (small corpus, few storage updates), "
        f"{QUICK_SECONDS:g} s runs, {QUICK_REPEAT} pairs",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=MEASUREMENT_NAMES,
        default=list(MEASUREMENT_NAMES),
        metavar="NAME",
        help=f"measurements to run (default: all of {', '.join(MEASUREMENT_NAMES)})",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="ratio current / baseline a figure must reach (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="JSON report to write (default: %(default)s)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=RESULTS_DIR,
        help="parent directory of the scratch stores (default: %(default)s)",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE,
        help="where baseline builds are kept, one per commit (default: %(default)s)",
    )
    parser.add_argument(
        "--rebuild", action="store_true", help="build the baseline again even if cached"
    )
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = QUICK_REPEAT if args.quick else DEFAULT_REPEAT
    if args.seconds is None:
        args.seconds = QUICK_SECONDS if args.quick else DEFAULT_SECONDS
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    if args.baseline_site is not None and not (args.baseline_site / "percolite").is_dir():
        parser.error(f"--baseline-site: no percolite package in {args.baseline_site}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    began = time.perf_counter()
    machine = machine_info()
    current, baseline, baseline_described = make_sides(args)
    sides = {"current": current} if baseline is None else {"current": current, "baseline": baseline}
    steps = plan(args, baseline is not None)
    runs = []
    # A reinstall in the middle would mix two builds on one side.
    stamps = {key: side.core_stamp() for key, side in sides.items()}
    with scratch_dir(args.dir, "compare-") as scratch:
        for number, (repetition, measurement, side) in enumerate(steps, start=1):
            if sides[side].core_stamp() != stamps[side]:
                raise SystemExit(
                    f"compare: the {side} build changed during the comparison "
                    f"({sides[side].probe['core']} was rewritten: make install?); run it again"
                )
            run = run_one(args, measurement, sides[side], repetition, scratch)
            runs.append(run)
            log(
                f"compare: {number}/{len(steps)} pair {repetition + 1} {measurement.name} "
                f"{sides[side].letter} ({side}, {run['wall_seconds']:.1f} s): "
                f"{_describe(run['figures'])}"
            )
    figures = {
        figure.key: summary
        for figure in FIGURES
        if (summary := summarise(figure, runs, args.threshold)) is not None
    }
    ok = [summary["ok"] for summary in figures.values() if "ok" in summary]
    report = {
        "benchmark": "compare_builds",
        "measures": "percolite's figures on the installed build (current) and a baseline "
        "build, interleaved; ratio = current speed / baseline speed",
        "settings": {
            "repeat": args.repeat,
            "seconds": args.seconds,
            "quick": args.quick,
            "threshold": args.threshold,
            "measurements": [m.name for m in MEASUREMENTS if m.name in args.only],
            "commands": {
                m.name: [m.script, *m.options(args)] for m in MEASUREMENTS if m.name in args.only
            },
            "order": "per repetition every measurement, A and B back to back, the first "
            "side alternating from one pair to the next",
            "store_parent": str(args.dir.resolve()),
            "python": sys.executable,
        },
        "revisions": {"current": _current_revision(current), "baseline": baseline_described},
        "machine": machine,
        "load_average_end": list(os.getloadavg()),
        "wall_seconds": round(time.perf_counter() - began, 1),
        "figures": figures,
        "memory_backend": summarise_memory(runs, figures),
        "all_ok": all(ok) if ok else None,
        "runs": runs,
    }
    print(format_report(report), flush=True)
    write_json(args.out, report)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
