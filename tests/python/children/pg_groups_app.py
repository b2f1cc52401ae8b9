"""The application of test_postgresql.py's worker groups (``percolite worker
children.pg_groups_app:app``): hot keys summed by a combine queue (the native
``sum``), every changed value exported into a PostgreSQL table.

From the environment, read when imported: PG_SINK (a postgresql:// URI of the
sink's database, required), PG_SLOW (seconds each export call waits after
applying its batch, so that a kill can land mid-run) and PG_NATIVE ("1": the
export queue's exporter is the sink itself, whose batches the core applies
natively; PG_SLOW then has no effect).
"""

from __future__ import annotations

import os
import time

import percolite
from percolite.exporters import Postgres

app = percolite.App("pg_groups")
sink = Postgres(os.environ["PG_SINK"], "hot_values", key="k", columns="v")
SLOW = float(os.environ.get("PG_SLOW", "0"))

hot = app.combine_queue("hot", buckets=8, value_codec="int64", buffer_size=2000)


def slow_sink(entries):
    sink(entries)
    if SLOW:
        time.sleep(SLOW)


out = app.export_queue(
    "out",
    sink if os.environ.get("PG_NATIVE") == "1" else slow_sink,
    buckets=4,
    batch_size=50,
    value_codec="int64",
)


hot.export_to(out)
