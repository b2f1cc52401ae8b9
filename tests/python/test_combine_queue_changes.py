"""The combine queue's two guarantees about the changes it reports (contract
in cpp/include/percolite/combine_queue.h), with adders and workers running at
once: guarantee 1 (a run's new value combines every update committed before
it), guarantee 2 (each old value is the previous new value), exact final
values, over small buffers, a resumed cursor and two levels of queues.

Everything runs in a child interpreter with a timeout
(``_isolated.run_child_json``; the code is in children/combine_queue_changes.py);
the children print JSON and the checks (_combine_checks.py, which says how the
change observers record committed reports) run here.
"""

from __future__ import annotations

from collections import Counter

import children.combine_queue_changes
import pytest
from _combine_checks import (
    assert_both_guarantees,
    chain_violations,
    guarantee_1_violations,
    reference_sums,
)
from _isolated import run_child_json
from conftest import BACKENDS


def child(scenario, backend: str, timeout: float = 60, **params):
    """Runs ``scenario`` (of children/combine_queue_changes.py) on a store of
    ``backend`` with ``params``; returns its JSON."""
    return run_child_json(scenario, backend, timeout=timeout, **params)


# -- guarantees under concurrent adders and workers -------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def concurrent_run(request, tmp_path_factory):
    """One run of 3 adder threads (plus a preload) against 2 worker threads on
    a queue with a small buffer, shared by the guarantee tests; one per backend."""
    backend = request.param
    db = tmp_path_factory.mktemp("concurrent") / "db"
    return child(
        children.combine_queue_changes.concurrent,
        backend,
        db=db,
        buckets=3,
        buffer=4,
        nkeys=40,
        txs=400,
        adders=3,
        preload=True,
    )


def test_guarantee_1_new_value_combines_every_update_committed_before_the_run(concurrent_run):
    """For every reported change, the new value equals the sum of that key's
    updates with commit_ts <= the processing transaction's start_ts (see
    ``guarantee_1_violations``)."""
    r = concurrent_run
    assert r["idle"] and r["failures"] == 0, r["last_error"]
    n_reports = sum(len(v) for v in r["reports"].values())
    runs = {ts for v in r["reports"].values() for ts, _, _ in v}
    assert n_reports > 200 and len(runs) > 50, "the check must cover many runs"
    assert guarantee_1_violations(r["adds"], r["reports"]) == []


def test_guarantee_2_old_value_is_the_previous_new_value(concurrent_run):
    r = concurrent_run
    assert r["idle"] and r["failures"] == 0, r["last_error"]
    # Sums go through zero (deleted) and back: the chain passes through None.
    assert any(
        old is None and i > 0 for v in r["reports"].values() for i, (_, old, _) in enumerate(v)
    ), "some key must be deleted and come back"
    assert chain_violations(r["reports"], r["final"]) == []


def test_concurrent_run_ends_exact_with_nothing_left(concurrent_run):
    r = concurrent_run
    assert r["conflicts"] == 0, "adders never collide"
    assert r["final"] == reference_sums(r["adds"])
    assert r["queued"] == 0 and r["pending"] == 0


def test_hammer_zipf_adders_with_workers_running(backend, tmp_path):
    """4 adder threads x 1000 transactions x 20 Zipf-chosen +1/-1 updates over
    3000 keys while two worker threads process: no adder ever conflicts, and
    at the end every value equals a Counter of the updates (zero sums absent),
    every report satisfies guarantee 1, and every key's chain holds."""
    r = child(
        children.combine_queue_changes.hammer,
        backend,
        db=tmp_path / "db",
        nkeys=3000,
        txs=1000,
        timeout=90,
    )
    assert r["errors"] == []
    assert r["conflicts"] == 0, "adders collided"
    assert len(r["adds"]) == 4 * 1000 * 20
    assert r["idle"] and r["failures"] == 0, r["last_error"]
    reference = Counter()
    for _, key, delta in r["adds"]:
        reference[key] += delta
    expected = {key: n for key, n in reference.items() if n != 0}
    assert r["final"] == expected
    assert len(expected) > 500 and any(n == 0 for n in reference.values())
    assert r["queued"] == 0 and r["pending"] == 0
    assert_both_guarantees(r)
    assert r["commits_while_adding"] > 10, "processing ran while the adders added"


# -- buffer size, continuation and the cursor -----------------------------------


