"""Applications: observers (and, later, queues) declared in one importable place.

Every worker process imports the same ``App`` object, so every process builds
the same registry::

    app = percolite.App()

    @app.observer(("doc", "content"), notify=percolite.STRONG)
    def index(tx, row, column):
        text = tx.get(row, column).decode()
        tx.set(row, ("doc", "words"), str(len(text.split())))

    env = percolite.open("my.db", app=app)
    env.process(threads=4)     # start workers, wait until idle, stop
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from . import _core
from ._args import check_max_attempts
from ._cells import Column, column_of
from ._combine import CombineQueue
from ._export import ExportQueue, SequencedExport, TransientErrors, check_transient_errors
from ._html import app_html
from ._log import failure_text
from ._observer import STRONG, WEAK, NotificationType, ObserverTransaction
from ._queues import check_queue_options, core_spec
from .codecs import Codec

if TYPE_CHECKING:
    # Type checkers know typing_extensions from their own stubs; Python 3.11's
    # TypeVar takes no default (PEP 696), so the running program needs none.
    from typing_extensions import TypeVar

    # A queue's keys and values: the type of its codec, or Any for a codec
    # given by name (typing a name would take an overload per name and role).
    K = TypeVar("K", default=Any)
    V = TypeVar("V", default=Any)
else:
    from typing import TypeVar

    K = TypeVar("K")
    V = TypeVar("V")

__all__ = ["App", "NotificationType", "STRONG", "WEAK", "ObserverTransaction"]


# An observer: fn(tx, row, column), its result ignored.
ObserverFn = TypeVar("ObserverFn", bound=Callable[[ObserverTransaction, bytes, Column], object])

# The form of app_identity() that stores record.
IDENTITY_VERSION = 1


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How app identity ``current`` differs from ``recorded`` (both as
    :func:`app_identity` gives them), one sentence each; empty when they
    agree. Observer names, lingers, batch sizes and max_attempts are not
    compared: they change nothing stored."""
    out = []
    if recorded.get("name") != current["name"]:
        out.append(f"the app is named {current['name']!r}, not {recorded.get('name')!r}")
    old, new = recorded.get("observers", {}), current["observers"]

    def column(entry: dict[str, Any]) -> str:
        family, qualifier = entry["column"]
        return f"column {family}:{qualifier} ({entry['notify']})"

    for key in sorted(old.keys() - new.keys()):
        out.append(f"{column(old[key])} is observed by the recorded app, not by this one")
    for key in sorted(new.keys() - old.keys()):
        out.append(f"{column(new[key])} is observed by this app, not by the recorded one")
    for key in sorted(old.keys() & new.keys()):
        if old[key]["notify"] != new[key]["notify"]:
            out.append(
                f"{column(new[key])} was observed {old[key]['notify'].upper()} by the recorded app"
            )
    old, new = recorded.get("queues", {}), current["queues"]
    for queue_id in sorted(old.keys() - new.keys()):
        out.append(f"{old[queue_id]['kind']} {queue_id!r} is in the recorded app, not in this one")
    for queue_id in sorted(new.keys() - old.keys()):
        out.append(f"{new[queue_id]['kind']} {queue_id!r} is in this app, not in the recorded one")
    for queue_id in sorted(old.keys() & new.keys()):
        was, now = old[queue_id], new[queue_id]
        changed = [
            f"{name} {was.get(name)!r} -> {now.get(name)!r}"
            for name in sorted(was.keys() | now.keys())
            if was.get(name) != now.get(name)
        ]
        if changed:
            out.append(f"{now['kind']} {queue_id!r}: {', '.join(changed)}")
    return out


class _Observer(NamedTuple):
    column: Column
    fn: Callable[[Any, bytes, Column], Any]
    notify: NotificationType
    name: str
    max_attempts: int | None = _core.DEFAULT_MAX_ATTEMPTS


def _check_observer_signature(fn: Callable[..., Any], name: str) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    try:
        signature.bind(None, None, None)
    except TypeError:
        raise TypeError(
            f"observer {name} must accept three arguments (tx, row, column); "
            f"its signature is {signature}"
        ) from None


