"""The combine queue (Fluo Recipes' Combine Queue; contract in
cpp/include/percolite/combine_queue.h): combiners, get and scan, declarations,
and the bytes cq.add stores.

Anything that runs workers runs in a child interpreter with a timeout
(``_isolated.run_child_json``; the code is in children/combine_queue.py): a
hang fails one test instead of the suite. The children print JSON; the checks
run here, in the test process (_combine_checks.py says how the change
observers record committed reports). The two guarantees under concurrency
are tested in test_combine_queue_changes.py, bad input in
test_combine_queue_bad_input.py, linger in test_combine_queue_linger.py.
"""

from __future__ import annotations

import enum
import math
from collections import Counter, defaultdict

import children.combine_queue
import percolite
import pytest
from _combine_checks import assert_both_guarantees, chain_violations, reference_sums
from _isolated import run_child_json
from conftest import open_store
from percolite import _core
from percolite._queue_rows import PACKED_FAMILIES, packed_entries

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def child(scenario, backend: str, timeout: float = 60, **params):
    """Runs ``scenario`` (of children/combine_queue.py) on a store of ``backend``
    with ``params``; returns its JSON."""
    return run_child_json(scenario, backend, timeout=timeout, **params)


# -- combiners ---------------------------------------------------------------------

BIG = 1 << 40
NATIVE_PHASES = [
    [
        ("isum", [("a", 1), ("a", 2), ("b", BIG + 3), ("z", 5)]),
        ("isum", [("a", -10), ("b", -(1 << 50)), ("z", -5), ("c", 1)]),
        ("isum", [("d", INT64_MAX), ("e", INT64_MIN)]),
        ("fsum", [("a", 0.5), ("b", -1.25), ("z", 0.75)]),
        ("fsum", [("a", 0.25), ("b", 2**-20), ("z", -0.5), ("z", -0.25)]),
        ("tsum", [("a", (1, -1)), ("b", (1, 2)), ("c", (1, 0))]),
        ("tsum", [("a", (2, 3)), ("b", (-1, -2)), ("c", (-1, 5))]),
        ("imax", [("a", -5), ("a", 3), ("b", -7), ("c", INT64_MIN)]),
        ("imax", [("a", -1), ("b", -9)]),
        ("imin", [("a", -5), ("a", 3), ("b", 7), ("c", INT64_MAX)]),
        ("imin", [("a", -1), ("b", 9)]),
        ("fmax", [("a", -2.5), ("a", 1.5), ("b", -1e300)]),
        ("fmin", [("a", -2.5), ("a", 1.5), ("b", 1e300)]),
        ("tmax", [("a", (1, -5))]),
        ("tmax", [("a", (-1, 7))]),
        ("tmin", [("a", (1, -5))]),
        ("tmin", [("a", (-1, 7))]),
        ("ilast", [("a", 1), ("b", 10)]),
        ("ilast", [("a", -2)]),
        ("ilast", [("a", 0), ("c", 0)]),
        ("slast", [("a", "first")]),
        ("slast", [("a", "second"), ("b", "")]),
        ("jlast", [("a", {"x": [1]})]),
        ("jlast", [("a", [None, "two"])]),
    ],
    [
        # Phase 2 combines with the current values.
        ("isum", [("a", 7), ("b", 1 << 50), ("c", -1), ("d", -1), ("e", 1)]),
        ("isum", [("b", -BIG - 3)]),
        ("fsum", [("a", -0.75), ("b", 1.0)]),
        ("tsum", [("a", (-3, -2)), ("c", (0, -5))]),
        ("imax", [("a", 2), ("b", -8)]),
        ("imin", [("a", -4), ("b", 8)]),
        ("fmax", [("a", 1.0), ("b", -1e299)]),
        ("fmin", [("a", -3.0)]),
        ("tmax", [("a", (0, 8))]),
        ("tmin", [("a", (2, -6))]),
        ("ilast", [("a", 5)]),
        ("ilast", [("a", 6)]),
        ("slast", [("b", "third")]),
        ("jlast", [("a", [None, "two"])]),
    ],
]


