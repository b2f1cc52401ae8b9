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

``webindex_inlinks`` has one row per (target, source page) link, with the
seq of its last change; ``webindex_inlinks_seq`` guards deleted links.

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
CREATE TABLE IF NOT EXISTS webindex_inlinks_seq (
    uri TEXT NOT NULL, from_uri TEXT NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (uri, from_uri));
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
        conn.execute("BEGIN IMMEDIATE")
        try:
            for entry in entries:
                apply(conn, entry)
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
        self._write(_apply_uri, entries)

    # -- export queue "outcounts": uri -> outcount (None: no content) ---------
    def outcounts(self, entries: list[Any]) -> None:
        self._write(_apply_outcount, entries)

    # -- export queue "inlinks": [target, source] -> anchor or None -----------
    def inlinks(self, entries: list[Any]) -> None:
        self._write(_apply_inlink, entries)


def _guard(conn: sqlite3.Connection, uri: str) -> tuple[int, int, int]:
    row = conn.execute(
        "SELECT in_seq, out_seq, outcount FROM webindex_pages_seq WHERE uri = ?", (uri,)
    ).fetchone()
    return row if row is not None else (-1, -1, 0)


def _apply_uri(conn: sqlite3.Connection, entry: Any) -> None:
    uri, value, seq = entry.key, entry.value, entry.seq
    in_seq, out_seq, outcount = _guard(conn, uri)
    if seq <= in_seq:
        return
    conn.execute(
        "INSERT INTO webindex_pages_seq (uri, in_seq, out_seq, outcount) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (uri) DO UPDATE SET in_seq = excluded.in_seq",
        (uri, seq, out_seq, outcount),
    )
    if value is None:
        conn.execute("DELETE FROM webindex_pages WHERE uri = ?", (uri,))
        return
    incount, has_content = value
    conn.execute(
        "INSERT INTO webindex_pages (uri, domain, incount, outcount, has_content, in_seq, "
        "out_seq) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (uri) DO UPDATE SET "
        "incount = excluded.incount, has_content = excluded.has_content, "
        "in_seq = excluded.in_seq",
        (uri, domain_of(uri), incount, outcount, has_content, seq, out_seq),
    )


def _apply_outcount(conn: sqlite3.Connection, entry: Any) -> None:
    uri, value, seq = entry.key, entry.value, entry.seq
    in_seq, out_seq, _ = _guard(conn, uri)
    if seq <= out_seq:
        return
    outcount = value or 0
    conn.execute(
        "INSERT INTO webindex_pages_seq (uri, in_seq, out_seq, outcount) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (uri) DO UPDATE SET out_seq = excluded.out_seq, "
        "outcount = excluded.outcount",
        (uri, in_seq, seq, outcount),
    )
    conn.execute(
        "UPDATE webindex_pages SET outcount = ?, out_seq = ? WHERE uri = ?",
        (outcount, seq, uri),
    )


def _apply_inlink(conn: sqlite3.Connection, entry: Any) -> None:
    target, source = json.loads(entry.key)
    seq = entry.seq
    row = conn.execute(
        "SELECT seq FROM webindex_inlinks_seq WHERE uri = ? AND from_uri = ?", (target, source)
    ).fetchone()
    if row is not None and seq <= row[0]:
        return
    conn.execute(
        "INSERT INTO webindex_inlinks_seq (uri, from_uri, seq) VALUES (?, ?, ?) "
        "ON CONFLICT (uri, from_uri) DO UPDATE SET seq = excluded.seq",
        (target, source, seq),
    )
    if entry.value is None:
        conn.execute(
            "DELETE FROM webindex_inlinks WHERE uri = ? AND from_uri = ?", (target, source)
        )
    else:
        conn.execute(
            "INSERT INTO webindex_inlinks (uri, from_uri, anchor, seq) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (uri, from_uri) DO UPDATE SET anchor = excluded.anchor, "
            "seq = excluded.seq",
            (target, source, entry.value, seq),
        )
