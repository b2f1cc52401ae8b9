"""HTML cards for Jupyter: the ``_repr_html_`` of :class:`percolite.Env`,
:class:`percolite.App` and the queues.

Every text that comes from the store or the application (paths, names,
errors, codecs) goes through :func:`html.escape`. The cards load nothing:
no script, no font, no style sheet, only inline styles whose colours are
either inherited from the notebook's theme or translucent, so that they
read the same on light and dark themes.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import App
    from ._combine import CombineQueue
    from ._env import Env
    from ._export import ExportQueue

__all__ = ["app_graph_svg", "app_html", "combine_queue_html", "env_html", "export_queue_html"]

_LINE = "rgba(127,127,127,.45)"
_CARD = (
    f"border:1px solid {_LINE};border-radius:6px;padding:6px 12px;margin:4px 0;"
    "color:inherit;background:transparent;line-height:1.45;max-width:72em"
)
_TITLE = "font-weight:600;margin:2px 0 6px 0"
_SECTION = "font-weight:600;margin:8px 0 2px 0"
_TABLE = "border-collapse:collapse;margin:2px 0;color:inherit;background:transparent"
_CELL = "text-align:left;vertical-align:top;padding:1px 10px 1px 0;color:inherit;border:none"
_HEAD = f"{_CELL};font-weight:600;border-bottom:1px solid {_LINE}"
_KEY = f"{_CELL};opacity:.75;white-space:nowrap"
_CODE = "font-family:monospace"
_NOTE = "opacity:.75"
_BADGE = "padding:0 7px;border-radius:9px;font-size:90%;white-space:nowrap;background:{}"
_BADGE_COLOURS = {
    "ok": "rgba(40,167,69,.25)",
    "warn": "rgba(255,160,0,.3)",
    "bad": "rgba(220,53,69,.3)",
    "off": "rgba(127,127,127,.25)",
}


def _e(value: object) -> str:
    """``value`` as escaped text: bytes decoded as UTF-8 (undecodable
    bytes as escapes), None as an empty string."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode("utf-8", "backslashreplace")
    return html.escape(str(value), quote=True)


def _code(value: object) -> str:
    return f'<span style="{_CODE}">{_e(value)}</span>'


def _badge(text: str, tone: str) -> str:
    return f'<span style="{_BADGE.format(_BADGE_COLOURS[tone])}">{_e(text)}</span>'


def _card(title: str, body: list[str]) -> str:
    """A card: ``title`` (markup) over the parts of ``body`` (markup)."""
    return f'<div style="{_CARD}"><div style="{_TITLE}">{title}</div>{"".join(body)}</div>'


def _section(title: str) -> str:
    return f'<div style="{_SECTION}">{_e(title)}</div>'


def _fields(pairs: list[tuple[str, str]]) -> str:
    """A two-column table of ``(label, markup)`` pairs."""
    rows = "".join(
        f'<tr><td style="{_KEY}">{_e(label)}</td><td style="{_CELL}">{markup}</td></tr>'
        for label, markup in pairs
    )
    return f'<table style="{_TABLE}"><tbody>{rows}</tbody></table>'


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """A table with ``headers`` (text) over ``rows`` of markup cells."""
    head = "".join(f'<th style="{_HEAD}">{_e(h)}</th>' for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td style="{_CELL}">{cell}</td>' for cell in row) + "</tr>"
        for row in rows
    )
    return f'<table style="{_TABLE}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _when(unix: float | None) -> str:
    if unix is None:
        return ""
    return _e(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix)))


def _name(fn: Any) -> str:
    """A callable's name for a card (its qualified name, else its repr)."""
    return getattr(fn, "__qualname__", None) or repr(fn)


def _column(family: bytes, qualifier: bytes) -> str:
    return _code(b"%s:%s" % (family, qualifier))


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _count(n: int, tone_if_any: str) -> str:
    return _badge(str(n), tone_if_any) if n else _e(n)


