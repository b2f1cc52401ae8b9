"""The `percolite` command line as a whole: every command finds its store
the same way (DB, --db DB or $PERCOLITE_DB) and reports the same mistake
with the same words and exit status (the table in percolite._cli and
docs/operations.md)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import sys

import percolite
import pytest
from _isolated import TESTS_DIR, load_fresh, run_command
from percolite.__main__ import build_parser, main
from percolite._env import TARGET_VARIABLE, shown_target

CONTENT = ("doc", "content")

# Every command, with the store as {db} and what else it needs to run.
COMMANDS = {
    "status": ["status", "--db", "{db}"],
    "scan": ["scan", "--db", "{db}"],
    "wait": ["wait", "--db", "{db}", "--quiet", "--timeout", "5"],
    "retry": ["retry", "--db", "{db}"],
    "check": ["check", "--db", "{db}"],
    "restored": ["restored", "--db", "{db}"],
    "worker": ["worker", "children.flaky_app:app", "--db", "{db}", "--until-idle"],
    "take-over": ["take-over", "children.flaky_app:app", "out", "--db", "{db}"],
    "phrasecount": ["phrasecount", "--quiet", "--db", "{db}"],
    "webindex": [
        "webindex",
        "load",
        "children",
        "--base-url",
        "http://x/",
        "--quiet",
        "--db",
        "{db}",
    ],
    "demo": ["demo", "--db", "{db}"],
    "ui": ["ui", "--db", "{db}", "--port", "0"],
}
# Those that make their store where there is none.
CREATES = {"phrasecount", "webindex", "demo"}
# Those whose only positional argument is the store.
POSITIONAL = {"status", "scan", "wait", "retry", "check", "restored", "ui"}


def command(name: str, db=None, *, how: str = "--db") -> list[str]:
    """``name``'s argv with the store ``db`` given as ``how`` says: "--db",
    "DB" (positional) or "none" (left out: $PERCOLITE_DB, or nothing)."""
    argv = list(COMMANDS[name])
    at = argv.index("--db")
    del argv[at : at + 2]
    if how == "--db":
        argv[at:at] = ["--db", str(db)]
    elif how == "DB":
        argv[1:1] = [str(db)]
    return argv


@pytest.fixture
def cli(capsys, monkeypatch):
    """Runs main() in this process: (status, stdout, stderr). $PERCOLITE_DB
    is unset; the percolite logger is left as it was found."""
    monkeypatch.delenv(TARGET_VARIABLE, raising=False)
    monkeypatch.chdir(TESTS_DIR)  # the children.* apps
    logger = logging.getLogger("percolite")
    level, handlers = logger.level, list(logger.handlers)

    def run(*argv):
        try:
            status = main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            status = e.code
        out, err = capsys.readouterr()
        return status, out, err

    yield run
    logger.setLevel(level)
    logger.handlers[:] = handlers


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices


def test_the_table_covers_every_command():
    assert set(subcommands()) == set(COMMANDS), "a new command: add it to COMMANDS"
    for name, sub in subcommands().items():
        actions = sub._actions
        groups = [a for a in actions if isinstance(a, argparse._SubParsersAction)]
        if groups:  # a group of commands: the one of the table takes the store
            actions = groups[0].choices[COMMANDS[name][1]]._actions
        options = {o for a in actions for o in a.option_strings}
        assert "--db" in options, name
        has_db = any(a.dest == "store" for a in actions)
        assert has_db == (name in POSITIONAL), name


def ways(names) -> list[tuple[str, str]]:
    """(command, how it is given its store) for every way each of ``names`` takes one."""
    hows = {name: ["--db", "env"] + (["DB"] if name in POSITIONAL else []) for name in names}
    if "demo" in hows:
        hows["demo"].remove("env")  # the demo never writes to the store of $PERCOLITE_DB
    return [(name, how) for name in sorted(names) for how in hows[name]]


@pytest.mark.parametrize("name, how", ways(COMMANDS))
def test_a_file_given_as_the_store(cli, tmp_path, monkeypatch, name, how):
    db = tmp_path / "plain"
    db.write_text("mine")
    if how == "env":
        monkeypatch.setenv(TARGET_VARIABLE, str(db))
    status, out, err = cli(*command(name, db, how="none" if how == "env" else how))
    assert status == 2
    assert one_line(err) == (
        f"percolite: {db}: not a percolite store: it is a file (a store is a directory)"
    )
    assert db.read_text() == "mine"


@pytest.mark.parametrize("name, how", ways(set(COMMANDS) - CREATES))
def test_a_store_that_does_not_exist(cli, tmp_path, monkeypatch, name, how):
    db = tmp_path / "nothing"
    if how == "env":
        monkeypatch.setenv(TARGET_VARIABLE, str(db))
    status, out, err = cli(*command(name, db, how="none" if how == "env" else how))
    assert status == 2
    assert one_line(err) == f"percolite: {db}: no such store: nothing is there"
    assert not db.exists(), "nothing was created"


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - CREATES))
def test_a_directory_that_holds_no_store(cli, tmp_path, name):
    db = tmp_path / "plain"
    db.mkdir()
    (db / "notes.txt").write_text("mine")
    status, out, err = cli(*command(name, db))
    assert status == 2
    assert one_line(err) == (
        f"percolite: {db}: not a percolite store: the directory holds none (no data.mdb)"
    )
    assert os.listdir(db) == ["notes.txt"], "nothing was created"


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - {"demo"}))
def test_no_store_given(cli, name):
    status, out, err = cli(*command(name, how="none"))
    assert status == 2
    assert one_line(err) == (
        "percolite: no store given: name it with --db DB (a directory or a postgresql:// URI) "
        "or $PERCOLITE_DB"
    )


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - {"restored", "demo"}))
def test_a_server_that_cannot_be_reached(cli, name):
    db = "postgresql://nobody@/percolite?host=/nonexistent-percolite-socket"
    status, out, err = cli(*command(name, db))
    assert status == 1
    line = one_line(err)
    assert line.startswith(
        "percolite: cannot connect to the postgresql server of "
        "'postgresql://nobody@/percolite?host=/nonexistent-percolite-socket': "
    ), line


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - CREATES - {"restored"}))
def test_a_postgresql_schema_that_holds_no_store(cli, postgres_server, name):
    target = f"{postgres_server.uri}&password=s3cret&schema=nothing_here"
    status, out, err = cli(*command(name, target))
    assert status == 2
    shown = shown_target(target)
    assert "s3cret" not in shown
    assert one_line(err) == (
        f"percolite: {shown}: not a percolite store: its schema nothing_here holds none"
    )


def test_restored_is_for_a_store_directory(cli, postgres_server):
    status, out, err = cli("restored", "--db", f"{postgres_server.uri}&schema=restored_here")
    assert status == 2
    assert one_line(err).endswith("this works on the files of an lmdb store directory")


@pytest.mark.parametrize("name", sorted(POSITIONAL))
def test_two_different_stores_is_a_usage_error(cli, tmp_path, name):
    with percolite.open(tmp_path / "a", sync="none"), percolite.open(tmp_path / "b", sync="none"):
        pass
    argv = command(name, tmp_path / "a")
    argv[1:1] = [str(tmp_path / "b")]
    status, out, err = cli(*argv)
    assert status == 2
    assert one_line(err) == (
        f"percolite: two stores given, {tmp_path / 'b'} and --db {tmp_path / 'a'}: give one"
    )


def test_the_same_store_twice_is_fine(cli, tmp_path):
    with percolite.open(tmp_path / "a", sync="none"):
        pass
    status, out, err = cli("scan", tmp_path / "a", "--db", tmp_path / "a")
    assert (status, out, err) == (0, "", "")


def test_status_takes_db_and_the_environment(cli, tmp_path, monkeypatch):
    """The issue's first try: `percolite status --db DB`."""
    db = tmp_path / "db"
    with percolite.open(db, sync="none") as env:
        with env.transaction() as tx:
            tx.set("r", CONTENT, "v")
    for argv in (["status", "--db", db], ["status", db]):
        status, out, err = cli(*argv)
        assert status == 0, err
        assert out.startswith(f"store:   {db}\n")
    monkeypatch.setenv(TARGET_VARIABLE, str(db))
    assert cli("scan") == (0, "r\tdoc:content\tv\n", "")
    # Given on the command line, the store wins over the environment's.
    monkeypatch.setenv(TARGET_VARIABLE, str(tmp_path / "elsewhere"))
    assert cli("scan", db) == (0, "r\tdoc:content\tv\n", "")
    assert cli("scan", "--db", db) == (0, "r\tdoc:content\tv\n", "")


