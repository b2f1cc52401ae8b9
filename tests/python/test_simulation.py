"""percolite.testing.simulate: a seeded, fault-injecting, single-threaded
run of a user's app.

The app (children/simulation.py) counts words with a combine queue whose
changes an export queue sends, as deltas, to a sink that adds them up. With
the sink's seq guard the totals are exact whatever the faults; without it,
a batch sent twice (an exporter failing after sending, a crash before the
batch is acknowledged) is counted twice, and the failing seed replays."""

from __future__ import annotations

import re

import children.simulation
import percolite
import pytest
from _isolated import run_child_json
from children import simulation
from percolite.testing import Faults, Simulation, simulate

EXPECTED = simulation.expected(simulation.documents())


def test_the_same_seed_gives_the_same_trace_and_store_in_two_processes():
    first = run_child_json(children.simulation.print_run, 7)
    second = run_child_json(children.simulation.print_run, 7)
    assert first == second
    here = simulation.run(7)
    assert here["trace_digest"] == first["trace_digest"]
    assert here["store_digest"] == first["store_digest"]


def test_different_seeds_explore_different_interleavings():
    digests = {simulation.run(seed)["trace_digest"] for seed in range(5)}
    assert len(digests) >= 2


def test_a_guarded_sink_is_exact_for_every_seed_whatever_the_faults():
    faults_seen = {"crashes": 0, "failures": 0, "conflicts": 0, "exported again": 0}
    for seed in range(100):
        result = simulation.run(seed)
        assert result["counts"] == EXPECTED, seed
        assert result["sink"] == EXPECTED, seed
        trace = "\n".join(result["trace"])
        faults_seen["crashes"] += trace.count("crash ")
        faults_seen["failures"] += trace.count(": failed ")
        faults_seen["conflicts"] += trace.count("conflict")
        faults_seen["exported again"] += trace.count("crash after an exporter returned")
    assert all(n > 0 for n in faults_seen.values()), faults_seen


def test_an_unguarded_sink_double_counts_and_its_seed_replays():
    failing = next(
        seed for seed in range(100) if simulation.run(seed, guarded=False)["sink"] != EXPECTED
    )
    first = simulation.run(failing, guarded=False)
    again = simulation.run(failing, guarded=False)
    assert first["sink"] == again["sink"] != EXPECTED
    assert first["trace"] == again["trace"]
    assert any(first["sink"][word] > EXPECTED[word] for word in EXPECTED), "counted twice"
    assert first["counts"] == EXPECTED, "the store itself stays exact"


def test_each_load_commits_exactly_once_through_crashes_and_conflicts():
    result = simulation.run(3, faults=Faults(crashes=0.05, conflicts=0.2))
    commits = [
        int(m.group(1))
        for line in result["trace"]
        if (m := re.match(r"load (\d+): commit at", line))
    ]
    assert sorted(commits) == list(range(len(simulation.documents())))
    assert any(line.startswith("crash") for line in result["trace"])
    assert any("conflict, runs again" in line for line in result["trace"])
    assert result["counts"] == EXPECTED


def test_without_faults_the_same_values_as_real_workers_on_lmdb(tmp_path):
    simulated = simulation.run(11, faults=None)
    sink: dict = {}
    app = simulation.make_app(sink, guarded=True)
    docs = simulation.documents()
    with percolite.open(tmp_path / "db", sync="none", app=app) as env:
        for fn in simulation.load(docs):
            env.run(fn)
        env.process(threads=4)
        with env.transaction() as tx:
            counts = {word: app.counts.get(tx, word) for word in EXPECTED}
    assert simulated["counts"] == counts == EXPECTED
    assert simulated["sink"] == sink == EXPECTED
    assert not any("fail" in line or "crash" in line for line in simulated["trace"])


def test_the_simulation_result():
    sink: dict = {}
    app = simulation.make_app(sink, guarded=True)
    with simulate(app, simulation.load(["a b", "b c"]), seed=1, workers=2) as sim:
        assert isinstance(sim, Simulation) and sim.seed == 1
        assert sim.stats["loads"] == 2 and sim.stats["commits"] >= 2
        assert sim.trace[0].startswith("load ")
        with sim.env.transaction() as tx:
            assert app.counts.get(tx, "b") == 2
    assert sink == {"a": 1, "b": 2, "c": 1}
    with pytest.raises(percolite.ClosedError):
        sim.env.transaction()


def test_on_lmdb_too():
    sink: dict = {}
    app = simulation.make_app(sink, guarded=True)
    docs = simulation.documents(10)
    sim = simulate(app, simulation.load(docs), seed=5, faults=simulation.FAULTS, backend="lmdb")
    try:
        assert sim.env.path != ":memory:"
        with sim.env.transaction() as tx:
            assert {w: app.counts.get(tx, w) for w in simulation.expected(docs)} == (
                simulation.expected(docs)
            )
    finally:
        sim.close()
    assert sink == simulation.expected(docs)


