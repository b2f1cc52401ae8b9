"""Codecs (``percolite.codecs``): how combine-queue keys and values become bytes.

The byte layouts of ``int64``, ``float64`` and ``int64s:N`` are part of the
store's format: the C++ core's native combiners read them directly (big-endian
two's complement int64, big-endian IEEE-754 float64). These tests pin them,
check round trips at the edges, and check that bad values fail with an error
that says what was expected.
"""

from __future__ import annotations

import datetime
import decimal
import fractions
import math
import pickle
import struct

import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from percolite.codecs import Codec, get_codec, int64s

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# -- round trips ----------------------------------------------------------------

ROUND_TRIPS = [
    ("str", ""),
    ("str", "a"),
    ("str", "héllo wörld"),
    ("str", "日本語のテキスト"),
    ("str", "emoji \U0001f600 and \u00e9\u0301"),
    ("str", "nul \x00 inside, and \x7f, \n, \t"),
    ("str", "x" * 100_000),
    ("bytes", b""),
    ("bytes", b"\x00"),
    ("bytes", b"\x00\x01\xfe\xff" * 7),
    ("bytes", bytes(range(256))),
    ("int64", 0),
    ("int64", 1),
    ("int64", -1),
    ("int64", 255),
    ("int64", 256),
    ("int64", 1 << 32),
    ("int64", -(1 << 32) - 7),
    ("int64", INT64_MIN),
    ("int64", INT64_MAX),
    ("int64", INT64_MIN + 1),
    ("int64", INT64_MAX - 1),
    ("float64", 0.0),
    ("float64", 1.5),
    ("float64", -2.75),
    ("float64", 0.1),
    ("float64", 1e308),
    ("float64", -1e-308),
    ("float64", 5e-324),
    ("float64", math.inf),
    ("float64", -math.inf),
    ("float64", 2.0**53 + 2),
    ("int64s:1", (0,)),
    ("int64s:1", (INT64_MIN,)),
    ("int64s:2", (0, 0)),
    ("int64s:2", (1, -1)),
    ("int64s:2", (INT64_MIN, INT64_MAX)),
    ("int64s:3", (INT64_MAX, 0, INT64_MIN)),
    ("int64s:5", (1, 2, 3, 4, 5)),
    ("json", None),
    ("json", True),
    ("json", 0),
    ("json", -(1 << 80)),
    ("json", 1.25),
    ("json", ""),
    ("json", "ünïcødé \U0001f600"),
    ("json", []),
    ("json", {}),
    ("json", {"b": [1, 2, {"c": None}], "a": "x", "ü": 1.5}),
    ("pickle", None),
    ("pickle", {1, 2, 3}),
    ("pickle", frozenset({"a"})),
    ("pickle", (1, "two", 3.0, b"four", None)),
    ("pickle", {"nested": [1, (2, 3)], 4: {5}}),
    ("pickle", complex(1, -2)),
    ("pickle", decimal.Decimal("1.10")),
    ("pickle", fractions.Fraction(1, 3)),
    ("pickle", datetime.datetime(2024, 2, 29, 23, 59, 59, 999999)),
    ("pickle", b"\x00bytes"),
]


@pytest.mark.parametrize(("name", "value"), ROUND_TRIPS, ids=lambda v: repr(v)[:40])
def test_round_trip(name, value):
    codec = get_codec(name)
    data = codec.encode(value)
    assert isinstance(data, bytes)
    back = codec.decode(data)
    assert back == value
    assert type(back) is type(value)
    # Encoding is a function of the value: equal values give equal bytes.
    assert codec.encode(back) == data


def test_float64_negative_zero_keeps_its_sign():
    codec = get_codec("float64")
    data = codec.encode(-0.0)
    assert data == b"\x80" + b"\x00" * 7
    back = codec.decode(data)
    assert back == 0.0 and math.copysign(1.0, back) == -1.0
    positive = codec.encode(0.0)
    assert positive == b"\x00" * 8
    assert math.copysign(1.0, codec.decode(positive)) == 1.0


def test_float64_nan_round_trips_as_nan():
    codec = get_codec("float64")
    assert math.isnan(codec.decode(codec.encode(math.nan)))


def test_float64_accepts_ints_and_decodes_floats():
    codec = get_codec("float64")
    assert codec.encode(3) == codec.encode(3.0)
    back = codec.decode(codec.encode(-7))
    assert back == -7.0 and type(back) is float


def test_bytes_accepts_bytearray_and_memoryview():
    codec = get_codec("bytes")
    assert codec.encode(bytearray(b"ab\x00")) == b"ab\x00"
    assert codec.encode(memoryview(b"xyz")) == b"xyz"
    assert type(codec.encode(bytearray(b"q"))) is bytes


def test_int64s_accepts_lists_and_decodes_tuples():
    codec = get_codec("int64s:3")
    data = codec.encode([1, -2, 3])
    assert data == codec.encode((1, -2, 3))
    assert codec.decode(data) == (1, -2, 3)
    assert type(codec.decode(data)) is tuple


