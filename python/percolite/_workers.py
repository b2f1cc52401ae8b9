"""Running an application's observers in one or several worker processes.

``percolite worker module:app --db DB --processes N --threads T`` and
:func:`run_workers` start N processes; process ``i`` takes the notifications
whose row hash is ``i`` mod ``N``. Each process opens the store itself (never
inherited through ``fork()``) and imports the app by name, so every process
builds the same registry.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import _core, _log, _metrics
from ._app import App
from ._env import TARGET_VARIABLE, shared_target, shown_target
from ._env import open as open_env
from .errors import SinkBlocked, StorageError, WorkParked

__all__ = [
    "load_app",
    "run_workers",
    "run_worker_processes",
    "EXIT_DONE",
    "EXIT_ERROR",
    "EXIT_USAGE",
    "EXIT_PARKED",
    "EXIT_BLOCKED",
    "EXIT_INTERRUPTED",
]

# Exit statuses of `percolite worker --until-idle` (and run_workers).
EXIT_DONE = 0  # nothing left to run, nothing parked
EXIT_ERROR = 1  # an error stopped it
EXIT_USAGE = 2  # bad arguments
EXIT_PARKED = 3  # nothing left to run but parked work
EXIT_BLOCKED = 4  # ... and an export queue blocked by a sink refusing the store
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)


@contextlib.contextmanager
def _import_errors(module_name: str) -> Iterator[None]:
    """Any exception raised while importing the app's module, as one
    ImportError naming the module and the exception (the command line then
    prints one line and exits 2)."""
    try:
        yield
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the module raised
        raise ImportError(f"importing {module_name!r} raised {type(e).__name__}: {e}") from e


def load_app(spec: str) -> App:
    """Import ``module:attribute`` (or ``path/to/file.py:attribute``) and
    return that :class:`percolite.App`."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"app must be given as module:attribute, not {spec!r}")
    module_name, _, attribute = spec.rpartition(":")
    if module_name.endswith(".py") or os.sep in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise ImportError(f"no such file: {module_name}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules.setdefault(path.stem, module)
        with _import_errors(module_name):
            module_spec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        with _import_errors(module_name):
            module = importlib.import_module(module_name)
    try:
        app = getattr(module, attribute)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(app, App):
        raise TypeError(f"{spec} is a {type(app).__name__}, not a percolite.App")
    return app


# Set by `percolite worker --processes N` for its children: the group's id
# (their leases' group) and the parent's pid (they stop when it is gone).
GROUP_VARIABLE = "PERCOLITE_WORKER_GROUP"
PARENT_VARIABLE = "PERCOLITE_WORKER_PARENT"
# How often a worker process looks whether its group's parent is still there.
PARENT_CHECK_SECONDS = 0.25


def _run_in_this_process(
    app: App,
    db: str,
    threads: int,
    until_idle: bool,
    worker_index: int | None,
    worker_count: int | None,
    metrics_port: int | None = None,
    upgrade: bool = False,
    ui_port: int | None = None,
) -> int:
    # The handler only sets a flag: taking a lock there (threading.Event.set
    # does) deadlocks when a second SIGTERM arrives while the first handler
    # holds it, which happens when both the parent and a process-group kill
    # deliver one. Without --until-idle the loop below waits on a pipe that
    # the interpreter's C-level signal handler writes to (set_wakeup_fd), so
    # a stop begins at once rather than at the next check, even when the
    # signal comes between the flag's check and the wait (time.sleep resumes
    # after a handler; select returns on the byte).
    stop_requested = [False]

    def request_stop(signum, frame):  # noqa: ARG001
        stop_requested[0] = True

    parent = os.environ.get(PARENT_VARIABLE)
    parent_pid = int(parent) if parent and parent.isdigit() else None

    def orphaned() -> bool:
        # A group's process lives and dies with the parent: once the parent is
        # gone (even SIGKILLed, with no chance to stop its children), a
        # supervisor restarting the command must not find the old group
        # still working beside the new one.
        return parent_pid is not None and os.getppid() != parent_pid

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    # The main thread (checked by the callers), so neither call raises.
    previous_wakeup = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    previous = signal.signal(signal.SIGTERM, request_stop)
    try:
        with (
            open_env(db, app=app, create=False, upgrade=upgrade) as env,
            _servers(env, metrics_port, ui_port),
        ):
            env.start_workers(
                threads,
                worker_index=worker_index,
                worker_count=worker_count,
                lease_group=os.environ.get(GROUP_VARIABLE, ""),
            )
            try:
                while not stop_requested[0]:
                    if orphaned():
                        _log.workers.warning(
                            "the parent (pid %d) of this worker group is gone: stopping",
                            parent_pid,
                        )
                        return EXIT_ERROR
                    if until_idle and env.wait(timeout=PARENT_CHECK_SECONDS):
                        return EXIT_DONE
                    if not until_idle:
                        ready, _, _ = select.select([wake_read], [], [], PARENT_CHECK_SECONDS)
                        if ready:  # any handled signal writes; drained, or the wait would spin
                            with contextlib.suppress(BlockingIOError):
                                os.read(wake_read, 512)
            except WorkParked as e:
                if parent_pid is None:  # in a group, the parent says it once
                    _log.logger.error("%s", e)
                return EXIT_BLOCKED if isinstance(e, SinkBlocked) else EXIT_PARKED
            except KeyboardInterrupt:
                return EXIT_INTERRUPTED
        return EXIT_DONE
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.set_wakeup_fd(previous_wakeup)
        os.close(wake_read)
        os.close(wake_write)


@contextlib.contextmanager
def _servers(env: Any, metrics_port: int | None, ui_port: int | None) -> Iterator[None]:
    """While in the block, serves ``env``'s metrics on 127.0.0.1:``metrics_port``
    and its console on 127.0.0.1:``ui_port`` (its URL, with the token, printed
    on standard output first); nothing for None."""
    with contextlib.ExitStack() as stack:
        if metrics_port is not None:
            server = _metrics.serve(env, metrics_port)
            stack.callback(server.server_close)
            stack.callback(server.shutdown)
        if ui_port is not None:
            from .ui._server import Console

            try:
                console = Console(env, port=ui_port)
            except ValueError as e:
                from .ui._server import name_the_option

                raise ValueError(name_the_option(str(e), "--ui-port")) from None
            _log.logger.getChild("ui").setLevel(logging.INFO)  # actions taken from the page
            stack.callback(console.close)
            console.start()
            print(console.url, flush=True)
        yield


def _group_status(codes: list[int]) -> int:
    """One exit status for a group of worker processes. A process killed by a
    signal lost nothing (its lease lapsed and the others took its share), so
    it counts only when no process finished; otherwise an error of any
    first, then parked work, then done."""
    finished = [c for c in codes if c >= 0]
    if not finished:
        return EXIT_ERROR
    errors = [c for c in finished if c not in (EXIT_DONE, EXIT_PARKED, EXIT_BLOCKED)]
    if errors:
        return errors[0]
    for status in (EXIT_BLOCKED, EXIT_PARKED):
        if status in finished:
            return status
    return EXIT_DONE


def _require_main_thread() -> None:
    # Before anything starts: a handler for SIGTERM can only be set there, and
    # worker processes started first would be left running.
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "run the workers from the main thread: they stop on SIGTERM, and only the main "
            "thread can handle signals"
        )


