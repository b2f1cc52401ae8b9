"""What the native-delivery tests of the SQL sinks share: the layouts they
try, and a pair of sinks fed the same batches, one through the exporter
(the Python path), one through its native path (export_queue.h, "Native
sinks"), which hands back what it declines to its own exporter as a queue
would."""

from __future__ import annotations

import pytest
from percolite._export import ExportBatch
from percolite.codecs import get_codec
from percolite.errors import SinkOwnedByOtherStore
from percolite.exporters import SequencedExport

STORE, OTHER = "a" * 32, "b" * 32

# (key codec, value codec, key columns, value columns, key of i, value of i)
LAYOUTS = {
    "str-int64": ("str", "int64", "key", "value", lambda i: f"k{i:03d}", lambda i: i * 7 - 50),
    "str-str": ("str", "str", "key", "value", lambda i: f"ké{i}", lambda i: f"v{i}" * (i % 3)),
    "bytes-bytes": ("bytes", "bytes", "key", "value", lambda i: bytes([i % 7, i]), bytes),
    "int64-float64": ("int64", "float64", "id", "x", lambda i: i - 20, lambda i: i / 3 - 1.5),
    "float64-str": ("float64", "str", "id", "name", lambda i: i * 0.5 - 3, str),
    "int64s-int64s": (
        "int64s:2",
        "int64s:3",
        ("a", "b"),
        ("x", "y", "z"),
        lambda i: (i % 4, -i),
        lambda i: (i, -i, i * i),
    ),
    "str-int64s1": ("str", "int64s:1", "key", ("v",), lambda i: f"k{i}", lambda i: (i,)),
}


class Pair:
    """The same batches into two sinks of layout ``layout``, made by
    ``make(role, key=..., columns=...)`` for the roles "python" and
    "native"; ``dump(exporter)`` reads everything a sink holds."""

    def __init__(self, make, dump, layout):
        self.kc, self.vc, key, columns, *_ = LAYOUTS[layout]
        self.key_codec, self.value_codec = get_codec(self.kc), get_codec(self.vc)
        self.python = make("python", key=key, columns=columns)
        self.native = make("native", key=key, columns=columns)
        self.dump = dump
        key_layout = (self.kc.split(":")[0], self.key_codec.length)
        value_layout = (self.vc.split(":")[0], self.value_codec.length)
        self.sink, why = self.native._native_sink(key_layout, value_layout)
        assert why == "native"
        self.declined = 0

    def raw(self, entries):
        items = []
        for key, value, seq in entries:
            tag = b"\x00" if value is None else b"\x01" + self.value_codec.encode(value)
            items.append((self.key_codec.encode(key), tag, seq))
        # As the queue hands them over: by key (its bytes), then seq.
        return sorted(items, key=lambda item: (item[0], item[2]))

    def batch(self, items, store, epoch):
        entries = ExportBatch(
            SequencedExport(
                self.key_codec.decode(k),
                None if v == b"\x00" else self.value_codec.decode(v[1:]),
                seq,
            )
            for k, v, seq in items
        )
        entries.queue, entries.store, entries.epoch = "q", store, epoch
        return entries

    def deliver(self, entries, store=STORE, epoch=1):
        items = self.raw(entries)
        self.python(self.batch(items, store, epoch))
        outcome = self.native_only(items, store, epoch)
        assert outcome == (True, None, None), outcome

    def native_only(self, items, store=STORE, epoch=1):
        outcome = self.sink.deliver(items, store, epoch)
        if outcome is None:
            self.declined += 1
            self.native(self.batch(items, store, epoch))
            return (True, None, None)
        return outcome

    def same(self):
        python, native = self.dump(self.python), self.dump(self.native)
        assert native == python
        return python

    def close(self):
        self.python.close()
        self.native.close()


def exercise(pair, layout):
    """Batches of every kind through ``pair``: new keys, the same batch
    again, newer and older values, deletions, several entries per key, keys
    brought back; returns what both sinks hold."""
    key, value = LAYOUTS[layout][4:]
    first = [(key(i), value(i), 100 + i) for i in range(40)]
    pair.deliver(first)  # creates the tables and the owner: the exporter's
    assert pair.declined == 1
    pair.deliver(first)  # delivered again
    # Newer values, older ones (ignored), deletions, several per key.
    pair.deliver(
        [(key(i), value(i + 1), 200 + i) for i in range(0, 10)]
        + [(key(i), value(i + 2), 50 + i) for i in range(10, 20)]
        + [(key(i), None, 300 + i) for i in range(20, 30)]
        + [(key(i), value(i + 3), 400 + i) for i in range(30, 35)]
        + [(key(i), value(i + 4), 410 + i) for i in range(30, 35)]
        + [(key(i), None, 420 + i) for i in range(33, 35)]
    )
    # Guard rows now exist: a deletion older than the row, a value older
    # than the guard, a newer one bringing a key back, a new key deleted.
    pair.deliver(
        [(key(0), None, 150)]
        + [(key(20), value(1), 310)]
        + [(key(21), value(2), 330)]
        + [(key(22), None, 500)]
        + [(key(50), None, 510), (key(51), value(51), 511)]
    )
    pair.deliver([(key(21), value(3), 320), (key(22), value(4), 400)])  # stale
    tables = pair.same()
    assert pair.sink.counters() == (4, 1)
    assert pair.declined == 1
    return tables


def exercise_large_values(pair, layout):
    """Values of a megabyte and empty ones (layout "bytes-bytes" or
    "str-str"); returns what both sinks hold."""
    big = b"\xff\x00" * 500_000 if layout == "bytes-bytes" else "é" * 500_000
    empty = b"" if layout == "bytes-bytes" else ""
    key = (lambda s: s.encode()) if layout == "bytes-bytes" else str
    pair.deliver([(key("a"), big, 1), (key("b"), empty, 2)])
    pair.deliver([(key("c"), big, 3), (key("d"), empty, 4), (key("a"), empty, 5)])
    tables = pair.same()
    assert len(pair.native.rows()) == 4
    assert pair.sink.counters() == (1, 1)
    return tables


def exercise_owners(pair):
    """Another store's entries and a new epoch go to the exporter, which
    refuses the one and ages the sink for the other; entries of no store
    (the exporter called directly) are applied unchecked. ``pair`` has the
    layout "str-int64"."""
    pair.deliver([("a", 1, 1)])
    items = pair.raw([("a", 2, 2)])
    assert pair.sink.deliver(items, OTHER, 1) is None
    with pytest.raises(SinkOwnedByOtherStore):
        pair.native(pair.batch(items, OTHER, 1))
    # A later epoch of the owner: its entries win whatever their seq.
    assert pair.sink.deliver(pair.raw([("a", 3, 0)]), STORE, 2) is None
    pair.deliver([("a", 3, 0)], epoch=2)
    assert pair.native.rows() == {"a": 3}
    pair.deliver([("a", 4, 1)], epoch=2)
    pair.same()
    assert pair.sink.counters()[0] == 1
    pair.deliver([("b", 4, 1)], store="")
    pair.same()
    assert pair.sink.counters()[0] == 2