def test_native_combiners_combine_exactly(backend, tmp_path):
    """sum over int64 / float64 / int64s:2 (elementwise, zero deletes), max,
    min (signed, elementwise for tuples), last (commit order), in two phases
    so that the current value takes part; and changes are reported only when
    the value changed."""
    r = child(children.combine_queue.native, backend, db=tmp_path / "db", phases=NATIVE_PHASES)
    p1, p2 = r["phase0"], r["phase1"]
    for p in (p1, p2):
        assert p["result"]["idle"] and p["result"]["failures"] == 0, p["result"]
    assert p1["values"] == {
        "isum": {
            '"a"': -7,
            '"b"': BIG + 3 - (1 << 50),
            '"c"': 1,
            '"d"': INT64_MAX,
            '"e"': INT64_MIN,
        },
        "fsum": {'"a"': 0.75, '"b"': -1.25 + 2**-20},
        "tsum": {'"a"': [3, 2], '"c"': [0, 5]},
        "imax": {'"a"': 3, '"b"': -7, '"c"': INT64_MIN},
        "imin": {'"a"': -5, '"b"': 7, '"c"': INT64_MAX},
        "fmax": {'"a"': 1.5, '"b"': -1e300},
        "fmin": {'"a"': -2.5, '"b"': 1e300},
        "tmax": {'"a"': [1, 7]},
        "tmin": {'"a"': [-1, -5]},
        "ilast": {'"a"': 0, '"b"': 10, '"c"': 0},
        "slast": {'"a"': "second", '"b"': ""},
        "jlast": {'"a"': [None, "two"]},
    }
    assert p2["values"] == {
        "isum": {'"d"': INT64_MAX - 1, '"e"': INT64_MIN + 1},  # a, b, c sum to zero
        "fsum": {'"b"': -0.25 + 2**-20},
        "tsum": {},  # (3, 2) + (-3, -2) and (0, 5) + (0, -5) are all-zero: deleted
        "imax": {'"a"': 3, '"b"': -7, '"c"': INT64_MIN},
        "imin": {'"a"': -5, '"b"': 7, '"c"': INT64_MAX},
        "fmax": {'"a"': 1.5, '"b"': -1e299},
        "fmin": {'"a"': -3.0, '"b"': 1e300},
        "tmax": {'"a"': [1, 8]},
        "tmin": {'"a"': [-1, -6]},
        "ilast": {'"a"': 6, '"b"': 10, '"c"': 0},
        "slast": {'"a"': "second", '"b"': "third"},
        "jlast": {'"a"': [None, "two"]},
    }
    reports = r["reports"]
    # Unchanged values are not reported: max/min updates that lose, and a
    # "last" update equal to the current value.
    assert len(reports["imax"]['"a"']) == 1 and len(reports["imin"]['"b"']) == 1
    assert len(reports["jlast"]['"a"']) == 1
    # Deleting a key is reported as a change to None.
    assert reports["isum"]['"a"'][-1][1:] == [-7, None]
    assert reports["tsum"]['"a"'][-1][1:] == [[3, 2], None]
    assert reports["fsum"]['"a"'][-1][1:] == [0.75, None]
    for name, final in p2["values"].items():
        assert chain_violations(reports[name], final) == [], name


def test_int64_overflow_in_sum_is_a_visible_failure_not_a_wraparound(backend, tmp_path):
    r = child(children.combine_queue.overflow, backend, db=tmp_path / "db")
    assert r["before"]["idle"] and r["before"]["failures"] == 0
    assert r["idle"] is False, "the overflowing buckets stay pending"
    assert r["failures"]["ov"] >= 4 and r["failures"]["ovt"] >= 2
    for q in ("ov", "ovt"):
        assert "overflow" in r["errors"][q], r["errors"][q]
    assert r["got"] == {"big": INT64_MAX, "small": INT64_MIN, "t": [0, INT64_MAX], "x": 3}
    assert r["queued"] == {"ov": 2, "ovt": 1, "fine": 0}, "nothing consumed, nothing lost"
    assert r["pending"] == r["failing_buckets"], "the failing buckets stay notified"
    assert r["failures"]["fine"] == 0 and r["errors"]["fine"] is None


