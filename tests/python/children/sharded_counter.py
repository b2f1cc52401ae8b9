"""Children of test_sharded_counter.py: sharded counters under real threads
and processes."""

from __future__ import annotations

import json
import os
import random
import threading
import time

import percolite

from children import open_store


def exact_totals_threads(backend, path):
    """8 threads x 500 transactions, each adding k + 1 and logging a cell;
    one in five aborted after its add. Prints the value, the shard cells,
    the log count, aborts per thread and errors."""
    env = open_store(backend, path, sync="none")
    hits = percolite.ShardedCounter("hits", 16)
    aborted = [0] * 8
    errors = []

    class Abort(Exception):
        pass

    def worker(k):
        try:
            for i in range(500):

                def count(tx, i=i):
                    hits.add(tx, k + 1)
                    tx.set(b"log:%d:%03d" % (k, i), ("f", "q"), b"")
                    if i % 5 == 0:
                        raise Abort  # the add must vanish with the transaction

                try:
                    env.run(count, retries=None)
                except Abort:
                    aborted[k] += 1
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tx = env.transaction()
    shards = [(c.row.decode(), c.value.hex()) for c in tx.scan(prefix="counter:")]
    logs = sum(1 for _ in tx.scan(prefix="log:"))
    tx.abort()
    print(
        json.dumps(
            {
                "value": hits.value(env),
                "shards": shards,
                "logs": logs,
                "aborted": aborted,
                "errors": errors,
            }
        )
    )
    env.close()


def process_incrementer(path, ready_file, go_file, amount):
    """500 increments by ``amount``, started together with another process
    (touches ``ready_file``, then waits for ``go_file``)."""
    env = percolite.open(path, sync="none")
    hits = percolite.ShardedCounter("hits", 16)
    open(ready_file, "w").close()
    while not os.path.exists(go_file):  # start together, so the two really collide
        time.sleep(0.001)
    for _ in range(500):
        hits.increment(env, amount)
    print(json.dumps(env.stats()["conflicts"]))
    env.close()


def _rounds(env, shards, n_rounds=40, n_threads=8):
    """Conflicts when, each round, ``n_threads`` threads all begin and add
    before any commits."""
    counter = percolite.ShardedCounter(f"c{shards}", shards, rng=random.Random(shards))
    barrier = threading.Barrier(n_threads, timeout=20)
    conflicts = [0] * n_threads
    errors = []

    def worker(k):
        try:
            for _ in range(n_rounds):
                tx = env.transaction()
                counter.add(tx)
                barrier.wait()  # all began before any commits
                try:
                    tx.commit()
                except percolite.CommitConflict:
                    conflicts[k] += 1
                barrier.wait()
        except BaseException as e:
            errors.append(repr(e))
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors
    assert counter.value(env) == n_rounds * n_threads - sum(conflicts)
    return sum(conflicts)


def _retries(env, shards, n_threads=8, n=200):
    """Conflicts counted by the store while ``n_threads`` threads run ``n``
    increments each with env.run, no backoff, 0.2 ms of work after the add."""
    counter = percolite.ShardedCounter(f"r{shards}", shards)

    def add_and_work(tx):
        counter.add(tx)
        time.sleep(0.0002)

    before = env.stats()["conflicts"]
    threads = [
        threading.Thread(
            target=lambda: [env.run(add_and_work, retries=None, backoff=0) for _ in range(n)]
        )
        for _ in range(n_threads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.value(env) == n_threads * n
    return env.stats()["conflicts"] - before


def shard_collisions(backend, path):
    """Conflicts with 1 and 16 shards, in rounds and with retries."""
    env = open_store(backend, path, sync="none")
    print(
        json.dumps(
            {
                "rounds": {s: _rounds(env, s) for s in (1, 16)},
                "retries": {s: _retries(env, s) for s in (1, 16)},
            }
        )
    )
    env.close()


def cached_threads(backend, path):
    """8 threads x 500 increments of a cached counter, for p = 0.05 and 1.0;
    prints per p whether the returned totals were 1..4000, the value, and
    what is persisted before and after flush."""
    env = open_store(backend, path, sync="none")
    results = {}
    for p in (0.05, 1.0):
        results[p] = _cached_run(env, p)
    print(json.dumps(results))
    env.close()


def _cached_run(env, p):
    counter = percolite.ShardedCounter(f"p{p}", 16, chance_to_write=p)
    totals, errors = [], []

    def worker():
        try:
            mine = [counter.increment(env) for _ in range(500)]
            totals.extend(mine)
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tx = env.transaction()
    before_flush = counter.get(tx)
    tx.abort()
    counter.flush(env)
    tx = env.transaction()
    after_flush = counter.get(tx)
    tx.abort()
    return {
        "sorted_ok": sorted(totals) == list(range(1, 4001)),
        "value": counter.value(env),
        "before_flush": before_flush,
        "after_flush": after_flush,
        "errors": errors,
    }


def cached_exit_without_flush(path):
    """300 increments of a cached counter (p = 0.1, seeded); prints the
    cached value and what is persisted, then ends the process at once."""
    env = percolite.open(path, sync="none")
    counter = percolite.ShardedCounter("hits", 8, chance_to_write=0.1, rng=random.Random(5))
    for _ in range(300):
        counter.increment(env)
    tx = env.transaction()
    print(counter.value(env), counter.get(tx), flush=True)
    os._exit(0)  # no close, no flush, no atexit: like a crash
