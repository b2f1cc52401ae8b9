"""Sharded counters (docs/sharded_counters.md).

Exact mode: totals stay exact under real threads and processes, increments
commit or abort with their transaction, and more shards mean fewer collisions.
Cached mode (``chance_to_write=p``): the cached total is exact in its handle;
the persisted total never exceeds it, never decreases, and lags it by the
increments since the last persisted one, whose number is geometric with
``P(lag >= k) = (1 - p)**k`` and mean ``(1 - p) / p``; exactly that lag is lost
when the handle or process ends without ``flush``.

Tests with threads or several processes run in child interpreters with a
timeout (``run_child_json``; their code is in children/sharded_counter.py), so
a hang fails one test instead of the suite.
"""

from __future__ import annotations

import math
import random
import struct
import time

import children.sharded_counter
import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from _isolated import finish_child, run_child, run_child_json, start_child
from conftest import committed_cells, open_store

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
SUM, MAX = (b"counter", b"sum"), (b"counter", b"max")


def stored(env, counter):
    """``counter.get`` in a fresh snapshot: for a cached counter, what is persisted."""
    tx = env.transaction()
    try:
        return counter.get(tx)
    finally:
        tx.abort()


# -- exact mode ----------------------------------------------------------------


def test_exact_totals_8_threads_x_500_increments(backend, store_path):
    """Every committed increment counts, every aborted one does not, whatever
    the interleaving: 8 threads, 500 transactions each, one in five of them
    aborted after its add."""
    report = run_child_json(
        children.sharded_counter.exact_totals_threads, backend, timeout=90, path=store_path
    )
    assert report["errors"] == []
    assert report["aborted"] == [100] * 8
    assert report["logs"] == 8 * 400
    expected = sum(400 * (k + 1) for k in range(8))
    assert report["value"] == expected
    values = [struct.unpack(">q", bytes.fromhex(v))[0] for _, v in report["shards"]]
    assert sum(values) == expected
    assert 1 < len(values) <= 16  # spread over the shards, and only those
    assert all(row.startswith("counter:hits:") for row, _ in report["shards"])


def test_exact_totals_two_processes(store_path, tmp_path):
    """lmdb only: two processes share one store."""
    percolite.open(store_path, sync="none").close()  # create it before the race
    go_file = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [
        start_child(children.sharded_counter.process_incrementer, store_path, r, go_file, amount)
        for r, amount in zip(ready, (1, 3), strict=True)
    ]
    deadline = time.monotonic() + 30
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break  # a child died early: finish_child reports it
        time.sleep(0.005)
    go_file.touch()
    for p in procs:
        finish_child(p, timeout=60)
    with percolite.open(store_path, sync="none") as env:
        assert percolite.ShardedCounter("hits").value(env) == 500 * 1 + 500 * 3


def test_more_shards_collide_less(backend, store_path):
    """Same load, counted conflicts. Each round, 8 threads begin a transaction
    and add, wait for each other, then all commit: every pair of them overlaps.
    With 1 shard all but one must conflict; with 16 shards only those that
    picked a shard already taken, 8 - E[distinct shards] = 1.55 per round on
    average. Second load: env.run with no backoff, 8 threads x 200 increments,
    each transaction sleeping 0.2 ms after its add so that transactions
    overlap as they would doing real work (a bare add commits in about 10 us
    when no other commit is in progress, so how often bare adds overlap is up
    to the scheduler). With backoff, a single hot cell throttles itself: fewer
    conflicts, but increments wait; see docs/sharded_counters.md."""
    report = run_child_json(
        children.sharded_counter.shard_collisions, backend, timeout=90, path=store_path
    )
    rounds, retries = report["rounds"], report["retries"]
    assert rounds["1"] == 40 * 7  # exactly one winner per round
    # Expected 62 (sd about 7); far below 280.
    assert rounds["16"] < 120, rounds
    assert retries["16"] * 3 < retries["1"], retries


def test_add_commits_or_aborts_with_its_transaction(env):
    hits = percolite.ShardedCounter("hits", 4)
    tx = env.transaction()
    hits.add(tx, 5)
    hits.add(tx, 2)
    assert hits.get(tx) == 7  # the transaction sees its own adds
    assert hits.value(env) == 0  # nobody else does before commit
    tx.abort()
    assert hits.value(env) == 0
    assert committed_cells(env) == []

    def fails(tx):
        hits.add(tx)
        raise KeyError("no")

    with pytest.raises(KeyError):
        env.run(fails)
    assert hits.value(env) == 0

    with env.transaction() as tx:
        hits.add(tx, 5)
        hits.add(tx, -2)
    assert hits.value(env) == 3
    assert hits.increment(env, 4) is None
    assert hits.value(env) == 7


