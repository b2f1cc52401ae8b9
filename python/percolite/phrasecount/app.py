"""The phrase count application, built only on percolite's public API.

It follows the phrasecount example of Fluo: documents are keyed by their
location; identical contents are one *unique document* with a reference count
of the locations pointing to it; phrase counts change only when a unique
document gains its first reference or loses its last.

Data flow::

    load(location, content)          one transaction per location (through env.loader)
      loc:<location>  loc:hash       the content id the location points to
      doc:<id>        doc:refs       reference count of the unique document
                      doc:text       its text, while referenced
                      doc:status     "index" / "unindex": STRONG notification
                                  |
    index_document (observer)     v  adds or subtracts the document's phrases
      combine queue "phrases"        native sum over (doc_count, total_count)
                                  |
    export_to                     v  one export entry per changed phrase
      export queue "export"  ---->   sink: phrase_counts(phrase, doc_count,
                                     total_count, seq), SQLite or PostgreSQL

The ``doc:indexed`` cell records whether a unique document's phrases are in
the counts, so a document that loses and regains its last reference before
the observer runs is neither counted twice nor dropped.

Every worker process imports this module, so the sink is named by the
environment variable ``PERCOLITE_PHRASECOUNT_EXPORT`` (``sqlite:FILE`` or a
``postgresql://`` URL), which :func:`set_export` sets for this process and the
worker processes it starts.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import percolite
from percolite import exporters

from .text import phrases

__all__ = [
    "app",
    "phrase_counts",
    "export",
    "load",
    "unload",
    "set_export",
    "open_sink",
    "EXPORT_VARIABLE",
    "TABLE",
]

EXPORT_VARIABLE = "PERCOLITE_PHRASECOUNT_EXPORT"
TABLE = "phrase_counts"

STATUS = ("doc", "status")
TEXT = ("doc", "text")
REFS = ("doc", "refs")
INDEXED = ("doc", "indexed")
NPHRASES = ("doc", "phrases")  # distinct phrases of an indexed document
HASH = ("loc", "hash")

app: percolite.App = percolite.App("phrasecount")

# phrase -> (doc_count, total_count), summed natively in C++. A run rewrites
# the value pages of its bucket that hold its phrases, and phrases are spread
# evenly, so its cost is about the bucket's pages, whatever it folds: the
# value pages are rewritten about once per linger, however many buckets there
# are. A long linger makes runs few and full (a hot phrase is written once
# per run, not once per document): with the export settings below, a large
# corpus takes less time and writes less to disk than with a shorter linger,
# the built-in corpus the same time. The buffer bounds a run's memory: the
# pages a run rewrites are held in memory until it commits, and as the store
# grows they are more distinct pages per run; a buffer of 16,384 keeps the
# speed of one of 65,536 with a quarter less memory on a large corpus, and
# one of 4,096 is slower (figures in bench/results/notes.md). The lingers
# cost no time at the end: cli.run waits with env.wait once the documents
# are loaded, and a linger never idles a waiter. Nor at the start: a young
# bucket goes at its second look (combine_queue.md), so on the built-in
# corpus most counts are folded and exported while the documents are still
# read. 64 buckets rather than 16: on a large corpus, one of 16 buckets
# fills its buffer long before its linger ends, so it runs several times a
# linger, each run rewriting most of the bucket's value pages; each of 64
# gets a quarter of the updates, folds a linger's worth in one run, and has
# a quarter of the pages to rewrite (and to hold until the run commits):
# 100,000 synthetic documents took 85 s instead of 115 s
# (bench/results/notes.md, "Phrase count: buckets").
phrase_counts: percolite.CombineQueue[str, tuple[int, int]] = app.combine_queue(
    "phrases", buckets=64, value_codec="int64s:2", buffer_size=16384, linger=2.5
)


def open_sink(target: str) -> Any:
    """The exporter for ``target``: ``sqlite:FILE`` or ``postgresql://...``."""
    if not isinstance(target, str):
        raise TypeError(f"the export target must be a str, not {type(target).__name__}")
    columns = ("doc_count", "total_count")
    if target.startswith("sqlite:"):
        path = target[len("sqlite:") :]
        if not path:
            raise ValueError("the export target 'sqlite:' needs a file name: sqlite:FILE")
        return exporters.SQLite(path, TABLE, key="phrase", columns=columns)
    if target.startswith(("postgresql://", "postgres://")):
        return exporters.Postgres(target, TABLE, key="phrase", columns=columns)
    raise ValueError(f"unknown export target {target!r}: use sqlite:FILE or a postgresql:// URL")


