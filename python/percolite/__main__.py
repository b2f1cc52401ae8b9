"""The percolite command line: ``percolite`` or ``python -m percolite``.

Commands: ``phrasecount [PATH ...]``, ``webindex load|top|inlinks|domains``,
``demo``, ``status``, ``scan``, ``wait``, ``worker MODULE:APP``, ``retry``,
``take-over MODULE:APP QUEUE``, ``check``, ``restored``. Each takes its store as ``--db DB`` or from
``$PERCOLITE_DB``; those whose only positional argument is the store take
it as ``DB`` too (``percolite status DB``).

Every command reports its mistakes the same way: one line, ``percolite:
...``, on standard error and an exit status by kind (the table in _cli and
docs/operations.md): 0 done; 1 an error; 2 a mistake in the command (no
store there among them); 3 (``worker --until-idle`` and ``wait``) nothing
left to run but parked work; 4 (the same) nothing left but parked work and
export queues blocked by a sink that refuses the store (``take-over``);
130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence

import percolite

from . import _core
from ._cli import (
    BAD_APP,
    BAD_TARGET,
    NOT_DONE,
    CommandError,
    Parser,
    at_least,
    check_store,
    exit_statuses,
    explain,
    port,
    port_or_zero,
    resolve_store,
    seconds,
    store_argument,
    takes_store,
)
from ._env import TARGET_VARIABLE, shown_target, store_directory
from ._log import describe_cell, shown
from ._metrics import prometheus_text
from ._workers import EXIT_DONE, EXIT_ERROR, load_app, run_worker_processes


def _demo(args: argparse.Namespace) -> int:
    """A small tour of transactions: concurrent increments without lost updates."""
    import threading

    if args.db:
        check_store(args.db, creates=True, shared=False)  # ":memory:" is fine here
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
    return percolite.open(path, create=False)  # resolve_store refused private targets


def _printable(value: bytes) -> str:
    text = value.decode("utf-8", "backslashreplace")
    return text if text.isprintable() else repr(value)


def _when(unix: float | None) -> str:
    if unix is None:
        return "-"
    return datetime.datetime.fromtimestamp(unix).isoformat(sep=" ", timespec="seconds")


def _status(args: argparse.Namespace) -> int:
    # Its own writes (its handle's row, its metrics) need no sync: so status
    # answers while commits that wait for a synchronous standby hang.
    with percolite.open(args.db, create=False, sync="none") as env:
        if args.prometheus:
            sys.stdout.write(prometheus_text(env.metrics()))
            return EXIT_DONE
        status = env.status()
        # All of it, not status()'s first STATUS_PARKED_LIMIT: the summary counts it.
        parked = env.parked() if status["parked"] and not args.json else []
    if args.json:
        print(json.dumps(status, default=lambda b: b.decode("utf-8", "backslashreplace"), indent=2))
        return EXIT_DONE
    print(f"store:   {status['path']}")
    if status["identity"] is not None:
        identity = status["identity"]
        print(f"identity: {identity['store']} (epoch {identity['epoch']})")
    server = status["server"]
    if server is not None:
        _print_server(server)
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
        # A pool alone is its own group, named after it: say so once.
        group = "" if h["group"] == h["owner"] else f" group {h['group']} "
        print(
            f"  {h['owner']:<40}{group} {h['threads']} threads, "
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
    if parked:
        (_parked_items if args.details else _parked_summary)(parked)
        _retry_commands(args.db, parked)
    return EXIT_DONE


def _print_server(server: dict) -> None:
    """The server line of ``percolite status``, and the last reconnection
    and failover any process recorded."""
    n = server["reconnections"]
    print(
        f"server:  {server['address']} ({n} reconnection{'s' if n != 1 else ''}, "
        f"{server['failovers']} failover{'s' if server['failovers'] != 1 else ''}, "
        "every process)"
    )
    replication = server["replication"]
    n = server["standbys"]
    connected = f"{n} standby{'' if n == 1 else 's'} connected"
    if replication == "synchronous":
        names = server["synchronous_standby_names"]
        print(f"  replication: synchronous ({names}), {connected}")
    elif replication == "asynchronous":
        print(f"  replication: asynchronous, {connected} (a failover may lose the last commits)")
    else:
        print("  replication: none, no standby connected (a lost server loses the store)")
    waits = server["waiting_for_standbys"]
    if waits["sessions"]:
        print(
            f"  commits waiting for a synchronous standby: {waits['sessions']} sessions, the "
            f"longest for {waits['longest_seconds']:.0f} s (a standby that does not answer "
            "blocks every commit: see pg_stat_replication; a quorum, ANY 1 (s1, s2), "
            "outlives one)"
        )
    last = server["last_failover"]
    if last is not None:
        seen = f"(seen by {last['process']})"
        print(f"  last failover {_when(last['unix'])}: {last['servers']} {seen}")
    last = server["last_reconnection"]
    if last is not None:
        print(
            f"  last reconnection {_when(last['unix'])} to {last['server']} "
            f"(seen by {last['process']}): {last['cause']}"
        )


def _parked_items(records: list[dict]) -> None:
    """Every parked notification and queue key, with its traceback."""
    for record in records:
        error = record["error"]
        if record["queue"] is not None:
            what = f"{record['observer']} key {shown(record['key'])}"
        else:
            what = f"observer {record['observer']!r} on {describe_cell(record)}"
        print(
            f"parked: {what} after {_attempts(record)}, "
            f"last at {_when(record['last_failure_unix'])}:"
        )
        print(_indented(error["traceback"]))


def _parked_summary(records: list[dict]) -> None:
    """The parked work counted by observer (or queue) and error type, with
    the traceback of the last failure of each."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        groups.setdefault((record["observer"], record["error"]["type"]), []).append(record)
    print("parked work, by observer and error (every item: --verbose):")
    for (observer, error_type), group in sorted(
        groups.items(), key=lambda item: (item[1][0]["queue"] is not None, item[0])
    ):
        last = max(group, key=lambda r: r["last_failure_unix"] or 0)
        n = len(group)
        if last["queue"] is not None:
            who = _queue_named(observer)
            counted = f"{n} key{'s' if n != 1 else ''}"
            where = f"key {shown(last['key'])}"
        else:
            who = f"observer {observer!r}"
            counted = f"{n} notification{'s' if n != 1 else ''}"
            where = describe_cell(last)
        print(
            f"  {who}: {counted} parked after {error_type}, such as {where} "
            f"({_attempts(last)}, the last at {_when(last['last_failure_unix'])}):"
        )
        print(_indented(last["error"]["traceback"], "      "))


