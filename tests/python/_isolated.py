"""Run test code in a child interpreter, so that a deadlock fails fast.

Tests of workers, threads and close-while-running can hang the interpreter
that runs them. ``run_child`` runs a function of a module of the ``children``
package (see its docstring), given as the function itself, in a fresh
``python -c`` with a timeout: a
nonzero exit or a timeout fails the calling test with the child's output.
Shortly before the timeout the child dumps the stacks of all its Python
threads (faulthandler) to stderr, which names the place it hangs.
``start_child``/``finish_child`` do the same for children that run side by
side, ``run_command`` for any command line (the CLI's workers, scripts), and
``load_fresh`` loads in the test process the app a worker process runs.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "TESTS_DIR",
    "alive",
    "children_of",
    "finish_child",
    "load_fresh",
    "run_child",
    "run_child_json",
    "run_command",
    "start_child",
]

# tests/python: first on the children's sys.path, and the working directory of
# worker processes that load a children.<name>_app module.
TESTS_DIR = Path(__file__).resolve().parent


def _communicate_or_kill(proc: subprocess.Popen, timeout: float) -> tuple[str, str, bool]:
    """Wait up to ``timeout`` seconds; on a timeout kill the child's whole
    process group. Returns (stdout, stderr, timed_out)."""
    try:
        out, err = proc.communicate(timeout=timeout)
        return out, err, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return out, err, True


# The program of every child: arm the stack dump before anything else, then
# let children.main import and call the target.
_LAUNCHER = """\
import faulthandler as _faulthandler
_faulthandler.dump_traceback_later({dump_after!r}, exit=True)
import sys
sys.path.insert(0, {tests_dir!r})
from children import main
main(sys.argv[1:])
"""


def _dump_after(timeout: float) -> float:
    return max(1.0, timeout - 2.0) if timeout > 3 else timeout * 0.8


def _call_literal(args: tuple, kwargs: dict) -> tuple:
    """``(args, kwargs)`` with paths as ``str``, and that as a Python literal,
    checked to read back equal with ``ast.literal_eval``."""

    def plain(value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    call = ([plain(a) for a in args], {name: plain(v) for name, v in kwargs.items()})
    literal = repr(call)
    try:
        same = ast.literal_eval(literal) == call
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise TypeError(f"arguments of a child must be Python literals: {literal[:200]}")
    return call, literal


def _target(scenario: Any) -> str:
    """The ``"module:function"`` path the child imports to call ``scenario``,
    which must be a function defined at the top level of a module of the
    ``children`` package (only that can be imported anew in the child)."""
    module = getattr(scenario, "__module__", None)
    qualname = getattr(scenario, "__qualname__", None)
    if (
        inspect.isfunction(scenario)
        and isinstance(module, str)
        and module.startswith("children.")
        and getattr(sys.modules.get(module), qualname, None) is scenario
    ):
        return f"{module}:{qualname}"
    raise TypeError(
        "a child runs a function defined at the top level of a module of the "
        f"children package (such as children.processes.write_x), not {scenario!r}"
    )


def start_child(
    scenario: Callable[..., Any],
    *args: Any,
    timeout: float = 60,
    cwd: Any = None,
    environment: dict | None = None,
    **kwargs: Any,
) -> subprocess.Popen:
    """Start ``scenario`` (a function of a module of the ``children``
    package, such as ``children.processes.write_x``) in a fresh
    interpreter, in its own process group, called with ``args`` and
    ``kwargs`` (Python literals; paths become ``str``); pass the result to
    :func:`finish_child`. ``environment`` adds variables to the child's
    environment. Shortly before ``timeout`` the child dumps every thread's
    stack, so a hang shows where it is stuck."""
    target = _target(scenario)
    call, literal = _call_literal(args, kwargs)
    launcher = _LAUNCHER.format(dump_after=_dump_after(timeout), tests_dir=str(TESTS_DIR))
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, target, literal],
        cwd=None if cwd is None else os.fspath(cwd),
        env=None if environment is None else {**os.environ, **environment},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout kills grandchildren too
    )
    shown = [repr(a) for a in call[0]] + [f"{name}={v!r}" for name, v in call[1].items()]
    proc.isolated_description = f"--- child ---\n{target}({', '.join(shown)})"
    return proc


def finish_child(proc: subprocess.Popen, timeout: float = 60) -> str:
    """Wait for a child from :func:`start_child` and return its stdout; fail
    the test (naming the call, with both outputs) when it exits nonzero, is
    killed by a signal, or runs longer than ``timeout`` seconds."""
    description = getattr(proc, "isolated_description", "")
    out, err, timed_out = _communicate_or_kill(proc, timeout)
    outputs = f"{description}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"
    if timed_out:
        pytest.fail(
            f"child process timed out after {timeout} s (hang or deadlock?)\n{outputs}",
            pytrace=False,
        )
    if proc.returncode != 0:
        status = proc.returncode
        if status < 0:
            status = f"{status} (killed by {signal.Signals(-status).name})"
        pytest.fail(f"child process exited with status {status}\n{outputs}", pytrace=False)
    return out


def run_child(
    scenario: Callable[..., Any], *args: Any, timeout: float = 60, cwd: Any = None, **kwargs: Any
) -> str:
    """Run ``scenario`` in a fresh interpreter (see :func:`start_child`) and
    return its stdout; fails the test on a nonzero exit or a timeout."""
    return finish_child(start_child(scenario, *args, timeout=timeout, cwd=cwd, **kwargs), timeout)


def _last_line_json(out: str) -> Any:
    lines = out.strip().splitlines()
    if not lines:
        pytest.fail("child process printed nothing; expected JSON on its last line", pytrace=False)
    try:
        return json.loads(lines[-1])
    except ValueError:
        pytest.fail(f"child's last line is not JSON:\n{out}", pytrace=False)


def run_child_json(
    scenario: Callable[..., Any], *args: Any, timeout: float = 60, cwd: Any = None, **kwargs: Any
) -> Any:
    """Like :func:`run_child`, returning the JSON the child printed on its
    last line."""
    return _last_line_json(run_child(scenario, *args, timeout=timeout, cwd=cwd, **kwargs))


_FRESH_NAMES = itertools.count()


def load_fresh(module: str) -> Any:
    """A fresh copy of ``module`` (``"children.<name>_app"``): its file run
    anew, as a worker process imports it, so that a test binds the same app
    in its own process (and reads the environment variables it reads)."""
    path = TESTS_DIR.joinpath(*module.split(".")).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(
        f"{module.rpartition('.')[2]}_{next(_FRESH_NAMES)}", path
    )
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def run_command(
    argv: list, *, timeout: float = 60, cwd: Any = None, env: Any = None
) -> subprocess.CompletedProcess:
    """Run ``argv`` and return its result (text output, any exit status);
    fail the test if it runs longer than ``timeout`` seconds, killing it and
    every process it started."""
    with subprocess.Popen(
        [os.fspath(a) for a in argv],
        cwd=None if cwd is None else os.fspath(cwd),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        out, err, timed_out = _communicate_or_kill(proc, timeout)
    if timed_out:
        pytest.fail(
            f"{' '.join(map(str, argv))} timed out after {timeout} s\n"
            f"--- stdout ---\n{out}\n--- stderr ---\n{err}",
            pytrace=False,
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def children_of(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(child) for child in text]
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (Linux /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
