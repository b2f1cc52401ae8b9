"""Native delivery to the PostgreSQL sink (export_queue.h, "Native sinks"),
on the session's real server: an export queue whose exporter is a plain
percolite.exporters.Postgres and whose codecs are fixed hands its batches
to the core, which applies each in one statement through libpq, its
parameters bound from the queued bytes. Every batch must leave the sink
row for row as the exporter's Python path leaves it, guard table included;
whatever the native path is not sure to do the same way goes to the
exporter. (The fork test runs the SQLite sink's native path too.)"""

from __future__ import annotations

import itertools
import threading
import time

import children.exporters
import percolite
import psycopg
import pytest
from _isolated import run_child
from _native_pair import (
    LAYOUTS,
    STORE,
    Pair,
    exercise,
    exercise_large_values,
    exercise_owners,
)
from percolite._export import ExportBatch
from percolite.exporters import Postgres, SequencedExport

NAMES = itertools.count()


def dump(exporter):
    """Everything of the sink: main, guard and owner tables, each cell
    with its type, in a stable order."""
    out = {}
    with psycopg.connect(exporter._dsn) as conn:
        for suffix in ("", "_seq", "_owner"):
            table = f"{exporter.table}{suffix}"
            columns = [
                row[0]
                for row in conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s)"
                    " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                    (f'"{table}"',),
                )
            ]
            if not columns:
                out[suffix] = None
                continue
            typed = ", ".join(f'"{c}", pg_typeof("{c}")::text' for c in columns)
            rows = conn.execute(f'SELECT {typed} FROM "{table}"').fetchall()
            out[suffix] = (columns, sorted(rows, key=repr))
    return out


def postgres_pair(dsn, layout, **options):
    """A Pair of Postgres sinks on the session's server, in tables of their own."""
    number = next(NAMES)

    def make(role, **columns):
        return Postgres(dsn, f"native{number}_{role}", **columns, **options)

    return Pair(make, dump, layout)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_native_delivery_leaves_the_sink_as_the_python_path_does(postgres_dsn, layout):
    pair = postgres_pair(postgres_dsn, layout)
    try:
        tables = exercise(pair, layout)
        # PostgreSQL's guard table keeps every key: 0..39, 50 and 51.
        assert len(tables["_seq"][1]) == 42
    finally:
        pair.close()


def test_large_values_and_empty_ones(postgres_dsn):
    for layout in ("bytes-bytes", "str-str"):
        pair = postgres_pair(postgres_dsn, layout)
        try:
            exercise_large_values(pair, layout)
        finally:
            pair.close()


def test_what_the_exporter_or_the_server_would_refuse_goes_to_the_exporter(postgres_dsn):
    pair = postgres_pair(postgres_dsn, "int64-float64")
    try:
        pair.deliver([(1, 1.0, 1)])
        items = pair.raw([(2, float("nan"), 2)])
        assert pair.sink.deliver(items, STORE, 1) is None
        with pytest.raises(ValueError, match="not storable"):
            pair.native(pair.batch(items, STORE, 1))
    finally:
        pair.close()
    pair = postgres_pair(postgres_dsn, "str-str")
    try:
        pair.deliver([("a", "x", 1)])
        # Text with NUL: the server refuses the statement, which writes
        # nothing; the exporter then raises its own error.
        items = pair.raw([("b", "y", 2), ("c", "z\x00", 3)])
        assert pair.sink.deliver(items, STORE, 1) is None
        with pytest.raises(psycopg.DataError, match="NUL"):
            pair.native(pair.batch(items, STORE, 1))
        assert pair.native.rows() == {"a": "x"}
        # The sink is still usable.
        pair.deliver([("b", "y", 4)])
        assert pair.sink.counters() == (1, 2)
    finally:
        pair.close()


def test_another_store_or_a_new_epoch_goes_to_the_exporter(postgres_dsn):
    pair = postgres_pair(postgres_dsn, "str-int64")
    try:
        exercise_owners(pair)
    finally:
        pair.close()


