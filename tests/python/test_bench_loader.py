"""Smoke test of ``bench/bench_loader.py``: its ``--quick`` run through
``run.py`` writes the report, ``REPORT.md`` and the plot, measures every
system, gets exact results, computes the targets from the medians, and cleans
up its scratch stores. No test checks whether a target is met: timings on a
test machine say nothing.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import _bench
import pytest
from _bench import BENCH_DIR

# --quick takes a few seconds; the timeout only turns a hang into a failure.
TIMEOUT_SECONDS = 120
LATENCY_FIELDS = {"p50_ms", "p99_ms", "max_ms", "submit_wait_p50_ms", "submit_wait_p99_ms"}


@pytest.fixture(scope="module")
def loader_bench() -> Iterator[ModuleType]:
    """``bench/bench_loader.py`` imported (with ``bench/`` on the path, as when run)."""
    sys.path.insert(0, str(BENCH_DIR))
    try:
        yield importlib.import_module("bench_loader")
    finally:
        sys.path.remove(str(BENCH_DIR))


def check_latency(latency: dict[str, float]) -> None:
    assert set(latency) == LATENCY_FIELDS
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"], latency
    assert 0 <= latency["submit_wait_p50_ms"] <= latency["submit_wait_p99_ms"], latency


def check_loader_run(run: dict[str, Any]) -> None:
    """One loader run: what it loaded, its CPU use, its latencies."""
    assert run["transactions"] > 0 and run["batches"] > 0, run
    assert 0 < run["load_seconds"] <= run.get("total_seconds", run.get("seconds")), run
    cpu = run["cpu"]
    assert cpu["wall_seconds"] > 0 and cpu["process_cores"] >= 0 and cpu["submitter_busy"] >= 0
    assert cpu["loader_thread_busy"] is None or cpu["loader_thread_busy"] >= 0
    check_latency(run["latency"])


def check_loader_report(report: dict[str, Any], loader_bench: ModuleType) -> None:
    assert report["benchmark"] == "loader"
    assert {"machine", "settings", "versions", "load_average_after"} <= set(report)
    settings = report["settings"]
    assert settings["quick"] is True and settings["in_flight"] == 256
    assert settings["percolite"] == {"sync": "full"}
    approaches = settings["hotkeys"]["approaches"]
    assert approaches == [
        "loader-naive",
        "loader-cq-native",
        "loader-cq-lambda-2w",
        "loader-cq-lambda-4w",
        "sqlite-4t",
        "sqlite-16t",
    ]
    assert settings["hotkeys"]["user_worker_threads"] == [2, 4]

    hot = report["hotkeys"]
    for approach in approaches:
        measured = hot["results"][approach]
        assert measured["median_updates_per_s"] > 0, approach
        assert measured["median_load_updates_per_s"] >= measured["median_updates_per_s"] * 0.999
        # Every final value equals the sum of the updates submitted.
        assert measured["exact"] is True, (approach, measured)
        assert len(measured["runs"]) == settings["repeat"] == 1
        for run in measured["runs"]:
            assert run["exact"] and run["wrong_keys"] == 0, (approach, run)
            assert run["updates"] == 20 * run["transactions"] > 0, (approach, run)
            if approach.startswith("loader-"):
                check_loader_run(run)
        if approach.startswith("loader-"):
            check_latency(measured["latency"])
    for approach in ("loader-cq-native", "loader-cq-lambda-2w", "loader-cq-lambda-4w"):
        assert hot["results"][approach]["median_conflicts_per_transaction"] == 0
    best = max(("sqlite-4t", "sqlite-16t"), key=lambda a: hot["results"][a]["median_updates_per_s"])
    assert hot["sqlite_best"] == best
    cq = hot["results"]["loader-cq-native"]["median_updates_per_s"]
    assert hot["cq_vs_naive"] == round(
        cq / hot["results"]["loader-naive"]["median_updates_per_s"], 3
    )
    assert hot["cq_vs_sqlite_best"] == round(cq / hot["results"][best]["median_updates_per_s"], 3)
    assert list(hot["user"]) == ["loader-cq-lambda-2w", "loader-cq-lambda-4w"]
    for approach, versus in hot["user"].items():
        user = hot["results"][approach]["median_updates_per_s"]
        assert versus == {
            "vs_naive": round(user / hot["results"]["loader-naive"]["median_updates_per_s"], 3),
            "vs_sqlite_best": round(user / hot["results"][best]["median_updates_per_s"], 3),
        }

    bulk = report["bulk"]
    assert settings["bulk"]["updates"] == 20_000 and settings["bulk"]["tx_keys"] == 50
    ours, lmdb = bulk["results"]["loader_cq"], bulk["results"]["lmdb_put"]
    assert [run["operations"] for run in ours["runs"]] == [20_000]
    assert [run["transactions"] for run in ours["runs"]] == [400]
    assert [run["operations"] for run in lmdb["runs"]] == [20_000]
    assert [run["transactions"] for run in lmdb["runs"]] == [2]
    assert ours["runs"][0]["exact"] is True  # the folded values were checked
    check_loader_run(ours["runs"][0])
    check_latency(ours["latency"])
    assert bulk["ratio"] == round(ours["median_per_s"] / lmdb["median_per_s"], 4) > 0

    targets = loader_bench.targets(report)
    user = hot["user"]
    assert [t.measured for t in targets] == [
        hot["cq_vs_naive"],
        hot["cq_vs_sqlite_best"],
        user["loader-cq-lambda-2w"]["vs_naive"],
        user["loader-cq-lambda-2w"]["vs_sqlite_best"],
        user["loader-cq-lambda-4w"]["vs_naive"],
        user["loader-cq-lambda-4w"]["vs_sqlite_best"],
        bulk["ratio"],
    ]
    assert [t.target for t in targets] == [20.0, 5.0, 25.0, 8.0, 25.0, 8.0, 0.3]


def test_quick_run_through_run_py(tmp_path: Path, loader_bench: ModuleType) -> None:
    out, stores = tmp_path / "out", tmp_path / "stores"
    began = time.monotonic()
    stdout = _bench.run_script(
        "run.py",
        *("--quick", "--only", "loader", "--out", str(out), "--dir", str(stores)),
        timeout=TIMEOUT_SECONDS,
    ).stdout
    seconds = time.monotonic() - began

    report = json.loads((out / "loader.json").read_text(encoding="utf-8"))
    check_loader_report(report, loader_bench)
    assert "target: loader: hot keys, CQ native / naive" in stdout
    assert "target: loader: CQ updates (50 per transaction), folded" in stdout
    assert "target: loader: hot keys, CQ lambda+fresh dicts, 2 workers / naive" in stdout
    assert "Targets (measured ratio vs target)" in stdout
    assert "error:" not in stdout
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert list(summary["benchmarks"]) == ["loader"]
    assert [t["name"].split(":")[0] for t in summary["targets"]] == ["loader"] * 7
    assert summary["plots"] == ["loader-hotkeys.png"]
    assert (out / "loader-hotkeys.png").read_bytes().startswith(b"\x89PNG")
    markdown = (out / "REPORT.md").read_text(encoding="utf-8")
    assert "## loader\n" in markdown and "Could not read" not in markdown
    assert "Hot keys through one loader thread" in markdown
    assert "loader, CQ lambda+fresh dicts, 2 workers" in markdown
    assert list(stores.iterdir()) == [], "scratch stores were left behind"
    assert seconds < 60, f"--quick took {seconds:.0f} s"


def test_committed_report_still_readable(loader_bench: ModuleType) -> None:
    """``bench/results/loader.json`` makes tables, plots and targets, as
    ``run.py --report-only`` needs."""
    report = json.loads((BENCH_DIR / "results" / "loader.json").read_text(encoding="utf-8"))
    assert report["settings"]["quick"] is False
    assert all(table.rows for table in loader_bench.tables(report))
    assert all(plot.x and plot.series for plot in loader_bench.plots(report))
    assert all(t.measured is not None and t.measured > 0 for t in loader_bench.targets(report))
    assert loader_bench.format_report(report)
