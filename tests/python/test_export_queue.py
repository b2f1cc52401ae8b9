"""The export queue (design.md section 6; seed 003; contract in
cpp/include/percolite/export_queue.h).

Anything that runs workers runs in a child interpreter with a timeout
(``_isolated.run_isolated_json``); the children print JSON and the checks run
here. Children record every exporter call, so the tests can check what left
the store (only committed entries), in which order (key then seq within a
call, seq following commit order), and that a seq-guarded sink ends equal to
the reference even when calls fail or repeat.
"""

from __future__ import annotations

import textwrap

import percolite
import pytest
from _isolated import run_isolated_json

CHILD = r'''
import json, random, threading, time
import percolite

calls = []          # every exporter call: [[key, value, seq], ...]
sink = {}           # key -> (seq, value): a seq-guarded sink
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


def emit(**result):
    print(json.dumps(result))
'''


def child(code: str, timeout: float = 60, **params):
    return run_isolated_json(CHILD + textwrap.dedent(code), timeout=timeout, **params)


def per_call_order_ok(calls):
    return all(
        [(k, s) for k, _v, s in call] == sorted((k, s) for k, _v, s in call) for call in calls
    )


def test_only_committed_entries_are_exported(tmp_path):
    out = child(
        """
        app = percolite.App()
        eq = app.export_queue("ex", guarded, buckets=4)
        env = percolite.open(path, app=app, sync="none")

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
        a.set("row", ("f", "q"), "a"); eq.add(a, "winner", 4)
        b.set("row", ("f", "q"), "b"); eq.add(b, "loser", 5)
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
            eq.add(tx, "retried-%d" % len(attempts), 6)
            tx.set("row", ("f", "q"), "c")
            if len(attempts) == 1:
                other = env.transaction()
                other.set("row", ("f", "q"), "d")
                other.commit()
        env.run(body)
        assert env.process(threads=2, timeout=30)["idle"]
        emit(keys=sorted(k for call in calls for k, _v, _s in call), attempts=len(attempts),
             depth=depth(env, eq))
        """,
        path=str(tmp_path / "db"),
    )
    assert out["attempts"] == 2
    assert out["keys"] == ["committed", "retried-2", "winner"]
    assert out["depth"] == 0


def test_seq_follows_commit_order_and_calls_are_ordered(tmp_path):
    out = child(
        """
        app = percolite.App()
        eq = app.export_queue("ex", guarded, buckets=3, batch_size=7)
        env = percolite.open(path, app=app, sync="none")
        committed = []   # [commit_ts, [[key, value, index], ...]]
        def adder(t):
            rng = random.Random(t)
            for i in range(150):
                def body(tx):
                    # read-modify-write of a shared counter makes adders conflict sometimes
                    n = int(tx.get("n", ("f", "q")) or 0)
                    tx.set("n", ("f", "q"), str(n + 1))
                    items = [("k%d" % rng.randrange(12), [t, i, j]) for j in range(3)]
                    for key, value in items:
                        eq.add(tx, key, value)
                    return tx, items
                tx, items = env.run(body)
                with lock:
                    committed.append([tx.commit_ts, items])
        env.start_workers(threads=3)
        threads = [threading.Thread(target=adder, args=(t,)) for t in range(4)]
        for th in threads: th.start()
        for th in threads: th.join()
        assert env.wait(timeout=60)
        env.stop_workers()
        emit(calls=calls, committed=committed, depth=depth(env, eq))
        """,
        path=str(tmp_path / "db"),
    )
    calls, committed = out["calls"], out["committed"]
    assert out["depth"] == 0
    assert per_call_order_ok(calls)
    # seq = commit_ts << 20 | index among the transaction's stamped writes.
    expected = {}
    for commit_ts, items in committed:
        for index, (key, value) in enumerate(items):
            expected[(commit_ts << percolite._export.SEQ_INDEX_BITS) | index] = (key, value)
    delivered = {s: (k, v) for call in calls for k, v, s in call}
    assert delivered == expected  # everything committed left, nothing else did
    # For one key, a later commit has a larger seq, and deliveries never go back.
    seen = {}
    for call in calls:
        for key, _value, seq in call:
            assert seq > seen.get(key, -1) or (seq, key) in {(s, k) for k, _v, s in call}
            seen[key] = max(seen.get(key, -1), seq)
    commit_order = sorted(committed)
    for key in {k for _ts, items in committed for k, _v in items}:
        seqs = [
            (ts << 20) | i
            for ts, items in commit_order
            for i, (k, _v) in enumerate(items)
            if k == key
        ]
        assert seqs == sorted(seqs)


