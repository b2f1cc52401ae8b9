"""A seeded synthetic web: many domains, power-law inbound links.

A web is a dict ``{uri: {target: anchor}}`` of the pages with content.
Page ``i`` is ``http://d<k>.example/p<i>.html`` on one of ``domains``
domains; each page has 0 to ``2 * mean_links`` outlinks whose targets are
drawn with probability proportional to ``1 / (rank + 1) ** alpha`` (a few
pages get most inbound links), some of them to pages that do not exist
(known URIs without content). The same arguments give the same web.
"""

from __future__ import annotations

import itertools
import json
import os
import random

__all__ = ["generate", "mutate", "write_records", "write_html", "page_uri"]


def page_uri(i: int, domains: int) -> str:
    return f"http://d{i % domains}.example/p{i}.html"


def _targets(rng: random.Random, n: int, alpha: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (r + 1) ** alpha for r in range(n)))


def _links(
    rng: random.Random, uri: str, candidates: list[str], cum: list[float], mean: int
) -> dict:
    count = rng.randint(0, 2 * mean)
    links: dict[str, str] = {}
    for target in rng.choices(candidates, cum_weights=cum, k=count):
        if target != uri and target not in links:
            links[target] = f"link {rng.randint(0, 999)}"
    return links


def generate(
    pages: int,
    *,
    seed: int = 0,
    domains: int | None = None,
    mean_links: int = 8,
    alpha: float = 1.1,
    dangling: float = 0.1,
) -> dict[str, dict[str, str]]:
    """A web of ``pages`` pages (see the module docstring); ``dangling`` is
    the share of link targets that have no page."""
    rng = random.Random(seed)
    domains = domains or max(1, pages // 50)
    uris = [page_uri(i, domains) for i in range(pages)]
    missing = [
        f"http://d{i % domains}.example/missing{i}.html" for i in range(int(pages * dangling))
    ]
    candidates = uris + missing
    rng.shuffle(candidates)  # the ranks of the power law, not the page numbers
    cum = _targets(rng, len(candidates), alpha)
    return {uri: _links(rng, uri, candidates, cum, mean_links) for uri in uris}


def mutate(
    web: dict[str, dict[str, str]],
    *,
    seed: int,
    edit: float = 0.05,
    remove: float = 0.01,
    add: float = 0.01,
) -> dict[str, dict[str, str]]:
    """A re-crawl of ``web``: a share ``edit`` of its pages with links added,
    dropped and anchors changed, ``remove`` of them gone, ``add`` new pages."""
    rng = random.Random(seed)
    result = {uri: dict(links) for uri, links in web.items()}
    uris = sorted(result)
    if not uris:
        return result
    for uri in rng.sample(uris, int(len(uris) * edit)):
        links = result[uri]
        for target in list(links):
            roll = rng.random()
            if roll < 0.3:
                del links[target]
            elif roll < 0.5:
                links[target] = f"changed {rng.randint(0, 999)}"
        for target in rng.sample(uris, min(3, len(uris))):
            if target != uri:
                links.setdefault(target, "added")
    for uri in rng.sample(uris, int(len(uris) * remove)):
        del result[uri]
    first = len(uris) + rng.randint(0, 10**6) * 1000
    for i in range(int(len(uris) * add)):
        uri = f"http://new{i % 7}.example/q{first + i}.html"
        result[uri] = {t: "to old" for t in rng.sample(uris, min(5, len(uris)))}
    return result


def write_records(web: dict[str, dict[str, str]], path: str) -> None:
    """Writes ``web`` as link records, one JSON object a line, sorted by URI."""
    with open(path, "w", encoding="utf-8") as f:
        for uri in sorted(web):
            links = [{"url": t, "text": a} for t, a in web[uri].items()]
            f.write(json.dumps({"url": uri, "links": links}) + "\n")


def write_html(web: dict[str, dict[str, str]], directory: str) -> None:
    """Writes ``web`` as HTML files under ``directory``, one directory per
    host (load it with ``--base-url http://``); files of pages no longer in
    ``web`` are deleted."""
    from html import escape
    from urllib.parse import urlsplit

    wanted = set()
    for uri, links in web.items():
        parts = urlsplit(uri)
        path = os.path.join(directory, parts.hostname, parts.path.lstrip("/"))
        wanted.add(path)
        body = "\n".join(
            f'<li><a href="{escape(t)}">{escape(a)}</a></li>' for t, a in links.items()
        )
        text = (
            f"<!doctype html>\n<html><head><title>{escape(uri)}</title></head>\n"
            f"<body><ul>\n{body}\n</ul></body></html>\n"
        )
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    continue
        except FileNotFoundError:
            pass
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            if path not in wanted:
                os.remove(path)
