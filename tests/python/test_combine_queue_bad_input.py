"""Bad input to a combine queue: updates its codecs cannot encode and
declarations it cannot honour are clear errors that queue or register
nothing (the rest of the transaction still commits)."""

from __future__ import annotations

import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from conftest import open_store

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


# -- bad input (no workers) ---------------------------------------------------------


def update_rows(env, queue_id):
    tx = env.transaction()
    try:
        return [c.row for c in tx.scan(prefix=f"{queue_id}:u:")]
    finally:
        tx.abort()


class FourByteInt(percolite.codecs.Codec):
    """Claims the int64 layout but writes 4 bytes: the core must refuse it."""

    name = "four"
    native = "int64"

    def encode(self, value):
        return int(value).to_bytes(4, "big", signed=True)

    def decode(self, data):
        return int.from_bytes(data, "big", signed=True)


BAD_UPDATES = [
    # (queue options, a good pair, the bad pair, error, words in the message)
    ({}, ("ok", 1), (5, 1), TypeError, ["key 5", "'q'", "str"]),
    ({}, ("ok", 1), (None, 1), TypeError, ["key None"]),
    ({}, ("ok", 1), (b"k", 1), TypeError, ["key b'k'"]),
    ({}, ("ok", 1), ("k", "x"), TypeError, ["'x'", "key 'k'", "int"]),
    ({}, ("ok", 1), ("k", 1.5), TypeError, ["1.5", "key 'k'"]),
    ({}, ("ok", 1), ("k", True), TypeError, ["True", "key 'k'", "bool"]),
    ({}, ("ok", 1), ("k", None), TypeError, ["None", "key 'k'"]),
    ({}, ("ok", 1), ("k", INT64_MAX + 1), ValueError, [str(INT64_MAX + 1), "key 'k'"]),
    ({}, ("ok", 1), ("k", INT64_MIN - 1), ValueError, [str(INT64_MIN - 1), "key 'k'"]),
    ({}, ("ok", 1), ("\ud800", 1), ValueError, ["key '\\ud800'", "'q'"]),
    ({"value_codec": "int64s:2"}, ("ok", (1, 2)), ("k", (1, 2, 3)), ValueError, ["2", "key 'k'"]),
    ({"value_codec": "int64s:2"}, ("ok", (1, 2)), ("k", (1,)), ValueError, ["2", "key 'k'"]),
    ({"value_codec": "int64s:2"}, ("ok", (1, 2)), ("k", 3), TypeError, ["key 'k'"]),
    ({"value_codec": "int64s:2"}, ("ok", (1, 2)), ("k", (1, 1 << 64)), ValueError, ["key 'k'"]),
    ({"value_codec": "float64"}, ("ok", 1.5), ("k", "1.5"), TypeError, ["key 'k'"]),
    ({"key_codec": "bytes"}, (b"ok", 1), ("k", 1), TypeError, ["key 'k'", "bytes"]),
    ({"key_codec": "int64"}, (1, 1), (1 << 64, 1), ValueError, [f"key {1 << 64}"]),
    ({"combiner": "last", "value_codec": "json"}, ("ok", [1]), ("k", {1}), TypeError, ["key 'k'"]),
    ({"value_codec": FourByteInt()}, ("ok", 1), None, ValueError, ["4", "8"]),
]


