"""Smoke tests of ``bench/compare_builds.py`` (the installed build against a
baseline build, interleaved) and of ``bench_commit.py --backend memory``.

Building a baseline revision takes longer than a test should, so the runs
here compare the installed build with itself (``--self``) or with a copy of
itself passed as ``--baseline-site`` (which goes through ``PYTHONPATH`` like a
built baseline). They check the report's figures, ratios and the percolite
each side imported, never whether a ratio reaches the threshold: timings on a
test machine say nothing. The whole file takes about half a minute on two
cores.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import _bench
import percolite
import pytest
from _bench import BENCH_DIR

TIMEOUT_SECONDS = 120
FIGURES = (
    "commit_1t",
    "commit_16t",
    "storage_combine_queue",
    "reads_lookups",
    "reads_scan",
    "hotkeys_native_4t",
    "phrasecount_builtin",
)
MEMORY_FIGURES = ("memory_commit_1t", "memory_commit_16t")


@pytest.fixture(scope="module")
def compare() -> Iterator[ModuleType]:
    """``bench/compare_builds.py`` imported (with ``bench/`` on the path, as when run)."""
    sys.path.insert(0, str(BENCH_DIR))
    try:
        yield importlib.import_module("compare_builds")
    finally:
        sys.path.remove(str(BENCH_DIR))


def run_script(script: str, *options: str) -> str:
    return _bench.run_script(script, *options, timeout=TIMEOUT_SECONDS).stdout


def check_figure(summary: dict[str, Any], pairs: int) -> None:
    for side in ("current", "baseline"):
        assert summary[side]["median"] > 0, summary
        assert len(summary[side]["runs"]) == pairs, summary
    assert summary["ratio"] > 0
    assert len(summary["pair_ratios"]) == pairs
    assert summary["pair_ratio_min"] <= summary["pair_ratio_median"] <= summary["pair_ratio_max"]
    assert isinstance(summary["ok"], bool)


def test_self_quick_reports_every_figure(tmp_path: Path) -> None:
    out, stores = tmp_path / "compare.json", tmp_path / "stores"
    stdout = run_script(
        "compare_builds.py",
        *("--self", "--quick", "--repeat", "2", "--seconds", "0.2"),
        *("--out", str(out), "--dir", str(stores)),
    )

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["settings"]["repeat"] == 2 and report["settings"]["quick"] is True
    assert report["revisions"]["baseline"]["self"] is True
    module = report["revisions"]["current"]["percolite_module"]
    assert Path(module) == Path(percolite.__file__).parent
    assert set(report["figures"]) == set(FIGURES)
    for key in FIGURES:
        check_figure(report["figures"][key], pairs=2)
    assert report["figures"]["phrasecount_builtin"]["lower_is_better"] is True
    assert isinstance(report["all_ok"], bool)
    assert set(report["memory_backend"]) == set(MEMORY_FIGURES)
    for key in MEMORY_FIGURES:
        memory = report["memory_backend"][key]
        assert memory["current"]["median"] > 0 and memory["memory_vs_lmdb"] > 0, memory

    # Five measurements on both sides and the memory backend on one, per pair.
    runs = report["runs"]
    assert len(runs) == 2 * (5 * 2 + 1)
    assert all(run["percolite_module"] == module for run in runs)
    memory_runs = [run for run in runs if run["measurement"] == "memory"]
    assert [run["side"] for run in memory_runs] == ["current", "current"]
    for run in memory_runs:
        assert run["report"]["settings"]["backend"] == "memory"
    # A and B back to back, each measurement's first side alternating from one
    # repetition to the next.
    paired = [run for run in runs if run["measurement"] != "memory"]
    firsts = [paired[i]["side"] for i in range(0, len(paired), 2)]
    assert firsts == ["current"] * 5 + ["baseline"] * 5
    for first, second in zip(paired[::2], paired[1::2], strict=False):
        assert first["measurement"] == second["measurement"]
        assert {first["side"], second["side"]} == {"current", "baseline"}

    assert "against itself (--self)" in stdout
    assert "commits, 16 threads" in stdout and "Memory backend" in stdout
    assert "all 7 figures >= 0.95: " in stdout
    assert list(stores.iterdir()) == [], "scratch stores were left behind"


def test_baseline_site_is_imported_through_pythonpath(tmp_path: Path) -> None:
    """A copy of the installed package as the baseline: the baseline's runs
    must import it, the current build's runs the installed one."""
    site = tmp_path / "site"
    shutil.copytree(
        Path(percolite.__file__).parent,
        site / "percolite",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    out, stores = tmp_path / "compare.json", tmp_path / "stores"
    run_script(
        "compare_builds.py",
        *("--baseline-site", str(site), "--quick", "--repeat", "1", "--seconds", "0.1"),
        *("--only", "commit", "hotkeys", "--out", str(out), "--dir", str(stores)),
    )

    report = json.loads(out.read_text(encoding="utf-8"))
    baseline_module = report["revisions"]["baseline"]["percolite_module"]
    assert Path(baseline_module) == (site / "percolite").resolve()
    installed = report["revisions"]["current"]["percolite_module"]
    assert Path(installed) == Path(percolite.__file__).parent
    assert set(report["figures"]) == {"commit_1t", "commit_16t", "hotkeys_native_4t"}
    for summary in report["figures"].values():
        check_figure(summary, pairs=1)
    assert report["memory_backend"] == {}
    for run in report["runs"]:
        expected = baseline_module if run["side"] == "baseline" else installed
        assert run["percolite_module"] == expected, run["command"]
    # bench_commit records the module it imported; compare_builds checked it.
    assert all(
        run["module_checked_in_report"] for run in report["runs"] if run["measurement"] == "commit"
    )


def test_baseline_site_without_percolite_is_refused(tmp_path: Path) -> None:
    completed = _bench.run_command(
        [sys.executable, BENCH_DIR / "compare_builds.py", "--baseline-site", tmp_path],
        timeout=TIMEOUT_SECONDS,
    )
    assert completed.returncode == 2
    assert "no percolite package" in completed.stderr


def test_ratios_and_order(compare: ModuleType) -> None:
    """Ratios are current speed / baseline speed: rates A/B, seconds B/A."""

    def runs(measurement: str, key: str, current: list, baseline: list) -> list:
        return [
            {"measurement": measurement, "side": side, "figures": {key: value}}
            for side, values in (("current", current), ("baseline", baseline))
            for value in values
        ]

    rate = next(f for f in compare.FIGURES if f.key == "commit_16t")
    summary = compare.summarise(rate, runs("commit", "commit_16t", [90, 100, 110], [100] * 3), 0.95)
    assert summary["ratio"] == 1.0 and summary["pair_ratios"] == [0.9, 1.0, 1.1]
    assert summary["ok"] is True

    seconds = next(f for f in compare.FIGURES if f.key == "phrasecount_builtin")
    measured = runs("phrasecount", "phrasecount_builtin", [2.0, 8.0], [4.0, 4.0])
    summary = compare.summarise(seconds, measured, 0.95)
    # Median times 5.0 (current) and 4.0 (baseline): the current build is slower.
    assert summary["ratio"] == 0.8 and summary["pair_ratios"] == [2.0, 0.5]
    assert summary["ok"] is False

    args = argparse.Namespace(repeat=3, only=["commit", "memory", "hotkeys"])
    steps = [(rep, m.name, side) for rep, m, side in compare.plan(args, has_baseline=True)]
    assert steps[:5] == [
        (0, "commit", "current"),
        (0, "commit", "baseline"),
        (0, "memory", "current"),
        (0, "hotkeys", "current"),
        (0, "hotkeys", "baseline"),
    ]
    assert len(steps) == 3 * 5
    # Each measurement's first side alternates from one repetition to the next,
    # however many measurements there are (six by default: an even number).
    for names in (["commit", "memory", "hotkeys"], [m.name for m in compare.MEASUREMENTS]):
        args = argparse.Namespace(repeat=4, only=names)
        steps = [(rep, m.name, side) for rep, m, side in compare.plan(args, has_baseline=True)]
        for name in {"commit", "hotkeys"} & set(names):
            firsts = [
                next(side for r, n, side in steps if r == rep and n == name) for rep in range(4)
            ]
            assert firsts == ["current", "baseline", "current", "baseline"], (name, names)
    no_baseline = compare.plan(args, has_baseline=False)
    assert {side for _rep, _m, side in no_baseline} == {"current"}


def test_commit_benchmark_on_the_memory_backend(tmp_path: Path) -> None:
    out, stores = tmp_path / "commit.json", tmp_path / "stores"
    stdout = run_script(
        "bench_commit.py",
        *("--backend", "memory", "--threads", "2", "--seconds", "0.05", "--repeat", "1"),
        *("--out", str(out), "--dir", str(stores)),
    )

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["settings"]["backend"] == "memory"
    assert report["settings"]["percolite"] == {"sync": "full", "backend": "memory"}
    (result,) = report["results"]
    assert result["percolite"]["median_tx_per_s"] > 0 and result["lmdb"]["median_tx_per_s"] > 0
    assert "percolite (memory) tx/s" in stdout and "not durable" in stdout
    assert list(stores.iterdir()) == [], "scratch stores were left behind"
