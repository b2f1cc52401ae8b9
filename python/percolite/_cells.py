"""Columns and cells: the names of the data model."""

# No "from __future__ import annotations" here: the records' field
# annotations stay real types, which documentation tools and
# typing.get_type_hints resolve without the module's namespace.
from typing import Any, Generic, NamedTuple, Self, TypeVar

BytesLike = bytes | str

__all__ = ["Column", "Cell", "Change", "SequencedExport", "as_bytes", "column_of"]

K = TypeVar("K")
V = TypeVar("V")


def as_bytes(value: object, what: str) -> bytes:
    """``value`` as bytes: bytes pass through, str means UTF-8."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or str, not {type(value).__name__}")


class Column(tuple):
    """A column: ``(family, qualifier)``, both bytes.

    ``Column("doc", "content")`` and the plain tuple ``("doc", "content")``
    are interchangeable wherever percolite takes a column; ``str`` parts mean
    UTF-8. The family must not be empty; the qualifier may be.
    """

    __slots__ = ()

    def __new__(cls, family: BytesLike, qualifier: BytesLike = b"") -> Self:
        fam = as_bytes(family, "column family")
        if not fam:
            raise ValueError("column family must not be empty")
        return tuple.__new__(cls, (fam, as_bytes(qualifier, "column qualifier")))

    @property
    def family(self) -> bytes:
        """The column family (``self[0]``), as bytes."""
        return self[0]

    @property
    def qualifier(self) -> bytes:
        """The column qualifier (``self[1]``), as bytes; may be empty."""
        return self[1]

    def __repr__(self) -> str:
        return f"Column({self[0]!r}, {self[1]!r})"

    def __getnewargs__(self) -> tuple[bytes, bytes]:  # pickling
        return tuple(self)


def column_of(family: bytes, qualifier: bytes) -> Column:
    """The :class:`Column` of a family and qualifier the core gave back (bytes
    it has checked already): made without :class:`Column`'s checks, for the
    paths that make one per cell read or per observer run."""
    return tuple.__new__(Column, (family, qualifier))


class Cell(NamedTuple):
    """One cell as returned by ``Transaction.scan``."""

    row: bytes
    column: Column
    value: bytes


class Change(NamedTuple, Generic[K, V]):
    """One key's change in a processed batch; ``old``/``new`` are ``None`` when absent."""

    key: K
    old: V | None
    new: V | None


class SequencedExport(NamedTuple):
    """One exported entry. ``value`` is ``None`` when the key was deleted.

    ``seq`` is an int that fits in a signed 64-bit column: the committing
    transaction's commit timestamp shifted left by SEQ_INDEX_BITS bits, plus
    the entry's index in that transaction. For one key, a later commit has a
    larger seq.
    """

    key: Any
    value: Any
    seq: int