def test_layout_and_changing_the_shard_count(env):
    """Documented layout; ``get`` sums every shard of the name present, so a
    counter reopened with another shard count keeps its total."""
    few = percolite.ShardedCounter("hits", 2, rng=random.Random(1))
    for _ in range(20):
        few.increment(env)
    cells = committed_cells(env)
    assert {row for row, _, _ in cells} == {b"counter:hits:0000", b"counter:hits:0001"}
    assert all(column == SUM for _, column, _ in cells)
    assert sum(struct.unpack(">q", value)[0] for _, _, value in cells) == 20

    many = percolite.ShardedCounter("hits", 65536, rng=random.Random(2))
    for _ in range(30):
        many.increment(env, 2)
    assert many.value(env) == few.value(env) == 80
    rows = {row for row, _, _ in committed_cells(env)}
    assert len(rows) > 20
    assert all(len(row) == len(b"counter:hits:ffff") for row in rows)
    # Other counters, whose names extend this one, are not summed.
    percolite.ShardedCounter("hits2", 1).increment(env, 1000)
    with env.transaction() as tx:
        tx.set("counter:hits:zz", ("other", "cell"), b"not a shard")
    assert few.value(env) == 80


def test_zero_writes_nothing_and_negative_amounts_count(env):
    gauge = percolite.ShardedCounter("gauge", 1)
    gauge.increment(env, 0)
    assert committed_cells(env) == []
    gauge.increment(env, 10)
    gauge.increment(env, -25)
    assert gauge.value(env) == -15


def test_shard_overflow_raises_and_writes_nothing(env):
    big = percolite.ShardedCounter("big", 1)
    big.increment(env, INT64_MAX)
    before = committed_cells(env)
    with pytest.raises(ValueError, match=r"sharded counter 'big': adding 1 overflows shard"):
        big.increment(env, 1)
    assert committed_cells(env) == before
    big.increment(env, INT64_MIN)
    assert big.value(env) == -1
    # Shards are int64 each; the total is a Python int and may exceed int64.
    two = percolite.ShardedCounter("two", 2, rng=random.Random(0))
    with env.transaction() as tx:
        for shard in range(2):
            tx.set(f"counter:two:{shard:04x}", SUM, struct.pack(">q", INT64_MAX))
    assert two.value(env) == 2 * INT64_MAX


# -- cached mode ------------------------------------------------------------------


def test_cached_lag_follows_the_documented_distribution(env):
    """1000 counters x 80 increments, p = 0.1. For each, the lag (cached total
    minus persisted total, amount 1) must be geometric: mean (1-p)/p = 9,
    P(lag >= k) = 0.9**k. Bounds are 5 standard errors (seeded, so the run is
    reproducible; any seed passes with overwhelming probability)."""
    p, n_counters, n = 0.1, 1000, 80
    rng = random.Random(20090422)
    lags = []
    for i in range(n_counters):
        counter = percolite.ShardedCounter(f"c{i}", 16, chance_to_write=p, rng=rng)
        for expected_total in range(1, n + 1):
            assert counter.increment(env) == expected_total
        assert counter.value(env) == n
        lags.append(n - stored(env, counter))
    assert min(lags) >= 0
    mean = sum(lags) / n_counters
    expected_mean = (1 - p) / p * (1 - (1 - p) ** n)  # the lag cannot exceed n
    sd = math.sqrt(1 - p) / p / math.sqrt(n_counters)
    assert abs(mean - expected_mean) < 5 * sd, (mean, expected_mean)
    for k in (1, 5, 10, 20, 40):
        tail = (1 - p) ** k
        share = sum(lag >= k for lag in lags) / n_counters
        assert abs(share - tail) < 5 * math.sqrt(tail * (1 - tail) / n_counters), (k, share, tail)


def test_cached_persisted_total_only_grows_and_never_exceeds_the_cache(env):
    counter = percolite.ShardedCounter("hits", 4, chance_to_write=0.2, rng=random.Random(7))
    last_stored = 0
    changes = 0
    for i in range(1, 301):
        counter.increment(env, i % 3 + 1)
        now = stored(env, counter)
        assert last_stored <= now <= counter.value(env)
        changes += now != last_stored
        last_stored = now
    assert 30 < changes < 100  # about 0.2 * 300 persisted increments
    assert all(column == MAX for _, column, _ in committed_cells(env))


