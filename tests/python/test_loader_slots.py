"""The loader's slots taken without waiting and given back in batches, and
the combine queue's add on its short path: the same results, the same
errors, whichever way they go."""

from __future__ import annotations

import collections
import threading

import percolite
import pytest
from conftest import COL
from percolite import _core


def test_try_acquire_takes_free_slots_only():
    core = _core.Loader(3)
    assert [core.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert core.in_flight == 3
    core.release(2)
    assert core.in_flight == 1
    assert [core.try_acquire() for _ in range(3)] == [True, True, False]
    core.release(10)  # more than in flight: none left, not a wrap-around
    assert core.in_flight == 0
    core.release(0)
    assert core.in_flight == 0
    core.close()
    assert core.try_acquire() is False
    assert core.acquire(0) is False


def test_release_of_many_wakes_every_blocked_acquire():
    core = _core.Loader(2)
    assert core.try_acquire() and core.try_acquire()
    got = []
    waiters = [threading.Thread(target=lambda: got.append(core.acquire(10))) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    core.release(2)
    for waiter in waiters:
        waiter.join(timeout=10)
    assert got == [True, True] and core.in_flight == 2


def test_flush_returns_with_every_slot_given_back(store_path):
    with percolite.open(store_path, sync="none") as env:
        with env.loader(max_in_flight=16) as loader:
            for round_ in range(20):
                futures = [
                    loader.submit(lambda tx, i: tx.set(b"%d" % i, COL, b"v"), round_ * 100 + i)
                    for i in range(100)
                ]
                assert loader.flush(timeout=60)
                assert loader.in_flight == 0
                assert all(f.done() for f in futures)
        with env.transaction() as tx:
            assert sum(1 for _ in tx.scan(columns=[COL])) == 2000


def test_failures_and_cancellations_give_their_slots_back(store_path):
    with percolite.open(store_path, sync="none") as env:
        loader = env.loader(max_in_flight=4)
        gate = threading.Event()
        blocker = loader.submit(lambda tx: gate.wait(10))
        queued = [loader.submit(lambda tx: None) for _ in range(3)]
        assert all(f.cancel() for f in queued)  # still waiting behind the blocker
        gate.set()
        blocker.result(timeout=10)

        def fail(tx):
            raise KeyError("boom")

        failed = [loader.submit(fail) for _ in range(50)]  # 50 > 4 slots: each came back
        assert loader.flush(timeout=60) and loader.in_flight == 0
        assert all(isinstance(f.exception(timeout=0), KeyError) for f in failed)
        with pytest.raises(KeyError):
            loader.__exit__(None, None, None)


def queue_app(queue_id="hot"):
    app = percolite.App()
    return app, app.combine_queue(queue_id, buckets=4, combiner="sum")


def test_lambda_adds_of_fresh_dicts_through_the_loader_are_exact(store_path):
    app, cq = queue_app()
    expected = collections.Counter()
    with percolite.open(store_path, app=app, sync="none") as env:
        env.start_workers(2)
        with env.loader(max_in_flight=32) as loader:
            for i in range(3000):
                batch = {f"k{(i * 7 + j) % 97}": j + 1 for j in range(i % 20 + 1)}
                expected.update(batch)
                loader.submit(lambda tx, b: cq.add(tx, b), batch)
        assert env.wait(timeout=120)
        with env.transaction() as tx:
            assert dict(cq.scan(tx)) == dict(expected)


@pytest.mark.parametrize(
    "updates",
    [
        {"a": 1, "b": -2, "é": 2**61},
        [("a", 1), ("b", -2), ("a", 5)],
        collections.Counter({"a": 3, "b": 4}),  # a dict subclass: the general path
        (("a", 1), ("b", 2)),  # a tuple of pairs: the general path
    ],
    ids=["dict", "list", "counter", "tuple"],
)
def test_a_twin_queue_of_another_app_adds_what_the_bound_queue_adds(store_path, updates):
    """A queue declared alike on another App is not the bound app's queue
    object: its add takes the checked path and must queue the same."""
    app, cq = queue_app()
    _twin_app, twin = queue_app()
    with percolite.open(store_path, app=app, sync="none") as env:
        for queue in (cq, twin):
            with env.transaction() as tx:
                queue.add(tx, updates)
        env.process()
        with env.transaction() as tx:
            once = collections.Counter()
            for key, value in updates.items() if isinstance(updates, dict) else updates:
                once[key] += value
            assert dict(cq.scan(tx)) == {k: 2 * v for k, v in once.items()}


@pytest.mark.parametrize(
    ("updates", "error", "message"),
    [
        ({"a": "1"}, TypeError, r"combine queue 'hot': value '1' for key 'a': expected int"),
        ({"a": True}, TypeError, r"value True for key 'a': expected int, not bool"),
        ({"a": 2**63}, ValueError, r"combine queue 'hot': value 9223372036854775808 for key 'a'"),
        ({b"a": 1}, TypeError, r"combine queue 'hot': key b'a': expected str"),
        ({"\ud800": 1}, ValueError, r"combine queue 'hot': key '\\ud800'"),
        (5, TypeError, r"combine queue 'hot': add needs a mapping"),
    ],
)
def test_bad_updates_raise_the_same_on_both_paths(store_path, updates, error, message):
    app, cq = queue_app()
    _twin_app, twin = queue_app()
    with percolite.open(store_path, app=app, sync="none") as env:
        for queue in (cq, twin):
            tx = env.transaction()
            with pytest.raises(error, match=message):
                queue.add(tx, updates)
            tx.abort()
        with env.transaction() as tx:
            assert cq.depth(tx) == 0


def test_adds_from_threads_into_one_transaction_are_all_queued(store_path):
    """Adds from several threads into one transaction, each on the short
    path: the transaction serialises them, none is lost."""
    app, cq = queue_app()
    with percolite.open(store_path, app=app, sync="none") as env:
        tx = env.transaction()

        def adder(n):
            for i in range(200):
                cq.add(tx, {f"k{i % 10}": 1, "all": n})

        threads = [threading.Thread(target=adder, args=(n,)) for n in (1, 2, 3, 4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        tx.commit()
        env.process()
        with env.transaction() as tx:
            values = dict(cq.scan(tx))
        assert values == {**{f"k{i}": 80 for i in range(10)}, "all": 200 * (1 + 2 + 3 + 4)}
