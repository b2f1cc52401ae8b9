"""The JSON Lines exporter (percolite.exporters.JSONLines): it appends the
newest entry of each key it has not seen, loads back the state, and ends at
the reference state whatever the delivery (threads, processes, redelivered
or older batches, a torn line). The exporter is called directly here with
lists of SequencedExport."""

from __future__ import annotations

import json
import random
import threading

import percolite.exporters
import pytest
from _export_histories import batches_of, export_from_processes, history, reference
from percolite._export import SequencedExport as E
from percolite.errors import ClosedError

# --- JSON Lines --------------------------------------------------------------


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonlines_appends_entries_and_loads_the_state(tmp_path):
    path = tmp_path / "out.jsonl"
    exporter = percolite.exporters.JSONLines(path)
    assert exporter.rows() == {}
    exporter([E("a", {"n": 1}, 1), E(("b", 2), [1, 2], 2)])
    exporter([E("a", None, 3), E("c", "x", 4)])
    assert lines(path) == [
        {"key": "a", "value": {"n": 1}, "seq": 1},
        {"key": ["b", 2], "value": [1, 2], "seq": 2},
        {"key": "a", "value": None, "seq": 3},
        {"key": "c", "value": "x", "seq": 4},
    ]
    state = percolite.exporters.JSONLines.load(path)
    assert state == {("b", 2): [1, 2], "c": "x"}, "tuple keys come back as tuples"
    assert exporter.rows() == state
    assert repr(exporter) == f"<percolite.exporters.JSONLines {str(path)!r}>"


def test_jsonlines_skips_redelivered_older_and_collapsed_entries(tmp_path):
    path = tmp_path / "out.jsonl"
    exporter = percolite.exporters.JSONLines(path)
    batch = [E("a", 1, 1), E("a", 2, 2), E("b", 1, 3)]
    exporter(batch)
    assert [line["seq"] for line in lines(path)] == [2, 3], "one line per key: the newest"
    exporter(batch)
    exporter([E("b", None, 9)])
    exporter([E("b", "old", 4), E("a", 2, 2)])  # older than what the file holds
    assert [line["seq"] for line in lines(path)] == [2, 3, 9]
    assert percolite.exporters.JSONLines.load(path) == {"a": 2}


def test_jsonlines_objects_see_what_others_appended(tmp_path):
    path = tmp_path / "out.jsonl"
    first, second = percolite.exporters.JSONLines(path), percolite.exporters.JSONLines(path)
    first([E("a", "new", 5)])
    second([E("a", "old", 4)])  # second has never read the file: it must look first
    assert percolite.exporters.JSONLines.load(path) == {"a": "new"}
    assert len(lines(path)) == 1


def test_jsonlines_ignores_a_torn_line_from_a_crashed_call(tmp_path):
    path = tmp_path / "out.jsonl"
    exporter = percolite.exporters.JSONLines(path)
    exporter([E("a", 1, 1)])
    with open(path, "ab") as file:
        file.write(b'{"key": "a", "value": 99, "se')  # a call that died mid-write
    exporter([E("b", 2, 2)])
    assert percolite.exporters.JSONLines.load(path) == {"a": 1, "b": 2}
    assert path.read_text().splitlines()[-1] == '{"key": "b", "value": 2, "seq": 2}'


def test_jsonlines_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        percolite.exporters.JSONLines(tmp_path / "nowhere" / "out.jsonl")
    exporter = percolite.exporters.JSONLines(tmp_path / "out.jsonl")
    with pytest.raises(ValueError, match="entry of key 'a' is not JSON"):
        exporter([E("a", b"bytes", 1)])
    with pytest.raises(ValueError, match="seq must be an int"):
        exporter([E("a", 1, "1")])
    with pytest.raises(FileNotFoundError):
        percolite.exporters.JSONLines.load(tmp_path / "absent.jsonl")
    with exporter:
        pass
    with pytest.raises(ClosedError):
        exporter([E("a", 1, 1)])
    assert exporter.rows() == {}


def test_jsonlines_four_threads_end_at_the_reference_state(tmp_path):
    rng = random.Random(5)
    entries = history(rng)
    batches = batches_of(rng, entries, 80)
    path = tmp_path / "out.jsonl"
    exporters = [percolite.exporters.JSONLines(path) for _ in range(2)]
    threads = [
        threading.Thread(target=lambda i=i: [exporters[i % 2](b) for b in batches[i::4]])
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert percolite.exporters.JSONLines.load(path) == reference(entries)
    seqs = [line["seq"] for line in lines(path)]
    assert len(seqs) == len(set(seqs)), "no entry was appended twice"


def test_jsonlines_two_processes_end_at_the_reference_state(tmp_path):
    rng = random.Random(3)
    entries = history(rng)
    batches = batches_of(rng, entries, 120)
    path = tmp_path / "out.jsonl"
    export_from_processes(tmp_path, "jsonl", str(path), "", [batches[0::2], batches[1::2]])
    assert percolite.exporters.JSONLines.load(path) == reference(entries)
    by_key = {}
    for line in lines(path):
        by_key.setdefault(line["key"], []).append(line["seq"])
    assert all(seqs == sorted(set(seqs)) for seqs in by_key.values()), (
        "per key, every appended line is newer than the ones before it"
    )
