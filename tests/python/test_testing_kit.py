"""percolite.testing: run_until_idle and the pytest plugin's fixtures.

run_until_idle runs an app's work in the calling thread, one run at a time,
until nothing is pending: observers chained through several columns, a
combine queue folding into an export queue and its exporter. The fixtures
come from the installed package's pytest11 entry point: a test file in a
directory of its own, with no conftest, uses them under plain pytest."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import percolite
import pytest
from children.simulation import failing_export_app
from percolite.testing import RunSummary, StuckError, run_until_idle

TEXT = ("doc", "text")
WORDS = ("doc", "words")


def word_count_app(calls: list | None = None, exported: list | None = None) -> percolite.App:
    """Documents -> their words, counted by a combine queue (native sum)
    whose changes an export queue sends to ``exported``."""
    app = percolite.App("wordcount")
    counts = app.combine_queue("counts", buckets=4, combiner="sum", value_codec="int64")

    @app.export_queue("out", buckets=2, value_codec="int64")
    def out(entries):
        if exported is not None:
            exported.extend((e.key, e.value, e.seq) for e in entries)

    counts.export_to(out)

    @app.observer(TEXT)
    def split(tx, row, col):
        if calls is not None:
            calls.append(bytes(row))
        words = tx.get(row, col).decode().split()
        tx.set(row, WORDS, str(len(words)))
        counts.add(tx, {w: 1 for w in words})

    app.counts = counts  # type: ignore[attr-defined]
    return app


DOCS = {f"doc{i:02}": " ".join(f"w{(i * j) % 7}" for j in range(1, 6)) for i in range(30)}


def load(env: percolite.Env) -> None:
    for name, text in DOCS.items():
        env.run(lambda tx, name=name, text=text: tx.set(name, TEXT, text))


def expected_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for text in DOCS.values():
        for word in set(text.split()):
            counts[word] = counts.get(word, 0) + 1
    return counts


def test_run_until_idle_runs_observers_queues_and_exporters_to_exact_values(percolite_app_env):
    exported: list = []
    app = word_count_app(exported=exported)
    env = percolite_app_env(app)
    load(env)
    summary = run_until_idle(env)
    assert isinstance(summary, RunSummary)
    assert summary.failures == summary.parked == summary.conflicts == 0
    # 30 observer runs, then folds and exports: every run committed.
    assert summary.runs == summary.commits > len(DOCS)
    assert env.status(queues=False)["pending"] == 0
    with env.transaction() as tx:
        assert {k: app.counts.get(tx, k) for k in expected_counts()} == expected_counts()
        assert tx.get("doc00", WORDS) == b"5"
    newest = {}
    for key, value, _seq in sorted(exported, key=lambda e: e[2]):
        newest[key] = value
    assert newest == expected_counts()
    assert run_until_idle(env) == RunSummary(0, 0, 0, 0, 0, 0), "idle: nothing more runs"


def test_the_same_store_runs_in_the_same_order(percolite_app_env):
    orders = []
    for _ in range(2):
        calls: list = []
        env = percolite_app_env(word_count_app(calls=calls))
        load(env)
        run_until_idle(env)
        orders.append(calls)
    assert orders[0] == orders[1]
    assert sorted(orders[0]) == sorted(name.encode() for name in DOCS)


def test_observers_run_in_the_calling_thread():
    app = percolite.App("threads")
    seen = []

    @app.observer(TEXT)
    def where(tx, row, col):
        seen.append(threading.get_ident())

    with percolite.open(backend="memory", app=app) as env:
        env.run(lambda tx: tx.set("a", TEXT, "x"))
        run_until_idle(env)
    assert seen == [threading.get_ident()]


def test_same_values_as_real_workers_on_lmdb(tmp_path, percolite_app_env):
    simulated = percolite_app_env(word_count_app())
    load(simulated)
    run_until_idle(simulated)
    app = word_count_app()
    with percolite.open(tmp_path / "db", sync="none", app=app) as env:
        load(env)
        env.process(threads=4)
        with env.transaction() as tx, simulated.transaction() as sim:
            words = expected_counts()
            assert {w: app.counts.get(tx, w) for w in words} == {
                w: app.counts.get(sim, w) for w in words
            }


def failing_app(max_attempts: int = 3) -> percolite.App:
    app = percolite.App("failing")

    @app.observer(TEXT, max_attempts=max_attempts)
    def broken(tx, row, col):
        raise KeyError(f"no such thing in {bytes(row)!r}")

    return app


def test_an_observers_exception_is_raised_to_the_test(percolite_app_env):
    env = percolite_app_env(failing_app())
    env.run(lambda tx: tx.set("r", TEXT, "x"))
    with pytest.raises(KeyError, match="no such thing in b'r'"):
        run_until_idle(env)
    assert env.status(queues=False)["pending"] == 1  # still pending, the failure recorded
    (history,) = env.failures().values()
    assert history["failures"] == 1 and history["last_error"]["type"] == "KeyError"


def test_without_raise_errors_failures_are_retried_then_parked(percolite_app_env):
    env = percolite_app_env(failing_app(max_attempts=3))
    env.run(lambda tx: tx.set("r", TEXT, "x"))
    summary = run_until_idle(env, raise_errors=False)
    assert (summary.runs, summary.failures, summary.parked, summary.commits) == (3, 3, 1, 0)
    assert [record["row"] for record in env.parked()] == [b"r"]


def test_an_exporter_failing_is_raised_too(percolite_app_env):
    env = percolite_app_env(failing_export_app())
    env.run(lambda tx: tx.set("r", TEXT, "x"))
    with pytest.raises(ValueError, match="sink refuses the entry"):
        run_until_idle(env)


def test_an_observer_that_notifies_itself_is_stuck(percolite_app_env):
    app = percolite.App("loop")

    @app.observer(TEXT)
    def again(tx, row, col):
        tx.set(row, col, "again")

    env = percolite_app_env(app)
    env.run(lambda tx: tx.set("spin", TEXT, "x"))
    stuck = r"not idle after 50 runs \(max_runs\): 1 notifications still pending: row 'spin' "
    with pytest.raises(StuckError, match=stuck + r"column 'doc:text' \(.*again\)\. Raise max_runs"):
        run_until_idle(env, max_runs=50)
    assert issubclass(StuckError, percolite.Error)


def test_refused_while_workers_run_and_inside_an_observer(tmp_path):
    app = percolite.App("inside")
    errors = []

    @app.observer(TEXT)
    def nested(tx, row, col):
        try:
            run_until_idle(opened)
        except percolite.Error as e:
            errors.append(str(e))

    with percolite.open(tmp_path / "db", sync="none", app=app) as opened:
        opened.start_workers(1)
        with pytest.raises(percolite.Error, match="workers run on this handle"):
            run_until_idle(opened)
        opened.run(lambda tx: tx.set("r", TEXT, "x"))
        assert opened.wait(timeout=30)
        opened.stop_workers()
    assert len(errors) == 1 and "inside an observer" in errors[0]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_runs": 0}, ValueError, "max_runs must be between 1 and"),
        ({"max_runs": 2**64}, ValueError, "max_runs must be between 1 and"),
        ({"max_runs": True}, TypeError, "max_runs must be an int, not bool"),
        ({"max_runs": "10"}, TypeError, "max_runs must be an int, not str"),
        ({"raise_errors": "yes"}, TypeError, "raise_errors must be True or False, not 'yes'"),
    ],
)
def test_bad_arguments(percolite_env, kwargs, error, match):
    with pytest.raises(error, match=match):
        run_until_idle(percolite_env, **kwargs)


def test_not_an_env():
    with pytest.raises(TypeError, match="needs a percolite.Env, not str"):
        run_until_idle("store")  # type: ignore[arg-type]


def test_queue_keys_parked_are_counted(percolite_app_env):
    env = percolite_app_env(failing_export_app(max_attempts=2))
    env.run(lambda tx: tx.set("r", TEXT, "x"))
    summary = run_until_idle(env, raise_errors=False)
    assert summary.parked == 1 and summary.failures >= 1
    assert len(env.parked()) == 1


def test_a_nested_refusal_keeps_the_outer_exception(percolite_app_env):
    """An observer that calls run_until_idle (refused) and then raises its
    own error: the test gets that error, not the refusal's text."""
    app = percolite.App("nested")

    @app.observer(TEXT)
    def nested(tx, row, col):
        with pytest.raises(percolite.Error):
            run_until_idle(env)
        raise ValueError("the observer's own error")

    env = percolite_app_env(app)
    env.run(lambda tx: tx.set("r", TEXT, "x"))
    with pytest.raises(ValueError, match="the observer's own error"):
        run_until_idle(env)