@pytest.mark.parametrize(
    ("options", "good", "bad", "error", "words"), BAD_UPDATES, ids=lambda v: repr(v)[:30]
)
def test_bad_update_is_a_clear_error_and_queues_nothing(
    backend, store_path, options, good, bad, error, words
):
    app = percolite.App()
    queue = app.combine_queue("q", **options)
    with open_store(backend, store_path, app=app, sync="none") as env:
        if bad is None:  # the codec itself is broken: every value is bad
            good, bad = None, good
        # A valid add, then a bad one in the same transaction; the
        # transaction is aborted: nothing of it is applied.
        tx = env.transaction()
        if good is not None:
            queue.add(tx, dict([good]))
        with pytest.raises(error) as info:
            queue.add(tx, [bad])
        tx.abort()
        message = str(info.value)
        for word in words:
            assert word in message, (word, message)
        assert update_rows(env, "q") == []
        # Good and bad pairs in one call: the call queues nothing, while the
        # rest of the transaction still commits.
        tx = env.transaction()
        tx.set("other", ("f", "q"), "kept")
        with pytest.raises(error):
            queue.add(tx, [p for p in (good, bad) if p is not None])
        tx.commit()
        assert update_rows(env, "q") == []
        assert env.status()["pending"] == 0, "no bucket was notified"
        with env.transaction() as tx:
            assert tx.get("other", ("f", "q")) == b"kept"
        if good is not None:
            with env.transaction() as tx:
                queue.add(tx, [good])
            assert len(update_rows(env, "q")) == 1, "the queue still works"


BAD_DECLARATIONS = [
    ({"queue_id": "a:b"}, ValueError, ["a:b", "':'"]),
    ({"queue_id": ":"}, ValueError, ["':'"]),
    ({"queue_id": "a\nb"}, ValueError, ["control"]),
    ({"queue_id": "a\x00b"}, ValueError, ["control"]),
    ({"queue_id": "del\x7f"}, ValueError, ["control"]),
    ({"queue_id": "tab\t"}, ValueError, ["control"]),
    ({"queue_id": ""}, ValueError, ["empty"]),
    ({"queue_id": 5}, TypeError, ["str"]),
    ({"queue_id": b"q"}, TypeError, ["str"]),
    ({"buckets": 0}, ValueError, ["buckets", "0"]),
    ({"buckets": -3}, ValueError, ["buckets", "-3"]),
    ({"buckets": 1_000_000}, ValueError, ["buckets", "1000000"]),
    ({"buckets": 1 << 32}, ValueError, ["buckets", str(1 << 32)]),
    ({"buckets": "4"}, TypeError, ["buckets", "str"]),
    ({"buckets": 2.0}, TypeError, ["buckets", "float"]),
    ({"buckets": True}, TypeError, ["buckets", "bool"]),
    ({"buffer_size": 0}, ValueError, ["buffer_size", "0"]),
    ({"buffer_size": -1}, ValueError, ["buffer_size", "-1"]),
    ({"buffer_size": "8"}, TypeError, ["buffer_size", "str"]),
    ({"linger": -1}, ValueError, ["'q'", "linger", "between 0 and 3600", "-1"]),
    ({"linger": float("nan")}, ValueError, ["linger", "nan"]),
    ({"linger": 3601}, ValueError, ["linger", "3601"]),
    ({"linger": "0.5"}, TypeError, ["linger", "str"]),
    ({"linger": False}, TypeError, ["linger", "bool"]),
    ({"combiner": "avg"}, ValueError, ["'avg'", "'sum'", "'max'", "'min'", "'last'"]),
    ({"combiner": "SUM"}, ValueError, ["'SUM'"]),
    ({"combiner": ""}, ValueError, ["combiner"]),
    ({"combiner": 5}, TypeError, ["combiner", "int"]),
    ({"combiner": [sum]}, TypeError, ["combiner", "list"]),
    ({"combiner": lambda key: 0}, TypeError, ["(key, values)"]),
    ({"combiner": lambda: 0}, TypeError, ["(key, values)"]),
    ({"combiner": lambda key, values, extra: 0}, TypeError, ["(key, values)"]),
    ({"combiner": lambda *, key, values: 0}, TypeError, ["(key, values)"]),
    ({"value_codec": "int64s"}, ValueError, ["int64s:2"]),
    ({"value_codec": "int64s:0"}, ValueError, ["length"]),
    ({"value_codec": "int32"}, ValueError, ["value_codec", "'int32'"]),
    ({"key_codec": "nope"}, ValueError, ["key_codec", "'nope'"]),
    ({"key_codec": None}, TypeError, ["key_codec"]),
    ({"value_codec": 8}, TypeError, ["value_codec"]),
    ({"combiner": "sum", "value_codec": "json"}, ValueError, ["int64"]),
    ({"combiner": "sum", "value_codec": "str"}, ValueError, ["int64"]),
    ({"combiner": "sum", "value_codec": "bytes"}, ValueError, ["int64"]),
    ({"combiner": "sum", "value_codec": "pickle"}, ValueError, ["int64"]),
    ({"combiner": "max", "value_codec": "json"}, ValueError, ["int64"]),
    ({"combiner": "min", "value_codec": "str"}, ValueError, ["int64"]),
]


