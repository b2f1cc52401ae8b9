"""Opening a store: :func:`open` and :class:`Env`."""

from __future__ import annotations

import atexit
import json
import logging
import os
import random
import shlex
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

from . import _core, _log, _metrics
from ._app import App, app_identity, differences, worker_specs
from ._args import check_bool, check_int, check_progress, check_retry_options, check_timeout
from ._export import ExportQueue
from ._frames import Failures, ParkedWork
from ._html import env_html
from ._loader import Loader
from ._progress import Progress
from ._queue_rows import queue_depth
from ._transaction import Transaction
from .errors import AppMismatch, ClosedError, CommitConflict, Error, SinkBlocked, WorkParked

__all__ = ["open", "Env", "SYNC_MODES"]

T = TypeVar("T")

SYNC_MODES: tuple[str, ...] = _core.SYNC_MODES

# Where a store records the app bound to it (_app.app_identity(), as JSON).
_APP_ROW = _core.SYSTEM_ROW_PREFIX + b"app"
_APP_COLUMN = (b"a", b"identity")


def open(  # noqa: A001 - mirrors lmdb.open / sqlite3.connect
    path: str | os.PathLike[str] | None = None,
    *,
    sync: Literal["full", "meta", "none"] = "full",
    create: bool = True,
    mode: int = _core.DEFAULT_FILE_MODE,
    map_size: int = _core.DEFAULT_MAP_SIZE,
    max_readers: int = _core.DEFAULT_MAX_READERS,
    app: App | None = None,
    upgrade: bool = False,
    backend: Literal["lmdb", "memory", "postgresql"] | None = None,
    restored: bool = False,
) -> Env:
    """Open (creating it by default) the percolite store in directory ``path``.

    ``path`` is a directory (the default ``"lmdb"`` backend, also written
    ``"lmdb://DIR"``), or ``":memory:"`` for a new in-memory store: like
    ``sqlite3.connect(":memory:")``, each such open is a private store of its
    own, gone when the handle closes, seen by no other handle or process (for
    tests and simulations; nothing is written to disk, so ``sync`` changes
    nothing). A ``postgresql://`` URI (any libpq connection URI; the
    parameter ``schema``, default ``percolite``, keeps several stores in one
    database) opens a store in a PostgreSQL database, created on first open
    and shared by every process on every machine that opens it; a URI whose
    server cannot be reached raises ``StorageError`` naming it (never its
    password). ``backend`` (``"lmdb"``, ``"memory"`` or ``"postgresql"``)
    names the backend instead of the path's form; ``open(backend="memory")`` needs no path. An
    unknown scheme or backend name raises ``ValueError``, as do a path with
    ``backend="memory"`` and ``create=False`` with ``":memory:"``.

    ``sync`` chooses durability: ``"full"`` (default) makes every commit
    durable; ``"meta"`` may lose the last commits on an OS crash but never
    corrupts; ``"none"`` leaves flushing to the OS (fast, for tests and
    scratch data; a process crash alone loses nothing).

    The directory is created with ``mode`` plus search permission where it
    grants read (``0o600`` gives ``0o700``); the files get ``mode``.
    ``map_size`` is the initial size of the memory map; it grows by itself.
    ``max_readers`` bounds transactions open at once across processes.
    ``app`` binds a :class:`percolite.App`: its observed columns are stored in
    the store (so every process creates the same notifications) and its
    observers run when you start workers. The first app bound to a store is
    recorded in it (name, observed columns, queue layouts); binding an app
    that differs raises :class:`percolite.AppMismatch` naming the
    differences, unless ``upgrade=True`` records the new app deliberately
    (see :meth:`Env.bind`). Opening without an app always works.

    A damaged store is refused with :class:`percolite.CorruptionError` and
    left untouched, never served: every stored record carries a checksum,
    and a data file that went back in time (its newest commits missing,
    because a damaged meta page let an older one take over or an old copy
    was put in its place) is refused at open. ``restored=True`` says the
    data file was restored from a backup on purpose: it opens, and later
    opens compare against it. See ``percolite check``.

    Opening a path that this process has open already returns a new handle
    on the same store (with the same ``sync``, else ``ValueError``). A store
    opened before ``os.fork()`` cannot be used in the child: open it there
    again, or use the ``spawn``/``forkserver`` start methods.
    """
    if sync not in SYNC_MODES:
        raise ValueError(f"sync must be one of {', '.join(map(repr, SYNC_MODES))}, not {sync!r}")
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, not {type(backend).__name__}")
    if path is None:
        if backend is None or backend == "lmdb":
            raise TypeError("open() needs a path (or backend='memory' for an in-memory store)")
        path = ":memory:"  # the core names an unknown backend
    try:
        fspath = os.fspath(path)
    except TypeError:
        raise TypeError(f"path must be str or os.PathLike, not {type(path).__name__}") from None
    if isinstance(fspath, bytes):
        fspath = os.fsdecode(fspath)
    for name, value in (("mode", mode), ("map_size", map_size), ("max_readers", max_readers)):
        check_int(name, value)
    if not 0 <= mode <= 0o777:
        raise ValueError(f"mode must be a permission mask between 0 and 0o777, not {mode:#o}")
    if map_size < 1 << 20:
        raise ValueError(f"map_size must be at least 1 MiB, not {map_size}")
    if map_size > 1 << 48:
        raise ValueError(f"map_size must be at most 256 TiB (2**48), not {map_size}")
    if not 1 <= max_readers <= 1 << 16:
        raise ValueError(f"max_readers must be between 1 and 65536, not {max_readers}")
    check_bool("create", create)
    check_bool("upgrade", upgrade)
    check_bool("restored", restored)
    if app is not None and not isinstance(app, App):
        raise TypeError(f"app must be a percolite.App, not {type(app).__name__}")
    core = _core.Env.open(
        fspath, sync, create, mode, map_size, max_readers, backend or "", restored
    )
    env = Env(core, sync=sync)
    if app is not None:
        try:
            env.bind(app, upgrade=upgrade)
        except BaseException:
            env.close()
            raise
    return env


