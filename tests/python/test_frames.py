"""pandas DataFrames (the optional extra percolite[pandas]): combine-queue
values decoded by every built-in codec, scans, failures and parked work, on
every backend; and the error that names the extra when pandas is missing."""

from __future__ import annotations

import collections.abc
import json
import subprocess
import sys

import percolite
import pytest
from conftest import COL, as_tuples, open_store
from percolite.codecs import get_codec

pd = pytest.importorskip("pandas")

CONTENT = ("doc", "content")

# For each built-in codec: keys and values it encodes (the keys all distinct;
# no value None, which a combiner's result deletes).
SAMPLES = {
    "str": (["", "a", "b/c", "é☃", "z" * 40], ["", "x", "ü", "line\nbreak", "y" * 100]),
    "bytes": (
        [b"\x00", b"a", b"a\x00", b"\xff\xfe", b"k"],
        [b"", b"\x00", b"v", b"\xff" * 9, b"w"],
    ),
    "int64": ([-(2**63), -1, 0, 1, 2**63 - 1], [2**63 - 1, -(2**63), 0, 42, -7]),
    "float64": ([-1.5, 0.0, 2.25, 1e300, float("inf")], [0.5, -0.0, 1e-300, -float("inf"), 3.0]),
    "int64s:2": ([(0, 0), (-1, 5), (2**63 - 1, -(2**63)), (7, 7), (1, 2)], [(1, 2)] * 5),
    "int64s:3": ([(0, 0, 1), (9, 8, 7)], [(-(2**63), 0, 2**63 - 1), (3, 2, 1)]),
    "json": (
        ["k", [1, "two"], {"a": [None, True]}, 3, None],
        [{"n": 1, "tags": ["x", "y"]}, [1, 2.5, None], "text", 0, {"nested": {"deep": [False]}}],
    ),
    "pickle": (
        ["p", (1, "tuple"), 2, frozenset({3}), b"raw"],
        [{"set": {1, 2}}, (1, 2), 1 + 2j, ["list", b"bytes"], 0.5],
    ),
}


def last(key, values):
    """A combiner for any codec: the last update wins."""
    return values[-1]


def test_every_built_in_codec_has_a_sample():
    names = {"str", "bytes", "int64", "float64", "json", "pickle"}
    assert names <= set(SAMPLES) and any(name.startswith("int64s:") for name in SAMPLES)


@pytest.mark.parametrize("codec", sorted(SAMPLES))
def test_combine_queue_values_round_trip_through_every_codec(backend, tmp_path, codec):
    """Keys and values of each built-in codec, folded by the workers, come
    back in the frame as they were folded, in scan order."""
    keys, values = SAMPLES[codec]
    values = (values * len(keys))[: len(keys)]
    app = percolite.App("frames")
    cq = app.combine_queue("q", buckets=4, combiner=last, key_codec=codec, value_codec=codec)
    with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
        with env.transaction() as tx:
            cq.add(tx, [(key, values[0]) for key in keys])  # folded over below
        with env.transaction() as tx:
            cq.add(tx, list(zip(keys, values, strict=True)))
        assert env.process(2)["failures"] == 0
        with env.transaction() as tx:
            frame = cq.to_pandas(tx)
            scanned = list(cq.scan(tx))
    encode = get_codec(codec).encode
    expected = sorted(zip(keys, values, strict=True), key=lambda pair: encode(pair[0]))
    assert list(frame.columns) == ["key", "value"]
    assert frame["key"].tolist() == [k for k, _ in expected]
    assert frame["value"].tolist() == [v for _, v in expected]
    assert list(zip(frame["key"].tolist(), frame["value"].tolist(), strict=True)) == scanned
    for column in ("key", "value"):
        kinds = {type(x) for x in frame[column].tolist()}
        assert kinds == {type(x) for x in (keys if column == "key" else values)}


def test_numeric_codecs_make_numeric_columns(tmp_path):
    app = percolite.App("frames")
    ints = app.combine_queue("ints")  # str keys, int64 values, native sum
    floats = app.combine_queue("floats", key_codec="int64", value_codec="float64")
    never_added = app.combine_queue("empty")
    with percolite.open(":memory:", app=app) as env:
        with env.transaction() as tx:
            ints.add(tx, {"a": 1, "b": 2})
            floats.add(tx, {1: 0.5, 2: 1.5})
        with env.transaction() as tx:
            ints.add(tx, {"a": 10})
            floats.add(tx, {1: 0.25})
        env.process(2)
        with env.transaction() as tx:
            summed = ints.to_pandas(tx)
            halves = floats.to_pandas(tx)
            only_b = ints.to_pandas(tx, prefix="b")
            empty = never_added.to_pandas(tx)
    assert summed["value"].dtype == "int64" and summed["value"].tolist() == [11, 2]
    assert summed["key"].tolist() == ["a", "b"]
    assert halves["key"].dtype == "int64" and halves["value"].dtype == "float64"
    assert halves.to_dict("list") == {"key": [1, 2], "value": [0.75, 1.5]}
    assert only_b.to_dict("list") == {"key": ["b"], "value": [2]}
    assert list(empty.columns) == ["key", "value"] and len(empty) == 0
    assert empty["value"].dtype == "int64"


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
    rows = zip(frame["row"], frame["family"], frame["qualifier"], frame["value"], strict=True)
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


