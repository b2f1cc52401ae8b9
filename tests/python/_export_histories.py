"""Random export histories, their batches and the state an exporter must end
in, and batches exported from several processes at once: what the tests of
every exporter (test_exporters.py, test_exporters_jsonlines.py) check
against. An exporter called with the batches, in any order and from any
number of threads and processes, must end at ``reference(entries)``."""

from __future__ import annotations

import json
import time

import children.exporters
import pytest
from _isolated import finish_child, start_child
from percolite._export import SequencedExport as E

__all__ = ["batches_of", "export_from_processes", "highest_seqs", "history", "reference"]


def history(rng, keys=20, commits=150):
    """Commits in seq order: each changes one key, deleting it one time in five.
    A value names its seq, so a stale value cannot pass for the right one."""
    seq, entries = 0, []
    for _ in range(commits):
        seq += rng.randint(1, 3)
        key = f"k{rng.randrange(keys):02}"
        entries.append(E(key, None if rng.random() < 0.2 else f"v{seq}", seq))
    return entries


def batches_of(rng, entries, count):
    """``count`` batches (ordered by key, then seq, like the queue's) covering
    every entry at least once, with redeliveries and supersets, shuffled."""
    shuffled = rng.sample(entries, len(entries))
    half = count // 2
    chunks = [shuffled[i::half] for i in range(half)]
    chunks += [rng.sample(entries, rng.randint(1, 12)) for _ in range(count - len(chunks))]
    chunks += [rng.choice(chunks) for _ in range(count // 4)]  # the same batch again
    rng.shuffle(chunks)
    return [sorted(chunk, key=lambda e: (e.key, e.seq)) for chunk in chunks]


def reference(entries):
    """Per key, the value of the entry with the highest seq; deleted keys absent."""
    newest = {}
    for entry in entries:
        if entry.key not in newest or entry.seq > newest[entry.key].seq:
            newest[entry.key] = entry
    return {key: e.value for key, e in newest.items() if e.value is not None}


def highest_seqs(entries):
    seqs = {}
    for entry in entries:
        seqs[entry.key] = max(entry.seq, seqs.get(entry.key, -1))
    return seqs


def export_from_processes(tmp_path, kind, location, table, shares):
    """Runs one child interpreter per share of batches, all at once."""
    go_file = tmp_path / "go"
    procs, ready = [], []
    for index, share in enumerate(shares):
        batches_file = tmp_path / f"batches{index}.json"
        batches_file.write_text(json.dumps(share))
        ready.append(tmp_path / f"ready{index}")
        procs.append(
            start_child(
                children.exporters.export_batches,
                kind,
                location,
                table,
                batches_file,
                ready[-1],
                go_file,
            )
        )
    deadline = time.monotonic() + 30
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in procs):
            break  # a child died early: finish_child reports it
        time.sleep(0.005)
    go_file.touch()
    failures = []
    for proc in procs:  # wait for every child, even when one failed
        try:
            finish_child(proc, timeout=60)
        except pytest.fail.Exception as failure:
            failures.append(str(failure))
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)
