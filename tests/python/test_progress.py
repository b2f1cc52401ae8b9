"""Progress bars: tqdm when it is installed, nothing when it is not."""

from __future__ import annotations

import io
import time

import percolite
import pytest
from _bad_input import entry_point_params, refuses_bad_input
from percolite import _progress

CONTENT = ("doc", "content")


def slow_app() -> percolite.App:
    app = percolite.App()

    @app.observer(CONTENT)
    def index(tx, row, column):
        time.sleep(0.002)  # slow enough that wait() finds work pending
        tx.set(row, ("doc", "out"), "1")

    return app


def test_wait_draws_a_tqdm_bar_of_the_notifications_run(capsys):
    with percolite.open(":memory:", app=slow_app()) as env:
        with env.transaction() as tx:
            for i in range(200):
                tx.set(f"r{i}", CONTENT, "x")
        result = env.process(2, progress=True)
    assert result["commits"] == 200
    err = capsys.readouterr().err
    assert "notifications done" in err and "100%" in err


def test_progress_without_tqdm_draws_nothing(monkeypatch, capsys):
    monkeypatch.setattr(_progress, "available", lambda: False)
    with percolite.open(":memory:", app=slow_app()) as env:
        with env.transaction() as tx:
            tx.set("r", CONTENT, "x")
        assert env.process(1, progress=True)["commits"] == 1
    assert capsys.readouterr().err == ""


def test_a_falling_count_grows_its_total_when_work_arrives():
    stream = io.StringIO()
    bar = _progress.Progress("left", enabled=True, stream=stream)
    bar.remaining(10)
    bar.remaining(4)  # 6 done
    bar.remaining(9)  # 5 more arrived: 6 of 15
    assert (bar.bar.n, bar.bar.total) == (6, 15)
    bar.remaining(0)
    assert (bar.bar.n, bar.bar.total) == (15, 15)
    bar.close()
    assert "left" in stream.getvalue()


@pytest.mark.parametrize("enabled", [False, "auto"])
def test_disabled_or_auto_off_a_terminal_draws_nothing(enabled, monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)  # not in a notebook
    stream = io.StringIO()  # not a terminal
    bar = _progress.Progress("x", enabled=enabled, stream=stream)
    bar.advance(5)
    bar.remaining(3)
    bar.close()
    assert stream.getvalue() == ""


def test_phrasecount_draws_loading_and_working_bars(tmp_path):
    from percolite.phrasecount import cli

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(20):
        (docs / f"d{i}.txt").write_text(f"one two three four five {i} six seven")
    stream = io.StringIO()
    summary = cli.run([str(docs)], tmp_path / "db", progress=True, stream=stream, threads=2)
    assert summary.documents == 20
    text = stream.getvalue()
    assert "documents read" in text and "notifications done" in text


# -- bad input: the progress option --------------------------------------------

ENTRY_POINT_CASES = [
    # (id, call(env, tmp_path, app objects), exception, message pattern)
    (
        "wait-progress-str",
        lambda env, d, q: env.wait(timeout=0, progress="maybe"),
        ValueError,
        r"progress must be True, False or 'auto', not 'maybe'",
    ),
    (
        "process-progress-int",
        lambda env, d, q: env.process(progress=5),
        ValueError,
        r"progress must be True, False or 'auto', not 5",
    ),
]


@pytest.mark.parametrize("call, error, pattern", entry_point_params(ENTRY_POINT_CASES))
def test_entry_points_refuse_bad_input_and_change_nothing(tmp_path, call, error, pattern):
    refuses_bad_input(tmp_path, call, error, pattern)