@pytest.mark.parametrize("buffer_size", [1, 3])
def test_tiny_buffer_continues_over_many_runs_and_stays_exact(backend, tmp_path, buffer_size):
    r = child(
        children.combine_queue_changes.concurrent,
        backend,
        db=tmp_path / "db",
        buckets=2,
        buffer=buffer_size,
        nkeys=60,
        txs=250,
        adders=2,
        preload=True,
    )
    assert r["idle"] and r["failures"] == 0, r["last_error"]
    assert r["final"] == reference_sums(r["adds"])
    assert r["queued"] == 0 and r["pending"] == 0
    runs = {ts for v in r["reports"].values() for ts, _, _ in v}
    assert len(runs) >= 60 // 2, "a tiny buffer makes many runs"
    assert_both_guarantees(r)


def test_a_keys_updates_are_never_split_across_runs(backend, tmp_path):
    """buffer_size=5 and one key with 50 updates: the run that takes the key
    takes all its queued updates. With everything committed before the
    workers start, the key is reported once, with the full sum; later, with
    adds racing the workers, every report of it includes every update
    committed before its run started (guarantee 1)."""
    r = child(children.combine_queue_changes.never_split, backend, db=tmp_path / "db")
    p1 = r["phase1"]
    assert p1["result"]["idle"] and p1["result"]["failures"] == 0
    assert p1["reports"]['"hot"'][0][1:] == [None, sum(range(1, 51))]
    assert len(p1["reports"]['"hot"']) == 1, p1["reports"]['"hot"']
    assert p1["final"]['"hot"'] == 1275
    for i in range(20):
        assert p1["reports"][f'"o{i:02}"'] == [[p1["reports"][f'"o{i:02}"'][0][0], None, 7]]
    runs = {ts for v in p1["reports"].values() for ts, _, _ in v}
    assert len(runs) >= 5, "buffer_size=5 continued over several runs"
    assert p1["result"]["commits"] >= 5

    assert r["idle"] and r["failures"] == 0, r["last_error"]
    assert r["final"] == reference_sums(r["adds"])
    assert r["queued"] == 0
    assert_both_guarantees(r)


def test_updates_behind_a_resumed_cursor_are_not_lost(backend, tmp_path):
    """One bucket, buffer_size=2, 200 keys: processing walks the bucket with
    its cursor over ~100 runs. Meanwhile updates of the first keys (behind
    the cursor) keep arriving; they must be picked up by a later pass."""
    r = child(children.combine_queue_changes.resumed_cursor, backend, db=tmp_path / "db")
    assert r["idle"] and r["failures"] == 0, r["last_error"]
    assert r["behind"] >= 20, "the scenario must add behind a resumed cursor"
    assert r["final"] == reference_sums(r["adds"])
    assert r["queued"] == 0
    assert_both_guarantees(r)


def test_bytes_keys_that_prefix_each_other_with_a_one_update_buffer(backend, tmp_path):
    """Keys with NUL bytes, 0xff and prefixes of each other (the escaping of
    the update qualifier must keep each key's updates together and apart)."""
    r = child(children.combine_queue_changes.tricky_keys, backend, db=tmp_path / "db")
    assert r["result"]["idle"] and r["result"]["failures"] == 0
    assert r["final"] == r["expected"]
    assert r["got"] == r["expected"]
    assert r["queued"] == 0
    assert max(r["batches"]) == 1, "buffer_size=1: each run takes one key"


# -- two-level aggregation ------------------------------------------------------


def test_change_observer_feeding_a_second_queue_ends_exact(backend, tmp_path):
    """Word counts -> histogram of counts (the Fluo Recipes count -> index example):
    the first queue's change observer adds -1 for the old count and +1 for the
    new count to the second queue, in the processing transaction."""
    r = child(children.combine_queue_changes.two_level, backend, db=tmp_path / "db")
    assert r["idle"] and r["failures"] == {"w": 0, "hist": 0}, r["errors"]
    assert r["words"] == reference_sums(r["adds"])
    histogram = Counter(r["words"].values())
    assert r["hist"] == {str(count): n for count, n in histogram.items()}
    assert sum(r["hist"].values()) == len(r["words"])
    assert r["queued"] == 0
    assert chain_violations(r["word_reports"], r["words"]) == []
    assert chain_violations(r["hist_reports"], r["hist"]) == []
    assert guarantee_1_violations(r["adds"], r["word_reports"]) == []
