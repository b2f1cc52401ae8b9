"""Smoke tests of the export, storage and growth benchmarks in ``bench/``:
each runs in quick mode in a child process (with a timeout, so a hang fails
instead of freezing the suite), writes its JSON report with the expected
keys, and removes its scratch stores. Targets are not checked: timings on a
test machine say nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO_ROOT / "bench"
TIMEOUT_SECONDS = 120


def run_quick(script: str, tmp_path: Path) -> dict[str, Any]:
    out, stores = tmp_path / "report.json", tmp_path / "stores"
    completed = subprocess.run(
        [
            sys.executable,
            str(BENCH_DIR / script),
            "--quick",
            "--out",
            str(out),
            "--dir",
            str(stores),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    assert completed.returncode == 0, (
        f"{script} exited {completed.returncode}\n"
        f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
    )
    assert list(stores.iterdir()) == [], "scratch stores were left behind"
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["settings"]["quick"] is True
    assert {"machine", "versions"} <= set(report)
    return report


def check_targets(script: str, report: dict[str, Any]) -> None:
    sys.path.insert(0, str(BENCH_DIR))
    try:
        module = __import__(script.removesuffix(".py"))
    finally:
        sys.path.remove(str(BENCH_DIR))
    for name, measured, wanted in module.targets(report):
        assert isinstance(name, str) and measured > 0 and wanted > 0, (name, measured, wanted)


def test_export_quick(tmp_path: Path) -> None:
    report = run_quick("bench_export.py", tmp_path)
    assert report["benchmark"] == "export"
    assert set(report["sinks"]) == {"sqlite", "postgres"}
    for measured in report["sinks"].values():
        assert measured["sink_alone"]["median_entries_per_s"] > 0
        for summary in measured["throughput"].values():
            assert summary["median_entries_per_s"] > 0
            assert summary["runs"]
        assert set(measured["latency"]) == {"idle", "load"}
        for mode in measured["latency"].values():
            for kind in ("export", "observer"):
                assert set(mode[kind]) >= {"p50_ms", "p99_ms", "max_ms", "commits"}
        assert measured["latency"]["load"]["load_entries_per_s"] > 0
    check_targets("bench_export.py", report)


def test_storage_quick(tmp_path: Path) -> None:
    report = run_quick("bench_storage.py", tmp_path)
    assert report["benchmark"] == "storage"
    assert set(report["results"]) == {"lmdb_put", "lmdb_putmulti", "combine_queue"}
    for system in report["results"].values():
        assert system["median_per_s"] > 0
    assert report["combine_ratio"] > 0
    assert report["durable_commits"]["benchmark"] == "commit"
    assert report["durable_commits"]["target"]["threads"] == 16
    check_targets("bench_storage.py", report)


def test_growth_quick(tmp_path: Path) -> None:
    report = run_quick("bench_growth.py", tmp_path)
    assert report["benchmark"] == "growth"
    assert [size["documents"] for size in report["sizes"]] == report["settings"]["sizes"]
    for size in report["sizes"]:
        assert size["peak_rss_mib"] > 0 and size["data_mdb_mib"] > 0
        assert size["phrases"] > 0
    rounds = report["drain"]["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, report["settings"]["rounds"] + 1))
    assert all(r["data_mdb_mib"] > 0 for r in rounds)
    check_targets("bench_growth.py", report)