# The environment variable that hands a store's target to the child
# processes percolite starts (worker processes, the checking process): a
# postgresql:// URI may carry a password, which never goes on a command line.
TARGET_VARIABLE = "PERCOLITE_DB"


def shared_target(target: str | os.PathLike[str]) -> tuple[str, str]:
    """``(backend, target)`` for a store that several processes can open:
    the directory of an lmdb store, or the postgresql:// URI as given.
    ``ValueError`` for an in-memory target, which no other process can open,
    and for a malformed one."""
    text = os.fsdecode(os.fspath(target))
    backend, location = _core.parse_target(text)
    if backend == "memory":
        raise ValueError(
            f"{text!r} is an in-memory store, private to the process that opens it: give the "
            "directory of a store (or a postgresql:// URI)"
        )
    if backend == "postgresql":
        _core.parse_postgresql_target(text)  # its parameters, checked now
        return backend, text
    return backend, location


def store_directory(target: str | os.PathLike[str]) -> str:
    """The directory of the on-disk store ``target`` names (a path or
    ``lmdb://PATH``), for tools that work on its files; ``ValueError`` for
    an in-memory or a postgresql target, which have none."""
    backend, location = shared_target(target)
    if backend != "lmdb":
        raise ValueError(
            f"{shown_target(location)!r} is a {backend} store: this works on the files of an "
            "lmdb store directory"
        )
    return location


def shown_target(target: str) -> str:
    """``target`` fit to print: a postgresql:// URI with its password hidden
    (``_core.hide_password``, the rule of every message of the core)."""
    try:
        backend, _location = _core.parse_target(target)
    except ValueError:  # malformed: still never show a password
        return _core.hide_password(target)
    return _core.hide_password(target) if backend == "postgresql" else target


