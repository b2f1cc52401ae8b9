"""Children of test_backends.py: a memory store and fork()."""

from __future__ import annotations

import os
import sys

import percolite

COL = ("f", "q")


def fork_with_a_memory_store():
    """Forks with a memory store and a transaction open. The forked child must
    get percolite.Error naming fork (not ClosedError, not a crash) from the
    handle, from the inherited transaction and from its commit, and must be
    able to open a memory store of its own, which is empty; its exit status
    has a bit per failure. Prints "child-exit <status>" and, once the
    parent's handle and transaction still worked, "parent-ok"."""
    env = percolite.open(":memory:", sync="none")
    with env.transaction() as tx:
        tx.set("parent", COL, "before-fork")
    open_tx = env.transaction()
    writer = env.transaction()
    writer.set("writer", COL, "set before the fork")

    pid = os.fork()
    if pid == 0:
        code = 0
        uses = [
            (1, env.transaction),
            (4, lambda: open_tx.get("parent", COL)),
            (16, writer.commit),
            (64, env.stats),
        ]
        for bit, use in uses:
            try:
                use()
                code |= bit  # it worked: the child used the parent's store
            except percolite.ClosedError:
                code |= bit << 1
            except percolite.Error as e:
                if "fork" not in str(e):
                    code |= bit << 1
            except BaseException as e:
                sys.stderr.write(f"unexpected {e!r}\n")
                code |= bit << 1
        try:
            with percolite.open(":memory:", sync="none") as own:
                with own.transaction() as tx:
                    if list(tx.scan()) != []:
                        code |= 256  # a new memory store is empty
                    tx.set("child", COL, "own store")
                with own.transaction() as tx:
                    if tx.get("child", COL) != b"own store":
                        code |= 256
        except BaseException as e:
            sys.stderr.write(f"own memory store failed: {e!r}\n")
            code |= 512
        sys.stderr.flush()
        os._exit(code)

    _, status = os.waitpid(pid, 0)
    print("child-exit", os.waitstatus_to_exitcode(status))
    # The parent's handle and its open transactions still work.
    assert open_tx.get("parent", COL) == b"before-fork"
    open_tx.abort()
    writer.commit()
    with env.transaction() as tx:
        assert tx.get("writer", COL) == b"set before the fork"
        assert tx.get("child", COL) is None
        tx.set("parent", COL, "after-fork")
    env.close()
    print("parent-ok")