def failing_app() -> tuple[percolite.App, percolite.CombineQueue]:
    app = percolite.App("frames")

    @app.observer(CONTENT, name="index", max_attempts=2)
    def index(tx, row, column):
        raise ValueError(f"bad {row.decode()}")

    def poisoned(key, values):
        if key == "poison":
            raise RuntimeError("no folding this")
        return sum(values)

    cq = app.combine_queue("counts", combiner=poisoned, max_attempts=1)
    return app, cq


def park_work(env: percolite.Env, cq: percolite.CombineQueue) -> None:
    with env.transaction() as tx:
        tx.set("r1", CONTENT, "x")
        tx.set("r2", CONTENT, "y")
        cq.add(tx, {"poison": 1, "fine": 2})
    env.start_workers(2, retry_initial=0.005, retry_max=0.02)
    try:
        with pytest.raises(percolite.WorkParked):
            env.wait(timeout=60)
    finally:
        env.stop_workers()


def test_failures_and_parked_work_become_frames(backend, tmp_path):
    app, cq = failing_app()
    with open_store(backend, tmp_path / "db", app=app, sync="none") as env:
        assert env.failures() == {} and env.parked() == []
        park_work(env, cq)
        failures = env.failures()
        parked = env.parked()
    # Still a dict and a list to everyone who had them.
    assert isinstance(failures, dict) and isinstance(failures, percolite.Failures)
    assert isinstance(parked, list) and isinstance(parked, percolite.ParkedWork)
    assert failures == dict(failures) and parked == list(parked)
    json.dumps([dict(failures), list(parked)], default=repr)

    frame = failures.to_pandas()
    assert sorted(frame["observer"]) == ["combine queue counts", "index"]
    (index,) = frame[frame["observer"] == "index"].to_dict("records")
    history = failures["index"]
    assert index["failures"] == history["failures"] == 4  # 2 attempts of 2 rows
    assert index["parked"] == 2
    assert index["last_cell_family"] == b"doc" and index["last_cell_row"] in (b"r1", b"r2")
    assert index["last_error_type"] == "ValueError"
    assert index["last_error_message"].startswith("bad r")
    assert "raise ValueError" in index["last_error_traceback"]
    for when in ("first_failure", "last_failure"):
        assert str(frame[when].dtype) == "datetime64[ns, UTC]"
        assert isinstance(index[when], pd.Timestamp)
        assert abs(index[when].timestamp() - history[f"{when}_unix"]) < 1e-5

    rows = parked.to_pandas()
    assert len(rows) == len(parked) == 3
    assert list(rows.columns[:3]) == ["observer", "queue", "key"]
    by_observer = rows.sort_values(["observer", "row"]).to_dict("records")
    queued, first, second = by_observer
    assert queued["observer"] == "combine queue counts" and queued["queue"] == "counts"
    assert queued["key"] == "poison" and queued["error_type"] == "RuntimeError"
    assert queued["attempts"] == 1
    assert [first["row"], second["row"]] == [b"r1", b"r2"]
    assert first["key"] is None and pd.isna(first["queue"])
    assert (first["family"], first["qualifier"]) == (b"doc", b"content")
    assert first["attempts"] == 2 and bool(first["parked"]) is True
    assert first["error_message"] == "bad r1"
    assert str(rows["last_failure"].dtype) == "datetime64[ns, UTC]"
    assert (rows["first_failure"] <= rows["last_failure"]).all()


def test_no_failures_make_empty_frames_with_the_columns():
    with percolite.open(":memory:") as env:
        failures, parked = env.failures().to_pandas(), env.parked().to_pandas()
    assert len(failures) == 0 and len(parked) == 0
    assert list(failures.columns) == [
        "observer",
        "failures",
        "parked",
        "first_failure",
        "last_failure",
        "last_cell_row",
        "last_cell_family",
        "last_cell_qualifier",
        "last_error_type",
        "last_error_message",
        "last_error_traceback",
    ]
    assert list(parked.columns)[:6] == ["observer", "queue", "key", "row", "family", "qualifier"]
    assert str(parked["last_failure"].dtype) == "datetime64[ns, UTC]"


# -- without pandas --------------------------------------------------------------


@pytest.fixture
def no_pandas(monkeypatch):
    """pandas made unimportable, as in an install without the extra."""
    monkeypatch.setitem(sys.modules, "pandas", None)


def test_without_pandas_every_conversion_names_the_extra(no_pandas):
    app = percolite.App("frames")
    cq = app.combine_queue("q")
    with percolite.open(":memory:", app=app) as env:
        with env.transaction() as tx:
            tx.set("r", COL, "v")
            cq.add(tx, {"k": 1})
        env.process(1)
        with env.transaction() as tx:
            scan = tx.scan()
            conversions = [
                scan.to_pandas,
                lambda: cq.to_pandas(tx),
                env.failures().to_pandas,
                env.parked().to_pandas,
            ]
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