_open_envs: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # Worker threads call into Python: stop them before the interpreter goes away.
    for env in list(_open_envs):
        try:
            env.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class Env:
    """An open percolite store. Create it with :func:`percolite.open`.

    Thread-safe: share one ``Env`` between threads. Use it as a context
    manager, or call :meth:`close`, which aborts this handle's unfinished
    transactions (waiting for commits already under way) and closes the store
    when it is the last handle in the process. Using a closed handle raises
    :class:`~percolite.ClosedError`.
    """

    def __init__(self, core: Any, *, sync: str) -> None:
        self._core = core
        self._sync = sync
        self._app: App | None = None
        self._bound_revision = 0  # the revision of self._app the store records
        self._workers_running = False
        self._worker_args: dict[str, Any] | None = None  # start_workers' arguments, for bind()
        self._loaders: weakref.WeakSet[Loader] = weakref.WeakSet()
        _open_envs.add(self)
        self._recorder = _metrics.recorder_for(self)
        if sync == "full":
            _warn_if_replication_is_asynchronous(self)

    def bind(self, app: App, *, upgrade: bool = False) -> None:
        """Bind ``app`` to this open store (as ``open(..., app=app)`` does).

        The store records the first app bound to it: its name, its observed
        columns (with STRONG or WEAK) and its queues' layouts (kind, combiner,
        codecs, buckets). An app that differs raises
        :class:`percolite.AppMismatch`, naming every difference, and changes
        nothing: another app would otherwise silently replace the observed
        columns of the one that wrote the data. With ``upgrade=True`` the new
        app is recorded instead; pending notifications of columns it no
        longer observes are dropped (no observer would ever run them, and
        :meth:`wait` would wait for them for ever), and the count is logged
        at WARNING on the ``percolite`` logger. Lingers, batch sizes,
        ``max_attempts`` and observer names are not part of the record.
        Changes to the bound app object in this process (observers or queues
        added after opening) are recorded as they happen. Workers running on
        this handle are stopped (running observers finish) and started again
        with the new app's observers, so a notebook can edit an observer and
        bind again without restarting its kernel; a loader must be closed
        first.
        """
        if not isinstance(app, App):
            raise TypeError(f"app must be a percolite.App, not {type(app).__name__}")
        if any(not loader.closed for loader in list(self._loaders)):
            raise Error(
                "bind(): a loader of this handle is open; leave its with block (or call "
                "loader.close()) before binding another app"
            )
        restart = self._worker_args if self._workers_running else None
        if restart is not None:
            self.stop_workers()  # running observers finish with the old app
        try:
            self._bind(app, upgrade=bool(upgrade))
        finally:
            if restart is not None:
                self.start_workers(**restart)

    def _bind(self, app: App, *, upgrade: bool = False) -> None:
        revision = app.revision
        current = app_identity(app)

        def record(tx: Transaction) -> tuple[list[str], dict[str, Any]]:
            stored = tx.get(_APP_ROW, _APP_COLUMN)
            recorded = json.loads(stored) if stored is not None else None
            found = [] if recorded is None else differences(recorded, current)
            if found and not upgrade:
                raise AppMismatch(
                    f"{self.path} is bound to app {recorded.get('name')!r}; app "
                    f"{app.name!r} differs: " + "; ".join(found) + ". Open it with its "
                    "own app, or pass upgrade=True (percolite worker --upgrade) to record "
                    "this one (pending notifications of columns it no longer observes are "
                    "dropped; stored queue rows are not migrated)",
                    differences=found,
                )
            if recorded is None or found:
                tx.set(_APP_ROW, _APP_COLUMN, json.dumps(current, sort_keys=True))
            return found, recorded or {}

        found, recorded = self.run(record)
        self._core.set_observers(worker_specs(app))
        self._app = app
        self._bound_revision = revision
        app.subscribe(self._refuse_app_change, self._follow_app_change)
        if found:
            gone = [
                tuple(bytes.fromhex(part) for part in key.split(":"))
                for key in recorded.get("observers", {}).keys() - current["observers"].keys()
            ]
            old_queues = recorded.get("queues", {})
            for queue_id in old_queues.keys() - current["queues"].keys():
                gone += _queue_notify_columns(queue_id, old_queues[queue_id])
            dropped = self._core.drop_notifications(gone) if gone else 0
            relaid = [
                queue_id
                for queue_id in old_queues.keys() & current["queues"].keys()
                if old_queues[queue_id] != current["queues"][queue_id]
            ]
            if relaid:
                found.append(
                    f"the stored rows of {', '.join(map(repr, sorted(relaid)))} keep their old "
                    "layout: migrate them, or their values read back wrong or missing"
                )
            _log.logger.warning(
                "%s: recorded app %r in place of %r (%s); dropped %d pending notification%s of "
                "columns no longer observed",
                self.path,
                app.name,
                recorded.get("name"),
                "; ".join(found),
                dropped,
                "" if dropped == 1 else "s",
            )

    # The bound app calls these around each change of its declaration (App.subscribe).
    def _refuse_app_change(self, app: App, what: str) -> None:
        # Workers run the observers and queues as bound; they would keep
        # running the old ones while the store recorded the new app.
        if app is self._app and not self.closed and self._workers_running:
            raise Error(
                f"cannot register {what}: workers are running on {self.path}; "
                "stop them first (env.stop_workers())"
            )

    def _follow_app_change(self, app: App) -> None:
        # The app changed in this process: record it, as bind(upgrade=True) would.
        if app is self._app and not self.closed and app.revision != self._bound_revision:
            self._bind(app, upgrade=True)

    @property
    def app(self) -> App | None:
        """The :class:`percolite.App` bound with ``open(..., app=...)``."""
        return self._app

    @property
    def core(self) -> _core.Env:
        """The compiled store handle underneath (``percolite._core``), for
        percolite's own modules and tools (the console, the testing kit,
        ``percolite check``); its methods are internal and may change in any
        release."""
        return self._core

    @property
    def path(self) -> str:
        """The real path of the store's directory, or ``":memory:"``."""
        return self._core.path

    @property
    def backend(self) -> str:
        """The storage backend: ``"lmdb"`` or ``"memory"``."""
        return self._core.capabilities["name"]

    @property
    def capabilities(self) -> dict[str, Any]:
        """What the backend offers: ``name``, ``persistent`` (data outlives
        the process), ``cross_process`` (other processes may open the store),
        ``durable`` (``sync="full"`` commits survive a power cut) and
        ``max_value_size`` in bytes."""
        return dict(self._core.capabilities)

    @property
    def sync(self) -> str:
        """The durability mode the store was opened with: ``"full"``,
        ``"meta"`` or ``"none"`` (see :func:`percolite.open`)."""
        return self._sync

    @property
    def closed(self) -> bool:
        """Whether this handle is closed; a closed handle raises
        :class:`~percolite.ClosedError` when used."""
        return self._core.closed

    def transaction(self) -> Transaction:
        """Begin a transaction on a snapshot of everything committed so far."""
        return Transaction(self._core.begin(), self._app)

    def run(
        self,
        fn: Callable[[Transaction], T],
        *,
        retries: int | None = 1000,
        backoff: float = 0.001,
        max_backoff: float = 0.1,
    ) -> T:
        """Run ``fn(tx)`` in a fresh transaction and commit it, retrying on
        :class:`~percolite.CommitConflict`; return what ``fn`` returned.

        Retries wait a random time up to ``backoff * 2**attempt`` seconds,
        capped at ``max_backoff`` ("full jitter"), so colliding writers spread
        out. After ``retries`` retries the last conflict is raised;
        ``retries=None`` retries until it commits. Any other exception aborts
        the transaction and propagates at once. ``fn`` may run several times:
        keep side effects outside percolite out of it.
        """
        check_retry_options("retries", retries, backoff, max_backoff)
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        attempt = 0
        while True:
            tx = self.transaction()
            try:
                result = fn(tx)
                if tx.state in ("active", "closed"):
                    tx.commit()  # raises ClosedError if the store closed meanwhile
                return result
            except CommitConflict:
                if retries is not None and attempt >= retries:
                    raise
                attempt += 1
                time.sleep(random.uniform(0, min(max_backoff, backoff * 2 ** min(attempt, 30))))
            finally:
                tx.abort()

    def loader(
        self,
        max_in_flight: int = 256,
        *,
        max_retries: int | None = 1000,
        backoff: float = 0.001,
        max_backoff: float = 0.1,
    ) -> Loader:
        """A :class:`percolite.Loader` on this store: one thread keeps up to
        ``max_in_flight`` transactions in flight, each future resolving once
        its transaction is durable. Use it as a context manager::

            with env.loader() as loader:
                for doc in docs:
                    loader.submit(index, doc)   # index(tx, doc) runs in a transaction

        Conflicts re-run the function after a random back-off from
        ``backoff`` up to ``max_backoff`` seconds, at most ``max_retries``
        times (``None``: until it commits). Closing the store flushes and
        closes its loaders first.
        """
        if self.closed:
            raise ClosedError(f"store {self.path!r} is closed")
        loader = Loader(
            self,
            max_in_flight,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
        )
        self._loaders.add(loader)
        return loader

    # -- workers ------------------------------------------------------------
    @property
    def workers_running(self) -> bool:
        """Whether this handle's workers are running (:meth:`start_workers`
        was called and :meth:`stop_workers` or :meth:`close` was not)."""
        return self._workers_running

    def start_workers(
        self,
        threads: int = _core.DEFAULT_THREADS,
        *,
        worker_index: int | None = None,
        worker_count: int | None = None,
        retry_initial: float = _core.DEFAULT_RETRY_INITIAL,
        retry_max: float = _core.DEFAULT_RETRY_MAX,
        lease_seconds: float = _core.DEFAULT_LEASE_SECONDS,
        lease_group: str = "",
    ) -> None:
        """Start ``threads`` C++ worker threads running this app's observers.

        Several worker pools (threads of other processes, on this machine or,
        with a shared store, others) share the work by lease: each holds a
        lease recorded in the store, renewed in the background, and takes
        the share of the notifications that leases assign it. A pool that
        dies (killed, crashed) stops renewing; within ``lease_seconds`` its
        lease lapses and the live pools take its share, so the work
        completes. ``lease_group`` names the pools started together (shown
        by ``percolite status``). Alternatively give each of N pools a fixed
        share: ``worker_index`` in ``range(worker_count)`` takes the
        notifications whose row hash is ``worker_index`` mod
        ``worker_count`` (and nobody takes it over).

        A failing observer is retried after ``retry_initial`` seconds,
        doubling up to ``retry_max``, until its ``max_attempts``
        (:meth:`App.observer`); each failure is recorded in the store and
        logged to the ``percolite.observers`` logger.
        """
        if (worker_index is None) != (worker_count is None):
            raise ValueError("give worker_index and worker_count together, or neither (leases)")
        for name, value in (
            ("threads", threads),
            ("worker_index", worker_index or 0),
            ("worker_count", worker_count or 1),
        ):
            check_int(name, value)
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        if worker_count is not None and (worker_count < 1 or not 0 <= worker_index < worker_count):
            raise ValueError(
                f"worker_index must be in range(worker_count); got {worker_index} of {worker_count}"
            )
        if not 0 < retry_initial <= retry_max:
            raise ValueError("retry_initial must be > 0 and <= retry_max")
        if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, (int, float)):
            raise TypeError(f"lease_seconds must be a number, not {type(lease_seconds).__name__}")
        if not 0 < lease_seconds <= 3600:
            raise ValueError(f"lease_seconds must be > 0 and at most 3600, not {lease_seconds}")
        if not isinstance(lease_group, str):
            raise TypeError(f"lease_group must be a str, not {type(lease_group).__name__}")
        self._worker_args = dict(
            threads=threads,
            worker_index=worker_index,
            worker_count=worker_count,
            retry_initial=retry_initial,
            retry_max=retry_max,
            lease_seconds=lease_seconds,
            lease_group=lease_group,
        )
        failure_log = _log.FailureLog()
        self._core.start_workers(
            threads,
            worker_index or 0,
            worker_count or 0,
            retry_initial,
            retry_max,
            failure_log.failure,
            float(lease_seconds),
            lease_group,
            _log.report_lease_change,
            failure_log.recovery,
        )
        self._workers_running = True

    def stop_workers(self) -> None:
        """Let running observers finish, then stop the workers. Idempotent."""
        self._core.stop_workers()
        self._workers_running = False

    def wait(self, timeout: float | None = None, progress: Any = False) -> bool:
        """Block until no notification is pending and no observer is running.

        Returns ``True`` when idle with nothing parked, ``False`` if
        ``timeout`` seconds passed first (a failing observer keeps its
        notification pending until its last attempt: see :meth:`status`).
        Raises :class:`percolite.WorkParked` when what is left is parked
        work (:meth:`parked`), instead of waiting for work that will not run
        until retried. Works whether the workers run in this process or in
        others. ``progress=True`` (or ``"auto"``: on terminals and in
        notebooks) draws a tqdm bar of the notifications done, when tqdm is
        installed (``pip install percolite[progress]``). Ctrl-C interrupts it.

        While it waits, this process's workers hurry: as soon as they have
        nothing else to run, lingering queues (the ``linger`` of
        :meth:`App.combine_queue` and :meth:`App.export_queue`) process what
        they hold instead of waiting for more. Without workers here, the
        wait hurries other processes' workers instead (an lmdb store signals
        them through its directory's ``waiting`` file). A ``":memory:"``
        store has no other processes: waiting on one without workers while
        work is pending raises :class:`percolite.Error` at once instead of
        hanging (start workers, or call :meth:`process`).
        """
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = Progress("notifications done", enabled=progress, unit="notification")
        if bar.enabled:
            bar.remaining(self._core.pending_notifications())
        looked = 0.0
        try:
            while True:
                chunk = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
                if self._core.wait_idle(chunk):
                    bar.remaining(0)
                    self._raise_if_parked()
                    return True
                bar.remaining(self._core.pending_notifications())
                if bar.enabled and time.monotonic() - looked >= 1.0:  # a read of the records
                    bar.note(_sinks_note(self.sinks()))
                    looked = time.monotonic()
                if deadline is not None and time.monotonic() >= deadline:
                    return False
        finally:
            bar.close()

    def _raise_if_parked(self) -> None:
        parked = self._core.work_records(True)
        if not parked:
            return
        by_observer: dict[str, int] = {}
        for record in parked:
            by_observer[record["observer"]] = by_observer.get(record["observer"], 0) + 1
        parts = []
        for name, n in sorted(by_observer.items()):
            processor = _core.parse_processor_name(name)
            if processor is not None:
                kind, queue_id = processor
                parts.append(f"{n} key{'s' if n != 1 else ''} of {kind} {queue_id!r}")
            else:
                parts.append(f"{n} of observer {name!r}")
        blocked = self._blocked_queues(parked)
        if blocked:
            queue_id, message = next(iter(blocked.items()))
            raise SinkBlocked(
                f"nothing left to run but export queue{'s' if len(blocked) > 1 else ''} "
                f"{', '.join(map(repr, blocked))} blocked by a sink that refuses this store "
                f"({message.splitlines()[0] if message else '?'}); their entries stay queued. "
                "Deal with the sink (one that belongs to another store: "
                f"env.take_over_sink({queue_id!r})), then the queue runs again",
                parked=len(parked),
                by_observer=by_observer,
                blocked=blocked,
            )
        raise WorkParked(
            f"nothing left to run but parked work, {len(parked)} in all ({', '.join(parts)}), "
            f"which failed on every attempt; see env.parked() or `percolite status "
            f"{shlex.quote(self.path)}`, fix the cause, then env.retry_parked() or "
            f"`percolite retry {shlex.quote(self.path)}`",
            parked=len(parked),
            by_observer=by_observer,
        )

    @staticmethod
    def _blocked_queues(records: list[dict[str, Any]]) -> dict[str, str]:
        """The export queues that ``records`` (parked work) show blocked by a
        sink refusing the store: ``{queue_id: the sink's error message}``."""
        blocked = {}
        for record in records:
            processor = _core.parse_processor_name(record["observer"])
            if record["sink"] == "refused" and processor is not None:
                blocked[processor[1]] = record["error"]["message"]
        return blocked

    def process(
        self,
        threads: int = _core.DEFAULT_THREADS,
        *,
        timeout: float | None = None,
        progress: Any = False,
    ) -> dict[str, Any]:
        """Start workers, wait until nothing is left to run, stop them;
        return what they did: ``{"runs", "commits", "conflicts",
        "failures", "parked", "blocked", "idle"}``. ``parked`` counts the
        parked notifications in the store at the end (:meth:`parked`);
        ``blocked`` maps each export queue blocked by a sink that refuses
        this store to the sink's error (:class:`percolite.SinkBlocked`);
        ``idle`` is
        ``False`` when ``timeout`` passed first. Parked work does not raise
        here (it does in :meth:`wait`)."""
        check_progress(progress)
        self.start_workers(threads)
        try:
            try:
                idle = self.wait(timeout=timeout, progress=progress)
            except WorkParked:
                idle = True
        finally:
            self.stop_workers()
        # Counted once stopped: a run whose commit the store shows done may
        # be counted by its worker only when the commit's result comes back
        # (on postgresql, from the writer thread), and stopping waits for it.
        stats = self._core.worker_stats()
        totals = {
            key: sum(o[key] for o in stats["observers"])
            for key in ("runs", "commits", "conflicts", "failures")
        }
        parked = self._core.work_records(True)
        totals["parked"] = len(parked)
        totals["blocked"] = self._blocked_queues(parked)
        totals["idle"] = idle
        return totals

    # -- failures and parked work -------------------------------------------
    def parked(self, observer: str | None = None) -> ParkedWork:
        """The parked work recorded in the store, from any process: one dict
        per parked notification or queue key, ``{"observer", "row",
        "family", "qualifier", "key", "queue", "attempts", "parked",
        "first_failure_unix", "last_failure_unix", "error": {"type",
        "message", "traceback"}}``, observers' work first (in cell order),
        then queue keys. For a queue key, ``observer`` is the queue's
        processor (``"combine queue <id>"``), ``queue`` its id, ``row`` the
        bucket's row, and ``key`` the key (decoded with the queue's key codec
        when the app declares the queue, else as stored); for an observer's
        work both are None. Only ``observer``'s (by name) when given. A
        :class:`percolite.ParkedWork`: a list whose ``to_pandas()`` gives one
        row per parked item (with pandas installed)."""
        if observer is not None and not isinstance(observer, str):
            raise TypeError(
                f"parked: observer must be a name (str) or None, not {type(observer).__name__}"
            )
        records = self._core.work_records(True)
        if observer is not None:
            records = [r for r in records if r["observer"] == observer]
        return ParkedWork(describe_record(self._app, r) for r in records)

    def _check_observer_names(self, names: list[str]) -> None:
        """ValueError for names that are neither an observer of the bound
        app nor the observer of some parked work (a typo, most likely)."""
        if not names or self._app is None:
            return
        known = {o.name for o in self._app.observers}
        known |= {r["observer"] for r in self._core.work_records(True)}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(
                f"no observer named {', '.join(map(repr, unknown))} in app "
                f"{self._app.name!r} or among the parked work"
            )

    @property
    def identity(self) -> dict[str, Any] | None:
        """Which store this is, for the sinks it feeds: ``{"store": 32
        hexadecimal digits, made the first time it is asked for or workers
        start (one commit) and kept by the store's copies, "epoch": from 1,
        the next one each time the store is opened as restored from a
        copy}``; None for a store that refuses commits and has none yet. A
        ``:memory:`` store is new, with a new identity, at every open."""
        found = self._core.identity(True)
        return None if found is None else {"store": found[0], "epoch": found[1]}

    def sinks(self) -> dict[str, dict[str, Any]]:
        """The state of each export queue's sink, as the store records it,
        from any process: ``{queue_id: {"state": ..., "since_unix",
        "buckets" (how many of its buckets wait on the sink),
        "last_failure_unix", "last_error": {"type", "message",
        "traceback"}}}`` where ``state`` is ``"failing"`` (an outage: the
        sink is down, the batches wait and are retried, nothing is parked)
        or ``"refused"`` (the sink refuses this store for good, e.g. it
        belongs to another one: the queue is blocked, its entries kept, see
        :meth:`take_over_sink`); the other export queues of the bound (or
        recorded) app as ``{"state": "ok"}``."""
        states: dict[str, dict[str, Any]] = {}
        if self._app is not None:
            for queue_id, queue in self._app.queues.items():
                if isinstance(queue, ExportQueue):
                    states[queue_id] = {"state": "ok"}
        else:
            with self.transaction() as tx:
                for queue_id, layout in recorded_queues(tx).items():
                    if layout.get("kind") == "export queue":
                        states[queue_id] = {"state": "ok"}
        for record in self._core.work_records(False):
            processor = _core.parse_processor_name(record["observer"])
            if processor is None or processor[0] != "export queue" or record["sink"] is None:
                continue
            queue_id = processor[1]
            name = "failing" if record["sink"] == "down" else "refused"
            state = states.get(queue_id)
            if name == "failing" and state is not None and state["state"] == "refused":
                continue  # blocked for good says more than down for now
            if state is None or state["state"] != name:
                state = states[queue_id] = {
                    "state": name,
                    "since_unix": record["first_failure_unix"],
                    "buckets": 0,
                    "last_failure_unix": record["last_failure_unix"],
                    "last_error": record["error"],
                }
            state["buckets"] += 1
            state["since_unix"] = min(state["since_unix"], record["first_failure_unix"])
            if record["last_failure_unix"] > state["last_failure_unix"]:
                state["last_failure_unix"] = record["last_failure_unix"]
                state["last_error"] = record["error"]
        return states

    def failures(self) -> Failures:
        """Each observer's failure history in the store, by observer name:
        ``{"failures", "parked", "first_failure_unix", "last_failure_unix",
        "last_cell": {"row", "family", "qualifier"}, "last_error": {"type",
        "message", "traceback"}}``, totals of every process that worked the
        store. A :class:`percolite.Failures`: a dict whose ``to_pandas()``
        gives one row per observer (with pandas installed)."""
        return Failures((s.pop("observer"), s) for s in self._core.failure_summaries())

    def retry_parked(
        self,
        observer: str | Iterable[str] | None = None,
        *,
        queue: str | Iterable[str] | None = None,
    ) -> int:
        """Put parked work back to run: all of it, or that of the observers
        named (``observer``) and of the queues named (``queue``, by id);
        returns how many notifications and queue keys were retried (0 when
        nothing matched). Each runs again with a fresh count of attempts; a
        queue key's queued updates (or entries) are processed in order with
        the rest of its bucket."""
        names = _names(observer, "observer")
        queues = _names(queue, "queue")
        if names is None and queues is None:
            return self._core.retry_parked(None)
        self._check_observer_names(names or [])
        parked_names = {r["observer"] for r in self._core.work_records(True)}
        wanted = list(names or [])
        for queue_id in queues or []:
            processors = queue_processors(queue_id)
            declared = self._app is not None and queue_id in self._app.queues
            if not declared and not parked_names.intersection(processors):
                raise ValueError(f"no queue named {queue_id!r} in the app or among the parked work")
            wanted += processors
        return self._core.retry_parked(wanted)

    def take_over_sink(self, queue: str) -> dict[str, Any]:
        """Makes the sink of export queue ``queue`` (a built-in exporter of
        :mod:`percolite.exporters`) belong to this store, on purpose and
        once: in one transaction of the sink, its rows (another store's
        exports) are deleted and this store is recorded as its owner; then
        the queue's buckets blocked by the sink's refusal run again. Returns
        what it did: ``{"sink", "previous_owner", "owner", "epoch",
        "rows_cleared", "retried"}``.

        Raises ValueError when the bound app has no export queue ``queue``
        or its exporter is not a built-in sink (a custom exporter keeps the
        identity itself: ``docs/exporters.md``), and
        :class:`percolite.SinkBusy` when another call is writing the sink
        (the other store's workers), with nothing changed."""
        if not isinstance(queue, str):
            raise TypeError(f"take_over_sink: queue must be a str, not {type(queue).__name__}")
        declared = self._app.queues.get(queue) if self._app is not None else None
        if not isinstance(declared, ExportQueue):
            raise ValueError(
                f"take_over_sink: no export queue named {queue!r} in "
                + (f"app {self._app.name!r}" if self._app is not None else "this store (no app)")
            )
        take_over = getattr(declared.exporter, "take_over", None)
        if take_over is None or not callable(take_over):
            raise ValueError(
                f"take_over_sink: the exporter of export queue {queue!r} "
                f"({declared.exporter!r}) is not a built-in sink of percolite.exporters; "
                "a custom sink is taken over by its own code (env.identity names this store)"
            )
        identity = self.identity
        if identity is None:
            raise Error(f"take_over_sink: {self.path} has no identity yet (it refuses commits)")
        done = dict(take_over(identity["store"], identity["epoch"]))
        done["retried"] = self._core.retry_parked(
            [_core.processor_name("export queue", queue)], True
        )
        # Taking over a sink nobody owned and that held nothing is routine (a
        # new store's default sink); anything else is worth a warning.
        routine = done["previous_owner"] is None and not done["rows_cleared"]
        _log.logger.log(
            logging.INFO if routine else logging.WARNING,
            "export queue %r: took its sink %s over (owner was %s, %d rows cleared)",
            queue,
            done["sink"],
            done["previous_owner"],
            done["rows_cleared"],
        )
        return done

    # How many parked records status() lists (parked() lists them all).
    STATUS_PARKED_LIMIT = 100

    def status(self, *, queues: bool = True) -> dict[str, Any]:
        """What the engine is doing, read from the store (so from any
        process) where the store keeps it: pending notifications per observed
        column; per observer, this process's runs, commits, conflicts and
        deferrals, and the failures every process recorded (``failures``,
        ``parked``, ``first_failure_unix``, ``last_failure_unix``,
        ``last_error`` (the traceback), ``last_error_type``,
        ``last_error_message``, ``last_failed_cell``); ``parked``, the number
        of parked notifications, and ``parked_work``, the first
        ``STATUS_PARKED_LIMIT`` of them (:meth:`parked` has them all); the
        entries queued in each queue of the bound app (``queues``: ``{id:
        count}``, found by a scan; ``queues=False`` skips the scan, for
        frequent polling); the state of each export queue's sink (``sinks``,
        as :meth:`sinks` gives it, with ``waiting``: the entries queued,
        None without the scan; for the bound app's queues also
        ``delivery``, as the queue says it, and this process's
        ``native_batches`` and ``exporter_batches``: the tries the core
        made on a built-in sink itself, and the batches its exporter took); this
        process's worker pool (``workers``: ``running``, ``threads``,
        ``queued`` notifications, ``active`` runs, ``committing``: runs
        whose commits are with the writer or wait to be
        settled, their notifications held meanwhile, and ``lease``); the
        worker leases of every process (``leases``: owner, group, threads,
        expiry, last renewal, live, partitions taken); this process's commit
        counters (``store``); and for a store on a server (``server``, None
        for a local one): the server this handle reaches (``address``), its
        replication, this handle's writer's time on its current batch, the
        clock offset, the reconnections and failovers every process counted
        (``percolite._metrics.server_status`` lists the keys), and the last of
        each any process recorded (``last_reconnection``: its ``cause``;
        ``last_failover``: its ``servers``, old -> new; both with ``server``,
        ``unix`` and ``process``)."""
        check_bool("status: queues", queues)
        workers = self._core.worker_stats()
        pending = self._core.pending_by_column()
        observed = self._core.observed_columns()
        summaries = self.failures()
        parked = self._core.work_records(True)
        parked_by: dict[str, int] = {}
        for record in parked:
            parked_by[record["observer"]] = parked_by.get(record["observer"], 0) + 1
        by_column = {(o["family"], o["qualifier"]): o for o in workers["observers"]}
        observers = []
        for family, qualifier, notify, name in observed:
            entry = dict(by_column.get((family, qualifier), {}))
            entry.update(
                name=name,
                family=family,
                qualifier=qualifier,
                notify=notify,
                pending=pending.get((family, qualifier), 0),
            )
            for key in ("runs", "commits", "conflicts", "failures", "deferrals", "running"):
                entry.setdefault(key, 0)
            entry.setdefault("last_error", None)
            entry.setdefault("last_failure_unix", None)
            entry.pop("skipped_parked", None)
            entry["parked"] = parked_by.get(name, 0)
            summary = summaries.get(name)
            entry.update(first_failure_unix=None, last_error_type=None, last_error_message=None)
            entry["last_failed_cell"] = None
            if summary is not None:
                error = summary["last_error"]
                entry.update(
                    failures=max(entry["failures"], summary["failures"]),
                    first_failure_unix=summary["first_failure_unix"],
                    last_failure_unix=summary["last_failure_unix"],
                    last_error=error["traceback"],
                    last_error_type=error["type"],
                    last_error_message=error["message"],
                    last_failed_cell=summary["last_cell"],
                )
            observers.append(entry)
        depths = self.queue_depths() if queues else {}
        sinks = self.sinks()
        for queue_id, state in sinks.items():
            state["waiting"] = depths.get(queue_id)
            queue = self._app.queues.get(queue_id) if self._app is not None else None
            if isinstance(queue, ExportQueue):
                state.update(queue.delivered())
        return {
            "path": self.path,
            "identity": recorded_identity(self),
            "pending": sum(pending.values()),
            "parked": len(parked),
            "parked_work": [
                describe_record(self._app, r) for r in parked[: self.STATUS_PARKED_LIMIT]
            ],
            "workers": {
                k: workers[k]
                for k in ("running", "threads", "queued", "active", "committing", "lease")
            },
            "leases": self._core.lease_holders(),
            "observers": observers,
            "queues": depths,
            "sinks": sinks,
            "store": self.stats(),
            "server": _metrics.server_status(self),
        }

    def queue_depths(self) -> dict[str, int]:
        """Entries queued per queue, ``{id: count}`` (a scan, as in
        :meth:`status`): the queues of the bound app, or else those of the
        app the store recorded (read without the app's code)."""
        with self.transaction() as tx:
            if self._app is not None:
                return {qid: q.depth(tx) for qid, q in self._app.queues.items()}
            depths = {}
            for queue_id, layout in recorded_queues(tx).items():
                core = _recorded_core_queue(queue_id, layout)
                if core is not None:
                    depths[queue_id] = queue_depth(tx, core.entry_row_prefix)
            return depths

    def metrics(self) -> dict[str, Any]:
        """Counters and gauges of the store, totals over every process that
        worked it (each process adds its counts to the store every
        ``percolite._metrics.FLUSH_SECONDS`` seconds, when it closes the
        store, and, for this process, now)::

            {"counters": {"commits", "conflicts", "syncs",
                          "observer_runs", "observer_commits", "observer_conflicts",
                          "observer_deferrals", "observer_failures", "observer_parkings":
                              {observer: n},
                          "queue_batches", "queue_entries": {queue: n},
                          "observer_writes": {observer: {target: n}},
                          "commit_seconds_bucket": {le: n}, "commit_seconds_sum",
                          "commit_seconds_count", "reconnections", "failovers"},
             "gauges": {"pending_notifications", "pending_by_observer",
                        "parked", "parked_by_observer", "queue_depth",
                        "sink_failing", "sink_failing_since_unix",
                        "lease_holders", "lease_groups", "transactions_per_sync",
                        "updated_unix"}}

        ``commits`` leaves out the metric writes themselves; ``syncs`` counts
        group commits (``commits / syncs`` is ``transactions_per_sync``);
        ``queue_entries / queue_batches`` is a queue's mean fold (or export)
        size. ``observer_writes`` counts what observers' committed runs wrote,
        by target: ``"family:F"`` (cells of column family F their own code
        set or deleted) or ``"queue:ID"`` (entries added to queue ID): the
        app's dataflow graph, learned from its runs. ``commit_seconds_*`` is
        a histogram of how long commits took (from the call to the result,
        group commit and sync included): ``le`` is a bucket's upper bound in
        seconds, counts cumulative as in Prometheus. ``reconnections`` counts
        the connections to a store's server lost and made again, ``failovers``
        those that reached another host (0 for a local store). ``percolite status DB
        --prometheus`` prints them in the Prometheus text format.
        """
        self._recorder.flush()
        return _metrics.read(self)

    def stats(self) -> dict[str, Any]:
        """Counters of this process's commits: ``commits``, ``conflicts``,
        ``batches`` (group commits), ``inline_batches`` (those a committing
        thread ran itself, with no hand-off to the writer thread),
        ``tombstones_collected``, ``map_size``, ``map_growths``."""
        return self._core.stats()

    def close(self) -> None:
        """Flush and close this handle's loaders, stop its workers (letting
        running observers finish), then close it; idempotent."""
        for loader in list(self._loaders):
            loader.close()
        if not self.closed:
            self._core.stop_workers()  # their last counts go into the metrics
            self._recorder.release(self)
        self._core.close()
        self._workers_running = False

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<percolite.Env {self.path!r} sync={self._sync!r} {state}>"

    def _repr_html_(self) -> str:
        """Jupyter's view of the handle: a status card read with
        ``status(queues=False)`` (no queue scan), or "closed"."""
        return env_html(self)


