"""Children of test_combine_queue.py and test_combine_queue_linger.py: combine
queues with workers running (children/combine_queue_changes.py has those of
test_combine_queue_changes.py, and uses the helpers here).

Every change observer here records each reported ``Change`` as a cell written
inside the processing transaction (row ``log:<tag>:<json key>``, qualifier =
the processing transaction's ``start_ts``, value = ``[old, new]``), so exactly
the reports of committed runs are kept; adders record the ``commit_ts`` of
each transaction with its updates. _combine_checks.py says how the tests
check the guarantees from these records.
"""

from __future__ import annotations

import json
import random
import threading
import time

import percolite
from percolite._queue_rows import queue_depth

from children import open_store

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

K = json.dumps  # how a key is named in the JSON a child prints


def record(tx, changes, tag="r"):
    """Change observer body: one cell per reported change, committed with the
    new values (so only committed runs leave a report)."""
    for c in changes:
        tx.set(f"log:{tag}:{K(c.key)}", ("r", f"{tx.start_ts:020d}"), json.dumps([c.old, c.new]))


def reports(env, tag="r"):
    """{key name: [[start_ts, old, new], ...]} in start_ts order."""
    out = {}
    prefix = (f"log:{tag}:").encode()
    with env.transaction() as tx:
        for row, column, value in tx.scan(prefix=prefix):
            out.setdefault(row[len(prefix) :].decode(), []).append(
                [int(column.qualifier), *json.loads(value)]
            )
    return out


def values(env, cq):
    with env.transaction() as tx:
        return {K(k): v for k, v in cq.scan(tx)}


def queued(env, queue_id):
    """How many queued (not yet consumed) updates the queue has (a packed
    record holds several: percolite._queue_rows)."""
    with env.transaction() as tx:
        return queue_depth(tx, (queue_id + ":u:").encode())


def observer(env, queue_id):
    for o in env.status()["observers"]:
        if o["name"] == "combine queue " + queue_id:
            return o
    raise KeyError(queue_id)


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout} s")
        time.sleep(0.005)


def emit(**result):
    print(json.dumps(result))


def native(backend, db, phases):
    app = percolite.App()
    queues = {
        "isum": app.combine_queue("isum", buckets=4, buffer_size=2),
        "fsum": app.combine_queue("fsum", buckets=4, value_codec="float64"),
        "tsum": app.combine_queue("tsum", buckets=4, value_codec="int64s:2"),
        "imax": app.combine_queue("imax", combiner="max"),
        "imin": app.combine_queue("imin", combiner="min"),
        "fmax": app.combine_queue("fmax", combiner="max", value_codec="float64"),
        "fmin": app.combine_queue("fmin", combiner="min", value_codec="float64"),
        "tmax": app.combine_queue("tmax", combiner="max", value_codec="int64s:2"),
        "tmin": app.combine_queue("tmin", combiner="min", value_codec="int64s:2"),
        "ilast": app.combine_queue("ilast", combiner="last", buckets=2, buffer_size=1),
        "slast": app.combine_queue("slast", combiner="last", value_codec="str"),
        "jlast": app.combine_queue("jlast", combiner="last", value_codec="json"),
    }
    for name, q in queues.items():
        q.on_change(lambda tx, changes, name=name: record(tx, changes, name))

    env = open_store(backend, db, app=app, sync="none")

    def phase(adds):
        """adds: [(queue, [(key, value), ...]), ...], one transaction each."""
        for name, pairs in adds:
            with env.transaction() as tx:
                queues[name].add(tx, pairs)
        result = env.process(2)
        with env.transaction() as tx:
            state = {name: {K(k): v for k, v in q.scan(tx)} for name, q in queues.items()}
        return {"result": result, "values": state}

    out = {}
    for i, adds in enumerate(phases):
        out[f"phase{i}"] = phase([(n, [tuple(p) for p in pairs]) for n, pairs in adds])
    out["reports"] = {name: reports(env, name) for name in queues}
    emit(**out)
    env.close()


