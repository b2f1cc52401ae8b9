"""pandas DataFrames of what percolite returns: the optional extra
``percolite[pandas]``.

pandas is imported only when a conversion is asked for, so ``import
percolite`` never needs it; without it, ``to_pandas`` raises ImportError
saying what to install. The conversions:

* :meth:`Scan.to_pandas`: the cells of ``tx.scan(...)``, columns ``row``,
  ``family``, ``qualifier``, ``value`` (bytes);
* :meth:`percolite.CombineQueue.to_pandas`: a queue's current values,
  columns ``key``, ``value``, decoded by the queue's codecs
  (:func:`key_value_frame`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ._cells import Cell
from .codecs import Codec, native_layout

if TYPE_CHECKING:
    import pandas

__all__ = ["Scan", "INSTALL_HINT", "import_pandas", "key_value_frame"]

INSTALL_HINT = "pip install 'percolite[pandas]'"


def import_pandas() -> Any:
    """The pandas module; ImportError naming the extra to install when it is missing."""
    try:
        import pandas
    except ImportError as e:
        raise ImportError(
            f"to_pandas needs pandas, which is not installed: {INSTALL_HINT} "
            "(or pip install 'pandas>=1.5')",
            name="pandas",
        ) from e
    return pandas


class Scan(Iterator[Cell]):
    """The cells of :meth:`percolite.Transaction.scan`: an iterator of
    :class:`percolite.Cell`, as lazy as before (it reads the snapshot in
    chunks as it is iterated, so stopping early is cheap, and its
    arguments are checked at the first cell), that can also become a
    DataFrame with :meth:`to_pandas`.

    ``for cell in tx.scan(...)`` iterates the underlying generator itself:
    the wrapper costs one object per scan, nothing per cell.
    """

    __slots__ = ("_cells",)

    def __init__(self, cells: Iterator[Cell]) -> None:
        self._cells = cells

    def __iter__(self) -> Iterator[Cell]:
        # The generator itself, so that a for loop runs at generator speed;
        # it shares its position with this object's __next__.
        return self._cells

    def __next__(self) -> Cell:
        return next(self._cells)

    def close(self) -> None:
        """Stop the scan early and release what it holds (as a generator's ``close``)."""
        close = getattr(self._cells, "close", None)
        if close is not None:
            close()

    def to_pandas(self) -> pandas.DataFrame:
        """The cells not yet iterated, as a DataFrame with columns ``row``,
        ``family``, ``qualifier`` and ``value`` (all bytes, as the cells
        have them), one row per cell in scan order. Consumes the scan.
        Needs pandas (``pip install 'percolite[pandas]'``): without it,
        ImportError, and the scan is left as it was."""
        pd = import_pandas()
        rows: list[bytes] = []
        families: list[bytes] = []
        qualifiers: list[bytes] = []
        values: list[bytes] = []
        for row, (family, qualifier), value in self._cells:
            rows.append(row)
            families.append(family)
            qualifiers.append(qualifier)
            values.append(value)
        return pd.DataFrame(
            {
                "row": pd.Series(rows, dtype=object),
                "family": pd.Series(families, dtype=object),
                "qualifier": pd.Series(qualifiers, dtype=object),
                "value": pd.Series(values, dtype=object),
            }
        )

    def __repr__(self) -> str:
        return "<percolite.Scan (iterate it, or call to_pandas())>"


def _series(pd: Any, values: list[Any], dtype: Any) -> Any:
    """``pd.Series(values, dtype=dtype)``; ``dtype`` None lets pandas
    choose, except for no values (object, as pandas 2 does: pandas 1 warns)."""
    return pd.Series(values, dtype=object if dtype is None and not values else dtype)


def _dtype(codec: Codec) -> Any:
    """The dtype of a column of values of ``codec``: int64 and float64 for
    those built-in codecs, pandas' own choice for ``str``, else object
    (bytes, tuples, JSON values, pickled objects, custom codecs' values)."""
    layout = native_layout(codec)
    if layout is None:
        return object
    return {"int64": "int64", "float64": "float64", "str": None}.get(layout[0], object)


def key_value_frame(
    pairs: Iterable[tuple[Any, Any]], key_codec: Codec, value_codec: Codec
) -> pandas.DataFrame:
    """A DataFrame with columns ``key`` and ``value`` of decoded ``pairs``,
    typed after the codecs that decoded them (:func:`_dtype`). pandas is
    imported before ``pairs`` is iterated."""
    pd = import_pandas()
    keys: list[Any] = []
    values: list[Any] = []
    for key, value in pairs:
        keys.append(key)
        values.append(value)
    return pd.DataFrame(
        {
            "key": _series(pd, keys, _dtype(key_codec)),
            "value": _series(pd, values, _dtype(value_codec)),
        }
    )
