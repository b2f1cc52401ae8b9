"""The app the console tests show: an observer that fails on some rows, a
combine queue with a change observer feeding an export queue, whose sink is
a JSON Lines file. Run by ``percolite worker children.console_app:app``.

Environment: ``CONSOLE_FIXED`` names a file; while it exists, the rows that
fail ("bad...") succeed (the cause fixed, so a retry empties the parked
work). ``CONSOLE_SINK`` is the sink's file. ``CONSOLE_DELAY`` slows each run
of the observer (seconds), so a backlog drains visibly.
"""

from __future__ import annotations

import os
import tempfile
import time

import percolite
from percolite.exporters import JSONLines


def make_app(sink: str) -> percolite.App:
    app = percolite.App("shop")
    totals = app.combine_queue(
        "totals", buckets=4, combiner="sum", key_codec="str", value_codec="int64"
    )
    out = app.export_queue("out", JSONLines(sink), buckets=2, key_codec="str", value_codec="int64")

    @totals.on_change
    def changed(tx, changes):
        for change in changes:
            out.add(tx, change.key, change.new)

    @app.observer(("order", "item"), name="count", max_attempts=1)
    def count(tx, row, column):
        delay = float(os.environ.get("CONSOLE_DELAY", "0"))
        if delay:
            time.sleep(delay)
        fixed = os.environ.get("CONSOLE_FIXED")
        if row.startswith(b"bad") and not (fixed and os.path.exists(fixed)):
            raise ValueError(f"cannot parse order {row.decode()}")
        tx.set(row, ("seen", "at"), b"1")
        totals.add(tx, {tx.get(row, column).decode(): 1})

    return app


app = make_app(os.environ.get("CONSOLE_SINK", os.path.join(tempfile.gettempdir(), "sink.jsonl")))


def load(env, orders: int, bad: int = 1) -> None:
    """``orders`` orders of 5 products, and ``bad`` that fail."""
    with env.transaction() as tx:
        for i in range(orders):
            tx.set(f"o{i:05d}", ("order", "item"), f"p{i % 5}")
        for i in range(bad):
            tx.set(f"bad{i}", ("order", "item"), "p0")