def overflow(backend, db):
    app = percolite.App()
    ov = app.combine_queue("ov", buckets=8)
    ovt = app.combine_queue("ovt", buckets=1, value_codec="int64s:2")
    fine = app.combine_queue("fine", buckets=1)
    env = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        ov.add(tx, {"big": INT64_MAX, "small": INT64_MIN})
        ovt.add(tx, {"t": (0, INT64_MAX)})
    before = env.process(2)
    with env.transaction() as tx:
        ov.add(tx, {"big": 1, "small": -1})
        ovt.add(tx, {"t": (5, 1)})
        fine.add(tx, {"x": 3})
    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    wait_for(lambda: observer(env, "ov")["failures"] >= 4 and observer(env, "ovt")["failures"] >= 2)
    idle = env.wait(timeout=0.5)
    status = {q: observer(env, q) for q in ("ov", "ovt", "fine")}
    env.stop_workers()
    with env.transaction() as tx:
        got = {
            "big": ov.get(tx, "big"),
            "small": ov.get(tx, "small"),
            "t": ovt.get(tx, "t"),
            "x": fine.get(tx, "x"),
        }
    emit(
        before=before,
        idle=idle,
        got=got,
        pending=env.status()["pending"],
        failing_buckets=len({ov.bucket_of("big"), ov.bucket_of("small")}) + 1,
        queued={q: queued(env, q) for q in ("ov", "ovt", "fine")},
        failures={q: o["failures"] for q, o in status.items()},
        errors={q: o["last_error"] for q, o in status.items()},
    )
    env.close()


def python_combiner(backend, db):
    failing = threading.Event()
    failing.set()

    app = percolite.App()

    def total(key, values):
        if failing.is_set():
            raise RuntimeError(f"combiner exploded on {key}")
        return sum(values) or None  # None deletes the key

    def wrong_type(key, values):
        return "not an int"

    pyq = app.combine_queue("py", buckets=3, buffer_size=2, combiner=total)
    bad = app.combine_queue("bad", buckets=1, combiner=wrong_type)

    @pyq.on_change
    def changed(tx, changes):
        record(tx, changes)

    env = open_store(backend, db, app=app, sync="none")
    keys = [f"p{i:02d}" for i in range(12)]
    adds = []
    rng = random.Random(9)

    def add_some(n):
        for _ in range(n):
            pairs = [(rng.choice(keys), rng.choice((-1, 1, 2))) for _ in range(3)]
            tx = env.transaction()
            pyq.add(tx, pairs)
            tx.commit()
            adds.extend([tx.commit_ts, K(k), d] for k, d in pairs)

    add_some(40)
    with env.transaction() as tx:
        bad.add(tx, {"k": 1})
    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    add_some(40)  # more updates while the combiner fails
    wait_for(lambda: observer(env, "py")["failures"] >= 5 and observer(env, "bad")["failures"] >= 1)
    failing_status = observer(env, "py")
    bad_status = observer(env, "bad")
    during = {
        "values": values(env, pyq),
        "queued": queued(env, "py"),
        "pending": env.status()["pending"],
    }
    failing.clear()
    add_some(40)
    wait_for(lambda: queued(env, "py") == 0)
    # Bring two keys back to zero: the combiner's None result deletes them.
    for key in ("p00", "p01"):
        with env.transaction() as tx:
            current = pyq.get(tx, key, 0)
        tx = env.transaction()
        pyq.add(tx, {key: -current})
        tx.commit()
        adds.append([tx.commit_ts, K(key), -current])
    wait_for(lambda: queued(env, "py") == 0)
    env.stop_workers()
    emit(
        adds=adds,
        reports=reports(env),
        final=values(env, pyq),
        during=during,
        failures=failing_status["failures"],
        last_error=failing_status["last_error"],
        bad_failures=bad_status["failures"],
        bad_error=bad_status["last_error"],
        queued=queued(env, "py"),
    )
    env.close()


