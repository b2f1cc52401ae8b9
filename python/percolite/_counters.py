"""Sharded counters (after "Efficient Global Counters, revisited", 2009).

One counter cell that every transaction read-modify-writes makes every two
concurrent increments collide. A :class:`ShardedCounter` spreads the count over
``shards`` cells and each increment touches one of them, chosen at random, so
collisions fall with the shard count; the value is the sum over the shards.

Layout (``:`` is reserved in names, so one counter's rows never share a prefix
with another's): row ``counter:<name>:<shard as 4 lowercase hex digits>``,
family ``counter``, qualifier ``sum`` (exact mode) or ``max`` (cached mode),
value a signed 64-bit big-endian integer (the ``"int64"`` codec).
"""

from __future__ import annotations

import random
import re
import struct
import threading
import weakref

from ._cells import Column
from ._env import Env
from ._transaction import Transaction
from .errors import ClosedError

__all__ = ["ShardedCounter", "check_cell"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT64 = struct.Struct(">q")
_MAX_SHARDS = 1 << 16

_SUM = Column("counter", "sum")  # exact mode: each shard holds part of the sum
_MAX = Column("counter", "max")  # cached mode: each shard holds a total once persisted

# Cached mode: the blog post's memcache. One running total per (Env handle, counter
# name), shared by every thread and every ShardedCounter object using that
# handle; it goes away with the handle.
_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


class _CachedTotal:
    __slots__ = ("lock", "total")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total: int | None = None  # None until loaded from the shards


class ShardedCounter:
    """A counter whose increments rarely collide; see ``docs/sharded_counters.md``.

    ``ShardedCounter(name, shards=16)`` is **exact** (the default mode):

    * ``add(tx, amount=1)`` reads and rewrites one shard, chosen at random,
      inside ``tx``: the increment commits or aborts with ``tx``, and two
      concurrent increments collide only when they pick the same shard
      (probability ``1/shards`` for a pair). ``amount`` is any int64; 0 writes
      nothing. Each shard must stay within int64 (else ``ValueError``).
    * ``get(tx)`` is the exact sum over the shards in ``tx``'s view (every
      shard of this name present in the store, so changing ``shards`` between
      runs loses nothing).
    * ``increment(env, amount)`` runs ``add`` in its own transaction with
      :meth:`Env.run` (retrying conflicts); ``value(env)`` is ``get`` in a
      fresh snapshot.

    ``ShardedCounter(name, shards, chance_to_write=p)`` with ``0 < p <= 1`` is
    the blog post's **cached** mode, for counters that only grow and may lose a few
    counts (hit counters, statistics). It is not transactional:

    * The running total lives in memory, one per ``Env`` handle, shared by
      every thread using the handle (the blog post's memcache). It is loaded on
      first use as the **maximum** over the shards.
    * ``increment(env, amount)`` (``amount >= 1``) adds to that total under a
      lock and returns the new total; then, with probability ``p``, decided
      independently for each increment, it persists that total to one random
      shard in its own transaction, writing ``max(shard, total)``, so the
      shards only grow. ``add(tx)`` is refused: the count could not be undone
      if ``tx`` aborted.
    * Exact: ``value(env)``, the cached total, counts every increment made
      through this handle plus what was persisted when it was loaded.
    * Approximate: ``get(tx)`` (the persisted total: the maximum over the
      shards in ``tx``'s view) and therefore what the next handle or process
      loads. It never exceeds the true count and never decreases. Once no
      increment is in flight it lags the cached total by exactly the
      increments made after the last persisted one. Their number ``N`` is
      geometric: ``P(N >= k) = (1 - p)**k``, mean ``(1 - p) / p`` (9 for
      ``p = 0.1``); the lag is the sum of their amounts (``N`` when
      ``amount=1``).
    * Lost: that lag, when the handle is closed or the process ends or
      crashes before :meth:`flush`. ``flush(env)`` persists the cached total,
      after which nothing counted before it can be lost. ``p = 1`` persists
      every increment: nothing is lost, but every increment is a commit.
    * One handle per store per process: two handles (or two processes)
      incrementing one cached counter each count from the total they loaded,
      and the maximum keeps only the larger, losing the other's increments.
      Use the exact mode there.

    ``rng`` (a :class:`random.Random`) chooses the shards and the persisting
    increments; pass a seeded one for reproducible runs.
    """

    def __init__(
        self,
        name: str,
        shards: int = 16,
        *,
        chance_to_write: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"sharded counter name must be a str, not {type(name).__name__}")
        if not name:
            raise ValueError("sharded counter name must not be empty")
        if any(c == ":" or ord(c) < 0x20 or ord(c) == 0x7F for c in name):
            raise ValueError(
                f"sharded counter name {name!r} contains a character the layout reserves "
                "(':' or a control character)"
            )
        if isinstance(shards, bool) or not isinstance(shards, int):
            raise TypeError(f"sharded counter {name!r}: shards must be an int, not {_kind(shards)}")
        if not 1 <= shards <= _MAX_SHARDS:
            raise ValueError(
                f"sharded counter {name!r}: shards must be between 1 and {_MAX_SHARDS}, "
                f"not {shards}"
            )
        if chance_to_write is not None:
            if isinstance(chance_to_write, bool) or not isinstance(chance_to_write, (int, float)):
                raise TypeError(
                    f"sharded counter {name!r}: chance_to_write must be a float or None, "
                    f"not {_kind(chance_to_write)}"
                )
            if not 0 < chance_to_write <= 1:  # also refuses NaN
                raise ValueError(
                    f"sharded counter {name!r}: chance_to_write must be in (0, 1], "
                    f"not {chance_to_write!r}"
                )
            chance_to_write = float(chance_to_write)
        if rng is not None and not isinstance(rng, random.Random):
            raise TypeError(
                f"sharded counter {name!r}: rng must be a random.Random, not {_kind(rng)}"
            )
        self.name = name
        self.shards = shards
        self.chance_to_write = chance_to_write
        self._rng = rng if rng is not None else random.Random()
        self._prefix = f"counter:{name}:"

    @property
    def cached(self) -> bool:
        """``True`` in the cached mode (``chance_to_write`` given)."""
        return self.chance_to_write is not None

    # -- exact mode, inside the caller's transaction -----------------------------
    def add(self, tx: Transaction, amount: int = 1) -> None:
        """Add ``amount`` to one random shard in ``tx`` (exact mode only)."""
        self._check_transaction(tx, "add")
        self._check_amount(amount)
        if self.cached:
            raise ValueError(
                f"sharded counter {self.name!r} caches its total "
                f"(chance_to_write={self.chance_to_write}), which no transaction can undo: "
                "use increment(env); add(tx) is for exact counters"
            )
        if amount == 0:
            return
        row = self._row(self._rng.randrange(self.shards))
        new = self._decode(row, tx.get(row, _SUM)) + amount
        if not _INT64_MIN <= new <= _INT64_MAX:
            raise ValueError(
                f"sharded counter {self.name!r}: adding {amount} overflows shard row {row!r} "
                "(each shard holds a signed 64-bit integer)"
            )
        tx.set(row, _SUM, _INT64.pack(new))

    def get(self, tx: Transaction) -> int:
        """In ``tx``'s view: the exact sum over the shards (exact mode), or
        the persisted total, the maximum over the shards (cached mode)."""
        self._check_transaction(tx, "get")
        mine, other = (_MAX, _SUM) if self.cached else (_SUM, _MAX)
        values = []
        for row, column, value in tx.scan(prefix=self._prefix, columns=[_SUM, _MAX]):
            if column == other:
                kind, remedy = ("a cached", "with") if other is _MAX else ("an exact", "without")
                raise ValueError(
                    f"sharded counter {self.name!r}: row {row!r} holds a shard of {kind} "
                    f"counter; open it {remedy} chance_to_write"
                )
            values.append(self._decode(row, value))
        return max(values, default=0) if mine is _MAX else sum(values)

    # -- own transactions -----------------------------------------------------
    def increment(self, env: Env, amount: int = 1) -> int | None:
        """Count ``amount``. Exact mode: ``add`` in its own transaction,
        retried on conflicts; returns ``None``. Cached mode: add to the cached
        total and, with probability ``chance_to_write``, persist it; returns
        the new cached total (counted even if persisting it then raises)."""
        self._check_env(env, "increment")
        self._check_amount(amount)
        if not self.cached:
            env.run(lambda tx: self.add(tx, amount))
            return None
        if amount < 1:
            raise ValueError(
                f"sharded counter {self.name!r}: amount must be >= 1 in the cached mode "
                f"(its shards keep maxima, so it only grows), not {amount}"
            )
        cache = self._cached_total(env)
        with cache.lock:
            total = cache.total + amount
            if total > _INT64_MAX:
                raise ValueError(
                    f"sharded counter {self.name!r}: adding {amount} to {cache.total} "
                    "overflows the signed 64-bit total"
                )
            cache.total = total
        if self._rng.random() < self.chance_to_write:
            self._persist(env, total)
        return total

    def value(self, env: Env) -> int:
        """Exact mode: the sum over the shards in a fresh snapshot. Cached
        mode: this handle's cached total (exact for this handle)."""
        self._check_env(env, "value")
        if self.cached:
            return self._cached_total(env).total
        return self._stored(env)

    def flush(self, env: Env) -> None:
        """Cached mode: persist this handle's cached total now, so that
        closing the handle or ending the process loses nothing counted so
        far. Exact mode: nothing to do."""
        self._check_env(env, "flush")
        if self.cached:
            with _caches_lock:
                cache = _caches.get(env, {}).get(self.name)
            if cache is not None and cache.total is not None:
                self._persist(env, cache.total)

    # -- internals ------------------------------------------------------------
    def _row(self, shard: int) -> str:
        return f"{self._prefix}{shard:04x}"

    def _decode(self, row: object, data: bytes | None) -> int:
        if data is None:
            return 0
        if len(data) != _INT64.size:
            raise ValueError(
                f"sharded counter {self.name!r}: shard row {row!r} holds {len(data)} bytes, "
                "not a signed 64-bit integer"
            )
        return _INT64.unpack(data)[0]

    def _persist(self, env: Env, total: int) -> None:
        def write_max(tx: Transaction) -> None:
            row = self._row(self._rng.randrange(self.shards))
            if self._decode(row, tx.get(row, _MAX)) < total:
                tx.set(row, _MAX, _INT64.pack(total))

        env.run(write_max)

    def _cached_total(self, env: Env) -> _CachedTotal:
        with _caches_lock:
            per_env = _caches.get(env)
            if per_env is None:
                per_env = _caches[env] = {}
            cache = per_env.get(self.name)
            if cache is None:
                cache = per_env[self.name] = _CachedTotal()
        if cache.total is None:
            # Load outside the lock; the first loader to finish sets it (the
            # blog post's add-only-if-absent), later ones keep what is there.
            loaded = self._stored(env)
            with cache.lock:
                if cache.total is None:
                    cache.total = loaded
        return cache

    def _stored(self, env: Env) -> int:
        tx = env.transaction()
        try:
            return self.get(tx)
        finally:
            tx.abort()

    def _check_env(self, env: object, operation: str) -> None:
        if not isinstance(env, Env):
            hint = f"; inside a transaction use {'get' if operation == 'value' else 'add'}(tx)"
            raise TypeError(
                f"sharded counter {self.name!r}: {operation} needs a percolite.Env, "
                f"not {_kind(env)}" + (hint if isinstance(env, Transaction) else "")
            )
        if env.closed:
            raise ClosedError(f"sharded counter {self.name!r}: {operation} on a closed Env")

    def _check_transaction(self, tx: object, operation: str) -> None:
        if not isinstance(tx, Transaction):
            hint = f"; with an Env use {'value' if operation == 'get' else 'increment'}(env)"
            raise TypeError(
                f"sharded counter {self.name!r}: {operation} needs a percolite.Transaction, "
                f"not {_kind(tx)}" + (hint if isinstance(tx, Env) else "")
            )

    def _check_amount(self, amount: object) -> None:
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError(
                f"sharded counter {self.name!r}: amount must be an int, not {_kind(amount)}"
            )
        if not _INT64_MIN <= amount <= _INT64_MAX:
            raise ValueError(
                f"sharded counter {self.name!r}: amount {amount} does not fit in a signed "
                "64-bit integer"
            )

    def __repr__(self) -> str:
        mode = "" if not self.cached else f" chance_to_write={self.chance_to_write}"
        return f"<percolite.ShardedCounter {self.name!r} shards={self.shards}{mode}>"


def _kind(value: object) -> str:
    return type(value).__name__


_SHARD_ROW = re.compile(rb"^counter:[^:]+:[0-9a-f]{4}$")


def check_cell(row: bytes, column: Column, value: bytes) -> str | None:
    """For ``percolite check``: what is wrong with a cell of a counter's
    shard row (None when it is not one, or is fine)."""
    if not _SHARD_ROW.match(row) or column not in (_SUM, _MAX):
        return None
    if len(value) != _INT64.size:
        return f"counter shard {row!r} {column!r} holds {len(value)} bytes, not an int64"
    return None
