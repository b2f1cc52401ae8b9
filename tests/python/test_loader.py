"""The loader: one thread keeps many commits in flight, each future resolving
once its transaction is durable (percolite.Loader, Env.loader)."""

from __future__ import annotations

import asyncio
import threading

import children.loader
import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from _isolated import run_child
from conftest import COL, open_store


def counter_app():
    app = percolite.App()
    words = app.combine_queue("words", combiner="sum", value_codec="int64")
    return app, words


def test_thousands_of_submissions_from_one_thread_are_exact(backend, store_path):
    app, words = counter_app()
    with open_store(backend, store_path, app=app, sync="none") as env:

        def load(tx, i):
            tx.set(f"doc{i:05d}", COL, b"%d" % i)
            words.add(tx, {f"w{i % 50}": 1, "all": 1})
            return i * 2

        with env.loader(max_in_flight=128) as loader:
            futures = [loader.submit(load, i) for i in range(5000)]
        assert [f.result(timeout=0) for f in futures] == [i * 2 for i in range(5000)]
        env.process()
        tx = env.transaction()
        assert words.get(tx, "all") == 5000
        assert [words.get(tx, f"w{k}") for k in range(50)] == [100] * 50
        assert tx.get("doc04999", COL) == b"4999"
        tx.abort()


def test_a_resolved_future_means_a_committed_transaction(backend, store_path):
    with open_store(backend, store_path, sync="full") as env:
        with env.loader() as loader:
            future = loader.submit(lambda tx: tx.set("r", COL, b"v"))
            assert future.result(timeout=30) is None
            tx = env.transaction()  # begun after the future resolved: sees the commit
            assert tx.get("r", COL) == b"v"
            tx.abort()


def test_a_failing_function_fails_only_its_future_and_the_block_raises_it(backend, store_path):
    with open_store(backend, store_path, sync="none") as env:

        def load(tx, i):
            if i == 7:
                raise KeyError("bad document 7")
            tx.set(b"%d" % i, COL, b"ok")

        futures = []
        with pytest.raises(KeyError, match="bad document 7"):
            with env.loader() as loader:
                futures = [loader.submit(load, i) for i in range(20)]
        assert isinstance(futures[7].exception(timeout=0), KeyError)
        assert all(f.exception(timeout=0) is None for i, f in enumerate(futures) if i != 7)
        tx = env.transaction()
        assert tx.get(b"7", COL) is None  # nothing of the failed run was written
        assert sum(tx.get(b"%d" % i, COL) == b"ok" for i in range(20)) == 19
        tx.abort()


def test_conflicts_are_retried_until_every_increment_lands(backend, store_path):
    with open_store(backend, store_path, sync="none") as env:

        def increment(tx):
            n = int(tx.get("counter", COL, b"0"))
            tx.set("counter", COL, b"%d" % (n + 1))
            return n

        with env.loader(max_in_flight=64) as loader:
            futures = [loader.submit(increment) for _ in range(300)]
        # Each run read a different count: no lost update.
        assert sorted(f.result(timeout=0) for f in futures) == list(range(300))
        tx = env.transaction()
        assert tx.get("counter", COL) == b"300"
        tx.abort()
        if backend == "lmdb":  # a group commit validates many members against each other
            assert env.stats()["conflicts"] > 0


def test_without_retries_a_conflict_fails_its_future(store_path):
    with percolite.open(store_path, sync="none") as env:

        def increment(tx):
            n = int(tx.get("counter", COL, b"0"))
            tx.set("counter", COL, b"%d" % (n + 1))

        with pytest.raises(percolite.CommitConflict):
            with env.loader(max_in_flight=64, max_retries=0) as loader:
                futures = [loader.submit(increment) for _ in range(300)]
        failed = sum(isinstance(f.exception(timeout=0), percolite.CommitConflict) for f in futures)
        tx = env.transaction()
        assert int(tx.get("counter", COL)) == 300 - failed
        tx.abort()


def test_submit_blocks_at_max_in_flight(backend, store_path):
    with open_store(backend, store_path, sync="none") as env:
        seen = []
        with env.loader(max_in_flight=8) as loader:

            def load(tx, i):
                seen.append(loader.in_flight)
                tx.set(b"%d" % i, COL, b"v")

            for i in range(500):
                loader.submit(load, i)
                assert loader.in_flight <= 8
        assert len(seen) == 500 and max(seen) <= 8
        assert loader.in_flight == 0


