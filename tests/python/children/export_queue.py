"""Children of test_export_queue.py: export queues with workers running.

Each child records every exporter call of ``guarded`` in ``calls`` and
applies it to ``sink`` with a seq guard, so the test can check what left the
store (only committed entries), in which order (key then seq within a call,
seq following commit order), and that a seq-guarded sink ends equal to the
reference even when calls fail or repeat. One child runs per process, so
these module globals are its own.
"""

from __future__ import annotations

import json
import random
import threading
import time

import percolite
from percolite.exporters import SQLite

from children import open_store

calls = []  # every exporter call: [[key, value, seq], ...]
sink = {}  # key -> (seq, value): a seq-guarded sink
lock = threading.Lock()


def guarded(entries):
    """Apply entries to ``sink`` with a seq guard; record the call."""
    with lock:
        calls.append([[e.key, e.value, e.seq] for e in entries])
        for e in entries:
            if e.key not in sink or sink[e.key][0] < e.seq:
                sink[e.key] = (e.seq, e.value)


def live(sink):
    return {k: v for k, (s, v) in sink.items() if v is not None}


def observer(env, name):
    for o in env.status()["observers"]:
        if o["name"] == name:
            return o
    raise KeyError(name)


def depth(env, eq):
    with env.transaction() as tx:
        return eq.depth(tx)


def settled(env, timeout=30):
    """Polls until no notification is pending, without env.wait (which
    would hurry lingering runs)."""
    deadline = time.monotonic() + timeout
    while env.status(queues=False)["pending"]:
        assert time.monotonic() < deadline, "still pending"
        time.sleep(0.01)


def emit(**result):
    print(json.dumps(result))


def only_committed_entries(backend, path):
    app = percolite.App()
    eq = app.export_queue("ex", guarded, buckets=4)
    env = open_store(backend, path, app=app, sync="none")

    with env.transaction() as tx:
        eq.add(tx, "committed", 1)
    tx = env.transaction()
    eq.add(tx, "aborted", 2)
    tx.abort()
    try:
        with env.transaction() as tx:
            eq.add(tx, "raised", 3)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    # Two transactions write one cell; both add; the second to commit conflicts.
    a, b = env.transaction(), env.transaction()
    a.set("row", ("f", "q"), "a")
    eq.add(a, "winner", 4)
    b.set("row", ("f", "q"), "b")
    eq.add(b, "loser", 5)
    a.commit()
    try:
        b.commit()
    except percolite.CommitConflict:
        pass
    # env.run retries a conflicting function: only the committed attempt's entry leaves.
    attempts = []

    def body(tx):
        attempts.append(1)
        tx.get("row", ("f", "q"))
        eq.add(tx, f"retried-{len(attempts)}", 6)
        tx.set("row", ("f", "q"), "c")
        if len(attempts) == 1:
            other = env.transaction()
            other.set("row", ("f", "q"), "d")
            other.commit()

    env.run(body)
    assert env.process(threads=2, timeout=30)["idle"]
    emit(
        keys=sorted(k for call in calls for k, _v, _s in call),
        attempts=len(attempts),
        depth=depth(env, eq),
    )