def test_a_locked_table_is_waited_for_then_written(postgres_dsn):
    pair = postgres_pair(postgres_dsn, "str-int64")
    try:
        pair.deliver([("a", 1, 1)])
        outcome = []
        with psycopg.connect(postgres_dsn) as other:
            other.execute(f'LOCK TABLE "{pair.native.table}" IN EXCLUSIVE MODE')
            worker = threading.Thread(
                target=lambda: outcome.append(
                    pair.sink.deliver(pair.raw([("a", 2, 2), ("b", 3, 3)]), STORE, 1)
                )
            )
            worker.start()
            time.sleep(0.3)
            assert worker.is_alive() and outcome == []  # waiting for the lock
            assert pair.native.rows() == {"a": 1}
        worker.join(30)
        assert outcome == [(True, None, None)]
        assert pair.native.rows() == {"a": 2, "b": 3}
    finally:
        pair.close()


def test_a_deletion_sees_the_row_a_batch_committed_while_it_waited(postgres_dsn):
    # Another writer of key "k" (seq 10) holds its guard row when the native
    # path deletes "k" (seq 20): the deletion waits for that lock, then must
    # see and delete the row the other writer committed meanwhile.
    pair = postgres_pair(postgres_dsn, "str-int64")
    try:
        pair.deliver([("a", 1, 1)])
        table, guard = pair.native.table, pair.native.guard_table
        outcome = []
        with psycopg.connect(postgres_dsn) as other:
            other.execute(f'INSERT INTO "{guard}" (key, seq) VALUES (%s, 10)', ("k",))
            other.execute(f'INSERT INTO "{table}" (key, value, seq) VALUES (%s, 1, 10)', ("k",))
            worker = threading.Thread(
                target=lambda: outcome.append(
                    pair.sink.deliver(pair.raw([("k", None, 20)]), STORE, 1)
                )
            )
            worker.start()
            time.sleep(0.3)
            assert worker.is_alive()  # waiting for the guard row
        worker.join(30)
        assert outcome == [(True, None, None)]
        assert pair.native.rows() == {"a": 1}
        with psycopg.connect(postgres_dsn) as conn:
            seqs = conn.execute(f'SELECT key, seq FROM "{guard}" ORDER BY key').fetchall()
        assert seqs == [("a", 1), ("k", 20)]
    finally:
        pair.close()


@pytest.mark.parametrize(
    ("key_type", "codec", "keys"),
    [("REAL", "float64", [0.1, -2.5, 3.0]), ("CHAR(4)", "str", ["ab", "ab  ", "cd"])],
)
def test_key_columns_that_do_not_compare_exactly_go_to_the_exporter(
    postgres_dsn, key_type, codec, keys
):
    # A REAL key holds 0.1 as another number than the batch's double; CHAR
    # pads and compares without trailing spaces. The native path would
    # match other keys than the exporter: every batch is the exporter's, and
    # the sink ends as the exporter alone leaves another such table.
    table = f"native{next(NAMES)}_lossy"
    with psycopg.connect(postgres_dsn) as conn:
        for name in (table, f"{table}_py"):
            conn.execute(
                f'CREATE TABLE "{name}" (key {key_type} PRIMARY KEY, value BIGINT, seq BIGINT)'
            )
    sink = Postgres(postgres_dsn, table)
    python = Postgres(postgres_dsn, f"{table}_py")
    made, why = sink._native_sink((codec, 0), ("int64", 0))
    assert why == "native"
    kc = percolite.codecs.get_codec(codec)
    try:
        for seq, key in enumerate(keys, start=1):
            items = [(kc.encode(key), b"\x01" + seq.to_bytes(8, "big", signed=True), seq)]
            entries = ExportBatch([SequencedExport(key, seq, seq)])
            entries.queue, entries.store, entries.epoch = "q", STORE, 1
            if made.deliver(items, STORE, 1) is None:
                sink(entries)
            python(entries)
        assert made.counters() == (0, len(keys))
        assert sink.rows() == python.rows()
    finally:
        sink.close()
        python.close()


