"""Word counts -> histogram of counts: the application the two worker
processes of test_combine_queue_processes.py run
(``percolite worker children.combine_app:app``).

Each change observer records every reported change (and the worker's pid)
inside the processing transaction, as test_combine_queue's children do.
"""

from __future__ import annotations

import collections
import json
import os
import time

import percolite

# Seconds each word-change run waits (test_combine_queue_processes.py sets
# it): the work then outlasts the moment the second worker process joins
# the lease table, so both processes take buckets however fast the machine.
CHANGE_DELAY = float(os.environ.get("COMBINE_APP_CHANGE_DELAY", "0"))

app = percolite.App("combine")
words = app.combine_queue("wc", buckets=8, buffer_size=3)
hist = app.combine_queue("hist", buckets=4, buffer_size=2, key_codec="int64")


def record(tx, changes, tag):
    for c in changes:
        tx.set(
            f"log:{tag}:{json.dumps(c.key)}",
            ("r", f"{tx.start_ts:020d}"),
            json.dumps([c.old, c.new, os.getpid()]),
        )


@words.on_change
def word_changed(tx, changes):
    if CHANGE_DELAY:
        time.sleep(CHANGE_DELAY)
    record(tx, changes, "w")
    update = collections.Counter()
    for c in changes:
        if c.old is not None:
            update[c.old] -= 1
        if c.new is not None:
            update[c.new] += 1
    hist.add(tx, {count: n for count, n in update.items() if n})


@hist.on_change
def hist_changed(tx, changes):
    record(tx, changes, "h")