def seq_follows_commit_order(backend, path):
    app = percolite.App()
    eq = app.export_queue("ex", guarded, buckets=3, batch_size=7)
    env = open_store(backend, path, app=app, sync="none")
    committed = []  # [commit_ts, [[key, value, index], ...]]

    def adder(t):
        rng = random.Random(t)
        for i in range(150):

            def body(tx, i=i):
                # read-modify-write of a shared counter makes adders conflict sometimes
                n = int(tx.get("n", ("f", "q")) or 0)
                tx.set("n", ("f", "q"), str(n + 1))
                items = [(f"k{rng.randrange(12)}", [t, i, j]) for j in range(3)]
                for key, value in items:
                    eq.add(tx, key, value)
                return tx, items

            tx, items = env.run(body)
            with lock:
                committed.append([tx.commit_ts, items])

    env.start_workers(threads=3)
    threads = [threading.Thread(target=adder, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert env.wait(timeout=60)
    env.stop_workers()
    emit(calls=calls, committed=committed, depth=depth(env, eq))


def failing_exporter(backend, path):
    broken = [True]

    def export(entries):
        if broken[0]:
            raise ConnectionError("sink is down")
        guarded(entries)

    app = percolite.App()
    eq = app.export_queue("ex", export, buckets=2)
    env = open_store(backend, path, app=app, sync="none")
    with env.transaction() as tx:
        for i in range(20):
            eq.add(tx, f"k{i}", i)
    env.start_workers(threads=2)
    time.sleep(0.3)
    before = observer(env, "export queue ex")
    kept = depth(env, eq)
    reported = env.status()["queues"]
    broken[0] = False
    assert env.wait(timeout=30)
    env.stop_workers()
    after = observer(env, "export queue ex")
    emit(
        failures=before["failures"],
        error=before["last_error"],
        kept=kept,
        reported=reported,
        sink=live(sink),
        depth=depth(env, eq),
        after_pending=after["pending"],
    )


def random_failures(backend, path):
    rng = random.Random(7)
    failed = [0]

    def flaky(entries):
        guarded(entries)  # applied, then (sometimes) fails: a redelivery follows
        with lock:
            fail = rng.random() < 0.3
        if fail:
            failed[0] += 1
            raise OSError("random failure")

    app = percolite.App()
    eq = app.export_queue("ex", flaky, buckets=4, batch_size=16)
    env = open_store(backend, path, app=app, sync="none")
    reference = {}
    env.start_workers(threads=3)

    def adder(t):
        r = random.Random(100 + t)
        for i in range(200):
            key = f"k{r.randrange(40)}"
            value = None if r.random() < 0.1 else [t, i]

            def body(tx, key=key, value=value):
                eq.add(tx, key, value)
                tx.set("last:" + key, ("f", "q"), json.dumps(value))  # serializes per key

            env.run(body)

    threads = [threading.Thread(target=adder, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert env.wait(timeout=60)
    env.stop_workers()
    with env.transaction() as tx:
        for row, _col, value in tx.scan(prefix="last:"):
            v = json.loads(value)
            if v is not None:
                reference[row.decode()[5:]] = v
    delivered = sum(len(c) for c in calls)
    emit(
        sink=live(sink),
        reference=reference,
        failed=failed[0],
        delivered=delivered,
        failures=observer(env, "export queue ex")["failures"],
        ordered=None,
    )


def deletions(backend, path):
    app = percolite.App()
    eq = app.export_queue("ex", guarded, buckets=1)
    env = open_store(backend, path, app=app, sync="none")
    with env.transaction() as tx:
        eq.add(tx, "a", {"x": 1})
        eq.add(tx, "b", [1, 2])
    with env.transaction() as tx:
        eq.add(tx, "a", None)
    env.process(threads=1)
    emit(calls=calls, sink=live(sink))


def change_observer_exports(backend, path):
    app = percolite.App()
    counts = app.combine_queue("counts", buckets=4)
    eq = app.export_queue("out", guarded, buckets=4, key_codec="str", value_codec="int64")

    @counts.on_change
    def changed(tx, changes):
        for c in changes:
            eq.add(tx, c.key, c.new)

    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(threads=3)

    def adder(t):
        r = random.Random(t)
        for _ in range(150):
            updates = {}
            for _ in range(5):
                k = f"w{r.randrange(30)}"
                updates[k] = updates.get(k, 0) + r.choice([1, 1, 2, -1])
            env.run(lambda tx, updates=updates: counts.add(tx, updates))

    threads = [threading.Thread(target=adder, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert env.wait(timeout=60)
    env.stop_workers()
    with env.transaction() as tx:
        final = dict(counts.scan(tx))
    emit(sink=live(sink), final=final)


def young_and_older_bucket(backend, path):
    """A bucket lingering 3 s (a look every 0.75 s): entries 10 ms apart for
    2.2 s (and at least 101) into the new bucket; once they are exported,
    entries 10 ms apart for 1.6 s (and at least 21, at most half as many)
    into the same bucket. The counts hold on a machine too busy to commit
    every 10 ms. Reports, for each call, its size and how many entries had
    been added when it began, and how many each stream added."""
    app = percolite.App()
    added = [0]
    began_at = []

    def exporter(entries):
        began_at.append(added[0])
        guarded(entries)

    eq = app.export_queue("ex", exporter, buckets=1, batch_size=1000, linger=3.0)
    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(2)
    streams = []
    for seconds, least in ((2.2, 101), (1.6, 21)):
        limit = streams[0] // 2 if streams else None
        began, count = time.monotonic(), 0
        while (time.monotonic() - began < seconds or count < least) and count != limit:
            with env.transaction() as tx:
                eq.add(tx, f"k{added[0]:04d}", count)
            added[0] += 1
            count += 1
            time.sleep(0.01)
        streams.append(count)
        settled(env)
    env.stop_workers()
    emit(calls=[len(c) for c in calls], began_at=began_at, streams=streams)


def stream_with_linger(backend, path, linger):
    """20 commits of one entry, 10 ms apart, to a queue with ``linger``."""
    app = percolite.App()
    eq = app.export_queue("ex", guarded, buckets=1, batch_size=1000, linger=linger)
    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(2)
    for i in range(20):
        with env.transaction() as tx:
            eq.add(tx, f"k{i:02d}", i)
        time.sleep(0.01)
    last_add = time.monotonic()
    settled(env)
    drain = time.monotonic() - last_add
    stats = observer(env, "export queue ex")
    env.stop_workers()
    emit(
        calls=[len(c) for c in calls],
        keys=sorted(k for c in calls for k, _v, _s in c),
        deferrals=stats["deferrals"],
        failures=stats["failures"],
        drain=drain,
        linger=eq.linger,
        depth=depth(env, eq),
    )


def linger_never_idles_a_waiter(backend, path):
    app = percolite.App()
    eq = app.export_queue("ex", guarded, buckets=1, batch_size=1000, linger=60)

    @app.observer(("job", "go"), notify=percolite.STRONG)
    def job(tx, row, column):
        time.sleep(0.02)
        eq.add(tx, row.decode(), 1)
        tx.delete(row, column)

    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(1)
    with env.transaction() as tx:
        eq.add(tx, "a", 1)
    time.sleep(0.3)  # the run looks, finds a short batch and defers
    before = observer(env, "export queue ex")["deferrals"]
    began = time.monotonic()
    idle = env.wait(timeout=10)
    first = time.monotonic() - began
    with env.transaction() as tx:
        for i in range(20):
            tx.set(f"j{i:02d}", ("job", "go"), "1")
    began = time.monotonic()
    idle_jobs = env.wait(timeout=10)
    jobs = time.monotonic() - began
    after_wait = [len(c) for c in calls]
    with env.transaction() as tx:  # nobody waits now
        eq.add(tx, "c", 3)
    time.sleep(0.5)
    emit(
        before=before,
        idle=idle,
        first=first,
        idle_jobs=idle_jobs,
        jobs=jobs,
        after_wait=after_wait,
        calls=len(calls),
        depth=depth(env, eq),
    )
    env.stop_workers()


def export_to_under_concurrent_adds(backend, path):
    app = percolite.App()
    counts = app.combine_queue("counts", buckets=8, buffer_size=16)
    eq = app.export_queue(
        "out", guarded, buckets=4, batch_size=32, key_codec="str", value_codec="int64"
    )
    returned = counts.export_to(eq)
    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(threads=2, retry_initial=0.01, retry_max=0.2)

    def adder(t):
        r = random.Random(t)
        for _ in range(200):
            updates = {}
            for _ in range(5):
                k = f"w{r.randrange(40):02d}"
                updates[k] = updates.get(k, 0) + r.choice([1, 1, 2, -1, 3])
            tx = env.transaction()
            counts.add(tx, updates)
            tx.commit()

    threads = [threading.Thread(target=adder, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert env.wait(timeout=60)
    with env.transaction() as tx:
        final = dict(counts.scan(tx))
    sink_then = live(sink)
    # Bring five keys to exactly zero: the native sum deletes them.
    zeroed = sorted(final)[:5]
    seq_before = {k: sink[k][0] for k in zeroed}
    with env.transaction() as tx:
        counts.add(tx, {k: -final[k] for k in zeroed})
    assert env.wait(timeout=60)
    env.stop_workers()
    with env.transaction() as tx:
        after = dict(counts.scan(tx))
    emit(
        returned_same=returned is eq,
        final=final,
        sink_then=sink_then,
        after=after,
        sink_after=live(sink),
        zeroed=zeroed,
        deletions={k: [sink[k][1], sink[k][0] > seq_before[k]] for k in zeroed},
        delivered=sum(len(c) for c in calls),
        calls=len(calls),
        depth=depth(env, eq),
        failures=[
            observer(env, n)["failures"] for n in ("combine queue counts", "export queue out")
        ],
    )


def export_to_while_workers_run(backend, path):
    app = percolite.App()
    counts = app.combine_queue("counts", buckets=2)
    eq = app.export_queue("out", guarded, key_codec="str", value_codec="int64")
    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(1)
    try:
        counts.export_to(eq)
        error = None
    except percolite.Error as e:
        error = str(e)
    with env.transaction() as tx:
        counts.add(tx, {"before": 1})
    assert env.wait(timeout=30)
    env.stop_workers()
    nothing = list(calls)
    counts.export_to(eq)  # allowed once the workers are stopped
    with env.transaction() as tx:
        counts.add(tx, {"after": 2})
    result = env.process(threads=1, timeout=30)
    emit(error=error, nothing=nothing, sink=live(sink), idle=result["idle"])


def export_to_from_aborted_runs(backend, path):
    failing = threading.Event()
    failing.set()
    app = percolite.App()
    counts = app.combine_queue("counts", buckets=2)
    eq = app.export_queue("out", guarded, buckets=2, key_codec="str", value_codec="int64")
    counts.export_to(eq)

    @counts.on_change
    def changed(tx, changes):
        if failing.is_set():
            raise ValueError("observer says no")

    env = open_store(backend, path, app=app, sync="none")
    with env.transaction() as tx:
        counts.add(tx, {"a": 1, "b": 2, "c": 3})
    env.start_workers(2, retry_initial=0.01, retry_max=0.1)
    deadline = time.monotonic() + 20
    while observer(env, "combine queue counts")["failures"] < 6:
        assert time.monotonic() < deadline, "the change observer never failed"
        time.sleep(0.01)
    with env.transaction() as tx:
        during = {
            "depth": eq.depth(tx),
            "queued": counts.depth(tx),
            "values": dict(counts.scan(tx)),
        }
    during["calls"] = list(calls)
    o = observer(env, "combine queue counts")
    failing.clear()
    assert env.wait(timeout=30)
    env.stop_workers()
    with env.transaction() as tx:
        final = dict(counts.scan(tx))
    emit(
        during=during,
        failures=o["failures"],
        error=o["last_error"],
        final=final,
        sink=live(sink),
        delivered=sorted(k for c in calls for k, _v, _s in c),
        depth=depth(env, eq),
    )


def sqlite_sink(backend, path, sink_file):
    """Three adder threads commit entries (values and deletions of 50 keys)
    while two worker threads export them into table "kv" of the SQLite file
    ``sink_file`` through percolite.exporters.SQLite; a quarter of the calls
    fail after SQLite committed the batch, so it is delivered again. Each
    adder also leaves entries in aborted and in conflicting transactions,
    which must never reach the file. Emits every committed transaction's
    [commit_ts, [[key, value], ...]] and the queue's state after the wait."""
    exporter = SQLite(sink_file, "kv", key="k", columns="v")
    rng = random.Random(11)
    failed = [0]

    def export(entries):
        exporter(entries)
        with lock:
            fail = rng.random() < 0.25
        if fail:
            failed[0] += 1
            raise OSError("the sink's acknowledgement was lost")

    app = percolite.App()
    eq = app.export_queue("kv", export, buckets=4, batch_size=20, value_codec="int64")
    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(threads=2)
    committed, errors = [], []

    def adder(t):
        r = random.Random(200 + t)
        try:
            for i in range(150):
                items = {
                    f"k{r.randrange(50):02d}": None if r.random() < 0.15 else t * 1000 + i
                    for _ in range(r.randint(1, 4))
                }

                def body(tx, items=items):
                    for key, value in items.items():
                        eq.add(tx, key, value)
                    return tx

                tx = env.run(body)
                with lock:
                    committed.append([tx.commit_ts, list(items.items())])
                if i % 15 == 0:
                    aborted = env.transaction()
                    eq.add(aborted, f"aborted-{t}-{i}", i)
                    aborted.abort()
                    winner, loser = env.transaction(), env.transaction()
                    for tx, name in ((winner, "winner"), (loser, "loser")):
                        tx.set(f"race-{t}", ("f", "q"), name)
                    eq.add(loser, f"conflicted-{t}-{i}", i)
                    winner.commit()
                    try:
                        loser.commit()
                        errors.append("the second writer of one cell committed")
                    except percolite.CommitConflict:
                        pass
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=adder, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    idle = env.wait(timeout=60)
    env.stop_workers()
    emit(
        committed=committed,
        errors=errors,
        idle=idle,
        failed=failed[0],
        failures=observer(env, "export queue kv")["failures"],
        depth=depth(env, eq),
        pending=env.status()["pending"],
    )
    env.close()
    exporter.close()


class _Turns:
    """An exporter that counts the calls going at once per sink name."""

    going: dict = {}
    most: dict = {}
    calls: dict = {}

    def __init__(self, exclusive_sink, label):
        self.exclusive_sink = exclusive_sink
        self.label = label

    def __call__(self, entries):
        name = self.exclusive_sink or self.label
        with lock:
            going = self.going[name] = self.going.get(name, 0) + 1
            self.most[name] = max(self.most.get(name, 0), going)
            self.calls[self.label] = self.calls.get(self.label, 0) + 1
        time.sleep(0.01)  # long enough for the other threads to start calls
        with lock:
            self.going[name] -= 1


class _ForwardsTo:
    """A forwarding exporter (forward_to()): its sink is learnt from its target."""

    def __init__(self, target):
        self.target = target

    def __call__(self, entries):
        self.forward_to()(entries)

    def forward_to(self):
        return self.target


def exclusive_sinks_take_turns(backend, path):
    """Queues "one" and "two" (a forwarder) write sink "s"; "free" and
    "loose" name none. Four worker threads, batches of 5."""
    app = percolite.App()
    one = app.export_queue("one", _Turns("s", "one"), buckets=4, batch_size=5)
    two = app.export_queue("two", _ForwardsTo(_Turns("s", "two")), buckets=4, batch_size=5)
    free = app.export_queue("free", _Turns(None, "free"), buckets=4, batch_size=5)
    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(4)
    with env.transaction() as tx:  # the forwarder's first batch names its sink
        two.add(tx, "first", 1)
    assert env.wait(timeout=30)
    _Turns.most.clear()
    for start in range(0, 200, 20):
        with env.transaction() as tx:
            for i in range(start, start + 20):
                for queue in (one, two, free):
                    queue.add(tx, f"k{i:03d}", i)
    idle = env.wait(timeout=60)
    emit(
        idle=idle,
        most=_Turns.most,
        calls=_Turns.calls,
        left=sum(depth(env, q) for q in (one, two, free)),
    )
    env.stop_workers()
