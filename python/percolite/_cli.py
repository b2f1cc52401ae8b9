"""What the commands of ``percolite`` share: how each finds its store, and
the one table of mistakes that every command reports from.

A command that works on a store calls :func:`store_argument` on its parser
(``--db DB``, and for a command whose only positional argument is the
store, ``DB`` as well); ``main()`` resolves the store with
:func:`resolve_store` before the command runs. Whatever a command raises
reaches :func:`explain`, which names the kind of mistake (a row of
:data:`MISTAKES`: the exit status) and the one line printed for it, so the
same mistake reads the same and exits the same from every command.
docs/operations.md has the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from . import _core
from ._env import TARGET_VARIABLE, shared_target, shown_target
from ._workers import (
    EXIT_BLOCKED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_PARKED,
    EXIT_USAGE,
)
from .errors import CorruptionError, Error, SinkBlocked, StorageError, WorkParked

__all__ = [
    "BAD_APP",
    "BAD_ARGUMENT",
    "BAD_TARGET",
    "BLOCKED",
    "DAMAGED",
    "FAILED",
    "INTERRUPTED",
    "MISTAKES",
    "NOT_A_STORE",
    "NOT_DONE",
    "NO_STORE",
    "NO_SUCH_STORE",
    "PARKED",
    "TWO_STORES",
    "UNREACHABLE",
    "CommandError",
    "Mistake",
    "Parser",
    "at_least",
    "check_store",
    "exit_statuses",
    "explain",
    "port",
    "resolve_store",
    "seconds",
    "store_argument",
    "takes_store",
]


@dataclasses.dataclass(frozen=True)
class Mistake:
    """A kind of mistake (or of failure) that a command reports, and the
    exit status it gets."""

    kind: str
    status: int


NO_STORE = Mistake("no store given", EXIT_USAGE)
TWO_STORES = Mistake("two different stores given", EXIT_USAGE)
BAD_TARGET = Mistake("a store this command cannot use", EXIT_USAGE)
NO_SUCH_STORE = Mistake("the store does not exist", EXIT_USAGE)
NOT_A_STORE = Mistake("not a percolite store", EXIT_USAGE)
BAD_APP = Mistake("an app that cannot be loaded", EXIT_USAGE)
BAD_ARGUMENT = Mistake("a bad argument or option value", EXIT_USAGE)
UNREACHABLE = Mistake("the server cannot be reached", EXIT_ERROR)
DAMAGED = Mistake("the store is damaged", EXIT_ERROR)
FAILED = Mistake("another error", EXIT_ERROR)
NOT_DONE = Mistake("still busy or nothing to retry", EXIT_ERROR)
PARKED = Mistake("only parked work left", EXIT_PARKED)
BLOCKED = Mistake("only parked work and blocked export queues left", EXIT_BLOCKED)
INTERRUPTED = Mistake("interrupted (Ctrl-C)", EXIT_INTERRUPTED)

# Every kind, in the order of the table in docs/operations.md.
MISTAKES = (
    NO_STORE,
    TWO_STORES,
    BAD_TARGET,
    NO_SUCH_STORE,
    NOT_A_STORE,
    BAD_APP,
    BAD_ARGUMENT,
    UNREACHABLE,
    DAMAGED,
    FAILED,
    NOT_DONE,
    PARKED,
    BLOCKED,
    INTERRUPTED,
)


class CommandError(Exception):
    """A mistake a command found: ``percolite: <message>`` on standard
    error (nothing for an empty message), and ``mistake.status`` as the
    exit status."""

    def __init__(self, mistake: Mistake, message: str) -> None:
        super().__init__(message)
        self.mistake = mistake


def exit_statuses() -> str:
    """The exit statuses, by :data:`MISTAKES`, for the end of a command's --help."""
    kinds: dict[int, list[str]] = {}
    for mistake in MISTAKES:
        kinds.setdefault(mistake.status, []).append(mistake.kind)
    listed = "; ".join(f"{status} {', '.join(k)}" for status, k in sorted(kinds.items()))
    return f"Exit status: 0 done; {listed}. The table: docs/operations.md."


