"""webindex on a real HTML tree no one here wrote: PostgreSQL's manual as
Debian's postgresql-doc-15 installs it (about 1,200 cross-linked pages).

The exported tables are checked against a recomputation from the HTML that
shares no code with the package: the standard library's ``html.parser`` and
``urllib.parse`` applying the documented rules. Then a copy of the tree is
edited over several CLI runs on an lmdb store, and the kept tables must
equal, row for row, the recomputation and a fresh store's."""

from __future__ import annotations

import collections
import os
import random
import re
import shutil
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit, urlunsplit

import percolite
import pytest
from percolite.webindex import app as wi
from percolite.webindex import cli

# The real tree; scripts/bootstrap.sh installs it.
TREE = "/usr/share/doc/postgresql-doc-15/html"
BASE = "https://www.postgresql.org/docs/15/"


@pytest.fixture(scope="module")
def real_tree():
    assert os.path.isfile(os.path.join(TREE, "index.html")), (
        f"{TREE} is missing: scripts/bootstrap.sh installs Debian's postgresql-doc-15"
    )
    return TREE


class _Anchors(HTMLParser):
    """Every ``<a href>`` with its text, and the first ``<base href>``."""

    def __init__(self) -> None:
        super().__init__()
        self.base = None
        self.anchors = []
        self.open = None

    def handle_starttag(self, tag, attrs):
        href = dict(attrs).get("href")
        if tag == "base" and self.base is None and href is not None:
            self.base = href
        if tag == "a":
            self.handle_endtag("a")
            if href is not None:
                self.open = (href, [])

    def handle_endtag(self, tag):
        if tag == "a" and self.open is not None:
            self.anchors.append((self.open[0], "".join(self.open[1])))
            self.open = None

    def handle_data(self, data):
        if self.open is not None:
            self.open[1].append(data)


def _canonical(base, href):
    url = urljoin(base, href.strip(" \t\n\r\f"))
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return None
    port = parts.port
    netloc = parts.hostname
    if port is not None and port != {"http": 80, "https": 443}[parts.scheme]:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))


def reference_web(tree, base_url):
    """``{page: {target: anchor}}`` of the HTML files under ``tree``."""
    web = {}
    for folder, _dirs, files in os.walk(tree):
        for name in files:
            if not name.endswith(".html"):
                continue
            path = os.path.join(folder, name)
            page = _canonical(base_url, os.path.relpath(path, tree).replace(os.sep, "/"))
            parser = _Anchors()
            with open(path, encoding="utf-8") as f:
                parser.feed(f.read())
            parser.close()
            parser.handle_endtag("a")
            against = urljoin(page, parser.base) if parser.base else page
            links = {}
            for href, text in parser.anchors:
                target = _canonical(against, href)
                if target is not None and target != page and target not in links:
                    links[target] = " ".join(text.split())
            web[page] = links
    return web


def reference_tables(web):
    incount = collections.Counter(t for links in web.values() for t in links)
    known = set(web) | set(incount)
    domains = collections.defaultdict(lambda: [0, 0])
    for uri in known:
        host = urlsplit(uri).hostname
        domains[host][0] += 1
        domains[host][1] += incount[uri]
    return {
        "webindex_pages": sorted(
            (u, urlsplit(u).hostname, incount[u], len(web.get(u, {})), int(u in web)) for u in known
        ),
        "webindex_inlinks": sorted((t, s, a) for s, links in web.items() for t, a in links.items()),
        "webindex_domains": sorted((d, p, n) for d, (p, n) in domains.items()),
    }


def _load(paths, db, export, processes=0):
    summary = cli.run(
        [str(p) for p in paths],
        db,
        export=export,
        base_url=BASE,
        processes=processes,
        progress=False,
    )
    assert not summary.missing
    return summary


def test_real_tree_against_an_independent_reference(real_tree, tmp_path):
    web = reference_web(real_tree, BASE)
    assert len(web) > 1000
    assert sum(len(links) for links in web.values()) > 10000
    export = "sqlite:" + str(tmp_path / "q.sqlite")
    wi.set_export(export)
    with percolite.open(":memory:", app=wi.app) as env:
        env.start_workers(4)
        read, loaded, removed = cli.load_into(env, [real_tree], BASE)
        assert env.wait(timeout=600)
        env.stop_workers()
    assert (read, loaded, removed) == (len(web), len(web), 0)
    tables = wi.read_tables(export)
    expected = reference_tables(web)
    # Every URI's inbound count, and every inlink with its anchor.
    incounts = {uri: n for uri, _d, n, _o, _h in tables["webindex_pages"]}
    assert incounts == {uri: n for uri, _d, n, _o, _h in expected["webindex_pages"]}
    assert tables["webindex_inlinks"] == expected["webindex_inlinks"]
    assert tables == expected
    # The manual links outside itself, and some of its pages are linked by many.
    assert len(tables["webindex_domains"]) > 1
    assert max(incounts.values()) > 500


def _edit(tree, rng, run):
    """Edits about 5% of the pages (links removed and added, anchors
    changed), deletes 1% and adds a few."""
    pages = sorted(n for n in os.listdir(tree) if n.endswith(".html"))
    for name in rng.sample(pages, len(pages) // 20):
        path = os.path.join(tree, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        kind = rng.randrange(3)
        if kind == 0:  # links removed: the <a> stays, without its href
            text = re.sub(r'href="[^"]*"', "", text, count=rng.randint(1, 4))
        elif kind == 1:  # links added, to pages that exist and that do not
            extra = "".join(
                f'<a href="{rng.choice(pages)}">see {run}</a> <a href="new-{run}-{i}.html">n</a>'
                for i in range(rng.randint(1, 3))
            )
            text = text.replace("</body>", extra + "</body>", 1)
        else:  # anchors changed
            text = re.sub(r">([A-Z][a-z]+)</a>", rf">\1 (run {run})</a>", text, count=3)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    gone = rng.sample(pages, len(pages) // 100)
    for name in gone:
        os.remove(os.path.join(tree, name))
    for i in range(5):
        links = " ".join(f'<a href="{rng.choice(pages)}">p{j}</a>' for j in range(10))
        with open(os.path.join(tree, f"new-{run}-{i}.html"), "w", encoding="utf-8") as f:
            f.write(f"<html><body>{links} <a href='index.html'>home</a></body></html>")
    return len(gone)


def test_real_tree_edited_over_cli_runs_equals_from_scratch(real_tree, tmp_path):
    tree = tmp_path / "html"
    shutil.copytree(real_tree, tree)
    db, export = tmp_path / "db", "sqlite:" + str(tmp_path / "kept.sqlite")
    rng = random.Random(39)
    for run in range(3):
        deleted = _edit(tree, rng, run) if run else 0
        web = reference_web(tree, BASE)
        summary = _load([tree], db, export, processes=1)
        assert summary.pages == len(web)
        if run:
            assert 0 < summary.loaded < len(web) // 5
            assert summary.removed == deleted > 0
        tables = wi.read_tables(export)
        assert tables == reference_tables(web), f"run {run}"
    fresh = "sqlite:" + str(tmp_path / "fresh.sqlite")
    assert _load([tree], tmp_path / "fresh", fresh).loaded == len(web)
    assert wi.read_tables(fresh) == tables
    # Nothing changed: nothing is loaded, nothing moves.
    again = _load([tree], db, export)
    assert (again.loaded, again.removed) == (0, 0)
    assert wi.read_tables(export) == tables