def set_export(target: str) -> Any:
    """Choose the sink for this process and the worker processes it starts;
    returns the exporter (checked: a bad target raises here)."""
    sink = open_sink(target)
    os.environ[EXPORT_VARIABLE] = target
    _sink.clear()
    _sink.append(sink)
    return sink


_sink: list[Any] = []
_sink_lock = threading.Lock()


def _current_sink() -> Any:
    with _sink_lock:
        if not _sink:
            target = os.environ.get(EXPORT_VARIABLE)
            if not target:
                # Refused, not failed: every batch would fail the same way,
                # so the queue is blocked at once instead of retried.
                raise percolite.SinkRefused(
                    f"no export target: call set_export() or set {EXPORT_VARIABLE}"
                )
            _sink.append(open_sink(target))
        return _sink[0]


# One bucket and big batches: each call is one durable SQLite (or PostgreSQL)
# transaction, and phrases are spread over the whole sink table, so a call of
# thousands of rows rewrites most of its pages (SQLite: into the WAL, then
# again at the checkpoint). Its cost is per call as much as per row, and one
# bucket lingering as long as the counts makes the fewest calls. Batches this
# large took a large corpus less time than half as large, and the built-in
# corpus the same; twice as large gained little more (figures in
# bench/results/notes.md).
class _Forward:
    """The export queue's exporter: sends changed counts to the sink this
    process chose (a deletion when a phrase reaches 0), and takes it over
    for :meth:`percolite.Env.take_over_sink`."""

    def __call__(self, entries: list[Any]) -> None:
        self.forward_to()(entries)

    def forward_to(self) -> Any:
        """The sink every batch goes to now: the queue applies batches to it
        natively (in C++, without Python) when it is a built-in SQLite or
        PostgreSQL sink."""
        return _current_sink()

    def take_over(self, store: str, epoch: int = 1) -> dict[str, Any]:
        return dict(_current_sink().take_over(store, epoch))

    def __repr__(self) -> str:
        return "<phrasecount sink: $" + EXPORT_VARIABLE + ">"


export: percolite.ExportQueue[str, Any] = app.export_queue(
    "export", _Forward(), buckets=1, value_codec="int64s:2", batch_size=131072, linger=2.5
)


# Every changed count goes to the sink; in C++, like an on_change that calls
# export.add(tx, change.key, change.new) for each change.
phrase_counts.export_to(export)


@app.observer(STATUS, notify=percolite.STRONG)
def index_document(tx: percolite.Transaction, row: bytes, column: percolite.Column) -> None:
    """Adds a unique document's phrases to the counts when it gains its first
    reference, and subtracts them when it loses its last."""
    status = tx.get(row, STATUS)
    indexed = tx.get(row, INDEXED) is not None
    if status == b"index" and not indexed:
        counts = phrases(tx.get(row, TEXT).decode())
        phrase_counts.add(tx, {p: (1, n) for p, n in counts.items()})
        tx.set(row, INDEXED, "1")
        tx.set(row, NPHRASES, str(len(counts)))
    elif status == b"unindex":
        if indexed:
            counts = phrases(tx.get(row, TEXT).decode())
            phrase_counts.add(tx, {p: (-1, -n) for p, n in counts.items()})
            tx.delete(row, INDEXED)
            tx.delete(row, NPHRASES)
        tx.delete(row, TEXT)
        tx.delete(row, STATUS)


