"""The JSON Lines exporter."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from typing import Any

from ..errors import ClosedError
from ._common import (
    _FORK_AWARE,
    DEFAULT_FILE_MODE,
    _check_seq,
    _file_mode,
    _open_created,
    _require_directory,
)


def _freeze(item: Any) -> Any:
    """Lists (at any depth) as tuples, so that a key read back is hashable."""
    if isinstance(item, list):
        return tuple(_freeze(part) for part in item)
    return item


def _json_line(key: Any, value: Any, seq: int) -> bytes:
    try:
        text = json.dumps({"key": key, "value": value, "seq": seq}, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"entry of key {key!r} is not JSON: {exc} (value {value!r})") from None
    return text.encode("utf-8") + b"\n"


def _read_lines(data: bytes, last_seq: dict[str, Any], state: dict[str, Any] | None = None) -> None:
    """Applies the complete lines of ``data`` to ``last_seq`` (key -> highest
    seq) and to ``state`` (key -> value of that seq) when given. A line that
    is not a JSON entry is a torn write from a crashed call: that call did not
    return, so its batch was delivered again and the line is ignored."""
    for line in data.split(b"\n"):
        try:
            record = json.loads(line)
            key, value, seq = _freeze(record["key"]), record["value"], record["seq"]
            hash(key)
        except (ValueError, TypeError, KeyError):
            continue
        if isinstance(seq, bool) or not isinstance(seq, int):
            continue
        if seq > last_seq.get(key, -1):
            last_seq[key] = seq
            if state is not None:
                state[key] = value


class JSONLines:
    """Appends one JSON object per entry to the file ``path``:
    ``{"key": ..., "value": ..., "seq": ...}`` (a deleted key has value
    null), for inspection and simple pipelines. Keys and values must be JSON
    (tuples are written as lists).

    The seq guard is the file itself: under an exclusive ``flock`` a call
    reads what was appended since this object last looked (other objects and
    processes append too), then appends only the entries whose seq is higher
    than the highest seq of that key in the file, then flushes and fsyncs.
    :meth:`load` reads the current state back.

    A file the exporter creates gets permissions ``mode`` (default
    ``0o600``, owner-only like the store, whatever the umask).

    Raises FileNotFoundError at construction when the directory of ``path``
    does not exist; ValueError from a call for an entry that is not JSON.
    """

    def __init__(self, path: Any, *, mode: int = DEFAULT_FILE_MODE) -> None:
        self.mode: int = _file_mode(mode)
        self.path: str = os.path.abspath(os.fspath(path))
        _require_directory(self.path)
        self._lock = threading.Lock()  # one call of this object at a time
        self._offset = 0  # how far this object has read the file
        self._file_id: tuple | None = None  # (device, inode) read so far
        self._last_seq: dict[Any, Any] = {}  # key -> highest seq in the file up to _offset
        self._closed = False
        _FORK_AWARE.add(self)

    def __call__(self, entries: Iterable[Any]) -> None:
        """Appends the newest entry of each key in ``entries`` (a list of
        :class:`SequencedExport`) whose seq is higher than the file's for that key."""
        newest: dict[Any, Any] = {}
        for entry in entries:
            seq = _check_seq(entry)
            line = _json_line(entry.key, entry.value, seq)
            key = _freeze(json.loads(line)["key"])  # the key as load() will see it
            try:
                kept = newest.get(key)
            except TypeError:
                raise ValueError(f"key {entry.key!r} cannot be a dict key once read back") from None
            if kept is None or seq > kept[0]:
                newest[key] = (seq, line)
        if not newest:
            return
        import fcntl  # POSIX only: imported here so the module loads everywhere

        with self._lock:
            if self._closed:
                raise ClosedError("the exporter was closed")
            fd = _open_created(self.path, os.O_RDWR | os.O_APPEND, self.mode)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released by close
                torn = self._catch_up(fd)
                fresh = {
                    key: line
                    for key, (seq, line) in newest.items()
                    if seq > self._last_seq.get(key, -1)
                }
                if not fresh:
                    return
                data = (b"\n" if torn else b"") + b"".join(fresh.values())
                _write_all(fd, data)
                os.fsync(fd)
                _read_lines(data, self._last_seq)
                self._offset += len(data)
            finally:
                os.close(fd)

    def _catch_up(self, fd: int) -> bool:
        """Reads what others appended; returns whether the file ends in a torn line."""
        info = os.fstat(fd)
        if self._file_id != (info.st_dev, info.st_ino) or info.st_size < self._offset:
            self._file_id = (info.st_dev, info.st_ino)  # a new or replaced file
            self._offset, self._last_seq = 0, {}
        data = os.pread(fd, info.st_size - self._offset, self._offset)
        _read_lines(data, self._last_seq)
        self._offset += len(data)
        return self._offset > 0 and os.pread(fd, 1, self._offset - 1) != b"\n"

    @staticmethod
    def load(path: Any) -> dict[str, Any]:
        """The state the file at ``path`` describes: ``{key: value}`` with,
        per key, the value of its highest seq; deleted keys are absent; keys
        that were tuples or lists come back as tuples. Raises
        FileNotFoundError when the file does not exist."""
        import fcntl

        with open(path, "rb") as file:
            fcntl.flock(file.fileno(), fcntl.LOCK_SH)  # no half-written call
            data = file.read()
        state: dict[Any, Any] = {}
        _read_lines(data, {}, state)
        return {key: value for key, value in state.items() if value is not None}

    def rows(self) -> dict[str, Any]:
        """:meth:`load` of this file; {} before the first export."""
        try:
            return self.load(self.path)
        except FileNotFoundError:
            return {}

    def close(self) -> None:
        """Later calls raise ClosedError (each call opens and closes the file
        itself, so there is nothing else to release)."""
        self._closed = True

    def __enter__(self) -> JSONLines:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<percolite.exporters.JSONLines {self.path!r}>"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
