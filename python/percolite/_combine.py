"""The combine queue: many transactions update hot keys without colliding.

Contract: ``cpp/include/percolite/combine_queue.h`` (from Fluo Recipes'
CombineQueue). In short:

* ``cq.add(tx, {key: update})`` queues updates; adders never collide with each
  other or with the processor;
* one transaction per bucket folds the queued updates into the current values
  with the combiner, and calls the change observer with every
  ``Change(key, old, new)`` of the batch, inside that transaction;
* guarantee 1: the new value reported for a key combines every update of that
  key committed before the processing transaction started;
* guarantee 2: the old value reported for a key is the new value of the
  previous report for that key (``None`` the first time);
* a combiner result of ``None`` deletes the key (the native ``"sum"`` deletes a
  key that sums to zero).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from . import _core
from ._args import check_max_attempts
from ._cells import Change
from ._export import ExportQueue
from ._frames import key_value_frame
from ._html import combine_queue_html
from ._log import failure_text
from ._observer import ObserverTransaction
from ._queue_rows import queue_depth
from ._queues import (
    accepts,
    adding_transaction,
    check_linger,
    check_queue_options,
    encode_or_raise,
    require_transaction,
)
from .codecs import Codec, get_codec, native_layout

if TYPE_CHECKING:
    import pandas

    from ._app import App
    from ._transaction import Transaction

__all__ = ["CombineQueue", "Change", "NATIVE_COMBINERS"]

NATIVE_COMBINERS: tuple[str, ...] = _core.NATIVE_COMBINERS
# Most buffer_size for export_to: half of the 2**SEQ_INDEX_BITS export entries
# a transaction may add.
_EXPORT_BUFFER_BITS = _core.SEQ_INDEX_BITS - 1
_EXPORT_BUFFER_LIMIT = 1 << _EXPORT_BUFFER_BITS


K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")


class CombineQueue(Generic[K, V]):
    """Queued updates of keys, folded into current values by the workers.

    ``CombineQueue[K, V]`` for type checkers: keys of type ``K``, values and
    updates of type ``V``, the types of its codecs (``Codec[K]`` and
    ``Codec[V]``; ``Any`` for a codec given by name).
    Create it with :meth:`percolite.App.combine_queue`; see
    ``docs/combine_queue.md``. Attributes: ``id``, ``buckets``,
    ``buffer_size``, ``linger``, ``combiner``, ``key_codec``, ``value_codec`` (as
    declared).
    """

    def __init__(
        self,
        app: App,
        queue_id: str,
        *,
        buckets: int,
        combiner: Any,
        key_codec: str | Codec[K],
        value_codec: str | Codec[V],
        buffer_size: int,
        linger: float = 0.0,
        max_attempts: int | None = _core.DEFAULT_MAX_ATTEMPTS,
        changing: Callable[[str], AbstractContextManager[object]] | None = None,
    ) -> None:
        """``changing(what)``: the app's context around every change of the
        queue's declaration (:meth:`on_change`, :meth:`export_to`), which may
        refuse it and records it once made."""
        check_queue_options("combine queue", queue_id, buckets, "buffer_size", buffer_size)
        linger = check_linger("combine queue", queue_id, linger)
        check_max_attempts(max_attempts, f"combine queue {queue_id!r}")
        if isinstance(combiner, str):
            if combiner not in NATIVE_COMBINERS:
                raise ValueError(
                    f"combiner must be one of {', '.join(map(repr, NATIVE_COMBINERS))} "
                    f"or a callable, not {combiner!r}"
                )
        elif not callable(combiner):
            raise TypeError(f"combiner must be a name or a callable, not {type(combiner).__name__}")
        elif not accepts(combiner, 2):
            raise TypeError(f"combiner {combiner!r} must accept (key, values)")
        self.app = app
        self.id = queue_id
        self.buckets = buckets
        self.buffer_size = buffer_size
        self.linger = linger
        self.max_attempts = max_attempts
        self.combiner = combiner
        self.key_codec: Codec[K] = get_codec(key_codec, "key_codec")
        self.value_codec: Codec[V] = get_codec(value_codec, "value_codec")
        self._changing = changing or (lambda what: nullcontext())
        self._on_change: Callable[[ObserverTransaction, list[Change[K, V]]], object] | None = None
        self._export_to: list[ExportQueue[K, V]] = []
        kl, vl = native_layout(self.key_codec), native_layout(self.value_codec)
        self._native_codecs = None if kl is None or vl is None else (kl, vl)
        self._core = None
        self._core = self._make_core()  # validates id and value type now

    # -- declaration ------------------------------------------------------
    def on_change(
        self, fn: Callable[[ObserverTransaction, list[Change[K, V]]], object]
    ) -> Callable[[ObserverTransaction, list[Change[K, V]]], object]:
        """Decorator registering ``fn(tx, changes)``, called once per processed
        batch, inside the processing transaction, with a list of
        :class:`Change`. It may add to an export queue or another combine
        queue (atomically with the new values); it must not write this queue."""
        if not callable(fn):
            raise TypeError(f"on_change needs a callable, not {type(fn).__name__}")
        if not accepts(fn, 2):
            raise TypeError(f"change observer {fn!r} must accept (tx, changes)")
        if self._on_change is not None:
            raise ValueError(f"combine queue {self.id!r} already has a change observer")
        with self._changing("a change"):
            self._on_change = fn
            self._core = self._make_core()
        return fn

    def export_to(self, queue: ExportQueue[K, V]) -> ExportQueue[K, V]:
        """Feed every change of this queue into the export queue ``queue``:
        each processed batch adds ``(key, new)`` to it for every changed key
        (``new`` is ``None`` for a deleted key), in C++, inside the processing
        transaction, before any :meth:`on_change` observer runs. The same as
        an ``on_change`` that calls ``queue.add(tx, c.key, c.new)``, without
        Python per change. Both queues must use the same key and value
        codecs. Returns ``queue``."""
        if not isinstance(queue, ExportQueue):
            raise TypeError(f"export_to needs a percolite.ExportQueue, not {type(queue).__name__}")
        if queue.app is not self.app:
            raise ValueError(
                f"export queue {queue.id!r} belongs to another App than combine queue {self.id!r}"
            )
        if any(q is queue for q in self._export_to):
            raise ValueError(f"combine queue {self.id!r} already exports to {queue.id!r}")
        for role, ours, theirs in (
            ("key", self.key_codec, queue.key_codec),
            ("value", self.value_codec, queue.value_codec),
        ):
            if type(ours) is not type(theirs) or ours.name != theirs.name:
                raise ValueError(
                    f"combine queue {self.id!r} cannot export to {queue.id!r}: {role} codecs "
                    f"differ ({ours.name!r} and {theirs.name!r})"
                )
        if self.buffer_size > _EXPORT_BUFFER_LIMIT:
            # A run forwards up to about buffer_size changes in one
            # transaction, and a transaction holds at most 2**SEQ_INDEX_BITS export entries.
            raise ValueError(
                f"combine queue {self.id!r}: buffer_size {self.buffer_size} is too large to "
                f"export from; at most {_EXPORT_BUFFER_LIMIT} (2**{_EXPORT_BUFFER_BITS})"
            )
        with self._changing(f"an export from combine queue {self.id!r}"):
            self._export_to.append(queue)
            self._core = self._make_core()
        return queue

    @property
    def change_observer(
        self,
    ) -> Callable[[ObserverTransaction, list[Change[K, V]]], object] | None:
        """The function :meth:`on_change` registered, or None."""
        return self._on_change

    @property
    def export_queues(self) -> tuple[ExportQueue[K, V], ...]:
        """The export queues this queue feeds (:meth:`export_to`), in the
        order they were given."""
        return tuple(self._export_to)

    def _make_core(self):
        kc, vc = self.key_codec, self.value_codec
        combiner = self.combiner
        if not isinstance(combiner, str):
            fn = combiner

            def combiner(key_bytes: bytes, values: list[Any]) -> tuple[Any, ...]:
                try:
                    result = fn(kc.decode(key_bytes), [vc.decode(v) for v in values])
                    return (True, None if result is None else vc.encode(result))
                except BaseException:
                    return (False, failure_text())

        on_change = None
        if self._on_change is not None:
            user_fn = self._on_change

            def on_change(core_tx, items: list[Any]) -> tuple[Any, ...]:
                try:
                    changes = [
                        Change(
                            kc.decode(k),
                            None if o is None else vc.decode(o),
                            None if n is None else vc.decode(n),
                        )
                        for k, o, n in items
                    ]
                    user_fn(ObserverTransaction(core_tx), changes)
                    return (True, None)
                except BaseException:
                    return (False, failure_text())

        return _core.CombineQueue.create(
            self.id,
            self.buckets,
            self.buffer_size,
            combiner,
            vc.native,
            vc.length,
            on_change,
            [queue.core for queue in self._export_to],
            self.linger,
            check_max_attempts(self.max_attempts, f"combine queue {self.id!r}"),
        )

    @property
    def core(self) -> _core.CombineQueue:
        """The compiled queue underneath (``percolite._core``), for
        percolite's own modules; its methods are internal and may change in
        any release."""
        return self._core

    @property
    def layout(self) -> dict[str, Any]:
        """What a store bound to the app records of this queue, what its
        stored rows mean: ``{"kind", "buckets", "combiner", "key_codec",
        "value_codec"}`` (a new dict at each call)."""
        return {
            "kind": "combine queue",
            "buckets": self.buckets,
            "combiner": self.combiner if isinstance(self.combiner, str) else "a Python callable",
            "key_codec": self.key_codec.name,
            "value_codec": self.value_codec.name,
        }

    # -- use ----------------------------------------------------------------
    def add(self, tx: Transaction, updates: Mapping[K, V] | Iterable[tuple[K, V]]) -> None:
        """Queue ``{key: update}`` (or ``(key, update)`` pairs) in ``tx``.
        Every key and update is encoded first: if one cannot be, nothing is
        queued and the error names it."""
        native = self._native_codecs
        core_tx = adding_transaction(tx, "combine queue", self)
        if native is not None and self._core.add_native(core_tx, updates, *native):
            return  # encoded in C++: a dict or list of pairs of the codecs' exact types
        what = f"combine queue {self.id!r}"
        items = updates.items() if isinstance(updates, Mapping) else updates
        encoded = []
        kc, vc = self.key_codec, self.value_codec
        try:
            pairs = [_pair(item, what) for item in items]
        except TypeError as e:
            if "not iterable" not in str(e):
                raise
            raise TypeError(
                f"{what}: add needs a mapping {{key: update}} or (key, update) pairs, "
                f"not {type(updates).__name__}"
            ) from None
        for key, value in pairs:
            k = encode_or_raise(kc, key, f"combine queue {self.id!r}: key {key!r}")
            v = encode_or_raise(
                vc, value, f"combine queue {self.id!r}: value {value!r} for key {key!r}"
            )
            encoded.append((k, v))
        self._core.add(core_tx, encoded)

    @overload
    def get(self, tx: Transaction, key: K) -> V | None: ...
    @overload
    def get(self, tx: Transaction, key: K, default: V) -> V: ...
    @overload
    def get(self, tx: Transaction, key: K, default: D) -> V | D: ...
    def get(self, tx: Transaction, key: K, default: Any = None) -> Any:
        """The current value of ``key`` in ``tx``'s view, or ``default``."""
        what = f"combine queue {self.id!r}"
        core_tx = require_transaction(tx, f"{what}: get")
        data = self._core.get(core_tx, encode_or_raise(self.key_codec, key, f"{what}: key {key!r}"))
        return default if data is None else self.value_codec.decode(data)

    def scan(self, tx: Transaction, prefix: K | None = None) -> Iterator[tuple[K, V]]:
        """``(key, value)`` pairs of current values, in key order (of the
        encoded keys); ``prefix`` keeps the keys whose encoding starts with
        the encoding of ``prefix``."""
        kc, vc = self.key_codec, self.value_codec
        wanted = b"" if prefix is None else kc.encode(prefix)
        column = [(b"cq", b"v")]

        def bucket(number: int) -> Iterator[tuple[bytes, bytes]]:
            # Values sit by bucket (combine_queue.h): each bucket in key order.
            row_prefix = self._core.data_row_prefix(number)
            skip = len(row_prefix)
            for row, _column, value in tx.scan(prefix=row_prefix + wanted, columns=column):
                yield row[skip:], value

        merged = heapq.merge(*(bucket(n) for n in range(self.buckets)), key=itemgetter(0))
        for key, value in merged:
            yield kc.decode(key), vc.decode(value)

    def to_pandas(self, tx: Transaction, prefix: K | None = None) -> pandas.DataFrame:
        """The current values in ``tx``'s view as a DataFrame with columns
        ``key`` and ``value``, one row per key in the order of :meth:`scan`
        (``prefix`` as there), decoded by the queue's codecs: ``int64`` and
        ``float64`` values make columns of those dtypes, ``str`` pandas'
        string column, the others (``bytes``, ``int64s:N`` tuples, ``json``,
        ``pickle``, custom codecs) object columns of the decoded values.
        Needs pandas (``pip install 'percolite[pandas]'``): without it,
        ImportError before anything is read."""
        return key_value_frame(self.scan(tx, prefix), self.key_codec, self.value_codec)

    def depth(self, tx: Transaction) -> int:
        """How many updates are queued (not yet folded) in ``tx``'s view (a scan)."""
        return queue_depth(tx, self._core.entry_row_prefix)

    def bucket_of(self, key: K) -> int:
        """The bucket (in ``range(buckets)``) that queues ``key``'s updates:
        a hash of the encoded key modulo ``buckets``."""
        return self._core.bucket_of(self.key_codec.encode(key))

    def __repr__(self) -> str:
        combiner = self.combiner if isinstance(self.combiner, str) else "python"
        return f"<percolite.CombineQueue {self.id!r} buckets={self.buckets} combiner={combiner!r}>"

    def _repr_html_(self) -> str:
        """Jupyter's view of the queue: id, kind, buckets, codecs and the rest
        of its declaration."""
        return combine_queue_html(self)


def _pair(item: Any, what: str) -> tuple[Any, ...]:
    """A (key, update) pair of the updates given to add; TypeError naming
    the queue for anything else."""
    if isinstance(item, (str, bytes)) or not isinstance(item, (tuple, list)) or len(item) != 2:
        raise TypeError(f"{what}: add needs (key, update) pairs, not {item!r}")
    return item[0], item[1]