def test_python_combiner_that_raises_is_retried_and_nothing_is_lost(backend, tmp_path):
    """While the combiner raises, runs fail (visible in status() with the
    traceback), values stay untouched and updates stay queued; once it stops
    raising, values are exact. The combiner returns None for a zero sum,
    which deletes the key; a combiner returning a value the codec cannot
    encode is a failure too."""
    r = child(children.combine_queue.python_combiner, backend, db=tmp_path / "db")
    assert r["failures"] >= 5
    assert "Traceback" in r["last_error"]
    assert "RuntimeError: combiner exploded on p" in r["last_error"]
    assert "in total" in r["last_error"], "the traceback names the combiner"
    assert r["during"]["values"] == {}, "a failing run commits nothing"
    assert r["during"]["queued"] == 80 * 3, "all updates still queued"
    assert r["during"]["pending"] > 0
    assert r["bad_failures"] >= 1 and "expected int" in r["bad_error"], r["bad_error"]

    assert r["queued"] == 0
    assert r["final"] == reference_sums(r["adds"])
    assert '"p00"' not in r["final"] and '"p01"' not in r["final"]
    for key in ('"p00"', '"p01"'):
        assert r["reports"][key][-1][2] is None, "deleted by the None result"
    assert_both_guarantees(r)


def test_python_combiner_gets_current_value_then_updates_in_commit_order(backend, tmp_path):
    """A combiner that concatenates lists: the final list of each key is its
    updates in commit_ts order, across threads, runs and continuations."""
    r = child(children.combine_queue.commit_order, backend, db=tmp_path / "db")
    assert r["idle"] and r["failures"] == 0, r["last_error"]
    expected = defaultdict(list)
    for _, key, item in sorted(r["adds"]):
        expected[key].append(item)
    assert r["final"] == dict(expected)
    assert r["max_values"] >= 2


def test_a_failing_change_observer_commits_nothing_and_is_retried(backend, tmp_path):
    """The change observer runs inside the processing transaction: when it
    raises, neither the new values nor its own writes commit."""
    r = child(children.combine_queue.on_change_fails, backend, db=tmp_path / "db")
    assert r["failures"] >= 4
    assert "ValueError: observer says no" in r["last_error"]
    assert r["during"] == {"values": {}, "reports": {}, "queued": 3}
    assert r["idle"]
    assert r["final"] == {'"a"': 11, '"b"': 2, '"c"': 3}
    assert chain_violations(r["reports"], r["final"]) == []
    first = {k: v[0][1] for k, v in r["reports"].items()}
    assert first == {'"a"': None, '"b"': None, '"c"': None}


def test_get_scan_and_layout(backend, tmp_path):
    """Before processing nothing is visible; updates sit in the documented
    rows of their key's bucket, one notification per bucket; after, get and
    scan (with a prefix) return the values."""
    r = child(children.combine_queue.get_scan_and_layout, backend, db=tmp_path / "db")
    assert r["before"] == {"get": None, "default": -1, "scan": []}
    assert r["rows"] == r["buckets"]
    assert r["pending"] == len(r["buckets"])
    assert r["result"]["idle"] and r["result"]["failures"] == 0
    assert r["after"]["get"] == {"apple": 11, "apricot": 2, "banana": 3, "": 4, "äpfel": 5}
    assert r["after"]["missing"] == "d"
    assert r["after"]["scan"] == [
        ["", 4],
        ["apple", 11],
        ["apricot", 2],
        ["banana", 3],
        ["äpfel", 5],
    ]
    assert r["after"]["ap"] == [["apple", 11], ["apricot", 2]]
    assert r["after"]["empty"] == []
    assert r["queued"] == 0


def test_registering_while_workers_run_is_an_error(backend, tmp_path):
    r = child(children.combine_queue.register_while_workers_run, backend, db=tmp_path / "db")
    assert set(r["errors"]) == {"queue", "on_change"}
    for message in r["errors"].values():
        assert "workers are running" in message, message
    assert sorted(r["names"]) == ["combine queue r1", "combine queue r2"]
    assert r["idle"]


def test_the_core_names_each_queue_processor_and_reads_the_name_back(tmp_path):
    # What the status, the console and `percolite retry` read in observer
    # names: the names the store runs, parsed by the core that made them. An
    # observer of the user's may contain " queue " and is still no queue's.
    app = percolite.App("names")
    app.combine_queue("totals", combiner="sum")
    app.export_queue("a queue b", exporter=lambda entries: None)
    app.observer(("f", "q"), name="my queue x")(lambda tx, row, column: None)
    with open_store("lmdb", tmp_path / "db", app=app, sync="none") as env:
        names = [o["name"] for o in env.status()["observers"]]
    parsed = {name: _core.parse_processor_name(name) for name in names}
    assert parsed == {
        "combine queue totals": ("combine queue", "totals"),
        "export queue a queue b": ("export queue", "a queue b"),
        "my queue x": None,
    }
    assert _core.QUEUE_KINDS == ("combine queue", "export queue")
    for kind in _core.QUEUE_KINDS:
        for queue_id in ("q", "a queue b", "export queue c", " "):
            name = _core.processor_name(kind, queue_id)
            assert name == f"{kind} {queue_id}"
            assert _core.parse_processor_name(name) == (kind, queue_id)
    for name in ("combine queue", "combine queue ", "Combine queue x", "export queues x", ""):
        assert _core.parse_processor_name(name) is None, name
    with pytest.raises(ValueError, match="'combine queue' or 'export queue', not 'combine'"):
        _core.processor_name("combine", "totals")


