"""Codecs: how queue keys and values become bytes and back.

By name: ``"str"`` (UTF-8), ``"bytes"``, ``"int64"`` (8 bytes, big-endian),
``"float64"`` (IEEE-754, big-endian), ``"int64s:N"`` (a tuple of N int64s,
e.g. ``"int64s:2"``), ``"json"``; ``"pickle"`` only when asked for by name
(unpickling runs code: use it for data you trust). Or pass a :class:`Codec`:
the built-in ones are :data:`STR`, :data:`BYTES`, :data:`INT64`,
:data:`FLOAT64`, :data:`JSON`, :data:`PICKLE` and ``int64s(N)``.

``Codec[T]`` encodes values of type ``T``, and a queue declared with codec
objects is typed by them: ``app.combine_queue("words", key_codec=STR,
value_codec=INT64)`` is a ``CombineQueue[str, int]`` for type checkers. A
queue declared with codec names works the same but is typed with ``Any``.

The native combiners of the combine queue read ``int64``, ``float64`` and
``int64s:N`` values directly in C++, so these encodings are part of the store's
format.
"""

from __future__ import annotations

import json
import pickle
import struct
from typing import Any, Generic, TypeVar

__all__ = [
    "Codec",
    "get_codec",
    "int64s",
    "STR",
    "BYTES",
    "INT64",
    "FLOAT64",
    "JSON",
    "PICKLE",
]