def test_json_is_deterministic_so_equal_keys_encode_equal():
    """With key_codec="json", equal dicts must be one key: the encoding may not
    depend on insertion order (and is compact)."""
    codec = get_codec("json")
    one = codec.encode({"b": 1, "a": [2, {"d": 3, "c": 4}]})
    two = codec.encode({"a": [2, {"c": 4, "d": 3}], "b": 1})
    assert one == two
    assert one == b'{"a":[2,{"c":4,"d":3}],"b":1}'


def test_json_tuples_come_back_as_lists():
    codec = get_codec("json")
    assert codec.decode(codec.encode((1, 2))) == [1, 2]


# -- byte layouts the C++ core relies on ------------------------------------------


@pytest.mark.parametrize(
    ("value", "data"),
    [
        (0, b"\x00" * 8),
        (1, b"\x00" * 7 + b"\x01"),
        (2, b"\x00" * 7 + b"\x02"),
        (256, b"\x00" * 6 + b"\x01\x00"),
        (0x0102030405060708, b"\x01\x02\x03\x04\x05\x06\x07\x08"),
        (-1, b"\xff" * 8),
        (-2, b"\xff" * 7 + b"\xfe"),
        (INT64_MAX, b"\x7f" + b"\xff" * 7),
        (INT64_MIN, b"\x80" + b"\x00" * 7),
    ],
    ids=repr,
)
def test_int64_is_big_endian_twos_complement(value, data):
    codec = get_codec("int64")
    assert codec.encode(value) == data
    assert codec.decode(data) == value


def test_float64_is_big_endian_ieee754():
    codec = get_codec("float64")
    assert codec.encode(1.0) == b"\x3f\xf0" + b"\x00" * 6
    assert codec.encode(-2.0) == b"\xc0" + b"\x00" * 7
    assert codec.encode(math.inf) == b"\x7f\xf0" + b"\x00" * 6
    assert codec.encode(0.1) == struct.pack(">d", 0.1)


def test_int64s_is_the_concatenation_of_big_endian_int64s():
    codec = get_codec("int64s:2")
    assert codec.encode((1, -1)) == b"\x00" * 7 + b"\x01" + b"\xff" * 8
    assert codec.encode((INT64_MIN, 2)) == b"\x80" + b"\x00" * 7 + b"\x00" * 7 + b"\x02"
    assert len(get_codec("int64s:5").encode((0,) * 5)) == 40


def test_str_is_utf8():
    assert get_codec("str").encode("é€\U0001f600") == "é€\U0001f600".encode()
    assert get_codec("str").encode("") == b""


def test_native_layout_names():
    """What the core is told about each codec's values."""
    assert (get_codec("int64").native, get_codec("int64").length) == ("int64", 0)
    assert get_codec("float64").native == "float64"
    tuple_codec = get_codec("int64s:4")
    assert (tuple_codec.native, tuple_codec.length, tuple_codec.name) == ("int64s", 4, "int64s:4")
    for name in ("str", "bytes", "json", "pickle"):
        assert get_codec(name).native == "bytes", name


# -- errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "error", "words"),
    [
        ("str", 1, TypeError, ["str", "int"]),
        ("str", b"bytes", TypeError, ["str", "bytes"]),
        ("str", None, TypeError, ["str", "NoneType"]),
        ("bytes", "text", TypeError, ["bytes", "str"]),
        ("bytes", 3, TypeError, ["bytes", "int"]),
        ("int64", 1.0, TypeError, ["int", "float"]),
        ("int64", "1", TypeError, ["int", "str"]),
        ("int64", True, TypeError, ["int", "bool"]),
        ("int64", None, TypeError, ["int"]),
        ("int64", INT64_MAX + 1, ValueError, [str(INT64_MAX + 1), "64-bit"]),
        ("int64", INT64_MIN - 1, ValueError, [str(INT64_MIN - 1), "64-bit"]),
        ("int64", 1 << 100, ValueError, ["64-bit"]),
        ("float64", "1.0", TypeError, ["float", "str"]),
        ("float64", True, TypeError, ["float", "bool"]),
        ("float64", None, TypeError, ["float"]),
        ("int64s:2", (1,), ValueError, ["2", "1"]),
        ("int64s:2", (1, 2, 3), ValueError, ["2", "3"]),
        ("int64s:2", (), ValueError, ["2", "0"]),
        ("int64s:2", 5, TypeError, ["tuple", "int"]),
        ("int64s:2", "12", TypeError, ["tuple", "str"]),
        ("int64s:2", (1, "2"), TypeError, ["int", "str"]),
        ("int64s:2", (1, 2.0), TypeError, ["int", "float"]),
        ("int64s:2", (1, True), TypeError, ["int", "bool"]),
        ("int64s:2", (1, INT64_MAX + 1), ValueError, ["64-bit"]),
        ("json", {1, 2}, TypeError, ["set"]),
        ("json", object(), TypeError, ["object"]),
        ("json", b"bytes", TypeError, ["bytes"]),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_encode_errors_say_what_was_expected(name, value, error, words):
    with pytest.raises(error) as info:
        get_codec(name).encode(value)
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)


