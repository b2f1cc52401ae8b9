"""Choosing a backend: ``percolite.open``'s target and ``backend`` argument,
and what is particular to the memory backend (a private store per handle,
gone when the handle closes, refused in a forked child). The engine's
contracts themselves are tested on every backend by the tests that take the
``env`` or ``backend`` fixture."""

from __future__ import annotations

import os
import subprocess
import sys

import children.backends
import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from _isolated import run_child
from conftest import BACKENDS, COL, committed_cells, open_store


def test_every_backend_is_tested():
    assert BACKENDS == tuple(percolite._core.BACKENDS)
    assert {"lmdb", "memory", "postgresql"} <= set(BACKENDS)


def test_a_store_names_its_backend(backend, store_path):
    with open_store(backend, store_path, sync="none") as env:
        assert env.backend == backend
        assert env.capabilities["name"] == backend


def test_memory_store_path_backend_and_capabilities():
    with percolite.open(":memory:") as env:
        assert env.path == ":memory:"
        assert env.backend == "memory"
        capabilities = env.capabilities
    assert capabilities["persistent"] is False
    assert capabilities["cross_process"] is False
    assert capabilities["durable"] is False
    with percolite.open(":memory:", backend="memory") as env:
        assert (env.path, env.backend) == (":memory:", "memory")


def test_lmdb_store_by_path_and_by_lmdb_url(tmp_path):
    with percolite.open(tmp_path / "plain") as env:
        assert env.backend == "lmdb"
        assert env.path == os.path.realpath(tmp_path / "plain")
        assert env.capabilities["persistent"] is True
    with percolite.open(f"lmdb://{tmp_path / 'url'}") as env:
        assert env.backend == "lmdb"
        assert env.path == os.path.realpath(tmp_path / "url")
    assert (tmp_path / "url").is_dir()


def test_each_open_of_memory_is_a_private_store():
    first = percolite.open(":memory:", sync="none")
    second = percolite.open(":memory:", sync="none")
    try:
        with first.transaction() as tx:
            tx.set("r", COL, "first")
        assert committed_cells(second) == []
        with second.transaction() as tx:
            tx.set("r", COL, "second")
        # The same cell in two stores: no conflict between them.
        t1, t2 = first.transaction(), second.transaction()
        t1.set("x", COL, "1")
        t2.set("x", COL, "2")
        t1.commit()
        t2.commit()
        assert committed_cells(first) == [
            (b"r", (b"f", b"q"), b"first"),
            (b"x", (b"f", b"q"), b"1"),
        ]
        assert committed_cells(second) == [
            (b"r", (b"f", b"q"), b"second"),
            (b"x", (b"f", b"q"), b"2"),
        ]
        first.close()
        assert committed_cells(second)[0] == (b"r", (b"f", b"q"), b"second")
    finally:
        first.close()
        second.close()


def test_a_memory_store_is_gone_after_close():
    env = percolite.open(":memory:", sync="none")
    with env.transaction() as tx:
        tx.set("r", COL, "v")
    assert committed_cells(env) == [(b"r", (b"f", b"q"), b"v")]
    env.close()
    with percolite.open(":memory:", sync="none") as again:
        assert committed_cells(again) == []
        with again.transaction() as tx:
            assert tx.get("r", COL) is None


def test_a_closed_memory_store_raises_closed_error():
    env = percolite.open(":memory:", sync="none")
    with env.transaction() as tx:
        tx.set("r", COL, "v")
    reader = env.transaction()
    writer = env.transaction()
    writer.set("w", COL, "v")
    env.close()
    assert env.closed
    assert writer.state == "closed"
    for use in (
        env.transaction,
        env.stats,
        env.status,
        lambda: env.run(lambda tx: None),
        lambda: reader.get("r", COL),
        lambda: list(reader.scan()),
        writer.commit,
    ):
        with pytest.raises(percolite.ClosedError, match="closed"):
            use()
    reader.abort()  # never raises


@pytest.mark.parametrize(
    "target",
    ["mysql://h/db", "redis://localhost:6379/0", "s3://bucket/store"],
)
def test_an_unknown_scheme_is_a_value_error_naming_it(target):
    scheme = target.split("://")[0]
    with pytest.raises(ValueError, match=f"'{scheme}://'"):
        percolite.open(target)


@pytest.mark.parametrize("name", ["nope", "LMDB", "Memory", "sqlite"])
def test_an_unknown_backend_name_is_a_value_error_naming_it(name, store_path):
    with pytest.raises(ValueError, match=f"unknown backend '{name}'"):
        percolite.open(":memory:", backend=name)
    with pytest.raises(ValueError, match=f"unknown backend '{name}'"):
        percolite.open(store_path, backend=name)
    assert not store_path.exists()


@pytest.mark.parametrize("name", [5, b"memory", ["lmdb"], True], ids=repr)
def test_a_backend_that_is_not_a_str_is_a_type_error(name, store_path):
    with pytest.raises(
        TypeError, match=f"backend must be a str or None, not {type(name).__name__}"
    ):
        percolite.open(":memory:", backend=name)
    with pytest.raises(TypeError, match="backend must be a str or None"):
        percolite.open(store_path, backend=name)
    assert not store_path.exists()


