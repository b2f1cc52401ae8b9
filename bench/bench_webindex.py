"""webindex end to end: percolite against one SQLite database kept per page.

What is measured: the time to bring the query tables (every known URI's
inbound count and whether it has content, the inlinks with their anchors,
the per-domain counts) up to date from an HTML tree, from reading the files
to the last change being durable, for a first load and for a re-crawl in
which 5% of the pages changed and 1% vanished (the tree is a synthetic web
of ``percolite.webindex.synthetic``, written as HTML). Systems:

* ``percolite``: ``percolite.webindex.cli.run(tree, db, export=...)``, the
  command's job: one loader, a worker process, the export queues into
  SQLite; the store is lmdb with its default ``sync``.
* ``sqlite``: the strongest simple alternative: one SQLite database (WAL,
  ``synchronous=FULL``) updated in one ``BEGIN IMMEDIATE`` transaction per
  changed page, with its own link diff against the page's stored links and
  the same parser (``percolite.webindex.inputs``), files whose digest did
  not change skipped.
* ``parse``: reading and parsing the tree alone, the work both share.

Reported: seconds and pages/s per phase and system, and percolite's ratio
to SQLite on processing time (each system's time less the parse time).
This is a skeleton: one repetition, the synthetic tree only; the real tree
(PostgreSQL's manual, as tests/python/test_webindex_real.py reads it) and
the targets of the full benchmark are still to come.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import (
    OptionGroup,
    Table,
    format_tables,
    log,
    machine_info,
    open_sqlite,
    ratio,
    run_standalone,
    scratch_dir,
)
from percolite.webindex import cli, inputs, synthetic
from percolite.webindex.app import read_tables
from percolite.webindex.links import domain_of

NAME = "webindex"
SYSTEMS = ("percolite", "sqlite", "parse")
DEFAULT_PAGES = 20_000
QUICK_PAGES = 500
SEED = 39
BASE_URL = "http://"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, uri TEXT, digest TEXT);
CREATE TABLE IF NOT EXISTS pages (uri TEXT PRIMARY KEY, links TEXT);
CREATE TABLE IF NOT EXISTS uris (uri TEXT PRIMARY KEY, incount INTEGER, has_content INTEGER);
CREATE TABLE IF NOT EXISTS inlinks (uri TEXT, from_uri TEXT, anchor TEXT,
    PRIMARY KEY (uri, from_uri));
CREATE TABLE IF NOT EXISTS domains (domain TEXT PRIMARY KEY, pages INTEGER, incount INTEGER);
"""


def _sqlite_set_page(db: Any, uri: str, new: dict[str, str] | None) -> None:
    """One page's new links (None: gone) applied to every table, in one
    transaction."""
    db.execute("BEGIN IMMEDIATE")
    row = db.execute("SELECT links FROM pages WHERE uri = ?", (uri,)).fetchone()
    old = json.loads(row[0]) if row else None
    old_links, new_links = old or {}, new or {}
    deltas: Counter[str] = Counter()
    content: dict[str, int] = {}
    for target in new_links.keys() - old_links.keys():
        deltas[target] += 1
    for target in old_links.keys() - new_links.keys():
        deltas[target] -= 1
        db.execute("DELETE FROM inlinks WHERE uri = ? AND from_uri = ?", (target, uri))
    for target, anchor in new_links.items():
        if old_links.get(target) != anchor:
            db.execute(
                "INSERT OR REPLACE INTO inlinks (uri, from_uri, anchor) VALUES (?, ?, ?)",
                (target, uri, anchor),
            )
    if (old is None) != (new is None):
        content[uri] = 1 if new is not None else -1
    for target in set(deltas) | set(content):
        before = db.execute(
            "SELECT incount, has_content FROM uris WHERE uri = ?", (target,)
        ).fetchone()
        incount, has = before or (0, 0)
        after = (incount + deltas[target], has + content.get(target, 0))
        known_delta = (after != (0, 0)) - (before is not None)
        if after == (0, 0):
            db.execute("DELETE FROM uris WHERE uri = ?", (target,))
        else:
            db.execute("INSERT OR REPLACE INTO uris VALUES (?, ?, ?)", (target, *after))
        db.execute(
            "INSERT INTO domains VALUES (?, ?, ?) ON CONFLICT (domain) DO UPDATE SET "
            "pages = pages + excluded.pages, incount = incount + excluded.incount",
            (domain_of(target), known_delta, deltas[target]),
        )
    db.execute("DELETE FROM domains WHERE pages = 0")
    if new is None:
        db.execute("DELETE FROM pages WHERE uri = ?", (uri,))
    else:
        db.execute("INSERT OR REPLACE INTO pages VALUES (?, ?)", (uri, json.dumps(new)))
    db.execute("COMMIT")