def test_accepted_declarations():
    app = percolite.App()
    app.combine_queue("flex", combiner=lambda key, values, extra=None: None)
    app.combine_queue("star", combiner=lambda *args: None)
    app.combine_queue("builtin", combiner=max)  # no signature: trusted
    app.combine_queue("last-json", combiner="last", value_codec="json")
    app.combine_queue("tuple", value_codec="int64s:3")
    app.combine_queue("float-max", combiner="max", value_codec="float64")
    app.combine_queue("codec", value_codec=percolite.codecs.int64s(2))
    app.combine_queue("one", buckets=1, buffer_size=1)
    app.combine_queue("many", buckets=999_999)
    app.combine_queue("dots.and-dashes_ünïcode")


def test_duplicate_queue_id_is_a_value_error():
    app = percolite.App()
    first = app.combine_queue("dup")
    with pytest.raises(ValueError, match="'dup'"):
        app.combine_queue("dup", combiner="max")
    assert app._queues["dup"] is first


def test_change_observer_declaration_errors():
    app = percolite.App()
    queue = app.combine_queue("c")
    with pytest.raises(TypeError):
        queue.on_change(42)
    with pytest.raises(TypeError, match=r"\(tx, changes\)"):
        queue.on_change(lambda tx: None)
    with pytest.raises(TypeError, match=r"\(tx, changes\)"):
        queue.on_change(lambda tx, changes, more: None)

    @queue.on_change
    def first(tx, changes):
        pass

    with pytest.raises(ValueError, match="already has a change observer"):

        @queue.on_change
        def second(tx, changes):
            pass


def test_change_is_a_named_tuple():
    change = percolite.Change("k", None, 3)
    assert (change.key, change.old, change.new) == ("k", None, 3)
    assert change == ("k", None, 3)


def test_int64_sum_overflow_is_unstuck_by_a_compensating_update(backend, tmp_path):
    """Regression: the native sum checked overflow after every step, so a key at
    INT64_MAX with +1 queued stayed failing even after a -1 was queued."""
    app = percolite.App()
    q = app.combine_queue("ov", buckets=1)
    env = open_store(backend, tmp_path / "db", app=app, sync="none")
    try:
        with env.transaction() as tx:
            q.add(tx, {"k": 2**63 - 1})
        assert env.process(threads=1)["idle"]
        with env.transaction() as tx:
            q.add(tx, {"k": 1})
        with env.transaction() as tx:
            q.add(tx, {"k": -1})
        assert env.process(threads=1, timeout=30)["idle"]
        with env.transaction() as tx:
            assert q.get(tx, "k") == 2**63 - 1
    finally:
        env.close()


# -- native encoding in cq.add (module.cc EncodeFast) -------------------------------
#
# With built-in key and value codecs, cq.add encodes in C++ (_core.add_native)
# and falls back to the Python codecs when that returns False. These tests pin
# the C++ encodings to the codecs' bytes and check that whatever the C++ path
# refuses behaves exactly as the Python path does.


def raw_data_cells(env, queue):
    """{encoded key: stored value bytes} of the queue's current values, read
    from the documented rows ``<id>:d:<bucket>:<key>`` (column cq:v)."""
    out = {}
    with env.transaction() as tx:
        for bucket in range(queue.buckets):
            prefix = queue._core.data_row_prefix(bucket)
            for row, _column, value in tx.scan(prefix=prefix, columns=[(b"cq", b"v")]):
                key = row[len(prefix) :]
                assert key not in out, f"key {key!r} stored in two buckets"
                assert queue._core.bucket_of(key) == bucket, f"key {key!r} in a foreign bucket"
                out[key] = value
    return out


