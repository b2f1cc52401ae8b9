"""webindex's link rules: the URI normalization, the extraction from HTML,
the charset, and the inputs, against a plain recomputation with the
standard library's html.parser and urllib.parse."""

from __future__ import annotations

import gzip
import json
import os
import random
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest
from percolite.webindex import inputs, links, synthetic


@pytest.mark.parametrize(
    "href, expected",
    [
        ("HTTP://Example.COM", "http://example.com/"),
        ("http://example.com:80/a", "http://example.com/a"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("http://example.com:443/a", "http://example.com:443/a"),
        ("https://example.com:8443", "https://example.com:8443/"),
        ("http://example.com/A/B#frag", "http://example.com/A/B"),
        ("http://example.com/dir/", "http://example.com/dir/"),
        ("http://example.com/dir/index.html", "http://example.com/dir/index.html"),
        ("http://example.com/a%20b?Q=1#x", "http://example.com/a%20b?Q=1"),
        ("http://example.com/a?", "http://example.com/a?"),
        ("http://User@Example.com/", "http://User@example.com/"),
        ("http://[::1]:80/x", "http://[::1]/x"),
        ("  http://example.com/x \n", "http://example.com/x"),
        ("mailto:someone@example.com", None),
        ("ftp://example.com/", None),
        ("javascript:void(0)", None),
    ],
)
def test_normalize(href, expected):
    assert links.normalize(href) == expected


@pytest.mark.parametrize("href", ["http://example.com:port/", "http://[::1/", "http:///path"])
def test_normalize_refuses_what_does_not_parse(href):
    with pytest.raises(ValueError):
        links.normalize(href)


@pytest.mark.parametrize(
    "url",
    [
        "http://Example.ORG",
        "https://a.b.example:8443/x/y?q#f",
        "http://user:pw@Host.example:81/p@q:r",
        "http://[2001:DB8::1]:8080/",
        "https://[::1]/a",
        "http://h/a?b=c/d:e@f",
        "https://xn--bcher-kva.example/%7E",
    ],
)
def test_domain_of_is_the_host_of_the_normalized_uri(url):
    uri = links.normalize(url)
    assert links.domain_of(uri) == urlsplit(uri).hostname
    assert links.domain_of(url) == urlsplit(url).hostname


def test_relative_links_base_and_self_links():
    html = """<html><head><base href="/docs/"></head><body>
    <a href="a.html">First   text
      here</a> <a href="a.html">second</a>
    <a href="#top">self by fragment</a>
    <a href="http://example.com/docs/">the base itself</a>
    <a href="http://x.example:99999/">bad port</a>
    <a name="no href">nothing</a>
    <a href="../up.html"><b>Up</b> one</a>
    <a href="mailto:a@b.c">mail</a>
    </body></html>"""
    result = links.extract_links("http://example.com/docs/", html)
    assert result.links == {
        "http://example.com/docs/a.html": "First text here",
        "http://example.com/up.html": "Up one",
    }
    assert result.bad_hrefs == 1


def test_unclosed_anchor_ends_at_the_next():
    result = links.extract_links("http://e.org/", '<a href="/a">one <a href="/b">two')
    assert result.links == {"http://e.org/a": "one", "http://e.org/b": "two"}


@pytest.mark.parametrize(
    "data, content_type, text, replaced",
    [
        ("caf\u00e9".encode(), None, "caf\u00e9", False),
        (b'<meta charset="latin-1">caf\xe9', None, '<meta charset="latin-1">caf\u00e9', False),
        (
            b'<meta http-equiv="Content-Type" content="text/html; charset=ISO-8859-1">\xe9',
            None,
            '<meta http-equiv="Content-Type" content="text/html; charset=ISO-8859-1">\u00e9',
            False,
        ),
        (b"caf\xe9", "text/html; charset=latin-1", "caf\u00e9", False),
        (b"caf\xe9", None, "caf\ufffd", True),
        (
            b'<meta charset="no-such-charset">\xff',
            None,
            '<meta charset="no-such-charset">\ufffd',
            True,
        ),
    ],
)
def test_decode_page(data, content_type, text, replaced):
    assert links.decode_page(data, content_type) == (text, replaced)


# -- the reference ------------------------------------------------------------------


class _Reference(HTMLParser):
    """The rules, written again in the plainest way."""

    def __init__(self):
        super().__init__()
        self.base = None
        self.anchors = []  # [href, [text]]
        self.open = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "base" and self.base is None and attrs.get("href") is not None:
            self.base = attrs["href"]
        if tag == "a":
            self.open = None
            if attrs.get("href") is not None:
                self.open = [attrs["href"], []]
                self.anchors.append(self.open)

    def handle_endtag(self, tag):
        if tag == "a":
            self.open = None

    def handle_data(self, data):
        if self.open is not None:
            self.open[1].append(data)


def _reference_uri(url):
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        return None
    host = parts.hostname
    if not host:
        raise ValueError(url)
    port = parts.port
    default = {"http": 80, "https": 443}[parts.scheme.lower()]
    netloc = (f"[{host}]" if ":" in host else host) + (
        f":{port}" if port not in (None, default) else ""
    )
    if "@" in parts.netloc:
        netloc = parts.netloc.rsplit("@", 1)[0] + "@" + netloc
    query = "?" + parts.query if "?" in url.split("#")[0] else ""
    return f"{parts.scheme.lower()}://{netloc}{parts.path or '/'}{query}"


def test_normalize_agrees_with_the_reference_on_random_urls():
    """Every URL form, absolute or relative, with or without a base, through
    whichever path normalize takes (already-normal absolute URLs skip the
    parsing): the reference's result, or ValueError from both."""
    rng = random.Random(7)
    schemes = ["http", "https", "HTTP", "Https", "ftp", "mailto", ""]
    hosts = ["d0.example", "D0.Example", "h:80", "h:443", "h:8080", "u@h", "[::1]", "", "h:x"]
    pieces = [
        "a",
        "B",
        "/",
        "//",
        ".",
        "..",
        "%20",
        "~",
        "-",
        "_",
        "?",
        "#",
        ";",
        "=",
        "&",
        " ",
        "\t",
        "@",
        ":",
        "+",
        "!",
        "'",
        "(",
        "*",
        ",",
        "$",
        "\u00e9",
        "index.html",
    ]
    bases = [None, "http://b.example/dir/page.html", "https://b.example/", "http://b.example"]
    checked = 0
    for _ in range(20_000):
        path = "".join(rng.choice(pieces) for _ in range(rng.randrange(6)))
        form = rng.randrange(4)
        if form == 0:  # absolute
            url = f"{rng.choice(schemes)}://{rng.choice(hosts)}{path}"
        elif form == 1:  # already normal, the common case of link records
            url = f"http{rng.choice(['', 's'])}://d{rng.randrange(9)}.example/p{path}"
        elif form == 2:  # scheme-relative
            url = f"//{rng.choice(hosts)}{path}"
        else:  # relative
            url = path
        base = rng.choice(bases)
        try:
            expected = _reference_uri(
                url.strip(" \t\n\f\r") if base is None else urljoin(base, url.strip(" \t\n\f\r"))
            )
        except ValueError:
            with pytest.raises(ValueError):
                links.normalize(url, base)
            continue
        assert links.normalize(url, base) == expected, (url, base)
        checked += 1
    assert checked > 15_000


def reference_links(page_url, html):
    parser = _Reference()
    parser.feed(html)
    parser.close()
    base = page_url if parser.base is None else urljoin(page_url, parser.base.strip())
    out = {}
    for href, text in parser.anchors:
        try:
            target = _reference_uri(urljoin(base, href.strip()))
        except ValueError:
            continue
        if target and target != page_url and target not in out:
            out[target] = " ".join("".join(text).split())
    return out


def test_synthetic_html_tree_matches_the_reference(tmp_path):
    web = synthetic.generate(300, seed=4)
    # Relative links, fragments and upper case hosts mixed in.
    web["http://d0.example/p0.html"]["http://d0.example/p1.html"] = "relative"
    synthetic.write_html(web, str(tmp_path))
    page = tmp_path / "d0.example" / "p0.html"
    page.write_text(
        page.read_text().replace('href="http://d0.example/p1.html"', 'href="p1.html#x"')
        + '<a href="HTTP://D1.EXAMPLE:80/p1.html">caps</a>'
    )
    problems = []
    pages = list(inputs.directory_pages(str(tmp_path), "http://", problems.append))
    assert problems == []
    assert len(pages) == 300
    for p in pages:
        with open(p.file, encoding="utf-8") as f:
            assert p.links == reference_links(p.url, f.read()), p.url
    assert pages[0].url.startswith("http://d0.example/")


def test_inputs_agree_records_html_and_reference(tmp_path):
    web = synthetic.generate(200, seed=5)
    synthetic.write_records(web, str(tmp_path / "web.jsonl"))
    synthetic.write_html(web, str(tmp_path / "html"))
    from_records = {p.url: p.links for p in inputs.record_pages(str(tmp_path / "web.jsonl"))}
    from_html = {p.url: p.links for p in inputs.directory_pages(str(tmp_path / "html"), "http://")}
    assert from_records == from_html == web


def test_wat_records_take_anchor_links_only(tmp_path):
    record = {
        "Envelope": {
            "WARC-Header-Metadata": {"WARC-Target-URI": "http://e.org/a/"},
            "Payload-Metadata": {
                "HTTP-Response-Metadata": {
                    "HTML-Metadata": {
                        "Head": {"Base": "http://e.org/b/"},
                        "Links": [
                            {"path": "A@/href", "url": "x.html", "text": " X  x "},
                            {"path": "IMG@/src", "url": "i.png"},
                            {"path": "A@/href", "url": "http://[bad"},
                        ],
                    }
                }
            },
        }
    }
    path = tmp_path / "crawl.wat.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(record) + "\n")
    problems = []
    pages = list(inputs.record_pages(str(path), problems.append))
    assert pages == [inputs.Page("http://e.org/a/", {"http://e.org/b/x.html": "X x"})]
    assert [p.kind for p in problems] == [inputs.ProblemKind.BAD_HREF]


def test_bad_records_are_counted(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        "not json\n"
        + json.dumps({"links": []})
        + "\n"
        + json.dumps({"url": "ftp://e.org/", "links": []})
        + "\n"
        + json.dumps({"url": "http://e.org/", "links": [{"url": 3}]})
        + "\n"
        + json.dumps({"url": "http://e.org/ok", "links": [{"url": "/x", "text": "x"}]})
        + "\n"
    )
    problems = []
    pages = list(inputs.record_pages(str(path), problems.append))
    assert pages == [inputs.Page("http://e.org/ok", {"http://e.org/x": "x"})]
    assert [p.kind for p in problems] == [inputs.ProblemKind.BAD_RECORD] * 4


def test_bad_files_in_a_directory(tmp_path):
    (tmp_path / "style.css").write_text("a {}")
    (tmp_path / "bin.html").write_bytes(b"\0\1\2<a href='x'>")
    (tmp_path / "latin.html").write_bytes(b"<a href='/x'>caf\xe9</a>")
    (tmp_path / "ok.html").write_text("<a href='http://[::1'>bad</a><a href='/y'>y</a>")
    problems = []
    pages = list(inputs.directory_pages(str(tmp_path), "https://E.org/docs", problems.append))
    assert [(p.url, p.links) for p in pages] == [
        ("https://e.org/docs/latin.html", {"https://e.org/x": "caf\ufffd"}),
        ("https://e.org/docs/ok.html", {"https://e.org/y": "y"}),
    ]
    kinds = sorted(p.kind.value for p in problems)
    assert kinds == ["bad href", "decoded with replacement", "not HTML", "not HTML"]


@pytest.mark.parametrize(
    "base_url",
    [
        "http://",
        "https://E.org/docs",
        "HTTPS://e.org:443/A/",
        "http://u@H.example:8080",
        " http://x/",
    ],
)
def test_file_urls_are_those_of_the_rule_for_any_name(tmp_path, base_url):
    """A directory's files get file_url(base URL, relative path), whatever
    their names and their directories' (normalized once per directory for
    plain names, one by one for the others)."""
    directories = ["", "D0.example/", "h.example:80/", "a b/", "q?x/", "f#g/", "caf\u00e9/", "n/m/"]
    names = ["p.html", "P-1_x~.HTM", "a b.html", "q?.html", "h#.html", "%41.html", "\u00e9.html"]
    for directory in directories:
        (tmp_path / directory).mkdir(parents=True, exist_ok=True)
        for name in names:
            (tmp_path / directory / name).write_text("<a href='/t'>t</a>")
    problems = []
    pages = list(inputs.directory_pages(str(tmp_path), base_url, problems.append))
    expected = {}
    for directory in directories:
        for name in names:
            try:
                url = inputs.file_url(base_url, directory + name)
            except ValueError:
                continue
            if url is not None:
                expected[str(tmp_path / directory / name)] = url
    assert {p.file: p.url for p in pages} == expected
    assert len(pages) + len(problems) == len(directories) * len(names)


def test_pages_of_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(ValueError, match="--base-url"):
        inputs.pages_of(str(tmp_path), None)
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(ValueError, match="unknown kind of file"):
        inputs.pages_of(str(tmp_path / "x.txt"), None)
    problems = []
    assert list(inputs.pages_of(str(tmp_path / "gone"), None, problems.append)) == []
    assert [p.kind for p in problems] == [inputs.ProblemKind.MISSING_PATH]


def _warc_record(kind, uri, block):
    head = (
        f"WARC/1.0\r\nWARC-Type: {kind}\r\nWARC-Target-URI: {uri}\r\n"
        f"WARC-Record-ID: <urn:uuid:{abs(hash((kind, uri))):032x}>\r\n"
        "WARC-Date: 2026-01-01T00:00:00Z\r\n"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(block)}\r\n\r\n"
    )
    return head.encode() + block + b"\r\n\r\n"