def _retry_commands(db: str, records: list[dict]) -> None:
    """The commands that put the parked work back to run: all of it, and
    each observer's or queue's alone when there are several."""
    shown_db = shown_target(db)
    # A URI's password is never printed: then the store comes from $PERCOLITE_DB.
    retry = "percolite retry" + (f" --db {shlex.quote(shown_db)}" if shown_db == db else "")
    print(f"once the cause is fixed, run it again: {retry}")
    whose = {(r["observer"], r["queue"]) for r in records}
    if len(whose) > 1:
        for observer, queue in sorted(whose, key=lambda w: (w[1] is not None, w[0])):
            if queue is None:
                print(f"  only observer {observer!r}: {retry} --observer {shlex.quote(observer)}")
            else:
                print(f"  only {_queue_named(observer)}: {retry} --queue {shlex.quote(queue)}")
    if shown_db != db:
        print(f"  (with the store in ${TARGET_VARIABLE})")


def _queue_named(processor: str) -> str:
    """The queue whose processor runs as observer ``processor``, as messages
    name it: "combine queue 'totals'"."""
    kind, queue_id = _core.parse_processor_name(processor) or ("queue", processor)
    return f"{kind} {queue_id!r}"


def _attempts(record: dict) -> str:
    return f"{record['attempts']} attempt{'s' if record['attempts'] != 1 else ''}"


def _indented(text: str | None, indent: str = "    ") -> str:
    return indent + (text or "").rstrip("\n").replace("\n", "\n" + indent)


def _retry(args: argparse.Namespace) -> int:
    with _open_existing(args.db) as env:
        parked = env.parked()
        if not parked:
            raise CommandError(NOT_DONE, f"nothing is parked in {env.path}")
        names = args.observer or []
        queues = args.queue or []
        unknown = sorted(set(names) - {r["observer"] for r in parked})
        unknown += sorted(set(queues) - {r["queue"] for r in parked if r["queue"] is not None})
        if unknown:
            raise CommandError(
                NOT_DONE,
                f"no parked work of {', '.join(map(repr, unknown))} in {env.path}; "
                "nothing was retried",
            )
        retried = env.retry_parked(names or None, queue=queues or None)
    print(f"retried {retried} parked item{'s' if retried != 1 else ''}; run the workers")
    return EXIT_DONE


def _check(args: argparse.Namespace) -> int:
    report = percolite.check(args.db)
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
    try:
        store_directory(args.db)  # a server's store has no data file to restore
    except ValueError as e:
        raise CommandError(BAD_TARGET, str(e)) from None
    with percolite.open(args.db, create=False, restored=True):
        pass
    print(
        f"{args.db}: accepted as restored from a copy (its durable mark starts again from it, "
        "and any record of damage is cleared); run 'percolite check' on it before the workers"
    )
    return EXIT_DONE


