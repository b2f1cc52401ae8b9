"""Smoke tests of the benchmarks in ``bench/``: they run, write their JSON
reports, REPORT.md and the plots, measure something for every system, get
exact results, and clean up their scratch stores.

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


def run_script(script: str, *options: str) -> str:
    """Run a benchmark script; return its standard output."""
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
    return completed.stdout


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


def check_hotkeys_report(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "hotkeys"
    approaches = report["settings"]["approaches"]
    assert approaches == ["naive", "sharded", "cq-native", "cq-python", "sqlite"]
    assert [result["threads"] for result in report["results"]] == [1, 4]
    for result in report["results"]:
        for approach in approaches:
            measured = result[approach]
            assert measured["median_updates_per_s"] > 0, (approach, result)
            assert measured["exact"] is True, (approach, result)
            for run in measured["runs"]:
                assert run["updates"] == 20 * run["transactions"] > 0, (approach, run)
                assert run["exact"] and run["wrong_keys"] == 0, (approach, run)
                assert run["conflicts"] >= 0
        assert result["native_vs_naive"] > 0
        assert result["native_vs_sqlite"] > 0


def check_phrasecount_report(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "phrasecount"
    assert [result["corpus"] for result in report["results"]] == ["builtin", "synthetic"]
    for result in report["results"]:
        assert result["documents"] > 0 and result["phrase_updates"] > 0
        for system in ("percolite", "sqlite", "counter"):
            measured = result[system]
            assert measured["median_seconds"] > 0, (system, result)
            assert measured["median_docs_per_s"] > 0, (system, result)
            # Every system's counts equal reference_counts of the same documents.
            assert measured["exact"] is True, (system, result)
            assert [run["documents"] for run in measured["runs"]] == [result["documents"]]
        assert result["percolite_vs_sqlite"] > 0
        assert result["percolite_vs_counter"] > 0


def check_report_files(out: Path) -> None:
    """REPORT.md, summary.json and the PNGs: present, complete, small."""
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert set(summary["benchmarks"]) == {"commit", "notify", "hotkeys", "phrasecount"}
    names = [target["name"] for target in summary["targets"]]
    assert len(names) == 4, names
    assert any(name.startswith("hot keys:") for name in names)
    assert sum(name.startswith("phrase count:") for name in names) == 2
    for target in summary["targets"]:
        assert set(target) == {"name", "measured_ratio", "target_ratio", "met"}
        assert target["measured_ratio"] > 0 and isinstance(target["met"], bool), target

    markdown = (out / summary["report"]).read_text(encoding="utf-8")
    assert markdown.startswith("# percolite benchmarks")
    assert "## Targets" in markdown and "Could not read" not in markdown
    for name in summary["benchmarks"]:
        assert f"## {name}\n" in markdown and f"({name}.json)" in markdown
    assert set(summary["plots"]) >= {
        "commit-throughput.png",
        "hotkeys-throughput.png",
        "phrasecount-docs-per-s.png",
    }
    for picture in summary["plots"]:
        data = (out / picture).read_bytes()
        assert data.startswith(b"\x89PNG"), picture
        assert len(data) < 100_000, (picture, len(data))
        assert f"]({picture})" in markdown


def test_run_quick_writes_every_report(tmp_path: Path) -> None:
    out, stores = tmp_path / "out", tmp_path / "stores"
    stdout = run_script("run.py", "--quick", "--out", str(out), "--dir", str(stores))

    report = json.loads((out / "commit.json").read_text(encoding="utf-8"))
    check_commit_report(report, [1, 4, 16])
    assert report["settings"]["quick"] is True
    assert isinstance(report["target"]["met"], bool)
    check_hotkeys_report(json.loads((out / "hotkeys.json").read_text(encoding="utf-8")))
    check_phrasecount_report(json.loads((out / "phrasecount.json").read_text(encoding="utf-8")))
    check_report_files(out)
    assert "target: percolite" in stdout and "Targets (measured ratio vs target)" in stdout
    assert list(stores.iterdir()) == [], "scratch stores were left behind"

    # The report can be rebuilt from the JSON files alone.
    (out / "REPORT.md").unlink()
    run_script("run.py", "--report-only", "--out", str(out), "--dir", str(stores))
    check_report_files(out)


def test_commit_benchmark_alone_writes_report_file(tmp_path: Path) -> None:
    out, stores = tmp_path / "commit.json", tmp_path / "stores"
    stdout = run_script(
        "bench_commit.py",
        *("--threads", "2", "--seconds", "0.05", "--repeat", "2", "--value-size", "10"),
        *("--out", str(out), "--dir", str(stores)),
    )

    assert "target: percolite" in stdout
    report = json.loads(out.read_text(encoding="utf-8"))
    check_commit_report(report, [2])
    assert len(report["results"][0]["percolite"]["runs"]) == 2
    assert report["target"]["met"] is None  # 16 threads not measured
    assert list(stores.iterdir()) == [], "scratch stores were left behind"