def queued_update_values(env, queue):
    """Sorted values of the queued (not yet folded) updates: single-entry
    cells, and the entries of packed records (percolite._queue_rows)."""
    values = []
    with env.transaction() as tx:
        for _row, col, value in tx.scan(prefix=f"{queue.id}:u:"):
            if col[0] in PACKED_FAMILIES:
                values.extend(v for _k, v in packed_entries(value))
            else:
                values.append(value)
    return sorted(values)


def same_value(got, expected, codec):
    """Equal as the codec sees it (so -0.0 != 0.0 and nan == nan), and of the same type."""
    return type(got) is type(expected) and codec.encode(got) == codec.encode(expected)


FAST_CASES = {
    # name: (key codec, value codec, {key: value}); every item of the exact types
    # the C++ encoder takes, with the edges of each layout.
    "str-int64": (
        "str",
        "int64",
        {
            "": 0,
            "a": INT64_MIN,
            "ab": INT64_MAX,
            "ä\u00e9": -1,
            "\U0001f600 astral": -(1 << 40),
            "nul\x00inside": 255,
            "日本語": 1 << 32,
        },
    ),
    "bytes-float64": (
        "bytes",
        "float64",
        {
            b"": -0.0,
            b"\x00": 0.0,
            b"\x00\x00": math.inf,
            b"\x00\xff": -math.inf,
            b"\xff": 1.7976931348623157e308,
            b"big": -1e300,
            b"tiny": 5e-324,
            b"neg": -2.5,
            b"nan": math.nan,
            b"a\x00b": 0.1,
        },
    ),
    "int64-int64s:3": (
        "int64",
        "int64s:3",
        {
            0: (0, 0, 0),
            -1: (INT64_MIN, INT64_MAX, -1),
            INT64_MAX: (1, -2, 3),
            INT64_MIN: (-(1 << 62), 1 << 62, 0),
            1 << 40: (7, 7, 7),
        },
    ),
    "str-str": (
        "str",
        "str",
        {
            "empty": "",
            "astral": "\U0001f600\U0001d11e",
            "nul": "a\x00b",
            "latin": "ñé",
            "long": "x" * 5000,
            "\U0010ffff": "max code point \U0010ffff",
        },
    ),
    "str-bytes": (
        "str",
        "bytes",
        {"empty": b"", "nuls": b"\x00\x00", "ff": b"\xff\x00\x01", "all": bytes(range(256))},
    ),
    "int64-float64": ("int64", "float64", {-5: -0.0, 5: 1e-300, 0: 2.0**53 + 2}),
}


@pytest.mark.parametrize("case", sorted(FAST_CASES))
@pytest.mark.parametrize("form", ["dict", "pairs"])
def test_native_add_stores_exactly_the_codec_bytes(backend, tmp_path, case, form):
    """cq.add through the C++ encoder: the queued update cells and, after
    processing ("last" keeps an update's bytes as they are), the stored current
    values are byte for byte what the Python codecs encode; get and scan read
    back equal values of the same types, scan in encoded-key order."""
    key_codec, value_codec, items = FAST_CASES[case]
    app = percolite.App()
    queue = app.combine_queue(
        "q", buckets=8, combiner="last", key_codec=key_codec, value_codec=value_codec
    )
    kc, vc = queue.key_codec, queue.value_codec
    updates = dict(items) if form == "dict" else list(items.items())
    with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
        # The C++ path takes these inputs (else this test would not test it).
        probe = env.transaction()
        assert queue._core.add_native(probe._tx, updates, *queue._native_codecs) is True
        probe.abort()

        with env.transaction() as tx:
            queue.add(tx, updates)
        assert queued_update_values(env, queue) == sorted(vc.encode(v) for v in items.values())
        assert env.process(threads=1, timeout=30)["idle"]
        assert raw_data_cells(env, queue) == {kc.encode(k): vc.encode(v) for k, v in items.items()}
        with env.transaction() as tx:
            for key, value in items.items():
                assert same_value(queue.get(tx, key), value, vc), key
            scanned = list(queue.scan(tx))
    assert [kc.encode(k) for k, _ in scanned] == sorted(kc.encode(k) for k in items)
    for key, value in scanned:
        assert type(key) is type(next(iter(items)))
        assert same_value(value, items[key], vc), key
    if value_codec == "float64" and b"" in items:
        assert math.copysign(1.0, dict(scanned)[b""]) == -1.0, "-0.0 keeps its sign"


