"""What the console shows, read from a store: the data behind ``/api/``.

A :class:`Monitor` wraps an open :class:`percolite.Env`. It reads everything
from the store (so it shows the work of every process, not only its own) and
keeps, in memory, a short history of samples taken every
``SAMPLE_SECONDS``: the time series and the rates (runs/s, commits/s, the
rate on each graph edge) come from differences between samples. Every method
returns plain JSON-ready data.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import threading
import time
from itertools import pairwise
from typing import Any

from .. import _core, _metrics
from .._app import App
from .._env import (
    describe_record,
    queue_processors,
    recorded_app,
    recorded_identity,
    recorded_queues,
    shown_target,
)
from ..codecs import Codec, get_codec
from ..errors import Error
from . import _graph

__all__ = ["Monitor", "SAMPLE_SECONDS", "HISTORY_SECONDS"]

# How often the monitor samples the store's metrics, and how long it keeps them.
SAMPLE_SECONDS = 2.0
HISTORY_SECONDS = 600.0
# Rates are differences over this long a window (metrics reach the store
# every few seconds, so a shorter one would jump).
RATE_WINDOW_SECONDS = 10.0
# Rows of the cell browser per page, at most.
MAX_PAGE = 500


# Longest value the cell browser shows (the rest is counted, not sent).
MAX_SHOWN = 2000


def _text(value: bytes) -> str:
    """Bytes as readable text: UTF-8, with what is not printable (control
    bytes, invalid UTF-8) escaped as \\xNN."""
    text = value.decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.urlsafe_b64encode(value).decode()


def _unb64(value: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(value.encode())
    except (ValueError, UnicodeError):
        raise ValueError(f"{what} is not URL-safe base64: {value!r}") from None


def _shown_value(value: bytes, form: str) -> str:
    """A value as text (newlines and tabs kept, other unprintable bytes
    escaped) or hex, cut at MAX_SHOWN characters with the bytes left said."""
    if form == "hex":
        shown = value[: MAX_SHOWN // 3].hex(" ")
        left = len(value) - MAX_SHOWN // 3
    else:
        text = value.decode("utf-8", "backslashreplace")
        shown = "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" for c in text)
        left = 0
        if len(shown) > MAX_SHOWN:
            left = len(value) - len(shown[:MAX_SHOWN].encode("utf-8", "surrogateescape"))
            shown = shown[:MAX_SHOWN]
    return shown + (f" \u2026 ({left:,} more bytes)" if left > 0 else "")


class Monitor:
    """The console's view of ``env`` (see the module docstring)."""

    def __init__(self, env: Any, *, sample_seconds: float = SAMPLE_SECONDS) -> None:
        self.env = env
        self.sample_seconds = sample_seconds
        self._samples: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=max(2, int(HISTORY_SECONDS / sample_seconds) + 1)
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- sampling -----------------------------------------------------------
    def start(self) -> None:
        """Samples now, then every ``sample_seconds`` on a daemon thread."""
        self.sample()
        thread = threading.Thread(target=self._loop, name="percolite-console", daemon=True)
        thread.start()
        self._thread = thread  # only once it runs: stop() may come at any moment (Ctrl-C)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.sample_seconds):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a closing store; the page shows the last sample
                if self.env.closed:
                    return

    def sample(self) -> dict[str, Any]:
        """Reads the store's metrics now and keeps them in the history (this
        process's own counts first go to the store, as env.metrics() does:
        a console beside workers shows them without waiting for a flush)."""
        try:
            _metrics.flush(self.env)
        except Exception:  # noqa: BLE001 - a store that refuses commits: show what it has
            pass
        metrics = _metrics.read(self.env)
        sample = {"unix": time.time(), "mono": time.monotonic(), **metrics}
        with self._lock:
            self._samples.append(sample)
        return sample

    def _window(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The newest sample and one at least RATE_WINDOW_SECONDS older (or
        the oldest), None with fewer than two."""
        with self._lock:
            samples = list(self._samples)
        if len(samples) < 2:
            return None
        newest = samples[-1]
        older = samples[0]
        for s in reversed(samples[:-1]):
            older = s
            if newest["mono"] - s["mono"] >= RATE_WINDOW_SECONDS:
                break
        return older, newest

    @staticmethod
    def _per_second(older: dict[str, Any], newest: dict[str, Any], name: str) -> dict[str, float]:
        seconds = max(newest["mono"] - older["mono"], 1e-6)
        before = older["counters"].get(name, {})
        return {
            key: max(0, n - before.get(key, 0)) / seconds
            for key, n in newest["counters"].get(name, {}).items()
        }

    # -- the pieces of the page ---------------------------------------------
    def store(self) -> dict[str, Any]:
        env = self.env
        backend = env.backend
        size = None
        if backend == "lmdb":
            try:
                size = os.path.getsize(os.path.join(env.path, "data.mdb"))
            except OSError:
                size = None
        app = env.app
        return {
            "backend": backend,
            "location": shown_target(env.path),
            "size_bytes": size,
            "identity": recorded_identity(env),
            "app": app.name if app is not None else self._recorded_app_name(),
            "app_bound": app is not None,
        }

    def _recorded_app_name(self) -> str | None:
        with self.env.transaction() as tx:
            return recorded_app(tx).get("name")

    def groups(self) -> list[dict[str, Any]]:
        """Worker groups and their pools' leases, from the store."""
        # Leases are judged by the store's clock (a server's, for a store on one).
        now = time.time() + self.env.stats().get("clock_offset_seconds", 0.0)
        groups: dict[str, list[dict[str, Any]]] = {}
        for holder in self.env.core.lease_holders():
            host, _, rest = holder["owner"].partition(":")
            pid, _, _suffix = rest.partition(":")
            groups.setdefault(holder["group"], []).append(
                {
                    "owner": holder["owner"],
                    "host": host,
                    "pid": int(pid) if pid.isdigit() else None,
                    "threads": holder["threads"],
                    "partitions": holder["partitions"],
                    "live": holder["live"],
                    "expires_unix": holder["expires_unix"],
                    "expires_in": round(holder["expires_unix"] - now, 1),
                    "renewed_unix": holder["renewed_unix"],
                }
            )
        return [{"group": g, "pools": pools} for g, pools in sorted(groups.items())]

    def status(self) -> dict[str, Any]:
        """The page's main snapshot: the store, the groups, a row per observer
        and queue with its live rates, and the sinks. The same figures as
        ``percolite status --json`` (``env.status()``), plus rates."""
        status = self.env.status(queues=True)
        window = self._window()
        runs = commits = {}
        entries: dict[str, float] = {}
        if window is not None:
            runs = self._per_second(*window, "observer_runs")
            commits = self._per_second(*window, "observer_commits")
            entries = self._per_second(*window, "queue_entries")
        queue_ids = set(status["queues"]) | set(status["sinks"])
        rows = []
        for o in status["observers"]:
            processor = _core.parse_processor_name(o["name"])
            is_queue = processor is not None
            kind, queue_id = processor if processor is not None else ("observer", "")
            sink = status["sinks"].get(queue_id) if is_queue else None
            rows.append(
                {
                    "name": o["name"],
                    "kind": kind,
                    "queue": queue_id if is_queue else None,
                    "column": [_text(o["family"]), _text(o["qualifier"])],
                    "notify": o["notify"],
                    "pending": o["pending"],
                    "running": o["running"],
                    "runs_per_second": round(runs.get(o["name"], 0.0), 2),
                    "commits_per_second": round(commits.get(o["name"], 0.0), 2),
                    "entries_per_second": round(entries.get(queue_id, 0.0), 2)
                    if is_queue
                    else None,
                    "conflicts": o["conflicts"],
                    "failures": o["failures"],
                    "parked": o["parked"],
                    "depth": status["queues"].get(queue_id) if is_queue else None,
                    "sink": sink["state"] if sink is not None else None,
                    "last_error_type": o["last_error_type"],
                    "last_error_message": o["last_error_message"],
                    "last_failure_unix": o["last_failure_unix"],
                }
            )
            queue_ids.discard(queue_id)
        return {
            "store": self.store(),
            "pending": status["pending"],
            "parked": status["parked"],
            "groups": self.groups(),
            "observers": rows,
            "queues": status["queues"],
            "sinks": status["sinks"],
            "workers": status["workers"],
            "commits": status["store"],
            "server": status["server"],
            "updated_unix": time.time(),
        }

    def history(self) -> dict[str, Any]:
        """Time series of the kept samples: pending and parked work as
        sampled; runs, commits and failures per second, transactions per
        sync and mean commit latency over each interval between samples."""
        with self._lock:
            samples = list(self._samples)
        series: dict[str, list[Any]] = {
            "unix": [],
            "pending": [],
            "parked": [],
            "runs_per_second": [],
            "commits_per_second": [],
            "failures_per_second": [],
            "transactions_per_sync": [],
            "commit_latency_ms": [],
        }
        for older, newest in pairwise(samples):
            seconds = max(newest["mono"] - older["mono"], 1e-6)
            a, b = older["counters"], newest["counters"]

            def step(name: str, a: dict[str, Any] = a, b: dict[str, Any] = b) -> float:
                before, after = a.get(name, 0), b.get(name, 0)
                if isinstance(after, dict):
                    return float(sum(after.values()) - sum(before.values()))
                return float(after - before)

            syncs = step("syncs")
            timed = step("commit_seconds_count")
            series["unix"].append(round(newest["unix"], 3))
            series["pending"].append(newest["gauges"]["pending_notifications"])
            series["parked"].append(newest["gauges"]["parked"])
            series["runs_per_second"].append(round(max(0.0, step("observer_runs")) / seconds, 2))
            series["commits_per_second"].append(round(max(0.0, step("commits")) / seconds, 2))
            series["failures_per_second"].append(
                round(max(0.0, step("observer_failures")) / seconds, 2)
            )
            series["transactions_per_sync"].append(
                # Idle (no commits but the metrics' own), there is nothing to say.
                round(step("commits") / syncs, 2) if syncs > 0 and step("commits") > 0 else None
            )
            series["commit_latency_ms"].append(
                round(1000 * step("commit_seconds_sum") / timed, 3) if timed > 0 else None
            )
        return series

    def graph(self) -> dict[str, Any]:
        """The dataflow graph (see :mod:`percolite.ui._graph`) with live rates."""
        env = self.env
        with self._lock:
            newest = self._samples[-1] if self._samples else None
        if newest is None:
            newest = self.sample()
        counters, gauges = newest["counters"], newest["gauges"]
        window = self._window()
        edge_rates: dict[tuple[str, str], float] = {}
        runs: dict[str, float] = {}
        queues = self._queues()
        processors = {f"{q['kind']} {qid}": f"queue:{qid}" for qid, q in queues.items()}
        if window is not None:
            runs = self._per_second(*window, "observer_runs")
            older, later = window
            seconds = max(later["mono"] - older["mono"], 1e-6)
            before_writes = older["counters"].get("observer_writes", {})
            for observer, targets in later["counters"].get("observer_writes", {}).items():
                source = processors.get(observer, f"observer:{observer}")
                for target, n in targets.items():
                    step = n - before_writes.get(observer, {}).get(target, 0)
                    edge_rates[(source, target)] = max(0, step) / seconds
            entries = self._per_second(*window, "queue_entries")
            for queue_id, rate in entries.items():
                if queues.get(queue_id, {}).get("kind") == "export queue":
                    edge_rates[(f"queue:{queue_id}", f"sink:{queue_id}")] = rate
        return _graph.build(
            observed=env.core.observed_columns(),
            queues=queues,
            writes=counters.get("observer_writes", {}),
            rates=edge_rates,
            # Counted now, not at the last sample: the status beside it is.
            pending=_metrics.pending_by_observer(self.env),
            depths=gauges["queue_depth"],
            sinks=env.sinks(),
            runs_per_second=runs,
        )

    def _queues(self) -> dict[str, dict[str, Any]]:
        """The queues of the bound app (with export_to and sinks), else the
        recorded app's."""
        app = self.env.app
        if app is not None:
            return _graph.declared_queues(app)
        with self.env.transaction() as tx:
            recorded = recorded_queues(tx)
        return {
            qid: {"kind": q.get("kind"), "export_to": [], "sink": None}
            for qid, q in recorded.items()
        }

    def failures(self) -> dict[str, Any]:
        return {"failures": self.env.failures()}

    def work(
        self,
        status: str = "parked",
        observer: str | None = None,
        queue: str | None = None,
        limit: int = 200,
    ) -> dict[str, Any]:
        """Failed work, grouped by observer (a queue's processor for its
        keys): ``status`` "parked" (given up on until retried), "failing"
        (failed, to be retried) or "all"; at most ``limit`` items a group,
        each with an ``item`` handle that the retry action takes."""
        if status not in ("parked", "failing", "all"):
            raise ValueError(f"status must be 'parked', 'failing' or 'all', not {status!r}")
        if not 1 <= limit <= 10_000:
            raise ValueError(f"limit must be from 1 to 10000, not {limit}")
        records = self.env.core.work_records(status == "parked")
        if status == "failing":
            records = [r for r in records if not r["parked"]]
        groups: dict[str, dict[str, Any]] = {}
        for raw in records:
            processor = _core.parse_processor_name(raw["observer"])
            queue_id = processor[1] if processor is not None else None
            is_queue = raw["key"] is not None
            if observer is not None and raw["observer"] != observer:
                continue
            if queue is not None and (not is_queue or queue_id != queue):
                continue
            group = groups.setdefault(
                raw["observer"],
                {
                    "observer": raw["observer"],
                    "queue": queue_id if is_queue else None,
                    "count": 0,
                    "items": [],
                },
            )
            group["count"] += 1
            if len(group["items"]) >= limit:
                continue
            handle = {
                "observer": raw["observer"],
                "cell": [_b64(raw["row"]), _b64(raw["family"]), _b64(raw["qualifier"])],
                "key": _b64(raw["key"]),
            }
            described = describe_record(self.env.app, dict(raw))
            key = described["key"]
            group["items"].append(
                {
                    "item": base64.urlsafe_b64encode(json.dumps(handle).encode()).decode(),
                    "row": _text(raw["row"]),
                    "column": [_text(raw["family"]), _text(raw["qualifier"])],
                    "key": None
                    if key is None
                    else (_text(key) if isinstance(key, bytes) else repr(key)),
                    "attempts": raw["attempts"],
                    "parked": raw["parked"],
                    "sink": raw["sink"],
                    "first_failure_unix": raw["first_failure_unix"],
                    "last_failure_unix": raw["last_failure_unix"],
                    "error": raw["error"],
                }
            )
        return {"total": sum(g["count"] for g in groups.values()), "groups": list(groups.values())}

    def retry(
        self, *, observer: str | None = None, queue: str | None = None, item: str | None = None
    ) -> dict[str, Any]:
        """Puts parked work back to run: all of it, an observer's, a queue's
        or one item (a handle from :meth:`parked`)."""
        if item is not None:
            try:
                handle = json.loads(_unb64(item, "item"))
                name = handle["observer"]
                cell = tuple(_unb64(part, "item") for part in handle["cell"])
                key = None if handle["key"] is None else _unb64(handle["key"], "item")
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"item is not a parked item's handle: {item[:60]!r}") from None
            retried = self.env.core.retry_parked([name], False, cell, key)
            return {"retried": retried, "what": f"one item of {name}"}
        parked_names = {r["observer"] for r in self.env.core.work_records(True)}
        if observer is not None:
            observed = {name for _f, _q, _n, name in self.env.core.observed_columns()}
            if observer not in observed | parked_names:
                raise ValueError(f"no observer named {observer!r} in this store")
            return {
                "retried": self.env.core.retry_parked([observer]),
                "what": f"observer {observer!r}",
            }
        if queue is not None:
            processors = queue_processors(queue)
            if queue not in self._queues() and not parked_names.intersection(processors):
                raise ValueError(f"no queue named {queue!r} in this store")
            return {"retried": self.env.core.retry_parked(processors), "what": f"queue {queue!r}"}
        return {"retried": self.env.retry_parked(), "what": "all parked work"}

    def take_over(self, queue: str) -> dict[str, Any]:
        if self.env.app is None:
            raise Error(
                f"taking the sink of export queue {queue!r} over needs the app's code (its "
                "exporter): serve the console with --app MODULE:APP (or from percolite worker "
                "--ui-port)"
            )
        return self.env.take_over_sink(queue)

    def cells(
        self,
        *,
        prefix: str | None = None,
        start: str | None = None,
        end: str | None = None,
        after: str | None = None,
        limit: int = 50,
        form: str = "text",
        queue: str | None = None,
    ) -> dict[str, Any]:
        """One page of cells in order: rows by ``prefix`` or by ``start <=
        row < end`` (text), after the cursor ``after`` (the ``next`` of the
        page before); values as text or hex. With ``queue``, that combine
        queue's current values instead, decoded by its codecs."""
        if form not in ("text", "hex"):
            raise ValueError(f"form must be 'text' or 'hex', not {form!r}")
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be from 1 to {MAX_PAGE}, not {limit}")
        if queue is not None:
            return self._queue_values(queue, prefix=prefix, after=after, limit=limit)
        cursor = None
        if after is not None:
            try:
                cursor = tuple(_unb64(p, "after") for p in json.loads(_unb64(after, "after")))
            except (ValueError, TypeError):
                raise ValueError(f"after is not a cursor of this console: {after[:60]!r}") from None
        kwargs: dict[str, Any] = {}
        if prefix is not None and (start is not None or end is not None):
            raise ValueError("give either prefix or start/end, not both")
        if cursor is not None:
            kwargs["start"] = cursor[0]
            if end is not None:
                kwargs["end"] = end.encode()
            elif prefix is not None:
                kwargs["end"] = _prefix_end(prefix.encode())
        elif prefix is not None:
            kwargs["prefix"] = prefix.encode()
        else:
            if start is not None:
                kwargs["start"] = start.encode()
            if end is not None:
                kwargs["end"] = end.encode()
        rows: list[dict[str, Any]] = []
        next_cursor = None
        with self.env.transaction() as tx:
            for cell in tx.scan(**kwargs):
                where = (cell.row, cell.column.family, cell.column.qualifier)
                if cursor is not None and where <= cursor:
                    continue
                if len(rows) == limit:
                    next_cursor = rows[-1]["_where"]
                    break
                rows.append(
                    {
                        "_where": where,
                        "row": _text(cell.row),
                        "family": _text(cell.column.family),
                        "qualifier": _text(cell.column.qualifier),
                        "value": _shown_value(cell.value, form),
                        "size": len(cell.value),
                    }
                )
        for r in rows:
            r.pop("_where")
        nxt = None
        if next_cursor is not None:
            nxt = _b64(json.dumps([_b64(p) for p in next_cursor]).encode())
        return {"cells": rows, "next": nxt}

    def _queue_values(
        self, queue_id: str, *, prefix: str | None, after: str | None, limit: int
    ) -> dict[str, Any]:
        app = self.env.app
        declared = app.queues.get(queue_id) if app is not None else None
        if declared is None or declared.layout["kind"] != "combine queue":
            with self.env.transaction() as tx:
                recorded = recorded_queues(tx).get(queue_id)
            if recorded is None:
                raise ValueError(f"no combine queue named {queue_id!r} in this store")
            if recorded.get("kind") != "combine queue":
                raise ValueError(
                    f"{queue_id!r} is an {recorded.get('kind')}: its entries leave for its sink, "
                    "it keeps no current values (browse its rows as cells)"
                )
            # A stand-in with the recorded layout and codecs: it only reads.
            declared = App("console").combine_queue(
                queue_id,
                buckets=int(recorded.get("buckets", 1)),
                combiner=lambda _key, values: values[-1],
                key_codec=_safe_codec(recorded.get("key_codec")),
                value_codec=_safe_codec(recorded.get("value_codec")),
            )
        cursor = None
        if after is not None:
            cursor = _unb64(after, "after")
        wanted = None
        if prefix is not None:
            wanted = prefix if declared.key_codec.name == "str" else None
            if wanted is None:
                raise ValueError(
                    f"combine queue {queue_id!r}: a key prefix needs str keys, "
                    f"its keys are {declared.key_codec.name!r}"
                )
        rows: list[dict[str, Any]] = []
        nxt = None
        with self.env.transaction() as tx:
            for key, value in declared.scan(tx, wanted):
                encoded = declared.key_codec.encode(key)
                if cursor is not None and encoded <= cursor:
                    continue
                if len(rows) == limit:
                    nxt = _b64(declared.key_codec.encode(rows[-1]["_key"]))
                    break
                rows.append({"_key": key, "key": _repr(key), "value": _repr(value)})
        for r in rows:
            r.pop("_key")
        return {"queue": queue_id, "values": rows, "next": nxt}


def _repr(value: Any) -> Any:
    """A decoded key or value as JSON gives it (numbers stay numbers), else as text."""
    if isinstance(value, bytes):
        return _shown_value(value, "text")
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return list(value) if isinstance(value, tuple) else value


def _prefix_end(prefix: bytes) -> bytes | None:
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _safe_codec(name: Any) -> Codec:
    """A recorded codec by name; raw bytes for pickle (never unpickled by
    the console) and for codecs this version does not know."""
    if not isinstance(name, str) or name == "pickle":
        return get_codec("bytes")
    try:
        return get_codec(name)
    except (ValueError, TypeError):
        return get_codec("bytes")