def _doc_row(content_id: str) -> str:
    return "doc:" + content_id


def _add_reference(tx: percolite.Transaction, content_id: str, content: str) -> bool:
    row = _doc_row(content_id)
    refs = int(tx.get(row, REFS, b"0"))
    tx.set(row, REFS, str(refs + 1))
    if refs == 0:
        tx.set(row, TEXT, content)
        tx.set(row, STATUS, "index")
    return refs == 0


def _drop_reference(tx: percolite.Transaction, content_id: str) -> None:
    row = _doc_row(content_id)
    refs = int(tx.get(row, REFS, b"0"))
    if refs <= 1:
        tx.delete(row, REFS)
        tx.set(row, STATUS, "unindex")
    else:
        tx.set(row, REFS, str(refs - 1))


UNCHANGED, MOVED, FIRST_REFERENCE = 0, 1, 2


def load(tx: percolite.Transaction, location: str, content: str, content_id: str) -> int:
    """Points ``location`` at ``content`` (whose id is ``content_id``) in
    ``tx``. Returns ``UNCHANGED`` when it already pointed there,
    ``FIRST_REFERENCE`` when the content became a new unique document (to be
    indexed), ``MOVED`` otherwise."""
    row = "loc:" + location
    old = tx.get(row, HASH)
    new = content_id.encode()
    if old == new:
        return UNCHANGED
    tx.set(row, HASH, new)
    if old is not None:
        _drop_reference(tx, old.decode())
    return FIRST_REFERENCE if _add_reference(tx, content_id, content) else MOVED


def unload(tx: percolite.Transaction, location: str) -> bool:
    """Removes ``location``; returns False when it was not loaded."""
    row = "loc:" + location
    old = tx.get(row, HASH)
    if old is None:
        return False
    tx.delete(row, HASH)
    _drop_reference(tx, old.decode())
    return True


def is_loaded(tx: percolite.Transaction, location: str) -> bool:
    return tx.get("loc:" + location, HASH) is not None


def has_locations(tx: percolite.Transaction, prefix: str = "") -> bool:
    """Whether a loaded location starts with ``prefix``."""
    return next(iter(tx.scan(prefix="loc:" + prefix, columns=[HASH])), None) is not None


def locations(tx: percolite.Transaction, prefix: str = "") -> list[str]:
    """The loaded locations starting with ``prefix``."""
    start = len("loc:")
    scan = tx.scan(prefix="loc:" + prefix, columns=[HASH])
    return [row[start:].decode() for row, _c, _v in scan]


def read_top(target: str, n: int = 10) -> tuple[list[tuple[str, int, int]], int]:
    """The ``n`` phrases with the most occurrences in the sink, and how many
    phrases it holds: ``([(phrase, doc_count, total_count)], count)``."""
    top_sql = (
        f"SELECT phrase, doc_count, total_count FROM {TABLE} "
        "ORDER BY total_count DESC, doc_count DESC, phrase LIMIT %d" % n
    )
    count_sql = f"SELECT count(*) FROM {TABLE}"
    if target.startswith("sqlite:"):
        import sqlite3

        path = target[len("sqlite:") :]
        if not os.path.exists(path):
            return [], 0
        with sqlite3.connect(path) as db:
            try:
                return db.execute(top_sql).fetchall(), db.execute(count_sql).fetchone()[0]
            except sqlite3.OperationalError:  # no table: nothing was exported
                return [], 0
    import psycopg

    with psycopg.connect(target) as db:
        exists = db.execute("SELECT to_regclass(%s)", (TABLE,)).fetchone()[0]
        if exists is None:
            return [], 0
        rows = [tuple(r) for r in db.execute(top_sql).fetchall()]
        return rows, db.execute(count_sql).fetchone()[0]
