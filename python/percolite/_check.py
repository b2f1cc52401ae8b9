"""``percolite.check(path)`` and ``percolite check DB``: read a whole store
back and report what is damaged, without risking the caller.

The walk runs in a child process: LMDB trusts the pages it maps, so damage
inside the B-tree can make it fault, and a fault there must not kill the
program that asked. The child reads every cell (user rows, percolite's own
rows), every pending notification and every record percolite keeps for
itself, and checks what it reads:

* every table holds as many entries as the store's own bookkeeping records
  for it (the backend walks its tables: damaged pages often make a B-tree
  look shorter, or empty, without an error), its keys come in order, a
  search for each key finds the entry the walk found, and every record
  passes its checksum and decodes;
* every cell and notification key decodes (the core raises on malformed
  keys and records);
* queue entries carry their 12-byte stamp, and packed queue records (several
  entries in one value) decode; sharded counters' shards hold integers;
* percolite's own records (failures, parked work, leases, metrics, the app
  record) decode.

A walk that faults (the core turns that into an error) or hangs is
reported as damage too. Damage found by the walk's reads is remembered in
the store (the file ``damaged``), so no process writes over it; a store
that remembers damage found earlier is reported as such even when the walk
finds nothing now, since it refuses commits until it is restored.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from typing import Any

__all__ = ["check", "CHECK_TIMEOUT"]

# The walk's time limit in seconds (a hung walk is damage too).
CHECK_TIMEOUT = 600.0

_QUEUE_ENTRY_ROW = re.compile(rb"^[^:]+:(u|e):[0-9]{6}$")


def check(path: Any, *, timeout: float = CHECK_TIMEOUT) -> dict[str, Any]:
    """Reads the whole store at ``path`` back in a child process and returns
    ``{"ok", "problems": [str], "counts": {...}}``; ``ok`` is True when
    nothing is damaged. Raises percolite.StorageError when there is no
    store at ``path`` or it cannot be opened (nothing is created)."""
    from ._args import check_timeout
    from ._env import TARGET_VARIABLE, shared_target
    from .errors import StorageError

    limit = check_timeout(timeout)
    if limit == 0:
        raise ValueError("timeout must be > 0 or None: a walk of the store takes time")
    try:
        target = os.fspath(path)
    except TypeError:
        raise TypeError(f"path must be str or os.PathLike, not {type(path).__name__}") from None
    _backend, shared = shared_target(target)
    command = [sys.executable, "-m", "percolite._check"]
    # In the environment: a postgresql:// URI may carry a password.
    child_env = dict(os.environ, **{TARGET_VARIABLE: shared})
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=child_env)
    except subprocess.TimeoutExpired:
        return _damaged(f"reading the store did not finish in {timeout:g} s")
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return _damaged(
            f"reading the store killed the checking process ({name}): its pages are damaged"
        )
    lines = done.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, ValueError):
        return _damaged(f"the checking process failed: {done.stderr.strip()[-500:]}")
    if "unusable" in report:  # no store there, or it cannot be opened: not damage
        raise StorageError(report["unusable"])
    return report


def _damaged(problem: str) -> dict[str, Any]:
    return {"ok": False, "problems": [problem], "counts": {}}


def _walk(directory: str) -> dict[str, Any]:
    """The child's work: everything the module docstring lists."""
    from . import _core
    from ._counters import check_cell as counter_cell_problem
    from ._env import open as open_env
    from ._queue_rows import PACKED_FAMILIES, STAMP, packed_entries
    from .errors import CorruptionError, Error, StorageError

    problems: list[str] = []
    counts = {"cells": 0, "own_cells": 0, "notifications": 0, "parked": 0, "leases": 0}

    def problem(text: str) -> None:
        if len(problems) < 100:
            problems.append(text)

    try:
        env = open_env(directory, create=False, sync="none")
    except CorruptionError as e:
        return {"ok": False, "problems": [str(e)], "counts": counts}
    except (StorageError, ValueError) as e:
        return {"unusable": str(e)}
    with env:
        try:
            for found in env.core.verify_structure():
                problem(found)
            with env.transaction() as tx:
                for row, column, value in tx.scan():
                    counts["cells"] += 1
                    if _QUEUE_ENTRY_ROW.match(row) and column.family in PACKED_FAMILIES:
                        if len(column.qualifier) != STAMP:
                            problem(f"packed queue record {row!r} {column!r}: no stamp alone")
                        else:
                            try:
                                packed_entries(value)
                            except ValueError as e:
                                problem(f"packed queue record {row!r} {column!r}: {e}")
                    elif _QUEUE_ENTRY_ROW.match(row) and len(column.qualifier) < STAMP:
                        problem(f"queue entry {row!r} {column!r}: no stamp in its qualifier")
                    elif (wrong := counter_cell_problem(row, column, value)) is not None:
                        problem(wrong)
                for row, column, value in tx.scan(prefix=_core.SYSTEM_ROW_PREFIX):
                    counts["own_cells"] += 1
                    if row == _core.SYSTEM_ROW_PREFIX + b"app" or row.endswith(b"metrics"):
                        try:
                            json.loads(value)
                        except ValueError:
                            problem(f"percolite's record {row!r} {column!r} is not JSON")
            counts["parked"] = len(env.core.work_records(True))
            env.core.failure_summaries()
            counts["leases"] = len(env.core.lease_holders())
            after = b""
            while True:
                chunk = env.core.scan_notifications(after, 4096)
                if not chunk:
                    break
                counts["notifications"] += len(chunk)
                after = chunk[-1][4]
        except Error as e:
            problem(f"{type(e).__name__}: {e}")
        if not problems and (mark := env.core.damaged_mark()) is not None:
            problem(
                f"the store was found damaged earlier ({mark}), so it refuses commits; the "
                "walk finds nothing damaged now: once you know why (a copy of data.mdb put "
                "back, say), run 'percolite restored DIR' to write to it again"
            )
    return {"ok": not problems, "problems": problems, "counts": counts}


if __name__ == "__main__":
    from ._env import TARGET_VARIABLE

    print(json.dumps(_walk(os.environ[TARGET_VARIABLE])))
