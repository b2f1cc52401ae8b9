"""What the combine queue and the export queue share: the checks of a
declaration, encoding with the queue named in errors, and how a queue's
processor is registered with the workers."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import _core
from ._args import check_int
from ._observer import WEAK
from ._transaction import Transaction
from .codecs import Codec

__all__ = [
    "MAX_BUCKETS",
    "MAX_LINGER",
    "accepts",
    "check_linger",
    "check_queue_options",
    "core_spec",
    "adding_transaction",
    "encode_or_raise",
    "require_transaction",
]

# The most buckets a queue may have (bucket rows are named by 6 decimal digits).
MAX_BUCKETS: int = _core.MAX_BUCKETS
# The longest linger (seconds) a queue may declare.
MAX_LINGER: float = _core.MAX_LINGER_SECONDS


def accepts(fn: Callable[..., Any], n: int) -> bool:
    """Whether ``fn`` can be called with ``n`` positional arguments (True
    when its signature cannot be read)."""
    try:
        inspect.signature(fn).bind(*([None] * n))
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def check_queue_options(
    kind: str, queue_id: Any, buckets: Any, batch_name: str, batch: Any
) -> None:
    """The checks every queue declaration makes, before anything reaches the core."""
    if not isinstance(queue_id, str):
        raise TypeError(f"{kind} id must be a str, not {type(queue_id).__name__}")
    for name, value in (("buckets", buckets), (batch_name, batch)):
        check_int(name, value)
    if not queue_id:
        raise ValueError(f"{kind} id must not be empty")
    if any(c == ":" or ord(c) < 0x20 or ord(c) == 0x7F for c in queue_id):
        raise ValueError(
            f"{kind} id {queue_id!r} contains a character the layout reserves "
            "(':' or a control character)"
        )
    if not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"buckets must be between 1 and {MAX_BUCKETS}, not {buckets}")
    if not 1 <= batch <= 1 << 30:
        raise ValueError(f"{batch_name} must be between 1 and 2**30, not {batch}")


def check_linger(kind: str, queue_id: str, linger: Any) -> float:
    """``linger`` as a float, or a TypeError / ValueError naming the queue."""
    if isinstance(linger, bool) or not isinstance(linger, (int, float)):
        raise TypeError(
            f"{kind} {queue_id!r}: linger must be a number of seconds, not {type(linger).__name__}"
        )
    if not 0 <= linger <= MAX_LINGER:
        raise ValueError(
            f"{kind} {queue_id!r}: linger must be between 0 and {MAX_LINGER:g} "
            f"seconds, not {linger!r}"
        )
    return float(linger)


def require_transaction(tx: Any, what: str, queue: Any = None) -> Any:
    """``tx``'s core transaction; TypeError naming ``what`` when ``tx`` is
    not a :class:`percolite.Transaction`. With ``queue``, ValueError when the
    app bound to ``tx``'s store has no such queue (its entries would never be
    processed there)."""
    if not isinstance(tx, Transaction):
        raise TypeError(
            f"{what} needs a percolite.Transaction (from env.transaction(), env.run, "
            f"a loader or an observer) as its first argument, not {type(tx).__name__}"
        )
    app = tx.app
    if queue is not None and app is not None:
        bound = app.queues.get(queue.id)
        if bound is not queue and (bound is None or bound.layout != queue.layout):
            has = "has no queue" if bound is None else "declares another queue"
            raise ValueError(
                f"{what}: the store is bound to app {app.name!r}, which {has} named "
                f"{queue.id!r}: what you add would never be processed there. Declare the queue "
                "on that app, or bind the app that declares it"
            )
    return tx.core


def adding_transaction(tx: Any, kind: str, queue: Any) -> Any:
    """:func:`require_transaction` for ``queue.add`` (``kind``: "combine
    queue", "export queue"), building no error text in the common case: a
    queue of the app bound to the store, or of none."""
    if isinstance(tx, Transaction) and (
        (app := tx.app) is None or app.queues.get(queue.id) is queue
    ):
        return tx.core
    return require_transaction(tx, f"{kind} {queue.id!r}: add", queue)


def encode_or_raise(codec: Codec[Any], obj: Any, what: str) -> bytes:
    """``codec.encode(obj)``, re-raising a failure with ``what`` in front."""
    try:
        return codec.encode(obj)
    except (TypeError, ValueError) as e:
        kind = TypeError if isinstance(e, TypeError) else ValueError
        raise kind(f"{what}: {e}") from None


def core_spec(core: Any) -> tuple[Any, ...]:
    """The observer spec of a queue's core object: its processor, run as the
    weak observer of the queue's notify column."""
    family, qualifier, name = core.notify_column
    return (family, qualifier, int(WEAK), name, core)
