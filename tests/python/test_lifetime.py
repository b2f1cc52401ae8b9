"""Handles and transactions freed on threads that cannot wait (worker
threads): no crash, no hang, and the store closes."""

from __future__ import annotations

from _isolated import run_child


# Regression: an Env freed on a worker thread (its last reference dropped in
# an observer, or Python's garbage collector running there, as after a loader
# run) threw from its destructor ("cannot be called from inside an observer")
# and aborted the process.
def test_an_env_freed_on_a_worker_thread_closes_without_aborting(backend, tmp_path):
    out = run_child(
        "children.lifetime:drop_an_env_inside_an_observer",
        backend,
        tmp_path / "db",
        tmp_path / "other",
        timeout=60,
    )
    assert out.splitlines() == ["idle: True dropped: 1"]