def test_flush_waits_for_every_submission(backend, store_path):
    with open_store(backend, store_path, sync="none") as env:
        loader = env.loader()
        futures = [loader.submit(lambda tx, i: tx.set(b"%d" % i, COL, b"v"), i) for i in range(300)]
        assert loader.flush(timeout=30)
        assert all(f.done() for f in futures)
        loader.close()
        assert loader.closed


def test_closing_the_store_flushes_its_loaders(backend, store_path):
    env = open_store(backend, store_path, sync="none")
    loader = env.loader()
    futures = [loader.submit(lambda tx, i: tx.set(b"%d" % i, COL, b"v"), i) for i in range(1000)]
    env.close()
    assert all(f.result(timeout=0) is None for f in futures)
    with pytest.raises(percolite.Error, match="loader is closed"):
        loader.submit(lambda tx: None)
    with pytest.raises(percolite.ClosedError):
        env.loader()


def test_submissions_from_several_threads(backend, store_path):
    app, words = counter_app()
    with open_store(backend, store_path, app=app, sync="none") as env:
        with env.loader(max_in_flight=32) as loader:

            def submitter():
                for _ in range(250):
                    loader.submit(lambda tx: words.add(tx, {"n": 1}))

            threads = [threading.Thread(target=submitter) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        env.process()
        tx = env.transaction()
        assert words.get(tx, "n") == 1000
        tx.abort()


def test_asubmit_from_asyncio(backend, store_path):
    with open_store(backend, store_path, sync="none") as env:

        async def main(loader):
            results = await asyncio.gather(
                *(
                    loader.asubmit(lambda tx, i: tx.set(b"%d" % i, COL, b"v") or i, i)
                    for i in range(200)
                )
            )
            return results

        with env.loader(max_in_flight=16) as loader:
            assert asyncio.run(main(loader)) == list(range(200))


def test_a_function_that_commits_itself_resolves_with_its_result(backend, store_path):
    with open_store(backend, store_path, sync="none") as env:

        def commits_itself(tx):
            tx.set("r", COL, b"v")
            tx.commit()
            return tx.commit_ts

        with env.loader() as loader:
            future = loader.submit(commits_itself)
        assert future.result(timeout=0) > 0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_in_flight": 0}, ValueError, "max_in_flight must be >= 1, not 0"),
        ({"max_in_flight": -3}, ValueError, "max_in_flight must be >= 1"),
        ({"max_in_flight": "8"}, TypeError, "max_in_flight must be an int, not str"),
        ({"max_in_flight": True}, TypeError, "max_in_flight must be an int, not bool"),
        ({"max_in_flight": 2.5}, TypeError, "max_in_flight must be an int, not float"),
        ({"max_retries": -1}, ValueError, "max_retries must be >= 0"),
        ({"backoff": -1}, ValueError, "backoff must be a finite number >= 0"),
        ({"max_backoff": float("nan")}, ValueError, "max_backoff must be a finite number"),
    ],
)
def test_bad_loader_arguments(env, kwargs, error, match):
    with pytest.raises(error, match=match):
        env.loader(**kwargs)


def test_submit_needs_a_callable_and_an_open_loader(env):
    loader = env.loader()
    with pytest.raises(TypeError, match="fn must be callable, not int"):
        loader.submit(42)
    loader.close()
    with pytest.raises(percolite.Error, match="the loader is closed"):
        loader.submit(lambda tx: None)
    loader.close()  # idempotent


def test_flush_from_inside_a_submitted_function_is_refused(env):
    loader = env.loader()
    future = loader.submit(lambda tx: loader.flush())
    with pytest.raises(percolite.Error, match="flush"):
        future.result(timeout=30)
    loader.close()  # close() alone does not raise the failures; leaving a with block does


# -- bad input, in the table of entry points -----------------------------------

ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    (
        "loader-zero",
        lambda env, d, q: env.loader(max_in_flight=0),
        ValueError,
        r"max_in_flight must be >= 1, not 0",
    ),
    (
        "loader-float",
        lambda env, d, q: env.loader(max_in_flight=2.5),
        TypeError,
        r"max_in_flight must be an int, not float",
    ),
]


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)


def test_back_pressure_keeps_memory_steady_over_many_submissions():
    # 1,000,000 submissions from one thread: the loader holds at most 256 at
    # a time, so memory after 200,000 and after 1,000,000 is the same.
    out = run_child(
        children.loader.rss_over_submissions, 1_000_000, [200_000, 1_000_000], timeout=240
    )
    lines = out.splitlines()
    (_, early), (_, late) = (map(int, line.split()) for line in lines[:2])
    assert late - early < 8 * 1024, f"RSS grew from {early} KiB to {late} KiB"
    assert lines[2].startswith("last")
