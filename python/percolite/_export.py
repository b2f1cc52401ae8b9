"""The export queue: only committed data leaves for external systems.

Contract: ``cpp/include/percolite/export_queue.h`` (from Fluo Recipes'
ExportQueue, shared/seeds 003). In short:

* ``eq.add(tx, key, value)`` queues an entry that exists if and only if ``tx``
  commits; adders never collide with each other or with the exporter;
* each entry gets a sequence number ``seq`` that follows commit order: for one
  key, a later commit always has a larger ``seq``;
* one transaction per bucket reads a batch of entries, calls the exporter with
  them ordered by key, then seq, and deletes them when the exporter returns;
* at least once: an exporter that raises leaves the batch queued and it is
  retried with backoff (a retry may deliver the same entries again, possibly
  with more); sinks absorb duplicates with a seq guard.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["SequencedExport", "SEQ_INDEX_BITS"]

# seq = commit_ts << SEQ_INDEX_BITS | index of the entry in its transaction.
SEQ_INDEX_BITS = 20


class SequencedExport(NamedTuple):
    """One exported entry. ``value`` is ``None`` when the key was deleted.

    ``seq`` is an int that fits in a signed 64-bit column: the committing
    transaction's commit timestamp shifted left by 20 bits, plus the entry's
    index in that transaction. For one key, a later commit has a larger seq.
    """

    key: Any
    value: Any
    seq: int