def _http(content_type, body):
    return f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n\r\n".encode() + body


def _warc(path):
    """A WARC file written by hand (the format is plain): two responses and a resource."""
    with open(path, "wb") as f:
        f.write(
            _warc_record(
                "response",
                "http://e.org/",
                _http("text/html; charset=latin-1", b"<a href='/a'>caf\xe9</a>"),
            )
        )
        f.write(_warc_record("response", "http://e.org/img.png", _http("image/png", b"PNG")))
        f.write(_warc_record("resource", "http://e.org/x", b"<a href=y>"))


def test_warc_responses(tmp_path):
    path = str(tmp_path / "crawl.warc")
    _warc(path)
    problems = []
    pages = list(inputs.pages_of(path, None, problems.append))
    assert pages == [inputs.Page("http://e.org/", {"http://e.org/a": "caf\u00e9"})]
    assert sorted(p.kind.value for p in problems) == ["not a response", "not a response"]


def test_warc_without_warcio_is_a_clear_problem(tmp_path, monkeypatch):
    path = tmp_path / "crawl.warc"
    path.write_bytes(b"")
    monkeypatch.setitem(__import__("sys").modules, "warcio.archiveiterator", None)
    problems = []
    assert list(inputs.pages_of(str(path), None, problems.append)) == []
    assert [p.kind for p in problems] == [inputs.ProblemKind.NO_WARCIO]
    assert "pip install" in problems[0].reason
    assert os.path.exists(path)