def _warn_if_replication_is_asynchronous(env: Env) -> None:
    """A store that asks for durable commits, on a server whose standbys
    do not confirm them: a failover may lose what was reported committed."""
    stats = env.stats()
    if stats.get("replication") != "asynchronous":
        return
    n = stats["standbys"]
    logging.getLogger("percolite.store").warning(
        "%s: the server replicates asynchronously (%d standby%s, no "
        "synchronous_standby_names): after a failover, the last commits it reported may be "
        "missing on the new primary. For commits that survive a failover, make standbys "
        "synchronous, as a quorum: synchronous_standby_names = 'ANY 1 (s1, s2)'",
        shown_target(env.path),
        n,
        "" if n == 1 else "s",
    )


def bound_to(app: App) -> list[Env]:
    """The open handles of this process that ``app`` is bound to."""
    return [env for env in list(_open_envs) if env.app is app and not env.closed]


def recorded_app(tx: Transaction) -> dict[str, Any]:
    """The app the store recorded (``{"name", "observers", "queues"}``), {} for none."""
    stored = tx.get(_APP_ROW, _APP_COLUMN)
    return json.loads(stored) if stored is not None else {}


def recorded_queues(tx: Transaction) -> dict[str, dict[str, Any]]:
    """The queues of the app the store recorded: ``{id: {"kind", "buckets", ...}}``."""
    return recorded_app(tx).get("queues", {})


