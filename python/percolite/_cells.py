"""Columns and cells: the names of the data model."""

from __future__ import annotations

from typing import NamedTuple, Union

BytesLike = Union[bytes, str]

__all__ = ["Column", "Cell", "as_bytes"]


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

    def __new__(cls, family: BytesLike, qualifier: BytesLike = b"") -> Column:
        fam = as_bytes(family, "column family")
        if not fam:
            raise ValueError("column family must not be empty")
        return tuple.__new__(cls, (fam, as_bytes(qualifier, "column qualifier")))

    @classmethod
    def _from_bytes(cls, family: bytes, qualifier: bytes) -> Column:
        return tuple.__new__(cls, (family, qualifier))

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


class Cell(NamedTuple):
    """One cell as returned by ``Transaction.scan``."""

    row: bytes
    column: Column
    value: bytes
