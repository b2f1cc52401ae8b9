"""percolite's loggers, and what the workers report through them.

Everything percolite reports goes through :mod:`logging`, under the
``percolite`` logger (nothing is printed, except by the command line):

* ``percolite.observers``: an observer's failure at WARNING, with its
  traceback; work parked after its last attempt at ERROR.
* ``percolite.workers``: a worker pool's share of the work by lease, each
  time it changes (a pool joined, stopped, or its lease lapsed and was taken
  over), at INFO; worker processes: one killed (its share taken over) or
  stopping because its group's parent is gone, at WARNING.

Configure them as any library's loggers, e.g.
``logging.getLogger("percolite").setLevel(logging.ERROR)``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from . import _core

LEASE_PARTITIONS = _core.LEASE_PARTITIONS

__all__ = [
    "logger",
    "observers",
    "workers",
    "describe_cell",
    "shown",
    "report_failure",
    "report_lease_change",
    "failure_text",
    "capture_failures",
]

logger = logging.getLogger("percolite")
observers = logging.getLogger("percolite.observers")
workers = logging.getLogger("percolite.workers")


def shown(value: Any) -> str:
    """``value`` for a message: bytes that are printable UTF-8 as a str."""
    if not isinstance(value, bytes):
        return repr(value)
    decoded = value.decode("utf-8", "backslashreplace")
    return repr(decoded) if decoded.isprintable() else repr(value)


def describe_cell(record: dict[str, Any]) -> str:
    """``row 'r' column 'family:qualifier'`` for a record with row, family and qualifier."""
    text = shown
    column = f"{text(record['family'])[1:-1]}:{text(record['qualifier'])[1:-1]}"
    return f"row {text(record['row'])} column {column!r}"


def report_failure(record: dict[str, Any]) -> None:
    """Called by the workers after each failed run is recorded in the store
    (``record`` as :meth:`percolite.Env.parked` lists them)."""
    error = record["error"]
    if record.get("key") is not None:
        where = f"{record['observer']} key {shown(record['key'])}"
    else:
        where = f"observer {record['observer']!r} on {describe_cell(record)}"
    if record["parked"]:
        observers.error(
            "%s failed on its last attempt (%d) and is parked: %s: %s\n%s",
            where,
            record["attempts"],
            error["type"],
            error["message"],
            error["traceback"].rstrip("\n"),
        )
    else:
        observers.warning(
            "%s failed (attempt %d), will retry: %s: %s\n%s",
            where,
            record["attempts"],
            error["type"],
            error["message"],
            error["traceback"].rstrip("\n"),
        )


class _Captured(threading.local):
    on = False
    exception: BaseException | None = None


_captured = _Captured()


@contextlib.contextmanager
def capture_failures() -> Iterator[_Captured]:
    """While it is entered, the exception of a user callback failing on this
    thread is kept (the last one) in the yielded object's ``exception``, for
    code that runs callbacks in its own thread and raises what they raised
    (``percolite.testing``). Nested uses each see their own callbacks'
    failures; the outer one's state comes back when the inner one ends."""
    before = (_captured.on, _captured.exception)
    _captured.on, _captured.exception = True, None
    try:
        yield _captured
    finally:
        _captured.on, _captured.exception = before


def failure_text() -> str:
    """The traceback of the exception being handled, for a runner that
    reports a user callback's failure: from the callback's frame on (the
    runner's own frame, which called it, left out)."""
    kind, value, tb = sys.exc_info()
    if _captured.on:
        _captured.exception = value
    if tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "".join(traceback.format_exception(kind, value, tb))


def report_lease_change(owner: str, partitions: int, pools: int) -> None:
    """Called by a worker pool sharing work by lease when its share changed."""
    workers.info(
        "worker pool %s now takes %d of %d partitions (%d live pool%s)",
        owner,
        partitions,
        LEASE_PARTITIONS,
        pools,
        "" if pools == 1 else "s",
    )