def test_cached_exact_in_its_handle_under_8_threads(backend, store_path):
    """The cached total counts every increment exactly (each returns a
    distinct total, 1..4000); with p = 1 every total is persisted and the
    maximum survives out-of-order writes; flush persists the rest."""
    report = run_child_json(
        children.sharded_counter.cached_threads, backend, timeout=90, path=store_path
    )
    for p, r in report.items():
        assert r["errors"] == [], p
        assert r["sorted_ok"], p
        assert r["value"] == 4000, p
        assert r["after_flush"] == 4000, p
        assert 0 < r["before_flush"] <= 4000, p
    assert report["1.0"]["before_flush"] == 4000


def test_cached_closing_without_flush_loses_exactly_the_lag(store_path):
    """lmdb only: a new handle on the reopened store loads what was persisted."""
    counter = percolite.ShardedCounter("hits", 8, chance_to_write=0.05, rng=random.Random(3))
    env = percolite.open(store_path, sync="none")
    for _ in range(500):
        counter.increment(env)
    persisted = stored(env, counter)
    assert counter.value(env) == 500
    assert persisted < 500  # P(last increment persisted) = 0.05; seeded
    env.close()
    with pytest.raises(percolite.ClosedError, match="sharded counter 'hits': increment"):
        counter.increment(env)

    env = percolite.open(store_path, sync="none")
    assert counter.value(env) == persisted  # the new handle loads the maximum
    counter.increment(env, 10)
    counter.flush(env)
    env.close()
    env = percolite.open(store_path, sync="none")
    assert counter.value(env) == persisted + 10  # flushed: nothing lost
    env.close()


def test_cached_process_ending_without_flush_loses_exactly_the_lag(store_path):
    """lmdb only: the store outlives the process that wrote it."""
    out = run_child(children.sharded_counter.cached_exit_without_flush, store_path, timeout=60)
    cached, persisted = map(int, out.split())
    assert cached == 300
    with percolite.open(store_path, sync="none") as env:
        counter = percolite.ShardedCounter("hits", 8, chance_to_write=0.1)
        assert counter.value(env) == persisted
        assert 0 <= persisted <= cached  # lost: the lag, cached - persisted


def test_cached_counter_refuses_transactional_use_and_mixed_modes(env):
    cached = percolite.ShardedCounter("hits", chance_to_write=0.5)
    tx = env.transaction()
    with pytest.raises(ValueError, match=r"'hits' caches its total.*use increment\(env\)"):
        cached.add(tx)
    tx.abort()
    for bad in (0, -1):
        with pytest.raises(ValueError, match=r"'hits': amount must be >= 1 in the cached mode"):
            cached.increment(env, bad)
    assert committed_cells(env) == []
    assert cached.value(env) == 0

    percolite.ShardedCounter("exact").increment(env)
    with pytest.raises(ValueError, match=r"holds a shard of an exact counter; open it.* without"):
        percolite.ShardedCounter("exact", chance_to_write=0.5).value(env)
    cached.increment(env)
    cached.flush(env)
    with pytest.raises(ValueError, match=r"holds a shard of a cached counter; open it.* with ch"):
        percolite.ShardedCounter("hits").value(env)


# -- bad input ----------------------------------------------------------------------

BAD_COUNTERS = [
    # (id, kwargs, exception, message pattern)
    ("int-name", {"name": 5}, TypeError, r"name must be a str, not int"),
    ("bytes-name", {"name": b"hits"}, TypeError, r"name must be a str, not bytes"),
    ("empty-name", {"name": ""}, ValueError, r"name must not be empty"),
    ("colon-name", {"name": "a:b"}, ValueError, r"'a:b' contains a character the layout"),
    ("newline-name", {"name": "a\nb"}, ValueError, r"contains a character the layout reserves"),
    ("del-name", {"name": "a\x7f"}, ValueError, r"contains a character the layout reserves"),
    ("zero-shards", {"shards": 0}, ValueError, r"'c': shards must be between 1 and 65536, not 0"),
    ("many-shards", {"shards": 65537}, ValueError, r"shards must be between 1 and 65536"),
    ("float-shards", {"shards": 1.5}, TypeError, r"'c': shards must be an int, not float"),
    ("bool-shards", {"shards": True}, TypeError, r"shards must be an int, not bool"),
    ("str-shards", {"shards": "16"}, TypeError, r"shards must be an int, not str"),
    ("zero-chance", {"chance_to_write": 0}, ValueError, r"'c': chance_to_write must be in \(0"),
    ("big-chance", {"chance_to_write": 1.5}, ValueError, r"chance_to_write must be in \(0, 1\]"),
    ("neg-chance", {"chance_to_write": -0.1}, ValueError, r"chance_to_write must be in"),
    ("nan-chance", {"chance_to_write": math.nan}, ValueError, r"chance_to_write must be in"),
    ("bool-chance", {"chance_to_write": True}, TypeError, r"chance_to_write must be a float"),
    ("str-chance", {"chance_to_write": "0.5"}, TypeError, r"chance_to_write must be a float"),
    ("bad-rng", {"rng": 42}, TypeError, r"'c': rng must be a random.Random, not int"),
]