def test_a_key_column_changed_to_a_lossy_type_is_noticed_at_the_next_batch(postgres_dsn):
    pair = postgres_pair(postgres_dsn, "float64-str")
    try:
        pair.deliver([(0.5, "a", 1)])
        pair.deliver([(0.1, "b", 2)])  # native, on a connection it keeps
        with psycopg.connect(postgres_dsn) as conn:
            for table in (pair.native.table, pair.native.guard_table):
                conn.execute(f'ALTER TABLE "{table}" ALTER COLUMN id TYPE real')
        assert pair.sink.deliver(pair.raw([(0.1, "c", 3)]), STORE, 1) is None
        assert pair.sink.counters() == (1, 2)
    finally:
        pair.close()


def test_a_prepare_that_times_out_is_not_held_against_the_table(postgres_dsn):
    # A lock_timeout while another session holds the table: that batch goes
    # to the exporter, later ones are native again.
    pair = postgres_pair(f"{postgres_dsn} options='-c lock_timeout=200'", "str-int64")
    try:
        pair.deliver([("a", 1, 1)])
        with psycopg.connect(postgres_dsn) as other:
            other.execute(f'LOCK TABLE "{pair.native.table}" IN ACCESS EXCLUSIVE MODE')
            assert pair.sink.deliver(pair.raw([("a", 2, 2)]), STORE, 1) is None
        pair.deliver([("a", 3, 3)])
        assert pair.native.rows() == {"a": 3}
        assert pair.sink.counters() == (1, 2)
    finally:
        pair.close()


def test_keys_of_both_signs_are_locked_in_the_exporters_order(postgres_dsn):
    # The queue hands keys over by their bytes (negative int64s last); the
    # exporter takes them by value. Batches of both paths over the same keys
    # at once must not deadlock.
    number = next(NAMES)
    sink = Postgres(postgres_dsn, f"native{number}_signs", key="id")
    made, why = sink._native_sink(("int64", 0), ("int64", 0))
    assert why == "native"
    kc = percolite.codecs.get_codec("int64")
    keys = [-3, -2, -1, 1, 2, 3]
    failures = []

    def batch(seq):
        entries = ExportBatch(SequencedExport(k, seq, seq * 10 + i) for i, k in enumerate(keys))
        entries.queue, entries.store, entries.epoch = "q", STORE, 1
        return entries

    sink(batch(0))

    def python_path():
        for seq in range(1, 60, 2):
            try:
                sink(batch(seq))
            except psycopg.Error as exc:
                failures.append(exc)

    def native_path():
        for seq in range(2, 60, 2):
            items = sorted(
                (kc.encode(k), b"\x01" + kc.encode(seq), seq * 10 + i) for i, k in enumerate(keys)
            )
            outcome = made.deliver(items, STORE, 1)
            if outcome != (True, None, None):
                failures.append(outcome)

    threads = [threading.Thread(target=python_path), threading.Thread(target=native_path)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert failures == []
        assert sink.rows() == {k: 59 for k in keys}
    finally:
        sink.close()


def test_a_lost_connection_is_an_outage_and_the_next_batch_reconnects(postgres_dsn):
    pair = postgres_pair(postgres_dsn, "str-int64")
    try:
        pair.deliver([("a", 1, 1)])
        pair.deliver([("a", 2, 2)])  # the sink now holds an idle connection
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'percolite native sink'"
            ).fetchall()
        assert ended == [(True,)]
        ok, message, kind = pair.sink.deliver(pair.raw([("a", 3, 3)]), STORE, 1)
        assert (ok, kind) == (False, "down")
        assert pair.native.table in message
        assert pair.native.rows() == {"a": 2}
        assert pair.sink.deliver(pair.raw([("a", 3, 3)]), STORE, 1) == (True, None, None)
        assert pair.native.rows() == {"a": 3}
    finally:
        pair.close()


def test_an_unreachable_server_is_an_outage(tmp_path):
    sink = Postgres(f"host={tmp_path} port=1 dbname=none", "t", connect_timeout=1)
    made, why = sink._native_sink(("str", 0), ("int64", 0))
    assert why == "native"
    ok, message, kind = made.deliver([(b"a", b"\x01" + bytes(8), 1)], STORE, 1)
    assert (ok, kind) == (False, "down")
    assert "cannot connect" in message and str(tmp_path) in message
    sink.close()


