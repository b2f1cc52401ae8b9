"""The percolite command line: ``percolite`` or ``python -m percolite``.

Commands: ``phrasecount [PATH ...] --db DB``, ``demo``, ``status DB``,
``scan DB``, ``wait DB``, ``worker MODULE:APP --db DB``, ``retry DB``,
``take-over MODULE:APP QUEUE --db DB``, ``check DB``.

Exit statuses: 0 done; 1 an error; 2 bad arguments (usage); 3 (``worker
--until-idle`` and ``wait``) nothing left to run but parked work; 4 (the
same) nothing left but parked work and export queues blocked by a sink
that refuses the store (``take-over``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence

import percolite

from . import _core
from ._env import TARGET_VARIABLE, shared_target, shown_target, store_directory
from ._log import describe_cell, shown
from ._metrics import prometheus_text
from ._workers import (
    EXIT_BLOCKED,
    EXIT_DONE,
    EXIT_ERROR,
    EXIT_PARKED,
    EXIT_USAGE,
    load_app,
    run_worker_processes,
)


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
                f"{stats['commits']} commits and {stats['conflicts']} conflicts (retried) "
                f"in {stats['batches']} group-commit batches, {elapsed:.2f} s"
            )
            return 0 if total == expected else 1


def _open_existing(path: str) -> percolite.Env:
    shared_target(path)  # a memory target: no other process's store to look at
    return percolite.open(path, create=False)


def _printable(value: bytes) -> str:
    text = value.decode("utf-8", "backslashreplace")
    return text if text.isprintable() else repr(value)


def _when(unix: float | None) -> str:
    if unix is None:
        return "-"
    return datetime.datetime.fromtimestamp(unix).isoformat(sep=" ", timespec="seconds")


def _status(args: argparse.Namespace) -> int:
    with _open_existing(args.db) as env:
        if args.prometheus:
            sys.stdout.write(prometheus_text(env.metrics()))
            return EXIT_DONE
        status = env.status()
    if args.json:
        print(json.dumps(status, default=lambda b: b.decode("utf-8", "backslashreplace"), indent=2))
        return EXIT_DONE
    print(f"store:   {status['path']}")
    if status["identity"] is not None:
        identity = status["identity"]
        print(f"identity: {identity['store']} (epoch {identity['epoch']})")
    n = status["pending"]
    print(f"pending: {n} notification{'s' if n != 1 else ''}")
    print(f"parked:  {status['parked']} (notifications and queue keys)")
    live = [h for h in status["leases"] if h["live"]]
    groups = {h["group"] for h in live}
    print(
        f"workers: {len(live)} live pool{'s' if len(live) != 1 else ''} holding leases"
        + (f", in {len(groups)} group{'s' if len(groups) != 1 else ''}" if live else "")
    )
    for h in live:
        print(
            f"  {h['owner']:<40} group {h['group']}  {h['threads']} threads, "
            f"{h['partitions']} of {_core.LEASE_PARTITIONS} partitions"
        )
    for o in status["observers"]:
        column = f"{_printable(o['family'])}:{_printable(o['qualifier'])}"
        print(
            f"  {o['name']:<30} {column:<30} {o['notify']:<6} pending {o['pending']}"
            f"  failures {o['failures']}  parked {o['parked']}"
        )
        if o["failures"]:
            where = o["last_failed_cell"]
            print(
                f"    last failure {_when(o['last_failure_unix'])}"
                + (f" on {describe_cell(where)}" if where and where["row"] is not None else "")
                + f": {o['last_error_type']}: {o['last_error_message']}"
            )
    for queue_id, sink in status["sinks"].items():
        if sink["state"] == "ok":
            continue
        waiting = "" if sink["waiting"] is None else f", {sink['waiting']} entries waiting"
        error = sink["last_error"]
        how = "failing" if sink["state"] == "failing" else "refusing this store (blocked)"
        print(
            f"sink of export queue {queue_id!r}: {how} since {_when(sink['since_unix'])}"
            f"{waiting}, last error: {error['type']}: {error['message']}"
        )
    for record in status["parked_work"]:
        error = record["error"]
        if record["queue"] is not None:
            what = f"{record['observer']} key {shown(record['key'])}"
        else:
            what = f"observer {record['observer']!r} on {describe_cell(record)}"
        print(
            f"parked: {what} after {record['attempts']} attempts, "
            f"last at {_when(record['last_failure_unix'])}:"
        )
        print("    " + error["traceback"].rstrip("\n").replace("\n", "\n    "))
    if status["parked"] > len(status["parked_work"]):
        print(f"... and {status['parked'] - len(status['parked_work'])} more (see --json)")
    return EXIT_DONE


def _retry(args: argparse.Namespace) -> int:
    with _open_existing(args.db) as env:
        parked = env.parked()
        if not parked:
            print(f"percolite: nothing is parked in {env.path}", file=sys.stderr)
            return EXIT_ERROR
        names = args.observer or []
        queues = args.queue or []
        unknown = sorted(set(names) - {r["observer"] for r in parked})
        unknown += sorted(set(queues) - {r["queue"] for r in parked if r["queue"] is not None})
        if unknown:
            print(
                f"percolite: no parked work of {', '.join(map(repr, unknown))} in {env.path}; "
                "nothing was retried",
                file=sys.stderr,
            )
            return EXIT_ERROR
        retried = env.retry_parked(names or None, queue=queues or None)
    print(f"retried {retried} parked item{'s' if retried != 1 else ''}; run the workers")
    return EXIT_DONE


def _check(args: argparse.Namespace) -> int:
    shared_target(args.db)  # a memory target: no store another process can check
    try:
        report = percolite.check(args.db)
    except percolite.StorageError as e:
        raise ValueError(str(e)) from None  # a usage error: exit 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        counts = report["counts"]
        if counts and (report["ok"] or counts["cells"] or counts["own_cells"]):
            print(
                f"read {counts['cells']:,} cells, {counts['own_cells']:,} of percolite's own, "
                f"{counts['notifications']:,} pending notifications, {counts['leases']} leases"
            )
        for problem in report["problems"]:
            print(f"damaged: {problem}")
        print("clean" if report["ok"] else f"{shown_target(args.db)}: damaged")
    return EXIT_DONE if report["ok"] else EXIT_ERROR


def _restored(args: argparse.Namespace) -> int:
    store_directory(args.db)  # a memory target has no copy to restore
    with percolite.open(args.db, create=False, restored=True):
        pass
    print(
        f"{args.db}: accepted as restored from a copy (its durable mark starts again from it, "
        "and any record of damage is cleared); run 'percolite check' on it before the workers"
    )
    return EXIT_DONE


def _scan(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise ValueError(f"--limit must be >= 0, not {args.limit}")
    with _open_existing(args.db) as env:
        if args.notifications:
            after, shown = b"", 0
            while shown < args.limit:
                chunk = env._core.scan_notifications(after, min(512, args.limit - shown))
                if not chunk:
                    break
                for row, family, qualifier, stamp, key in chunk:
                    print(
                        f"{_printable(row)}\t{_printable(family)}:{_printable(qualifier)}\t{stamp}"
                    )
                    after = key
                    shown += 1
            return 0
        with env.transaction() as tx:
            for n, (row, column, value) in enumerate(tx.scan(prefix=args.prefix)):
                if n >= args.limit:
                    break
                print(
                    f"{_printable(row)}\t{_printable(column.family)}:"
                    f"{_printable(column.qualifier)}\t{_printable(value)}"
                )
    return 0


def _wait(args: argparse.Namespace) -> int:
    if args.timeout is not None and not args.timeout >= 0:  # NaN too
        raise ValueError(f"--timeout must be a number of seconds >= 0, not {args.timeout}")
    with _open_existing(args.db) as env:
        try:
            idle = env.wait(timeout=args.timeout, progress="auto" if not args.quiet else False)
        except percolite.WorkParked as e:
            print(f"percolite: {e}", file=sys.stderr)
            return EXIT_BLOCKED if isinstance(e, percolite.SinkBlocked) else EXIT_PARKED
    if not idle:
        print(f"percolite: still busy after {args.timeout} s", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_DONE


def _take_over(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    with percolite.open(args.db, app=app, create=False) as env:
        done = env.take_over_sink(args.queue)
    print(
        f"export queue {args.queue!r}: {done['sink']} now belongs to store {done['owner']} "
        f"(it belonged to {done['previous_owner'] or 'no store'}; {done['rows_cleared']} rows "
        f"cleared; {done['retried']} blocked bucket{'s' if done['retried'] != 1 else ''} "
        "put back to run)"
    )
    return EXIT_DONE


def _worker(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    return run_worker_processes(
        app_spec=args.app,
        app=app,
        db=args.db,
        processes=args.processes,
        threads=args.threads,
        until_idle=args.until_idle,
        worker_index=args.worker_index,
        worker_count=args.worker_count,
        metrics_port=args.metrics_port,
        upgrade=args.upgrade,
    )


def _configure_logging(args: argparse.Namespace) -> None:
    """Records of the percolite loggers go to stderr, at the chosen level."""
    if args.log_level:
        level = getattr(logging, args.log_level)
    else:
        level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logger = logging.getLogger("percolite")
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)


def _ui(args: argparse.Namespace) -> int:
    from .ui import _cli as ui_cli

    app = load_app(args.app) if args.app else None
    backend, _target = shared_target(args.db)
    with percolite.open(args.db, app=app, create=False) as env:
        return ui_cli.serve(env, args.host, args.port)


def main(argv: Sequence[str] | None = None) -> int:
    summary = percolite.__doc__.splitlines()[0]
    parser = argparse.ArgumentParser(prog="percolite", description=summary)
    parser.add_argument("--version", action="version", version=percolite.__version__)
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more (-v: INFO, -vv: DEBUG); the default shows WARNING and above",
    )
    parser.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        type=str.upper,
        help="the level of the percolite loggers (overrides -v)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    phrasecount = commands.add_parser(
        "phrasecount",
        help="count 4-word phrases of documents (default: the stdlib's docstrings) and export them",
    )
    from .phrasecount import cli as phrasecount_cli

    phrasecount_cli.add_arguments(phrasecount)
    phrasecount.set_defaults(func=phrasecount_cli.main)

    demo = commands.add_parser("demo", help="a short tour of transactions")
    demo.add_argument("--db", help="store directory (default: a temporary one)")
    demo.add_argument("--threads", type=int, default=4)
    demo.add_argument("--increments", type=int, default=100)
    demo.set_defaults(func=_demo)

    status = commands.add_parser("status", help="pending notifications, observers, failures")
    status.add_argument("db")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument(
        "--prometheus",
        action="store_true",
        help="print the store's metrics in the Prometheus text exposition format",
    )
    status.set_defaults(func=_status)

    scan = commands.add_parser("scan", help="print cells, or pending notifications")
    scan.add_argument("db")
    scan.add_argument("--prefix", help="only rows starting with this")
    scan.add_argument("--notifications", action="store_true", help="list pending notifications")
    scan.add_argument("--limit", type=int, default=1000)
    scan.set_defaults(func=_scan)

    wait = commands.add_parser("wait", help="wait until no notification is pending")
    wait.add_argument("db")
    wait.add_argument("--timeout", type=float, default=None)
    wait.add_argument("--quiet", action="store_true", help="no progress display")
    wait.set_defaults(func=_wait)

    worker = commands.add_parser("worker", help="run an app's observers on a store")
    worker.add_argument("app", help="the application, as module:attribute (a percolite.App)")
    worker.add_argument(
        "--db",
        default=os.environ.get(TARGET_VARIABLE),
        required=not os.environ.get(TARGET_VARIABLE),
        help=f"the store (default: ${TARGET_VARIABLE}, which keeps a URI's password off the "
        "command line)",
    )
    worker.add_argument("--processes", type=int, default=1)
    worker.add_argument("--threads", type=int, default=_core.DEFAULT_THREADS)
    worker.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once nothing is pending",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="N",
        help="serve the store's metrics at http://127.0.0.1:N/metrics (Prometheus text)",
    )
    worker.add_argument(
        "--upgrade",
        action="store_true",
        help="record this app in the store in place of the one it was bound to",
    )
    worker.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    worker.epilog = (
        "exit status with --until-idle: 0 when all work is done, 3 when everything left "
        "is parked (see `percolite status`, then `percolite retry`), 4 when export queues "
        "are blocked by a sink that refuses this store besides (`percolite take-over`), "
        "1 on an error"
    )
    worker.add_argument("--worker-count", type=int, default=None, help=argparse.SUPPRESS)
    worker.set_defaults(func=_worker)

    check_cmd = commands.add_parser(
        "check", help="read the whole store back and report damage (exit 1 when damaged)"
    )
    check_cmd.add_argument("db")
    check_cmd.add_argument("--json", action="store_true", help="print the report as JSON")
    check_cmd.set_defaults(func=_check)

    restored = commands.add_parser(
        "restored",
        help="accept a store's data file as restored from a copy on purpose "
        "(what open(..., restored=True) does)",
    )
    restored.add_argument("db")
    restored.set_defaults(func=_restored)

    take_over = commands.add_parser(
        "take-over",
        help="make an export queue's sink belong to this store (clears its rows)",
        description="A sink belongs to the store that first fed it: another store's entries "
        "are refused. When that store is gone for good, this makes the sink of export queue "
        "QUEUE belong to the store DB, deleting the rows the old store exported, and puts the "
        "queue's blocked buckets back to run.",
    )
    take_over.add_argument("app", help="the application, as module:attribute (a percolite.App)")
    take_over.add_argument("queue", help="the export queue's id")
    take_over.add_argument(
        "--db",
        default=os.environ.get(TARGET_VARIABLE),
        required=not os.environ.get(TARGET_VARIABLE),
        help=f"the store (default: ${TARGET_VARIABLE})",
    )
    take_over.set_defaults(func=_take_over)

    ui = commands.add_parser(
        "ui",
        help="serve a live console of the store to a browser",
        description="Serves a live console of the store DB: its observers, queues, worker "
        "groups, failures and dataflow graph, in a browser. The first line printed is the URL "
        "to open, with its access token.",
    )
    ui.add_argument("db")
    from .ui import _cli as ui_cli

    ui_cli.add_arguments(ui)
    ui.set_defaults(func=_ui)

    retry = commands.add_parser("retry", help="put parked work back to run")
    retry.add_argument("db")
    retry.add_argument(
        "--observer", action="append", help="only this observer's parked work (repeatable)"
    )
    retry.add_argument(
        "--queue", action="append", help="only this queue's parked keys (repeatable)"
    )
    retry.set_defaults(func=_retry)

    args = parser.parse_args(argv)
    _configure_logging(args)
    try:
        return args.func(args)
    except percolite.Error as e:
        print(f"percolite: {e}", file=sys.stderr)
        return EXIT_ERROR
    except (ValueError, TypeError, ImportError) as e:
        print(f"percolite: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # a file or a server that cannot be reached
        print(f"percolite: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
