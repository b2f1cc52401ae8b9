"""The webindex application, built only on percolite's public API.

It follows Apache Fluo's webindex: pages go in with their outlinks; the
inbound-link index, the per-URI and per-domain counts and the rankings are
kept current in a query database, never in the store ("inverting on
export").

Data flow::

    load_page(uri, links)            one transaction per new or changed page
      p:<uri>  page:new              the page's links as JSON ("-": removed);
                                     STRONG notification
                                  |
    page_changed (observer)       v  diffs them against page:links (the
                                     links as indexed), which it then sets
      combine queue "uris"           uri -> (incount, has_content), native sum;
                                     all zero deletes the key: "no longer known"
      export "export_inlinks"        source -> its links {target: anchor}, None: gone
      export "export_outcounts"      uri -> number of outlinks (0: no content)
                                  |
    uris: on_change               v
      export "export_pages"          uri -> (domain, incount, has_content), None: unknown
      combine queue "domains"        domain -> (pages, incount), native sum
                                  |
    domains: export_to            v
      export "export_domains"        domain -> (pages, incount)

The export queues' sink is the query database, written by the built-in SQL
exporters (:class:`Sink`): ``webindex_inlinks`` as row groups (one entry
per source page replaces its rows), ``webindex_pages`` as shared rows (the
URI queue makes and deletes them, the outcounts fill their column).

The semantics (``links`` holds the URI rules):

* a URI's inbound count is the number of distinct pages with content whose
  outlinks include it;
* a URI is known while it has content or an inbound count above zero: that
  is exactly while its combine value is not all zero;
* a domain (the URI's host) has the number of its known URIs and the sum of
  their inbound counts.

Every worker process imports this module, so the sink is named by the
environment variable ``PERCOLITE_WEBINDEX_EXPORT`` (``sqlite:FILE`` or a
``postgresql://`` URI), which
:func:`set_export` sets for this process and the worker processes it starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections import defaultdict
from typing import Any

import percolite
from percolite import exporters

from .links import domain_of

__all__ = [
    "app",
    "uris",
    "domains",
    "load_page",
    "remove_page",
    "load_file",
    "load_batch",
    "unload_files",
    "unload_file",
    "set_export",
    "close_export",
    "open_sink",
    "read_top",
    "Rows",
    "read_inlinks",
    "read_domains",
    "read_tables",
    "EXPORT_VARIABLE",
]

EXPORT_VARIABLE = "PERCOLITE_WEBINDEX_EXPORT"

NEW = ("page", "new")  # the links as last loaded: JSON {target: anchor}, or REMOVED
LINKS = ("page", "links")  # the links as indexed, while the page has content
FILE_URI = ("file", "uri")
FILE_DIGEST = ("file", "digest")
REMOVED = b"-"

app: percolite.App = percolite.App("webindex")

uris: percolite.CombineQueue[str, tuple[int, int]] = app.combine_queue(
    "uris", buckets=16, value_codec="int64s:2", linger=0.5
)
domains: percolite.CombineQueue[str, tuple[int, int]] = app.combine_queue(
    "domains", buckets=4, value_codec="int64s:2", linger=0.5
)


def _schema(integer: str) -> list[str]:
    """The query database's tables, made before the exporters fill them
    (an exporter creates only its own columns, and no query indexes).
    ``outcount`` may be NULL: a take-over of its export queue empties it."""
    return [
        "CREATE TABLE IF NOT EXISTS webindex_pages (uri TEXT PRIMARY KEY, domain TEXT NOT NULL,"
        f" incount {integer} NOT NULL, outcount {integer} DEFAULT 0,"
        f" has_content {integer} NOT NULL, in_seq {integer}, out_seq {integer})",
        "CREATE INDEX IF NOT EXISTS webindex_pages_incount ON webindex_pages (incount DESC)",
        "CREATE INDEX IF NOT EXISTS webindex_pages_domain ON webindex_pages (domain, incount DESC)",
        "CREATE TABLE IF NOT EXISTS webindex_inlinks (uri TEXT NOT NULL, from_uri TEXT NOT NULL,"
        f" anchor TEXT NOT NULL, seq {integer}, PRIMARY KEY (uri, from_uri))",
        "CREATE TABLE IF NOT EXISTS webindex_domains (domain TEXT PRIMARY KEY,"
        f" pages {integer} NOT NULL, incount {integer} NOT NULL, seq {integer} NOT NULL)",
    ]


_POSTGRES = ("postgresql://", "postgres://")


class Sink:
    """The query database (``sqlite:FILE`` or a ``postgresql://`` URI): an
    exporter of the built-in SQL ones for each export queue.

    ``webindex_pages`` is shared by two queues: ``pages`` (the URI combine
    queue's values) makes and deletes its rows and writes ``domain``,
    ``incount`` and ``has_content``; ``outcounts`` (the page observer)
    fills ``outcount`` of the rows that exist. ``webindex_inlinks`` holds
    row groups: one entry per source page, its links, replaces the page's
    rows."""

    def __init__(self, target: str) -> None:
        if not isinstance(target, str):
            raise TypeError(f"the export target must be a str, not {type(target).__name__}")
        options: dict[str, Any]
        if target.startswith(_POSTGRES):
            self.path: str | None = None
            make: Any = exporters.Postgres
            where: str = target
            options = {}
        elif target.startswith("sqlite:") and target[len("sqlite:") :]:
            self.path = os.path.abspath(target[len("sqlite:") :])
            make, where = exporters.SQLite, self.path
            options = {}
        else:
            raise ValueError(
                f"unknown export target {target!r}: use sqlite:FILE or postgresql://..."
            )
        self.target: str = target
        self.pages: Any = make(
            where,
            "webindex_pages",
            key="uri",
            columns=("domain", "incount", "has_content"),
            seq="in_seq",
            **options,
        )
        self.outcounts: Any = make(
            where, "webindex_pages", key="uri", columns="outcount", seq="out_seq", makes_rows=False
        )
        self.inlinks: Any = make(
            where, "webindex_inlinks", key="from_uri", rows="uri", columns="anchor"
        )
        self.domains: Any = make(
            where, "webindex_domains", key="domain", columns=("pages", "incount")
        )
        # How messages name it: a PostgreSQL URI without its password.
        self.shown: str = self.pages.safe_dsn if self.path is None else target

    def check(self) -> None:
        """Raises now what exporting would: ConnectionError when a
        PostgreSQL query database cannot be reached, ValueError when the
        SQLite file exists but is not a database (a missing one is made when
        first written)."""
        if self.path is None:
            self.connect().close()
        else:
            self.pages.check()

    def connect(self) -> Any:
        """A psycopg connection to the PostgreSQL query database; an
        unreachable server raises ConnectionError naming it."""
        return self.pages.connect()

    def close(self) -> None:
        """Closes this process's connections to the query database."""
        for exporter in (self.pages, self.outcounts, self.inlinks, self.domains):
            exporter.close()

    def create(self) -> None:
        """Makes the tables and their query indexes when missing."""
        if self.path is None:
            with self.connect() as db, db.transaction():
                db.execute("SELECT pg_advisory_xact_lock(hashtext('percolite.webindex schema'))")
                for statement in _schema("BIGINT"):
                    db.execute(statement)
            return
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db, db:
            db.execute("PRAGMA journal_mode=WAL")
            for statement in _schema("INTEGER"):
                db.execute(statement)


def open_sink(target: str) -> Sink:
    """The sink for ``target`` (``sqlite:FILE`` or ``postgresql://...``);
    raises ValueError for another."""
    return Sink(target)


_sink: list[Sink] = []
_sink_lock = threading.Lock()


def set_export(target: str) -> Sink:
    """Choose the sink for this process and the worker processes it starts."""
    sink = open_sink(target)
    sink.create()
    os.environ[EXPORT_VARIABLE] = target
    with _sink_lock:
        replaced, _sink[:] = list(_sink), [sink]
    for old in replaced:
        old.close()
    return sink


def close_export() -> None:
    """Closes the sink this process chose (its connections); the next export
    opens the one ``PERCOLITE_WEBINDEX_EXPORT`` names."""
    with _sink_lock:
        replaced, _sink[:] = list(_sink), []
    for old in replaced:
        old.close()


def _current_sink() -> Sink:
    with _sink_lock:
        if not _sink:
            target = os.environ.get(EXPORT_VARIABLE)
            if not target:
                raise percolite.SinkRefused(
                    f"no export target: call set_export() or set {EXPORT_VARIABLE}"
                )
            _sink.append(open_sink(target))
        return _sink[0]


class _Forward:
    """An export queue's exporter: the exporter ``part`` of the sink this
    process chose, to which every batch goes unchanged (natively where the
    queue can)."""

    def __init__(self, part: str) -> None:
        self.part = part

    def __call__(self, entries: list[Any]) -> None:
        self.forward_to()(entries)

    def forward_to(self) -> Any:
        return getattr(_current_sink(), self.part)

    def take_over(self, store: str, epoch: int = 1) -> dict[str, Any]:
        return dict(self.forward_to().take_over(store, epoch))

    def __repr__(self) -> str:
        return f"<webindex sink {self.part}: ${EXPORT_VARIABLE}>"


# Export batches of up to EXPORT_BATCH entries, gathered for up to
# EXPORT_LINGER seconds: the query database then commits less often and
# writes each page of its B-trees fewer times (bench/results/notes.md,
# "Webindex: export batches").
EXPORT_BATCH = 16384
EXPORT_LINGER = 2.0

# uri -> (domain, incount, has_content); None: no longer known.
pages_export: percolite.ExportQueue[str, Any] = app.export_queue(
    "export_pages",
    _Forward("pages"),
    buckets=4,
    value_codec="json",
    batch_size=EXPORT_BATCH,
    linger=EXPORT_LINGER,
)
# uri -> its number of outlinks (0: no content).
outcounts_export: percolite.ExportQueue[str, Any] = app.export_queue(
    "export_outcounts",
    _Forward("outcounts"),
    buckets=4,
    value_codec="int64",
    batch_size=EXPORT_BATCH,
    linger=EXPORT_LINGER,
)
# source page -> its links {target: anchor}; None: the page is gone.
inlinks_export: percolite.ExportQueue[str, Any] = app.export_queue(
    "export_inlinks",
    _Forward("inlinks"),
    buckets=4,
    value_codec="json",
    batch_size=EXPORT_BATCH,
    linger=EXPORT_LINGER,
)
domains_export: percolite.ExportQueue[str, Any] = app.export_queue(
    "export_domains",
    _Forward("domains"),
    buckets=1,
    value_codec="int64s:2",
    batch_size=EXPORT_BATCH,
    linger=EXPORT_LINGER,
)

domains.export_to(domains_export)


@uris.on_change
def _uri_changed(tx: percolite.Transaction, changes: list[Any]) -> None:
    """Exports the URI's row; a URI that becomes known or unknown changes
    its domain's page count, a changed inbound count its domain's sum."""
    updates: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for change in changes:
        old = change.old or (0, 0)
        new = change.new or (0, 0)
        domain = domain_of(change.key)
        delta = updates[domain]
        delta[0] += (change.new is not None) - (change.old is not None)
        delta[1] += new[0] - old[0]
        pages_export.add(tx, change.key, None if change.new is None else (domain, *change.new))
    domains.add(tx, {d: (p, n) for d, (p, n) in updates.items() if p or n})


def _links_of(value: bytes | None) -> dict[str, str] | None:
    if value is None or value == REMOVED:
        return None
    return json.loads(value)


@app.observer(NEW, notify=percolite.STRONG)
def page_changed(tx: percolite.Transaction, row: bytes, column: percolite.Column) -> None:
    """Diffs a page's new outlinks against its indexed ones: +1/-1 per
    target gained or lost, the page's own has_content, the inlinks and the
    outcount exported."""
    new_value = tx.get(row, NEW)
    indexed = tx.get(row, LINKS)
    if new_value is None or new_value == indexed or (new_value == REMOVED and indexed is None):
        return  # indexed already
    uri = row[2:].decode()
    old = _links_of(indexed)
    new = _links_of(new_value)
    old_links, new_links = old or {}, new or {}
    updates: dict[str, tuple[int, int]] = {}
    for target in new_links.keys() - old_links.keys():
        updates[target] = (1, 0)
    for target in old_links.keys() - new_links.keys():
        updates[target] = (-1, 0)
    # One entry per page, its whole link set: the sink replaces the page's
    # rows, so a page costs one export entry rather than one per link.
    if new_links != old_links or (old is None) != (new is None):
        inlinks_export.add(tx, uri, new)
    if (old is None) != (new is None):
        updates[uri] = (0, 1 if new is not None else -1)
    if updates:
        uris.add(tx, updates)
    if (old is None) != (new is None) or len(old_links) != len(new_links):
        outcounts_export.add(tx, uri, len(new_links))
    # page:new stays as it is: deleting it would cost a tombstone (and
    # its removal later) for every page loaded.
    if new is None:
        tx.delete(row, LINKS)
    else:
        tx.set(row, LINKS, new_value)


def _encode(links: dict[str, str]) -> bytes:
    return json.dumps(links, ensure_ascii=False, separators=(",", ":")).encode()


def _current(tx: percolite.Transaction, row: str) -> bytes | None:
    """The page's links as last loaded (pending or indexed); None: no content."""
    value = tx.get(row, NEW)
    if value is None:
        value = tx.get(row, LINKS)
    return None if value == REMOVED else value


def load_page(tx: percolite.Transaction, uri: str, links: dict[str, str]) -> bool:
    """Gives page ``uri`` (normalized) the outlinks ``links`` in ``tx``;
    False when it had them already."""
    row = "p:" + uri
    value = _encode(links)
    if _current(tx, row) == value:
        return False
    tx.set(row, NEW, value)
    return True


def remove_page(tx: percolite.Transaction, uri: str) -> bool:
    """Removes page ``uri``'s content; False when it had none."""
    row = "p:" + uri
    if _current(tx, row) is None:
        return False
    tx.set(row, NEW, REMOVED)
    return True


def load_file(
    tx: percolite.Transaction, path: str, digest: str, uri: str, links: dict[str, str]
) -> bool:
    """Records that file ``path`` (bytes of digest ``digest``) is page
    ``uri`` and loads it; False when the file is unchanged."""
    row = "f:" + path
    old_uri = tx.get(row, FILE_URI)
    if old_uri == uri.encode() and tx.get(row, FILE_DIGEST) == digest.encode():
        return False
    if old_uri is not None and old_uri != uri.encode():
        remove_page(tx, old_uri.decode())  # loaded with another base URL before
    tx.set(row, FILE_URI, uri)
    tx.set(row, FILE_DIGEST, digest)
    load_page(tx, uri, links)
    return True


def load_batch(tx: percolite.Transaction, pages: list[Any]) -> int:
    """Loads ``pages`` (:class:`inputs.Page`, each URI at most once) in
    ``tx``; returns how many were new or changed."""
    changed = 0
    for page in pages:
        if page.file is not None:
            changed += load_file(tx, page.file, page.digest, page.url, page.links)
        else:
            changed += load_page(tx, page.url, page.links)
    return changed


def unload_files(tx: percolite.Transaction, paths: list[str]) -> int:
    """Removes the files ``paths`` and their pages; returns how many were loaded."""
    return sum(unload_file(tx, path) for path in paths)


def unload_file(tx: percolite.Transaction, path: str) -> bool:
    """Removes file ``path`` and its page; False when it was not loaded."""
    row = "f:" + path
    uri = tx.get(row, FILE_URI)
    if uri is None:
        return False
    tx.delete(row, FILE_URI)
    tx.delete(row, FILE_DIGEST)
    remove_page(tx, uri.decode())
    return True


def loaded_digests(tx: percolite.Transaction, prefix: str) -> dict[str, tuple[str, str]]:
    """The loaded files whose absolute path starts with ``prefix``, as
    ``{path: (uri, digest)}``."""
    start = len("f:")
    cells: dict[str, dict[str, str]] = {}
    for row, column, value in tx.scan(prefix="f:" + prefix, columns=[FILE_URI, FILE_DIGEST]):
        cells.setdefault(row[start:].decode(), {})[column.qualifier.decode()] = value.decode()
    uri, digest = FILE_URI[1], FILE_DIGEST[1]
    return {
        path: (found[uri], found[digest])
        for path, found in cells.items()
        if uri in found and digest in found
    }


# -- queries ----------------------------------------------------------------------


def _query(target: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` (``?`` placeholders) in the query database
    ``target``; [] while a table is missing (nothing exported yet). A SQLite
    file that does not exist raises FileNotFoundError: a mistyped path is
    not an empty index; one that is not a database raises ValueError."""
    sink = open_sink(target)
    if sink.path is None:
        import psycopg

        with sink.connect() as db:
            try:
                return db.execute(sql.replace("?", "%s"), args).fetchall()
            except psycopg.errors.UndefinedTable:
                return []
    if not os.path.exists(sink.path):
        raise FileNotFoundError(f"no query database at {sink.path}")
    try:
        sink.check()  # the exporter's rule for a file that is not a database
    finally:
        sink.close()
    with contextlib.closing(sqlite3.connect(sink.path)) as db:
        try:
            return db.execute(sql, args).fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return []  # nothing exported yet
            raise


class Rows(list[tuple[Any, ...]]):
    """The rows of a query (a list of tuples) and their ``columns``;
    :meth:`to_pandas` makes a DataFrame of them."""

    def __init__(self, rows: list[tuple[Any, ...]], columns: tuple[str, ...]) -> None:
        super().__init__(rows)
        self.columns: tuple[str, ...] = columns

    def to_pandas(self) -> Any:
        """A pandas DataFrame with the rows and their columns (ImportError,
        saying what to install, without pandas)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("to_pandas() needs pandas: pip install 'percolite[pandas]'") from None
        return pandas.DataFrame(list(self), columns=list(self.columns))


def read_top(target: str, n: int = 10, domain: str | None = None) -> Rows:
    """The ``n`` URIs with the most inbound links:
    ``[(uri, incount, outcount, has_content)]``, of ``domain`` if given."""
    where, args = ("WHERE domain = ? ", (domain,)) if domain else ("", ())
    rows = _query(
        target,
        f"SELECT uri, incount, outcount, has_content FROM webindex_pages {where}"
        "ORDER BY incount DESC, uri LIMIT ?",
        (*args, n),
    )
    return Rows(rows, ("uri", "incount", "outcount", "has_content"))


def read_inlinks(target: str, uri: str) -> Rows:
    """The pages linking to ``uri``: ``[(from_uri, anchor)]``."""
    rows = _query(
        target,
        "SELECT from_uri, anchor FROM webindex_inlinks WHERE uri = ? ORDER BY from_uri",
        (uri,),
    )
    return Rows(rows, ("from_uri", "anchor"))


def read_domains(target: str, n: int = 10) -> Rows:
    """The ``n`` domains with the most inbound links: ``[(domain, pages, incount)]``."""
    rows = _query(
        target,
        "SELECT domain, pages, incount FROM webindex_domains ORDER BY incount DESC, domain LIMIT ?",
        (n,),
    )
    return Rows(rows, ("domain", "pages", "incount"))


def read_tables(target: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the three tables, sorted, without the seq columns: for
    comparing two query databases."""
    return {
        "webindex_pages": _query(
            target,
            "SELECT uri, domain, incount, outcount, has_content FROM webindex_pages ORDER BY uri",
        ),
        "webindex_inlinks": _query(
            target,
            "SELECT uri, from_uri, anchor FROM webindex_inlinks ORDER BY uri, from_uri",
        ),
        "webindex_domains": _query(
            target, "SELECT domain, pages, incount FROM webindex_domains ORDER BY domain"
        ),
    }


def read_counts(target: str) -> dict[str, int]:
    """How many rows each of the three tables holds."""
    return {
        table: (_query(target, f"SELECT count(*) FROM {table}") or [(0,)])[0][0]
        for table in ("webindex_pages", "webindex_inlinks", "webindex_domains")
    }
