"""The app test_simulation.py simulates: documents' words counted by a
combine queue whose changes (deltas) an export queue sends to a sink that
adds them up, as a sink keeping totals in another system would. A guarded
sink applies each key's entries only past the highest seq it applied; an
unguarded one adds whatever it is sent, so a batch sent twice (an exporter
that failed after sending, a crash before the batch was acknowledged) is
counted twice."""

from __future__ import annotations

import hashlib
import json

import percolite
from percolite.testing import Faults, simulate

TEXT = ("doc", "text")


def make_app(sink: dict, guarded: bool) -> percolite.App:
    app = percolite.App("simulated-wordcount")
    counts = app.combine_queue("counts", buckets=4, combiner="sum", value_codec="int64")
    applied: dict = {}  # the guarded sink's seq per key

    @app.export_queue("deltas", buckets=2, value_codec="int64")
    def send(entries):
        for entry in entries:
            if guarded:
                if entry.seq <= applied.get(entry.key, -1):
                    continue
                applied[entry.key] = entry.seq
            sink[entry.key] = sink.get(entry.key, 0) + entry.value

    @counts.on_change
    def changed(tx, changes):
        for change in changes:
            send.add(tx, change.key, (change.new or 0) - (change.old or 0))

    @app.observer(TEXT)
    def split(tx, row, col):
        counts.add(tx, {word: 1 for word in tx.get(row, col).decode().split()})

    app.counts = counts  # type: ignore[attr-defined]
    return app


def failing_export_app(max_attempts: int = 10) -> percolite.App:
    """An observer sending each row to an export queue whose exporter always
    refuses its entries: its key is parked after ``max_attempts`` runs. (A
    sink that is down, raising ConnectionError, would park nothing: it is
    waited for.)"""
    app = percolite.App("failing-export")

    @app.export_queue("out", buckets=1, max_attempts=max_attempts)
    def out(entries):
        raise ValueError("sink refuses the entry")

    @app.observer(TEXT)
    def send(tx, row, col):
        out.add(tx, bytes(row).decode(), 1)

    return app


def documents(n: int = 40) -> list[str]:
    return [f"w{i % 5} w{i % 3} w{(i * 7) % 11} w{i % 2}" for i in range(n)]


def load(docs: list[str]) -> list:
    return [lambda tx, i=i, d=d: tx.set(f"doc{i:03}", TEXT, d) for i, d in enumerate(docs)]


def expected(docs: list[str]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for doc in docs:
        for word in set(doc.split()):
            totals[word] = totals.get(word, 0) + 1
    return totals


FAULTS = Faults(observer_errors=0.05, conflicts=0.05, crashes=0.02, exporter_errors=0.1, delays=0.1)


def run(seed: int, guarded: bool = True, faults: Faults | None = FAULTS) -> dict:
    """One simulation: the final store's counts, the sink, the trace (and its digest)."""
    sink: dict = {}
    app = make_app(sink, guarded)
    docs = documents()
    with simulate(app, load(docs), seed=seed, faults=faults) as sim:
        with sim.env.transaction() as tx:
            counts = {word: app.counts.get(tx, word) for word in expected(docs)}
            cells = [[bytes(c).hex() for c in (r, f, q, v)] for r, (f, q), v in tx.scan()]
        trace = sim.trace
    return {
        "counts": counts,
        "sink": sink,
        "trace": trace,
        "trace_digest": hashlib.sha256("\n".join(trace).encode()).hexdigest(),
        "store_digest": hashlib.sha256(json.dumps(cells, default=repr).encode()).hexdigest(),
    }


def print_run(seed: int) -> None:
    """Prints one simulation's digests, for a run in another process."""
    result = run(seed)
    print(json.dumps({k: result[k] for k in ("trace_digest", "store_digest", "counts", "sink")}))
