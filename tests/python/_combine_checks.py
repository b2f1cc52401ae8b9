"""The checks of a combine queue's two guarantees over the changes its
observers report, shared by the tests of combine queues.

How the guarantees are observed. Every change observer in these tests records
each reported ``Change`` as a cell written *inside the processing transaction*
(row ``log:<tag>:<json key>``, qualifier = the processing transaction's
``start_ts``, value = ``[old, new]``). So exactly the reports of committed
processing runs are kept (a run that conflicts or fails leaves no record), and
the reports of one key sort by the start of the run that made them. Committed
runs of one bucket never overlap (each writes the bucket's cursor cell, so of
two overlapping runs at most one commits), hence sorting by ``start_ts`` is
sorting by commit order. Adders record the ``commit_ts`` of each transaction
with its updates. A snapshot that starts at ``start_ts`` S sees exactly the
transactions with ``commit_ts <= S`` (backend.h: start_ts is the timestamp
counter of the snapshot).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict

__all__ = [
    "assert_both_guarantees",
    "chain_violations",
    "guarantee_1_violations",
    "reference_sums",
]


def guarantee_1_violations(adds, reports, zero_deletes=True):
    """Reports whose new value is not the combination (here: the sum) of every
    update of that key committed before the processing transaction started.

    ``adds`` is ``[[commit_ts, key, delta], ...]`` from the adders,
    ``reports`` is ``{key: [[start_ts, old, new], ...]}``. A run that started
    at S sees the transactions with ``commit_ts <= S``, so the reported new
    value must be exactly the sum of the deltas with ``commit_ts <= S`` (and
    ``None`` when that sum is 0: the native sum deletes zero). Missing an
    update committed before S (a key's updates split across runs, an update
    skipped behind a cursor, a lost update) or counting one twice shows up as
    a difference. Keys are only checked when reported: the guarantee is about
    reported values."""
    by_key = defaultdict(list)
    for commit_ts, key, delta in adds:
        by_key[key].append((commit_ts, delta))
    violations = []
    for key, key_reports in reports.items():
        entries = sorted(by_key.get(key, []))
        stamps = [ts for ts, _ in entries]
        sums = list(itertools.accumulate(d for _, d in entries))
        for start_ts, _old, new in key_reports:
            n = bisect.bisect_right(stamps, start_ts)
            expected = sums[n - 1] if n else 0
            if zero_deletes and expected == 0:
                expected = None
            if new != expected:
                violations.append(
                    f"{key}: run at start_ts {start_ts} reported new={new!r}, but the "
                    f"{n} updates committed before it sum to {expected!r}"
                )
    return violations


def chain_violations(reports, final):
    """Guarantee 2: per key, in run order, each reported ``old`` is the ``new``
    of the previous report (``None`` before the first report), each report is
    a change (old != new), and the last ``new`` is the key's final value
    (``None`` when absent). A key with a final value but no report is a change
    that was never reported."""
    violations = []
    for key in sorted(set(reports) | set(final)):
        previous = None
        for start_ts, old, new in reports.get(key, []):
            if old != previous:
                violations.append(
                    f"{key}: run at {start_ts} reported old={old!r}, previous new={previous!r}"
                )
            if old == new:
                violations.append(f"{key}: run at {start_ts} reported a non-change {old!r}")
            previous = new
        if previous != final.get(key):
            violations.append(
                f"{key}: last reported new={previous!r} but final value={final.get(key)!r}"
            )
    return violations


def assert_both_guarantees(r):
    """Guarantee 1 and the old/new chain (guarantee 2) over a run's reports."""
    assert guarantee_1_violations(r["adds"], r["reports"]) == []
    assert chain_violations(r["reports"], r["final"]) == []


def reference_sums(adds):
    totals = Counter()
    for _, key, delta in adds:
        totals[key] += delta
    return {key: total for key, total in totals.items() if total != 0}
