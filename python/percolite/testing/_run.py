"""run_until_idle: an app's pending work run in the calling thread."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._args import check_int
from .._env import Env
from .._log import capture_failures, shown
from ..errors import Error

BACKENDS: tuple[str, ...] = ("memory", "lmdb")
"""The backends the fixtures and :func:`simulate` open stores on."""

COUNT_LIMIT = 2**63 - 1  # the most runs or steps a count argument may ask for


class StuckError(Error):
    """:func:`run_until_idle` ran ``max_runs`` runs and work was still
    pending (an observer that keeps notifying itself, say). The message names
    the cells whose notifications were left."""


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What :func:`run_until_idle` ran: ``runs`` (observer, fold and export
    runs begun), ``commits`` (runs that committed), ``conflicts`` (runs that
    lost a write-write conflict and ran again), ``failures`` (runs that
    raised), ``parked`` (work parked after its last attempt) and
    ``deferrals`` (runs that put themselves off)."""

    runs: int
    commits: int
    conflicts: int
    failures: int
    parked: int
    deferrals: int


def run_until_idle(env: Env, *, max_runs: int = 100_000, raise_errors: bool = True) -> RunSummary:
    """Run the pending work of ``env``'s app in this thread until none is left.

    Each pass reads every pending notification and runs those the app
    observes one at a time, in the order the store keeps them (so the same
    store and app give the same runs), until a pass finds nothing to run.
    Combine and export queues process what they hold at once (their
    ``linger`` is not waited for); retries and deferred runs come in the
    next pass instead of after a delay.

    With ``raise_errors`` (the default) the first observer, combiner,
    change observer or exporter that raises stops the run, and its exception
    is raised here (the failure is recorded in the store as workers record
    it). With ``raise_errors=False`` a failing run is retried in later passes
    and parked after its ``max_attempts``, as workers do, and the summary
    counts the failures.

    Raises :class:`StuckError` when ``max_runs`` runs did not make the store
    idle; ``percolite.Error`` when workers run on ``env`` (stop them, or use
    :meth:`Env.wait`) or when called from inside an observer. Work of columns
    the app does not observe is left pending, as workers leave it.
    """
    if not isinstance(env, Env):
        raise TypeError(f"run_until_idle needs a percolite.Env, not {type(env).__name__}")
    check_int("max_runs", max_runs, 1, COUNT_LIMIT)
    if not isinstance(raise_errors, bool):
        raise TypeError(f"raise_errors must be True or False, not {raise_errors!r}")
    with capture_failures() as captured:
        result: dict[str, Any] = env.core.run_here(max_runs, raise_errors)
        raised = captured.exception
    if result["failed"]:
        if raised is not None:
            raise raised
        raise Error(result["error"])
    if result["stuck"]:
        left = "; ".join(
            f"row {shown(row)} column '{family.decode(errors='replace')}:"
            f"{qualifier.decode(errors='replace')}' ({observer})"
            for row, family, qualifier, observer in result["left"]
        )
        more = result["left_total"] - len(result["left"])
        raise StuckError(
            f"not idle after {max_runs:,} runs (max_runs): {result['left_total']:,} "
            f"notifications still pending: {left}{f' (and {more:,} more)' if more else ''}. "
            "Raise max_runs if the work is only large; if it never ends, look for an observer "
            "that writes a column it observes (it notifies itself again every run)"
        )
    return RunSummary(
        **{field.name: result[field.name] for field in dataclasses.fields(RunSummary)}
    )
