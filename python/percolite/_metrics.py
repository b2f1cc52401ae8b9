"""Metrics every process records in the store, read as totals from any process.

Each process that opens a store keeps one recorder for it. Every
``FLUSH_SECONDS`` (and when its last handle closes, and before
:meth:`Env.metrics` reads) the recorder adds what changed since its last
look to its own cell in percolite's own rows: commits, conflicts and syncs
of this process (its own metric writes left out), each observer's runs,
commits, conflicts and deferrals, and each queue's processed batches and
entries. Its own cell, so processes never conflict; a process that closes
its store adds its totals to a shared ``retired`` cell and deletes its own.
Reading sums every cell: totals over every process that worked the store,
less at most ``FLUSH_SECONDS`` of another running process's work.
Gauges (pending and parked work, queue depths, live leases) are read from
the store when asked. :func:`prometheus_text` renders both in the
Prometheus text exposition format.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterable
from typing import Any

from . import _core

__all__ = [
    "FLUSH_SECONDS",
    "flush",
    "pending_by_observer",
    "prometheus_text",
    "read",
    "recorder_for",
    "serve",
    "server_status",
]

FLUSH_SECONDS = 2.0

_ROW = _core.SYSTEM_ROW_PREFIX + b"metrics"
_FAMILY = b"m"
_RETIRED = b"retired"
# The last reconnection and the last failover any process saw, in the same
# row: {"cause" or "servers", "server", "unix", "process"}.
_EVENTS = b"e"
_EVENT_KINDS = ("reconnection", "failover")

_store_log = logging.getLogger("percolite.store")

_log = logging.getLogger("percolite.metrics")

# Counters: name -> (help, label name or None). Keys of a sample are
# (name, label value or "").
COUNTERS = {
    "commits": ("Transactions committed, percolite's own too (metric writes left out).", None),
    "conflicts": ("Commits refused with a write-write conflict.", None),
    "syncs": ("Group commits: write transactions of the store, one sync each.", None),
    "observer_runs": ("Observer runs started.", "observer"),
    "observer_commits": ("Observer runs that committed.", "observer"),
    "observer_conflicts": ("Observer runs that lost a write-write conflict.", "observer"),
    "observer_deferrals": (
        "Observer runs that deferred themselves (lingering queues).",
        "observer",
    ),
    "queue_batches": ("Batches a queue's runs handed to its combiner or exporter.", "queue"),
    "queue_entries": ("Entries in those batches.", "queue"),
    "observer_writes": (
        "Cells (by column family) and queue entries (by queue) that observers' committed "
        "runs wrote: the edges of the app's dataflow graph.",
        ("observer", "target"),
    ),
    "reconnections": (
        "Connections to the store's server lost and made again (stores on a server).",
        None,
    ),
    "failovers": ("Reconnections that reached another host (a promoted standby).", None),
    "commit_seconds_bucket": ("Commits by how long they took (seconds, cumulative).", "le"),
    "commit_seconds_sum": ("Seconds that commits took, in all.", None),
    "commit_seconds_count": ("Commits timed.", None),
}

Sample = dict[tuple[str, str], float]


class _Recorder:
    """One store's counters in this process (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}".encode()
        self.envs: weakref.WeakSet = weakref.WeakSet()
        self.totals: Sample = {}
        self.last: dict[int, Sample] = {}  # per source (env or queue), its last sample
        self.own_commits = 0  # metric writes, left out of "commits"
        self.lock = threading.Lock()
        self.seen = {kind: 0 for kind in _EVENT_KINDS}  # reconnections, failovers logged
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="percolite-metrics", daemon=True)
        self.thread.start()

    # -- sampling ---------------------------------------------------------
    def _sources(self) -> Iterable[tuple[int, Sample]]:
        envs = [env for env in list(self.envs) if not env.closed]
        if envs:
            core = envs[0].core  # one backend per path and process
            stats = core.stats()
            process: Sample = {
                ("commits", ""): stats["commits"] - self.own_commits,
                ("conflicts", ""): stats["conflicts"],
                ("syncs", ""): stats["batches"],
            }
            if "server" in stats:
                process[("reconnections", "")] = stats["reconnections"]
                process[("failovers", "")] = stats["failovers"]
            latency = core.commit_latency()
            for bound, count in latency["buckets"]:
                process[("commit_seconds_bucket", _le(bound))] = count
            process[("commit_seconds_sum", "")] = latency["sum"]
            process[("commit_seconds_count", "")] = latency["count"]
            yield 0, process
        queues = {}
        for env in envs:
            sample: Sample = {}
            for o in env.core.worker_stats()["observers"]:
                for key in ("runs", "commits", "conflicts", "deferrals"):
                    name = ("observer_" + key, o["name"])
                    sample[name] = sample.get(name, 0) + o[key]
                for target, n in o["writes"].items():
                    name = ("observer_writes", _pair(o["name"], target))
                    sample[name] = sample.get(name, 0) + n
            yield id(env), sample
            if env.app is not None:
                for queue_id, queue in env.app.queues.items():
                    queues[id(queue.core)] = (queue_id, queue.core)
        for key, (queue_id, core) in queues.items():
            batches, entries = core.counters()
            yield key, {("queue_batches", queue_id): batches, ("queue_entries", queue_id): entries}

    def _collect(self) -> Sample:
        """What changed since the last look, added to the totals."""
        delta: Sample = {}
        for source, sample in self._sources():
            before = self.last.get(source, {})
            for key, value in sample.items():
                # A counter that went down restarted (new workers): all of it is new.
                step = value - before.get(key, 0) if value >= before.get(key, 0) else value
                if step:
                    delta[key] = delta.get(key, 0) + step
            self.last[source] = sample
        for key, value in delta.items():
            self.totals[key] = self.totals.get(key, 0) + value
        return delta

    # -- writing ------------------------------------------------------------
    def _env(self) -> Any:
        for env in list(self.envs):
            if not env.closed:
                return env
        return None

    def flush(self) -> None:
        with self.lock:
            env = self._env()
            if env is None or not self._collect():
                return
            value = json.dumps(_encode(self.totals)).encode()
            events = self._new_events(env.core.stats())

            def write(tx: Any) -> None:
                tx.set(_ROW, (_FAMILY, self.id), value)
                _write_events(tx, events)

            env.run(write)
            self.own_commits += 1

    def _new_events(self, stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The reconnection and failover this process saw since the last
        flush (the last of each), logged once however many attempts or
        breaks it took: a reconnect storm is one line per flush, not one
        per attempt."""
        events: dict[str, dict[str, Any]] = {}
        if "server" not in stats:
            return events
        process = self.id.decode()
        for kind, count_key, detail in (
            ("reconnection", "reconnections", "cause"),
            ("failover", "failovers", "servers"),
        ):
            count, last = stats[count_key], stats["last_" + kind]
            if count <= self.seen[kind] or last is None:
                continue
            new = count - self.seen[kind]
            self.seen[kind] = count
            event = {detail: last[detail], "server": stats["server"], "unix": last["unix"]}
            events[kind] = {**event, "process": process}
            times = "" if new == 1 else f" ({new} times since the last report)"
            if kind == "failover":
                _store_log.warning(
                    "%s: failed over to another server%s: %s", self.path, times, last[detail]
                )
            else:
                _store_log.warning(
                    "%s: the connection to the server was lost%s and made again to %s: %s",
                    self.path,
                    times,
                    stats["server"],
                    last[detail],
                )
        return events

    def retire(self) -> None:
        """Adds this process's totals to the retired cell, deletes its own."""
        with self.lock:
            env = self._env()
            if env is None:
                return
            self._collect()
            events = self._new_events(env.core.stats())

            def fold(tx: Any) -> None:
                _write_events(tx, events)
                stored = tx.get(_ROW, (_FAMILY, _RETIRED))
                retired = _decode(json.loads(stored)) if stored else {}
                for key, value in self.totals.items():
                    retired[key] = retired.get(key, 0) + value
                tx.set(_ROW, (_FAMILY, _RETIRED), json.dumps(_encode(retired)).encode())
                tx.delete(_ROW, (_FAMILY, self.id))

            if self.totals or events:
                env.run(fold)

    def _loop(self) -> None:
        while not self.stop.wait(FLUSH_SECONDS):
            if self._env() is None:  # every handle was dropped without close()
                self._forget()
                return
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - a closing store; the next round retries
                _log.debug("metrics flush of %s failed", self.path, exc_info=True)

    def _forget(self) -> None:
        self.stop.set()
        with _recorders_lock:
            if _recorders.get(self.path) is self:
                del _recorders[self.path]

    def release(self, env: Any) -> None:
        """``env`` is closing: the last handle retires the recorder."""
        self.envs.discard(env)
        if any(not e.closed for e in self.envs):
            return
        self.envs.add(env)  # still open: write with it one last time
        try:
            self.retire()
        except Exception:  # noqa: BLE001 - best effort: the cell stays, with its last flush
            _log.debug("retiring the metrics of %s failed", self.path, exc_info=True)
        finally:
            self.envs.discard(env)
            self._forget()


_recorders: dict[str, _Recorder] = {}
_recorders_lock = threading.Lock()


def _key(env: Any) -> str:
    # A ":memory:" store is its own store: one recorder per handle.
    return env.path if env.path != ":memory:" else f":memory:{id(env)}"


def recorder_for(env: Any) -> _Recorder:
    """The recorder of ``env``'s store in this process."""
    key = _key(env)
    with _recorders_lock:
        recorder = _recorders.get(key)
        if recorder is None or recorder.stop.is_set():
            recorder = _recorders[key] = _Recorder(key)
        recorder.envs.add(env)
        return recorder


def flush(env: Any) -> None:
    """This process's counts of ``env``'s store go to the store now (as
    :meth:`percolite.Env.metrics` does first); nothing once the store's
    recorder has retired (its handles closed)."""
    with _recorders_lock:
        recorder = _recorders.get(_key(env))
    if recorder is not None and env in recorder.envs:
        recorder.flush()


def _le(bound: float | None) -> str:
    """A histogram bucket's label: its upper bound, as Prometheus writes it."""
    return "+Inf" if bound is None else repr(float(bound))


def _pair(first: str, second: str) -> str:
    """Two label values in one sample key (a JSON list: no value can break it)."""
    return json.dumps([first, second])


def _encode(sample: Sample) -> dict[str, Any]:
    out: dict[Any, Any] = {}
    for (name, label), value in sample.items():
        out.setdefault(name, {})[label] = value
    return out


def _decode(stored: dict[str, Any]) -> Sample:
    return {
        (name, label): value
        for name, labels in stored.items()
        if name in COUNTERS
        for label, value in labels.items()
    }


def pending_by_observer(env: Any) -> dict[str, int]:
    """Notifications waiting in ``env``'s store, by the name of the observer
    of their column ("(no observer)" for a column no observer has now)."""
    names = {(f, q): name for f, q, _notify, name in env.core.observed_columns()}
    pending_by: dict[str, int] = {}
    for column, n in env.core.pending_by_column().items():
        name = names.get(column, "(no observer)")
        pending_by[name] = pending_by.get(name, 0) + n
    return pending_by


def _write_events(tx: Any, events: dict[str, dict[str, Any]]) -> None:
    """Records the last reconnection and failover a process saw (in the
    transaction that also writes its metrics)."""
    for kind, event in events.items():
        tx.set(_ROW, (_EVENTS, kind.encode()), json.dumps(event).encode())


def server_status(env: Any) -> dict[str, Any] | None:
    """For a store on a server (None for a local one): ``address``, the
    server this handle reaches; its ``replication`` ("synchronous",
    "asynchronous" or "none"), ``standbys`` connected and
    ``synchronous_standby_names``; ``writer_busy_seconds``, how long this
    handle's writer has been on its current batch (0 when idle: seconds on
    end mean the server does not answer, or waits for a synchronous standby
    that does not); ``waiting_for_standbys``, the sessions of every process
    of the store whose commits wait for a synchronous standby
    (``sessions``, ``longest_seconds``); ``clock_offset_seconds``, the server's clock minus this
    machine's (leases are judged by the server's); ``reconnections`` and ``failovers``, the
    totals every process recorded (as the metrics count them); and
    ``last_reconnection`` and ``last_failover``, the last of each any
    process recorded (``cause`` or ``servers``, ``server``, ``unix``,
    ``process``), or None."""
    stats = env.core.stats()
    if "server" not in stats:
        return None
    totals = dict.fromkeys(("reconnections", "failovers"), 0)
    last: dict[str, Any] = dict.fromkeys(_EVENT_KINDS)
    with env.transaction() as tx:
        for cell in tx.scan(prefix=_ROW):
            family, qualifier = cell.column.family, cell.column.qualifier
            try:
                if family == _FAMILY:
                    stored = _decode(json.loads(cell.value))
                    for name in totals:
                        totals[name] += int(stored.get((name, ""), 0))
                elif family == _EVENTS and qualifier.decode() in last:
                    last[qualifier.decode()] = json.loads(cell.value)
            except (ValueError, AttributeError):
                continue  # a cell another version wrote
    # This process's own events, not flushed yet (the recorder writes them
    # every FLUSH_SECONDS): counted and shown now.
    recorder = recorder_for(env)
    flushed = recorder.last.get(0, {})
    for name in totals:
        totals[name] += max(0, int(stats[name]) - int(flushed.get((name, ""), 0)))
    for kind in _EVENT_KINDS:
        mine = stats["last_" + kind]
        if mine is not None and (last[kind] is None or mine["unix"] > last[kind]["unix"]):
            last[kind] = {**mine, "server": stats["server"], "process": recorder.id.decode()}
    return {
        "address": stats["server"],
        "replication": stats["replication"],
        "standbys": stats["standbys"],
        "synchronous_standby_names": stats["synchronous_standby_names"],
        "writer_busy_seconds": stats["writer_busy_seconds"],
        "waiting_for_standbys": env.core.waiting_for_standbys(),
        "clock_offset_seconds": stats["clock_offset_seconds"],
        **totals,
        "last_reconnection": last["reconnection"],
        "last_failover": last["failover"],
    }


def read(env: Any) -> dict[str, Any]:
    """The metrics of ``env``'s store: ``{"counters": {...}, "gauges": {...}}``
    (see :meth:`percolite.Env.metrics`)."""
    totals: Sample = {}
    with env.transaction() as tx:
        for cell in tx.scan(prefix=_ROW):
            if cell.column.family != _FAMILY:
                continue
            try:
                stored = _decode(json.loads(cell.value))
            except (ValueError, AttributeError):
                continue  # a cell another version wrote
            for key, value in stored.items():
                totals[key] = totals.get(key, 0) + value
    counters: dict[Any, Any] = {}
    for name, (_help, label) in COUNTERS.items():
        counters[name] = {} if label else 0
    for (name, label), value in totals.items():
        kind = COUNTERS[name][1]
        if name == "commit_seconds_sum":
            counters[name] = float(value)
        elif isinstance(kind, tuple):
            first, second = json.loads(label)
            counters[name].setdefault(first, {})[second] = int(value)
        elif kind:
            counters[name][label] = int(value)
        else:
            counters[name] = int(value)
    buckets = counters["commit_seconds_bucket"]
    counters["commit_seconds_bucket"] = dict(
        sorted(buckets.items(), key=lambda item: float(item[0]))
    )
    summaries = env.failures()
    counters["observer_failures"] = {n: s["failures"] for n, s in summaries.items()}
    counters["observer_parkings"] = {n: s["parked"] for n, s in summaries.items()}
    parked = env.parked()
    parked_by: dict[str, int] = {}
    for record in parked:
        parked_by[record["observer"]] = parked_by.get(record["observer"], 0) + 1
    pending_by = pending_by_observer(env)
    depths = env.queue_depths()
    leases = [h for h in env.core.lease_holders() if h["live"]]
    sinks = env.sinks()
    syncs = counters["syncs"]
    gauges = {
        "pending_notifications": sum(pending_by.values()),
        "pending_by_observer": pending_by,
        "parked": len(parked),
        "parked_by_observer": parked_by,
        "queue_depth": depths,
        "sink_failing": {q: int(s["state"] != "ok") for q, s in sinks.items()},
        "sink_failing_since_unix": {
            q: s["since_unix"] for q, s in sinks.items() if s["state"] != "ok"
        },
        "lease_holders": len(leases),
        "lease_groups": len({h["group"] for h in leases}),
        "transactions_per_sync": counters["commits"] / syncs if syncs else 0.0,
        "updated_unix": time.time(),
    }
    return {"counters": counters, "gauges": gauges}


_GAUGE_HELP = {
    "pending_notifications": "Notifications waiting for an observer run.",
    "pending_by_observer": ("Notifications waiting, by observer.", "observer"),
    "parked": "Parked notifications and queue keys (failed on every attempt).",
    "parked_by_observer": ("Parked work, by observer or queue processor.", "observer"),
    "queue_depth": ("Entries queued, by queue.", "queue"),
    "sink_failing": ("1 while an export queue's sink is down or refuses, by queue.", "queue"),
    "sink_failing_since_unix": ("When a failing sink went down (unix time), by queue.", "queue"),
    "lease_holders": "Worker pools holding a live lease.",
    "lease_groups": "Groups of worker pools holding live leases.",
    "transactions_per_sync": "Committed transactions per group commit (sync).",
}
_EXTRA_COUNTERS = {
    "observer_failures": ("Observer runs that failed, recorded in the store.", "observer"),
    "observer_parkings": ("Times an observer's work was parked.", "observer"),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_text(metrics: dict[str, Any]) -> str:
    """``metrics`` (as :func:`read` returns them) in the Prometheus text
    exposition format, every name prefixed ``percolite_``."""
    lines: list[str] = []

    def emit(name: str, kind: str, help_text: str, label: Any, value: Any) -> None:
        full = f"percolite_{name}" + ("_total" if kind == "counter" else "")
        lines.append(f"# HELP {full} {help_text}")
        lines.append(f"# TYPE {full} {kind}")
        if label is None:
            lines.append(f"{full} {float(value)!r}")
        elif isinstance(label, tuple):
            outer, inner = label
            for key, by_inner in sorted(value.items()):
                for second, n in sorted(by_inner.items()):
                    labels = f'{outer}="{_escape(key)}",{inner}="{_escape(second)}"'
                    lines.append(f"{full}{{{labels}}} {float(n)!r}")
        else:
            for key, n in sorted(value.items()):
                lines.append(f'{full}{{{label}="{_escape(str(key))}"}} {float(n)!r}')

    counters = metrics["counters"]
    for name, (help_text, label) in {**COUNTERS, **_EXTRA_COUNTERS}.items():
        if name.startswith("commit_seconds"):
            continue  # one histogram, below
        emit(name, "counter", help_text, label, counters[name])
    lines.append(
        "# HELP percolite_commit_seconds How long commits took, from the call to the result."
    )
    lines.append("# TYPE percolite_commit_seconds histogram")
    for le, n in (counters["commit_seconds_bucket"] or {"+Inf": 0}).items():
        lines.append(f'percolite_commit_seconds_bucket{{le="{le}"}} {float(n)!r}')
    lines.append(f"percolite_commit_seconds_sum {float(counters['commit_seconds_sum'])!r}")
    lines.append(f"percolite_commit_seconds_count {float(counters['commit_seconds_count'])!r}")
    gauges = metrics["gauges"]
    for name, spec in _GAUGE_HELP.items():
        help_text, label = spec if isinstance(spec, tuple) else (spec, None)
        emit(name, "gauge", help_text, label, gauges[name])
    return "\n".join(lines) + "\n"


def serve(env: Any, port: int) -> Any:
    """Serves ``GET /metrics`` (the Prometheus text of ``env``'s store) on
    127.0.0.1:``port`` from a daemon thread; returns the server (call its
    ``shutdown()``). ``ValueError`` naming the port when it cannot be bound."""
    import errno
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"--metrics-port must be a port number from 1 to 65535, not {port!r}")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            try:
                body = prometheus_text(env.metrics()).encode()
            except Exception as e:  # noqa: BLE001 - a closing store: say so
                self.send_error(503, f"metrics unavailable: {e}")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            _log.debug("metrics request: " + format, *args)

    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"--metrics-port {port}: the address is already in use") from None
        raise ValueError(f"--metrics-port {port}: {e.strerror or e}") from None
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, name="percolite-metrics-http", daemon=True
    ).start()
    return server