def test_json_circular_reference_is_a_value_error():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="[Cc]ircular"):
        get_codec("json").encode(loop)


def test_float64_out_of_range_int_is_an_error_not_inf():
    with pytest.raises(OverflowError):
        get_codec("float64").encode(10**400)


def test_str_decode_of_invalid_utf8_fails():
    with pytest.raises(UnicodeDecodeError):
        get_codec("str").decode(b"\xff\xfe")


def test_pickle_of_an_unpicklable_value_fails():
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        get_codec("pickle").encode(lambda: None)


@pytest.mark.parametrize(
    "codec, data",
    [
        ("int64", b"abc"),
        ("float64", b""),
        ("int64s:2", b"\x00" * 9),
        ("json", b"{"),
        ("str", b"\xff"),
    ],
)
def test_codecs_refuse_bytes_they_did_not_write(codec, data):
    with pytest.raises(ValueError):
        percolite.codecs.get_codec(codec).decode(data)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), [1.0, float("nan")]])
def test_json_codec_refuses_nan_and_infinity(value):
    with pytest.raises(ValueError, match="not JSON compliant"):
        percolite.codecs.get_codec("json").encode(value)


# -- bad input, in the table of entry points -----------------------------------

ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    (
        "codec-unknown",
        lambda env, d, q: percolite.codecs.get_codec("int65"),
        ValueError,
        r"codec must be one of .* not 'int65'",
    ),
    (
        "codec-int64-too-big",
        lambda env, d, q: percolite.codecs.get_codec("int64").encode(2**64),
        ValueError,
        r"18446744073709551616 does not fit in a signed 64-bit integer",
    ),
]


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)


# -- get_codec --------------------------------------------------------------------


def test_get_codec_by_name_returns_codecs():
    for name in ("str", "bytes", "int64", "float64", "json", "pickle", "int64s:2"):
        codec = get_codec(name)
        assert isinstance(codec, Codec), name
        assert codec.name == name
        assert name in repr(codec)


def test_get_codec_passes_codec_instances_through():
    class Upper(Codec):
        name = "upper"

        def encode(self, value):
            return value.upper().encode()

        def decode(self, data):
            return data.decode()

    codec = Upper()
    assert get_codec(codec) is codec
    tuple_codec = int64s(3)
    assert get_codec(tuple_codec) is tuple_codec


@pytest.mark.parametrize(
    "spec", ["", "INT64", "int", "utf8", "text", "int32", "float", "Pickle", "pickle ", "msgpack"]
)
def test_unknown_codec_name_is_a_value_error_listing_the_names(spec):
    with pytest.raises(ValueError) as info:
        get_codec(spec, "value_codec")
    message = str(info.value)
    assert "value_codec" in message
    assert repr(spec) in message
    for name in ("'str'", "'bytes'", "'int64'", "'float64'", "'json'", "'pickle'", "int64s:N"):
        assert name in message, (name, message)


@pytest.mark.parametrize("spec", ["int64s", "int64s:", "int64s:x", "int64s:-1", "int64s:1.5"])
def test_int64s_without_a_valid_length_is_a_value_error(spec):
    with pytest.raises(ValueError, match="int64s"):
        get_codec(spec, "value_codec")


@pytest.mark.parametrize("spec", ["int64s:0", "int64s:00"])
def test_int64s_of_length_zero_is_a_value_error(spec):
    with pytest.raises(ValueError, match="length"):
        get_codec(spec)


@pytest.mark.parametrize("length", [0, -1, True, 1.0, "2", None])
def test_int64s_constructor_checks_its_length(length):
    with pytest.raises(ValueError, match="length"):
        int64s(length)


@pytest.mark.parametrize("spec", [None, 1, b"str", str, pickle, ["str"]])
def test_get_codec_of_a_non_name_is_a_type_error(spec):
    with pytest.raises(TypeError) as info:
        get_codec(spec, "key_codec")
    assert "key_codec" in str(info.value)


def test_pickle_only_by_name():
    """Nothing falls back to pickle: the default codecs and json refuse
    arbitrary objects; pickle is there when named, and only then."""
    assert isinstance(get_codec("pickle"), Codec)
    app = percolite.App()
    queue = app.combine_queue("defaults")
    assert queue.key_codec.name == "str"
    assert queue.value_codec.name == "int64"
    for name in ("str", "bytes", "int64", "float64", "json"):
        with pytest.raises(TypeError):
            get_codec(name).encode({1, 2})
    pickled = app.combine_queue("pickled", combiner="last", value_codec="pickle")
    assert pickled.value_codec.name == "pickle"
    assert pickled.value_codec.decode(pickled.value_codec.encode({1, 2})) == {1, 2}
