"""Children of test_loader.py."""

from __future__ import annotations

import percolite

COL = ("f", "q")


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def rss_over_submissions(total, checkpoints):
    """Submit ``total`` small transactions from one thread (each overwrites one
    cell, so the store itself does not grow) and print the RSS in KiB after
    each of ``checkpoints`` submissions."""
    with percolite.open(":memory:") as env, env.loader(max_in_flight=256) as loader:
        marks = set(checkpoints)
        for i in range(1, total + 1):
            loader.submit(lambda tx, i: tx.set("counter", COL, b"%d" % i), i)
            if i in marks:
                loader.flush()
                print(i, rss_kib())
        loader.flush()
        tx = env.transaction()
        print("last", int(tx.get("counter", COL)) == total or "unordered")
        tx.abort()
