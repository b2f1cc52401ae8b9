"""Children of test_combine_queue_changes.py: adders and workers running at
once on combine queues, recording every committed report and every add.

The records are those children/combine_queue.py makes (its helpers are used
here); _combine_checks.py says how the tests check the guarantees from them.
"""

from __future__ import annotations

import collections
import json
import random
import threading
import time

import percolite

from children import open_store
from children.combine_queue import K, emit, observer, queued, record, reports, values


def concurrent(backend, db, buckets, buffer, nkeys, txs, adders, preload):
    app = percolite.App()
    cq = app.combine_queue("g", buckets=buckets, buffer_size=buffer)

    @cq.on_change
    def changed(tx, changes):
        record(tx, changes)

    env = open_store(backend, db, app=app, sync="none")
    keys = [f"k{i:03d}" for i in range(nkeys)]
    adds, lock, conflicts = [], threading.Lock(), [0]

    def adder(seed):
        rng = random.Random(seed)
        mine = []
        for i in range(txs):
            pairs = [
                (rng.choice(keys), rng.choice((-2, -1, -1, 1, 1, 2, 3)))
                for _ in range(rng.randint(1, 6))
            ]
            tx = env.transaction()
            cq.add(tx, pairs)
            try:
                tx.commit()
            except percolite.CommitConflict:
                conflicts[0] += 1
                continue
            mine.extend([tx.commit_ts, K(k), d] for k, d in pairs)
            if i % 40 == 39:
                time.sleep(0.003)  # let processing runs interleave with the adds
        with lock:
            adds.extend(mine)

    if preload:
        adder(-1)  # some updates queued before the workers start
    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    threads = [threading.Thread(target=adder, args=(seed,)) for seed in range(adders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # One key goes through zero and back whatever the timing of the random
    # adds, so the old/new chain check always sees a deletion and a return.
    for delta in (1, -1, 1):
        tx = env.transaction()
        cq.add(tx, [("zero", delta)])
        tx.commit()
        adds.append([tx.commit_ts, K("zero"), delta])
        env.wait(timeout=40)
    idle = env.wait(timeout=40)
    o = observer(env, "g")
    env.stop_workers()
    emit(
        adds=adds,
        reports=reports(env),
        final=values(env, cq),
        conflicts=conflicts[0],
        idle=idle,
        queued=queued(env, "g"),
        pending=env.status()["pending"],
        failures=o["failures"],
        commits=o["commits"],
        last_error=o["last_error"],
    )
    env.close()


def hammer(backend, db, nkeys, txs):
    app = percolite.App()
    cq = app.combine_queue("h", buckets=16, buffer_size=512)

    @cq.on_change
    def changed(tx, changes):
        record(tx, changes)

    env = open_store(backend, db, app=app, sync="none")
    keys = [f"w{i:04d}" for i in range(nkeys)]
    cum, total = [], 0.0
    for rank in range(1, nkeys + 1):
        total += 1.0 / rank**1.1
        cum.append(total)
    adds, lock, conflicts, errors = [], threading.Lock(), [0], []

    def adder(seed):
        rng = random.Random(seed)
        mine = []
        try:
            for _ in range(txs):
                # 20 keys per transaction, Zipf-distributed; a key may repeat.
                pairs = [(k, rng.choice((1, -1))) for k in rng.choices(keys, cum_weights=cum, k=20)]
                tx = env.transaction()
                cq.add(tx, pairs)
                try:
                    tx.commit()
                except percolite.CommitConflict:
                    conflicts[0] += 1
                    continue
                mine.extend([tx.commit_ts, K(k), d] for k, d in pairs)
        except BaseException as e:
            errors.append(repr(e))
        with lock:
            adds.extend(mine)

    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    threads = [threading.Thread(target=adder, args=(seed,)) for seed in range(4)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    adding = time.monotonic() - started
    commits_while_adding = observer(env, "h")["commits"]
    idle = env.wait(timeout=40)
    o = observer(env, "h")
    env.stop_workers()
    emit(
        adds=adds,
        reports=reports(env),
        final=values(env, cq),
        conflicts=conflicts[0],
        errors=errors,
        idle=idle,
        queued=queued(env, "h"),
        pending=env.status()["pending"],
        failures=o["failures"],
        commits=o["commits"],
        last_error=o["last_error"],
        adding=adding,
        commits_while_adding=commits_while_adding,
    )
    env.close()


def never_split(backend, db):
    app = percolite.App()
    cq = app.combine_queue("s", buckets=1, buffer_size=5)

    @cq.on_change
    def changed(tx, changes):
        record(tx, changes)

    env = open_store(backend, db, app=app, sync="none")
    adds = []

    def add(pairs):
        tx = env.transaction()
        cq.add(tx, pairs)
        tx.commit()
        adds.extend([tx.commit_ts, K(k), d] for k, d in pairs)

    # Phase 1, all before the workers start: 50 updates of "hot" in 50
    # transactions, interleaved with 3 updates each of 20 other keys.
    others = [f"o{i:02d}" for i in range(20)]
    for i in range(1, 51):
        add([("hot", i)])
        if i <= 20:
            add([(others[i - 1], 1)])
    for k in others:
        add([(k, 2)])
        add([(k, 4)])
    phase1 = {"result": env.process(2)}
    phase1["reports"] = reports(env)
    phase1["final"] = values(env, cq)

    # Phase 2: the same while workers run (a slow change observer stretches runs).
    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    rng = random.Random(5)
    for _ in range(300):
        add([("hot", rng.choice((1, 2, 3)))] + [(rng.choice(others), 1)])
    idle = env.wait(timeout=40)
    o = observer(env, "s")
    env.stop_workers()
    emit(
        phase1=phase1,
        adds=adds,
        reports=reports(env),
        final=values(env, cq),
        idle=idle,
        failures=o["failures"],
        last_error=o["last_error"],
        queued=queued(env, "s"),
    )
    env.close()


def resumed_cursor(backend, db):
    app = percolite.App()
    cq = app.combine_queue("c", buckets=1, buffer_size=2)

    @cq.on_change
    def changed(tx, changes):
        record(tx, changes)
        time.sleep(0.004)  # slow runs: the cursor walks the bucket while adders add

    env = open_store(backend, db, app=app, sync="none")
    keys = [f"k{i:03d}" for i in range(200)]
    adds = []

    def add(pairs):
        tx = env.transaction()
        cq.add(tx, pairs)
        tx.commit()
        adds.extend([tx.commit_ts, K(k), d] for k, d in pairs)

    for start in range(0, 200, 20):
        add([(k, 1) for k in keys[start : start + 20]])

    def cursor_key():
        with env.transaction() as tx:
            value = tx.get("c:b:000000", ("cq:c", "cursor"), b"")
        return value.split(b"\x00")[0].decode() if value else None

    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    behind = 0
    rng = random.Random(3)
    for i in range(150):
        early = keys[i % 10]
        position = cursor_key()
        add([(early, rng.choice((1, 2, -1)))])
        if position is not None and position > early:
            behind += 1
        time.sleep(0.002)
    idle = env.wait(timeout=40)
    o = observer(env, "c")
    env.stop_workers()
    emit(
        adds=adds,
        reports=reports(env),
        final=values(env, cq),
        idle=idle,
        behind=behind,
        failures=o["failures"],
        last_error=o["last_error"],
        queued=queued(env, "c"),
        commits=o["commits"],
    )
    env.close()


def tricky_keys(backend, db):
    app = percolite.App()
    cq = app.combine_queue("b", buckets=1, buffer_size=1, key_codec="bytes")

    @cq.on_change
    def changed(tx, changes):
        tx.set("log", ("r", f"{tx.start_ts:020d}"), json.dumps(len(changes)))

    env = open_store(backend, db, app=app, sync="none")
    keys = [
        b"",
        b"\x00",
        b"\x00\x00",
        b"\x00\x01",
        b"\x01",
        b"a",
        b"a\x00",
        b"a\x00\x01",
        b"a\x01",
        b"ab",
        b"\xff",
        b"\xff\xff",
        b"\x00\xff",
        b"a\xff\x00",
    ]
    totals = collections.Counter()
    rng = random.Random(11)
    for _round in range(3):
        for _ in range(30):
            pairs = [(rng.choice(keys), rng.randint(1, 9)) for _ in range(3)]
            with env.transaction() as tx:
                cq.add(tx, pairs)
            for k, d in pairs:
                totals[k] += d
        result = env.process(2)
    with env.transaction() as tx:
        final = {k.hex(): v for k, v in cq.scan(tx)}
        got = {k.hex(): cq.get(tx, k) for k in keys}
        batches = [json.loads(c.value) for c in tx.scan(prefix="log")]
    emit(
        final=final,
        got=got,
        expected={k.hex(): v for k, v in totals.items()},
        result=result,
        batches=batches,
        queued=queued(env, "b"),
    )
    env.close()


def two_level(backend, db):
    app = percolite.App()
    words = app.combine_queue("w", buckets=4, buffer_size=3)
    hist = app.combine_queue("hist", buckets=2, buffer_size=2, key_codec="int64")

    @words.on_change
    def word_changed(tx, changes):
        record(tx, changes, "w")
        update = collections.Counter()
        for c in changes:
            if c.old is not None:
                update[c.old] -= 1
            if c.new is not None:
                update[c.new] += 1
        hist.add(tx, {count: n for count, n in update.items() if n})

    @hist.on_change
    def hist_changed(tx, changes):
        record(tx, changes, "h")

    env = open_store(backend, db, app=app, sync="none")
    vocabulary = [f"v{i:02d}" for i in range(40)]
    adds, lock = [], threading.Lock()

    def adder(seed):
        rng = random.Random(seed)
        docs, mine = [], []
        for _ in range(150):
            if docs and rng.random() < 0.3:
                doc = docs.pop(rng.randrange(len(docs)))  # remove a document
                update = {w: -n for w, n in doc.items()}
            else:
                doc = collections.Counter(rng.choices(vocabulary, k=rng.randint(1, 8)))
                docs.append(doc)
                update = dict(doc)
            tx = env.transaction()
            words.add(tx, update)
            tx.commit()
            mine.extend([tx.commit_ts, K(w), n] for w, n in update.items())
        with lock:
            adds.extend(mine)

    env.start_workers(2, retry_initial=0.01, retry_max=0.2)
    threads = [threading.Thread(target=adder, args=(seed,)) for seed in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    idle = env.wait(timeout=40)
    status = {q: observer(env, q) for q in ("w", "hist")}
    env.stop_workers()
    emit(
        adds=adds,
        words=values(env, words),
        hist=values(env, hist),
        word_reports=reports(env, "w"),
        hist_reports=reports(env, "h"),
        idle=idle,
        failures={q: o["failures"] for q, o in status.items()},
        errors={q: o["last_error"] for q, o in status.items()},
        queued=queued(env, "w") + queued(env, "hist"),
    )
    env.close()
