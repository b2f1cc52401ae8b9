"""Children of test_processes.py: several processes on one store, and fork()."""

from __future__ import annotations

import json
import os
import sys
import time

import percolite


def incrementer(path, ready_file, go_file):
    """300 increments of one counter, started together with another process
    (touches ``ready_file``, then waits for ``go_file``); prints every
    [commit_ts, value written]."""
    col = ("stats", "n")

    def increment(tx):
        value = int(tx.get("counter", col, b"0")) + 1
        tx.set("counter", col, str(value))
        return tx, value

    env = percolite.open(path)  # default sync="full"
    open(ready_file, "w").close()
    while not os.path.exists(go_file):  # start together, so the two really collide
        time.sleep(0.001)
    done = []
    for _ in range(300):
        tx, value = env.run(increment, retries=None)
        done.append((tx.commit_ts, value))
    env.close()
    print(json.dumps(done))


def write_x(path):
    """Commits ("x", ("f", "q")) = "other-process" from this process."""
    with percolite.open(path, sync="none") as env:
        with env.transaction() as tx:
            tx.set("x", ("f", "q"), "other-process")


def fork_and_use_the_store(path):
    """Forks with a store handle and a transaction open. The forked child must
    get percolite.Error naming fork from both and be able to open the store
    again; its exit status has a bit per failure. Prints "child-exit <status>"
    and, once the parent's handle and transaction still worked, "parent-ok"."""
    env = percolite.open(path, sync="none")
    with env.transaction() as tx:
        tx.set("parent", ("f", "q"), "before-fork")
    open_tx = env.transaction()

    pid = os.fork()
    if pid == 0:
        # The child: the parent's handle and transaction must refuse, not crash.
        code = 0
        try:
            env.transaction()
            code |= 1
        except percolite.Error as e:
            if "fork" not in str(e) or isinstance(e, percolite.ClosedError):
                code |= 2
        except BaseException:
            code |= 4
        try:
            open_tx.get("parent", ("f", "q"))
            code |= 8
        except percolite.Error:
            pass
        except BaseException:
            code |= 16
        try:
            # Opening the store again in the child is the documented way.
            with percolite.open(path, sync="none") as again:
                with again.transaction() as tx:
                    if tx.get("parent", ("f", "q")) != b"before-fork":
                        code |= 32
                    tx.set("child", ("f", "q"), "reopened")
        except BaseException as e:
            sys.stderr.write(f"child reopen failed: {e!r}\n")
            code |= 64
        sys.stderr.flush()
        os._exit(code)

    _, status = os.waitpid(pid, 0)
    print("child-exit", os.waitstatus_to_exitcode(status))
    # The parent's handle and its open transaction still work.
    assert open_tx.get("parent", ("f", "q")) == b"before-fork"
    open_tx.abort()
    with env.transaction() as tx:
        assert tx.get("child", ("f", "q")) == b"reopened"
        tx.set("parent", ("f", "q"), "after-fork")
    env.close()
    print("parent-ok")