@pytest.mark.parametrize(
    "spec, words",
    [
        ("nocolon", "app must be given as module:attribute, not 'nocolon'"),
        ("no_such_module_here:app", "No module named 'no_such_module_here'"),
        ("children.flaky_app:nope", "module 'children.flaky_app' has no attribute 'nope'"),
        ("children.flaky_app:CONTENT", "is a tuple, not a percolite.App"),
    ],
)
@pytest.mark.parametrize("name", ["worker", "take-over"])
def test_a_bad_app_is_a_usage_error(cli, tmp_path, name, spec, words):
    with percolite.open(tmp_path / "db", sync="none"):
        pass
    argv = command(name, tmp_path / "db")
    argv[1] = spec
    status, out, err = cli(*argv)
    assert status == 2
    line = one_line(err)
    assert line.startswith(f"percolite: cannot load app {spec!r}: ") and words in line, line


def test_a_worker_group_names_the_commands_that_show_and_retry_parked_work(tmp_path):
    db = tmp_path / "a store"
    with percolite.open(db, app=load_fresh("children.flaky_app").app, sync="none") as env:
        with env.transaction() as tx:
            for i in range(4):
                tx.set(f"doc:{i}", CONTENT, "text")
    argv = [sys.executable, "-m", "percolite", "worker", "children.flaky_app:app", "--until-idle"]
    argv += ["--processes", "2", "--threads", "1", "--db", db]
    result = run_command(argv, timeout=120, cwd=TESTS_DIR)
    assert result.returncode == 3, result.stderr
    quoted = shlex.quote(str(db))
    assert f"see `percolite status --db {quoted}`" in result.stderr
    assert f"then `percolite retry --db {quoted}`" in result.stderr


