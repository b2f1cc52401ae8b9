"""The fast read paths: ``Transaction.get`` reads a local store without
releasing the GIL and without copying the value, and ``Transaction.scan``
gets its cells made in C++ a chunk at a time. Both must read exactly what
the general paths read: the snapshot, the transaction's own writes and
deletes, the columns asked for, no system rows, and the same errors."""

from __future__ import annotations

import inspect
import pickle
import random
import threading

import percolite
import pytest
from conftest import COL, as_tuples
from percolite import _core, _transaction
from percolite._cells import Cell, Column

CHUNK = _transaction._SCAN_CHUNK
SYSTEM = _core.SYSTEM_ROW_PREFIX
MISSING = object()


def _fill(env, cells):
    with env.transaction() as tx:
        for row, column, value in cells:
            tx.set(row, column, value)


def _random_store(env, seed, rows):
    """A store of random cells (rows, columns and values with zero and 0xFF
    bytes), and a transaction over it with own sets and deletes; returns
    (tx, model of what tx must see)."""
    rng = random.Random(seed)
    parts = [b"", b"\x00", b"\xff", b"a", b"a\x00b", b"\x00\x00", b"z\xff\x00"]
    columns = [(b"f", b""), (b"f", b"q"), (b"f\x00", b"\x00"), (b"g", b"\xff\x00")]

    def row(i):
        return b"r%05d" % i + rng.choice(parts)

    model = {}
    with env.transaction() as tx:
        for i in range(rows):
            for column in rng.sample(columns, rng.randint(1, len(columns))):
                key = (row(i), column)
                model[key] = rng.choice(parts) + b"v%d" % i
                tx.set(key[0], column, model[key])
    tx = env.transaction()
    keys = sorted(model)
    for key in rng.sample(keys, len(keys) // 5):
        tx.delete(key[0], key[1])
        del model[key]
    for i in range(rows // 4):
        key = (row(rng.randrange(rows)), rng.choice(columns))
        model[key] = b"own%d" % i
        tx.set(key[0], key[1], model[key])
    return tx, model


def _expected(model, prefix=None, start=None, end=None, columns=None):
    return [
        (row, column, value)
        for (row, column), value in sorted(model.items())
        if (prefix is None or row.startswith(prefix))
        and (start is None or row >= start)
        and (end is None or row < end)
        and (columns is None or column in columns)
    ]


# -- get ------------------------------------------------------------------


def test_get_sees_snapshot_own_sets_and_own_deletes(env):
    _fill(env, [(b"a", COL, b"1"), (b"b", COL, b"2"), (b"c", COL, b"")])
    with env.transaction() as tx:
        tx.set(b"b", COL, b"own")
        tx.delete(b"c", COL)
        tx.set(b"d", COL, b"new")
        assert tx.get(b"a", COL) == b"1"
        assert tx.get(b"b", COL) == b"own"
        assert tx.get(b"c", COL) is None
        assert tx.get(b"d", COL) == b"new"
        assert tx.get(b"e", COL) is None


def test_get_returns_the_default_object_itself(env):
    _fill(env, [(b"a", COL, b"")])
    with env.transaction() as tx:
        tx.delete(b"gone", COL)
        assert tx.get(b"missing", COL, MISSING) is MISSING
        assert tx.get(b"gone", COL, MISSING) is MISSING
        assert tx.get(b"a", COL, MISSING) == b""  # an empty value is a value
        assert tx.get(b"missing", COL, default=7) == 7


def test_get_reads_a_snapshot_not_later_commits(env):
    _fill(env, [(b"a", COL, b"old")])
    with env.transaction() as reader:
        assert reader.get(b"a", COL) == b"old"
        _fill(env, [(b"a", COL, b"new"), (b"b", COL, b"new")])
        assert reader.get(b"a", COL) == b"old"
        assert reader.get(b"b", COL) is None


def test_get_takes_str_bytearray_memoryview_and_column(env):
    _fill(env, [("räd", ("fam", "qual"), b"x")])
    with env.transaction() as tx:
        assert tx.get("räd", ("fam", "qual")) == b"x"
        assert tx.get("räd".encode(), Column("fam", "qual")) == b"x"
        assert tx.get(bytearray("räd".encode()), (b"fam", memoryview(b"qual"))) == b"x"


def test_get_matches_get_many_on_random_stores(env):
    tx, model = _random_store(env, seed=3, rows=300)
    try:
        keys = list(model) + [(b"absent", COL), (b"r00001", (b"nope", b""))]
        random.Random(4).shuffle(keys)
        singles = [tx.get(row, column) for row, column in keys]
        assert singles == tx.get_many(keys)
        assert singles == [model.get(key) for key in keys]
    finally:
        tx.abort()


@pytest.mark.parametrize(
    ("row", "column", "error", "message"),
    [
        (1, COL, TypeError, "row must be bytes or str, not int"),
        (None, COL, TypeError, "row must be bytes or str, not NoneType"),
        (b"r", "f", TypeError, "column must be a (family, qualifier) tuple"),
        (b"r", (b"f",), TypeError, "a tuple of 1 items"),
        (b"r", (b"f", b"q", b"x"), TypeError, "a tuple of 3 items"),
        (b"r", (1, b"q"), TypeError, "column family must be bytes or str, not int"),
        (b"r", (b"f", 2.5), TypeError, "column qualifier must be bytes or str, not float"),
        (b"", COL, ValueError, "row"),
        (b"r", (b"", b"q"), ValueError, "family"),
        ("\ud800", COL, UnicodeEncodeError, "surrogates"),
    ],
)
def test_get_rejects_bad_input_as_before(env, row, column, error, message):
    with env.transaction() as tx:
        with pytest.raises(error, match=None) as raised:
            tx.get(row, column)
        assert message in str(raised.value)
        with pytest.raises(error):
            tx.get_many([(row, column)])


def test_core_get_takes_two_or_three_arguments(env):
    with env.transaction() as tx:
        with pytest.raises(TypeError, match="get\\(\\) takes row, column"):
            tx.core.get(b"r")
        with pytest.raises(TypeError, match="get\\(\\) takes row, column"):
            tx.core.get(b"r", COL, None, None)


def test_the_transaction_class_holds_the_core_get_itself(env):
    """Transaction.get is the core's method bound to the user's class (no
    Python frame in between): it still reads like a method, says what it
    takes, works on subclasses and refuses other objects."""
    assert list(inspect.signature(percolite.Transaction.get).parameters) == [
        "self",
        "row",
        "column",
        "default",
    ]
    assert "default" in percolite.Transaction.get.__doc__

    class Mine(percolite.Transaction):
        __slots__ = ("extra",)

    with env.transaction() as tx:
        tx.set(b"r", COL, b"v")
        mine = Mine(tx.core)
        assert mine.get(b"r", COL) == b"v"
        assert mine.get(b"s", COL, 7) == 7
        assert percolite.Transaction.get(tx, b"r", COL) == b"v"
        with pytest.raises(TypeError, match="'get' for 'Transaction' objects"):
            percolite.Transaction.get(object(), b"r", COL)
        with pytest.raises(TypeError, match="get\\(\\) takes row, column"):
            tx.get(b"r")
        assert tx.get(row=b"r", column=COL) == b"v"
        assert tx.get(b"s", column=COL, default=3) == 3
        with pytest.raises(TypeError, match="unexpected keyword argument 'colum'"):
            tx.get(b"r", colum=COL)
        with pytest.raises(TypeError, match="multiple values for argument 'row'"):
            tx.get(b"r", COL, row=b"r")
        with pytest.raises(TypeError, match="get\\(\\) takes row, column"):
            tx.get(b"r", default=1)
    with pytest.raises(AttributeError, match="holds no core transaction"):
        percolite.Transaction.__new__(percolite.Transaction).get(b"r", COL)


@pytest.mark.parametrize(
    ("cls", "slot", "error", "message"),
    [
        (42, "_tx", TypeError, "takes a class"),
        (type("NoSlots", (), {}), "_tx", TypeError, "_tx is not an object slot"),
        (type("OtherSlot", (), {"__slots__": ("a", "_tx")}), "_tx", ValueError, "another slot"),
    ],
)
def test_binding_get_checks_the_class_and_slot(cls, slot, error, message):
    with pytest.raises(error, match=message):
        _core.bind_surface_get(cls, slot)


def test_get_after_the_end_raises(env):
    tx = env.transaction()
    tx.abort()
    with pytest.raises(percolite.errors.Error):
        tx.get(b"a", COL)


def test_get_from_several_threads_at_once(env):
    """Gets and sets from several threads on one transaction: some gets find
    the transaction busy and wait for it (with the GIL released)."""
    _fill(env, [(b"r%03d" % i, COL, b"v%d" % i) for i in range(200)])
    tx = env.transaction()
    errors = []

    def reader(seed):
        try:
            rng = random.Random(seed)
            for _ in range(3000):
                i = rng.randrange(200)
                value = tx.get(b"r%03d" % i, COL)
                if value not in (b"v%d" % i, b"w%d" % i):
                    errors.append((i, value))
        except Exception as exc:  # reported below
            errors.append(exc)

    def writer():
        try:
            for i in range(200):
                tx.set(b"r%03d" % i, COL, b"w%d" % i)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(s,), daemon=True) for s in range(3)]
    threads.append(threading.Thread(target=writer, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a thread is stuck"
    assert errors == []
    assert [tx.get(b"r%03d" % i, COL) for i in range(200)] == [b"w%d" % i for i in range(200)]
    tx.abort()


# -- scan -----------------------------------------------------------------


def test_scan_cells_are_cells_of_columns(env):
    _fill(env, [(b"a", COL, b"1"), (b"a", (b"g", b""), b"2"), (b"b", COL, b"3")])
    with env.transaction() as tx:
        cells = list(tx.scan())
    assert [type(cell) for cell in cells] == [Cell] * 3
    assert [type(cell.column) for cell in cells] == [Column] * 3
    assert cells[0] == Cell(b"a", Column(b"f", b"q"), b"1")
    assert cells[0].row == b"a" and cells[0].column.family == b"f"
    assert cells[0].column.qualifier == b"q" and cells[0].value == b"1"
    assert repr(cells[1]) == "Cell(row=b'a', column=Column(b'g', b''), value=b'2')"
    assert pickle.loads(pickle.dumps(cells)) == cells
    assert hash(cells[2]) == hash((b"b", (b"f", b"q"), b"3"))
    assert cells[0].column is not cells[1].column  # a new column, a new object


@pytest.mark.parametrize("seed", [1, 2])
def test_scan_equals_a_model_of_snapshot_and_own_writes(env, seed):
    tx, model = _random_store(env, seed, rows=CHUNK // 2 + 40)
    try:
        assert as_tuples(tx.scan()) == _expected(model)
        for prefix in (b"r0000", b"r00012", b"r0001\x00", b"r", b"zzz"):
            assert as_tuples(tx.scan(prefix)) == _expected(model, prefix=prefix)
        for start, end in ((b"r00010", b"r00200"), (None, b"r00003"), (b"r00250", None)):
            assert as_tuples(tx.scan(start=start, end=end)) == _expected(
                model, start=start, end=end
            )
        wanted = [(b"f\x00", b"\x00"), (b"g", b"\xff\x00")]
        assert as_tuples(tx.scan(columns=wanted)) == _expected(model, columns=wanted)
        assert as_tuples(tx.scan(b"r0001", columns=[Column(b"f", b"")])) == _expected(
            model, prefix=b"r0001", columns=[(b"f", b"")]
        )
    finally:
        tx.abort()


def test_scan_with_a_sparse_column_filter_across_chunks(env):
    _fill(
        env,
        [
            (b"r%05d" % i, (b"f", b"x") if i % 700 == 0 else COL, b"%d" % i)
            for i in range(3 * CHUNK)
        ],
    )
    with env.transaction() as tx:
        found = as_tuples(tx.scan(columns=[(b"f", b"x")]))
    assert found == [(b"r%05d" % i, (b"f", b"x"), b"%d" % i) for i in range(0, 3 * CHUNK, 700)]


def test_scan_empty_results(env):
    with env.transaction() as tx:
        assert list(tx.scan()) == []
        tx.set(b"a", COL, b"1")
        tx.delete(b"a", COL)
        assert list(tx.scan()) == []
        assert list(tx.scan(b"nothing")) == []
        assert list(tx.scan(start=b"b", end=b"a")) == []
        assert list(tx.scan(columns=[])) == []


def test_scan_leaves_out_system_rows_unless_asked(env):
    _fill(env, [(b"a", COL, b"1"), (SYSTEM + b"x", COL, b"s"), (b"\xff", COL, b"2")])
    with env.transaction() as tx:
        assert [c.row for c in tx.scan()] == [b"a", b"\xff"]
        assert [c.row for c in tx.scan(SYSTEM)] == [SYSTEM + b"x"]


def test_scan_stopped_early_then_read_on(env):
    _fill(env, [(b"r%05d" % i, COL, b"%d" % i) for i in range(2 * CHUNK + 3)])
    with env.transaction() as tx:
        scan = tx.scan()
        first = [next(scan) for _ in range(CHUNK + 1)]
        scan.close()
        assert [c.row for c in first] == [b"r%05d" % i for i in range(CHUNK + 1)]
        assert sum(1 for _ in tx.scan()) == 2 * CHUNK + 3


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"prefix": 5}, TypeError),
        ({"start": 5}, TypeError),
        ({"columns": [(b"f",)]}, TypeError),
        ({"columns": b"fq"}, TypeError),
        ({"prefix": b"a", "start": b"a"}, ValueError),
    ],
)
def test_scan_rejects_bad_input(env, kwargs, error):
    _fill(env, [(b"a", COL, b"1")])
    with env.transaction() as tx:
        with pytest.raises(error):
            list(tx.scan(**kwargs))


def test_core_scan_cells_checks_its_cell_types(env):
    with env.transaction() as tx:
        for bad in (dict, list, int):
            with pytest.raises(TypeError, match="cell_type must be a tuple subclass"):
                tx.core.scan_cells(None, None, None, None, None, 10, bad, tuple)
        cells, _, done = tx.core.scan_cells(None, None, None, None, None, 10, tuple, tuple)
        assert cells == [] and done
