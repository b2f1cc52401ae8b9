"""The query database's page and inlink tables, in SQLite.

``webindex_pages`` joins two sources: its ``incount`` and ``has_content``
come from the URI combine queue (export queue ``pages``), its ``outcount``
from the page observer (export queue ``outcounts``). Each source has its own
seq guard, ``in_seq`` and ``out_seq``, so neither overwrites the other's
columns with an older value; the guard table ``webindex_pages_seq`` keeps
both seqs and the last outcount for URIs without a row, so that a row
brought back by the URI queue gets the outcount exported while it was gone,
and an outcount exported while the row is gone does not bring it back (a
row exists exactly while its URI is known).

``webindex_inlinks`` has one row per (target, source page) link. Its export
queue has one entry per source page, the page's whole link set (None: the
page is gone), which replaces the page's rows; ``webindex_inlinks_seq``
keeps each source page's seq, and a row has the seq of its page's entry.

This exporter belongs in :mod:`percolite.exporters`: the built-in SQL
exporters write every value column of a row and delete the whole row on a
None value, so two export queues cannot share a table's rows, and one entry
writes one row. What is missing there: (1) a column subset per export queue
(``columns=`` naming the ones this queue writes, with its own seq column,
and a rule for which queue's deletion removes the row), and (2) the
persistent values of another source for a row that comes back. Until it is
there, this callable writes the tables with the same seq guard rule: an
entry is applied only if its seq is higher than the one recorded for its key
and source. It does not record the owning store as the built-in exporters
do (entries of another store are not refused).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from typing import Any

from .links import domain_of

__all__ = ["SQLiteTables", "SCHEMA"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS webindex_pages (
    uri TEXT PRIMARY KEY, domain TEXT NOT NULL, incount INTEGER NOT NULL,
    outcount INTEGER NOT NULL, has_content INTEGER NOT NULL,
    in_seq INTEGER NOT NULL, out_seq INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS webindex_pages_incount ON webindex_pages (incount DESC);
CREATE INDEX IF NOT EXISTS webindex_pages_domain ON webindex_pages (domain, incount DESC);
CREATE TABLE IF NOT EXISTS webindex_pages_seq (
    uri TEXT PRIMARY KEY, in_seq INTEGER NOT NULL, out_seq INTEGER NOT NULL,
    outcount INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS webindex_inlinks (
    uri TEXT NOT NULL, from_uri TEXT NOT NULL, anchor TEXT NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (uri, from_uri));
CREATE INDEX IF NOT EXISTS webindex_inlinks_from ON webindex_inlinks (from_uri);
CREATE TABLE IF NOT EXISTS webindex_inlinks_seq (
    from_uri TEXT PRIMARY KEY, seq INTEGER NOT NULL);
"""


