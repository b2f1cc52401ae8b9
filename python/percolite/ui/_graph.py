"""The app's dataflow graph: what feeds what, from the store and the app.

Nodes are column families (qualifiers folded: they are often data),
observers, queues and sinks. Edges:

* family -> observer: the observer watches a column of the family (from the
  observed columns the store records);
* observer -> family or queue: what the observer's committed runs wrote,
  learned from the runs (the ``observer_writes`` metric every process records
  in the store), so the graph of the real app appears without declaring it;
  a queue's processor (its combiner and change observer) is the queue's node;
* combine queue -> export queue: declared with ``export_to``;
* export queue -> sink.

:func:`build` makes the graph as plain data (what ``/api/graph`` serves),
:func:`layout` places it in layers from left to right, :func:`svg` draws it.
"""

from __future__ import annotations

import html
import math
from typing import Any

from .. import _core

__all__ = ["build", "declared", "declared_queues", "layout", "svg"]


def _node_id(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def build(
    *,
    observed: list[tuple[bytes, bytes, str, str]],
    queues: dict[str, dict[str, Any]],
    writes: dict[str, dict[str, int]],
    rates: dict[tuple[str, str], float] | None = None,
    pending: dict[str, int] | None = None,
    depths: dict[str, int] | None = None,
    sinks: dict[str, dict[str, Any]] | None = None,
    runs_per_second: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The graph as ``{"nodes": [...], "edges": [...]}``.

    ``observed``: the store's observed columns ``(family, qualifier, notify,
    observer name)``; ``queues``: ``{id: {"kind", "export_to": [ids], "sink":
    description or None}}``; ``writes``: ``{observer name: {target: n}}``
    (targets ``family:F`` or ``queue:ID``); ``rates``: per edge ``(source id,
    target id)``, per second; ``pending``: notifications waiting per observer
    name; ``depths``: entries queued per queue; ``sinks``: each export
    queue's sink state (:meth:`percolite.Env.sinks`); ``runs_per_second``:
    per observer name.
    """
    rates = rates or {}
    pending = pending or {}
    depths = depths or {}
    sinks = sinks if sinks is not None else {}
    runs_per_second = runs_per_second or {}
    nodes: dict[str, dict[str, Any]] = {}
    edges: dict[tuple[str, str], dict[str, Any]] = {}

    def node(kind: str, name: str, **extra: Any) -> str:
        node_id = _node_id(kind, name)
        if node_id not in nodes:
            nodes[node_id] = {"id": node_id, "kind": kind, "label": name, "backlog": None}
        nodes[node_id].update({k: v for k, v in extra.items() if v is not None})
        return node_id

    def edge(source: str, target: str, kind: str, count: int | None = None) -> None:
        found = edges.setdefault(
            (source, target),
            {"source": source, "target": target, "kind": kind, "count": None, "rate": None},
        )
        if count is not None:
            found["count"] = (found["count"] or 0) + count
        rate = rates.get((source, target))
        if rate is not None:
            found["rate"] = rate

    processors = {}  # a queue processor's observer name -> its queue's node
    for queue_id, queue in queues.items():
        kind = queue.get("kind", "queue")
        queue_node = node("queue", queue_id, queue_kind=kind, backlog=depths.get(queue_id))
        if kind in _core.QUEUE_KINDS:
            processors[_core.processor_name(kind, queue_id)] = queue_node
    for queue_id, queue in queues.items():
        for target in queue.get("export_to") or []:
            edge(_node_id("queue", queue_id), node("queue", target), "exports to")
        if queue.get("kind") == "export queue":
            # A sink's state is the store's to say: None for a bare declaration.
            state = sinks[queue_id]["state"] if queue_id in sinks else None
            sink = node("sink", queue_id, detail=queue.get("sink"), state=state)
            edge(_node_id("queue", queue_id), sink, "delivers")

    for family, _qualifier, notify, name in observed:
        if name in processors:
            continue  # a queue's own notifications: the queue's node says it
        processor = _core.parse_processor_name(name)
        if processor is not None:
            kind, queue_id = processor
            processors[name] = node("queue", queue_id, queue_kind=kind)
            continue
        observer = node(
            "observer",
            name,
            backlog=pending.get(name),
            runs_per_second=runs_per_second.get(name),
        )
        source = node("family", _text(family))
        edge(source, observer, f"{notify} notifications")
        found = edges[(source, observer)]
        if runs_per_second.get(name) is not None:
            found["rate"] = runs_per_second[name]

    for name, targets in writes.items():
        source = processors.get(name) or node("observer", name)
        for target, count in targets.items():
            kind, _, what = target.partition(":")
            if kind == "queue":
                target_node = node("queue", what)
            elif kind == "family":
                target_node = node("family", what)
            else:
                continue  # a target a later version names
            if target_node != source:
                edge(source, target_node, "writes", count)
    return {"nodes": list(nodes.values()), "edges": list(edges.values())}


def declared_queues(app: Any) -> dict[str, dict[str, Any]]:
    """The queues ``app`` declares, as :func:`build` takes them."""
    out = {}
    for queue_id, queue in app.queues.items():
        exporter = getattr(queue, "exporter", None)
        out[queue_id] = {
            "kind": queue.layout["kind"],
            "export_to": [q.id for q in getattr(queue, "export_queues", ())],
            "sink": repr(exporter) if exporter is not None else None,
        }
    return out


def declared(app: Any) -> dict[str, Any]:
    """The graph of what ``app`` declares, before any run: its observed
    columns, its queues, ``export_to`` and the sinks (what observers write
    shows once they have run: :class:`percolite.ui.Console`)."""
    observed = [
        (o.column.family, o.column.qualifier, o.notify.name.lower(), o.name) for o in app.observers
    ]
    return build(observed=observed, queues=declared_queues(app), writes={})


def layout(graph: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Layers from left to right: each node one step right of the furthest
    node that feeds it (cycles broken where they close), nodes of a layer
    stacked in the order of their kind, then name. Returns ``{id: (layer,
    row)}``."""
    ids = [n["id"] for n in graph["nodes"]]
    incoming: dict[str, list[str]] = {i: [] for i in ids}
    for e in graph["edges"]:
        if e["source"] != e["target"]:
            incoming[e["target"]].append(e["source"])
    layer: dict[str, int] = {}
    visiting: set[str] = set()

    def depth(node_id: str) -> int:
        if node_id in layer:
            return layer[node_id]
        if node_id in visiting:
            return -1  # a back edge: ignored
        visiting.add(node_id)
        deepest = max((depth(s) for s in incoming[node_id]), default=-1)
        visiting.discard(node_id)
        layer[node_id] = deepest + 1
        return layer[node_id]

    order = {"family": 0, "observer": 1, "queue": 2, "sink": 3}
    kinds = {n["id"]: n["kind"] for n in graph["nodes"]}
    for node_id in sorted(ids, key=lambda i: (order.get(kinds[i], 9), i)):
        depth(node_id)
    rows: dict[int, int] = {}
    placed = {}
    for node_id in sorted(ids, key=lambda i: (layer[i], order.get(kinds[i], 9), i)):
        placed[node_id] = (layer[node_id], rows.get(layer[node_id], 0))
        rows[layer[node_id]] = rows.get(layer[node_id], 0) + 1
    return placed


_WIDTH, _HEIGHT, _GAP_X, _GAP_Y, _MARGIN = 170, 46, 90, 24, 16
_COLORS = {
    "family": ("#e8f0fe", "#4a6fa5"),
    "observer": ("#e6f4ea", "#3c8d5a"),
    "queue": ("#fef3e0", "#b7791f"),
    "sink": ("#f3e8fd", "#7b4bb7"),
}


def _short(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _rate(value: float | None, count: int | None = None) -> str:
    """An edge's label: its live rate, or, idle, how many went along it in all."""
    if value:
        return f"{value:,.0f}/s" if value >= 100 else f"{value:.1f}/s"
    if count:
        return f"{count:,} in all"
    return "" if value is None else "0/s"


def svg(graph: dict[str, Any]) -> str:
    """The graph drawn as one SVG element: boxes for nodes (their backlog
    beneath the name), curves for edges with their live rate. Every node
    and edge carries ``data-node`` / ``data-edge`` attributes naming it."""
    places = layout(graph)
    layers = max((p[0] for p in places.values()), default=0) + 1
    rows = max((p[1] for p in places.values()), default=0) + 1
    width = _MARGIN * 2 + layers * _WIDTH + (layers - 1) * _GAP_X
    height = _MARGIN * 2 + rows * _HEIGHT + (rows - 1) * _GAP_Y

    def box(node_id: str) -> tuple[float, float]:
        column, row = places[node_id]
        return (_MARGIN + column * (_WIDTH + _GAP_X), _MARGIN + row * (_HEIGHT + _GAP_Y))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="percolite-graph" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="system-ui, sans-serif" font-size="12" role="img" '
        f'aria-label="dataflow graph">',
        '<defs><marker id="percolite-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="9" markerHeight="9" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#888"/></marker></defs>',
    ]
    for n in graph["nodes"]:
        x, y = box(n["id"])
        fill, line = _COLORS.get(n["kind"], ("#eee", "#666"))
        if n["kind"] == "sink" and n.get("state") not in (None, "ok"):
            fill, line = "#fde8e8", "#c53030"
        detail = n.get("queue_kind") or n["kind"]
        if n.get("backlog") is not None:
            detail += f" \u00b7 {n['backlog']:,} waiting"
        if n["kind"] == "sink":
            detail = f"sink \u00b7 {n['state']}" if n.get("state") else "sink"
        title = html.escape(n["label"] + (f" ({n['detail']})" if n.get("detail") else ""))
        parts.append(
            f'<g class="node node-{html.escape(n["kind"])}" '
            f'data-node="{html.escape(n["id"], quote=True)}"><title>{title}</title>'
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{_WIDTH}" height="{_HEIGHT}" rx="6" '
            f'fill="{fill}" stroke="{line}"/>'
            f'<text x="{x + 8:.0f}" y="{y + 18:.0f}" fill="#1a1a1a" font-weight="600">'
            f"{html.escape(_short(n['label']))}</text>"
            f'<text x="{x + 8:.0f}" y="{y + 35:.0f}" fill="#444" class="node-detail">'
            f"{html.escape(_short(detail, 28))}</text></g>"
        )
    # Edges over the boxes: one that passes a node stays visible.
    for e in graph["edges"]:
        if e["source"] not in places or e["target"] not in places:
            continue
        sx, sy = box(e["source"])
        tx, ty = box(e["target"])
        name = html.escape(f"{e['source']} -> {e['target']}", quote=True)
        title = html.escape(
            f"{e['source']} {e['kind']} {e['target']}"
            + (f": {e['count']:,} in all" if e.get("count") else ""),
            quote=False,
        )
        if places[e["target"]][0] > places[e["source"]][0]:
            x1, y1 = sx + _WIDTH, sy + _HEIGHT / 2
            x2, y2 = tx, ty + _HEIGHT / 2
            bend = max(40.0, (x2 - x1) / 2)
            path = (
                f"M {x1:.0f} {y1:.0f} C {x1 + bend:.0f} {y1:.0f} "
                f"{x2 - bend:.0f} {y2:.0f} {x2:.0f} {y2:.0f}"
            )
            lx, ly = (x1 + x2) / 2, (y1 + y2) / 2 - 4
        else:  # back to an earlier layer: around, below
            x1, y1 = sx + _WIDTH / 2, sy + _HEIGHT
            x2, y2 = tx + _WIDTH / 2, ty + _HEIGHT
            drop = 30 + abs(x1 - x2) / 6
            low = max(y1, y2) + drop
            path = f"M {x1:.0f} {y1:.0f} C {x1:.0f} {low:.0f} {x2:.0f} {low:.0f} {x2:.0f} {y2:.0f}"
            lx, ly = (x1 + x2) / 2, low - 6
        active = bool(e.get("rate"))
        stroke = "#2b7bb9" if active else "#999"
        width_px = 1 + min(3.0, math.log10(1 + (e.get("rate") or 0)))
        parts.append(
            f'<g class="edge" data-edge="{name}"><title>{title}</title>'
            f'<path d="{path}" fill="none" stroke="{stroke}" stroke-width="{width_px:.1f}" '
            f'marker-end="url(#percolite-arrow)"/>'
            f'<text x="{lx:.0f}" y="{ly:.0f}" text-anchor="middle" fill="{stroke}" '
            f'class="edge-rate">{html.escape(_rate(e.get("rate"), e.get("count")))}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)
