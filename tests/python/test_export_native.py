"""Native delivery to the SQLite sink (export_queue.h, "Native sinks"): an
export queue whose exporter is a plain percolite.exporters.SQLite and whose
codecs are fixed hands its batches to the core, which applies them from the
queued bytes through the SQLite library Python's sqlite3 module loaded.
Every batch must leave the sink row for row as the exporter's Python path
leaves it, seq guard and guard table included; whatever the native path is
not sure to do the same way goes to the exporter."""

from __future__ import annotations

import _sqlite3
import sqlite3

import percolite
import pytest
from _native_pair import (
    LAYOUTS,
    STORE,
    Pair,
    exercise,
    exercise_large_values,
    exercise_owners,
)
from percolite import _core
from percolite.exporters import SQLite


def dump(path, table):
    """Everything of the sink: main and guard tables, with each cell's type."""
    conn = sqlite3.connect(path)
    try:
        out = {}
        for name in (table, f"{table}_seq", f"{table}_owner"):
            columns = [row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')]
            types = [f'typeof("{c}")' for c in columns]
            out[name] = (
                columns,
                sorted(
                    conn.execute(f'SELECT *, {", ".join(types)} FROM "{name}"').fetchall(),
                    key=repr,
                )
                if columns
                else None,
            )
        return out
    finally:
        conn.close()


def sqlite_pair(tmp_path, layout, **options):
    """A Pair of SQLite sinks, each on a file of its own in ``tmp_path``."""

    def make(role, **columns):
        return SQLite(tmp_path / f"{role}.sqlite", "t", **columns, **options)

    return Pair(make, lambda exporter: dump(exporter.path, "t"), layout)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_native_delivery_leaves_the_sink_as_the_python_path_does(tmp_path, layout):
    pair = sqlite_pair(tmp_path, layout)
    try:
        tables = exercise(pair, layout)
        guards = tables["t_seq"][1]
        assert len(guards) == 12  # 20, 22..29, 33, 34, 50 deleted (21 is back)
    finally:
        pair.close()


def test_large_values_and_empty_ones(tmp_path):
    for layout in ("bytes-bytes", "str-str"):
        pair = sqlite_pair(tmp_path, layout)
        try:
            exercise_large_values(pair, layout)
        finally:
            pair.close()
        (tmp_path / "python.sqlite").unlink()
        (tmp_path / "native.sqlite").unlink()


def test_what_the_exporter_would_refuse_goes_to_it(tmp_path):
    pair = sqlite_pair(tmp_path, "int64-float64")
    try:
        pair.deliver([(1, 1.0, 1)])
        items = pair.raw([(2, float("nan"), 2)])
        assert pair.sink.deliver(items, STORE, 1) is None
        with pytest.raises(ValueError, match="not storable"):
            pair.native(pair.batch(items, STORE, 1))
    finally:
        pair.close()
    (tmp_path / "keys").mkdir()
    pair = sqlite_pair(tmp_path / "keys", "float64-str")
    try:
        # -0.0 and 0.0 are one key to the exporter: it merges them.
        pair.deliver([(0.0, "a", 3)])
        assert pair.sink.deliver(pair.raw([(-0.0, "b", 4)]), STORE, 1) is None
        assert pair.sink.deliver(pair.raw([(float("inf"), "b", 4)]), STORE, 1) is None
    finally:
        pair.close()


def test_another_store_or_a_new_epoch_goes_to_the_exporter(tmp_path):
    pair = sqlite_pair(tmp_path, "str-int64")
    try:
        exercise_owners(pair)
        assert dump(pair.native.path, "t")["t"][1] == [
            ("a", 4, 1, "text", "integer", "integer"),
            ("b", 4, 1, "text", "integer", "integer"),
        ]
    finally:
        pair.close()


def test_a_locked_sink_is_an_outage_after_the_busy_timeout(tmp_path):
    pair = sqlite_pair(tmp_path, "str-int64", timeout=0.2)
    try:
        pair.deliver([("a", 1, 1)])
        other = sqlite3.connect(pair.native.path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            ok, message, kind = pair.sink.deliver(pair.raw([("a", 2, 2)]), STORE, 1)
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert (ok, kind) == (False, "down") and "locked" in message
        assert pair.sink.deliver(pair.raw([("a", 2, 2)]), STORE, 1) == (True, None, None)
        assert pair.native.rows() == {"a": 2}
    finally:
        pair.close()


def test_a_closed_exporter_takes_every_batch(tmp_path):
    pair = sqlite_pair(tmp_path, "str-int64")
    pair.deliver([("a", 1, 1)])
    pair.close()
    assert pair.sink.deliver(pair.raw([("a", 2, 2)]), STORE, 1) is None


def test_no_sqlite_functions_in_the_library_means_the_python_path(tmp_path, monkeypatch):
    monkeypatch.setattr(_sqlite3, "__file__", _core.__file__)
    sink = SQLite(tmp_path / "out.sqlite", "t")
    app = percolite.App("native")
    out = app.export_queue("out", sink, value_codec="int64")
    assert out.delivery.startswith("python: SQLite's functions are not visible through")
    sink.close()


def run_queue(tmp_path, exporter, rounds, key_codec="str", value_codec="int64"):
    app = percolite.App("native")
    out = app.export_queue(
        "out", exporter, key_codec=key_codec, value_codec=value_codec, batch_size=16
    )
    with percolite.open(tmp_path / "store", app=app, sync="none") as env:
        for values in rounds:
            env.run(lambda tx, values=values: [out.add(tx, k, v) for k, v in values.items()])
            assert env.process(2)["idle"]
    return out


@pytest.mark.parametrize("native", [True, False])
def test_an_export_queue_delivers_natively_unless_told_not_to(tmp_path, monkeypatch, native):
    if not native:
        monkeypatch.setenv("PERCOLITE_NATIVE_SINKS", "0")
    sink = SQLite(tmp_path / "out.sqlite", "t")
    rounds = [
        {f"k{i}": i for i in range(100)},
        {f"k{i}": None for i in range(0, 100, 3)},
        {f"k{i}": -i for i in range(0, 100, 2)},
    ]
    out = run_queue(tmp_path, sink, rounds)
    expected = {f"k{i}": -i if i % 2 == 0 else i for i in range(100) if i % 2 == 0 or i % 3}
    assert sink.rows() == expected
    assert out.delivery == ("native" if native else "python: PERCOLITE_NATIVE_SINKS=0")
    assert (out._native_sink is not None) == native
    if native:
        applied, declined = out._native_sink.counters()
        assert applied > 0 and declined >= 1  # the first batches set the sink up
    sink.close()


def test_the_delivery_says_why_a_queue_takes_the_python_path(tmp_path):
    sink = SQLite(tmp_path / "out.sqlite", "t")
    pairs = SQLite(tmp_path / "out.sqlite", "p", key=("a", "b"))
    shared = SQLite(tmp_path / "out.sqlite", "s", seq="s_seq")

    class Mine(SQLite):
        pass

    app = percolite.App("native")
    cases = {
        "custom": (lambda entries: None, "int64", "no native path"),
        "subclass": (Mine(tmp_path / "out.sqlite", "m"), "int64", "no native path"),
        "json": (sink, "json", "not all fixed"),
        "pickle": (sink, "pickle", "not all fixed"),
        "misfit": (pairs, "int64", "the key codec str does not fit the key columns"),
        "shared": (shared, "int64", "shared rows are applied by the exporter"),
        "native": (sink, "int64", None),
    }
    for name, (exporter, codec, why) in cases.items():
        out = app.export_queue(name, exporter, value_codec=codec)
        if why is None:
            assert out.delivery == "native"
        else:
            assert out.delivery.startswith("python: ") and why in out.delivery
    for exporter in (sink, pairs, shared):
        exporter.close()


class Forward:
    """A forwarding exporter, as an app writes one to pick its sink per
    process: every batch goes, unchanged, to whatever ``target`` is now."""

    def __init__(self, target):
        self.target, self.calls = target, 0

    def __call__(self, entries):
        self.calls += 1
        self.forward_to()(entries)

    def forward_to(self):
        if self.target is None:
            raise RuntimeError("no sink chosen")
        return self.target


def test_a_forwarding_exporter_is_delivered_to_natively(tmp_path):
    first = SQLite(tmp_path / "first.sqlite", "t")
    forward = Forward(first)
    rounds = [{f"k{i}": i for i in range(100)}, {f"k{i}": None for i in range(0, 100, 3)}]
    out = run_queue(tmp_path, forward, rounds)
    assert out.delivery.startswith("forwarded: ")
    assert first.rows() == {f"k{i}": i for i in range(100) if i % 3}
    applied, declined = out._native_sink.counters()
    # The forwarder takes the first batch only (it sets the sink up); the
    # core applies the other batches (16 entries each) to the sink it names.
    assert forward.calls == declined >= 1 and applied >= 5
    first.close()


@pytest.mark.parametrize("how", ["native", "forwarded", "python"])
def test_the_status_says_how_each_batch_was_delivered(tmp_path, monkeypatch, how):
    if how == "python":
        monkeypatch.setenv("PERCOLITE_NATIVE_SINKS", "0")
    sink = SQLite(tmp_path / "out.sqlite", "t")
    forward = Forward(sink)
    app = percolite.App("native")
    out = app.export_queue(
        "out", forward if how == "forwarded" else sink, value_codec="int64", batch_size=16
    )
    with percolite.open(tmp_path / "store", app=app, sync="none") as env:
        env.run(lambda tx: [out.add(tx, f"k{i}", i) for i in range(200)])
        assert env.process(2)["idle"]
        state = env.status()["sinks"]["out"]
    batches, _ = out.core.counters()
    assert state["state"] == "ok" and state["delivery"] == out.delivery
    assert state["delivery"].startswith({"python": "python: "}.get(how, how))
    assert state["native_batches"] + state["exporter_batches"] == batches >= 13
    if how == "python":
        assert state["native_batches"] == 0
    else:  # the exporter sets the sink up with the first batches, the core does the rest
        assert 1 <= state["exporter_batches"] < state["native_batches"]
    if how == "forwarded":
        assert state["exporter_batches"] == forward.calls
    assert sink.rows() == {f"k{i}": i for i in range(200)}
    sink.close()


def test_a_forwarding_exporter_may_name_another_sink_or_one_without_a_native_path(tmp_path):
    first, second = SQLite(tmp_path / "first.sqlite", "t"), SQLite(tmp_path / "second.sqlite", "t")
    seen = []
    forward = Forward(first)
    app = percolite.App("native")
    out = app.export_queue("out", forward, value_codec="int64", batch_size=16)
    with percolite.open(tmp_path / "store", app=app, sync="none") as env:

        def add(values):
            env.run(lambda tx: [out.add(tx, k, v) for k, v in values.items()])
            assert env.process(2)["idle"]

        add({f"a{i}": i for i in range(40)})
        forward.target = second
        add({f"b{i}": i for i in range(40)})
        forward.target = seen.extend  # a plain callable: the forwarder takes every batch
        calls, (applied, declined) = forward.calls, out._native_sink.counters()
        add({f"c{i}": i for i in range(40)})
        now_applied, now_declined = out._native_sink.counters()
        assert now_applied == applied and now_declined - declined == forward.calls - calls > 0
        # forward_to raises: the batch fails as the forwarder's call does
        # (retried, well before max_attempts), and is applied once it works.
        forward.target = None
        env.run(lambda tx: out.add(tx, "d", 1))
        failed = env.process(2, timeout=0.5)
        assert failed["failures"] >= 1 and not failed["idle"]
        forward.target = first
        assert env.process(2)["idle"]
    assert first.rows() == {**{f"a{i}": i for i in range(40)}, "d": 1}
    assert second.rows() == {f"b{i}": i for i in range(40)}
    assert sorted(e.key for e in seen) == sorted(f"c{i}" for i in range(40))
    first.close()
    second.close()