# -- Env ---------------------------------------------------------------------


def env_html(env: Env) -> str:
    """The status card of ``env``: what ``env.status(queues=False)`` says
    (no queue scan, so it is cheap to show often), or "closed"."""
    title = f"percolite.Env {_code(env.path)} "
    if env.closed:
        return _card(title + _badge("closed", "off"), [_fields([("sync", _e(env.sync))])])
    try:
        status = env.status(queues=False)
    except Exception as error:  # noqa: BLE001 - the card says so rather than failing to show
        note = f"status unavailable: {type(error).__name__}: {error}"
        return _card(title + _badge("error", "bad"), [f'<div style="{_NOTE}">{_e(note)}</div>'])
    return _card(title + _badge("open", "ok"), _env_body(env, status))


def _env_body(env: Env, status: dict[str, Any]) -> list[str]:
    identity = status["identity"]
    workers = status["workers"]
    leases = status["leases"]
    live = [lease for lease in leases if lease.get("live")]
    if workers["running"]:
        pool = (
            f"running: {workers['threads']} threads, {workers['queued']} queued, "
            f"{workers['active']} active, {workers['committing']} committing"
        )
    else:
        pool = "not running in this process"
    app = env.app
    parked = status["parked"]
    fields = [
        ("backend", _e(env.backend)),
        ("sync", _e(env.sync)),
        ("app", _e(app.name) if app is not None else f'<span style="{_NOTE}">none bound</span>'),
        (
            "identity",
            f"{_code(identity['store'])} epoch {_e(identity['epoch'])}"
            if identity is not None
            else f'<span style="{_NOTE}">not made yet</span>',
        ),
        ("pending", _e(_plural(status["pending"], "notification"))),
        (
            "parked",
            _count(parked, "bad")
            + (f' <span style="{_NOTE}">(env.parked())</span>' if parked else ""),
        ),
        ("workers", _e(pool)),
        (
            "leases",
            _e(f"{len(live)} live of {len(leases)}")
            + "".join(
                f"<br>{_code(lease.get('owner'))} group {_e(lease.get('group'))}, "
                f"{_e(lease.get('threads'))} threads, {_e(lease.get('partitions'))} partitions"
                for lease in live
            ),
        ),
    ]
    body = [_fields(fields)]
    observers = status["observers"]
    if observers:
        rows = []
        for o in observers:
            error = ""
            if o["last_error_type"] is not None:
                error = _e(f"{o['last_error_type']}: {o['last_error_message']}")
                error += f' <span style="{_NOTE}">{_when(o["last_failure_unix"])}</span>'
            rows.append(
                [
                    _e(o["name"]),
                    _column(o["family"], o["qualifier"]),
                    _e(o["notify"]),
                    _e(o["pending"]),
                    _e(o["runs"]),
                    _count(o["failures"], "warn"),
                    _count(o["parked"], "bad"),
                    error,
                ]
            )
        body.append(_section("observers"))
        headers = ["name", "column", "notify", "pending", "runs", "failures", "parked"]
        body.append(_table([*headers, "last error"], rows))
    sinks = status["sinks"]
    if sinks:
        rows = []
        for queue_id, sink in sinks.items():
            state = sink["state"]
            tone = {"ok": "ok", "failing": "warn"}.get(state, "bad")
            last = sink.get("last_error")
            rows.append(
                [
                    _e(queue_id),
                    _badge(state, tone),
                    _when(sink.get("since_unix")),
                    _e(sink.get("buckets", "")),
                    _e(f"{last['type']}: {last['message']}") if last else "",
                ]
            )
        body.append(_section("sinks of the export queues"))
        body.append(_table(["queue", "state", "since", "buckets waiting", "last error"], rows))
    return body


# -- App and queues ------------------------------------------------------------


