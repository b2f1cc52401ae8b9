"""What the benchmark tests share: where ``bench/`` is, and running one of
its scripts in a child process that must exit 0 within a timeout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _isolated import run_command

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO_ROOT / "bench"


def run_script(script: str, *options: str, timeout: float) -> subprocess.CompletedProcess:
    """Run ``bench/<script>`` with ``options``; fail the test, with its output,
    unless it exits 0 within ``timeout`` seconds (a hang is killed)."""
    completed = run_command(
        [sys.executable, BENCH_DIR / script, *options], timeout=timeout, cwd=REPO_ROOT
    )
    assert completed.returncode == 0, (
        f"{script} exited {completed.returncode}\n"
        f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
    )
    return completed


# The benchmarks bench/run.py registers, in the order it runs and reports them.
BENCHMARK_ORDER = [
    "commit",
    "notify",
    "hotkeys",
    "storage",
    "reads",
    "first_commit",
    "loader",
    "export",
    "sqlite_sink",
    "phrasecount",
    "growth",
    "simulation",
    "postgresql",
    "webindex",
]
