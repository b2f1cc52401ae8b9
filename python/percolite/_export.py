"""The export queue: only committed data leaves for external systems.

Contract: ``cpp/include/percolite/export_queue.h`` (from Fluo Recipes'
ExportQueue). In short:

* ``eq.add(tx, key, value)`` queues an entry that exists if and only if ``tx``
  commits; adders never collide with each other or with the exporter;
* each entry gets a sequence number ``seq`` that follows commit order: for one
  key, a later commit always has a larger ``seq``;
* one transaction per bucket reads a batch of entries, calls the exporter with
  them ordered by key, then seq, and deletes them when the exporter returns;
  with ``linger``, a short batch first waits up to that many seconds to fill;
* at least once: an exporter that raises leaves the batch queued and it is
  retried with backoff (a retry may deliver the same entries again, possibly
  with more); sinks absorb duplicates with a seq guard;
* the sink being down is not a bad key: an exception of
  ``transient_errors`` (:func:`sink_is_down`) makes the batch wait and be
  retried whole, for as long as it takes, parking nothing.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

from . import _core
from ._args import check_max_attempts
from ._cells import SequencedExport
from ._html import export_queue_html
from ._log import failure_text
from ._queue_rows import queue_depth
from ._queues import (
    accepts,
    adding_transaction,
    check_linger,
    check_queue_options,
    encode_or_raise,
)
from .codecs import Codec, get_codec, native_layout
from .errors import SinkRefused, SinkUnavailable

if TYPE_CHECKING:
    from ._app import App
    from ._transaction import Transaction

__all__ = [
    "ExportBatch",
    "ExportQueue",
    "SequencedExport",
    "SEQ_INDEX_BITS",
    "TRANSIENT_ERRORS",
    "TransientErrors",
    "sink_is_down",
]

# seq = commit_ts << SEQ_INDEX_BITS | index of the entry in its transaction.
SEQ_INDEX_BITS: int = _core.SEQ_INDEX_BITS


# The exceptions that say a sink is down, unless a queue names its own
# (transient_errors): OSError covers ConnectionError and TimeoutError.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OSError,)

TransientErrors: TypeAlias = type[BaseException] | tuple[type[BaseException], ...]


def check_transient_errors(value: Any, what: str) -> tuple[type[BaseException], ...]:
    """``value`` (None, an exception class or a tuple of them) as a tuple;
    TypeError naming ``what`` otherwise."""
    if value is None:
        return TRANSIENT_ERRORS
    classes = value if isinstance(value, tuple) else (value,)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(
                f"{what}: transient_errors must be an exception class or a tuple of them, "
                f"not {cls!r}"
            )
    return classes


def sink_is_down(error: BaseException, transient: tuple[type[BaseException], ...]) -> bool:
    """Whether an exporter's ``error`` means its sink is down (retry the
    whole batch, park nothing) rather than that an entry is bad: an instance
    of ``transient`` or of :class:`percolite.SinkUnavailable`, psycopg's (or
    psycopg2's) ``OperationalError``, or a ``sqlite3.OperationalError`` that
    says the database is locked or busy."""
    if isinstance(error, (SinkUnavailable, *transient)):
        return True
    if isinstance(error, sqlite3.OperationalError):
        text = str(error)
        return "locked" in text or "busy" in text
    for driver in ("psycopg", "psycopg2"):
        module = sys.modules.get(driver)  # only loaded if the exporter uses it
        operational = getattr(module, "OperationalError", None)
        if operational is not None and isinstance(error, operational):
            return True
    return False


def _sink_failure(error: BaseException, transient: tuple[type[BaseException], ...]) -> str | None:
    """How the core is to take an exporter's ``error``: "refused" (the
    sink refuses this store for good: its bucket is blocked), "down" (an
    outage: retried whole, parks nothing) or None (a failed attempt)."""
    if isinstance(error, SinkRefused):
        return "refused"
    return "down" if sink_is_down(error, transient) else None


class ExportBatch(list[SequencedExport]):
    """The entries of one exporter call: a list of :class:`SequencedExport`
    ordered by key, then seq, which also says where they come from:
    ``queue`` (the export queue's id), ``store`` (the identity of the store
    feeding the sink: 32 hexadecimal digits, the same in every process and
    kept by copies of the store) and ``epoch`` (from 1; a store opened as
    restored from a copy starts the next one, and its entries are then newer
    than everything its sinks hold, whatever their seq). A sink that keeps
    the identity beside its seq guard can refuse another store's entries
    (``docs/exporters.md``, "A sink belongs to one store")."""

    __slots__ = ("queue", "store", "epoch")
    queue: str
    store: str
    epoch: int


K = TypeVar("K")
V = TypeVar("V")


# A queued value is one tag byte, then the encoded value: deletions (None) are
# representable whatever the codec (ExportValue in export_queue.h, which the
# combine queue's native export_to writes too).
_DELETED = b"\x00"
_PRESENT = b"\x01"


class InjectedFault(Exception):
    """A failure a simulation (``percolite.testing.simulate``) injected."""


class _Injected(threading.local):
    # Set by a simulation running on this thread (inject_exporter_faults).
    exporter_fails: Callable[[], bool] | None = None


_injected = _Injected()


def inject_exporter_faults(fails: Callable[[], bool] | None) -> None:
    """For a simulation (``percolite.testing.simulate``) running on this
    thread: ``fails()`` is called after each exporter call on the thread
    returns, and True makes the call fail as if the exporter had raised
    after sending its batch (the batch stays queued and is sent again).
    None stops the injection."""
    if (_injected.exporter_fails is None) != (fails is None):
        # Native sinks skip the Python call where faults are injected.
        _core.hold_native_sinks(fails is not None)
    _injected.exporter_fails = fails


def _native_maker(exporter: Any) -> Any:
    """The native-path factory of a built-in exporter (``_native_sink``), or
    None. Only the built-in exporter classes themselves: a subclass may
    change what a call does."""
    return type(exporter).__dict__.get("_native_sink")


class _Forwarded:
    """For an exporter that forwards every batch, unchanged, to the exporter
    its ``forward_to()`` returns at the time (one chosen by configuration in
    each process, say): called by the core at each batch, it returns the
    native path to that exporter, or None (the forwarding exporter takes the
    batch). Each exporter's native path is made once and kept while the
    exporter lives."""

    def __init__(
        self,
        forward_to: Callable[[], Any],
        kl: Any,
        vl: Any,
        on_target: Callable[[Callable[[], Any]], None],
    ) -> None:
        self.forward_to, self.kl, self.vl = forward_to, kl, vl
        self.on_target = on_target  # given the target at each batch
        self.made: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()

    def __call__(self) -> Any:
        target = self.forward_to()
        self.on_target(lambda: target)
        make = _native_maker(target)
        if make is None:
            return None
        with self.lock:
            if target not in self.made:
                self.made[target] = make(target, self.kl, self.vl)[0]
            return self.made[target]


class ExportQueue(Generic[K, V]):
    """Entries that leave for an external system once their transaction commits.

    ``ExportQueue[K, V]`` for type checkers: keys of type ``K`` and values of
    type ``V``, the types of its codecs (``Any`` for a codec given by name).
    Create it with :meth:`percolite.App.export_queue`; see
    ``docs/export_queue.md``. Attributes: ``id``, ``buckets``,
    ``batch_size``, ``linger``, ``max_attempts``, ``transient_errors`` (a
    tuple), ``exporter``, ``key_codec``,
    ``value_codec`` (as declared), ``delivery``: ``"native"`` when the
    core applies batches to the built-in sink itself (an
    :class:`percolite.exporters.SQLite` exporter, fixed codecs), else
    ``"python: "`` and why the exporter is called with every batch
    (environment variable ``PERCOLITE_NATIVE_SINKS=0`` forces that), or
    ``"forwarded: ..."`` for an exporter with a ``forward_to()`` method: one
    that hands every batch unchanged to the exporter that method returns,
    to which the core then applies the batch natively when it can.
    """

    def __init__(
        self,
        app: App,
        queue_id: str,
        *,
        buckets: int,
        exporter: Callable[[list[SequencedExport]], Any],
        key_codec: str | Codec[K],
        value_codec: str | Codec[V],
        batch_size: int,
        linger: float = 0.0,
        max_attempts: int | None = _core.DEFAULT_MAX_ATTEMPTS,
        transient_errors: Any = None,
    ) -> None:
        check_queue_options("export queue", queue_id, buckets, "batch_size", batch_size)
        linger = check_linger("export queue", queue_id, linger)
        self.transient_errors: tuple[type[BaseException], ...] = check_transient_errors(
            transient_errors, f"export queue {queue_id!r}"
        )
        core_attempts = check_max_attempts(max_attempts, f"export queue {queue_id!r}")
        if not callable(exporter):
            raise TypeError(
                f"export queue {queue_id!r}: the exporter must be callable, "
                f"not {type(exporter).__name__}"
            )
        if not accepts(exporter, 1):
            raise TypeError(
                f"export queue {queue_id!r}: exporter {exporter!r} must accept (entries)"
            )
        self.app = app
        self.id = queue_id
        self.buckets = buckets
        self.batch_size = batch_size
        self.linger = linger
        self.max_attempts = max_attempts
        self.exporter = exporter
        self.key_codec: Codec[K] = get_codec(key_codec, "key_codec")
        self.value_codec: Codec[V] = get_codec(value_codec, "value_codec")
        kl, vl = native_layout(self.key_codec), native_layout(self.value_codec)
        native = kl is not None and vl is not None
        self.delivery: str
        self._native_sink, self.delivery = self._make_native_sink(kl, vl)
        self._core = _core.ExportQueue.create(
            queue_id,
            buckets,
            batch_size,
            self._runner(decoded=native),
            SequencedExport if native else None,
            kl if native else None,
            vl if native else None,
            self.linger,
            core_attempts,
            self._native_sink,
        )
        # A forwarding exporter's sink is named at each of its batches.
        name = getattr(exporter, "exclusive_sink", None)
        if name is not None and not isinstance(name, str):
            raise TypeError(
                f"export queue {queue_id!r}: the exporter's exclusive_sink must be a str "
                f"naming its sink, or None, not {type(name).__name__}"
            )
        self._name_sink(exporter)

    def _make_native_sink(self, kl: Any, vl: Any) -> tuple[Any, str]:
        """The core's native path to a built-in sink (it applies batches
        itself, without Python) and ``"native"``; for an exporter with a
        ``forward_to()``, the path chosen at each batch (``_Forwarded``) and
        ``"forwarded: ..."``; or None and why the exporter takes every
        batch: ``"python: ..."``."""
        forward_to = getattr(self.exporter, "forward_to", None)
        make = _native_maker(self.exporter)
        if make is None and not callable(forward_to):
            return None, (
                "python: the exporter has no native path (not a built-in SQLite or PostgreSQL sink)"
            )
        if kl is None or vl is None:
            names = (self.key_codec.name, self.value_codec.name)
            return None, f"python: codecs {names} are not all fixed (str, bytes, int64, ...)"
        if os.environ.get("PERCOLITE_NATIVE_SINKS", "1") == "0":
            return None, "python: PERCOLITE_NATIVE_SINKS=0"
        if make is None:
            choose = _Forwarded(forward_to, kl, vl, self._follow_sink)
            why = "forwarded: native when forward_to() returns a built-in SQLite or PostgreSQL sink"
            return _core.chosen_native_sink(choose), why
        sink, why = make(self.exporter, kl, vl)
        return sink, why if sink is not None else f"python: {why}"

    def _follow_sink(self, forward_to: Callable[[], Any]) -> None:
        """Names the sink of the exporter a forwarding exporter's
        ``forward_to()`` returns now, at a batch: best effort, since the
        batch goes on either way (a target that cannot be had is the
        forwarding exporter's to report, when it is called)."""
        try:
            self._name_sink(forward_to())
        except Exception:
            pass

    def _name_sink(self, exporter: Any) -> None:
        """Names to the core the sink ``exporter`` writes, when that sink
        takes one writer at a time (its ``exclusive_sink``: a built-in
        SQLite exporter's database): the runs of queues that name the same
        sink take turns in each worker pool, rather than hold threads that
        would wait for each other's writes."""
        name = getattr(exporter, "exclusive_sink", None)
        # Named every time (an atomic store): runs naming at once agree.
        self._core.name_sink(name if isinstance(name, str) else "")

    def delivered(self) -> dict[str, Any]:
        """How this queue delivers its batches: ``{"delivery"}`` as the
        attribute says it, and, in this process, the tries of batches the
        core made on a built-in sink itself (``native_batches``: applied,
        or failed as an outage and tried again later) and those the
        exporter took (``exporter_batches``: every batch on the Python
        path; with a native path, the first ones, which set the sink up)."""
        batches, _entries = self._core.counters()
        native = self._native_sink.counters()[0] if self._native_sink is not None else 0
        return {
            "delivery": self.delivery,
            "native_batches": native,
            # The sink's counters also count deliveries made on it directly.
            "exporter_batches": max(0, batches - native),
        }

    def _runner(self, decoded: bool) -> Callable:
        """The exporter's wrapper; ``decoded``: the core decodes the entries
        (built-in codecs), else they come as ``(key, value, seq)`` bytes."""
        kc, vc, exporter = self.key_codec, self.value_codec, self.exporter
        transient = self.transient_errors
        forward_to = getattr(exporter, "forward_to", None)
        forward_to = forward_to if callable(forward_to) else None

        queue_id = self.id

        def run(items: list[Any], store: str, epoch: int) -> tuple[Any, ...]:
            try:
                if decoded:
                    entries = ExportBatch(items)
                else:
                    entries = ExportBatch(
                        SequencedExport(
                            kc.decode(k), None if v[:1] == _DELETED else vc.decode(v[1:]), seq
                        )
                        for k, v, seq in items
                    )
                entries.queue, entries.store, entries.epoch = queue_id, store, epoch
                if forward_to is not None:
                    self._follow_sink(forward_to)
                exporter(entries)
                if _injected.exporter_fails is not None and _injected.exporter_fails():
                    raise InjectedFault("an exporter failure injected by the simulation")
                return (True, None)
            except BaseException as error:
                return (False, failure_text(), _sink_failure(error, transient))

        return run

    @property
    def core(self) -> _core.ExportQueue:
        """The compiled queue underneath (``percolite._core``), for
        percolite's own modules; its methods are internal and may change in
        any release."""
        return self._core

    @property
    def layout(self) -> dict[str, Any]:
        """What a store bound to the app records of this queue, what its
        stored rows mean: ``{"kind", "buckets", "key_codec", "value_codec"}``
        (a new dict at each call)."""
        return {
            "kind": "export queue",
            "buckets": self.buckets,
            "key_codec": self.key_codec.name,
            "value_codec": self.value_codec.name,
        }

    def add(self, tx: Transaction, key: K, value: V | None) -> None:
        """Queue ``(key, value)`` in ``tx``: the entry exists if and only if
        ``tx`` commits. ``value=None`` exports a deletion of ``key``. Key and
        value are encoded first: if either cannot be, nothing is queued and
        the error names it."""
        core_tx = adding_transaction(tx, "export queue", self)
        try:
            k = self.key_codec.encode(key)
            v = _DELETED if value is None else _PRESENT + self.value_codec.encode(value)
        except (TypeError, ValueError):
            # Encoded again to name what failed (no text is built for an add that works).
            encode_or_raise(self.key_codec, key, f"export queue {self.id!r}: key {key!r}")
            what = f"export queue {self.id!r}: value {value!r} for key {key!r}"
            encode_or_raise(self.value_codec, value, what)
            raise
        self._core.add(core_tx, k, v)

    def depth(self, tx: Transaction) -> int:
        """How many entries are queued in ``tx``'s view (a scan: for status and tests)."""
        return queue_depth(tx, self._core.entry_row_prefix)

    def bucket_of(self, key: K) -> int:
        """The bucket (in ``range(buckets)``) that queues ``key``'s entries:
        a hash of the encoded key modulo ``buckets``."""
        return self._core.bucket_of(self.key_codec.encode(key))

    def __repr__(self) -> str:
        return (
            f"<percolite.ExportQueue {self.id!r} buckets={self.buckets} "
            f"exporter={getattr(self.exporter, '__qualname__', self.exporter)!r}>"
        )

    def _repr_html_(self) -> str:
        """Jupyter's view of the queue: id, kind, buckets, codecs and the rest
        of its declaration."""
        return export_queue_html(self)
