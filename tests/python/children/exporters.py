"""Children of test_exporters.py and test_exporters_jsonlines.py: the built-in
exporters used from several processes at once, and without psycopg.

``percolite.exporters`` is imported inside each function, so that
:func:`postgres_without_psycopg` can hide psycopg before that import.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _exporter(kind, location, table):
    import percolite.exporters

    if kind == "sqlite":
        return percolite.exporters.SQLite(location, table)
    if kind == "postgres":
        return percolite.exporters.Postgres(location, table)
    return percolite.exporters.JSONLines(location)


def export_batches(kind, location, table, batches_file, ready_file, go_file):
    """Exports the batches of ``batches_file`` (JSON lists of entries) with an
    exporter of ``kind`` ("sqlite", "postgres" or JSON Lines otherwise),
    started together with other processes (touches ``ready_file``, then
    waits for ``go_file``)."""
    from percolite._export import SequencedExport

    batches = [[SequencedExport(*e) for e in batch] for batch in json.load(open(batches_file))]
    exporter = _exporter(kind, location, table)
    open(ready_file, "w").close()
    while not os.path.exists(go_file):  # start together, so that the two really race
        time.sleep(0.001)
    for batch in batches:
        exporter(batch)
    exporter.close()


def export_across_fork(kind, location, table, batches_file):
    """``batches_file`` holds three shares of batches: the first is exported
    before a fork (so the parent has an open connection), then the parent
    and the forked child export one share each at once, then the parent
    exports the first share again on its pooled connection."""
    from percolite._export import SequencedExport

    first, parent_share, child_share = [
        [[SequencedExport(*e) for e in batch] for batch in share]
        for share in json.load(open(batches_file))
    ]
    exporter = _exporter(kind, location, table)
    for batch in first:
        exporter(batch)  # the parent has an open connection now
    pid = os.fork()
    if pid == 0:
        try:
            for batch in child_share:
                exporter(batch)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    for batch in parent_share:
        exporter(batch)
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"the forked child failed: status {status}"
    for batch in first:
        exporter(batch)  # the parent's pooled connection still works
    exporter.close()


def native_across_fork(kind, location, table, store):
    """The native path of an exporter of ``kind`` across fork(): a first
    batch set up by the exporter and one applied natively (the parent keeps
    a connection open); then the parent and a forked child each apply 40
    keys natively at once, the child on its own connection; then the parent
    applies one more on the connection it kept. Keys ``p<i>`` and ``c<i>``
    get the value ``i``."""
    from percolite._export import ExportBatch, SequencedExport

    def raw(prefix, values, seq):
        return [
            (f"{prefix}{i:03d}".encode(), b"\x01" + i.to_bytes(8, "big", signed=True), seq + i)
            for i in values
        ]

    exporter = _exporter(kind, location, table)
    sink, why = exporter._native_sink(("str", 0), ("int64", 0))
    assert why == "native", why
    first = ExportBatch([SequencedExport("p000", 0, 1)])
    first.queue, first.store, first.epoch = "q", store, 1
    exporter(first)  # the tables and the owner
    assert sink.deliver(raw("p", [1], 1), store, 1) == (True, None, None)
    pid = os.fork()
    if pid == 0:
        try:
            for i in range(40):
                assert sink.deliver(raw("c", [i], 1000), store, 1) == (True, None, None)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    for i in range(2, 40):
        assert sink.deliver(raw("p", [i], 1), store, 1) == (True, None, None)
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"the forked child failed: status {status}"
    assert sink.deliver(raw("p", [0], 5000), store, 1) == (True, None, None)
    applied, declined = sink.counters()
    assert (applied, declined) == (40, 0), (applied, declined)
    exporter.close()


def new_sqlite_file_race(directory, rounds, processes):
    """Each round, ``processes`` forked processes export one entry each to a
    new SQLite file at the same moment; every export must succeed."""
    import percolite.exporters
    from percolite._export import SequencedExport

    failures = 0
    for round in range(rounds):
        path = os.path.join(directory, f"race{round}.sqlite")
        go_read, go_write = os.pipe()
        children = []
        for index in range(processes):
            pid = os.fork()
            if pid == 0:
                os.close(go_write)
                os.read(go_read, 1)  # all start at once, when the pipe closes
                try:
                    with percolite.exporters.SQLite(path, "t") as exporter:
                        exporter([SequencedExport(f"k{index}", index, index)])
                except BaseException as exc:
                    print(f"round {round}, process {index}: {exc!r}", file=sys.stderr)
                    os._exit(1)
                os._exit(0)
            children.append(pid)
        os.close(go_read)
        os.close(go_write)
        failures += sum(os.waitpid(pid, 0)[1] != 0 for pid in children)
        with percolite.exporters.SQLite(path, "t") as exporter:
            rows = exporter.rows()
        assert rows == {f"k{i}": i for i in range(processes)}, rows
    assert failures == 0, f"{failures} exports failed"


def read_then_close(path):
    """Reads the SQLite database ``path`` and closes the connection: the
    last connection to close checkpoints and deletes the WAL, when no other
    process holds the database (its SQLite connections' locks)."""
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
    conn.close()


def postgres_without_psycopg():
    """Constructs a Postgres exporter with psycopg hidden; prints the
    ImportError."""
    sys.modules["psycopg"] = None
    import percolite.exporters

    try:
        percolite.exporters.Postgres("host=x", "t")
    except ImportError as exc:
        print(exc)