def app_graph_svg(app: App) -> str | None:
    """The app's graph (observed columns, queues, exporters and how they
    feed each other) as one self-contained ``<svg>`` element, or None while
    there is none to show. The App card puts it above its tables as it is:
    whatever makes it must escape the names it draws (``html.escape``) and
    load nothing (no script, no font, no link)."""
    from .ui import _graph

    graph = _graph.declared(app)
    return _graph.svg(graph) if graph["nodes"] else None


def app_html(app: App) -> str:
    """The card of ``app``: its graph (:func:`app_graph_svg`) when there is
    one, and its declarations: observers and the columns they observe,
    queues with kind, buckets, codecs and linger, and where each queue's
    output goes."""
    body = []
    svg = app_graph_svg(app)
    if svg:
        body.append(f"<div>{svg}</div>")
    observers = app.observers
    if observers:
        rows = [
            [
                _e(o.name),
                _column(o.column.family, o.column.qualifier),
                _e(o.notify.name),
                _e("forever" if o.max_attempts is None else o.max_attempts),
            ]
            for o in observers
        ]
        body.append(_section("observers"))
        body.append(_table(["name", "observes", "notify", "attempts"], rows))
    queues = list(app.queues.values())
    if queues:
        rows = [
            [
                _e(queue.id),
                _e(_kind(queue)),
                _e(queue.buckets),
                _code(queue.key_codec.name),
                _code(queue.value_codec.name),
                _e(f"{queue.linger:g} s"),
                _feeds(queue),
            ]
            for queue in queues
        ]
        body.append(_section("queues"))
        headers = ["id", "kind", "buckets", "key codec", "value codec", "linger", "feeds"]
        body.append(_table(headers, rows))
    if not body:
        body.append(f'<div style="{_NOTE}">no observers or queues declared</div>')
    counts = f"{_plural(len(observers), 'observer')}, {_plural(len(queues), 'queue')}"
    title = f'percolite.App {_code(app.name)} <span style="{_NOTE}">{counts}</span>'

    return _card(title, body)


def _kind(queue: Any) -> str:
    if hasattr(queue, "combiner"):
        combiner = queue.combiner if isinstance(queue.combiner, str) else _name(queue.combiner)
        return f"combine ({combiner})"
    return "export"


def _feeds(queue: Any) -> str:
    """Where a queue's output goes: an export queue's exporter; a combine
    queue's export queues and change observer."""
    if not hasattr(queue, "combiner"):
        return "→ exporter " + _code(_name(queue.exporter))
    parts = ["→ export queue " + _code(q.id) for q in queue.export_queues]
    if queue.change_observer is not None:
        parts.append("→ on_change " + _code(_name(queue.change_observer)))
    return "<br>".join(parts)


def _queue_fields(queue: Any) -> list[tuple[str, str]]:
    return [
        ("kind", _e(_kind(queue))),
        ("buckets", _e(queue.buckets)),
        ("key codec", _code(queue.key_codec.name)),
        ("value codec", _code(queue.value_codec.name)),
        ("linger", _e(f"{queue.linger:g} s")),
        ("attempts", _e("forever" if queue.max_attempts is None else queue.max_attempts)),
    ]


def combine_queue_html(queue: CombineQueue[Any, Any]) -> str:
    """The card of a combine queue: id, kind and combiner, buckets, codecs,
    buffer size, linger, attempts, and where its changes go."""
    fields = _queue_fields(queue)
    fields.insert(4, ("buffer size", _e(queue.buffer_size)))
    feeds = _feeds(queue)
    if feeds:
        fields.append(("feeds", feeds))
    return _card(f"percolite.CombineQueue {_code(queue.id)}", [_fields(fields)])


def export_queue_html(queue: ExportQueue[Any, Any]) -> str:
    """The card of an export queue: id, kind, buckets, codecs, batch size,
    linger, attempts and exporter."""
    fields = _queue_fields(queue)
    fields.insert(4, ("batch size", _e(queue.batch_size)))
    fields.append(("feeds", _feeds(queue)))
    return _card(f"percolite.ExportQueue {_code(queue.id)}", [_fields(fields)])
