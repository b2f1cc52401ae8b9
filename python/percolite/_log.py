"""percolite's loggers, and what the workers report through them.

Everything percolite reports goes through :mod:`logging`, under the
``percolite`` logger (nothing is printed, except by the command line):

* ``percolite.observers``: an observer's failure at WARNING, with its
  traceback; work parked after its last attempt at ERROR; a queue's sink
  failing (an outage) at WARNING, its recovery at INFO. Bounded: what goes
  on failing is logged in full once, then as one line a minute with a count.
* ``percolite.workers``: a worker pool's share of the work by lease, each
  time it changes (a pool joined, stopped, or its lease lapsed and was taken
  over), at INFO; worker processes: one killed (its share taken over) or
  stopping because its group's parent is gone, at WARNING.

Configure them as any library's loggers, e.g.
``logging.getLogger("percolite").setLevel(logging.ERROR)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import threading
import time
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
    "FailureLog",
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


# Bounded logs: a failure that goes on is logged once in full, then as one
# line at most this often (with a count), and its end once.
REPEAT_SECONDS = 60.0
# Parkings of one observer logged in full before they are summarised.
PARKINGS_IN_FULL = 5


@dataclasses.dataclass
class _Story:
    """One kind of failure of one observer, while it goes on."""

    since: float  # unix time of its first failure
    last_line: float  # monotonic time of its last log line
    last_failure: float  # monotonic
    total: int = 0
    unlogged: int = 0  # failures since the last line that no line reported


class _Failing:
    """What is failing now, per observer: the cells (or buckets) whose runs
    failed and have not committed since, and a story per kind of failure
    (an error type, "outage" or "parked")."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cells: dict[str, set[Any]] = {}
        self.stories: dict[tuple[str, str], _Story] = {}

    def note(self, observer: str, cell: Any, kind: str, in_full: int) -> tuple[str, _Story, int]:
        """Counts a failure on ``cell`` (None: work that is over, such as
        parked work): ("full", story, 0) when it is one of the first
        ``in_full`` of its story (log it in full), ("summary", story, n) when
        a periodic line is due (n failures went unlogged, this one
        included), else ("quiet", story, 0). A story with no failure for
        ``REPEAT_SECONDS`` ends: the next failure starts a new one."""
        now = time.monotonic()
        with self.lock:
            if cell is not None:
                self.cells.setdefault(observer, set()).add(cell)
            story = self.stories.get((observer, kind))
            if story is None or now - story.last_failure >= REPEAT_SECONDS:
                story = self.stories[(observer, kind)] = _Story(time.time(), now, now)
            story.last_failure = now
            story.total += 1
            if story.total <= in_full:
                story.last_line = now
                return "full", story, 0
            story.unlogged += 1
            if now - story.last_line >= REPEAT_SECONDS:
                unlogged, story.unlogged, story.last_line = story.unlogged, 0, now
                return "summary", story, unlogged
            return "quiet", story, 0

    def recover(self, observer: str, cell: Any) -> list[tuple[str, _Story]]:
        """A run on ``cell`` committed: once nothing of ``observer`` is
        failing any more, its stories end and are returned (to log the
        recovery); a later failure starts a new one."""
        with self.lock:
            cells = self.cells.get(observer)
            if cells is None:
                return []
            cells.discard(cell)
            if cells:
                return []
            del self.cells[observer]
            ended = [
                (kind, story)
                for (o, kind), story in self.stories.items()
                if o == observer and kind != "parked"
            ]
            for kind, _story in ended:
                del self.stories[(observer, kind)]
            return ended


def _where(record: dict[str, Any]) -> str:
    if record.get("key") is not None:
        return f"{record['observer']} key {shown(record['key'])}"
    return f"observer {record['observer']!r} on {describe_cell(record)}"


def _cell(record: dict[str, Any]) -> Any:
    return (record["row"], record["family"], record["qualifier"])


