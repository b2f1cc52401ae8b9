"""A combine queue's linger: a bucket defers its run to fold a stream of
updates in fewer runs, the scanner backs off while it finds only the
lingering work, and env.wait does not linger.

Everything runs in a child interpreter with a timeout
(``_isolated.run_child_json``; the code is in children/combine_queue.py)."""

from __future__ import annotations

import children.combine_queue
import pytest
from _isolated import run_child_json
from children.combine_queue import most_scans


def child(scenario, backend: str, timeout: float = 60, **params):
    """Runs ``scenario`` (of children/combine_queue.py) on a store of ``backend``
    with ``params``; returns its JSON."""
    return run_child_json(scenario, backend, timeout=timeout, **params)


def test_linger_folds_a_stream_of_updates_in_fewer_runs(backend, store_path, tmp_path):
    """20 commits adding 1 to one key. Without linger, an update that arrives
    after the one before was folded gets a run of its own, at once. With
    linger=8.0 the bucket's first run defers itself (a look, 2 s), the other
    19 updates arrive meanwhile, 10 ms apart, and its second look folds them
    in one run (a young bucket goes at its second look, test_export_queue.py);
    the reports still chain old to new and end at 20. Paced by folds and looks,
    not by the clock: the 19 take a small part of the 2 s (this test once sent
    all 20 10 ms apart against looks every 0.25 s, so how many runs each side
    made depended on how fast the machine ran)."""
    eager = child(
        children.combine_queue.stream_with_linger, backend, path=str(tmp_path / "eager"), linger=0
    )
    lingering = child(
        children.combine_queue.stream_with_linger,
        backend,
        path=str(tmp_path / "lingering"),
        linger=8.0,
    )
    for out in (eager, lingering):
        assert out["values"] == {'"k"': 20}
        chain = out["reports"]['"k"']
        assert [old for _ts, old, _new in chain] == [None] + [new for _ts, _old, new in chain][:-1]
        assert chain[-1][2] == 20
    assert eager["deferrals"] == 0 and len(eager["reports"]['"k"']) == 20
    assert lingering["linger"] == 8.0 and lingering["deferrals"] >= 1
    # One run; a few only if the stream outlasted looks (a look that finds no
    # update arrived since the one before ends the linger too).
    assert len(lingering["reports"]['"k"']) <= 3
    assert len(lingering["reports"]['"k"']) < len(eager["reports"]['"k"'])


@pytest.mark.parametrize("observed", [False, True])
def test_the_scanner_backs_off_while_it_finds_only_known_work(backend, tmp_path, observed):
    """Commits elsewhere wake the scanner; while its scans find only the
    lingering bucket the workers already hold, it waits longer between them
    (``SCAN_PAUSE_FIRST`` doubling to ``SCAN_PAUSE_MAX``) instead of scanning
    after every commit, also after commits that start runs (``observed``: a
    stream follows each run).

    Counted against the pauses, not timed: a pause is a sleep, so in a stream
    of T seconds the scanner begins at most ``most_scans(T)`` scans however
    slow the machine (load only makes them fewer), and each stream goes on
    until it made more than twice as many commits, so a scanner that rescanned
    after every commit would begin many more. Scans while a run goes are left
    out: such a scan rescans on the next wake (its run's commit may come with
    another process's work), so how many there are depends on how fast runs
    go. (This test once streamed a second of commits that each started a run
    and asserted fewer scans than half the commits; under load, runs were slow
    and it failed with 109 scans for 147 commits.) Before the pause there was
    a scan after every commit (6,397 a second)."""
    out = child(
        children.combine_queue.scans_while_lingering,
        backend,
        path=str(tmp_path / "store"),
        observed=observed,
        timeout=120,
    )
    assert out["queued"] == 1  # still lingering: nothing folded it
    assert len(out["streams"]) == (4 if observed else 1), out
    for stream in out["streams"]:
        assert stream["scans"] <= most_scans(stream["seconds"]), out
        assert stream["scans"] * 2 < stream["commits"], out


def test_wait_does_not_linger(backend, tmp_path):
    """A bucket lingering 60 s (a look every 15 s) defers its run; env.wait
    brings it forward and the update is folded at once, without another look."""
    out = child(children.combine_queue.wait_does_not_linger, backend, path=str(tmp_path / "store"))
    assert out["idle"] is True and out["seconds"] < 5.0
    assert out["values"] == {'"k"': 5} and out["queued"] == 0
    assert out["deferrals"] == out["before"]  # the run brought forward did not linger


def test_waiters_and_adders_together_lose_nothing(backend, tmp_path):
    """Real threads: 4 adders commit to a lingering queue while 3 threads keep
    calling env.wait (each call hurries the pool, then lets it linger again).
    Every update is folded once, and each wait returns."""
    out = child(children.combine_queue.waiters_and_adders, backend, path=str(tmp_path / "store"))
    assert out["idle"] is True and out["all_idle"] is True and out["waits"] >= 3
    assert out["last_wait"] < 5.0  # not a linger's wait
    expected = {f'"k{i}"': sum(1 for j in range(150) if j % 7 == i) * 4 for i in range(7)}
    expected.update({f'"t{n}"': 150 for n in range(4)})
    assert out["values"] == expected and out["queued"] == 0