def test_a_load_that_raises_stops_the_simulation_with_its_error():
    app = simulation.make_app({}, guarded=True)

    def broken(tx):
        raise RuntimeError("the load is broken")

    with pytest.raises(RuntimeError, match="the load is broken"):
        simulate(app, [broken], seed=1)


def test_an_endless_app_stops_at_max_steps():
    app = percolite.App("endless")

    @app.observer(simulation.TEXT)
    def again(tx, row, col):
        tx.set(row, col, "again")

    with pytest.raises(percolite.Error, match="did not finish within 500 steps"):
        simulate(app, [lambda tx: tx.set("r", simulation.TEXT, "x")], seed=1, max_steps=500)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"seed": "1"}, TypeError, "seed must be an int, not str"),
        ({"seed": 1.5}, TypeError, "seed must be an int, not float"),
        ({"seed": True}, TypeError, "seed must be an int, not bool"),
        ({"seed": 1, "faults": {"crashes": 0.1}}, TypeError, "faults must be a"),
        ({"seed": 1, "workers": 0}, ValueError, "workers must be between 1 and 256, not 0"),
        ({"seed": 1, "workers": 257}, ValueError, "workers must be between 1 and 256"),
        ({"seed": 1, "workers": "4"}, TypeError, "workers must be an int, not str"),
        ({"seed": 1, "max_steps": 0}, ValueError, "max_steps must be between 1 and"),
        ({"seed": 1, "raise_errors": 1}, TypeError, "raise_errors must be True or False"),
        ({"seed": 1, "backend": "sqlite"}, ValueError, "backend must be one of"),
        ({"seed": 1, "load": 5}, TypeError, "load must be an iterable of transaction functions"),
        ({"seed": 1, "load": "abc"}, TypeError, "load must be an iterable"),
        ({"seed": 1, "load": [print, 5]}, TypeError, r"load\[1\] must be a transaction function"),
        ({"seed": 1, "app": "app"}, TypeError, "simulate needs a percolite.App, not str"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    arguments = {"app": simulation.make_app({}, True), "load": [], **kwargs}
    app, load = arguments.pop("app"), arguments.pop("load")
    with pytest.raises(error, match=match):
        simulate(app, load, **arguments)


def test_an_app_running_workers_elsewhere_is_refused(tmp_path):
    app = simulation.make_app({}, guarded=True)
    with percolite.open(tmp_path / "db", sync="none", app=app) as env:
        env.start_workers(1)
        with pytest.raises(ValueError, match="bound elsewhere with workers running"):
            simulate(app, [], seed=1)
        env.stop_workers()
        with simulate(app, [], seed=1) as sim:
            assert sim.stats["steps"] >= 1


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), float("inf")], ids=repr)
def test_fault_probabilities_outside_0_1_are_refused(bad):
    probability = r"Faults\(crashes=...\) must be a probability in \[0, 1\]"
    with pytest.raises(ValueError, match=probability + ", not"):
        Faults(crashes=bad)


@pytest.mark.parametrize("bad", ["0.5", True, None, [0.1]], ids=repr)
def test_fault_probabilities_of_other_types_are_refused(bad):
    with pytest.raises(TypeError, match=r"Faults\(crashes=...\) must be a probability"):
        Faults(crashes=bad)


def test_faults_that_leave_nothing_to_commit_stop_early():
    app = simulation.make_app({}, guarded=True)
    with pytest.raises(percolite.Error, match=r"no progress in 100,000 steps.*crashes=1\.0"):
        simulate(app, simulation.load(["a"]), seed=1, faults=Faults(crashes=1.0))


def test_an_observers_own_error_stops_the_simulation_unless_asked_not_to():
    app = percolite.App("broken")

    @app.observer(simulation.TEXT, max_attempts=3)
    def broken(tx, row, col):
        raise IndexError("a real bug")

    load = [lambda tx: tx.set("r", simulation.TEXT, "x")]
    with pytest.raises(IndexError, match="a real bug"):
        simulate(app, load, seed=1)
    with simulate(app, load, seed=1, raise_errors=False) as sim:
        assert sim.stats["failures"] == 3 and sim.stats["parked"] == 1
        assert any("IndexError: a real bug" in line for line in sim.trace)


def test_stats_have_every_key_and_parked_queue_keys_show():
    app = simulation.failing_export_app(max_attempts=2)
    load = [lambda tx: tx.set("r", simulation.TEXT, "x")]
    with simulate(app, load, seed=1, raise_errors=False) as sim:
        assert set(sim.stats) == set(percolite.testing._simulation.STAT_KEYS)
        assert sim.stats["crashes"] == 0 and sim.stats["parked"] == 1
        assert any("parked 1 keys of export queue out" in line for line in sim.trace)
        assert "trace" not in repr(sim)