def test_two_threads_at_once_are_refused(tmp_path):
    app = percolite.App("slow")
    started = threading.Event()
    release = threading.Event()

    @app.observer(TEXT)
    def slow(tx, row, col):
        started.set()
        release.wait(10)

    errors = []
    with percolite.open(tmp_path / "db", sync="none", app=app) as env:
        env.run(lambda tx: tx.set("r", TEXT, "x"))
        first = threading.Thread(target=run_until_idle, args=(env,))
        first.start()
        assert started.wait(10)
        try:
            run_until_idle(env)
        except percolite.Error as e:
            errors.append(str(e))
        release.set()
        first.join(10)
    assert len(errors) == 1 and "already running on this handle in another thread" in errors[0]


def test_closed_env(percolite_env):
    percolite_env.close()
    with pytest.raises(percolite.ClosedError):
        run_until_idle(percolite_env)


# -- the plugin, as a user's project meets it --------------------------------

USER_TESTS = textwrap.dedent(
    """
    import percolite
    import pytest
    from percolite.testing import run_until_idle

    app = percolite.App("lengths")

    @app.observer(("doc", "text"))
    def measure(tx, row, col):
        tx.set(row, ("doc", "length"), str(len(tx.get(row, col))))

    def test_length(percolite_app_env):
        env = percolite_app_env(app)
        env.run(lambda tx: tx.set("doc1", ("doc", "text"), "hello"))
        run_until_idle(env)
        with env.transaction() as tx:
            assert tx.get("doc1", ("doc", "length")) == b"5"

    def test_no_app(percolite_env):
        percolite_env.run(lambda tx: tx.set("r", ("c", "q"), "v"))
        with percolite_env.transaction() as tx:
            assert tx.get("r", ("c", "q")) == b"v"
        print("BACKEND", percolite_env.path)

    @pytest.mark.percolite(backend="lmdb")
    def test_marked_lmdb(percolite_env):
        print("MARKED", percolite_env.path)
    """
)