def _run_sqlite(tree: Path, work: Path) -> int:
    db = open_sqlite(work / "sqlite.db")
    db.executescript(_SCHEMA)
    seen = set()
    for page in inputs.directory_pages(str(tree), BASE_URL):
        seen.add(page.file)
        row = db.execute("SELECT uri, digest FROM files WHERE path = ?", (page.file,)).fetchone()
        if row == (page.url, page.digest):
            continue
        _sqlite_set_page(db, page.url, page.links)
        db.execute(
            "INSERT OR REPLACE INTO files VALUES (?, ?, ?)", (page.file, page.url, page.digest)
        )
    for path, uri in db.execute("SELECT path, uri FROM files").fetchall():
        if path not in seen:
            _sqlite_set_page(db, uri, None)
            db.execute("DELETE FROM files WHERE path = ?", (path,))
    return len(seen)


def _tables(system: str, work: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The tables each system keeps, in one form: pages without outcount."""
    if system == "percolite":
        kept = read_tables("sqlite:" + str(work / "percolite.sqlite"))
        kept["webindex_pages"] = [(u, n, h) for u, _d, n, _o, h in kept["webindex_pages"]]
        return kept
    db = open_sqlite(work / "sqlite.db")
    try:
        return {
            "webindex_pages": db.execute("SELECT * FROM uris ORDER BY uri").fetchall(),
            "webindex_inlinks": db.execute(
                "SELECT * FROM inlinks ORDER BY uri, from_uri"
            ).fetchall(),
            "webindex_domains": db.execute("SELECT * FROM domains ORDER BY domain").fetchall(),
        }
    finally:
        db.close()


def _run_percolite(tree: Path, work: Path) -> int:
    summary = cli.run(
        [str(tree)],
        work / "db",
        export="sqlite:" + str(work / "percolite.sqlite"),
        base_url=BASE_URL,
        progress=False,
    )
    return summary.pages


def _run_parse(tree: Path, work: Path) -> int:
    return sum(1 for _ in inputs.directory_pages(str(tree), BASE_URL))


def add_arguments(parser: OptionGroup) -> None:
    parser.add_argument(
        "--wi-pages",
        type=int,
        default=None,
        metavar="N",
        help=f"pages of the synthetic web (default: {DEFAULT_PAGES:,}; --quick: {QUICK_PAGES})",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.wi_pages is not None and args.wi_pages < 1:
        raise ValueError(f"--wi-pages must be positive, not {args.wi_pages}")
    pages = args.wi_pages or (QUICK_PAGES if args.quick else DEFAULT_PAGES)
    web = synthetic.generate(pages, seed=SEED)
    recrawl = synthetic.mutate(web, seed=SEED + 1, edit=0.05, remove=0.01, add=0.0)
    results = []
    kept: dict[str, Any] = {}
    with scratch_dir(args.dir, "webindex-") as scratch:
        for system, runner in (
            ("percolite", _run_percolite),
            ("sqlite", _run_sqlite),
            ("parse", _run_parse),
        ):
            tree, work = scratch / f"{system}-tree", scratch / system
            work.mkdir()
            for phase, state in (("first load", web), ("re-crawl", recrawl)):
                synthetic.write_html(state, str(tree))
                log(f"webindex: {system}, {phase}, {len(state):,} pages")
                began = time.perf_counter()
                read = runner(tree, work)
                seconds = time.perf_counter() - began
                if system != "parse":
                    kept[system, phase] = _tables(system, work)
                results.append(
                    {"system": system, "phase": phase, "pages": read, "seconds": seconds}
                )
    same = {
        phase: kept["percolite", phase] == kept["sqlite", phase]
        for phase in ("first load", "re-crawl")
    }
    return {
        "name": NAME,
        "pages": pages,
        "machine": machine_info(),
        "results": results,
        "same_tables": same,
    }


def tables(report: dict[str, Any]) -> list[Table]:
    by = {(r["system"], r["phase"]): r for r in report["results"]}
    rows = []
    for phase in ("first load", "re-crawl"):
        parse = by[("parse", phase)]["seconds"]
        ours, theirs = by[("percolite", phase)]["seconds"], by[("sqlite", phase)]["seconds"]
        for system in SYSTEMS:
            r = by[(system, phase)]
            rows.append([phase, system, f"{r['seconds']:.2f}", f"{r['pages'] / r['seconds']:,.0f}"])
        speedup = ratio(theirs - parse, ours - parse)
        rows.append(
            [phase, "percolite / SQLite (processing)", "", f"{speedup:.2f}x" if speedup else "-"]
        )
    return [
        Table(
            f"webindex, synthetic web of {report['pages']:,} pages (HTML tree)",
            ["phase", "system", "seconds", "pages/s"],
            rows,
            ["processing = end to end less the parse time; one repetition (skeleton)"],
        )
    ]


def format_report(report: dict[str, Any]) -> str:
    text = format_tables(tables(report))
    differ = [phase for phase, same in report["same_tables"].items() if not same]
    if differ:
        text += f"\nerror: percolite's and SQLite's tables differ after: {', '.join(differ)}"
    return text


def main(argv: list[str] | None = None) -> int:
    return run_standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