class Color(enum.IntEnum):
    RED = 1
    BLUE = -(1 << 40)


class Name(str):
    pass


# (id, queue options, a function making the updates, what happens). What
# happens: "ok", or (error type, words of its message): the queue and the key.
# Each input is one the C++ encoder must refuse or take exactly as the codecs.
Q = "combine queue 'q'"
FALLBACK_CASES = [
    ("bool value", {}, lambda: {"k": True}, (TypeError, [Q, "True", "key 'k'"])),
    (
        "bool after good values",
        {},
        lambda: [("a", 1), ("b", 2), ("k", False)],
        (TypeError, [Q, "False", "key 'k'"]),
    ),
    ("IntEnum value", {}, lambda: {"k": Color.BLUE, "r": Color.RED}, "ok"),
    ("IntEnum key", {"key_codec": "int64"}, lambda: {Color.RED: 5}, "ok"),
    ("int above int64", {}, lambda: {"a": 1, "k": INT64_MAX + 1}, (ValueError, [Q, "key 'k'"])),
    ("int below int64", {}, lambda: [("k", INT64_MIN - 1)], (ValueError, [Q, "key 'k'"])),
    ("huge int", {}, lambda: {"k": 1 << 200}, (ValueError, [Q, "key 'k'"])),
    ("float for int64", {}, lambda: {"k": 1.0}, (TypeError, [Q, "key 'k'"])),
    ("str for int64", {}, lambda: {"k": "1"}, (TypeError, [Q, "key 'k'"])),
    ("None value", {}, lambda: {"k": None}, (TypeError, [Q, "key 'k'"])),
    ("int for float64", {"value_codec": "float64"}, lambda: {"k": 3, "j": -(1 << 60)}, "ok"),
    # float(1 << 2000) raises OverflowError in the Python codec, which
    # encode_or_raise does not reword (it names neither queue nor key): as before.
    (
        "huge int for float64",
        {"value_codec": "float64"},
        lambda: {"k": 1 << 2000},
        (OverflowError, []),
    ),
    ("bool for float64", {"value_codec": "float64"}, lambda: {"k": True}, (TypeError, [Q])),
    ("list for int64s", {"value_codec": "int64s:3"}, lambda: {"k": [1, -2, INT64_MIN]}, "ok"),
    ("bool in int64s", {"value_codec": "int64s:3"}, lambda: {"k": (1, True, 3)}, (TypeError, [Q])),
    ("short int64s", {"value_codec": "int64s:3"}, lambda: {"k": (1, 2)}, (ValueError, [Q])),
    ("long int64s", {"value_codec": "int64s:3"}, lambda: {"k": [1, 2, 3, 4]}, (ValueError, [Q])),
    (
        "overflow in int64s",
        {"value_codec": "int64s:3"},
        lambda: {"k": (1, 2, 1 << 63)},
        (ValueError, [Q, "key 'k'"]),
    ),
    ("int for int64s", {"value_codec": "int64s:3"}, lambda: {"k": 3}, (TypeError, [Q])),
    (
        "lone surrogate key",
        {},
        lambda: {"ok": 1, "bad\ud800": 1},
        (ValueError, [Q, "key 'bad\\ud800'"]),
    ),
    (
        "lone surrogate value",
        {"value_codec": "str"},
        lambda: {"k": "\udfff"},
        (ValueError, [Q, "key 'k'"]),
    ),
    ("bytes key for str", {}, lambda: {b"k": 1}, (TypeError, [Q, "key b'k'"])),
    ("int key for str", {}, lambda: [(7, 1)], (TypeError, [Q, "key 7"])),
    ("str subclass key", {}, lambda: {Name("k"): 1}, "ok"),
    ("bytearray key", {"key_codec": "bytes"}, lambda: [(bytearray(b"k\x00"), 1)], "ok"),
    ("memoryview value", {"value_codec": "bytes"}, lambda: {"k": memoryview(b"v\x00")}, "ok"),
    ("str key for bytes", {"key_codec": "bytes"}, lambda: {"k": 1}, (TypeError, [Q, "key 'k'"])),
    ("generator of pairs", {}, lambda: (p for p in [("a", 1), ("b", -1)]), "ok"),
    ("tuple of pairs", {}, lambda: (("a", 1), ("b", 2)), "ok"),
    ("list of lists", {}, lambda: [["a", 1], ["b", 2]], "ok"),
    ("Counter", {}, lambda: Counter({"a": 2, "b": -3}), "ok"),
    ("dict items view", {}, lambda: {"a": 1}.items(), "ok"),
    (
        "a triple in the list",
        {},
        lambda: [("a", 1), ("b", 2, 3)],
        (TypeError, ["combine queue 'q'", "(key, update) pairs", "('b', 2, 3)"]),
    ),
    ("not a pair", {}, lambda: ["abc"], (TypeError, ["combine queue 'q'", "pairs, not 'abc'"])),
    ("not iterable", {}, lambda: 5, (TypeError, ["int"])),
]