def run_user_tests(directory, *options: str) -> subprocess.CompletedProcess:
    (directory / "test_user_app.py").write_text(USER_TESTS)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *options],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_users_tests_get_the_fixtures_with_no_conftest(tmp_path):
    done = run_user_tests(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    assert "BACKEND :memory:" in done.stdout
    marked = done.stdout.split("MARKED ", 1)[1].split()[0]
    assert marked.endswith("store") and "percolite" in marked
    assert not list(tmp_path.glob("**/data.mdb")), "stores are removed after the test"


def test_the_backend_option_opens_lmdb_stores(tmp_path):
    done = run_user_tests(tmp_path, "--percolite-backend=lmdb")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "BACKEND :memory:" not in done.stdout
    refused = run_user_tests(tmp_path, "--percolite-backend=sqlite")
    assert refused.returncode != 0 and "invalid choice: 'sqlite'" in refused.stderr


def test_a_bad_marker_is_a_usage_error(tmp_path):
    (tmp_path / "test_bad.py").write_text(
        "import pytest\n"
        "@pytest.mark.percolite(backend='oracle')\n"
        "def test_it(percolite_env):\n"
        "    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_bad.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "backend='oracle'): the backend must be one of 'memory', 'lmdb'" in (
        done.stdout + done.stderr
    )


def test_seeds_label_each_case_and_refuse_bad_counts():
    from percolite.testing import seeds

    cases = seeds(3, start=5)
    assert [case.values for case in cases] == [(5,), (6,), (7,)]
    assert [case.id for case in cases] == ["seed=5", "seed=6", "seed=7"]
    with pytest.raises(TypeError, match="n must be an int, not str"):
        seeds("3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="start must be an int, not bool"):
        seeds(3, start=True)
    with pytest.raises(ValueError, match="n must be >= 0, not -1"):
        seeds(-1)


def test_the_app_factory_refuses_what_is_not_an_app(percolite_app_env):
    with pytest.raises(TypeError, match="percolite_app_env needs a percolite.App, not str"):
        percolite_app_env("wordcount")