def test_create_false_with_memory_is_a_value_error():
    with pytest.raises(ValueError, match="create=False"):
        percolite.open(":memory:", create=False)
    with pytest.raises(ValueError, match="create=False"):
        percolite.open(":memory:", backend="memory", create=False)


def test_a_target_and_a_backend_that_disagree_are_a_value_error():
    with pytest.raises(ValueError, match="names the memory backend, but backend='lmdb'"):
        percolite.open(":memory:", backend="lmdb")


def test_a_memory_store_used_in_a_forked_child_raises_error():
    """The child gets percolite.Error naming fork from the parent's memory
    store (handle, open transaction, commit, stats), never a crash, and can
    open a memory store of its own; the parent's store still works."""
    out = run_child(children.backends.fork_with_a_memory_store, timeout=30)
    lines = out.split()
    assert "child-exit" in lines and lines[lines.index("child-exit") + 1] == "0", out
    assert "parent-ok" in lines


def test_open_with_backend_memory_needs_no_path():
    with percolite.open(backend="memory", sync="none") as env:
        assert env.backend == "memory" and env.path == ":memory:"
        env.run(lambda tx: tx.set("r", ("f", "q"), b"v"))


def test_open_without_a_path_needs_backend_memory():
    with pytest.raises(TypeError, match="needs a path"):
        percolite.open()
    with pytest.raises(TypeError, match="needs a path"):
        percolite.open(backend="lmdb")


def test_a_path_with_backend_memory_is_a_value_error(store_path):
    with pytest.raises(ValueError, match="a memory store has no path"):
        percolite.open(store_path, backend="memory")
    assert not store_path.exists()


# -- targets and names, as the core reads them ---------------------------------


@pytest.mark.parametrize(
    "target, backend, expected",
    [
        (":memory:", "", ("memory", "")),
        ("memory:", "", ("memory", "")),
        ("memory://", "", ("memory", "")),
        ("MEMORY://", "", ("memory", "")),
        ("lmdb://some/dir", "", ("lmdb", "some/dir")),
        ("LMDB://some/dir", "", ("lmdb", "some/dir")),
        ("lmdb:rel", "", ("lmdb", "rel")),
        ("data:2024", "", ("lmdb", "data:2024")),  # a relative path with a colon
        ("plain/dir", "lmdb", ("lmdb", "plain/dir")),
        (":memory:", "memory", ("memory", "")),
    ],
)
def test_targets_name_a_backend_and_a_location(target, backend, expected):
    assert percolite._core.parse_target(target, backend) == expected


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"backend": "sqlite"}, ValueError, "unknown backend 'sqlite'"),
        ({"backend": "Memory"}, ValueError, "unknown backend 'Memory'"),
        ({"backend": b"memory"}, TypeError, "backend must be a str or None, not bytes"),
        ({"path": "", "backend": "memory"}, ValueError, "the path is empty"),
        ({"path": ""}, ValueError, "the path is empty"),
        ({"path": "lmdb://"}, ValueError, "names no directory"),
    ],
)
def test_bad_targets_and_names_raise_before_anything_is_created(tmp_path, kwargs, error, match):
    before = sorted(tmp_path.iterdir())
    with pytest.raises(error, match=match):
        percolite.open(**kwargs)
    assert sorted(tmp_path.iterdir()) == before


def test_waiting_on_a_memory_store_without_workers_raises_at_once():
    app = percolite.App()

    @app.observer(COL)
    def observe(tx, row, column):
        pass

    with percolite.open(":memory:", app=app) as env:
        assert env.wait(timeout=5)  # nothing pending: idle
        env.run(lambda tx: tx.set("r", COL, b"v"))
        with pytest.raises(percolite.Error, match="1 notification is pending and no workers run"):
            env.wait()  # would never end: no other process can run the work
        env.process()
        assert env.wait(timeout=5)


# -- bad backend names, in the table of entry points ---------------------------

ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    (
        "open-backend-int",
        lambda env, d, q: percolite.open(d / "c", backend=5),
        TypeError,
        r"backend must be a str or None, not int",
    ),
    (
        "open-backend-unknown",
        lambda env, d, q: percolite.open(d / "c", backend="sqlite"),
        ValueError,
        r"unknown backend 'sqlite'",
    ),
]


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)


# -- the command line needs a store other processes can open --------------------


def cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "percolite", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", ["status", "scan", "wait"])
def test_cli_refuses_a_memory_store_with_one_line(tmp_path, command):
    result = cli(command, ":memory:", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "percolite: ':memory:' is an in-memory store, private to the process that opens it: "
        "give the directory of a store (or a postgresql:// URI)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_cli_worker_and_phrasecount_take_lmdb_urls(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text('"""The quick brown fox jumps over the lazy dog."""\n')
    result = cli("phrasecount", "corpus", "--db", "lmdb://pc.db", "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # The sink is named after the store's directory, not after the URL.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "pc.db", "pc.db.phrases.sqlite"]
    worker = cli(
        "worker",
        "percolite.phrasecount.app:app",
        "--db",
        "lmdb://pc.db",
        "--until-idle",
        cwd=tmp_path,
    )
    assert worker.returncode == 0, worker.stderr


def test_cli_phrasecount_refuses_a_memory_store(tmp_path):
    result = cli("phrasecount", "--db", ":memory:", cwd=tmp_path)
    assert result.returncode != 0
    assert "in-memory store, private to the process" in result.stderr
    assert list(tmp_path.iterdir()) == []