def test_failing_exporter_is_retried_and_visible_in_status(tmp_path):
    out = child(
        """
        broken = [True]
        def export(entries):
            if broken[0]:
                raise ConnectionError("sink is down")
            guarded(entries)
        app = percolite.App()
        eq = app.export_queue("ex", export, buckets=2)
        env = percolite.open(path, app=app, sync="none")
        with env.transaction() as tx:
            for i in range(20):
                eq.add(tx, "k%d" % i, i)
        env.start_workers(threads=2)
        time.sleep(0.3)
        before = observer(env, "export queue ex")
        kept = depth(env, eq)
        reported = env.status()["queues"]
        broken[0] = False
        assert env.wait(timeout=30)
        env.stop_workers()
        after = observer(env, "export queue ex")
        emit(failures=before["failures"], error=before["last_error"], kept=kept, reported=reported,
             sink=live(sink), depth=depth(env, eq), after_pending=after["pending"])
        """,
        path=str(tmp_path / "db"),
    )
    assert out["failures"] >= 2
    assert "ConnectionError: sink is down" in out["error"]
    assert "Traceback" in out["error"]
    assert out["kept"] == 20
    assert out["reported"] == {"ex": 20}
    assert out["sink"] == {f"k{i}": i for i in range(20)}
    assert out["depth"] == 0 and out["after_pending"] == 0


def test_random_failures_and_redelivery_end_equal_to_the_reference(tmp_path):
    out = child(
        """
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
        env = percolite.open(path, app=app, sync="none")
        reference = {}
        env.start_workers(threads=3)
        def adder(t):
            r = random.Random(100 + t)
            for i in range(200):
                key = "k%d" % r.randrange(40)
                value = None if r.random() < 0.1 else [t, i]
                def body(tx):
                    eq.add(tx, key, value)
                    tx.set("last:" + key, ("f", "q"), json.dumps(value))  # serializes per key
                env.run(body)
        threads = [threading.Thread(target=adder, args=(t,)) for t in range(4)]
        for th in threads: th.start()
        for th in threads: th.join()
        assert env.wait(timeout=60)
        env.stop_workers()
        with env.transaction() as tx:
            for row, _col, value in tx.scan(prefix="last:"):
                v = json.loads(value)
                if v is not None:
                    reference[row.decode()[5:]] = v
        delivered = sum(len(c) for c in calls)
        emit(sink=live(sink), reference=reference, failed=failed[0], delivered=delivered,
             failures=observer(env, "export queue ex")["failures"], ordered=None)
        """,
        path=str(tmp_path / "db"),
        timeout=120,
    )
    assert out["failed"] > 5 and out["failures"] == out["failed"]
    assert out["delivered"] > 800  # every failed call is delivered again
    assert out["sink"] == out["reference"]


def test_deletions_export_none(tmp_path):
    out = child(
        """
        app = percolite.App()
        eq = app.export_queue("ex", guarded, buckets=1)
        env = percolite.open(path, app=app, sync="none")
        with env.transaction() as tx:
            eq.add(tx, "a", {"x": 1})
            eq.add(tx, "b", [1, 2])
        with env.transaction() as tx:
            eq.add(tx, "a", None)
        env.process(threads=1)
        emit(calls=calls, sink=live(sink))
        """,
        path=str(tmp_path / "db"),
    )
    flat = [[k, v] for call in out["calls"] for k, v, _s in call]
    assert flat == [["a", {"x": 1}], ["a", None], ["b", [1, 2]]] or flat == [
        ["a", {"x": 1}],
        ["b", [1, 2]],
        ["a", None],
    ]
    assert out["sink"] == {"b": [1, 2]}


