"""The JSON Lines exporter."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from .._args import check_file_mode, check_parent_directory
from ..errors import ClosedError
from ._common import (
    ADOPT,
    APPLY,
    DEFAULT_FILE_MODE,
    UNCHECKED,
    ForkSafeLock,
    _check_seq,
    _check_store,
    _claim,
    _log_adopted,
    _open_created,
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


def _owner_line(store: str, epoch: int) -> bytes:
    return json.dumps({"store": store, "epoch": epoch}).encode("utf-8") + b"\n"


def _read_lines(
    data: bytes,
    last_seq: dict[str, Any],
    state: dict[str, Any] | None = None,
    owner: list[Any] | None = None,
) -> None:
    """Applies the complete lines of ``data`` to ``last_seq`` (key -> highest
    seq), to ``state`` (key -> value of that seq) when given, and to ``owner``
    ([store, epoch] of the last owner line; a sink belongs to one store). An
    owner line of a new epoch makes every entry before it older than those
    after it (``last_seq`` starts again); of another store, it starts the
    file's state again. A line that is neither is a torn write from a
    crashed call: that call did not return, so its batch was delivered again
    and the line is ignored."""
    if owner is None:
        owner = []
    for line in data.split(b"\n"):
        try:
            record = json.loads(line)
            if "key" not in record and "store" in record:
                store, epoch = record["store"], record["epoch"]
                if owner and owner[0] != store:  # taken over: the file starts again
                    last_seq.clear()
                    if state is not None:
                        state.clear()
                elif owner and owner[1] != epoch:  # a new epoch: what came before is older
                    last_seq.clear()
                owner[:] = [store, epoch]
                continue
            key, value, seq = _freeze(record["key"]), record["value"], record["seq"]
            hash(key)
        except (ValueError, TypeError, KeyError, AttributeError):
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

    The file belongs to one store: an owner line ``{"store": ..., "epoch":
    ...}`` records it (written before the first entries of a store, and
    again when the store's epoch moves on; entries after a new epoch's line
    win over those before it whatever their seq). Entries of another store
    are refused with :class:`percolite.SinkOwnedByOtherStore`, until
    :meth:`take_over`.

    A file the exporter creates gets permissions ``mode`` (default
    ``0o600``, owner-only like the store, whatever the umask).

    Raises FileNotFoundError at construction when the directory of ``path``
    does not exist; ValueError from a call for an entry that is not JSON.
    """

    def __init__(self, path: Any, *, mode: int = DEFAULT_FILE_MODE) -> None:
        self.mode: int = check_file_mode(mode)
        self.path: str = os.path.abspath(os.fspath(path))
        check_parent_directory(self.path)
        self._lock = ForkSafeLock()  # one call of this object at a time
        self._offset = 0  # how far this object has read the file
        self._file_id: tuple | None = None  # (device, inode) read so far
        self._last_seq: dict[Any, Any] = {}  # key -> highest seq in the file up to _offset
        self._owner: list[Any] = []  # [store, epoch] of the file's last owner line
        self._closed = False

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
                owner_line = self._check_owner(entries)
                if owner_line:
                    _read_lines(owner_line, self._last_seq, None, self._owner)
                fresh = {
                    key: line
                    for key, (seq, line) in newest.items()
                    if seq > self._last_seq.get(key, -1)
                }
                if not fresh and not owner_line:
                    return
                data = (b"\n" if torn else b"") + owner_line + b"".join(fresh.values())
                _write_all(fd, data)
                os.fsync(fd)
                _read_lines(data, self._last_seq, None, self._owner)
                self._offset += len(data)
            finally:
                os.close(fd)

    def _check_owner(self, entries: Any) -> bytes:
        """Under the file's lock: the owner line to write before the
        entries (a sink with no owner yet, or a new epoch), or b"";
        raises for another store's entries (``_common._claim``)."""
        owner = (self._owner[0], self._owner[1]) if self._owner else None
        decision = _claim(owner, entries, repr(self))
        if decision in (APPLY, UNCHECKED):
            return b""
        if decision == ADOPT and self._offset > 0:
            _log_adopted(self, entries.store)
        return _owner_line(entries.store, entries.epoch)

    def take_over(self, store: str, epoch: int = 1) -> dict[str, Any]:
        """Makes this file belong to store ``store`` (an identity, as
        :attr:`percolite.Env.identity` gives it) from epoch ``epoch``: under
        the file's lock, empties it (another store's exports) and writes the
        owner line. Returns what it did: ``{"sink", "previous_owner",
        "owner", "epoch", "rows_cleared"}``."""
        import fcntl

        store, epoch = _check_store(store, epoch)
        with self._lock:
            if self._closed:
                raise ClosedError("the exporter was closed")
            fd = _open_created(self.path, os.O_RDWR, self.mode)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                data = os.pread(fd, os.fstat(fd).st_size, 0)
                owner: list[Any] = []
                state: dict[Any, Any] = {}
                _read_lines(data, {}, state, owner)
                os.ftruncate(fd, 0)
                line = _owner_line(store, epoch)
                _write_all(fd, line)
                os.fsync(fd)
                info = os.fstat(fd)
                self._file_id = (info.st_dev, info.st_ino)
                self._offset, self._last_seq, self._owner = len(line), {}, [store, epoch]
            finally:
                os.close(fd)
        return {
            "sink": repr(self),
            "previous_owner": owner[0] if owner else None,
            "owner": store,
            "epoch": epoch,
            "rows_cleared": sum(1 for value in state.values() if value is not None),
        }

    def owner(self) -> dict[str, Any] | None:
        """The store this file belongs to, ``{"store", "epoch"}`` (its last
        owner line), or None when it has none."""
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return None
        owner: list[Any] = []
        _read_lines(data, {}, None, owner)
        return {"store": owner[0], "epoch": owner[1]} if owner else None

    def _catch_up(self, fd: int) -> bool:
        """Reads what others appended; returns whether the file ends in a torn line."""
        info = os.fstat(fd)
        if self._file_id != (info.st_dev, info.st_ino) or info.st_size < self._offset:
            self._file_id = (info.st_dev, info.st_ino)  # a new or replaced file
            self._offset, self._last_seq, self._owner = 0, {}, []
        data = os.pread(fd, info.st_size - self._offset, self._offset)
        _read_lines(data, self._last_seq, None, self._owner)
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