# -- arguments and --help --------------------------------------------------------


def test_every_option_says_what_it_does_and_its_default():
    parsers = {"percolite": build_parser(), **subcommands()}
    for name, parser in parsers.items():
        assert parser.description, name
        for action in parser._actions:
            if action.dest == "help" or action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction) or action.dest == "version":
                continue
            if not action.option_strings and action.nargs not in ("?", "*"):
                assert action.help, (name, action.dest)  # required: no default
                continue
            assert action.help and "default: " in action.help, (name, action.dest)


def test_worker_help_describes_processes_and_threads(cli):
    status, out, err = cli("worker", "--help")
    assert status == 0
    text = " ".join(out.split())
    assert "Run an app's observers and queues on a store." in text
    assert "--processes N worker processes; with more than 1 they share the work by lease " in text
    assert (
        f"--threads T worker threads per process (default: {percolite._core.DEFAULT_THREADS})"
        in text
    )
    assert "Exit status: 0 done; 1 " in text and "; 3 only parked work left;" in text


@pytest.mark.parametrize(
    "argv, line",
    [
        (["scan", "--limit", "-1"], "--limit must be an int >= 0, not '-1'"),
        (["scan", "--limit", "many"], "--limit must be an int >= 0, not 'many'"),
        (["wait", "--timeout", "nan"], "--timeout must be a number of seconds >= 0, not 'nan'"),
        (["wait", "--timeout", "-1"], "--timeout must be a number of seconds >= 0, not '-1'"),
        (["worker", "a:app", "--processes", "0"], "--processes must be an int >= 1, not '0'"),
        (["worker", "a:app", "--threads", "0"], "--threads must be an int >= 1, not '0'"),
        (
            ["worker", "a:app", "--metrics-port", "70000"],
            "--metrics-port must be a port number from 1 to 65535, not '70000'",
        ),
        (["phrasecount", "--processes", "-1"], "--processes must be an int >= 0, not '-1'"),
        (["demo", "--threads", "0"], "--threads must be an int >= 1, not '0'"),
        (["status", "--bogus"], "unrecognized arguments: --bogus (see percolite status --help)"),
        (["status", "a", "b"], "unrecognized arguments: b (see percolite status --help)"),
        (["status", "--db"], "--db: expected one argument (see percolite status --help)"),
        (
            ["status", "--json", "--prometheus"],
            "--prometheus: not allowed with argument --json (see percolite status --help)",
        ),
        (
            ["worker"],
            "the following arguments are required: MODULE:APP (see percolite worker --help)",
        ),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(cli, argv, line):
    status, out, err = cli(*argv)
    assert status == 2
    assert one_line(err) == f"percolite: {line}"


def test_a_bad_argument_of_python_m_percolite_too(tmp_path):
    result = run_command([sys.executable, "-m", "percolite", "scan", "--limit", "x"], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == "percolite: --limit must be an int >= 0, not 'x'\n"


# -- status: a summary of parked work, the details behind --verbose ---------------


def park_work(db) -> None:
    """Parked work of two observers, one of them failing two ways, and a
    combine queue's poison key: 7 items in 4 (observer, error type) groups."""
    app = percolite.App("parking")

    @app.observer(("doc", "a"), max_attempts=1, name="alpha")
    def alpha(tx, row, column):
        if row.startswith(b"k"):
            raise KeyError(row.decode())
        raise ValueError(f"bad {row.decode()}")

    @app.observer(("doc", "b"), max_attempts=1, name="beta")
    def beta(tx, row, column):
        raise RuntimeError("beta fails")

    def combiner(key, values):
        if key == "bad":
            raise ValueError(f"cannot combine {key}")
        return sum(values)

    counts = app.combine_queue("counts", buckets=1, combiner=combiner, max_attempts=1)
    with percolite.open(db, app=app, sync="none") as env:
        with env.transaction() as tx:
            for row in ("v1", "v2", "v3", "k1"):
                tx.set(row, ("doc", "a"), "x")
            for row in ("b1", "b2"):
                tx.set(row, ("doc", "b"), "x")
            counts.add(tx, {"good": 1, "bad": 1})
        env.start_workers(2, retry_initial=0.005, retry_max=0.02)
        with pytest.raises(percolite.WorkParked, match="7 in all"):
            env.wait(timeout=60)


def test_status_sums_parked_work_up_with_one_traceback_per_observer_and_error(cli, tmp_path):
    db = tmp_path / "a store"
    park_work(db)
    status, out, err = cli("status", "--db", db)
    assert status == 0, err
    assert "parked:  7 (notifications and queue keys)" in out
    assert out.count("Traceback (most recent call last)") == 4
    summary = out[out.index("parked work, by observer and error (every item: --verbose):") :]
    lines = [line for line in summary.splitlines() if not line.startswith("      ")]
    # Which of a group's items is shown, and when it failed, vary from run to run.
    shown = [re.sub(r"'([vb])\d'", r"'\1N'", line) for line in lines]
    shown = [re.sub(r"the last at [-0-9]+ [:0-9]+", "the last at T", line) for line in shown]
    quoted = shlex.quote(str(db))
    assert shown == [
        "parked work, by observer and error (every item: --verbose):",
        "  observer 'alpha': 1 notification parked after KeyError, such as row 'k1' column "
        "'doc:a' (1 attempt, the last at T):",
        "  observer 'alpha': 3 notifications parked after ValueError, such as row 'vN' column "
        "'doc:a' (1 attempt, the last at T):",
        "  observer 'beta': 2 notifications parked after RuntimeError, such as row 'bN' column "
        "'doc:b' (1 attempt, the last at T):",
        "  combine queue 'counts': 1 key parked after ValueError, such as key 'bad' "
        "(1 attempt, the last at T):",
        f"once the cause is fixed, run it again: percolite retry --db {quoted}",
        f"  only observer 'alpha': percolite retry --db {quoted} --observer alpha",
        f"  only observer 'beta': percolite retry --db {quoted} --observer beta",
        f"  only combine queue 'counts': percolite retry --db {quoted} --queue counts",
    ]
    assert "ValueError: bad v" in summary and "RuntimeError: beta fails" in summary

    # Every item with its traceback, as before.
    status, verbose, err = cli("status", db, "--verbose")
    assert status == 0, err
    assert verbose.count("Traceback (most recent call last)") == 7
    assert "parked: observer 'alpha' on row 'v2' column 'doc:a' after 1 attempt, last" in verbose
    assert "parked: combine queue counts key 'bad' after 1 attempt, last" in verbose
    assert verbose.splitlines()[-4:] == lines[5:]
    # `percolite -v status` is still the log level.
    assert cli("-v", "status", db)[1] == out

    # The command printed retries the parked work.
    status, out, err = cli(*shlex.split(lines[5].split(": ", 1)[1])[1:])
    assert (status, out) == (0, "retried 7 parked items; run the workers\n"), err


def test_status_json_lists_the_parked_work_as_before(cli, tmp_path):
    db = tmp_path / "db"
    park_work(db)
    status, out, err = cli("status", db, "--json")
    parsed = json.loads(out)
    assert parsed["parked"] == 7 and len(parsed["parked_work"]) == 7
    assert "once the cause is fixed" not in out


def test_status_of_a_store_with_nothing_parked_names_no_retry(cli, tmp_path):
    with percolite.open(tmp_path / "db", sync="none"):
        pass
    status, out, err = cli("status", tmp_path / "db")
    assert status == 0 and "parked:  0" in out
    assert "parked work" not in out and "percolite retry" not in out


def test_the_mistakes_table_is_the_documented_one():
    """docs/operations.md has one row per kind of mistake, with its exit status."""
    from pathlib import Path

    from percolite._cli import MISTAKES

    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    rows = dict(re.findall(r"^\| ([^|`]+) \| .* \| (\d+) \|$", text, re.M))
    assert rows == {"done": "0", **{m.kind: str(m.status) for m in MISTAKES}}


def test_status_of_a_postgresql_store_in_the_environment(cli, postgres_server, monkeypatch):
    """The retry command printed never carries the password: the store
    stays in $PERCOLITE_DB, where status found it."""
    target = f"{postgres_server.uri}&password=s3cret&schema=parked_in_pg"
    park_work(target)
    monkeypatch.setenv(TARGET_VARIABLE, target)
    status, out, err = cli("status")
    assert status == 0, err
    assert "s3cret" not in out + err
    assert out.count("Traceback (most recent call last)") == 4
    assert "once the cause is fixed, run it again: percolite retry\n" in out
    assert out.endswith("  (with the store in $PERCOLITE_DB)\n")
    assert cli("retry")[:2] == (0, "retried 7 parked items; run the workers\n")
    # The server it reaches, and no reconnection yet by any process.
    server = f"{postgres_server.socket_dir}:{postgres_server.port}"
    assert f"\nserver:  {server} (0 reconnections, 0 failovers, every process)\n" in out


def test_status_of_a_local_store_names_no_server(cli, tmp_path):
    with percolite.open(tmp_path / "db") as env:
        assert env.status()["server"] is None
        assert "reconnections" not in env.stats()
    status, out, err = cli("status", "--db", tmp_path / "db")
    assert status == 0, err
    assert "server:" not in out


# -- wait: parked work and blocked queues, through the table ----------------------


def test_wait_exits_3_on_parked_work(cli, tmp_path):
    park_work(tmp_path / "db")
    status, out, err = cli("wait", "--db", tmp_path / "db", "--quiet")
    assert status == 3
    assert one_line(err).startswith("percolite: nothing left to run but parked work, 7 in all (")


def test_wait_exits_4_when_a_sink_refuses_the_store(cli, tmp_path):
    app = percolite.App("refused")

    def refuse(entries):
        raise percolite.SinkRefused("this sink belongs to another store")

    queue = app.export_queue("out", refuse, value_codec="int64")
    with percolite.open(tmp_path / "db", app=app, sync="none") as env:
        with env.transaction() as tx:
            queue.add(tx, "k", 1)
        env.start_workers(1, retry_initial=0.005, retry_max=0.02)
        with pytest.raises(percolite.SinkBlocked):
            env.wait(timeout=60)
    status, out, err = cli("wait", "--db", tmp_path / "db", "--quiet")
    assert status == 4
    assert one_line(err).startswith(
        "percolite: nothing left to run but export queue 'out' blocked by a sink that refuses "
        "this store (this sink belongs to another store)"
    )


@pytest.mark.parametrize(
    "error, kind, status",
    [
        (percolite.SinkBlocked("blocked"), "only parked work and blocked export queues left", 4),
        (percolite.WorkParked("parked"), "only parked work left", 3),
        (percolite.CorruptionError("bad page"), "the store is damaged", 1),
        (percolite.StorageError("disk full"), "another error", 1),
        (percolite.StorageError("cannot connect to x:\n\tdown"), "the server cannot be reached", 1),
        (ConnectionError("cannot connect to PostgreSQL at x"), "the server cannot be reached", 1),
        (percolite.AppMismatch("bound to app 'a'"), "another error", 1),
        (ValueError("--metrics-port 1: in use"), "a bad argument or option value", 2),
        (FileNotFoundError("no such directory"), "another error", 1),
        (ImportError("pip install psycopg"), "another error", 1),
        (KeyboardInterrupt(), "interrupted (Ctrl-C)", 130),
    ],
)
def test_what_a_raised_exception_reports(error, kind, status):
    from percolite._cli import explain

    failure = explain(error, "/some/store")
    assert (failure.mistake.kind, failure.mistake.status) == (kind, status)
    assert str(failure) == ("" if kind.startswith("interrupted") else " ".join(str(error).split()))


def test_a_bug_keeps_its_traceback():
    from percolite._cli import explain

    assert explain(RuntimeError("a bug"), "/some/store") is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["scan", "{db}", "--limit", "-1"], "--limit must be an int >= 0, not '-1'"),
        (["wait", "{db}", "--timeout", "nan"], "--timeout must be a number of seconds >= 0"),
        (["phrasecount", "--threads", "0", "--db", "{db}"], "--threads must be an int >= 1"),
        (["phrasecount", "--processes", "-1", "--db", "{db}"], "--processes must be an int >= 0"),
        (["worker", "badmod:app", "--db", "{db}"], "importing 'badmod' raised RuntimeError: boom"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, argv, message):
    db = tmp_path / "db"
    with percolite.open(db, sync="none"):
        pass
    (tmp_path / "badmod.py").write_text("raise RuntimeError('boom')\n")
    args = [a.format(db=db) for a in argv]
    result = run_command([sys.executable, "-m", "percolite", *args], cwd=tmp_path, timeout=30)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"percolite: {message}"] or (
        len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    )