def test_change_observer_exports_atomically_with_the_new_values(tmp_path):
    """The pipeline phrasecount uses: combine queue -> on_change -> export queue."""
    out = child(
        """
        app = percolite.App()
        counts = app.combine_queue("counts", buckets=4)
        eq = app.export_queue("out", guarded, buckets=4, key_codec="str", value_codec="int64")
        @counts.on_change
        def changed(tx, changes):
            for c in changes:
                eq.add(tx, c.key, c.new)
        env = percolite.open(path, app=app, sync="none")
        env.start_workers(threads=3)
        def adder(t):
            r = random.Random(t)
            for i in range(150):
                updates = {}
                for _ in range(5):
                    k = "w%d" % r.randrange(30)
                    updates[k] = updates.get(k, 0) + r.choice([1, 1, 2, -1])
                env.run(lambda tx: counts.add(tx, updates))
        threads = [threading.Thread(target=adder, args=(t,)) for t in range(4)]
        for th in threads: th.start()
        for th in threads: th.join()
        assert env.wait(timeout=60)
        env.stop_workers()
        with env.transaction() as tx:
            final = dict(counts.scan(tx))
        emit(sink=live(sink), final=final)
        """,
        path=str(tmp_path / "db"),
        timeout=120,
    )
    assert out["final"]
    assert out["sink"] == out["final"]


# -- declaration and bad input -------------------------------------------------


def test_decorator_form_returns_the_queue():
    app = percolite.App()

    @app.export_queue("ex", buckets=3, batch_size=5)
    def ex(entries):
        pass

    assert isinstance(ex, percolite.ExportQueue)
    assert (ex.id, ex.buckets, ex.batch_size) == ("ex", 3, 5)
    assert 0 <= ex.bucket_of("key") < 3
    assert "ex" in repr(ex)


@pytest.mark.parametrize(
    "kwargs, kind, message",
    [
        (dict(queue_id="a:b"), ValueError, "reserves"),
        (dict(queue_id=""), ValueError, "must not be empty"),
        (dict(queue_id=5), TypeError, "id must be a str"),
        (dict(buckets=0), ValueError, "buckets must be between"),
        (dict(buckets=2.5), TypeError, "buckets must be an int"),
        (dict(batch_size=0), ValueError, "batch_size must be between"),
        (dict(batch_size=True), TypeError, "batch_size must be an int"),
        (dict(key_codec="nope"), ValueError, "key_codec"),
        (dict(value_codec=3), TypeError, "value_codec"),
        (dict(exporter=42), TypeError, "exporter must be callable"),
        (dict(exporter=lambda: None), TypeError, "must accept (entries)"),
    ],
)
def test_bad_declarations_are_refused(kwargs, kind, message):
    app = percolite.App()
    args = dict(queue_id="ex", exporter=lambda entries: None)
    args.update(kwargs)
    queue_id = args.pop("queue_id")
    with pytest.raises(kind, match=message.replace("(", r"\(").replace(")", r"\)")):
        app.export_queue(queue_id, **args)
    assert app._queues == {}


def test_bad_decorator_arguments_fail_at_the_call():
    app = percolite.App()
    with pytest.raises(ValueError, match="buckets"):
        app.export_queue("ex", buckets=-1)
    with pytest.raises(TypeError, match="exporter must be callable"):
        app.export_queue("ex")(None)


def test_a_queue_id_is_declared_once():
    app = percolite.App()
    app.combine_queue("q")
    with pytest.raises(ValueError, match="already has a queue named 'q'"):
        app.export_queue("q", lambda entries: None)


@pytest.mark.parametrize(
    "key, value, kind, message",
    [
        (42, 1, TypeError, "export queue 'ex': key 42"),
        ("k", {1, 2}, TypeError, "value {1, 2} for key 'k'"),
        ("k", [b"bytes"], TypeError, r"value \[b'bytes'\] for key 'k'"),
        ("bad\ud800", 1, ValueError, "key 'bad"),
    ],
)
def test_unencodable_entries_are_refused_and_nothing_is_queued(env, key, value, kind, message):
    app = percolite.App()
    eq = app.export_queue("ex", lambda entries: None)
    tx = env.transaction()
    eq.add(tx, "good", 1)
    with pytest.raises(kind, match=message):
        eq.add(tx, key, value)
    tx.abort()
    with env.transaction() as tx:
        with pytest.raises(kind):
            eq.add(tx, key, value)
        tx.set("other", ("f", "q"), "x")
    with env.transaction() as tx:
        assert eq.depth(tx) == 0
        assert tx.get("other", ("f", "q")) == b"x"