def _add_outcome(backend, store, options, updates, python_only):
    """Add ``updates`` to queue "q" in a new store of ``backend``, in a
    transaction that also writes another cell and then commits. Returns
    ("ok", queued update values, stored current values after processing) or
    (error type, message); checks that a raising add queued nothing while the
    rest of its transaction committed."""
    app = percolite.App()
    queue = app.combine_queue("q", buckets=4, **options)
    if python_only:
        queue._native_codecs = None  # the Python codecs, as before the C++ path existed
    with open_store(backend, store, app=app, sync="none") as env:
        tx = env.transaction()
        tx.set("other", ("f", "q"), "x")
        try:
            queue.add(tx, updates)
        except Exception as e:  # any error: compared with the Python path's below
            tx.commit()
            with env.transaction() as check:
                assert queue.depth(check) == 0, "an add that raised queued something"
                assert check.get("other", ("f", "q")) == b"x"
            assert env.status()["pending"] == 0, "no bucket was notified"
            return (type(e), str(e))
        tx.commit()
        values = queued_update_values(env, queue)
        assert values, "the add queued nothing"
        assert env.process(threads=1, timeout=30)["idle"]
        return ("ok", values, raw_data_cells(env, queue))


@pytest.mark.parametrize(
    ("options", "make", "outcome"),
    [case[1:] for case in FALLBACK_CASES],
    ids=[case[0] for case in FALLBACK_CASES],
)
def test_inputs_off_the_native_path_behave_as_the_python_codecs(
    backend, tmp_path, options, make, outcome
):
    """Inputs the C++ encoder refuses (add_native returns False and queues
    nothing) go through the Python codecs: they work exactly as before the C++
    path existed (the same bytes queued and stored) or raise the same error,
    naming the queue and the key, with nothing queued. The few it may take
    (IntEnum, a str subclass, a list for int64s) must give the Python bytes."""
    options = {"combiner": "last", **options}
    got = _add_outcome(backend, tmp_path / "native", options, make(), python_only=False)
    expected = _add_outcome(backend, tmp_path / "python", options, make(), python_only=True)
    assert got == expected
    if outcome == "ok":
        assert got[0] == "ok", got
    else:
        error, words = outcome
        assert got[0] is error, got
        for word in words:
            assert word in got[1], (word, got[1])


def test_add_native_refuses_without_queuing(backend, store_path):
    """The C++ encoder returns False for anything not of the codecs' exact
    kinds (bool is not an int64, an int not a float64, ...) and then has
    queued nothing, even after encoding the items before the refused one."""
    app = percolite.App()
    ints = app.combine_queue("i", buckets=2)
    floats = app.combine_queue("f", buckets=2, value_codec="float64")
    tuples = app.combine_queue("t", buckets=2, value_codec="int64s:2")
    raw = app.combine_queue("b", buckets=2, key_codec="bytes", value_codec="bytes", combiner="last")
    refused = [
        (ints, [("a", 1), ("b", True)]),
        (ints, {"a": 1, "b": 1 << 63}),
        (ints, {"a": 1, 2: 1}),
        (ints, [("a", 1), ["b", 1]]),
        (ints, [("a", 1), ("b", 1, 2)]),
        (ints, (("a", 1),)),
        (ints, Counter({"a": 1})),
        (ints, {"a\ud800": 1}),
        (floats, {"a": 1.5, "b": 2}),
        (tuples, {"a": (1, 2), "b": (1, False)}),
        (tuples, {"a": (1, 2), "b": (1, 2, 3)}),
        (raw, [(b"a", b"1"), (bytearray(b"b"), b"2")]),
        (raw, {b"a": b"1", b"b": memoryview(b"2")}),
    ]
    with open_store(backend, store_path, app=app, sync="none") as env:
        for queue, updates in refused:
            tx = env.transaction()
            assert queue._core.add_native(tx._tx, updates, *queue._native_codecs) is False
            tx.commit()
        assert env.status()["pending"] == 0
        with env.transaction() as tx:
            assert [q.depth(tx) for q in (ints, floats, tuples, raw)] == [0, 0, 0, 0]