@pytest.mark.parametrize(("options", "error", "words"), BAD_DECLARATIONS, ids=repr)
def test_bad_declaration_is_a_clear_error_and_leaves_nothing(
    backend, store_path, options, error, words
):
    app = percolite.App()
    options = dict(options)
    queue_id = options.pop("queue_id", "q")
    with pytest.raises(error) as info:
        app.combine_queue(queue_id, **options)
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)
    # Nothing was registered: the name is free and the store has no observer.
    with open_store(backend, store_path, app=app, sync="none") as env:
        assert env.status()["observers"] == []
        app.combine_queue("q")
        assert [o["name"] for o in env.status()["observers"]] == ["combine queue q"]


# -- bad input, in the table of entry points -----------------------------------

ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    (
        "cq-add-no-tx",
        lambda env, d, q: q["cq"].add(None, {"a": 1}),
        TypeError,
        r"combine queue 'cq': add needs a percolite.Transaction",
    ),
    (
        "cq-get-no-tx",
        lambda env, d, q: q["cq"].get("tx", "a"),
        TypeError,
        r"combine queue 'cq': get needs a percolite.Transaction",
    ),
    (
        "cq-add-key-type",
        lambda env, d, q: q["cq"].add(env.transaction(), {5: 1}),
        TypeError,
        r"combine queue 'cq': key 5: expected str, not int",
    ),
    (
        "cq-add-value-too-big",
        lambda env, d, q: q["cq"].add(env.transaction(), {"a": 2**70}),
        ValueError,
        r"combine queue 'cq': value 1180591620717411303424 for key 'a'.*signed 64-bit",
    ),
    (
        "cq-add-value-none",
        lambda env, d, q: q["cq"].add(env.transaction(), {"a": None}),
        TypeError,
        r"combine queue 'cq': value None for key 'a': expected int",
    ),
    (
        "cq-get-key-type",
        lambda env, d, q: q["cq"].get(env.transaction(), 5),
        TypeError,
        r"combine queue 'cq': key 5: expected str, not int",
    ),
    (
        "cq-add-ended-tx",
        lambda env, d, q: q["cq"].add(q["ended"](env), {"a": 1}),
        percolite.Error,
        r"the transaction was already committed",
    ),
    (
        "cq-of-another-app",
        lambda env, d, q: q["other_cq"].add(env.transaction(), {"a": 1}),
        ValueError,
        r"combine queue 'ocq': add: the store is bound to app 'bad', which has no queue named "
        r"'ocq': what you add would never be processed there",
    ),
    (
        "cq-declared-otherwise",
        lambda env, d, q: q["cq_elsewhere"].add(env.transaction(), {"a": 1}),
        ValueError,
        r"which declares another queue named 'cq'",
    ),
    (
        "cq-buckets-zero",
        lambda env, d, q: percolite.App().combine_queue("q", buckets=0),
        ValueError,
        r"buckets must be between 1 and 999999, not 0",
    ),
    (
        "cq-unknown-combiner",
        lambda env, d, q: percolite.App().combine_queue("q", combiner="avg"),
        ValueError,
        r"combiner must be one of 'sum', 'max', 'min', 'last' or a callable, not 'avg'",
    ),
    (
        "cq-unknown-codec",
        lambda env, d, q: percolite.App().combine_queue("q", value_codec="int128"),
        ValueError,
        r"value_codec must be one of .* not 'int128'",
    ),
    (
        "cq-id-reserved-character",
        lambda env, d, q: percolite.App().combine_queue("a:b"),
        ValueError,
        r"combine queue id 'a:b' contains a character the layout reserves",
    ),
]


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)
