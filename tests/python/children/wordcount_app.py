"""The application the worker processes of test_workers_processes.py run
(``percolite worker children.wordcount_app:app``).

Each committed run of count_words leaves, in its own transaction: the
document's word count, an increment of one shard of the total, an increment
of a per-row run counter, and one marker cell with a unique qualifier whose
value is the worker's pid. OBSERVER_SLEEP (seconds, from the environment)
makes every run of count_words and log_event that much longer. START_GATE
(a directory) and GATE_PROCESSES (a count) hold every run until that many
worker processes have begun one, so on a busy machine a process that
started late still finds work.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import zlib

import percolite

app = percolite.App("wordcount")
SLEEP = float(os.environ.get("OBSERVER_SLEEP", "0"))
GATE = os.environ.get("START_GATE")
GATE_PROCESSES = int(os.environ.get("GATE_PROCESSES", "0"))
_gate_open = threading.Event()


def wait_at_gate():
    """Until GATE_PROCESSES processes have each begun a run (at most 60 s)."""
    if not GATE or _gate_open.is_set():
        return
    open(os.path.join(GATE, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(GATE)) < GATE_PROCESSES and time.monotonic() < deadline:
        time.sleep(0.01)
    _gate_open.set()


@app.observer(("doc", "content"), notify=percolite.STRONG, name="count_words")
def count_words(tx, row, column):
    wait_at_gate()
    words = len(tx.get(row, column).decode().split())
    tx.set(row, ("doc", "words"), str(words))
    shard = ("total", str(zlib.crc32(row) % 8))
    tx.set("totals", shard, str(int(tx.get("totals", shard, b"0")) + words))
    tx.set(row, ("obs", "runs"), str(int(tx.get(row, ("obs", "runs"), b"0")) + 1))
    tx.set(row, ("obs", "run:" + uuid.uuid4().hex), str(os.getpid()))
    if SLEEP:
        time.sleep(SLEEP)


@app.observer(("doc", "event"), notify=percolite.STRONG, name="log_event")
def log_event(tx, row, column):
    # Writes only a cell no other run writes: nothing but the notification's
    # ack cell keeps two concurrent runs of one notification from both committing.
    wait_at_gate()
    tx.set(row, ("log", uuid.uuid4().hex), str(os.getpid()))
    if SLEEP:
        time.sleep(SLEEP)


@app.observer(("q", "bucket"), notify=percolite.WEAK, name="drain")
def drain(tx, row, column):
    tx.set(row, ("q", "drained"), "yes")
