"""pandas DataFrames of what percolite returns: the optional extra
``percolite[pandas]``.

pandas is imported only when a conversion is asked for, so ``import
percolite`` never needs it; without it, ``to_pandas`` raises ImportError
saying what to install. The conversions:

* :meth:`Scan.to_pandas`: the cells of ``tx.scan(...)``, columns ``row``,
  ``family``, ``qualifier``, ``value`` (bytes);
* :meth:`percolite.CombineQueue.to_pandas`: a queue's current values,
  columns ``key``, ``value``, decoded by the queue's codecs
  (:func:`key_value_frame`);
* :meth:`Failures.to_pandas` (``env.failures()``): one row per observer;
* :meth:`ParkedWork.to_pandas` (``env.parked()``): one row per parked item.

Nested dicts of the records become columns ``<outer>_<inner>``
(``last_error_type``), and times (``*_unix``, seconds) become UTC
``pandas.Timestamp`` columns without the suffix (``last_failure``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ._cells import Cell
from .codecs import Codec, native_layout

if TYPE_CHECKING:
    import pandas

__all__ = ["Failures", "ParkedWork", "Scan", "INSTALL_HINT", "import_pandas", "key_value_frame"]

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


# A record's columns: name -> kind. "time" columns come from "<name>_unix"
# seconds; nested dicts are flattened into "<outer>_<inner>" first.
_FAILURE_COLUMNS = {
    "observer": "text",
    "failures": "int",
    "parked": "int",
    "first_failure": "time",
    "last_failure": "time",
    "last_cell_row": "bytes",
    "last_cell_family": "bytes",
    "last_cell_qualifier": "bytes",
    "last_error_type": "text",
    "last_error_message": "text",
    "last_error_traceback": "text",
}
_PARKED_COLUMNS = {
    "observer": "text",
    "queue": "text",
    "key": "any",
    "row": "bytes",
    "family": "bytes",
    "qualifier": "bytes",
    "attempts": "int",
    "parked": "bool",
    "sink": "text",
    "first_failure": "time",
    "last_failure": "time",
    "error_type": "text",
    "error_message": "text",
    "error_traceback": "text",
}
_DTYPES = {"int": "int64", "bool": "bool", "text": None, "bytes": object, "any": object}


def _flatten(record: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in record.items():
        if isinstance(value, dict):
            for inner, item in value.items():
                flat[f"{name}_{inner}"] = item
        elif name.endswith("_unix"):
            flat[name[: -len("_unix")]] = value
        else:
            flat[name] = value
    return flat


def _records_frame(records: list[dict[str, Any]], columns: dict[str, str]) -> pandas.DataFrame:
    """One row per record, ``columns`` first (in order, typed by kind),
    then any other field the records have, in the order first met."""
    pd = import_pandas()
    flat = [_flatten(r) for r in records]
    names = dict.fromkeys(columns)
    for record in flat:
        names.update(dict.fromkeys(record))
    data = {}
    for name in names:
        kind = columns.get(name, "any")
        values = [record.get(name) for record in flat]
        if kind == "time":
            # Whole microseconds (what a float of seconds since 1970 holds
            # exactly); None: NaN, then NaT.
            micros = (pd.Series(values, dtype="float64") * 1e6).round()
            data[name] = pd.to_datetime(micros, unit="us", utc=True).astype("datetime64[ns, UTC]")
        elif kind in ("int", "bool") and any(v is None for v in values):
            data[name] = pd.Series(values, dtype=object)
        else:
            data[name] = _series(pd, values, _DTYPES[kind])
    return pd.DataFrame(data, columns=list(names))


class Failures(dict[str, dict[str, Any]]):
    """What :meth:`percolite.Env.failures` returns: a dict (equal to the
    plain dict of the same items) of each observer's failure history by
    observer name, which :meth:`to_pandas` turns into a DataFrame."""

    __slots__ = ()

    def to_pandas(self) -> pandas.DataFrame:
        """One row per observer: ``observer``, ``failures``, ``parked``,
        ``first_failure`` and ``last_failure`` (UTC ``pandas.Timestamp``),
        ``last_cell_row``, ``last_cell_family``, ``last_cell_qualifier``
        (bytes), ``last_error_type``, ``last_error_message``,
        ``last_error_traceback``. Needs pandas (``pip install
        'percolite[pandas]'``)."""
        return _records_frame(
            [{"observer": name, **history} for name, history in self.items()], _FAILURE_COLUMNS
        )


class ParkedWork(list[dict[str, Any]]):
    """What :meth:`percolite.Env.parked` returns: a list (equal to the
    plain list of the same records) of the parked work, which
    :meth:`to_pandas` turns into a DataFrame."""

    __slots__ = ()

    def to_pandas(self) -> pandas.DataFrame:
        """One row per parked notification or queue key: ``observer``,
        ``queue``, ``key``, ``row``, ``family``, ``qualifier``,
        ``attempts``, ``parked``, ``sink``, ``first_failure`` and
        ``last_failure`` (UTC ``pandas.Timestamp``), ``error_type``,
        ``error_message``, ``error_traceback``. Needs pandas (``pip install
        'percolite[pandas]'``)."""
        return _records_frame(list(self), _PARKED_COLUMNS)
