"""The percolite command line: ``percolite`` or ``python -m percolite``."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence

import percolite


def _demo(args: argparse.Namespace) -> int:
    """A small tour of transactions: concurrent increments without lost updates."""
    import threading

    with tempfile.TemporaryDirectory(prefix="percolite-demo-") as scratch:
        path = args.db or f"{scratch}/demo.db"
        with percolite.open(path) as env:
            column = percolite.Column("stats", "count")

            def increment(tx: percolite.Transaction) -> None:
                tx.set("counter", column, str(int(tx.get("counter", column, b"0")) + 1))

            def worker() -> None:
                for _ in range(args.increments):
                    env.run(increment)

            began = time.perf_counter()
            threads = [threading.Thread(target=worker) for _ in range(args.threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - began
            with env.transaction() as tx:
                total = int(tx.get("counter", column))
            expected = args.threads * args.increments
            stats = env.stats()
            print(f"store: {env.path}")
            print(
                f"{args.threads} threads x {args.increments} increments of one counter: "
                f"{total} (expected {expected})"
            )
            print(
                f"{stats['commits']} commits in {stats['batches']} group commits, "
                f"{stats['conflicts']} conflicts retried, {elapsed:.2f} s"
            )
            return 0 if total == expected else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="percolite", description=percolite.__doc__.splitlines()[0]
    )
    parser.add_argument("--version", action="version", version=percolite.__version__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="a short tour of transactions")
    demo.add_argument("--db", help="store directory (default: a temporary one)")
    demo.add_argument("--threads", type=int, default=4)
    demo.add_argument("--increments", type=int, default=100)
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except percolite.Error as e:
        print(f"percolite: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