T = TypeVar("T")

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class Codec(Generic[T]):
    """Encodes one kind of Python value, of type ``T``, to bytes. ``native``
    names the layout the C++ core understands (``"int64"``, ``"float64"``,
    ``"int64s"`` or ``"bytes"``); ``length`` is the tuple length for
    ``"int64s"``.

    Subclass it (setting ``name`` and overriding :meth:`encode` and
    :meth:`decode`) for keys or values of your own kind, as ``class
    PointCodec(Codec[Point])``; leave ``native`` as ``"bytes"`` unless the
    encoding is exactly one of the native layouts."""

    name = "codec"
    native = "bytes"
    length = 0

    def encode(self, value: T) -> bytes:
        """``value`` as bytes; raises TypeError (wrong type) or ValueError
        (out of range) when it cannot be encoded."""
        raise NotImplementedError

    def decode(self, data: bytes) -> T:
        """The value that :meth:`encode` turned into ``data``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<percolite codec {self.name!r}>"


class _Str(Codec[str]):
    name = "str"

    def encode(self, value: str) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"expected str, not {type(value).__name__}")
        return value.encode("utf-8")

    def decode(self, data: bytes) -> str:
        return data.decode("utf-8")


class _Bytes(Codec[bytes]):
    name = "bytes"

    def encode(self, value: bytes) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, (bytearray, memoryview)):
            return bytes(value)
        raise TypeError(f"expected bytes, not {type(value).__name__}")

    def decode(self, data: bytes) -> bytes:
        return data


def _unpack(name: str, layout: struct.Struct, data: bytes) -> tuple[Any, ...]:
    """``layout.unpack(data)``; ValueError naming codec ``name`` and the
    sizes when ``data`` has the wrong length."""
    if len(data) != layout.size:
        raise ValueError(
            f"codec {name!r} decodes {layout.size} bytes, not {len(data)}: "
            f"{bytes(data[:16])!r}{'...' if len(data) > 16 else ''}"
        )
    return layout.unpack(data)


def _check_int64(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected int, not {type(value).__name__}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{value} does not fit in a signed 64-bit integer")
    return value


class _Int64(Codec[int]):
    name = "int64"
    native = "int64"
    _struct = struct.Struct(">q")

    def encode(self, value: int) -> bytes:
        return self._struct.pack(_check_int64(value))

    def decode(self, data: bytes) -> int:
        value: int = _unpack(self.name, self._struct, data)[0]
        return value


class _Float64(Codec[float]):
    name = "float64"
    native = "float64"
    _struct = struct.Struct(">d")

    def encode(self, value: float) -> bytes:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"expected float, not {type(value).__name__}")
        return self._struct.pack(float(value))

    def decode(self, data: bytes) -> float:
        value: float = _unpack(self.name, self._struct, data)[0]
        return value


class int64s(Codec[tuple[int, ...]]):  # noqa: N801 - reads like the codec's name
    """A tuple of ``length`` int64s, summed elementwise by the native "sum"."""

    native = "int64s"

    def __init__(self, length: int) -> None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"int64s needs a tuple length >= 1, not {length!r}")
        self.length = length
        self.name: str = f"int64s:{length}"
        self._struct = struct.Struct(f">{length}q")

    def encode(self, value: tuple[int, ...]) -> bytes:
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"expected a tuple of {self.length} ints, not {type(value).__name__}")
        if len(value) != self.length:
            raise ValueError(f"expected a tuple of {self.length} ints, not {len(value)}")
        return self._struct.pack(*(_check_int64(v) for v in value))

    def decode(self, data: bytes) -> tuple[int, ...]:
        return _unpack(self.name, self._struct, data)


class _Json(Codec[Any]):
    name = "json"

    # One encoder for every call: json.dumps with options makes a new one each time.
    # NaN and infinities are not JSON: refused here, not written for a reader to choke on.
    _encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)

    def encode(self, value: Any) -> bytes:
        return self._encoder.encode(value).encode("utf-8")

    def decode(self, data: bytes) -> Any:
        return json.loads(data)


class _Pickle(Codec[Any]):
    name = "pickle"

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes) -> Any:
        try:
            return pickle.loads(data)  # noqa: S301 - only when the user named "pickle"
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError) as e:
            raise ValueError(f"codec 'pickle' cannot decode {bytes(data[:16])!r}: {e}") from None


STR: Codec[str] = _Str()
"""UTF-8 text (the name ``"str"``)."""
BYTES: Codec[bytes] = _Bytes()
"""Bytes as they are (``"bytes"``); bytearray and memoryview encode too."""
INT64: Codec[int] = _Int64()
"""A signed 64-bit integer, 8 bytes big-endian (``"int64"``)."""
FLOAT64: Codec[float] = _Float64()
"""An IEEE-754 double, 8 bytes big-endian (``"float64"``); ints encode too."""
JSON: Codec[Any] = _Json()
"""A JSON value, compact with sorted keys (``"json"``); NaN and infinities are refused."""
PICKLE: Codec[Any] = _Pickle()
"""Any picklable value (``"pickle"``): decoding unpickles, so only for data you trust."""

# The codecs that names give, each the one typed object above.
_BY_NAME: dict[str, Codec[Any]] = {
    codec.name: codec for codec in (STR, BYTES, INT64, FLOAT64, JSON, PICKLE)
}


def get_codec(spec: str | Codec[Any], role: str = "codec") -> Codec[Any]:
    """The codec named by ``spec`` (a name or a :class:`Codec`)."""
    if isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"{role} must be a codec name or a percolite.codecs.Codec, not {spec!r}")
    if spec.startswith("int64s"):
        _, _, length = spec.partition(":")
        if not length.isdigit():
            raise ValueError(f"{role} 'int64s' needs a tuple length, e.g. 'int64s:2', not {spec!r}")
        return int64s(int(length))
    try:
        return _BY_NAME[spec]
    except KeyError:
        names = ", ".join(repr(n) for n in [*_BY_NAME, "int64s:N"])
        raise ValueError(f"{role} must be one of {names}, not {spec!r}") from None


# The built-in codecs the C++ queues also encode and decode themselves (the
# hot path of cq.add and of export deliveries, cpp/bindings/codecs.cc). Only
# these exact classes: a subclass may change the encoding.
_NATIVE_LAYOUTS = {
    _Str: "str",
    _Bytes: "bytes",
    _Int64: "int64",
    _Float64: "float64",
    int64s: "int64s",
}


def native_layout(codec: Codec[Any]) -> tuple[str, int] | None:
    """``(layout, tuple length)`` when the core can encode and decode values
    of ``codec`` itself, else ``None``."""
    name = _NATIVE_LAYOUTS.get(type(codec))
    return None if name is None else (name, codec.length)
