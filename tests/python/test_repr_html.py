"""What Jupyter shows of an Env, an App and the queues (``_repr_html_``):
the names and state that matter, everything escaped, nothing loaded."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import percolite
import percolite._html
import pytest
from conftest import open_store

CONTENT = ("doc", "content")
EVIL = "<script>alert('x')</script>"

# Elements that have no end tag.
VOID = {"br", "hr", "img", "meta", "link", "input", "col", "wbr"}


class Structure(HTMLParser):
    """The elements of a card, checked to nest properly."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.tags: set[str] = set()
        self.attributes: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attributes += attrs
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)


# What the app's graph (an inline SVG) may carry besides inline styles.
SVG_ATTRIBUTES = {
    "xmlns",
    "class",
    "width",
    "height",
    "viewbox",
    "font-family",
    "font-size",
    "role",
    "aria-label",
    "id",
    "refx",
    "refy",
    "markerwidth",
    "markerheight",
    "markerunits",
    "orient",
    "d",
    "fill",
    "stroke",
    "stroke-width",
    "marker-end",
    "x",
    "y",
    "rx",
    "text-anchor",
    "font-weight",
    "data-node",
    "data-edge",
}


def check_card(card: str) -> str:
    """``card`` checked to be a well-nested, self-contained fragment with
    inline styles only; returns its text (entities decoded)."""
    assert isinstance(card, str) and card.startswith("<div")
    parser = Structure()
    parser.feed(card)
    parser.close()
    assert parser.open == [], f"unclosed: {parser.open}"
    html_tags = {"div", "span", "table", "thead", "tbody", "tr", "th", "td", "br"}
    svg_tags = {"svg", "defs", "marker", "path", "g", "title", "rect", "text"}
    assert parser.tags <= html_tags | svg_tags
    outside_svg = {name for name, _ in parser.attributes} - SVG_ATTRIBUTES
    assert outside_svg <= {"style"}, outside_svg
    # The SVG namespace is a name, not an address: nothing else may look like one.
    lowered = card.lower().replace('xmlns="http://www.w3.org/2000/svg"', "")
    for loaded in ("<script", "<link", "<img", "<image", "url(", "@import", "@font-face", "http"):
        assert loaded not in lowered.replace("url(#percolite-arrow)", ""), loaded
    return "".join(parser.text)


def make_app(name: str = "console") -> tuple[percolite.App, percolite.CombineQueue]:
    app = percolite.App(name)

    @app.observer(CONTENT, name=EVIL, max_attempts=1)
    def evil(tx, row, column):
        raise ValueError("<img src=x onerror=alert(1)>")

    @app.observer(("doc", "words"), notify=percolite.WEAK, name="count_words")
    def count_words(tx, row, column):
        pass

    counts = app.combine_queue("counts", buckets=8, key_codec="str", value_codec="int64")
    sink = app.export_queue("sink", lambda entries: None, buckets=4, value_codec="int64")
    counts.export_to(sink)
    return app, counts


def test_the_app_card_shows_its_declarations_escaped():
    app, _counts = make_app()
    card = app._repr_html_()
    text = check_card(card)
    assert EVIL in text and "<script>" not in card and "&lt;script&gt;" in card
    for shown in ("console", "count_words", "doc:content", "doc:words", "STRONG", "WEAK"):
        assert shown in text, shown
    for shown in ("counts", "combine (sum)", "sink", "export", "str", "int64", "8", "4"):
        assert shown in text, shown
    assert "→ export queue sink" in text and "→ exporter" in text
    assert "2 observers, 2 queues" in text


def test_the_app_card_shows_its_graph_escaped():
    app, _counts = make_app()
    svg = percolite._html.app_graph_svg(app)
    card = app._repr_html_()
    assert svg is not None and svg in card
    nodes = set(re.findall(r'data-node="([^"]*)"', svg))
    assert {"family:doc", "queue:counts", "queue:sink", "sink:sink"} <= nodes
    assert html.escape(f"observer:{EVIL}", quote=True) in nodes
    edges = set(re.findall(r'data-edge="([^"]*)"', svg))
    assert "queue:counts -&gt; queue:sink" in edges and "queue:sink -&gt; sink:sink" in edges
    assert "no observers or queues" in check_card(percolite.App("empty")._repr_html_())
    assert percolite._html.app_graph_svg(percolite.App("empty")) is None


def test_queue_cards_show_their_declaration():
    app, counts = make_app()
    sink = app._queues["sink"]
    text = check_card(counts._repr_html_())
    for shown in ("percolite.CombineQueue", "counts", "combine (sum)", "buckets", "8"):
        assert shown in text, shown
    assert "key codecstr" in text and "value codecint64" in text
    assert "→ export queue sink" in text
    text = check_card(sink._repr_html_())
    for shown in ("percolite.ExportQueue", "sink", "export", "4", "batch size", "<lambda>"):
        assert shown in text, shown
    assert "<lambda>" not in sink._repr_html_()  # escaped


def test_the_env_card_shows_the_status_escaped(backend, tmp_path):
    app, counts = make_app()
    env = open_store(backend, tmp_path / "db", app=app, sync="none")
    with env:
        with env.transaction() as tx:
            tx.set("r1", CONTENT, "x")
            counts.add(tx, {"a": 1})
        text = check_card(env._repr_html_())
        assert "open" in text and env.backend in text and "console" in text
        for shown in (EVIL, "count_words", "doc:content", "cq:counts:notify", "sink", "ok"):
            assert shown in text, shown
        assert env.path in text
        env.start_workers(2, retry_initial=0.005, retry_max=0.02)
        with pytest.raises(percolite.WorkParked):
            env.wait(timeout=60)
        card = env._repr_html_()
        text = check_card(card)
        assert "<script>" not in card and "<img" not in card
        assert "ValueError: <img src=x onerror=alert(1)>" in text
        assert "parked1" in text.replace(" ", "")
        assert "running: 2 threads" in text
        identity = env.identity
        assert identity is not None and identity["store"] in text
        env.stop_workers()
        assert "not running in this process" in check_card(env._repr_html_())
    closed = check_card(env._repr_html_())
    assert "closed" in closed and env.path in closed


def test_the_env_card_reads_no_queue(monkeypatch):
    """The card is cheap: status without the queue scan."""
    app, _counts = make_app()
    with percolite.open(":memory:", app=app) as env:
        asked = []
        status = env.status
        monkeypatch.setattr(env, "status", lambda **kw: asked.append(kw) or status(**kw))
        check_card(env._repr_html_())
        assert asked == [{"queues": False}]


def test_the_env_card_says_when_status_fails(monkeypatch):
    with percolite.open(":memory:") as env:

        def broken(**kw):
            raise percolite.StorageError("<b>server gone</b>")

        monkeypatch.setattr(env, "status", broken)
        card = env._repr_html_()
        text = check_card(card)
        assert "StorageError: <b>server gone</b>" in text and "<b>" not in card
