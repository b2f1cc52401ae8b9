"""The application benchmarked by bench_notify.py: one observer that records
when it started, in its own transaction (so only committed runs count)."""

import time

import percolite

app = percolite.App("latency")
COLUMN = ("bench", "ping")
STARTED = ("bench", "observer_started")


@app.observer(COLUMN)
def record_start(tx, row, column):
    tx.set(row, STARTED, repr(time.monotonic()))