def _since(story: _Story) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(story.since))


class FailureLog:
    """Logs what a worker pool reports (one per pool, so one store's
    failures never quiet another's): :meth:`failure` after each failed run
    is recorded in the store, :meth:`recovery` when a run commits after
    failures (``record`` as :meth:`percolite.Env.parked` lists them)."""

    def __init__(self) -> None:
        self._failing = _Failing()

    def failure(self, record: dict[str, Any]) -> None:
        """Bounded: the
        first failure of an (observer, error type) is logged with its traceback,
        then one line at most every ``REPEAT_SECONDS`` with a count; a sink that
        is down (``record["sink"] == "down"``) likewise, one story per queue; the first
        ``PARKINGS_IN_FULL`` parkings of an observer in full, then a count."""
        error = record["error"]
        observer = record["observer"]
        summary = f"{error['type']}: {error['message']}"
        traceback_text = error["traceback"].rstrip("\n")
        if record.get("sink") == "down":
            how, story, unlogged = self._failing.note(observer, _cell(record), "outage", 1)
            if how == "full":
                observers.warning(
                    "%s: the sink is failing (%s); its batches wait and are retried until it "
                    "recovers, nothing is parked\n%s",
                    observer,
                    summary,
                    traceback_text,
                )
            elif how == "summary":
                observers.warning(
                    "%s: the sink is still failing, since %s (%d more failed attempts): %s",
                    observer,
                    _since(story),
                    unlogged,
                    summary,
                )
        elif record.get("sink") == "refused":
            # Blocked, once per bucket: one line for the queue while it lasts.
            self._failing.recover(observer, _cell(record))
            how, story, unlogged = self._failing.note(observer, None, "refused", 1)
            if how == "full":
                observers.error(
                    "%s is blocked: its sink refuses this store (%s); its entries stay "
                    "queued until that is dealt with (a sink of another store: "
                    "env.take_over_sink or `percolite take-over`)",
                    observer,
                    summary,
                )
        elif record["parked"]:
            # Parked work is over (a parked key's bucket goes on, and recovers).
            if record.get("key") is None:
                self._failing.recover(observer, _cell(record))
            how, story, unlogged = self._failing.note(observer, None, "parked", PARKINGS_IN_FULL)
            if how == "full":
                observers.error(
                    "%s failed on its last attempt (%d) and is parked: %s\n%s",
                    _where(record),
                    record["attempts"],
                    summary,
                    traceback_text,
                )
            elif how == "summary":
                observers.error(
                    "%s: %d more parked since %s, the last %s: %s",
                    observer,
                    unlogged,
                    _since(story),
                    _where(record),
                    summary,
                )
        else:
            how, story, unlogged = self._failing.note(observer, _cell(record), error["type"], 1)
            if how == "full":
                observers.warning(
                    "%s failed (attempt %d), will retry: %s\n%s",
                    _where(record),
                    record["attempts"],
                    summary,
                    traceback_text,
                )
            elif how == "summary":
                observers.warning(
                    "%s is still failing with %s, since %s (%d more failed runs), the last "
                    "%s (attempt %d): %s",
                    observer,
                    error["type"],
                    _since(story),
                    unlogged,
                    _where(record),
                    record["attempts"],
                    error["message"],
                )

    def recovery(self, record: dict[str, Any]) -> None:
        """Called by the workers when a run commits whose notification had
        failed before (``record``: its last failure record). Logs at INFO once
        nothing of that observer is failing any more."""
        for kind, story in self._failing.recover(record["observer"], _cell(record)):
            if kind == "outage":
                observers.info(
                    "%s: the sink recovered (failing since %s, %d failed attempts)",
                    record["observer"],
                    _since(story),
                    story.total,
                )
            else:
                observers.info(
                    "%s recovered: no run is failing with %s any more (since %s, %d failed runs)",
                    record["observer"],
                    kind,
                    _since(story),
                    story.total,
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