# -- arguments --------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose mistakes read like the others: one line,
    ``percolite: ...``, exit status 2 (a bad argument or option value). A
    bad value reads ``--limit must be an int >= 0, not '-1'``."""

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:  # named with the command's --help, not the top level's
            command = getattr(parsed, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            self._fail(f"unrecognized arguments: {' '.join(extra)}", prog)
        return parsed

    def error(self, message: str) -> NoReturn:
        self._fail(message, self.prog)

    @staticmethod
    def _fail(message: str, prog: str) -> NoReturn:
        value = re.match(r"argument (\S+): (must be .*)", message)
        if value is not None:
            message = f"{value[1]} {value[2]}"
        else:
            message = re.sub(r"^argument (\S+): ", r"\1: ", message)
            message += f" (see {prog} --help)"
        print(f"percolite: {message}", file=sys.stderr)
        raise SystemExit(BAD_ARGUMENT.status)


def at_least(least: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"must be an int >= {least}, not {text!r}")
        return value

    return parse


def seconds(text: str) -> float:
    """An argparse type: a number of seconds >= 0 (``inf``: no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, not {text!r}")
    return value


def port(text: str) -> int:
    """An argparse type: a TCP port number."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, not {text!r}")
    return value


def port_or_zero(text: str) -> int:
    """An argparse type: a TCP port number, or 0 for a free one."""
    if text.strip() == "0":
        return 0
    try:
        return port(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be a port number from 1 to 65535, or 0 for a free one, not {text!r}"
        ) from None


# -- the store ------------------------------------------------------------------

STORE_HELP = "the store: a directory or a postgresql:// URI"


def store_argument(
    parser: argparse.ArgumentParser, *, positional: bool = False, creates: bool = False
) -> None:
    """Adds the store's arguments to a command's ``parser``: ``--db DB``,
    and with ``positional`` an optional first ``DB`` too (for commands
    whose only positional argument is the store); without either the store
    comes from ``$PERCOLITE_DB``. ``main()`` then calls :func:`resolve_store`
    before the command runs. ``creates``: the command makes the store when
    there is none."""
    made = "; made when missing" if creates else ""
    if positional:
        parser.add_argument(
            "store",
            nargs="?",
            metavar="DB",
            help=f"{STORE_HELP}{made}, as --db gives it (default: --db, else ${TARGET_VARIABLE})",
        )
    parser.add_argument(
        "--db",
        metavar="DB",
        help=f"{STORE_HELP}{made} (default: ${TARGET_VARIABLE}, which keeps a URI's password "
        "off the command line)",
    )
    parser.set_defaults(store_creates=creates)


def takes_store(args: argparse.Namespace) -> bool:
    """Whether the command ``args`` were parsed for called :func:`store_argument`."""
    return hasattr(args, "store_creates")


def resolve_store(args: argparse.Namespace, *, environ: Mapping[str, str] | None = None) -> str:
    """The store a command was given, checked, also set as ``args.db``: the
    positional ``DB``, else ``--db``, else ``$PERCOLITE_DB`` (an empty one
    counts as none). Raises :class:`CommandError`: no store given, two
    different ones, or what :func:`check_store` finds."""
    environ = os.environ if environ is None else environ
    positional = getattr(args, "store", None) or None
    option = getattr(args, "db", None) or None
    if positional is not None and option is not None and not _same_store(positional, option):
        raise CommandError(
            TWO_STORES,
            f"two stores given, {shown_target(positional)} and --db {shown_target(option)}: "
            "give one",
        )
    target = positional or option or environ.get(TARGET_VARIABLE) or None
    if target is None:
        raise CommandError(
            NO_STORE,
            "no store given: name it with --db DB (a directory or a postgresql:// URI) or "
            f"${TARGET_VARIABLE}",
        )
    check_store(target, creates=getattr(args, "store_creates", False))
    args.db = target
    return target


def _same_store(first: str, second: str) -> bool:
    """Whether two targets name one store (``store`` and ``./store`` do)."""
    if first == second:
        return True
    try:
        (kind_a, where_a), (kind_b, where_b) = _core.parse_target(first), _core.parse_target(second)
    except ValueError:
        return False
    if kind_a == kind_b == "lmdb":
        return os.path.realpath(where_a) == os.path.realpath(where_b)
    return False


def check_store(target: str, *, creates: bool = False, shared: bool = True) -> None:
    """Raises :class:`CommandError` when ``target`` cannot be a store for a
    command: a malformed target, one no other process can open (unless not
    ``shared``), a path that is a file, and unless ``creates``, a path that
    does not exist or a directory that holds no store. A server's store is
    looked at when it is opened (:func:`explain` words what goes wrong)."""
    try:
        if shared:
            backend, location = shared_target(target)
        else:
            backend, location = _core.parse_target(os.fsdecode(target))
    except ValueError as e:
        raise CommandError(BAD_TARGET, str(e)) from None
    if backend != "lmdb":
        return
    if os.path.isdir(location):
        if not creates and not os.path.lexists(os.path.join(location, "data.mdb")):
            raise _not_a_store(target, "the directory holds none (no data.mdb)")
    elif os.path.exists(location):
        raise _not_a_store(target, "it is a file (a store is a directory)")
    elif not creates:
        raise CommandError(
            NO_SUCH_STORE, f"{shown_target(target)}: no such store: nothing is there"
        )


def _not_a_store(target: str, why: str) -> CommandError:
    return CommandError(NOT_A_STORE, f"{shown_target(target)}: not a percolite store: {why}")


# -- what a raised exception means ---------------------------------------------


def _as(mistake: Mistake) -> Callable[[BaseException, str | None], CommandError]:
    return lambda error, store: CommandError(mistake, str(error))


def _store_refused(error: BaseException, store: str | None) -> CommandError | None:
    """A server's refusal of the store, from its words: it cannot be
    reached, or what the target names holds no percolite store."""
    text = str(error)
    if text.startswith("cannot connect to"):
        return _unreachable(error, store)
    if store is None or not store.lower().startswith(("postgresql:", "postgres:")):
        return None
    if "no percolite store in schema" in text:
        schema = _core.parse_postgresql_target(store)[1]
        return _not_a_store(store, f"its schema {schema} holds none")
    if "but no percolite store" in text or "is not a percolite store's" in text:
        return _not_a_store(store, text)
    return None


def _unreachable(error: BaseException, store: str | None) -> CommandError:
    # libpq's reasons span lines (a hint on the next one): one line here.
    return CommandError(UNREACHABLE, " ".join(str(error).split()))


def _storage(error: BaseException, store: str | None) -> CommandError:
    return _store_refused(error, store) or CommandError(FAILED, str(error))


def _value(error: BaseException, store: str | None) -> CommandError:
    return _store_refused(error, store) or CommandError(BAD_ARGUMENT, str(error))


# How an exception that reached main() is reported: the first row whose
# class it is gives the mistake and its words. Any other exception is a
# bug, and keeps its traceback.
REPORTED: tuple[tuple[type[BaseException], Callable[..., CommandError]], ...] = (
    (CommandError, lambda error, store: error),
    (SinkBlocked, _as(BLOCKED)),
    (WorkParked, _as(PARKED)),
    (CorruptionError, _as(DAMAGED)),
    (StorageError, _storage),
    (Error, _as(FAILED)),
    (ConnectionError, _unreachable),  # a sink's server (an OSError)
    (ValueError, _value),
    (TypeError, _as(BAD_ARGUMENT)),
    (OSError, _as(FAILED)),  # a file, a directory, a port
    (ImportError, _as(FAILED)),  # an optional dependency missing (an app's import: BAD_APP)
    (KeyboardInterrupt, lambda error, store: CommandError(INTERRUPTED, "")),
)


def explain(error: BaseException, store: str | None = None) -> CommandError | None:
    """``error`` (raised by a command working on ``store``) as the mistake
    it reports, by the :data:`REPORTED` table; None for anything else."""
    for kind, report in REPORTED:
        if isinstance(error, kind):
            return report(error, store)
    return None
