"""Loading from one thread with hundreds of commits in flight: :class:`Loader`.

``env.run`` waits for each commit, so one thread loads one transaction per
sync. A loader runs each submitted function in a fresh transaction on its own
thread and hands the commit to the store without waiting for it: the store's
group commit then makes hundreds of them durable with one sync, and each
submission's :class:`concurrent.futures.Future` resolves once its
transaction is durable.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from . import _core
from ._args import check_int, check_retry_options
from .errors import ClosedError, CommitConflict, Error

if TYPE_CHECKING:
    from ._env import Env
    from ._transaction import Transaction

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["Loader"]

# Finished jobs whose slots the loop gives back together: few enough that a
# blocked submit() resumes while the rest of a large batch of events is
# handled.
_RELEASE_EVERY = 64


class _Job:
    __slots__ = ("fn", "args", "kwargs", "future", "attempts", "result")

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], future: Future
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.future = future
        self.attempts = 0
        self.result: Any = None


class Loader:
    """Runs submitted functions in transactions with many commits in flight.
    Create it with :meth:`percolite.Env.loader`, as a context manager.

    ``submit(fn, *args, **kwargs)`` returns a :class:`~concurrent.futures.Future`
    at once; the loader's thread runs ``fn(tx, *args, **kwargs)`` in a fresh
    transaction and submits its commit without waiting for the sync. The
    future resolves to ``fn``'s return value once the transaction is durable
    (as the store's ``sync`` makes commits durable), or to the exception
    ``fn`` or its commit raised. A commit that conflicts runs ``fn`` again,
    in a fresh transaction, after a random back-off (as :meth:`Env.run`
    does), up to ``max_retries`` times. ``fn`` may run more than once: keep
    side effects outside percolite out of it.

    Submission order is not commit order: transactions in flight together
    commit in any order. Blind combine-queue and export-queue adds never
    conflict, so they are what a loader does best.

    ``submit`` blocks while ``max_in_flight`` submissions are unfinished
    (back-pressure: memory stays bounded however much is submitted).
    :meth:`flush` waits for all of them; leaving the ``with`` block flushes,
    stops the loader, and raises the first failure (every failure is also on
    its own future). From asyncio, ``await loader.asubmit(fn, ...)``.
    """

    def __init__(
        self,
        env: Env,
        max_in_flight: int = 256,
        *,
        max_retries: int | None = 1000,
        backoff: float = 0.001,
        max_backoff: float = 0.1,
    ) -> None:
        check_int("max_in_flight", max_in_flight, 1)
        check_retry_options("max_retries", max_retries, backoff, max_backoff)
        self._env = env
        self._max_in_flight = max_in_flight
        self._max_retries = max_retries
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._core = _core.Loader(max_in_flight)
        self._jobs: dict[int, _Job] = {}
        self._tokens = itertools.count(1)
        self._retries: list[tuple[float, int]] = []  # (when, token), a heap
        self._finished = 0  # jobs finished whose slots the loop has not released yet
        self._first_failure: BaseException | None = None
        self._done = threading.Condition()
        self._closing = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="percolite-loader", daemon=True)
        self._thread.start()

    # -- submitting -------------------------------------------------------
    @property
    def max_in_flight(self) -> int:
        """How many submissions may be unfinished at once."""
        return self._max_in_flight

    @property
    def in_flight(self) -> int:
        """Submissions not finished yet (run, committing, or waiting to)."""
        return self._core.in_flight

    @property
    def closed(self) -> bool:
        """Whether the loader was closed (no more submissions)."""
        return self._closing

    def submit(
        self, fn: Callable[Concatenate[Transaction, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Future[R]:
        """Run ``fn(tx, *args, **kwargs)`` in a fresh transaction on the
        loader's thread and commit it; return a future of ``fn``'s result,
        resolved once the transaction is durable. Blocks while
        ``max_in_flight`` submissions are unfinished."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        if self._closing or self._env.closed:
            self._check_open()
        core = self._core
        if not core.try_acquire():
            while not core.acquire(0.1):
                self._check_open()
        future: Future = Future()
        token = next(self._tokens)
        self._jobs[token] = _Job(fn, args, kwargs, future)
        core.post(token)
        return future

    async def asubmit(
        self, fn: Callable[Concatenate[Transaction, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """``submit`` for asyncio: waits for a free slot without blocking the
        event loop, then awaits the transaction's durable result."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        self._check_open()
        if not self._core.try_acquire():
            loop = asyncio.get_running_loop()
            while not await loop.run_in_executor(None, self._core.acquire, 0.1):
                self._check_open()
        return await asyncio.wrap_future(self._post(fn, args, kwargs))

    def _check_open(self) -> None:
        if self._closing:
            raise Error("the loader is closed: submit to a new env.loader()")
        if self._env.closed:
            raise ClosedError(f"store {self._env.path!r} is closed")

    def _post(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Future[Any]:
        future: Future = Future()
        token = next(self._tokens)
        self._jobs[token] = _Job(fn, args, kwargs, future)
        self._core.post(token)
        return future

    # -- waiting and closing ---------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submission so far has finished (durable or
        failed); ``False`` if ``timeout`` seconds passed first."""
        if threading.current_thread() is self._thread:
            raise Error("flush() cannot be called from inside a submitted function")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._done:
            while (self._jobs or self._finished) and self._thread.is_alive():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._done.wait(0.1 if left is None else min(left, 0.1))
        return True

    def close(self) -> None:
        """Flush, then stop the loader's thread; later submissions raise.
        Idempotent."""
        if self._closed:
            return
        self.flush()
        self._closing = True
        self._core.close()
        self._thread.join()
        self._closed = True

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()
        if exc_type is None and self._first_failure is not None:
            raise self._first_failure

    def __repr__(self) -> str:
        state = "closed" if self._closing else f"{self.in_flight} in flight"
        return f"<percolite.Loader max_in_flight={self._max_in_flight} {state}>"

    # -- the loader's thread ---------------------------------------------
    def _loop(self) -> None:
        core, jobs = self._core, self._jobs
        while True:
            wait = 0.05
            if self._retries:
                wait = max(0.0, min(wait, self._retries[0][0] - time.monotonic()))
            for token, is_commit, error, _commit_ts in core.next(wait, 4096):
                job = jobs.get(token)
                if job is None:
                    continue
                if not is_commit:
                    if job.future.set_running_or_notify_cancel():
                        self._run(token, job)
                    else:
                        self._finish(token)
                elif error is None:
                    job.future.set_result(job.result)
                    self._finish(token)
                else:
                    self._failed_commit(token, job, error)
                if self._finished >= _RELEASE_EVERY:
                    self._release()
            now = time.monotonic()
            while self._retries and self._retries[0][0] <= now:
                token = heapq.heappop(self._retries)[1]
                self._run(token, jobs[token])
            self._release()
            if self._closing and not jobs:
                return

    def _run(self, token: int, job: _Job) -> None:
        try:
            tx = self._env.transaction()
        except BaseException as e:  # noqa: BLE001 - the job's failure, on its future
            self._fail(token, job, e)
            return
        try:
            job.result = job.fn(tx, *job.args, **job.kwargs)
            if tx.state in ("active", "closed"):
                self._core.commit(tx.core, token)  # its result comes back through core.next
            else:  # fn committed or aborted the transaction itself
                job.future.set_result(job.result)
                self._finish(token)
        except BaseException as e:  # noqa: BLE001 - the job's failure, on its future
            tx.abort()
            self._fail(token, job, e)

    def _failed_commit(self, token: int, job: _Job, error: BaseException) -> None:
        retries = self._max_retries
        if isinstance(error, CommitConflict) and (retries is None or job.attempts < retries):
            job.attempts += 1
            delay = random.uniform(
                0, min(self._max_backoff, self._backoff * 2 ** min(job.attempts, 30))
            )
            heapq.heappush(self._retries, (time.monotonic() + delay, token))
            return
        self._fail(token, job, error)

    def _fail(self, token: int, job: _Job, error: BaseException) -> None:
        if self._first_failure is None:
            self._first_failure = error
        job.future.set_exception(error)
        self._finish(token)

    def _finish(self, token: int) -> None:
        # Counted first: flush() must not see it gone from _jobs with its
        # slot still taken.
        self._finished += 1
        del self._jobs[token]

    def _release(self) -> None:
        """Give back the slots of the jobs finished since the last call, in
        one call (one wake-up of a blocked ``submit``), and wake ``flush``
        once none is left."""
        if not self._finished:
            return
        self._core.release(self._finished)
        self._finished = 0
        if not self._jobs:
            with self._done:
                self._done.notify_all()
