"""Handles and transactions freed on threads that cannot wait (worker
threads): no crash, no hang, and the store closes."""

from __future__ import annotations

import children.lifetime
import percolite
from _isolated import run_child
from children.lifetime import DONE


# Regression: an Env freed on a worker thread (its last reference dropped in
# an observer, or Python's garbage collector running there, as after a loader
# run) threw from its destructor ("cannot be called from inside an observer")
# and aborted the process.
def test_an_env_freed_on_a_worker_thread_closes_without_aborting(backend, tmp_path):
    out = run_child(
        children.lifetime.drop_an_env_inside_an_observer,
        backend,
        tmp_path / "db",
        tmp_path / "other",
        timeout=60,
    )
    assert out.splitlines() == ["idle: True dropped: 1"]


# Regression: handles freed on a worker thread are closed by threads of their
# own, and nothing waited for those at exit. The interpreter finalized while
# they still ran: one that took the GIL to release the pool's Python
# callables was ended by Python (pthread_exit) inside a C++ destructor, and
# the process aborted ("terminate called without an active exception") after
# printing its result; runs still going on the freed handles never committed.
def test_envs_freed_on_a_worker_thread_are_closed_before_the_interpreter_exits(tmp_path):
    count = 4
    out = run_child(
        children.lifetime.free_busy_envs_on_a_worker_thread_then_exit,
        tmp_path / "db",
        tmp_path / "other",
        count,
        timeout=60,
    )
    assert out.splitlines() == [f"running: {count} idle: True dropped: {count}"]
    for i in range(count):
        with percolite.open(tmp_path / f"other{i}") as env:
            # The run going on when its handle was freed finished and
            # committed, and the pool's lease was given back: closed in full.
            with env.transaction() as tx:
                assert tx.get("r", DONE) == b"finished"
            assert env.status()["leases"] == []
