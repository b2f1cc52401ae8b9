"""A sink belongs to one store (identity.h, docs/exporters.md): every store
has an identity; the built-in sinks record the store that feeds them beside
their seq guard and refuse another's entries until a deliberate take-over; a
store restored from a copy starts a new epoch whose entries are applied, not
dropped as stale. Real SQLite files, a real PostgreSQL server, real
processes."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import sys
import threading
import uuid

import percolite
import pytest
from _isolated import TESTS_DIR, load_fresh, run_command
from percolite.exporters import JSONLines, Postgres, SQLite
from test_phrasecount import exported_sqlite, reference_for, summary_numbers, write_corpus


class Sink:
    """One sink of a kind: ``make()`` gives a new exporter object on it (as
    each process makes its own), ``rows()`` what it holds."""

    def __init__(self, kind, tmp_path, request):
        self.kind = kind
        self.made = []
        if kind == "sqlite":
            self.args = (tmp_path / "out.sqlite", "kv")
        elif kind == "postgres":
            dsn = request.getfixturevalue("postgres_dsn")
            self.args = (dsn, f"kv_{uuid.uuid4().hex[:12]}")
        else:
            self.args = (tmp_path / "out.jsonl",)

    def make(self, **options):
        cls = {"sqlite": SQLite, "postgres": Postgres, "jsonlines": JSONLines}[self.kind]
        exporter = cls(*self.args, **options)
        self.made.append(exporter)
        return exporter

    def rows(self):
        return self.make().rows()

    def close(self):
        for exporter in self.made:
            exporter.close()


@pytest.fixture(params=["sqlite", "postgres", "jsonlines"])
def sink(request, tmp_path):
    made = Sink(request.param, tmp_path, request)
    yield made
    made.close()


def app_for(exporter) -> tuple[percolite.App, percolite.ExportQueue]:
    app = percolite.App("owned")
    out = app.export_queue("out", exporter, value_codec="int64")
    return app, out


def export(path, sink, values, **open_options) -> tuple[dict, dict]:
    """Opens the store at ``path``, exports ``values`` (None deletes) into a
    new exporter object on ``sink``; returns (the store's identity, what
    env.process() did)."""
    app, out = app_for(sink.make())
    with percolite.open(path, app=app, sync="none", **open_options) as env:
        env.run(lambda tx: [out.add(tx, key, value) for key, value in values.items()])
        return env.identity, env.process(2)


def test_every_store_has_an_identity_kept_across_opens_and_new_for_a_new_store(tmp_path):
    with percolite.open(tmp_path / "a") as env:
        first = env.identity
        assert env.status()["identity"] == first
    assert first["epoch"] == 1 and len(first["store"]) == 32
    int(first["store"], 16)  # hexadecimal digits
    with percolite.open(tmp_path / "a") as env:
        assert env.identity == first
    with percolite.open(tmp_path / "b") as env:
        assert env.identity["store"] != first["store"]
    with percolite.open(":memory:") as one, percolite.open(":memory:") as two:
        assert one.identity["store"] != two.identity["store"]
    shown = run_command([sys.executable, "-m", "percolite", "status", tmp_path / "a"], timeout=60)
    assert f"identity: {first['store']} (epoch 1)" in shown.stdout, shown.stdout


def test_a_new_store_at_the_same_path_is_refused_until_it_takes_the_sink_over(tmp_path, sink):
    db = tmp_path / "db"
    first, done = export(db, sink, {"a": 60, "b": 1})
    assert done["blocked"] == {} and sink.rows() == {"a": 60, "b": 1}
    shutil.rmtree(db)  # a notebook re-run, an rm -rf of the store
    app, out = app_for(sink.make())
    with percolite.open(db, app=app, sync="none") as env:
        second = env.identity
        assert second["store"] != first["store"]
        env.run(lambda tx: out.add(tx, "a", 7))
        done = env.process(2)
        (message,) = done["blocked"].values()
        assert f"belongs to store {first['store']}" in message
        assert second["store"] in message and "take_over_sink('out')" in message
        assert sink.rows() == {"a": 60, "b": 1}, "the sink is left untouched"
        assert env.parked(), "the blocked bucket is recorded"
        assert all(r["sink"] == "refused" and r["key"] is None for r in env.parked())
        state = env.status()["sinks"]["out"]
        assert state["state"] == "refused" and state["waiting"] == 1
        assert state["last_error"]["type"].endswith("SinkOwnedByOtherStore")
        with pytest.raises(percolite.SinkBlocked) as blocked:
            env.wait(10)
        assert set(blocked.value.blocked) == {"out"}

        taken = env.take_over_sink("out")
        assert taken["previous_owner"] == first["store"]
        assert taken["owner"] == second["store"] and taken["rows_cleared"] == 2
        assert taken["retried"] >= 1
        assert env.process(2)["blocked"] == {}
        assert env.sinks()["out"] == {"state": "ok"}
    assert sink.rows() == {"a": 7}
    assert sink.make().owner() == {"store": second["store"], "epoch": 1}


def test_two_live_stores_exporting_into_one_table_the_second_is_refused(tmp_path, sink):
    first, done = export(tmp_path / "one", sink, {"a": 1})
    assert done["blocked"] == {}
    _second, done = export(tmp_path / "two", sink, {"a": 2, "b": 2})
    assert set(done["blocked"]) == {"out"}
    _again, done = export(tmp_path / "one", sink, {"c": 3})
    assert done["blocked"] == {}
    assert sink.rows() == {"a": 1, "c": 3}
    assert sink.make().owner()["store"] == first["store"]


def test_a_store_restored_from_a_copy_exports_over_what_its_lost_history_left(tmp_path, sink):
    db, copy = tmp_path / "db", tmp_path / "copy"
    identity, _ = export(db, sink, {"a": 1, "b": 1})
    shutil.copytree(db, copy)
    export(db, sink, {"a": 2, "c": 5})  # the history the restore loses
    assert sink.rows() == {"a": 2, "b": 1, "c": 5}
    shutil.rmtree(db)
    shutil.copytree(copy, db)
    restored, done = export(db, sink, {"a": 3}, restored=True)
    assert restored == {"store": identity["store"], "epoch": 2}
    assert done["blocked"] == {}
    # a=3 has a lower seq than the lost a=2, and is applied all the same; c,
    # written by the lost history only, stays until its key changes again.
    assert sink.rows() == {"a": 3, "b": 1, "c": 5}
    assert sink.make().owner() == {"store": identity["store"], "epoch": 2}
    export(db, sink, {"b": None})
    assert sink.rows() == {"a": 3, "c": 5}


def test_a_custom_exporter_learns_the_store_from_its_batch(tmp_path):
    seen = []

    def exporter(entries):
        seen.append((entries.queue, entries.store, entries.epoch, list(entries)))

    app, out = app_for(exporter)
    with percolite.open(tmp_path / "db", app=app, sync="none") as env:
        env.run(lambda tx: out.add(tx, "k", 1))
        env.process(1)
        identity = env.identity
    ((queue, store, epoch, entries),) = seen
    assert (queue, store, epoch) == ("out", identity["store"], identity["epoch"])
    assert [(e.key, e.value) for e in entries] == [("k", 1)]
    assert isinstance(entries[0], percolite.SequencedExport)


def test_first_batches_of_many_writers_at_once_all_apply(sink):
    """Writers (each its own exporter object, as each process has) sending
    their first batch together: one creates the tables and records the
    owner, none fails for having raced it."""
    writers = [sink.make() for _ in range(8)]
    start = threading.Barrier(len(writers))
    errors = []

    def first_batch(i, exporter):
        batch = percolite.ExportBatch([percolite.SequencedExport(f"k{i}", i, 1)])
        batch.queue, batch.store, batch.epoch = "q", "a" * 32, 1
        start.wait()
        try:
            exporter(batch)
        except Exception as exc:  # noqa: BLE001 - every failure is reported below
            errors.append(exc)

    threads = [threading.Thread(target=first_batch, args=item) for item in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sink.rows() == {f"k{i}": i for i in range(len(writers))}


def test_a_built_in_exporter_called_directly_checks_nothing(tmp_path, sink):
    export(tmp_path / "db", sink, {"a": 1})
    sink.make()([percolite.SequencedExport("a", 9, 1 << 60)])  # a plain list: no store
    assert sink.rows() == {"a": 9}


def test_a_sink_made_before_sinks_knew_their_store_is_adopted_with_a_warning(
    tmp_path, sink, caplog
):
    sink.make()([percolite.SequencedExport("old", 1, 1)])  # rows, no owner
    assert sink.make().owner() is None
    with caplog.at_level(logging.WARNING, logger="percolite.exporters"):
        identity, done = export(tmp_path / "db", sink, {"new": 2})
    assert done["blocked"] == {}
    assert sink.rows() == {"old": 1, "new": 2}
    assert sink.make().owner() == identity
    (record,) = [r for r in caplog.records if r.name == "percolite.exporters"]
    assert "had rows but no owner" in record.getMessage() and identity["store"] in record.message


# -- bad input ------------------------------------------------------------------


def test_taking_over_a_queue_that_does_not_exist_or_a_custom_sink_is_refused(tmp_path):
    app = percolite.App("mixed")
    app.export_queue("custom", lambda entries: None)
    app.combine_queue("counts", combiner="sum")
    with percolite.open(tmp_path / "db", app=app) as env:
        with pytest.raises(ValueError, match="no export queue named 'nope' in app 'mixed'"):
            env.take_over_sink("nope")
        with pytest.raises(ValueError, match="no export queue named 'counts'"):
            env.take_over_sink("counts")
        with pytest.raises(ValueError, match="is not a built-in sink of percolite.exporters"):
            env.take_over_sink("custom")
        with pytest.raises(TypeError, match="queue must be a str"):
            env.take_over_sink(3)


@pytest.mark.parametrize("bad", ["ConnectionError", (ConnectionError, 3), 7, (int,)])
def test_transient_errors_that_are_not_exception_types_are_refused(bad):
    app = percolite.App("bad")
    with pytest.raises(TypeError, match="transient_errors must be an exception class"):
        app.export_queue("out", lambda entries: None, transient_errors=bad)
    with pytest.raises(TypeError, match="transient_errors must be an exception class"):
        app.export_queue("out", transient_errors=bad)


def test_a_take_over_while_another_writer_holds_the_sink_changes_nothing(tmp_path):
    sink = SQLite(tmp_path / "out.sqlite", "kv", timeout=0.3)
    app, out = app_for(sink)
    with percolite.open(tmp_path / "one", app=app, sync="none") as env:
        env.run(lambda tx: out.add(tx, "a", 1))
        env.process(1)
        owner = env.identity
    holder = sqlite3.connect(tmp_path / "out.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another store's workers, writing
    try:
        with percolite.open(tmp_path / "two", app=app, sync="none") as env:
            with pytest.raises(percolite.SinkBusy, match="locked by another writer"):
                env.take_over_sink("out")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert sink.rows() == {"a": 1}
    assert sink.owner() == owner


# -- the command line, with real worker processes ------------------------------


def cli(*args) -> list:
    return [sys.executable, "-m", "percolite", *map(str, args)]


def test_worker_exits_4_on_a_refused_sink_and_take_over_lets_it_finish(tmp_path, monkeypatch):
    sink_dir = tmp_path / "sink"
    sink_dir.mkdir()
    monkeypatch.setenv("SINK_DIR", str(sink_dir))
    monkeypatch.setenv("SINK_ENTRIES", "300")
    sink_app = load_fresh("children.sink_app")
    for db, times in ((tmp_path / "one", 1), (tmp_path / "two", 2)):
        with percolite.open(db, app=sink_app.app, sync="none") as env:
            sink_app.load(env, times)
    worker = cli("worker", "children.sink_app:app", "--db", tmp_path / "one", "--until-idle")
    assert run_command(worker, timeout=120, cwd=TESTS_DIR).returncode == 0
    worker[worker.index("--db") + 1] = tmp_path / "two"
    refused = run_command(worker, timeout=120, cwd=TESTS_DIR)
    assert refused.returncode == 4, refused.stderr
    assert "blocked by a sink that refuses this store" in refused.stderr
    shown = run_command(cli("status", tmp_path / "two"), timeout=60)
    assert "sink of export queue 'out': refusing this store (blocked)" in shown.stdout
    assert "SinkOwnedByOtherStore" in shown.stdout
    status = json.loads(run_command(cli("status", tmp_path / "two", "--json"), timeout=60).stdout)
    assert status["sinks"]["out"]["state"] == "refused"
    rows = sqlite3.connect(sink_dir / "out.sqlite").execute("SELECT k, v FROM kv").fetchall()
    assert dict(rows) == sink_app.expected(1), "the sink is untouched"

    missing = run_command(
        cli("take-over", "children.sink_app:app", "nope", "--db", tmp_path / "two"),
        timeout=60,
        cwd=TESTS_DIR,
    )
    assert missing.returncode == 2 and "no export queue named 'nope'" in missing.stderr
    taken = run_command(
        cli("take-over", "children.sink_app:app", "out", "--db", tmp_path / "two"),
        timeout=60,
        cwd=TESTS_DIR,
    )
    assert taken.returncode == 0, taken.stderr
    assert "300 rows cleared" in taken.stdout
    assert run_command(worker, timeout=120, cwd=TESTS_DIR).returncode == 0
    rows = sqlite3.connect(sink_dir / "out.sqlite").execute("SELECT k, v FROM kv").fetchall()
    assert dict(rows) == sink_app.expected(2)


def test_phrasecount_after_its_store_was_deleted_agrees_with_a_fresh_run(tmp_path):
    """The issue's scenario: files counted, then edited and removed, only
    the store deleted (its default sink left beside it), and phrasecount run
    again: the sink, the summary and the top ten equal a fresh run's."""
    root, db = tmp_path / "corpus", tmp_path / "db"
    files = write_corpus(root, n=60, seed=11)
    first = run_command(cli("phrasecount", "--quiet", root, "--db", db), timeout=180)
    assert first.returncode == 0, first.stderr
    for path in files[:20]:
        path.write_text(path.read_text(encoding="utf-8") + " and a rewritten ending here")
    for path in files[20:26]:
        path.unlink()
    shutil.rmtree(db)
    again = run_command(cli("phrasecount", "--quiet", root, "--db", db), timeout=180)
    assert again.returncode == 0, again.stderr
    assert "its sink held another store's counts" in again.stderr
    fresh_db = tmp_path / "fresh"
    fresh = run_command(cli("phrasecount", "--quiet", root, "--db", fresh_db), timeout=180)
    assert fresh.returncode == 0, fresh.stderr
    sink = tmp_path / "db.phrases.sqlite"
    assert exported_sqlite(sink) == exported_sqlite(tmp_path / "fresh.phrases.sqlite")
    assert exported_sqlite(sink) == reference_for(root)
    assert (
        summary_numbers(again.stdout).split(";")[1:] == summary_numbers(fresh.stdout).split(";")[1:]
    )
    top = [line for line in again.stdout.splitlines() if line.startswith("  ")]
    assert top == [line for line in fresh.stdout.splitlines() if line.startswith("  ")]