def _make_runner(fn: Callable[..., Any]) -> Callable:
    """The function the C++ workers call: wraps the core transaction, calls
    the observer, and reports a failure as its formatted traceback."""
    make_column = column_of

    def runner(core_tx, row: bytes, family: bytes, qualifier: bytes) -> tuple[Any, ...]:
        try:
            fn(ObserverTransaction(core_tx), row, make_column(family, qualifier))
        except BaseException:
            return (False, failure_text())
        return (True, None)

    return runner


class App:
    """A registry of observers (and queues) shared by every process of an application.

    The app is a declaration: what it holds is read through :attr:`observers`,
    :attr:`queues` and :attr:`revision`, and stores bound to it follow its
    changes (see :meth:`subscribe`)."""

    def __init__(self, name: str = "app") -> None:
        if not isinstance(name, str):
            raise TypeError(f"an app's name must be a str, not {type(name).__name__}")
        self.name = name
        self._observers: dict[Column, _Observer] = {}
        self._queues: dict[str, CombineQueue[Any, Any] | ExportQueue[Any, Any]] = {}
        self._queues_view = MappingProxyType(self._queues)  # read on every queue add
        self._revision = 0
        self._subscribers: list[tuple[Callable[[], Any], Callable[[], Any]]] = []

    @property
    def observers(self) -> list[_Observer]:
        """The registered observers, as ``(column, fn, notify, name)`` named
        tuples, in registration order (queues' processors not included): a
        new list at each call, which changes nothing when changed."""
        return list(self._observers.values())

    @property
    def queues(self) -> Mapping[str, CombineQueue[Any, Any] | ExportQueue[Any, Any]]:
        """The declared queues by id, in declaration order: a read-only view
        that follows later declarations."""
        return self._queues_view

    @property
    def revision(self) -> int:
        """How many changes the declaration has had: grows by one with every
        observer or queue declared or removed, and every ``on_change`` or
        ``export_to`` of its combine queues. A store bound to the app records
        the app again when it has grown."""
        return self._revision

    def subscribe(
        self, before: Callable[[App, str], object], after: Callable[[App], object]
    ) -> None:
        """Have ``before(app, what)`` called before each change of the
        declaration (``what`` names it; an exception refuses the change and
        leaves the app as it was) and ``after(app)`` once it is made. Every
        :class:`Env` bound to the app subscribes: it refuses changes while
        its workers run, and records each change in its store. Bound methods
        are held weakly (a subscriber that is gone drops out); subscribing
        the same pair again changes nothing."""
        if not callable(before) or not callable(after):
            raise TypeError("subscribe needs two callables: before(app, what) and after(app)")
        self._subscribers = [(b, a) for b, a in self._subscribers if b() is not None]
        if any(b() == before and a() == after for b, a in self._subscribers):
            return
        self._subscribers.append((_weak(before), _weak(after)))

    @contextmanager
    def _changing(self, what: str = "a change") -> Iterator[None]:
        """Around every change of the declaration: the subscribers may refuse
        it first; once made (the block did not raise), the revision grows and
        they hear of it. The queues get this to report their own changes."""
        for before, _after in list(self._subscribers):
            fn = before()
            if fn is not None:
                fn(self, what)
        yield
        self._revision += 1
        for _before, after in list(self._subscribers):
            fn = after()
            if fn is not None:
                fn(self)

    def observer(
        self,
        column: Column | tuple[bytes | str, bytes | str],
        notify: NotificationType = STRONG,
        *,
        name: str | None = None,
        max_attempts: int | None = _core.DEFAULT_MAX_ATTEMPTS,
    ) -> Callable[[ObserverFn], ObserverFn]:
        """Decorator registering ``fn(tx, row, column)`` as the observer of ``column``.

        A run that raises is retried with exponential backoff; after
        ``max_attempts`` failed runs of one notification (default 10;
        ``None`` retries forever) its work is *parked*: recorded in the store
        with the traceback and no longer run until
        :meth:`Env.retry_parked` (or ``percolite retry``) puts it back.
        """
        if callable(column):
            # A bare @app.observer would make `register` the function's name
            # and register nothing: refuse it here.
            raise TypeError(
                "App.observer takes the observed column first: write "
                "@app.observer((family, qualifier)), not a bare @app.observer"
            )
        check_max_attempts(max_attempts, f"observer for {column!r}")

        def register(fn: ObserverFn) -> ObserverFn:
            self.add_observer(column, fn, notify=notify, name=name, max_attempts=max_attempts)
            return fn

        return register

    def add_observer(
        self,
        column: Any,
        fn: Callable[..., Any],
        notify: NotificationType = STRONG,
        *,
        name: str | None = None,
        max_attempts: int | None = _core.DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        """Register ``fn(tx, row, column)`` for ``column``; see :meth:`observer`."""
        if not isinstance(column, tuple) or len(column) != 2:
            raise TypeError(
                f"column must be a (family, qualifier) tuple or percolite.Column, not {column!r}"
            )
        column = Column(*column)
        if not callable(fn):
            raise TypeError(f"observer for {column!r} must be callable, not {type(fn).__name__}")
        try:
            notify = NotificationType(notify)
        except ValueError:
            raise ValueError(
                f"notify must be percolite.STRONG or percolite.WEAK, not {notify!r}"
            ) from None
        label = name or getattr(fn, "__qualname__", None) or repr(fn)
        check_max_attempts(max_attempts, f"observer {label}")
        _check_observer_signature(fn, label)
        old = self._observers.get(column)
        if old is not None:
            # Declared again (a notebook cell run twice): the same settings take
            # the new function; other settings are refused, naming what differs.
            differ = [
                f"{what} {was!r} -> {now!r}"
                for what, was, now in (
                    ("name", old.name, label),
                    ("notify", old.notify.name, notify.name),
                    ("max_attempts", old.max_attempts, max_attempts),
                )
                if was != now
            ]
            if differ:
                raise ValueError(
                    f"column {column!r} already has an observer ({old.name}), declared with "
                    f"other settings: {', '.join(differ)}. One column has at most one "
                    f"observer: to replace it, call app.remove_observer({tuple(column)!r}) first"
                )
        with self._changing(f"observer {label}"):
            self._observers[column] = _Observer(column, fn, notify, label, max_attempts)

    def combine_queue(
        self,
        queue_id: str,
        *,
        buckets: int = _core.DEFAULT_COMBINE_BUCKETS,
        combiner: str | Callable[[Any, list[Any]], Any] = "sum",
        key_codec: str | Codec[K] = "str",
        value_codec: str | Codec[V] = "int64",
        buffer_size: int = _core.DEFAULT_BUFFER_SIZE,
        linger: float = 0.0,
        max_attempts: int | None = _core.DEFAULT_MAX_ATTEMPTS,
    ) -> CombineQueue[K, V]:
        """Declare a :class:`percolite.CombineQueue` (see ``percolite._combine``).

        ``combiner`` is ``"sum"``, ``"max"``, ``"min"``, ``"last"`` (native,
        run in C++ without the GIL) or a callable ``(key, values) -> value |
        None`` where ``values`` holds the current value (when there is one)
        followed by the queued updates in commit order; ``None`` deletes the
        key. Codecs: see :mod:`percolite.codecs`; a type checker types the
        queue's keys and values by codec objects (``key_codec=codecs.STR``
        gives ``str`` keys), and as ``Any`` for codec names. ``buffer_size``
        bounds the updates one processing transaction reads (a key's updates
        are never split across transactions). ``linger`` (seconds, 0 to 3600) lets a
        bucket with fewer than ``buffer_size`` updates wait up to that long
        for more while they keep arriving: fewer runs, each folding more
        updates of hot keys, for at most ``linger`` more latency. A linger
        never idles :meth:`Env.wait`. After ``max_attempts`` failed runs of a
        bucket (default 10; ``None`` retries forever) the keys it fails on
        (the combiner, the change observer or an export raising) are found
        by splitting the batch and parked, their updates kept queued until
        :meth:`Env.retry_parked`; the other keys fold and go on.
        """
        queue: CombineQueue[K, V] = self._add_queue(
            "combine queue",
            queue_id,
            lambda: CombineQueue(
                self,
                queue_id,
                buckets=buckets,
                combiner=combiner,
                key_codec=key_codec,
                value_codec=value_codec,
                buffer_size=buffer_size,
                linger=linger,
                max_attempts=max_attempts,
                changing=self._changing,
            ),
        )
        return queue

    # Two forms, told apart by whether the exporter is given: the queue, or a
    # decorator that makes one of the function it decorates.
    @overload
    def export_queue(
        self,
        queue_id: str,
        exporter: Callable[[list[SequencedExport]], object],
        *,
        buckets: int = ...,
        key_codec: str | Codec[K] = ...,
        value_codec: str | Codec[V] = ...,
        batch_size: int = ...,
        linger: float = ...,
        max_attempts: int | None = ...,
        transient_errors: TransientErrors | None = ...,
    ) -> ExportQueue[K, V]: ...
    @overload
    def export_queue(
        self,
        queue_id: str,
        exporter: None = ...,
        *,
        buckets: int = ...,
        key_codec: str | Codec[K] = ...,
        value_codec: str | Codec[V] = ...,
        batch_size: int = ...,
        linger: float = ...,
        max_attempts: int | None = ...,
        transient_errors: TransientErrors | None = ...,
    ) -> Callable[[Callable[[list[SequencedExport]], object]], ExportQueue[K, V]]: ...
    def export_queue(
        self,
        queue_id: str,
        exporter: Callable[[list[SequencedExport]], object] | None = None,
        *,
        buckets: int = 16,
        key_codec: str | Codec[K] = "str",
        value_codec: str | Codec[V] = "json",
        batch_size: int = _core.DEFAULT_BATCH_SIZE,
        linger: float = 0.0,
        max_attempts: int | None = _core.DEFAULT_MAX_ATTEMPTS,
        transient_errors: TransientErrors | None = None,
    ) -> (
        ExportQueue[K, V] | Callable[[Callable[[list[SequencedExport]], object]], ExportQueue[K, V]]
    ):
        """Declare a :class:`percolite.ExportQueue` (see ``percolite._export``)
        whose ``exporter(entries)`` receives lists of
        :class:`percolite.SequencedExport` ordered by key, then seq.

        With ``exporter`` given, returns the queue; without, returns a
        decorator that makes the decorated ``fn(entries)`` the exporter and
        returns the queue in its place::

            @app.export_queue("counts")
            def counts(entries): ...

            counts.add(tx, "key", 42)

        Built-in exporters: :mod:`percolite.exporters`. Codecs: as for
        :meth:`combine_queue` (``value_codec=codecs.INT64`` types the values
        as ``int``). ``batch_size`` bounds the entries of one call (and one
        processing transaction). ``linger``
        (seconds, 0 to 3600) lets a bucket with fewer than ``batch_size``
        entries wait up to that long for more before the exporter is called:
        fewer, fuller calls, for at most ``linger`` more latency. A linger
        never idles :meth:`Env.wait`.

        When the exporter raises, the sink being down and a bad key are told
        apart (``docs/exporters.md``, "When a sink fails"). An exception that
        is an instance of ``transient_errors`` (an exception class or a tuple
        of them; default :data:`percolite.exporters.TRANSIENT_ERRORS`:
        ``OSError``, which covers connection errors and time-outs), of
        :class:`percolite.SinkUnavailable`, psycopg's ``OperationalError``
        or a ``sqlite3.OperationalError`` saying the database is locked or
        busy means the sink is down: the batch is retried whole, with
        backoff, for as long as it takes, and nothing is parked. Other
        errors count as failed runs: after ``max_attempts`` of them for a
        bucket (default 10; ``None`` retries forever) the keys the exporter
        fails on are found by calling it with halves of the batch and
        parked, their entries kept queued until :meth:`Env.retry_parked`;
        a sink that fails for every part of that split is taken as down,
        not as poison keys, and nothing is parked.
        """

        def declare(fn: Any) -> ExportQueue[K, V]:
            queue: ExportQueue[K, V] = self._add_queue(
                "export queue",
                queue_id,
                lambda: ExportQueue(
                    self,
                    queue_id,
                    buckets=buckets,
                    exporter=fn,
                    key_codec=key_codec,
                    value_codec=value_codec,
                    batch_size=batch_size,
                    linger=linger,
                    max_attempts=max_attempts,
                    transient_errors=transient_errors,
                ),
            )
            return queue

        if exporter is not None:
            return declare(exporter)
        # Check the options now, so a mistake is reported at the call, not at decoration.
        check_queue_options("export queue", queue_id, buckets, "batch_size", batch_size)
        check_max_attempts(max_attempts, f"export queue {queue_id!r}")
        check_transient_errors(transient_errors, f"export queue {queue_id!r}")
        return declare

    def _add_queue(self, kind: str, queue_id: str, make: Callable[[], Any]) -> Any:
        """Registers the queue ``make()`` builds (which checks its options)
        under ``queue_id``. Declared again with the same settings (a notebook
        cell run twice), the new queue takes the old one's place; with other
        settings, ValueError names what differs."""
        queue = make()
        old = self._queues.get(queue_id)
        if old is not None:
            differ = [
                f"{name} {getattr(old, name, None)!r} -> {getattr(queue, name, None)!r}"
                for name in ("buckets", "linger", "max_attempts", "buffer_size", "batch_size")
                if getattr(old, name, None) != getattr(queue, name, None)
            ]
            differ += differences(
                {"name": self.name, "observers": {}, "queues": {queue_id: old.layout}},
                {"name": self.name, "observers": {}, "queues": {queue_id: queue.layout}},
            )
            if differ:
                raise ValueError(
                    f"app {self.name!r} already has a queue named {queue_id!r}, declared with "
                    f"other settings: {'; '.join(differ)}. To replace it, call "
                    f"app.remove_queue({queue_id!r}) first"
                )
        with self._changing(f"{kind} {queue_id!r}"):
            self._queues[queue_id] = queue
        return queue

    def remove_observer(self, column: Any) -> None:
        """Unregister the observer of ``column`` (KeyError when there is
        none). Stores bound to this app record the change; the column's
        pending notifications are dropped there, as ``upgrade=True`` does."""
        column = Column(*column)
        if column not in self._observers:
            raise KeyError(f"app {self.name!r} has no observer for column {column!r}")
        with self._changing(f"a change of the observer of {column!r}"):
            del self._observers[column]

    def remove_queue(self, queue_id: str) -> None:
        """Unregister queue ``queue_id`` (KeyError when there is none); its
        stored rows stay, and stores bound to this app record the change."""
        if queue_id not in self._queues:
            raise KeyError(f"app {self.name!r} has no queue named {queue_id!r}")
        with self._changing(f"a change of queue {queue_id!r}"):
            del self._queues[queue_id]

    def __repr__(self) -> str:
        return f"<percolite.App {self.name!r} observers={len(self._observers)}>"

    def _repr_html_(self) -> str:
        """Jupyter's view of the app: its declarations (observers and their
        columns, queues with their layouts and where their output goes)."""
        return app_html(self)


def _weak(fn: Callable[..., Any]) -> Callable[[], Any]:
    """A reference to ``fn``: weak for a bound method (whose object may go
    away), else strong."""
    if inspect.ismethod(fn):
        return weakref.WeakMethod(fn)
    return lambda: fn


def app_identity(app: App) -> dict[str, Any]:
    """What a store records of the app bound to it (see :func:`differences`):
    its name, its observed columns and its queues' layouts."""
    observers = {
        f"{o.column.family.hex()}:{o.column.qualifier.hex()}": {
            "column": [_text(o.column.family), _text(o.column.qualifier)],
            "notify": o.notify.name.lower(),
        }
        for o in app.observers
    }
    queues = {queue_id: queue.layout for queue_id, queue in app.queues.items()}
    return {
        "version": IDENTITY_VERSION,
        "name": app.name,
        "observers": observers,
        "queues": queues,
    }


def worker_specs(app: App) -> list[tuple[Any, ...]]:
    """What the core's workers run for ``app``: one spec per observer (its
    column, notification type, name, runner and attempts), then one per
    queue (its processor, a weak observer of the queue's notify column)."""
    specs: list[tuple[Any, ...]] = [
        (
            o.column.family,
            o.column.qualifier,
            int(o.notify),
            o.name,
            _make_runner(o.fn),
            check_max_attempts(o.max_attempts, o.name),
        )
        for o in app.observers
    ]
    specs += [core_spec(queue.core) for queue in app.queues.values()]
    return specs
