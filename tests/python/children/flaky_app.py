"""An app whose observer fails on every document until ``FLAKY_FIXED=1`` is
set: the worker processes of tests/python/test_operations.py import it."""

from __future__ import annotations

import os

import percolite

app = percolite.App("flaky")

CONTENT = ("doc", "content")
RUNS = ("obs", "runs")


@app.observer(CONTENT, max_attempts=3, name="index")
def index(tx, row, column):
    if os.environ.get("FLAKY_FIXED") != "1":
        raise ValueError(f"poisoned document {row.decode()}")
    # Counts committed runs: the count commits only with the run that wrote it.
    tx.set(row, RUNS, str(int(tx.get(row, RUNS, b"0")) + 1))
