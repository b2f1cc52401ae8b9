"""What an observer sees: how it is notified, and the transaction it runs in.

Shared by :class:`percolite.App`'s observers and by the queues' processors
(which the workers run as weak observers), below both.
"""

from __future__ import annotations

import enum
from typing import NoReturn

from . import _core
from ._transaction import Transaction
from .errors import Error

__all__ = [
    "NotificationType",
    "STRONG",
    "WEAK",
    "ObserverTransaction",
]


class NotificationType(enum.IntEnum):
    """How an observer is triggered.

    ``STRONG``: setting (not deleting) the observed column in a committed
    transaction notifies it; at most one run commits per notification, and sets
    before a run collapse into one run.

    ``WEAK``: ``tx.set_weak_notification(row, column)`` notifies it; never
    collides with anything; delivered at least once (runs may repeat).
    """

    STRONG = _core.NOTIFY_STRONG
    WEAK = _core.NOTIFY_WEAK


STRONG = NotificationType.STRONG
WEAK = NotificationType.WEAK


class ObserverTransaction(Transaction):
    """The transaction an observer (or a change observer) runs in. You never
    create one: percolite passes it to the callback. percolite commits it when
    the observer returns (together with the notification's acknowledgement)
    and aborts it when the observer raises, so the observer must not commit or
    abort it itself, nor use it in ``with``. Reads and writes are those of
    :class:`Transaction`."""

    __slots__ = ()

    def commit(self) -> None:
        """Refused: raises :class:`~percolite.Error` (percolite commits the
        observer's transaction when the observer returns)."""
        raise Error("an observer's transaction is committed by percolite when the observer returns")

    def abort(self) -> None:
        """Refused: raises :class:`~percolite.Error` (raise an exception from
        the observer instead: its transaction is aborted and retried)."""
        raise Error("an observer's transaction is aborted by percolite when the observer raises")

    def __enter__(self) -> NoReturn:
        raise Error("an observer's transaction is managed by percolite; do not use it in 'with'")
