"""An app whose export queue feeds a real SQLite sink that the tests of
tests/python/test_sink_failures.py take down and bring back, through files in
``$SINK_DIR``: ``down`` (every call raises ConnectionError), ``refuse``
(every call raises ValueError), ``poison`` (keys, one a line, whose batches
raise ValueError) and ``slow`` (seconds each call sleeps first); each call adds a line to
``calls``. Its worker
processes import it; the tests bind it in their own process too."""

from __future__ import annotations

import os
import time
from pathlib import Path

import percolite
from percolite.exporters import Postgres, SQLite

SINK_DIR = Path(os.environ["SINK_DIR"])
ENTRIES = int(os.environ.get("SINK_ENTRIES", "30000"))

if os.environ.get("SINK_POSTGRES"):  # a PostgreSQL sink on this server (a DSN)
    sink = Postgres(os.environ["SINK_POSTGRES"], "kv", key="k", columns="v")
else:
    sink = SQLite(
        SINK_DIR / "out.sqlite",
        "kv",
        key="k",
        columns="v",
        timeout=float(os.environ.get("SINK_TIMEOUT", "30")),
    )


def exporter(entries):
    with open(SINK_DIR / "calls", "a") as calls:  # one line per call, for the tests
        calls.write(f"{len(entries)}\n")
    slow = SINK_DIR / "slow"
    if slow.exists():
        time.sleep(float(slow.read_text()))
    if (SINK_DIR / "down").exists():
        raise ConnectionError("the sink is unreachable")
    if (SINK_DIR / "refuse").exists():
        raise ValueError("the sink refuses every entry")
    poison_file = SINK_DIR / "poison"
    poison = set(poison_file.read_text().split()) if poison_file.exists() else set()
    for entry in entries:
        if entry.key in poison:
            raise ValueError(f"cannot export {entry.key}")
    sink(entries)


# A wrapper offers its sink's take-over (Env.take_over_sink, percolite take-over).
exporter.take_over = sink.take_over  # type: ignore[attr-defined]

app = percolite.App("sinks")
out = app.export_queue(
    "out",
    exporter,
    key_codec="str",
    value_codec="int64",
    buckets=int(os.environ.get("SINK_BUCKETS", "4")),
    batch_size=int(os.environ.get("SINK_BATCH", "4096")),
    max_attempts=int(os.environ.get("SINK_ATTEMPTS", "3")),
)


def load(env: percolite.Env, times: int) -> None:
    """Queues every key ``times`` times, key i last with value i * times:
    the sink must end with those values, the latest of each key."""
    for n in range(1, times + 1):
        env.run(lambda tx, n=n: [out.add(tx, f"k{i:06d}", i * n) for i in range(ENTRIES)])


def expected(times: int) -> dict[str, int]:
    return {f"k{i:06d}": i * times for i in range(ENTRIES)}