def _scan(args: argparse.Namespace) -> int:
    with _open_existing(args.db) as env:
        if args.notifications:
            after, shown = b"", 0
            while shown < args.limit:
                chunk = env.core.scan_notifications(after, min(512, args.limit - shown))
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
    with _open_existing(args.db) as env:
        # Parked work raises WorkParked (or SinkBlocked): exit EXIT_PARKED (or
        # EXIT_BLOCKED), see _cli.
        idle = env.wait(timeout=args.timeout, progress="auto" if not args.quiet else False)
    if not idle:
        raise CommandError(NOT_DONE, f"still busy after {args.timeout} s")
    return EXIT_DONE


def _load_app(spec: str) -> percolite.App:
    try:
        return load_app(spec)
    except (ImportError, TypeError, ValueError) as e:
        raise CommandError(BAD_APP, f"cannot load app {spec!r}: {e}") from e


def _take_over(args: argparse.Namespace) -> int:
    app = _load_app(args.app)
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
    app = _load_app(args.app)
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
        ui_port=args.ui_port,
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

    app = _load_app(args.app) if args.app else None
    with percolite.open(args.db, app=app, create=False) as env:
        return ui_cli.serve(env, args.host, args.port)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (``func``: the function that runs it)."""
    summary = percolite.__doc__.splitlines()[0].rstrip(".")
    parser = Parser(
        prog="percolite",
        description=f"{summary}. Every command takes its store as --db DB or from "
        f"${TARGET_VARIABLE}.",
        epilog=exit_statuses(),
    )
    parser.add_argument("--version", action="version", version=percolite.__version__)
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more, before the command: -v INFO, -vv DEBUG (default: WARNING and above)",
    )
    parser.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        type=str.upper,
        help="the level of the percolite loggers, overriding -v (default: WARNING)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str = "") -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}. {description}".strip(),
            epilog=exit_statuses(),
        )

    from .phrasecount import cli as phrasecount_cli

    phrasecount = command(
        "phrasecount",
        "count 4-word phrases of documents (default: the stdlib's docstrings) and export them",
        "Loads the files under the PATHs into the store (made when missing), lets worker "
        "processes count and export the phrases, and prints the top ones. Running it again "
        "processes only what changed.",
    )
    phrasecount_cli.add_arguments(phrasecount)
    phrasecount.set_defaults(func=phrasecount_cli.main)

    from .webindex import cli as webindex_cli

    webindex = command(
        "webindex",
        "inbound links of web pages, kept current in a query database",
        "`webindex load PATH...` loads directories of HTML files, link records or WARC files; "
        "`webindex top|inlinks|domains` query the database it keeps.",
    )
    webindex_cli.add_arguments(webindex)

    demo = command(
        "demo",
        "a short tour of transactions",
        "Threads increment one counter; every increment counts, conflicts are retried.",
    )
    demo.add_argument(
        "--db",
        metavar="DB",
        help="the store to write the counter into: a directory (made when missing) or "
        f":memory: (default: a temporary directory, deleted after; ${TARGET_VARIABLE} is "
        "not read)",
    )
    demo.add_argument(
        "--threads", type=at_least(1), default=4, help="threads incrementing (default: 4)"
    )
    demo.add_argument(
        "--increments",
        type=at_least(1),
        default=100,
        help="increments per thread (default: 100)",
    )
    demo.set_defaults(func=_demo)

    status = command(
        "status",
        "pending notifications, observers, failures and parked work",
        "Opens the store without an app, from any process. Parked work is summed up by "
        "observer and error, with the command that retries it.",
    )
    store_argument(status, positional=True)
    output = status.add_mutually_exclusive_group()
    output.add_argument(
        "--json", action="store_true", help="print env.status() as JSON (default: text)"
    )
    output.add_argument(
        "--prometheus",
        action="store_true",
        help="print the store's metrics in the Prometheus text exposition format (default: text)",
    )
    output.add_argument(
        "--verbose",
        dest="details",
        action="store_true",
        help="list every parked item with its traceback (default: a summary, one traceback "
        "per observer and error type); `percolite -v status` sets the log level instead",
    )
    status.set_defaults(func=_status)

    scan = command("scan", "print cells, or pending notifications")
    store_argument(scan, positional=True)
    scan.add_argument(
        "--prefix", help="only rows starting with this (default: every row, not percolite's own)"
    )
    scan.add_argument(
        "--notifications",
        action="store_true",
        help="list the pending notifications instead of cells (default: cells)",
    )
    scan.add_argument(
        "--limit",
        type=at_least(0),
        default=1000,
        metavar="N",
        help="print at most N lines (default: 1000)",
    )
    scan.set_defaults(func=_scan)

    wait = command(
        "wait",
        "wait until no notification is pending",
        "Whichever processes the workers run in.",
    )
    store_argument(wait, positional=True)
    wait.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        metavar="S",
        help="give up after S seconds, exit status 1 (default: no limit)",
    )
    wait.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar (default: one on terminals, with tqdm installed)",
    )
    wait.set_defaults(func=_wait)

    worker = command(
        "worker",
        "run an app's observers and queues on a store",
        "Runs until SIGTERM or Ctrl-C (running observers finish first), or with --until-idle "
        "until nothing is left to run. The store must exist.",
    )
    worker.add_argument(
        "app",
        metavar="MODULE:APP",
        help="the percolite.App to run: a module on the path and its attribute, or "
        "path/to/file.py:app",
    )
    store_argument(worker)
    worker.add_argument(
        "--processes",
        type=at_least(1),
        default=1,
        metavar="N",
        help="worker processes; with more than 1 they share the work by lease (default: 1)",
    )
    worker.add_argument(
        "--threads",
        type=at_least(1),
        default=_core.DEFAULT_THREADS,
        metavar="T",
        help=f"worker threads per process (default: {_core.DEFAULT_THREADS})",
    )
    worker.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once nothing is left to run: 0 all done, 3 parked work left, 4 export "
        "queues blocked too (default: run until stopped)",
    )
    worker.add_argument(
        "--metrics-port",
        type=port,
        default=None,
        metavar="N",
        help="serve the store's metrics at http://127.0.0.1:N/metrics, Prometheus text "
        "(default: not served)",
    )
    worker.add_argument(
        "--ui-port",
        type=port_or_zero,
        default=None,
        metavar="N",
        help="serve the live console at http://127.0.0.1:N/ (0: a free port); its URL, with "
        "the access token, is printed first (default: not served)",
    )
    worker.add_argument(
        "--upgrade",
        action="store_true",
        help="record this app in the store in place of the one it was bound to (default: "
        "refuse an app that differs)",
    )
    worker.add_argument("--worker-index", type=at_least(0), default=None, help=argparse.SUPPRESS)
    worker.add_argument("--worker-count", type=at_least(1), default=None, help=argparse.SUPPRESS)
    worker.set_defaults(func=_worker)

    check_cmd = command(
        "check",
        "read the whole store back and report damage",
        "Exit status 0 clean, 1 damaged.",
    )
    store_argument(check_cmd, positional=True)
    check_cmd.add_argument(
        "--json", action="store_true", help="print the report as JSON (default: text)"
    )
    check_cmd.set_defaults(func=_check)

    restored = command(
        "restored",
        "accept a store's data file as restored from a copy on purpose",
        "What percolite.open(..., restored=True) does: the durable mark starts again from it "
        "and any record of damage is cleared. Run percolite check on it next.",
    )
    store_argument(restored, positional=True)
    restored.set_defaults(func=_restored)

    take_over = command(
        "take-over",
        "make an export queue's sink belong to this store (clears its rows)",
        "A sink belongs to the store that first fed it: another store's entries are refused. "
        "When that store is gone for good, this makes the sink of export queue QUEUE belong "
        "to the store, deleting the rows the old store exported, and puts the queue's "
        "blocked buckets back to run.",
    )
    take_over.add_argument(
        "app", metavar="MODULE:APP", help="the percolite.App that declares the queue"
    )
    take_over.add_argument("queue", metavar="QUEUE", help="the export queue's id")
    store_argument(take_over)
    take_over.set_defaults(func=_take_over)

    ui = command(
        "ui",
        "serve a live console of the store to a browser",
        "Its observers, queues, worker groups, failures and dataflow graph, updating "
        "themselves; retry parked work and take sinks over from the page. The first line "
        "printed is the URL to open, with its access token.",
    )
    store_argument(ui, positional=True)
    from .ui import _cli as ui_cli

    ui_cli.add_arguments(ui)
    ui.set_defaults(func=_ui)

    retry = command(
        "retry",
        "put parked work back to run",
        "The workers run it again with a fresh count of attempts.",
    )
    store_argument(retry, positional=True)
    retry.add_argument(
        "--observer",
        action="append",
        metavar="NAME",
        help="only this observer's parked work; repeatable (default: all parked work)",
    )
    retry.add_argument(
        "--queue",
        action="append",
        metavar="ID",
        help="only this queue's parked keys; repeatable (default: all parked work)",
    )
    retry.set_defaults(func=_retry)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args)
    try:
        if takes_store(args):
            resolve_store(args)
        return args.func(args)
    except (Exception, KeyboardInterrupt) as e:
        # One line and one exit status per kind of mistake: the table in _cli.
        failure = explain(e, getattr(args, "db", None))
        if failure is None:
            raise  # a bug: its traceback
        if str(failure):
            print(f"percolite: {failure}", file=sys.stderr)
        return failure.mistake.status


if __name__ == "__main__":
    sys.exit(main())
