"""The application the worker processes of test_export_queue_processes.py run
(``percolite worker children.exports_app:app``): an export queue into a real
SQLite file, and the Export Queue recipe's inverted index.

From the environment, read when imported: SINK (the SQLite file, required),
EXPORT_SLEEP (seconds each kv export waits after applying its batch) and
EXPORT_FAIL (the probability that an export call fails after applying).
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time

import percolite
from percolite.exporters import SQLite

app = percolite.App("exports")
SINK = os.environ["SINK"]
SLEEP = float(os.environ.get("EXPORT_SLEEP", "0"))
FAIL = float(os.environ.get("EXPORT_FAIL", "0"))
kv_sink = SQLite(SINK, "kv", key="k", columns="v")
_rng = random.Random()
_lock = threading.Lock()


def export_kv(entries):
    kv_sink(entries)  # applied to the sink first ...
    if SLEEP:
        time.sleep(SLEEP)  # ... so a kill here leaves applied entries queued
    with _lock:
        fail = _rng.random() < FAIL
    if fail:
        raise OSError("random exporter failure")


kv = app.export_queue("kv", export_kv, buckets=8, batch_size=25, value_codec="int64")

# The seed's example: an observer folds numUpdates into counter1 and exports
# (old, new); the exporter keeps an inverted index count -> rows in SQLite.
COUNTER = ("meta", "counter1")
UPDATES = ("meta", "numUpdates")


@app.export_queue("ici", buckets=4, batch_size=50, value_codec="json")
def ici(entries):
    db = sqlite3.connect(SINK, timeout=30, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        for e in entries:
            old, new = e.value
            applied = db.execute(
                "INSERT INTO ici_seq(row, seq) VALUES (?, ?) ON CONFLICT(row) "
                "DO UPDATE SET seq = excluded.seq WHERE excluded.seq > ici_seq.seq",
                (e.key, e.seq),
            ).rowcount
            if applied:
                db.execute("DELETE FROM ici WHERE count = ? AND row = ?", (old, e.key))
                db.execute("INSERT INTO ici(count, row) VALUES (?, ?)", (new, e.key))
        with _lock:
            fail = _rng.random() < FAIL
        if fail:
            db.execute("COMMIT")  # applied, then reported as failed: redelivered
            raise OSError("random exporter failure")
        db.execute("COMMIT")
    finally:
        db.close()


@app.observer(UPDATES, notify=percolite.STRONG)
def fold(tx, row, column):
    updates = int(tx.get(row, UPDATES, b"0"))
    old = int(tx.get(row, COUNTER, b"0"))
    new = old + updates
    tx.set(row, COUNTER, str(new))
    tx.delete(row, UPDATES)  # a delete does not notify
    if new != old:
        ici.add(tx, row.decode(), [old, new])
