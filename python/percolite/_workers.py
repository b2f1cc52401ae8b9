"""Running an application's observers in one or several worker processes.

``percolite worker module:app --db DB --processes N --threads T`` and
:func:`run_workers` start N processes; process ``i`` takes the notifications
whose row hash is ``i`` mod ``N``. Each process opens the store itself (never
inherited through ``fork()``) and imports the app by name, so every process
builds the same registry.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import _core, _log
from ._app import App
from ._env import open as open_env
from ._env import store_directory
from .errors import WorkParked

__all__ = [
    "load_app",
    "run_workers",
    "run_worker_processes",
    "EXIT_DONE",
    "EXIT_ERROR",
    "EXIT_USAGE",
    "EXIT_PARKED",
]

# Exit statuses of `percolite worker --until-idle` (and run_workers).
EXIT_DONE = 0  # nothing left to run, nothing parked
EXIT_ERROR = 1  # an error stopped it
EXIT_USAGE = 2  # bad arguments
EXIT_PARKED = 3  # nothing left to run but parked work


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
        module_spec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    try:
        app = getattr(module, attribute)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(app, App):
        raise TypeError(f"{spec} is a {type(app).__name__}, not a percolite.App")
    return app


def _run_in_this_process(
    app: App, db: str, threads: int, until_idle: bool, worker_index: int, worker_count: int
) -> int:
    # The handler only sets a flag: taking a lock there (threading.Event.set
    # does) deadlocks when a second SIGTERM arrives while the first handler
    # holds it, which happens when both the parent and a process-group kill
    # deliver one.
    stop_requested = [False]

    def request_stop(signum, frame):  # noqa: ARG001
        stop_requested[0] = True

    previous = signal.signal(signal.SIGTERM, request_stop)
    try:
        with open_env(db, app=app, create=False) as env:
            env.start_workers(threads, worker_index=worker_index, worker_count=worker_count)
            try:
                while not stop_requested[0]:
                    if until_idle and env.wait(timeout=0.5):
                        return EXIT_DONE
                    if not until_idle:
                        time.sleep(0.1)
            except WorkParked as e:
                _log.logger.error("%s", e)
                return EXIT_PARKED
            except KeyboardInterrupt:
                return 130
        return EXIT_DONE
    finally:
        signal.signal(signal.SIGTERM, previous)


def _group_status(codes: list[int]) -> int:
    """One exit status for a group of worker processes: an error (or a
    signal) of any first, then parked work, then done."""
    errors = [c for c in codes if c not in (EXIT_DONE, EXIT_PARKED)]
    if errors:
        return errors[0] if errors[0] > 0 else 1
    return EXIT_PARKED if EXIT_PARKED in codes else EXIT_DONE


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
) -> int:
    if processes < 1:
        raise ValueError(f"processes must be at least 1, not {processes}")
    if threads < 1:
        raise ValueError(f"threads must be at least 1, not {threads}")
    if not Path(store_directory(db)).is_dir():
        raise ValueError(f"no percolite store at {db!r}")
    if worker_index is not None or processes == 1:
        return _run_in_this_process(
            app, db, threads, until_idle, worker_index or 0, worker_count or 1
        )
    command = [sys.executable, "-m", "percolite", "worker", app_spec, "--db", db]
    command += ["--threads", str(threads), "--worker-count", str(processes)]
    if until_idle:
        command.append("--until-idle")
    children = [subprocess.Popen(command + ["--worker-index", str(i)]) for i in range(processes)]

    def stop_children(signum=signal.SIGTERM, frame=None):  # noqa: ARG001
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop_children)
    try:
        return _group_status([child.wait() for child in children])
    except KeyboardInterrupt:
        stop_children()
        for child in children:
            child.wait()
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_workers(
    app: str,
    db: str | os.PathLike,
    *,
    processes: int = 1,
    threads: int = _core.DEFAULT_THREADS,
    until_idle: bool = True,
) -> int:
    """Run ``app`` (given as ``"module:attribute"``) on store ``db`` in
    ``processes`` worker processes of ``threads`` threads each; with
    ``until_idle`` (default) return once nothing is pending. Returns the exit
    status: ``EXIT_DONE`` (0) when all work is done, ``EXIT_PARKED`` (3)
    when everything left is parked work, ``EXIT_ERROR`` (1) on an error."""
    return run_worker_processes(
        app_spec=app,
        app=load_app(app),
        db=os.fspath(db),
        processes=processes,
        threads=threads,
        until_idle=until_idle,
    )
