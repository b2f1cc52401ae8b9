"""simulate: an app run by a seeded, single-threaded scheduler with faults.

The scheduler stands in for the clients loading data and for several
workers: at each step it picks, with its own random generator, one thing to
do next: begin a load transaction (call the load function), commit one, let
a virtual worker begin a run (its observer runs in a transaction held open)
or finish one (commit it). Several transactions are open at once, so
conflicts happen as they would between threads. Faults are drawn from the
same generator, so a seed fixes the whole run: its trace and its final
store.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import numbers
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable
from typing import Any, Literal

from .._app import App
from .._args import check_int
from .._env import Env, bound_to
from .._env import open as open_store
from .._export import ExportQueue, InjectedFault, inject_exporter_faults
from .._log import capture_failures, shown
from .._transaction import Transaction
from ..errors import CommitConflict, Error
from ._run import BACKENDS, COUNT_LIMIT

_FAULTS = ("observer_errors", "conflicts", "crashes", "exporter_errors", "delays")
STAT_KEYS = (
    "steps",
    "loads",
    "load_conflicts",
    "runs",
    "commits",
    "conflicts",
    "failures",
    "parked",
    "deferrals",
    "exports",
    "crashes",
    "delays",
)
MAX_WORKERS = 256
# Steps in a row that commit nothing before the simulation gives up: faults
# as likely as 1.0 (every commit refused, every step a crash) stop all progress.
_STALLED = 100_000


@dataclasses.dataclass(frozen=True)
class Faults:
    """How often :func:`simulate` injects each fault: a probability in
    [0, 1] at every opportunity.

    * ``observer_errors``: a run fails as if its observer had raised (at
      each run an observer, fold or change observer makes);
    * ``conflicts``: a commit is refused as if it had lost a write-write
      conflict (at each commit, loads' and runs');
    * ``crashes``: the process dies (at each step, and right after an
      exporter returned, before its batch is acknowledged): every open
      transaction is lost, committed state is kept, and the workers start
      again; loads cut off before their commit run again;
    * ``exporter_errors``: an exporter raises after sending its batch (at
      each exporter call), so the batch is sent again;
    * ``delays``: a worker's step is put off (at each step), which reorders
      the runs.
    """

    observer_errors: float = 0.0
    conflicts: float = 0.0
    crashes: float = 0.0
    exporter_errors: float = 0.0
    delays: float = 0.0

    def __post_init__(self) -> None:
        for name in _FAULTS:
            p = getattr(self, name)
            if isinstance(p, bool) or not isinstance(p, numbers.Real):
                raise TypeError(
                    f"Faults({name}=...) must be a probability in [0, 1] (a float), "
                    f"not {type(p).__name__}"
                )
            if math.isnan(float(p)) or not (0.0 <= float(p) <= 1.0):
                raise ValueError(f"Faults({name}=...) must be a probability in [0, 1], not {p!r}")


@dataclasses.dataclass
class Simulation:
    """What :func:`simulate` did: ``seed``; ``trace``, one readable line per
    event (commits, runs, conflicts, faults, crashes, exports); ``env``, the
    final store (read it with transactions and queue scans; close it, or use
    the simulation as a context manager); ``stats``, how many of each event
    there were, every key present (``STAT_KEYS``: ``steps``, ``loads``,
    ``load_conflicts``, ``runs``, ``commits``, ``conflicts``, ``failures``,
    ``parked``, ``deferrals``, ``exports``, ``crashes``, ``delays``);
    ``directory``, the temporary directory of a ``backend="lmdb"`` run's
    store (None in memory), removed by :meth:`close`."""

    seed: int
    trace: list[str] = dataclasses.field(repr=False)
    env: Env
    stats: dict[str, int]
    directory: str | None = dataclasses.field(default=None, repr=False)

    def close(self) -> None:
        """Closes the final store (and removes it, for ``backend="lmdb"``)."""
        self.env.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> Simulation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _describe(run: Any) -> str:
    column = f"{run.family.decode(errors='replace')}:{run.qualifier.decode(errors='replace')}"
    return f"{run.observer} row {shown(run.row)} column {column!r}"


def _last_line(error: str) -> str:
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else error


class _Scheduler:
    def __init__(
        self,
        env: Env,
        app: App,
        loads: list[Callable[[Transaction], Any]],
        rng: random.Random,
        faults: Faults,
        workers: int,
        max_steps: int,
        raise_errors: bool,
    ) -> None:
        self.env, self.loads, self.rng, self.faults = env, loads, rng, faults
        self.max_steps = max_steps
        self.trace: list[str] = []
        self.stats: collections.Counter[str] = collections.Counter(dict.fromkeys(STAT_KEYS, 0))
        self.raise_errors = raise_errors
        self.last_progress = 0  # the step something last committed
        self.waiting = collections.deque(range(len(loads)))  # loads not yet committed
        self.open_loads: dict[int, Transaction] = {}  # by load index
        self.held: list[Any] = [None] * workers  # each worker's run, begun and not finished
        self.clients = workers
        self.export_columns = {
            queue.core.notify_column[:2]
            for queue in app.queues.values()
            if isinstance(queue, ExportQueue)
        }
        self.runnable: list[Any] | None = None  # pending work, read again after a commit

    def event(self, text: str, kind: str) -> None:
        self.trace.append(text)
        self.stats[kind] += 1
        if kind in ("loads", "commits", "failures"):  # each committed something
            self.last_progress = self.stats["steps"]

    def chance(self, name: str) -> bool:
        p = getattr(self.faults, name)
        return p > 0 and self.rng.random() < p

    # -- loads --------------------------------------------------------------
    def begin_load(self) -> None:
        index = self.waiting.popleft()
        tx = self.env.transaction()
        try:
            self.loads[index](tx)
        except BaseException:
            tx.abort()
            raise
        self.open_loads[index] = tx

    def commit_load(self, index: int) -> None:
        tx = self.open_loads.pop(index)
        try:
            if self.chance("conflicts"):
                tx.abort()
                raise CommitConflict("injected")
            tx.commit()
        except CommitConflict:
            self.event(f"load {index}: conflict, runs again", "load_conflicts")
            self.waiting.appendleft(index)
            return
        self.runnable = None
        self.event(f"load {index}: commit at {tx.commit_ts}", "loads")

    # -- workers ------------------------------------------------------------
    def begin_run(self, worker: int) -> None:
        if self.runnable is None:
            self.runnable = self.env.core.runnable()
        taken = {run.cell_key for run in self.held if run is not None}
        free = [n for n in self.runnable if n[0] not in taken]
        if not free:
            return
        cell_key, row_hash, stamp, family, qualifier = free[self.rng.randrange(len(free))]
        exporting = (family, qualifier) in self.export_columns
        fail = not exporting and self.chance("observer_errors")
        inject_exporter_faults((lambda: self.chance("exporter_errors")) if exporting else None)
        try:
            with capture_failures() as captured:
                run = self.env.core.begin_run(cell_key, row_hash, stamp, fail)
                raised = captured.exception
        finally:
            inject_exporter_faults(None)
        injected = fail or isinstance(raised, InjectedFault)
        if run.outcome in ("failed", "parked") and not injected and self.raise_errors:
            if raised is not None:
                raise raised
            raise Error(run.error)
        what = _describe(run) if run.outcome != "gone" else "a notification already done"
        if run.outcome == "ready":
            self.held[worker] = run
            self.event(f"worker {worker}: run {what}", "runs")
            if exporting:
                self.event(f"worker {worker}: exported", "exports")
                if self.chance("crashes"):  # the exporter returned; its batch is not acknowledged
                    self.crash("after an exporter returned")
            return
        self.settled(worker, run.outcome, run, what, injected)

    def finish_run(self, worker: int) -> None:
        run, self.held[worker] = self.held[worker], None
        injected = self.chance("conflicts")
        outcome = run.finish(injected)
        if outcome in ("failed", "parked") and self.raise_errors:
            raise Error(f"committing {_describe(run)} failed: {run.error}")
        self.settled(worker, outcome, run, _describe(run), injected)

    def settled(self, worker: int, outcome: str, run: Any, what: str, injected: bool) -> None:
        prefix = f"worker {worker}: "
        if outcome == "committed":
            self.runnable = None
            self.event(prefix + f"commit {what}", "commits")
            if run.parked_keys:
                self.event(prefix + f"parked {run.parked_keys} keys of {what}", "parked")
        elif outcome == "conflict":
            self.event(prefix + f"conflict{' (injected)' if injected else ''} {what}", "conflicts")
        elif outcome in ("failed", "parked"):
            self.runnable = None  # a failure record was committed
            cause = "injected failure" if injected else _last_line(run.error)
            if injected and not run.error.endswith("injected by the simulation"):
                cause = "injected exporter failure"
            self.event(prefix + f"failed {what}: {cause}", "failures")
            if outcome == "parked":
                self.event(prefix + f"parked {what}", "parked")
        elif outcome == "deferred":
            self.event(prefix + f"deferred {what}", "deferrals")
        else:  # gone or skipped: nothing ran
            self.runnable = None

    # -- faults -------------------------------------------------------------
    def crash(self, when: str) -> None:
        runs = sum(run is not None for run in self.held)
        for worker, run in enumerate(self.held):
            if run is not None:
                run.drop()
                self.held[worker] = None
        cut = sorted(self.open_loads)
        for index in cut:
            self.open_loads.pop(index).abort()
        self.waiting.extendleft(reversed(cut))  # loads cut off run again, in order
        self.runnable = None
        self.event(f"crash {when}: {runs} runs and {len(cut)} loads lost", "crashes")

    # -- the loop -----------------------------------------------------------
    def run(self) -> None:
        for _ in range(self.max_steps):
            self.stats["steps"] += 1
            if self.stats["steps"] - self.last_progress > _STALLED:
                self.stalled()
            if self.chance("crashes"):
                self.crash("between steps")
                continue
            actions: list[tuple[str, int]] = []
            if self.waiting and len(self.open_loads) < self.clients:
                actions.append(("begin load", 0))
            actions += [("commit load", index) for index in sorted(self.open_loads)]
            for worker, run in enumerate(self.held):
                actions.append(("finish" if run is not None else "begin", worker))
            kind, which = actions[self.rng.randrange(len(actions))]
            if kind == "begin load":
                self.begin_load()
            elif kind == "commit load":
                self.commit_load(which)
            elif self.chance("delays"):
                self.event(f"worker {which}: delayed", "delays")
            elif kind == "finish":
                self.finish_run(which)
            else:
                self.begin_run(which)
            if self.idle():
                return
        raise Error(
            f"the simulation did not finish within {self.max_steps:,} steps (max_steps): "
            f"{len(self.waiting) + len(self.open_loads)} loads not committed, "
            f"{len(self.runnable or [])} notifications pending"
        )

    def stalled(self) -> None:
        likely = ", ".join(
            f"{name}={getattr(self.faults, name)}"
            for name in _FAULTS
            if getattr(self.faults, name) >= 0.5
        )
        why = f": faults as likely as {likely} leave no step that can commit" if likely else ""
        raise Error(
            f"the simulation made no progress in {_STALLED:,} steps (nothing committed){why}"
        )

    def idle(self) -> bool:
        if self.waiting or self.open_loads or any(run is not None for run in self.held):
            return False
        if self.runnable is None:
            self.runnable = self.env.core.runnable()
        return not self.runnable


def simulate(
    app: App,
    load: Iterable[Callable[[Transaction], Any]],
    *,
    seed: int,
    faults: Faults | None = None,
    workers: int = 4,
    backend: Literal["memory", "lmdb"] = "memory",
    max_steps: int = 10_000_000,
    raise_errors: bool = True,
) -> Simulation:
    """Run ``app`` over ``load`` in a fresh store, scheduled from ``seed``.

    ``load`` is an iterable of transaction functions ``fn(tx)``, the loading
    code of a client, read whole before the run starts (so it must be
    finite); each commits exactly once: a commit that conflicts, or
    a load cut off by a crash before its commit, runs again as a client
    would retry it. ``workers`` virtual workers run the app's observers,
    combine-queue folds and exporters, each holding its run's transaction
    open until its next turn. A seeded generator picks every step and draws
    every fault (``faults``, default none), all in the calling thread: the
    same app, load and seed give the same trace and the same final store, in
    any process. Queues process what they hold at once (``linger`` is not
    waited for); retries come at later steps instead of after a delay.

    A crash loses what the store had not committed; Python objects live on
    (the app's own state, an exporter's sink and its seq guard), as if they
    were kept durably beside the store.

    With ``raise_errors`` (the default), an observer, combiner, change
    observer or exporter raising on its own (not by an injected fault)
    stops the simulation with its exception, as ``run_until_idle`` does;
    with ``raise_errors=False`` it is retried and parked as workers do, and
    the trace and ``stats`` count it. ``workers`` is at most MAX_WORKERS.

    Returns a :class:`Simulation` (close it, or use it in a ``with``
    block). A load function that raises stops the simulation with its
    exception. Raises ``ValueError`` when ``app`` runs workers on a store
    of this process (its callables would run twice at once), and
    ``percolite.Error`` when ``max_steps`` steps do not bring the store to
    idle (an observer that notifies itself forever).
    """
    if not isinstance(app, App):
        raise TypeError(f"simulate needs a percolite.App, not {type(app).__name__}")
    for bound in bound_to(app):
        if bound.workers_running:
            raise ValueError(
                f"app {app.name!r} is bound elsewhere with workers running (store "
                f"{bound.path}): a simulation runs the app's observers and exporters itself, "
                "one at a time; stop those workers first (env.stop_workers())"
            )
    check_int("seed", seed)
    if faults is None:
        faults = Faults()
    elif not isinstance(faults, Faults):
        raise TypeError(f"faults must be a percolite.testing.Faults, not {type(faults).__name__}")
    check_int("workers", workers, 1, MAX_WORKERS)
    check_int("max_steps", max_steps, 1, COUNT_LIMIT)
    if not isinstance(raise_errors, bool):
        raise TypeError(f"raise_errors must be True or False, not {raise_errors!r}")
    if backend not in BACKENDS:
        raise ValueError(
            f"backend must be one of {', '.join(map(repr, BACKENDS))}, not {backend!r}"
        )
    if isinstance(load, (str, bytes)) or not isinstance(load, Iterable):
        raise TypeError(
            f"load must be an iterable of transaction functions fn(tx), not {type(load).__name__}"
        )
    loads = list(load)
    for index, fn in enumerate(loads):
        if not callable(fn):
            raise TypeError(
                f"load[{index}] must be a transaction function fn(tx), not {type(fn).__name__}"
            )
    directory = None
    if backend == "memory":
        env = open_store(backend="memory", app=app)
    else:
        directory = tempfile.mkdtemp(prefix="percolite-simulation-")
        env = open_store(f"{directory}/store", sync="none", app=app)
    scheduler = _Scheduler(
        env, app, loads, random.Random(seed), faults, workers, max_steps, raise_errors
    )
    try:
        scheduler.run()
    except BaseException:
        env.close()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    return Simulation(seed, scheduler.trace, env, dict(scheduler.stats), directory)
