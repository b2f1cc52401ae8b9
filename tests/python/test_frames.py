"""pandas DataFrames (the optional extra percolite[pandas]): scans, on
every backend; and the error that names the extra when pandas is missing."""

from __future__ import annotations

import collections.abc
import subprocess
import sys

import percolite
import pytest
from conftest import COL, as_tuples, open_store

pd = pytest.importorskip("pandas")


def test_scan_to_pandas_has_the_cells_of_the_scan(backend, tmp_path):
    with open_store(backend, tmp_path / "db", sync="none") as env:
        with env.transaction() as tx:
            for i in range(1500):  # more than one chunk of the scan
                tx.set(f"r{i:05d}", COL, f"v{i}")
                tx.set(f"r{i:05d}", ("g", ""), b"\x00\xff")
        with env.transaction() as tx:
            expected = as_tuples(tx.scan(prefix="r00"))
            frame = tx.scan(prefix="r00").to_pandas()
            columns_only = tx.scan(start="r00010", end="r00012", columns=[COL]).to_pandas()
            empty = tx.scan(prefix="nothing").to_pandas()
    assert list(frame.columns) == ["row", "family", "qualifier", "value"]
    assert len(frame) == len(expected) == 2000
    rows = zip(frame["row"], frame["family"], frame["qualifier"], frame["value"])
    assert [(r, (f, q), v) for r, f, q, v in rows] == expected
    assert columns_only.to_dict("list") == {
        "row": [b"r00010", b"r00011"],
        "family": [b"f", b"f"],
        "qualifier": [b"q", b"q"],
        "value": [b"v10", b"v11"],
    }
    assert list(empty.columns) == ["row", "family", "qualifier", "value"] and len(empty) == 0


def test_scan_is_still_a_lazy_iterator(tmp_path):
    """The scan is an iterator of Cells as before: next() and for share one
    position, and to_pandas() takes the cells not yet iterated."""
    with percolite.open(":memory:") as env:
        with env.transaction() as tx:
            for row in ("a", "b", "c", "d"):
                tx.set(row, COL, row)
        with env.transaction() as tx:
            scan = tx.scan()
            assert isinstance(scan, percolite.Scan)
            assert isinstance(scan, collections.abc.Iterator)
            first = next(scan)
            assert isinstance(first, percolite.Cell) and first.row == b"a"
            for cell in scan:
                assert cell.row == b"b"
                break
            assert scan.to_pandas()["row"].tolist() == [b"c", b"d"]
            assert list(scan) == [] and scan.to_pandas().empty
            stopped = tx.scan()
            next(stopped)
            stopped.close()
            assert list(stopped) == []
            # As with the generator it wraps, arguments are checked when it runs.
            wrong = tx.scan(prefix="a", start="b")
            with pytest.raises(ValueError, match="either prefix or start/end"):
                next(wrong)


# -- without pandas --------------------------------------------------------------


@pytest.fixture
def no_pandas(monkeypatch):
    """pandas made unimportable, as in an install without the extra."""
    monkeypatch.setitem(sys.modules, "pandas", None)


def test_without_pandas_every_conversion_names_the_extra(no_pandas):
    with percolite.open(":memory:") as env:
        with env.transaction() as tx:
            tx.set("r", COL, "v")
        with env.transaction() as tx:
            scan = tx.scan()
            conversions = [scan.to_pandas]
            for convert in conversions:
                with pytest.raises(ImportError, match=r"pip install 'percolite\[pandas\]'") as e:
                    convert()
                assert e.value.name == "pandas"
            # Nothing was read before the import failed: the scan is whole.
            assert [c.row for c in scan][-1] == b"r"


def test_importing_percolite_does_not_import_pandas():
    code = "import sys, percolite; assert 'pandas' not in sys.modules, 'pandas was imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
