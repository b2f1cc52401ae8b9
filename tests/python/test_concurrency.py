"""Threads sharing one store, on every backend. Every test runs its body in a
child interpreter with a timeout (run_child; the code is in
children/concurrency.py), so a deadlock fails fast instead of hanging."""

from __future__ import annotations

import json

import children.concurrency
from _isolated import run_child


def test_no_lost_updates_8_threads_x_500_increments(backend, store_path):
    out = run_child(children.concurrency.no_lost_updates, backend, store_path, timeout=90)
    report = json.loads(out)
    assert report["errors"] == []
    assert report["final"] == "4000"
    results = report["results"]
    assert len(results) == 4000
    commit_ts = [ts for ts, _ in results]
    assert len(set(commit_ts)) == 4000, "commit_ts values must be unique"
    # Serial order: sorted by commit_ts, the increments wrote 1, 2, ..., 4000.
    assert [value for _, value in sorted(results)] == list(range(1, 4001))
    assert report["metrics_commits"] == 4000
    # The backend's count has the metric writes too (one per flush interval).
    assert report["stats"]["commits"] >= 4000


def test_snapshot_is_stable_while_other_threads_commit(backend, store_path):
    out = run_child(children.concurrency.stable_snapshot, backend, store_path, timeout=60)
    assert out.startswith("ok")


def test_one_transaction_shared_by_threads(backend, store_path):
    out = run_child(children.concurrency.shared_transaction, backend, store_path, timeout=60)
    assert out.strip() == "ok"


def test_close_while_other_threads_run(backend, tmp_path):
    """Close drains in-flight commits; other threads then get ClosedError,
    never a crash or a hang, and no commit reported as done is lost (checked
    by reopening, on the backends whose store outlives its handle)."""
    out = run_child(children.concurrency.close_while_threads_run, backend, tmp_path, timeout=60)
    assert out.strip() == "ok"


def test_begin_and_close_race_does_not_crash(backend, tmp_path):
    """Threads that keep beginning transactions while another thread closes the
    store get ClosedError; none may touch the storage after the store closed.
    The race window is small, so this repeats open/race/close for a few seconds."""
    out = run_child(children.concurrency.begin_and_close_race, backend, tmp_path, timeout=60)
    assert out.startswith("ok")