def recorded_identity(env: Env) -> dict[str, Any] | None:
    """``env.identity`` as the store holds it now, without making one (None
    before it is made)."""
    found = env.core.identity(False)
    return None if found is None else {"store": found[0], "epoch": found[1]}


def describe_record(app: App | None, record: dict[str, Any]) -> dict[str, Any]:
    """A record of parked or failing work as :meth:`Env.parked` shows it:
    with ``queue`` (the queue's id for a queue key, else None) and the key
    decoded by the queue's key codec when ``app`` declares the queue."""
    record["queue"] = None
    if record["key"] is None:
        return record
    processor = _core.parse_processor_name(record["observer"])
    if processor is None:
        return record
    queue_id = record["queue"] = processor[1]
    queue = app.queues.get(queue_id) if app is not None else None
    if queue is not None:
        try:
            record["key"] = queue.key_codec.decode(record["key"])
        except Exception:  # noqa: BLE001 - shown as stored rather than not at all
            pass
    return record


def queue_processors(queue_id: str) -> list[str]:
    """The observer names the processor of queue ``queue_id`` may run under,
    one per kind of queue: operators name a queue by its id alone."""
    return [_core.processor_name(kind, queue_id) for kind in _core.QUEUE_KINDS]


def _names(value: str | Iterable[str] | None, what: str) -> list[str] | None:
    """None, or the names given as one str or an iterable of them."""
    if value is None:
        return None
    message = f"retry_parked: {what} must be a name (str), an iterable of names, or None"
    if isinstance(value, str):
        return [value]
    try:
        names = list(value)
    except TypeError:
        raise TypeError(f"{message}, not {type(value).__name__}") from None
    if not all(isinstance(n, str) for n in names):
        raise TypeError(message)
    return names


