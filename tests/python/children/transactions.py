"""Children of test_transactions.py."""

from __future__ import annotations

import percolite


def print_persisted(path):
    """Prints the ("persisted", ("f", "q")) cell of an existing store."""
    with percolite.open(path, create=False) as env:
        tx = env.transaction()
        print(tx.get("persisted", ("f", "q")))
        tx.abort()