def run_worker_processes(
    *,
    app_spec: str,
    app: App,
    db: str,
    processes: int = 1,
    threads: int = _core.DEFAULT_THREADS,
    until_idle: bool = False,
    worker_index: int | None = None,
    worker_count: int | None = None,
    metrics_port: int | None = None,
    upgrade: bool = False,
    ui_port: int | None = None,
) -> int:
    _require_main_thread()
    if processes < 1:
        raise ValueError(f"processes must be at least 1, not {processes}")
    if threads < 1:
        raise ValueError(f"threads must be at least 1, not {threads}")
    if (worker_index is None) != (worker_count is None):
        raise ValueError("give --worker-index and --worker-count together, or neither")
    backend, target = shared_target(db)
    if backend == "lmdb" and not Path(target).is_dir():
        raise StorageError(f"no percolite store at {db!r}")
    if worker_index is not None or processes == 1:
        return _run_in_this_process(
            app, db, threads, until_idle, worker_index, worker_count, metrics_port, upgrade, ui_port
        )
    # The store reaches the children in the environment: a postgresql:// URI
    # may carry a password, which never goes on a command line.
    command = [sys.executable, "-m", "percolite", "worker", app_spec, "--threads", str(threads)]
    if upgrade:
        # One process records the app first, so the children agree with it.
        open_env(db, app=app, create=False, upgrade=True).close()
    if until_idle:
        command.append("--until-idle")
    group = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    child_env = dict(os.environ)
    child_env.update(
        {GROUP_VARIABLE: group, PARENT_VARIABLE: str(os.getpid()), TARGET_VARIABLE: os.fspath(db)}
    )
    # The parent serves the metrics and the console (read from the store, whoever worked).
    serving = contextlib.ExitStack()
    if metrics_port is not None or ui_port is not None:
        with contextlib.ExitStack() as starting:
            monitor = starting.enter_context(open_env(db, app=app, create=False))
            starting.enter_context(_servers(monitor, metrics_port, ui_port))
            serving = starting.pop_all()  # both started: closed at the end
    children = [subprocess.Popen(command, env=child_env) for _ in range(processes)]

    def stop_children(signum=signal.SIGTERM, frame=None):  # noqa: ARG001
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop_children)
    try:
        codes = [child.wait() for child in children]
        for child, code in zip(children, codes, strict=True):
            if code < 0:
                _log.workers.warning(
                    "worker process %d was killed by signal %d; the others took its share",
                    child.pid,
                    -code,
                )
        status = _group_status(codes)
        store = shlex.quote(shown_target(os.fspath(db)))  # never a URI's password
        if status == EXIT_BLOCKED:
            _log.logger.error(
                "nothing left to run but parked work and export queues blocked by a sink that "
                "refuses this store; see `percolite status --db %s`",
                store,
            )
        elif status == EXIT_PARKED:
            _log.logger.error(
                "nothing left to run but parked work; see `percolite status --db %s`, fix the "
                "cause, then `percolite retry --db %s`",
                store,
                store,
            )
        return status
    except KeyboardInterrupt:
        stop_children()
        for child in children:
            child.wait()
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
        serving.close()


def run_workers(
    app: str,
    db: str | os.PathLike[str],
    *,
    processes: int = 1,
    threads: int = _core.DEFAULT_THREADS,
    until_idle: bool = True,
) -> int:
    """Run ``app`` (given as ``"module:attribute"``) on store ``db`` in
    ``processes`` worker processes of ``threads`` threads each; with
    ``until_idle`` (default) return once nothing is pending. Returns the exit
    status: ``EXIT_DONE`` (0) when all work is done, ``EXIT_PARKED`` (3)
    when everything left is parked work, ``EXIT_ERROR`` (1) on an error.
    Raises RuntimeError when called from a thread other than the main one."""
    _require_main_thread()  # before the app's module is imported
    return run_worker_processes(
        app_spec=app,
        app=load_app(app),
        db=os.fspath(db),
        processes=processes,
        threads=threads,
        until_idle=until_idle,
    )