def test_an_unreachable_server_shows_in_status_as_an_outage(tmp_path):
    sink = Postgres(f"host={tmp_path} port=1 dbname=none", "t", connect_timeout=1)
    app = percolite.App("native")
    out = app.export_queue("out", sink, value_codec="int64")
    with percolite.open(tmp_path / "store", app=app, sync="none") as env:
        env.run(lambda tx: out.add(tx, "a", 1))
        done = env.process(1, timeout=0.5)
        state = env.status()["sinks"]["out"]
    assert not done["idle"] and done["parked"] == 0
    assert state["state"] == "failing" and state["waiting"] == 1
    assert state["last_error"]["type"] == "SinkUnavailable"
    assert "cannot connect" in state["last_error"]["message"]
    # Tries that failed as outages count as the core's, not the exporter's.
    assert state["native_batches"] >= 1 and state["exporter_batches"] == 0
    sink.close()


def test_a_table_the_statement_does_not_fit_goes_to_the_exporter(postgres_dsn):
    # A value column of type json: the exporter's driver sends text the
    # server may cast; the native statement's text[] cannot be.
    table = f"native{next(NAMES)}_json"
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute(f'CREATE TABLE "{table}" (key TEXT PRIMARY KEY, value JSON, seq BIGINT)')
    sink = Postgres(postgres_dsn, table)
    made, why = sink._native_sink(("str", 0), ("str", 0))
    assert why == "native"
    try:
        pair_batches = [[(b"a", b'\x01{"x": 1}', 1)], [(b"b", b"\x01[2]", 2)]]
        for items in pair_batches:
            if made.deliver(items, STORE, 1) is None:
                batch = ExportBatch(
                    SequencedExport(k.decode(), v[1:].decode(), seq) for k, v, seq in items
                )
                batch.queue, batch.store, batch.epoch = "q", STORE, 1
                sink(batch)
        assert sink.rows() == {"a": {"x": 1}, "b": [2]}
        # Both taken by the exporter; the second without another try.
        assert made.counters() == (0, 2)
    finally:
        sink.close()


def test_a_forked_child_delivers_natively_on_its_own_connection(target):
    exporter = target.exporter()
    run_child(
        children.exporters.native_across_fork,
        target.kind,
        target.location,
        exporter.table,
        STORE,
        timeout=60,
    )
    expected = {f"p{i:03d}": i for i in range(40)} | {f"c{i:03d}": i for i in range(40)}
    assert exporter.rows() == expected


def test_a_closed_exporter_takes_every_batch(postgres_dsn):
    pair = postgres_pair(postgres_dsn, "str-int64")
    pair.deliver([("a", 1, 1)])
    pair.close()
    assert pair.sink.deliver(pair.raw([("a", 2, 2)]), STORE, 1) is None


@pytest.mark.parametrize("native", [True, False])
def test_an_export_queue_delivers_natively_from_several_threads(
    tmp_path, postgres_dsn, monkeypatch, native
):
    if not native:
        monkeypatch.setenv("PERCOLITE_NATIVE_SINKS", "0")
    sink = Postgres(postgres_dsn, f"native{next(NAMES)}_queue")
    app = percolite.App("native")
    out = app.export_queue("out", sink, value_codec="int64", batch_size=16, buckets=8)
    rounds = [
        {f"k{i}": i for i in range(300)},
        {f"k{i}": None for i in range(0, 300, 3)},
        {f"k{i}": -i for i in range(0, 300, 2)},
    ]
    with percolite.open(tmp_path / "store", app=app, sync="none") as env:
        for values in rounds:
            env.run(lambda tx, values=values: [out.add(tx, k, v) for k, v in values.items()])
            assert env.process(2)["idle"]
        state = env.status()["sinks"]["out"]
    expected = {f"k{i}": -i if i % 2 == 0 else i for i in range(300) if i % 2 == 0 or i % 3}
    assert sink.rows() == expected
    assert state["delivery"] == ("native" if native else "python: PERCOLITE_NATIVE_SINKS=0")
    if native:
        assert 1 <= state["exporter_batches"] < state["native_batches"]
    else:
        assert state["native_batches"] == 0
    sink.close()