# -- scan over bucket-local values (rows <id>:d:<bucket>:<key>) --------------------


def _scan_keys():
    """Keys that prefix each other, with NULs, 0xff, non-ASCII and long ones."""
    keys = {f"k{i:04d}" for i in range(0, 600, 3)}
    keys |= {"", "a", "a\x00", "a\x00b", "ab", "abc", "b", "\x7f", "é", "\U0001f600", "\x00"}
    keys |= {"p" + "x" * n for n in range(0, 40, 7)}
    keys |= {"long:" + "y" * 600 + str(i) for i in range(3)}  # past the inline key limit
    return sorted(keys)


def test_scan_merges_many_buckets_in_encoded_key_order(backend, tmp_path):
    """64 buckets: scan returns every key exactly once, in the order of the
    encoded keys, with the right value; a prefix keeps exactly the keys whose
    encoding starts with the prefix's; each value sits in its key's bucket
    row; another App declaring the same queue reads the same, in the store
    and, where the store outlives its handle, after reopening it."""
    keys = _scan_keys()
    expected = {k: i + 1 for i, k in enumerate(keys)}

    def declare():
        app = percolite.App()
        return app, app.combine_queue("s", buckets=64, buffer_size=7)

    app, queue = declare()
    with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
        for start in range(0, len(keys), 50):
            with env.transaction() as tx:
                queue.add(tx, {k: expected[k] for k in keys[start : start + 50]})
        assert env.process(threads=2, timeout=60)["idle"]
        cells = raw_data_cells(env, queue)
        assert len({queue.bucket_of(k) for k in keys}) > 40, "keys spread over the buckets"

        with env.transaction() as tx:
            scanned = list(queue.scan(tx))
            prefixed = {p: list(queue.scan(tx, prefix=p)) for p in ("a", "k01", "p", "", "zz")}
            got = {k: queue.get(tx, k) for k in keys}
            _, again = declare()
            assert list(again.scan(tx)) == scanned
        persistent = env.capabilities["persistent"]
    encoded_order = sorted(keys, key=lambda k: k.encode("utf-8"))
    assert [k for k, _ in scanned] == encoded_order
    assert dict(scanned) == expected == got
    assert cells == {k.encode("utf-8"): v.to_bytes(8, "big") for k, v in expected.items()}
    for prefix, pairs in prefixed.items():
        want = [(k, expected[k]) for k in encoded_order if k.startswith(prefix)]
        assert pairs == want, prefix
    assert len(prefixed["k01"]) == 33 and prefixed["zz"] == []

    if not persistent:
        return  # a memory store is gone with its handle: nothing to reopen
    app, queue = declare()
    with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
        with env.transaction() as tx:
            assert list(queue.scan(tx)) == scanned
            assert list(queue.scan(tx, prefix="a")) == prefixed["a"]
            assert {k: queue.get(tx, k) for k in keys} == expected


def test_scan_orders_int64_keys_by_their_encoding(backend, store_path):
    """int64 keys encode big-endian two's complement: scan yields 0..max,
    then min..-1 (the encoded order), each key once, across 16 buckets."""
    keys = [0, 1, 2, 255, 256, 1 << 40, INT64_MAX, INT64_MIN, -(1 << 40), -256, -2, -1]
    app = percolite.App()
    queue = app.combine_queue("n", buckets=16, key_codec="int64", combiner="last")
    with open_store(backend, store_path, app=app, sync="none") as env:
        with env.transaction() as tx:
            queue.add(tx, {k: k // 3 for k in reversed(keys)})
        assert env.process(threads=1, timeout=30)["idle"]
        with env.transaction() as tx:
            assert list(queue.scan(tx)) == [(k, k // 3) for k in keys]
            assert list(queue.scan(tx, prefix=1 << 40)) == [(1 << 40, (1 << 40) // 3)]
    with pytest.raises(ValueError, match="no such bucket"):
        queue._core.data_row_prefix(16)
