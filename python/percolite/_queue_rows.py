"""Queued entries as a queue stores them (cpp/src/queues/queue_rows.h), for
the readers outside the core: queue depths and ``percolite check``.

A bucket row ``<id>:<kind>:<bucket>`` holds single-entry records (family
``u`` or ``e``: the qualifier is the 12-byte stamp, then the key) and packed
records (family ``U`` or ``E``: the qualifier is the stamp alone, the value
holds several entries). Depths count entries, not records.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PACKED_FAMILIES", "STAMP", "entry_count", "packed_entries", "queue_depth"]

STAMP = 12  # bytes of a record's stamp (backend.h kStampSize)
PACKED_FAMILIES = (b"U", b"E")
_PACKED_VERSION = 1


def _varint(value: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint (at most 32 bits) at ``pos`` and the position
    after it; ValueError when truncated or too long."""
    result = 0
    for shift in range(0, 35, 7):
        if pos >= len(value):
            raise ValueError("truncated")
        byte = value[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if result >> 32:
                raise ValueError("a size of more than 32 bits")
            return result, pos
    raise ValueError("a size of more than 5 bytes")


def packed_entries(value: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of a packed record; ValueError naming what is
    wrong when it does not decode."""
    if not value or value[0] != _PACKED_VERSION:
        raise ValueError("not a packed record of version 1")
    count, pos = _varint(value, 1)
    if count == 0 or count > (len(value) - pos) // 2:
        raise ValueError(f"a count of {count} entries in {len(value)} bytes")
    entries = []
    for _ in range(count):
        size, pos = _varint(value, pos)
        key = value[pos : pos + size]
        pos += size
        size, pos = _varint(value, pos)
        entry = value[pos : pos + size]
        pos += size
        if pos > len(value):
            raise ValueError("truncated")
        entries.append((key, entry))
    if pos != len(value):
        raise ValueError(f"{len(value) - pos} bytes after the last entry")
    return entries


def entry_count(family: bytes, value: bytes) -> int:
    """How many entries a queue record of ``family`` holds (a malformed
    packed record counts as one: ``percolite check`` reports it)."""
    if family not in PACKED_FAMILIES:
        return 1
    try:
        count, _ = _varint(value, 1)
    except ValueError:
        return 1
    return count if value[:1] == bytes([_PACKED_VERSION]) and count > 0 else 1


def queue_depth(tx: Any, entry_row_prefix: bytes) -> int:
    """Entries queued under ``entry_row_prefix`` in ``tx``'s view (a scan)."""
    return sum(
        entry_count(column[0], value) for _, column, value in tx.scan(prefix=entry_row_prefix)
    )
