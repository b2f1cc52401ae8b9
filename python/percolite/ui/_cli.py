"""``percolite ui DB``: serve the console of a store from the command line."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from .._cli import port_or_zero
from .._env import shown_target
from .._workers import EXIT_DONE, EXIT_INTERRUPTED
from ._server import DEFAULT_HOST, DEFAULT_PORT, Console, name_the_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"the address to listen on (default: {DEFAULT_HOST}, this machine only)",
    )
    parser.add_argument(
        "--port",
        type=port_or_zero,
        default=DEFAULT_PORT,
        help=f"the port to listen on; 0 picks a free one (default: {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--app",
        metavar="MODULE:APP",
        default=None,
        help="the application (a percolite.App), for what needs its code: taking a sink "
        "over, the exporters' names (default: none, the app the store recorded is shown)",
    )


def serve(env, host: str, port: int) -> int:
    """Serves the console of ``env`` until interrupted; the URL goes to
    standard output first. Returns 0 after SIGTERM (a supervisor's stop),
    130 after Ctrl-C, as every command does."""
    try:
        console = Console(env, host=host, port=port)
    except ValueError as e:
        raise ValueError(name_the_option(str(e), "--port")) from None
    logging.getLogger("percolite.ui").setLevel(logging.INFO)  # the actions, logged
    print(console.url, flush=True)
    print(
        f"serving the console of {shown_target(env.path)} on {console.host}:{console.port}; "
        "Ctrl-C stops it",
        file=sys.stderr,
        flush=True,
    )
    terminated = []

    def stop(signum, frame):  # noqa: ARG001 - SIGTERM ends it as Ctrl-C does, exit 0
        terminated.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        console.serve_forever()
    except KeyboardInterrupt:
        return EXIT_DONE if terminated else EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
        console.close()
    return EXIT_DONE
