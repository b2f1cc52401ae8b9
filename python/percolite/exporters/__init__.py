"""Built-in exporters for the export queue: SQLite, PostgreSQL, JSON Lines.

The export queue calls an exporter as ``exporter(entries)``, where ``entries``
is a list of :class:`SequencedExport` ``(key, value, seq)`` ordered by key,
then seq; ``value is None`` means the key was deleted.
Delivery is **at least once**: a batch may come again (possibly with more
entries), two processes may export the same batch at the same time, and an old
batch may arrive after a newer one. An exporter that raises leaves its batch
queued, to be retried later.

Every exporter here is therefore idempotent through a **seq guard**: for each
key it remembers the highest seq it applied (deleted keys included) and skips
an entry whose seq is not higher. (SQLite keeps it in the row's ``seq`` and,
for deleted keys, in a guard table; PostgreSQL in a guard row per key.)
Within one call only the newest entry of each key matters, so calls collapse
the batch per key first. Full description, table layouts and how to write
your own: ``docs/exporters.md``.

Thread and process safety: one exporter object may be called from several
threads at once, and each worker process builds its own. Connections are
opened lazily, per process (a forked child never touches its parent's
connections: it opens its own), and pooled per object so that threads do
not share one. ``close()`` closes the connections of the calling process;
later calls raise :class:`percolite.ClosedError`.
"""

from __future__ import annotations

from .._export import TRANSIENT_ERRORS, SequencedExport, sink_is_down
from ._jsonlines import JSONLines
from ._postgres import Postgres
from ._sql_layout import _Row, _sort_key  # noqa: F401 - the SQL exporters' row type and key order
from ._sqlite import SQLite

# SequencedExport is here too, for those who write or test an exporter.
__all__ = ["SQLite", "Postgres", "JSONLines", "SequencedExport", "TRANSIENT_ERRORS", "sink_is_down"]