class SQLiteTables:
    """The exporters of the ``pages``, ``outcounts`` and ``inlinks`` export
    queues, writing into the SQLite file ``path`` (made when missing, WAL).
    Each call is one ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.path: str = os.path.abspath(path)
        if not os.path.isdir(os.path.dirname(self.path)):
            raise FileNotFoundError(f"no directory for the query database {self.path}")
        self.timeout: float = timeout
        self._local = threading.local()
        # The export queues of one process take turns here rather than in
        # SQLite's busy handler, which sleeps up to 100 ms between tries: with
        # four queues writing one file, those sleeps were most of the time.
        self.lock: threading.Lock = _lock_of(self.path)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(SCHEMA)
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _write(self, apply: Any, entries: list[Any]) -> None:
        conn = self._conn()
        with self.lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                apply(conn, entries)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def create(self) -> None:
        """Creates the tables now (they are made at the first export otherwise)."""
        self._conn()

    # -- export queue "pages": uri -> (incount, has_content) or None ----------
    def pages(self, entries: list[Any]) -> None:
        self._write(_apply_uris, entries)

    # -- export queue "outcounts": uri -> outcount (None: no content) ---------
    def outcounts(self, entries: list[Any]) -> None:
        self._write(_apply_outcounts, entries)

    # -- export queue "inlinks": source -> JSON {target: anchor} or None -----
    def inlinks(self, entries: list[Any]) -> None:
        self._write(_apply_inlinks, entries)


_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


def _lock_of(path: str) -> threading.Lock:
    """One lock per query database file in this process."""
    with _locks_lock:
        return _locks.setdefault(path, threading.Lock())


# Each batch is applied by a few executemany() statements instead of
# statements per entry: first every entry's seq is raised in the guard table
# where it is higher than the recorded one; then the rows are written only
# for the entries whose seq is now the recorded one. Within a batch an older
# entry of a key thus loses to a newer one whatever their order, and an
# entry delivered twice writes the same row twice.

_RAISE_IN_SEQ = (
    "INSERT INTO webindex_pages_seq (uri, in_seq, out_seq, outcount) VALUES (?, ?, -1, 0) "
    "ON CONFLICT (uri) DO UPDATE SET in_seq = excluded.in_seq "
    "WHERE excluded.in_seq > webindex_pages_seq.in_seq"
)
_DELETE_PAGE = (
    "DELETE FROM webindex_pages WHERE uri = ?1 "
    "AND (SELECT in_seq FROM webindex_pages_seq WHERE uri = ?1) = ?2"
)
# A new row takes the outcount (and its seq) last exported for the URI.
_UPSERT_PAGE = (
    "INSERT INTO webindex_pages (uri, domain, incount, outcount, has_content, in_seq, out_seq) "
    "SELECT ?1, ?2, ?3, s.outcount, ?4, ?5, s.out_seq FROM webindex_pages_seq s "
    "WHERE s.uri = ?1 AND s.in_seq = ?5 "
    "ON CONFLICT (uri) DO UPDATE SET incount = excluded.incount, "
    "has_content = excluded.has_content, in_seq = excluded.in_seq"
)
_RAISE_OUT_SEQ = (
    "INSERT INTO webindex_pages_seq (uri, in_seq, out_seq, outcount) VALUES (?, -1, ?, ?) "
    "ON CONFLICT (uri) DO UPDATE SET out_seq = excluded.out_seq, outcount = excluded.outcount "
    "WHERE excluded.out_seq > webindex_pages_seq.out_seq"
)
_UPDATE_OUTCOUNT = (
    "UPDATE webindex_pages SET outcount = ?2, out_seq = ?3 WHERE uri = ?1 "
    "AND (SELECT out_seq FROM webindex_pages_seq WHERE uri = ?1) = ?3"
)
_RAISE_LINK_SEQ = (
    "INSERT INTO webindex_inlinks_seq (from_uri, seq) VALUES (?, ?) "
    "ON CONFLICT (from_uri) DO UPDATE SET seq = excluded.seq "
    "WHERE excluded.seq > webindex_inlinks_seq.seq"
)
_DELETE_LINKS = (
    "DELETE FROM webindex_inlinks WHERE from_uri = ?1 "
    "AND (SELECT seq FROM webindex_inlinks_seq WHERE from_uri = ?1) = ?2"
)
_INSERT_LINK = (
    "INSERT INTO webindex_inlinks (uri, from_uri, anchor, seq) SELECT ?1, ?2, ?3, ?4 "
    "WHERE (SELECT seq FROM webindex_inlinks_seq WHERE from_uri = ?2) = ?4"
)


def _apply_uris(conn: sqlite3.Connection, entries: list[Any]) -> None:
    conn.executemany(_RAISE_IN_SEQ, [(e.key, e.seq) for e in entries])
    conn.executemany(_DELETE_PAGE, [(e.key, e.seq) for e in entries if e.value is None])
    conn.executemany(
        _UPSERT_PAGE,
        [
            (e.key, domain_of(e.key), e.value[0], e.value[1], e.seq)
            for e in entries
            if e.value is not None
        ],
    )


def _apply_outcounts(conn: sqlite3.Connection, entries: list[Any]) -> None:
    rows = [(e.key, e.seq, e.value or 0) for e in entries]
    conn.executemany(_RAISE_OUT_SEQ, rows)
    conn.executemany(_UPDATE_OUTCOUNT, [(uri, n, seq) for uri, seq, n in rows])


def _apply_inlinks(conn: sqlite3.Connection, entries: list[Any]) -> None:
    latest: dict[str, Any] = {}
    for e in entries:  # a page's rows are replaced once per batch, by its newest entry
        if e.key not in latest or e.seq > latest[e.key].seq:
            latest[e.key] = e
    conn.executemany(_RAISE_LINK_SEQ, [(e.key, e.seq) for e in latest.values()])
    conn.executemany(_DELETE_LINKS, [(e.key, e.seq) for e in latest.values()])
    conn.executemany(
        _INSERT_LINK,
        [
            (target, e.key, anchor, e.seq)
            for e in latest.values()
            if e.value is not None
            for target, anchor in json.loads(e.value).items()
        ],
    )