def commit_order(backend, db):
    app = percolite.App()
    seen = []

    def concat(key, values):
        seen.append(len(values))
        return [x for v in values for x in v]

    q = app.combine_queue("o", buckets=2, buffer_size=3, combiner=concat, value_codec="json")
    env = open_store(backend, db, app=app, sync="none")
    adds, lock = [], threading.Lock()

    def adder(name):
        mine = []
        for i in range(150):
            key = f"k{i % 4}"
            tx = env.transaction()
            q.add(tx, {key: [f"{name}{i:03d}"]})
            tx.commit()
            mine.append([tx.commit_ts, key, f"{name}{i:03d}"])
            if i % 30 == 0:
                time.sleep(0.002)
        with lock:
            adds.extend(mine)

    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    threads = [threading.Thread(target=adder, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    idle = env.wait(timeout=40)
    o = observer(env, "o")
    env.stop_workers()
    with env.transaction() as tx:
        final = dict(q.scan(tx))
    emit(
        adds=adds,
        final=final,
        idle=idle,
        failures=o["failures"],
        last_error=o["last_error"],
        max_values=max(seen),
    )
    env.close()


def on_change_fails(backend, db):
    failing = threading.Event()
    failing.set()
    app = percolite.App()
    q = app.combine_queue("f", buckets=2)

    @q.on_change
    def changed(tx, changes):
        record(tx, changes)
        if failing.is_set():
            raise ValueError("observer says no")

    env = open_store(backend, db, app=app, sync="none")
    with env.transaction() as tx:
        q.add(tx, {"a": 1, "b": 2, "c": 3})
    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    wait_for(lambda: observer(env, "f")["failures"] >= 4)
    o = observer(env, "f")
    during = {"values": values(env, q), "reports": reports(env), "queued": queued(env, "f")}
    with env.transaction() as tx:
        q.add(tx, {"a": 10})
    failing.clear()
    idle = env.wait(timeout=20)
    env.stop_workers()
    emit(
        during=during,
        failures=o["failures"],
        last_error=o["last_error"],
        idle=idle,
        final=values(env, q),
        reports=reports(env),
    )
    env.close()


def get_scan_and_layout(backend, db):
    app = percolite.App()
    q = app.combine_queue("lay", buckets=5)
    env = open_store(backend, db, app=app, sync="none")
    keys = ["apple", "apricot", "banana", "", "äpfel"]
    with env.transaction() as tx:
        q.add(tx, {k: i + 1 for i, k in enumerate(keys)})
        q.add(tx, [("apple", 10)])  # a second update of a key in one transaction
    with env.transaction() as tx:
        before = {
            "get": q.get(tx, "apple"),
            "default": q.get(tx, "apple", -1),
            "scan": list(q.scan(tx)),
        }
        rows = sorted({c.row.decode() for c in tx.scan(prefix="lay:u:")})
    buckets = sorted({f"lay:u:{q.bucket_of(k):06d}" for k in keys})
    pending = env.status()["pending"]
    result = env.process(2)
    with env.transaction() as tx:
        after = {
            "get": {k: q.get(tx, k) for k in keys},
            "missing": q.get(tx, "nope", "d"),
            "scan": list(q.scan(tx)),
            "ap": list(q.scan(tx, prefix="ap")),
            "empty": list(q.scan(tx, prefix="zzz")),
        }
    emit(
        before=before,
        rows=rows,
        buckets=buckets,
        pending=pending,
        result=result,
        after=after,
        queued=queued(env, "lay"),
    )
    env.close()


def register_while_workers_run(backend, db):
    app = percolite.App()
    q = app.combine_queue("r1")
    env = open_store(backend, db, app=app, sync="none")
    env.start_workers(1)
    errors = {}
    try:
        app.combine_queue("r2")
    except percolite.Error as e:
        errors["queue"] = str(e)
    try:
        q.on_change(lambda tx, changes: None)
    except percolite.Error as e:
        errors["on_change"] = str(e)
    env.stop_workers()
    # Nothing of the refused registrations was kept: both work now.
    app.combine_queue("r2")
    q.on_change(lambda tx, changes: None)
    result = env.process(1)
    emit(errors=errors, names=[o["name"] for o in env.status()["observers"]], idle=result["idle"])
    env.close()


def stream_with_linger(backend, path, linger):
    """20 commits adding 1 to one key. Without ``linger``, each waits until
    the one before is folded (it arrives at an idle bucket). With it, the
    first waits until the bucket's run deferred itself (its first look), and
    the other 19 follow, 10 ms apart, while the bucket lingers."""
    app = percolite.App()
    cq = app.combine_queue("hot", buckets=1, linger=linger)
    cq.on_change(lambda tx, changes: record(tx, changes))
    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(2)
    for i in range(20):
        with env.transaction() as tx:
            cq.add(tx, {"k": 1})
        if not linger:
            wait_for(lambda i=i: values(env, cq).get(K("k")) == i + 1)
        elif i == 0:
            wait_for(lambda: observer(env, "hot")["deferrals"] >= 1)
        else:
            time.sleep(0.01)
    # Polled, not env.wait: a wait would hurry the lingering run.
    wait_for(lambda: env.status(queues=False)["pending"] == 0)
    stats = observer(env, "hot")
    env.stop_workers()
    emit(
        values=values(env, cq),
        reports=reports(env),
        runs=stats["commits"],
        deferrals=stats["deferrals"],
        linger=cq.linger,
    )


def wait_does_not_linger(backend, path):
    app = percolite.App()
    cq = app.combine_queue("hot", buckets=1, linger=60)
    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(2)
    with env.transaction() as tx:
        cq.add(tx, {"k": 5})
    wait_for(lambda: observer(env, "hot")["deferrals"] >= 1)
    before = observer(env, "hot")["deferrals"]
    began = time.monotonic()
    idle = env.wait(timeout=10)
    emit(
        idle=idle,
        seconds=time.monotonic() - began,
        values=values(env, cq),
        queued=queued(env, "hot"),
        before=before,
        deferrals=observer(env, "hot")["deferrals"],
    )
    env.stop_workers()


def waiters_and_adders(backend, path):
    app = percolite.App()
    cq = app.combine_queue("hot", buckets=4, linger=5)
    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(4)
    adding = threading.Event()
    adding.set()
    waits = []

    def adder(n):
        for i in range(150):
            with env.transaction() as tx:
                cq.add(tx, {f"k{i % 7}": 1, f"t{n}": 1})
            time.sleep(0.002)

    def waiter():
        while adding.is_set():
            waits.append(env.wait(timeout=20))

    adders = [threading.Thread(target=adder, args=(n,)) for n in range(4)]
    waiters = [threading.Thread(target=waiter) for _ in range(3)]
    for t in adders + waiters:
        t.start()
    for t in adders:
        t.join()
    adding.clear()
    for t in waiters:
        t.join()
    began = time.monotonic()
    idle = env.wait(timeout=20)
    emit(
        idle=idle,
        last_wait=time.monotonic() - began,
        waits=len(waits),
        all_idle=all(waits),
        values=values(env, cq),
        queued=queued(env, "hot"),
    )
    env.stop_workers()


def most_scans(seconds):
    """The most scans the scanner may begin in ``seconds`` while each of its
    scans finds only work the pool holds and is not running (workers.h
    "Finding work"): after such a scan it pauses ``SCAN_PAUSE_FIRST``, then
    twice as long each time up to ``SCAN_PAUSE_MAX``, whatever commits wake it
    meanwhile. Counted from a scan right after a reset of the pause: the scans
    that fit in the doubling pauses, then one per ``SCAN_PAUSE_MAX``. Pauses
    are sleeps, so a slow machine only makes them longer and the scans fewer."""
    first, most = percolite._core.SCAN_PAUSE_FIRST, percolite._core.SCAN_PAUSE_MAX
    doubling, pause = 0, first
    while pause < most:
        doubling += 1
        pause *= 2
    return doubling + seconds / most


def _workers_idle(env):
    """No run going or committing (the lingering bucket waits deferred)."""
    stats = env._core.worker_stats()
    return stats["active"] == 0 and stats["committing"] == 0


def _run_to_its_commit(env, n):
    """Commits a cell the observer "seen" watches, and waits until its run
    committed (the ``n``-th before) and nothing runs."""
    with env.transaction() as tx:
        tx.set(f"run{n}", ("f", "q"), "v")

    def committed():
        seen = next(o for o in env.status()["observers"] if o["name"] == "seen")
        return seen["commits"] > n and _workers_idle(env)

    wait_for(committed)


def _stream(env, n, at_least, deadline):
    """Commits of a column no observer watches (no notification, but each
    wakes the scanner), one after another, until ``at_least`` seconds passed
    and there were more than twice as many commits as ``most_scans`` of the
    time (so a scan after every commit would exceed it); ``deadline`` only
    guards against a hang. Returns the commits, the scans begun meanwhile and
    the seconds, measured around the two reads of the scan count."""
    began = time.monotonic()
    before = env._core.worker_stats()["scans"]
    commits = 0
    while True:
        with env.transaction() as tx:
            tx.set(f"stream{n}:{commits}", ("f", "u"), "v")
        commits += 1
        scans = env._core.worker_stats()["scans"] - before
        seconds = time.monotonic() - began
        enough = seconds >= at_least and commits > 2 * most_scans(seconds)
        if enough or time.monotonic() > deadline:
            return {"commits": commits, "scans": scans, "seconds": seconds}


def scans_while_lingering(backend, path, observed):
    """A bucket lingering an hour keeps its notification pending, and known
    to the workers (its next look is 15 minutes away), while a stream of
    commits wakes the scanner. With ``observed``, four streams, each after a
    commit that starts a run of an observer: the stream begins once that run
    committed, so none of its scans can see a run going (such a scan rescans
    on the next wake, and how many there are depends on how fast runs go)."""
    app = percolite.App()
    cq = app.combine_queue("hot", buckets=1, linger=3600)
    if observed:
        app.observer(("f", "q"), notify=percolite.STRONG, name="seen")(lambda tx, row, col: None)
    env = open_store(backend, path, app=app, sync="none")
    env.start_workers(2)
    with env.transaction() as tx:
        cq.add(tx, {"k": 5})
    wait_for(lambda: observer(env, "hot")["deferrals"] >= 1 and _workers_idle(env))
    deadline = time.monotonic() + 60  # a hang guard: a stream takes about a second
    streams = []
    for n in range(4 if observed else 1):
        if observed:
            _run_to_its_commit(env, n)
        streams.append(_stream(env, n, 0.25 if observed else 1.0, deadline))
    emit(streams=streams, queued=queued(env, "hot"))
    env.stop_workers()