def _sinks_note(sinks: dict[str, dict[str, Any]]) -> str:
    """What a progress line says of the export queues whose sink is not ok."""
    parts = []
    for queue_id, sink in sinks.items():
        if sink["state"] != "ok":
            since = time.strftime("%H:%M:%S", time.localtime(sink["since_unix"]))
            how = "failing" if sink["state"] == "failing" else "refusing this store"
            parts.append(f"sink of {queue_id!r} {how} since {since}")
    return "; ".join(parts)


def _recorded_core_queue(queue_id: str, recorded: dict[str, Any]) -> Any:
    """A throwaway core queue of the kind and buckets the store recorded
    for ``queue_id``, to ask the core for its layout (None if unknown)."""
    kind = recorded.get("kind")
    buckets = int(recorded.get("buckets", 1))
    try:
        if kind == "combine queue":
            return _core.CombineQueue.create(queue_id, buckets, 1, "sum", "int64", 0, None)
        if kind == "export queue":
            return _core.ExportQueue.create(queue_id, buckets, 1, lambda *call: (True, None))
    except ValueError:
        pass
    return None


def _queue_notify_columns(queue_id: str, recorded: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    """The notify column of a queue the recorded app had: the core's layout
    (``<family>:<id>``, ``notify``)."""
    core = _recorded_core_queue(queue_id, recorded)
    if core is None:
        return []
    family, qualifier, _name = core.notify_column
    return [(family, qualifier)]
