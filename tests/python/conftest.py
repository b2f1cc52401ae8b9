"""Shared fixtures and helpers for the percolite Python tests.

Tests that could hang (threads, several processes, close while others run,
fork) run their body in a child interpreter through ``run_isolated``, so a
deadlock fails that one test after a timeout instead of freezing the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import percolite
import pytest

# A column most tests write to.
COL = ("f", "q")


@pytest.fixture
def store_path(tmp_path):
    """A path for a new store (the directory does not exist yet)."""
    return tmp_path / "store"


@pytest.fixture
def env(store_path):
    """A fresh store opened with ``sync="none"``; closed after the test."""
    handle = percolite.open(store_path, sync="none")
    yield handle
    handle.close()


def as_tuples(cells):
    """Cells as plain ``(row, (family, qualifier), value)`` tuples, easy to compare."""
    return [(c.row, tuple(c.column), c.value) for c in cells]


def committed_cells(env):
    """Every committed cell of the store, as ``as_tuples`` gives them."""
    tx = env.transaction()
    try:
        return as_tuples(tx.scan())
    finally:
        tx.abort()


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start_isolated(code, *args):
    """Start ``code`` (dedented) in a fresh interpreter with ``sys.argv[1:] == args``;
    pass the result to ``finish_isolated``."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout kills grandchildren too
    )


def finish_isolated(proc, timeout=60):
    """Wait for a child from ``start_isolated``; assert that it exits with status 0
    within ``timeout`` seconds (otherwise its whole process group is killed and
    the test fails with its output) and return its stdout."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(
            f"isolated child timed out after {timeout}s (hang or deadlock)\n"
            f"--- stdout ---\n{out}\n--- stderr ---\n{err}"
        )
    finally:
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()
    status = proc.returncode
    if status < 0:
        status = f"{status} (killed by {signal.Signals(-status).name})"
    assert proc.returncode == 0, (
        f"isolated child exited with {status}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"
    )
    return out


def _run_isolated(code, *args, timeout=60):
    """Run ``code`` in a fresh interpreter and return its stdout; see
    ``start_isolated`` and ``finish_isolated``."""
    return finish_isolated(start_isolated(code, *args), timeout=timeout)


@pytest.fixture
def run_isolated():
    """``run_isolated(code, *args, timeout=60) -> stdout``; see ``_run_isolated``."""
    return _run_isolated
