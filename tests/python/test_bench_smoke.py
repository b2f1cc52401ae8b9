"""Smoke tests of the benchmarks in ``bench/``: they run, write their JSON
report, measure something for both systems and clean up their scratch stores.

They run the scripts in quick mode in a child process (with a timeout, so a
hang fails instead of freezing the suite) and never check the performance
target: timings on a test machine say nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO_ROOT / "bench"
TIMEOUT_SECONDS = 300


def run_script(script: str, *options: str) -> None:
    completed = subprocess.run(
        [sys.executable, str(BENCH_DIR / script), *options],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    assert completed.returncode == 0, (
        f"{script} exited {completed.returncode}\n"
        f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
    )
    assert "target: percolite" in completed.stdout


def check_commit_report(report: dict[str, Any], threads: list[int]) -> None:
    assert report["benchmark"] == "commit"
    assert [result["threads"] for result in report["results"]] == threads
    for result in report["results"]:
        for system in ("percolite", "lmdb"):
            measured = result[system]
            assert measured["median_tx_per_s"] > 0, (system, result)
            assert measured["runs"], (system, result)
            assert all(run["tx_per_s"] > 0 for run in measured["runs"]), (system, result)
            assert all(run["transactions"] > 0 for run in measured["runs"]), (system, result)
        assert result["ratio"] > 0
        assert len(result["ratio_per_repetition"]) == len(result["percolite"]["runs"])
    target = report["target"]
    assert set(target) == {"threads", "min_ratio", "ratio", "met"}


def test_run_quick_writes_commit_report(tmp_path: Path) -> None:
    out, stores = tmp_path / "out", tmp_path / "stores"
    run_script("run.py", "--quick", "--out", str(out), "--dir", str(stores))

    report = json.loads((out / "commit.json").read_text(encoding="utf-8"))
    check_commit_report(report, [1, 4, 16])
    assert report["settings"]["quick"] is True
    assert isinstance(report["target"]["met"], bool)
    assert list(stores.iterdir()) == [], "scratch stores were left behind"


def test_commit_benchmark_alone_writes_report_file(tmp_path: Path) -> None:
    out, stores = tmp_path / "commit.json", tmp_path / "stores"
    run_script(
        "bench_commit.py",
        *("--threads", "2", "--seconds", "0.05", "--repeat", "2", "--value-size", "10"),
        *("--out", str(out), "--dir", str(stores)),
    )

    report = json.loads(out.read_text(encoding="utf-8"))
    check_commit_report(report, [2])
    assert len(report["results"][0]["percolite"]["runs"]) == 2
    assert report["target"]["met"] is None  # 16 threads not measured
    assert list(stores.iterdir()) == [], "scratch stores were left behind"
