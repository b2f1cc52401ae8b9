"""Checks of the benchmarks in ``bench/`` that need no full run (the quick run
of every benchmark is in ``test_bench_smoke.py``): the options of all of them
fit into ``run.py``'s one parser, the storage, export and growth benchmarks
still run on their own, their targets compute the ratios they name, and the
reports already in ``bench/results/`` still make tables, plots and targets.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from types import ModuleType
from typing import Any

import _bench
import percolite.phrasecount.cli
import pytest
from _bench import BENCH_DIR

TIMEOUT_SECONDS = 120
NEW_MODULES = ("bench_storage", "bench_export", "bench_growth")


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """``bench/run.py`` imported (with ``bench/`` on the path, as when run)."""
    sys.path.insert(0, str(BENCH_DIR))
    try:
        yield importlib.import_module("run")
    finally:
        sys.path.remove(str(BENCH_DIR))


def run_script(script: str, *options: str) -> subprocess.CompletedProcess:
    return _bench.run_script(script, *options, timeout=TIMEOUT_SECONDS)


def test_every_benchmark_is_registered_in_order(bench: ModuleType) -> None:
    names = [module.NAME for module in bench.BENCHMARKS]
    assert names == _bench.BENCHMARK_ORDER
    for module in bench.BENCHMARKS:
        for function in ("add_arguments", "run", "format_report"):
            assert callable(getattr(module, function)), (module.NAME, function)
        # The report interface: no module draws its own plots any more.
        assert not hasattr(module, "plot"), module.NAME


@pytest.mark.parametrize(
    "name, option",
    [
        ("phrasecount", "--pc-threads"),
        ("phrasecount", "--pc-sqlite-threads"),
        ("notify", "--runs"),
        ("notify", "--run-threads"),
    ],
)
def test_counts_below_one_are_refused(bench: ModuleType, name: str, option: str) -> None:
    args = bench.parse_arguments(["--quick", option, "0"])
    module = next(m for m in bench.BENCHMARKS if m.NAME == name)
    with pytest.raises(ValueError, match=f"^{option} must be positive, not 0$"):
        module.run(args)


def test_options_do_not_clash(bench: ModuleType) -> None:
    """argparse refuses two modules defining one option string; two options
    with one destination would silently share a value, so check those too."""
    common = argparse.ArgumentParser()
    bench.add_common_arguments(common)
    taken = {action.dest for action in common._actions}
    for module in bench.BENCHMARKS:
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        own = {action.dest for action in parser._actions} - {"help"}
        assert own, module.NAME
        assert not own & taken, (module.NAME, own & taken)
        taken |= own

    args = bench.parse_arguments(["--quick"])
    assert args.export_threads is None and args.growth_sizes is None  # --quick decides
    # The phrase count gets the demo's worker threads (SQLite keeps its 8 loader
    # threads); growth keeps 4, as its reports have.
    assert args.pc_threads == percolite.phrasecount.cli.DEFAULT_THREADS == 8
    assert args.pc_sqlite_threads == 8
    assert args.growth_threads == 4

    help_text = run_script("run.py", "--help").stdout
    for name in ("storage", "export", "growth"):
        assert f"{name} benchmark:" in help_text
    for option in ("--storage-updates", "--export-sinks", "--growth-sizes", "--growth-rounds"):
        assert option in help_text


@pytest.mark.parametrize("module", NEW_MODULES)
def test_runs_alone_help(module: str) -> None:
    help_text = run_script(f"{module}.py", "--help").stdout
    prefix = module.removeprefix("bench_")
    assert f"--{prefix}-" in help_text and "--quick" in help_text and "--out" in help_text


def test_growth_alone_with_explicit_options(tmp_path: Path) -> None:
    """Standalone, tiny: explicit options win over the defaults; the drain
    target is a ratio, the rate and memory ones 'not measured' (no 10k/100k run)."""
    out, stores = tmp_path / "growth.json", tmp_path / "stores"
    stdout = run_script(
        "bench_growth.py",
        *("--growth-sizes", "150", "30", "--growth-threads", "2", "--growth-rounds", "3"),
        *("--growth-drain-updates", "300", "--growth-drain-keys", "30", "--repeat", "2"),
        *("--out", str(out), "--dir", str(stores)),
    ).stdout
    report = json.loads(out.read_text(encoding="utf-8"))
    settings = report["settings"]
    assert settings["quick"] is False
    assert settings["sizes"] == [30, 150]
    assert (settings["rounds"], settings["drain_updates"], settings["drain_keys"]) == (3, 300, 30)
    # Not multiples of the 100 documents per directory: exactly these were indexed.
    assert [size["documents"] for size in report["sizes"]] == [30, 150]
    assert all(size["peak_rss_mib"] > 0 for size in report["sizes"])
    for size in report["sizes"]:  # each size ran twice, on a fresh store each time
        assert len(size["runs_seconds"]) == len(size["runs_peak_rss_anon_mib"]) == 2
        assert size["seconds"] == sum(size["runs_seconds"]) / 2
        assert size["peak_rss_anon_mib"] == sum(size["runs_peak_rss_anon_mib"]) / 2
        assert size["phrases"] > 0 and size["data_mdb_mib"] > 0
    assert [r["exported_entries"] > 0 for r in report["drain"]["rounds"]] == [True] * 3
    rate = "documents/s at 100,000 docs / at 10,000 docs (the rate falls at most to 0.8x)"
    anon = "anonymous memory peak at 10,000 docs / at 100,000 docs (RssAnon grows at most 1.25x)"
    assert f"target: growth: {rate}: not measured" in stdout
    assert f"target: growth: {anon}: not measured" in stdout
    assert "target: growth: data.mdb after drain round 2 / after round 3" in stdout
    assert list(stores.iterdir()) == [], "scratch stores were left behind"


def _growth_report(
    peaks: dict[int, float], files: list[float], seconds: dict[int, float] | None = None
) -> dict[str, Any]:
    return {
        "settings": {"pc_threads": 4, "drain_updates": 10, "drain_keys": 5},
        "sizes": [
            {
                "documents": documents,
                "phrases": documents * 10,
                "peak_rss_mib": 3 * peak,
                "peak_rss_anon_mib": peak,
                "peak_rss_file_mib": 2 * peak,
                "data_mdb_mib": 1.0,
                "sink_mib": None,
                "seconds": (seconds or {}).get(documents, 1.0),
            }
            for documents, peak in peaks.items()
        ],
        "drain": {
            "rounds": [
                {"round": i + 1, "data_mdb_mib": f, "allocated_mib": f, "exported_entries": 5}
                for i, f in enumerate(files)
            ]
        },
    }


@pytest.mark.parametrize(
    ("peaks", "seconds", "files", "rate", "anon", "drain", "base"),
    [
        # 125 MiB at 100k is exactly 1.25x 100 MiB at 10k, 10x the documents in 12.5x the
        # time is exactly 0.8x the rate; the file grew 4% after round 2.
        (
            {10_000: 100.0, 50_000: 110.0, 100_000: 125.0},
            {10_000: 10.0, 50_000: 60.0, 100_000: 125.0},
            [10.0, 12.0, 12.5],
            (0.8, True),
            (0.8, True),
            0.96,
            2,
        ),
        # 1.5x more anonymous memory at half the rate; the file keeps growing (10% after
        # round 2).
        (
            {10_000: 100.0, 100_000: 150.0},
            {10_000: 10.0, 100_000: 200.0},
            [10.0, 12.0, 13.2],
            (0.5, False),
            (0.667, False),
            0.909,
            2,
        ),
        # Neither 10k nor 100k measured: the rate and memory targets are not measured.
        ({200: 50.0, 400: 60.0}, {}, [10.0, 12.0, 12.0, 12.0], (None, None), (None, None), 1.0, 2),
        # 10 rounds: the high-water mark steps up until round 4, then stays (met; round 2
        # against round 10 would be 0.938).
        (
            {200: 50.0},
            {},
            [10.0, 12.0, 12.4, 12.8, *[12.8] * 6],
            (None, None),
            (None, None),
            1.0,
            5,
        ),
        # 10 rounds, 2% more every round: the second half grows 10% (not met).
        (
            {200: 50.0},
            {},
            [round(10 * 1.02**i, 3) for i in range(10)],
            (None, None),
            (None, None),
            0.906,
            5,
        ),
    ],
)
def test_growth_targets(
    bench: ModuleType,
    peaks: dict[int, float],
    seconds: dict[int, float],
    files: list[float],
    rate: tuple[float | None, bool | None],
    anon: tuple[float | None, bool | None],
    drain: float,
    base: int,
) -> None:
    growth = sys.modules["bench_growth"]
    report = _growth_report(peaks, files, seconds)
    rate_target, anon_target, drain_target = growth.targets(report)
    assert (rate_target.measured, rate_target.met, rate_target.target) == (*rate, 0.8)
    assert "documents/s at 100,000 docs / at 10,000 docs" in rate_target.name
    # Anonymous memory, not the peak RSS (three times as much in these reports).
    assert (anon_target.measured, anon_target.met, anon_target.target) == (*anon, 0.8)
    assert "anonymous memory peak at 10,000 docs / at 100,000 docs" in anon_target.name
    assert (drain_target.measured, drain_target.target) == (drain, 0.95)
    assert drain_target.met == (drain >= 0.95)
    assert f"after drain round {base} / after round {len(files)}" in drain_target.name
    # Tables and plots read the same report.
    sizes, rounds = growth.tables(report)
    assert [row[0] for row in sizes.rows] == [f"{n:,}" for n in peaks]
    changes = [f"{after - before:+.2f}" for before, after in pairwise(files)]
    assert [row[2] for row in rounds.rows] == ["-", *changes]
    assert [plot.name for plot in growth.plots(report)] == ["sizes", "drain"]


def test_export_has_no_targets(bench: ModuleType) -> None:
    assert sys.modules["bench_export"].targets({"sinks": {}}) == []


@pytest.mark.parametrize("name", ["storage", "export", "growth"])
def test_reports_in_results_still_readable(bench: ModuleType, name: str) -> None:
    """The JSON in ``bench/results/`` (possibly from an older version of the
    benchmark) still makes tables, plots and targets, as ``--report-only``
    needs."""
    path = BENCH_DIR / "results" / f"{name}.json"
    assert path.exists(), f"bench/results/{path.name} is committed with the repository"
    report = json.loads(path.read_text(encoding="utf-8"))
    module = sys.modules[f"bench_{name}"]
    tables = module.tables(report)
    assert tables and all(table.rows for table in tables)
    assert all(plot.x and plot.series for plot in module.plots(report))
    for target in module.targets(report):
        assert target.measured is None or target.measured > 0, target
    assert module.format_report(report)


def test_repetition_helpers(bench: ModuleType) -> None:
    """The order of interleaved runs and the statistics of repeated runs,
    which every benchmark takes from ``common.py``."""
    common = sys.modules["common"]
    # Rotated: each item goes first once every len(items) turns.
    orders = [common.run_order("abc", turn) for turn in range(4)]
    assert orders == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert common.run_order("abc", 1, mirror=True) == list("cba")
    assert common.run_order("abc", 2, mirror=True) == list("abc")
    # With two items both schemes are one alternation.
    assert common.run_order("AB", 3) == common.run_order("AB", 3, mirror=True) == ["B", "A"]
    assert common.run_order((), 1) == []

    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert common.median(values) == 3.0
    # Nearest rank: always one of the values measured.
    assert [common.percentile(values, q) for q in (0, 0.5, 0.99, 1)] == [1.0, 3.0, 5.0, 5.0]
    with pytest.raises(ValueError, match="no values"):
        common.percentile([], 0.5)
    with pytest.raises(ValueError, match=r"q must be in \[0, 1\], not 1.5"):
        common.percentile(values, 1.5)
    assert common.median_or_none([None, 3.0, 1.0, None, 2.0]) == 2.0
    assert common.median_or_none(iter([None, None])) is None

    assert common.spread([2.0, 6.0, 3.0]) == 3.0
    assert common.spread([0.0, 1.0]) is None
    assert common.pair_ratios([1.0, 2.0, 3.0], [3.0, 0.0, 1.0], 3) == [0.333, None, 3.0]
    with pytest.raises(ValueError):  # every run has its pair
        common.pair_ratios([1.0], [1.0, 2.0], 3)
    assert common.format_range([None, 1.234, 0.5]) == "0.50-1.23x"
    assert common.format_range([None]) == "-"


def test_no_benchmark_uses_another_ones_private_names() -> None:
    """What two benchmarks share is in ``common.py`` or public: no module of
    ``bench/`` reaches for another one's ``_name``."""
    modules = {path.stem for path in BENCH_DIR.glob("*.py")}
    borrowed = []
    for path in sorted(BENCH_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules - {path.stem}
                and node.attr.startswith("_")
            ):
                borrowed.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                names = [alias.name for alias in node.names if alias.name.startswith("_")]
                borrowed += [f"{path.name}:{node.lineno}: {node.module}.{n}" for n in names]
    assert not borrowed, borrowed


def test_every_target_missed_in_results_says_why(bench: ModuleType) -> None:
    """Each target that the reports in ``bench/results/`` miss carries the
    reason REPORT.md prints under its verdict; a missed target without one
    is printed as such, and met targets are not listed."""
    report_module = sys.modules["report"]
    common = sys.modules["common"]
    missed = []
    for module in bench.BENCHMARKS:
        path = BENCH_DIR / "results" / f"{module.NAME}.json"
        if not path.exists() or not hasattr(module, "targets"):
            continue
        report = json.loads(path.read_text(encoding="utf-8"))
        missed += [t for t in module.targets(report) if t.met is False]
    assert [t.name for t in missed if not t.why.strip()] == []
    lines = report_module.not_met_lines(missed)
    for target in missed:
        assert any(target.name in line and target.why in line for line in lines), target.name
    met = common.Target("a met one", 2.0, 1.0, "")
    bare = common.Target("a missed one", 0.5, 1.0)
    assert report_module.not_met_lines([met]) == []
    text = "\n".join(report_module.not_met_lines([met, bare]))
    assert "a met one" not in text
    assert "*a missed one* (0.500x, needs >= 1x): no reason written yet." in text
