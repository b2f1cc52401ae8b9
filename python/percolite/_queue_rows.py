"""Queued entries as a queue stores them, for the readers outside the core:
queue depths and ``percolite check``. The layout is the core's
(``cpp/src/queues/queue_rows.h``); this module asks ``_core`` for it.

A bucket row ``<id>:<kind>:<bucket>`` holds single-entry records (the
qualifier is the stamp, then the key) and packed records (in the families
``_core.PACKED_FAMILIES``: the qualifier is the stamp alone, the value holds
several entries). Depths count entries, not records.
"""

from __future__ import annotations

from typing import Any

from . import _core

__all__ = ["PACKED_FAMILIES", "STAMP", "entry_count", "packed_entries", "queue_depth"]

STAMP: int = _core.STAMP_SIZE  # bytes of a record's stamp (commit_ts, index)
PACKED_FAMILIES: tuple[bytes, ...] = _core.PACKED_FAMILIES


def packed_entries(value: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of a packed record; ValueError when it does
    not decode."""
    return _core.packed_entries(value)


def entry_count(family: bytes, value: bytes) -> int:
    """How many entries a queue record of ``family`` holds (a malformed
    packed record counts as one: ``percolite check`` reports it)."""
    if family not in PACKED_FAMILIES:
        return 1
    count = _core.packed_count(value)
    return count if count else 1


def queue_depth(tx: Any, entry_row_prefix: bytes) -> int:
    """Entries queued under ``entry_row_prefix`` in ``tx``'s view (a scan)."""
    return sum(
        entry_count(column[0], value) for _, column, value in tx.scan(prefix=entry_row_prefix)
    )
