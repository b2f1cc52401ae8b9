"""Children of test_concurrency.py: threads sharing one store."""

from __future__ import annotations

import json
import os
import random
import threading
import time

import percolite

from children import open_store


def no_lost_updates(backend, path):
    """8 threads x 500 read-modify-write increments of one cell; prints the
    final value, every (commit_ts, value written), errors and the stats."""
    env = open_store(backend, path)  # default sync="full": group commit under test
    col = ("stats", "n")
    results = []  # (commit_ts, value written)
    lock = threading.Lock()
    errors = []

    def increment(tx):
        value = int(tx.get("counter", col, b"0")) + 1
        tx.set("counter", col, str(value))
        return tx, value

    def worker():
        try:
            mine = []
            for _ in range(500):
                tx, value = env.run(increment, retries=None)
                mine.append((tx.commit_ts, value))
            with lock:
                results.extend(mine)
        except BaseException as e:  # reported, not swallowed
            errors.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tx = env.transaction()
    final = tx.get("counter", col)
    tx.abort()
    print(
        json.dumps(
            {
                "final": final.decode(),
                "results": results,
                "errors": errors,
                "stats": env.stats(),
                # The store's own count leaves out the metric writes, which
                # a run longer than the metrics' flush interval adds.
                "metrics_commits": env.metrics()["counters"]["commits"],
            }
        )
    )
    env.close()


def stable_snapshot(backend, path):
    """One reader keeps checking its snapshot (gets, a scan, a prefix scan)
    while 4 threads commit changes to the same rows; prints "ok", the number
    of checks and of commits."""
    env = open_store(backend, path, sync="none")
    col = ("f", "q")
    n = 700  # more than one scan chunk
    with env.transaction() as tx:
        for i in range(n):
            tx.set(b"r%04d" % i, col, b"v0")

    reader = env.transaction()
    watched = [b"r%04d" % i for i in (0, 1, 255, 511, 512, 513, 699)]
    first_gets = {row: reader.get(row, col) for row in watched}
    first_scan = [tuple(c) for c in reader.scan()]
    first_prefix = [tuple(c) for c in reader.scan(b"r05")]
    assert len(first_scan) == n

    stop = threading.Event()
    commits = [0] * 4
    errors = []

    def writer(k):
        rng = random.Random(k)
        try:
            while not stop.is_set():

                def change(tx):
                    for _ in range(5):
                        i = rng.randrange(n + 100)
                        row = b"r%04d" % i
                        op = rng.random()
                        if op < 0.6:
                            tx.set(row, col, b"w%d" % k)
                        elif op < 0.8:
                            tx.delete(row, col)
                        else:
                            tx.set(row, ("f", "z"), b"new")
                    tx.set(watched[rng.randrange(len(watched))], col, b"hot%d" % k)

                env.run(change, retries=None)
                commits[k] += 1
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    checks = 0
    try:
        while checks < 30 or sum(commits) < 100:
            assert {row: reader.get(row, col) for row in watched} == first_gets
            assert [tuple(c) for c in reader.scan()] == first_scan
            assert [tuple(c) for c in reader.scan(b"r05")] == first_prefix
            checks += 1
            if checks > 5000:
                raise SystemExit("writers made no progress")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == [], errors
    # The writers really changed what the reader keeps seeing the old way.
    fresh = env.transaction()
    now = [tuple(c) for c in fresh.scan()]
    fresh.abort()
    assert now != first_scan
    assert [tuple(c) for c in reader.scan()] == first_scan
    assert reader.get(b"r0000", col) == b"v0"
    reader.abort()
    env.close()
    print("ok", checks, sum(commits))


def shared_transaction(backend, path):
    """4 threads write and read back 300 cells each in one transaction."""
    env = open_store(backend, path, sync="none")
    tx = env.transaction()

    def fill(k):
        for i in range(300):
            tx.set(b"t%d-%03d" % (k, i), ("f", "q"), b"%d" % i)
            assert tx.get(b"t%d-%03d" % (k, i), ("f", "q")) == b"%d" % i

    threads = [threading.Thread(target=fill, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(list(tx.scan())) == 1200
    tx.commit()
    check = env.transaction()
    rows = [c.row for c in check.scan()]
    check.abort()
    assert rows == sorted(b"t%d-%03d" % (k, i) for k in range(4) for i in range(300))
    env.close()
    print("ok")


def close_while_threads_run(backend, directory):
    """15 rounds: 6 threads keep committing increments while the store is
    closed under them; each round checks that every thread ends with
    ClosedError and, where the store outlives its handle (reopened), that no
    reported commit was lost."""
    for round_ in range(15):
        _close_while_committing(backend, os.path.join(directory, f"s{round_}"), round_)
    print("ok")


def _close_while_committing(backend, path, round_):
    col = ("c", "n")
    env = open_store(backend, path, sync="none")
    persistent = env.capabilities["persistent"]
    done = [0] * 6
    unexpected = []
    started = threading.Barrier(7)

    def worker(k):
        started.wait()

        def inc(tx):
            tx.set("counter", col, str(int(tx.get("counter", col, b"0")) + 1))
            tx.set(b"w%d" % k, col, b"x")

        while True:
            try:
                env.run(inc, retries=None, backoff=0.0001)
                done[k] += 1
            except percolite.ClosedError:
                return
            except BaseException as e:
                unexpected.append(repr(e))
                return

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.02 + 0.005 * round_)
    env.close()
    for t in threads:
        t.join(timeout=20)
        assert not t.is_alive(), "a thread hung after close"
    assert unexpected == [], unexpected
    if not persistent:
        return  # a memory store is gone with its handle: nothing to reopen
    with open_store(backend, path, sync="none") as again:
        tx = again.transaction()
        value = int(tx.get("counter", col, b"0"))
        tx.abort()
    assert value == sum(done), (value, done)


def begin_and_close_race(backend, directory):
    """Rounds of 4 threads beginning transactions while the store closes,
    for at least 300 rounds and 3 seconds; prints "ok" and the rounds."""
    path = os.path.join(directory, "store")
    deadline = time.monotonic() + 3
    rounds = 0
    while rounds < 300 or time.monotonic() < deadline:
        rounds += 1
        _begin_while_closing(backend, path)
    print("ok", rounds)


def _begin_while_closing(backend, path):
    env = open_store(backend, path, sync="none")
    go = threading.Event()
    unexpected = []

    def reader():
        go.wait()
        while True:
            try:
                env.transaction().abort()
            except percolite.ClosedError:
                return
            except BaseException as e:
                unexpected.append(repr(e))
                return

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    go.set()
    env.close()
    for t in threads:
        t.join(timeout=20)
        assert not t.is_alive(), "a thread hung after close"
    assert unexpected == [], unexpected
