"""webindex killed mid-run: the loader and its worker processes get SIGKILL
while pages are being loaded and exported; running the same load again ends
with the tables of the pages, equal to those of a fresh store."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

from _isolated import run_command
from percolite.webindex import app as wi
from percolite.webindex import synthetic
from test_webindex import expected_tables


def _command(tree, db, export):
    return [
        sys.executable,
        "-m",
        "percolite",
        "webindex",
        "load",
        str(tree),
        "--db",
        str(db),
        "--export",
        export,
        "--base-url",
        "http://",
        "--quiet",
    ]


def _environment():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def _inlinks(path):
    try:
        with sqlite3.connect(path, timeout=5) as db:
            return db.execute("SELECT count(*) FROM webindex_inlinks").fetchone()[0]
    except sqlite3.OperationalError:  # not made yet, or busy
        return 0


def _kill_when(tree, db, export, inlinks):
    """Starts the load and kills it, its worker processes with it, once the
    query database holds ``inlinks`` links; returns how many it holds
    then."""
    proc = subprocess.Popen(
        _command(tree, db, export),
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the loader and its worker processes, one group
    )
    try:
        deadline = time.monotonic() + 300
        while _inlinks(export[len("sqlite:") :]) < inlinks:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    return _inlinks(export[len("sqlite:") :])


def test_killed_twice_then_run_again_ends_with_the_same_tables(tmp_path):
    web = synthetic.generate(3000, seed=39)
    tree = tmp_path / "tree"
    synthetic.write_html(web, str(tree))
    links = sum(len(targets) for targets in web.values())
    db, export = tmp_path / "db", "sqlite:" + str(tmp_path / "q.sqlite")
    # Killed once the first export batch is in, then again once the second
    # run's first batch is. The export queues gather a small load's pages
    # into one batch per bucket (4 for the inlinks), so either kill may come
    # after the last of them; at least one must come before.
    first = _kill_when(tree, db, export, 1)
    second = _kill_when(tree, db, export, first + 1) if first < links else links
    assert min(first, second) < links, "both kills came after every inlink was exported"
    done = run_command(_command(tree, db, export), env=_environment(), timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"pages: {len(web):,} read" in done.stdout
    tables = wi.read_tables(export)
    assert tables == expected_tables(web)
    fresh = "sqlite:" + str(tmp_path / "fresh.sqlite")
    done = run_command(_command(tree, tmp_path / "fresh", fresh), env=_environment(), timeout=600)
    assert done.returncode == 0, done.stderr
    assert wi.read_tables(fresh) == tables
