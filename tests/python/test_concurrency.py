"""Threads sharing one store. Every test runs its body in a child interpreter
with a timeout (run_isolated), so a deadlock fails fast instead of hanging."""

from __future__ import annotations

import json


def test_no_lost_updates_8_threads_x_500_increments(store_path, run_isolated):
    out = run_isolated(
        """
        import json, sys, threading
        import percolite

        env = percolite.open(sys.argv[1])  # default sync="full": group commit under test
        COL = ("stats", "n")
        results = []  # (commit_ts, value written)
        lock = threading.Lock()
        errors = []

        def increment(tx):
            value = int(tx.get("counter", COL, b"0")) + 1
            tx.set("counter", COL, str(value))
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
        final = tx.get("counter", COL)
        tx.abort()
        print(json.dumps({"final": final.decode(), "results": results, "errors": errors,
                          "stats": env.stats()}))
        env.close()
        """,
        store_path,
        timeout=90,
    )
    report = json.loads(out)
    assert report["errors"] == []
    assert report["final"] == "4000"
    results = report["results"]
    assert len(results) == 4000
    commit_ts = [ts for ts, _ in results]
    assert len(set(commit_ts)) == 4000, "commit_ts values must be unique"
    # Serial order: sorted by commit_ts, the increments wrote 1, 2, ..., 4000.
    assert [value for _, value in sorted(results)] == list(range(1, 4001))
    assert report["stats"]["commits"] == 4000


def test_snapshot_is_stable_while_other_threads_commit(store_path, run_isolated):
    out = run_isolated(
        """
        import sys, threading, random
        import percolite

        env = percolite.open(sys.argv[1], sync="none")
        COL = ("f", "q")
        N = 700  # more than one scan chunk
        with env.transaction() as tx:
            for i in range(N):
                tx.set(b"r%04d" % i, COL, b"v0")

        reader = env.transaction()
        watched = [b"r%04d" % i for i in (0, 1, 255, 511, 512, 513, 699)]
        first_gets = {row: reader.get(row, COL) for row in watched}
        first_scan = [tuple(c) for c in reader.scan()]
        first_prefix = [tuple(c) for c in reader.scan(b"r05")]
        assert len(first_scan) == N

        stop = threading.Event()
        commits = [0] * 4
        errors = []

        def writer(k):
            rng = random.Random(k)
            try:
                while not stop.is_set():
                    def change(tx):
                        for _ in range(5):
                            i = rng.randrange(N + 100)
                            row = b"r%04d" % i
                            op = rng.random()
                            if op < 0.6:
                                tx.set(row, COL, b"w%d" % k)
                            elif op < 0.8:
                                tx.delete(row, COL)
                            else:
                                tx.set(row, ("f", "z"), b"new")
                        tx.set(watched[rng.randrange(len(watched))], COL, b"hot%d" % k)
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
                assert {row: reader.get(row, COL) for row in watched} == first_gets
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
        assert reader.get(b"r0000", COL) == b"v0"
        reader.abort()
        env.close()
        print("ok", checks, sum(commits))
        """,
        store_path,
        timeout=60,
    )
    assert out.startswith("ok")


def test_one_transaction_shared_by_threads(store_path, run_isolated):
    out = run_isolated(
        """
        import sys, threading
        import percolite

        env = percolite.open(sys.argv[1], sync="none")
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
        """,
        store_path,
        timeout=60,
    )
    assert out.strip() == "ok"


def test_close_while_other_threads_run(tmp_path, run_isolated):
    """Close drains in-flight commits; other threads then get ClosedError,
    never a crash or a hang, and no commit reported as done is lost."""
    out = run_isolated(
        """
        import sys, os, threading, time
        import percolite

        COL = ("c", "n")
        for round_ in range(15):
            path = os.path.join(sys.argv[1], "s%d" % round_)
            env = percolite.open(path, sync="none")
            done = [0] * 6
            unexpected = []
            started = threading.Barrier(7)

            def worker(k):
                started.wait()
                def inc(tx):
                    tx.set("counter", COL, str(int(tx.get("counter", COL, b"0")) + 1))
                    tx.set(b"w%d" % k, COL, b"x")
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
            with percolite.open(path, sync="none") as again:
                tx = again.transaction()
                value = int(tx.get("counter", COL, b"0"))
                tx.abort()
            assert value == sum(done), (value, done)
        print("ok")
        """,
        tmp_path,
        timeout=60,
    )
    assert out.strip() == "ok"


def test_begin_and_close_race_does_not_crash(tmp_path, run_isolated):
    """Threads that keep beginning transactions while another thread closes the
    store get ClosedError; none may touch LMDB after the environment closed.
    The race window is small, so this repeats open/race/close for a few seconds."""
    out = run_isolated(
        """
        import sys, os, threading, time
        import percolite

        path = os.path.join(sys.argv[1], "store")
        deadline = time.monotonic() + 3
        rounds = 0
        while rounds < 300 or time.monotonic() < deadline:
            rounds += 1
            env = percolite.open(path, sync="none")
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
        print("ok", rounds)
        """,
        tmp_path,
        timeout=60,
    )
    assert out.startswith("ok")