@pytest.mark.parametrize(
    "kwargs, exception, pattern", [c[1:] for c in BAD_COUNTERS], ids=[c[0] for c in BAD_COUNTERS]
)
def test_bad_counter_arguments(kwargs, exception, pattern):
    kwargs = {"name": "c", **kwargs}
    with pytest.raises(exception, match=pattern):
        percolite.ShardedCounter(**kwargs)


BAD_AMOUNTS = [
    (1.5, TypeError, r"'c': amount must be an int, not float"),
    (True, TypeError, r"amount must be an int, not bool"),
    ("1", TypeError, r"amount must be an int, not str"),
    (None, TypeError, r"amount must be an int, not NoneType"),
    (INT64_MAX + 1, ValueError, r"'c': amount 9223372036854775808 does not fit in a signed 64"),
    (INT64_MIN - 1, ValueError, r"does not fit in a signed 64-bit integer"),
]


@pytest.mark.parametrize("chance", [None, 0.5])
@pytest.mark.parametrize("amount, exception, pattern", BAD_AMOUNTS)
def test_bad_amounts_raise_and_write_nothing(env, chance, amount, exception, pattern):
    counter = percolite.ShardedCounter("c", chance_to_write=chance)
    with pytest.raises(exception, match=pattern):
        counter.increment(env, amount)
    if chance is None:
        with pytest.raises(exception, match=pattern):
            env.run(lambda tx: counter.add(tx, amount))
    assert committed_cells(env) == []
    assert counter.value(env) == 0


def test_wrong_handles_raise_and_write_nothing(env):
    counter = percolite.ShardedCounter("c")
    tx = env.transaction()
    with pytest.raises(TypeError, match=r"'c': increment needs a percolite.Env, not Transaction"):
        counter.increment(tx)
    with pytest.raises(TypeError, match=r"value needs a percolite.Env.*use get\(tx\)"):
        counter.value(tx)
    with pytest.raises(TypeError, match=r"add needs a percolite.Transaction, not Env.*increment"):
        counter.add(env)
    with pytest.raises(TypeError, match=r"get needs a percolite.Transaction, not Env.*value"):
        counter.get(env)
    with pytest.raises(TypeError, match=r"flush needs a percolite.Env, not str"):
        counter.flush("store")
    tx.abort()
    assert committed_cells(env) == []


def test_closed_env_raises_closed_error(backend, store_path):
    env = open_store(backend, store_path, sync="none")
    env.close()
    exact, cached = percolite.ShardedCounter("c"), percolite.ShardedCounter("c", chance_to_write=1)
    for counter in (exact, cached):
        for call in (counter.increment, counter.value, counter.flush):
            with pytest.raises(percolite.ClosedError, match=r"sharded counter 'c'"):
                call(env)


def test_repr():
    assert repr(percolite.ShardedCounter("hits")) == "<percolite.ShardedCounter 'hits' shards=16>"
    assert (
        repr(percolite.ShardedCounter("hits", 4, chance_to_write=0.25))
        == "<percolite.ShardedCounter 'hits' shards=4 chance_to_write=0.25>"
    )


# -- bad input, in the table of entry points -----------------------------------

ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    (
        "counter-add-str",
        lambda env, d, q: q["counter"].add(env.transaction(), "x"),
        TypeError,
        r"sharded counter 'hits': amount must be an int, not str",
    ),
    (
        "counter-add-too-big",
        lambda env, d, q: q["counter"].add(env.transaction(), 2**64),
        ValueError,
        r"sharded counter 'hits': amount 18446744073709551616 does not fit",
    ),
    (
        "counter-add-no-tx",
        lambda env, d, q: q["counter"].add(None, 1),
        TypeError,
        r"sharded counter 'hits': add needs a percolite.Transaction, not NoneType",
    ),
    (
        "counter-shards-zero",
        lambda env, d, q: percolite.ShardedCounter("c", shards=0),
        ValueError,
        r"sharded counter 'c': shards must be between 1 and 65536, not 0",
    ),
]


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)
