"""Workers: Python observers on C++ threads, several worker processes, a worker
killed mid-run, wait/stop/close while observers run, and the CLI.

Anything that runs workers does so in a child process with a timeout
(``_isolated``), so a deadlock fails fast. The test process itself only opens
stores to load data and read results (no workers).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import percolite
import pytest
from _isolated import run_command, run_isolated_json

CONTENT = ("doc", "content")

# The application every worker process imports (``wordcount_app:app``). Each
# committed run leaves, in its own transaction: the document's word count, an
# increment of one shard of the total, an increment of a per-row run counter,
# and one marker cell with a unique qualifier whose value is the worker's pid.
APP_SOURCE = """
import os, time, uuid, zlib
import percolite

app = percolite.App("wordcount")
SLEEP = float(os.environ.get("OBSERVER_SLEEP", "0"))

@app.observer(("doc", "content"), notify=percolite.STRONG, name="count_words")
def count_words(tx, row, column):
    words = len(tx.get(row, column).decode().split())
    tx.set(row, ("doc", "words"), str(words))
    shard = ("total", str(zlib.crc32(row) % 8))
    tx.set("totals", shard, str(int(tx.get("totals", shard, b"0")) + words))
    tx.set(row, ("obs", "runs"), str(int(tx.get(row, ("obs", "runs"), b"0")) + 1))
    tx.set(row, ("obs", "run:" + uuid.uuid4().hex), str(os.getpid()))
    if SLEEP:
        time.sleep(SLEEP)

@app.observer(("doc", "event"), notify=percolite.STRONG, name="log_event")
def log_event(tx, row, column):
    # Writes only a cell no other run writes: nothing but the notification's
    # ack cell keeps two concurrent runs of one notification from both committing.
    tx.set(row, ("log", uuid.uuid4().hex), str(os.getpid()))
    if SLEEP:
        time.sleep(SLEEP)

@app.observer(("q", "bucket"), notify=percolite.WEAK, name="drain")
def drain(tx, row, column):
    tx.set(row, ("q", "drained"), "yes")
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "app"
    directory.mkdir()
    (directory / "wordcount_app.py").write_text(APP_SOURCE)
    return directory


def load_app(app_dir: Path) -> percolite.App:
    """The same app in the test process (only to bind it when loading data)."""
    spec = importlib.util.spec_from_file_location(
        f"wordcount_app_{abs(hash(app_dir))}", app_dir / "wordcount_app.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.app


WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def make_documents(n: int, seed: int = 7) -> dict:
    rng = random.Random(seed)
    return {
        f"doc:{i:05}": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
        for i in range(n)
    }


def load_documents(db: Path, app_dir: Path, documents: dict, events: bool = False) -> None:
    """Sets each document's content; with ``events``, its ("doc", "event") too."""
    with percolite.open(db, app=load_app(app_dir), sync="none") as env:
        items = list(documents.items())
        for start in range(0, len(items), 200):
            with env.transaction() as tx:
                for row, text in items[start : start + 200]:
                    tx.set(row, CONTENT, text)
                    if events:
                        tx.set(row, ("doc", "event"), "happened")


def read_results(db: Path) -> dict:
    """Word counts, run counters, markers (pids) and logged events per row,
    shard totals, pending notifications."""
    words, counters, markers, totals, events = {}, {}, {}, {}, {}
    with percolite.open(db, sync="none") as env:
        with env.transaction() as tx:
            for row, column, value in tx.scan():
                r = row.decode()
                if column == (b"doc", b"words"):
                    words[r] = int(value)
                elif column == (b"obs", b"runs"):
                    counters[r] = int(value)
                elif column.family == b"obs" and column.qualifier.startswith(b"run:"):
                    markers.setdefault(r, []).append(int(value))
                elif column.family == b"log":
                    events[r] = events.get(r, 0) + 1
                elif r == "totals":
                    totals[column.qualifier.decode()] = int(value)
        pending = env.status()["pending"]
    return {
        "words": words,
        "counters": counters,
        "markers": markers,
        "totals": totals,
        "events": events,
        "pending": pending,
    }


def reference(documents: dict) -> tuple:
    words = {row: len(text.split()) for row, text in documents.items()}
    return words, sum(words.values())


def worker_command(db: Path, *extra: str) -> list:
    app = "wordcount_app:app"
    return [sys.executable, "-m", "percolite", "worker", app, "--db", str(db), *extra]


def cli(*args: str) -> list:
    return [sys.executable, "-m", "percolite", *args]


def environment(**extra: str) -> dict:
    return dict(os.environ, **extra)


def assert_exactly_once(results: dict, documents: dict) -> None:
    words, total = reference(documents)
    assert results["pending"] == 0
    assert results["words"] == words
    not_once = {
        row: (results["counters"].get(row), len(results["markers"].get(row, [])))
        for row in documents
        if results["counters"].get(row) != 1 or len(results["markers"].get(row, [])) != 1
    }
    assert not_once == {}, "exactly one committed run per notified row"
    assert sum(results["totals"].values()) == total


# -- Python observers on C++ worker threads -----------------------------------


def test_observers_run_on_worker_threads_concurrently(tmp_path):
    result = run_isolated_json(
        """
        import json, threading, time
        import percolite

        app = percolite.App()
        lock = threading.Lock()
        idents, running, most = set(), [0], [0]

        @app.observer(("doc", "content"))
        def slow(tx, row, column):
            with lock:
                idents.add(threading.get_ident())
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)  # releases the GIL: other observers may run
            with lock:
                running[0] -= 1
            tx.set(row, ("doc", "done"), "1")

        env = percolite.open(DB, app=app, sync="none")
        with env.transaction() as tx:
            for i in range(40):
                tx.set(f"doc:{i:02}", ("doc", "content"), "x")
        env.start_workers(4)
        # The main thread keeps running Python while the observers run.
        ticks = 0
        while not env.wait(timeout=0.01):
            ticks += 1
        threads = env.status()["workers"]["threads"]
        env.stop_workers()
        with env.transaction() as tx:
            done = sum(1 for _ in tx.scan(columns=[("doc", "done")]))
        print(json.dumps({
            "main": threading.get_ident(), "idents": sorted(idents), "most": most[0],
            "done": done, "ticks": ticks, "threads": threads,
        }))
        env.close()
        """,
        DB=tmp_path / "db",
    )
    assert result["done"] == 40
    assert result["main"] not in result["idents"], "observers run on worker threads"
    assert result["threads"] == 4
    assert len(result["idents"]) == 4, "all four worker threads ran observers"
    assert result["most"] == 4, "four observers ran at the same time"
    assert result["ticks"] > 0, "the main thread ran while the observers did"


# -- several worker processes -------------------------------------------------


def test_two_worker_processes_commit_each_notification_once(tmp_path, app_dir):
    db = tmp_path / "db"
    documents = make_documents(400)
    load_documents(db, app_dir, documents)
    done = run_command(
        worker_command(db, "--processes", "2", "--threads", "4", "--until-idle"),
        cwd=app_dir,
        env=environment(OBSERVER_SLEEP="0.001"),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    results = read_results(db)
    assert_exactly_once(results, documents)
    pids = {pid for pids in results["markers"].values() for pid in pids}
    assert len(pids) == 2, "both worker processes took their share"


def test_overlapping_worker_processes_still_commit_each_notification_once(tmp_path, app_dir):
    """Two worker processes that both take every notification (no sharing), so
    they often run one notification at the same time. count_words runs also
    collide on the cells they write; log_event runs write only unique cells,
    so for them the notification's ack cell alone must stop the second commit."""
    db = tmp_path / "db"
    documents = make_documents(300)
    load_documents(db, app_dir, documents, events=True)
    command = worker_command(db, "--threads", "4", "--until-idle")
    env = environment(OBSERVER_SLEEP="0.003")
    workers = [
        subprocess.Popen(
            command,
            cwd=app_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = []
    try:
        for worker in workers:
            outputs.append(worker.communicate(timeout=60))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
    assert [w.returncode for w in workers] == [0, 0], outputs
    results = read_results(db)
    assert_exactly_once(results, documents)
    logged_not_once = {row: n for row, n in results["events"].items() if n != 1}
    assert logged_not_once == {}, "two concurrent runs of one notification both committed"
    assert sorted(results["events"]) == sorted(documents)
    pids = {pid for pids in results["markers"].values() for pid in pids}
    assert pids == {w.pid for w in workers}, "both processes worked the same notifications"


def test_worker_killed_with_sigkill_loses_nothing(tmp_path, app_dir):
    db = tmp_path / "db"
    documents = make_documents(2000)
    load_documents(db, app_dir, documents)
    worker = subprocess.Popen(
        worker_command(db, "--threads", "4"),
        cwd=app_dir,
        env=environment(OBSERVER_SLEEP="0.002"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with percolite.open(db, sync="none") as env:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and worker.poll() is None:
                if env.status()["pending"] <= len(documents) - 300:
                    break
                time.sleep(0.005)
            assert worker.poll() is None, f"the worker exited early: {worker.stderr.read()}"
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
            pending_after_kill = env.status()["pending"]
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        worker.stderr.close()
    assert worker.returncode == -signal.SIGKILL
    assert 0 < pending_after_kill < len(documents), "killed after some but not all work"
    partial = read_results(db)
    assert 0 < len(partial["words"]) < len(documents)

    done = run_command(
        worker_command(db, "--threads", "4", "--until-idle"), cwd=app_dir, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert_exactly_once(read_results(db), documents)


# -- wait, stop_workers and close while observers run --------------------------

BUSY_APP = """
import json, threading, time, uuid
import percolite

app = percolite.App()
lock = threading.Lock()
in_progress = [0]
started = threading.Event()

@app.observer(("doc", "content"))
def busy(tx, row, column):
    with lock:
        in_progress[0] += 1
    started.set()
    try:
        time.sleep(SLEEP)
        sum(range(20000))  # holds the GIL for a while
        tx.set(row, ("obs", "runs"), str(int(tx.get(row, ("obs", "runs"), b"0")) + 1))
        tx.set(row, ("obs", "run:" + uuid.uuid4().hex), "1")
    finally:
        with lock:
            in_progress[0] -= 1

def load(env, n):
    for start in range(0, n, 10):
        with env.transaction() as tx:
            for i in range(start, min(n, start + 10)):
                tx.set(f"doc:{i:04}", ("doc", "content"), "x")

def runs(env):
    out = {}
    with env.transaction() as tx:
        for row, column, value in tx.scan():
            if column == (b"obs", b"runs"):
                out.setdefault(row.decode(), [0, 0])[0] = int(value)
            elif column.family == b"obs":
                out.setdefault(row.decode(), [0, 0])[1] += 1
    return out
"""


def busy_child(code: str, tmp_path: Path, sleep: float, timeout: float = 40) -> dict:
    return run_isolated_json(
        BUSY_APP + textwrap.dedent(code), timeout=timeout, DB=tmp_path / "db", SLEEP=sleep
    )


def test_wait_while_observers_run_does_not_deadlock(tmp_path):
    result = busy_child(
        """
        env = percolite.open(DB, app=app, sync="none")
        env.start_workers(4)
        load(env, 300)
        idle = env.wait()
        env.stop_workers()
        r = runs(env)
        print(json.dumps({"idle": idle, "rows": len(r),
                          "once": all(v == [1, 1] for v in r.values()),
                          "pending": env.status()["pending"]}))
        env.close()
        """,
        tmp_path,
        sleep=0.002,
    )
    assert result == {"idle": True, "rows": 300, "once": True, "pending": 0}


def test_stop_workers_while_observers_run_does_not_deadlock(tmp_path):
    result = busy_child(
        """
        env = percolite.open(DB, app=app, sync="none")
        load(env, 200)
        env.start_workers(4)
        assert started.wait(20)
        env.stop_workers()
        after_stop = {"in_progress": in_progress[0], "running": env.workers_running,
                      "active": env.status()["workers"]["active"],
                      "pending": env.status()["pending"], "rows": len(runs(env))}
        env.stop_workers()  # idempotent
        totals = env.process(threads=4, timeout=30)
        r = runs(env)
        print(json.dumps({"after_stop": after_stop, "idle": totals["idle"], "rows": len(r),
                          "once": all(v == [1, 1] for v in r.values()),
                          "pending": env.status()["pending"]}))
        env.close()
        """,
        tmp_path,
        sleep=0.02,
    )
    after_stop = result["after_stop"]
    assert after_stop["in_progress"] == 0, "stop_workers lets running observers finish"
    assert after_stop["running"] is False
    assert after_stop["active"] == 0
    assert after_stop["pending"] > 0, "stopped before the work was done"
    assert after_stop["rows"] + after_stop["pending"] == 200
    assert result["idle"] is True
    assert result["rows"] == 200
    assert result["once"] is True
    assert result["pending"] == 0


def test_close_while_observers_run_does_not_deadlock(tmp_path):
    result = busy_child(
        """
        env = percolite.open(DB, app=app, sync="none")
        load(env, 200)
        env.start_workers(4)
        assert started.wait(20)
        env.close()
        after_close = {"in_progress": in_progress[0], "closed": env.closed}
        try:
            env.wait(timeout=1)
        except percolite.ClosedError:
            after_close["wait"] = "ClosedError"
        env = percolite.open(DB, app=app, sync="none")
        after_close["pending"] = env.status()["pending"]
        after_close["rows"] = len(runs(env))
        totals = env.process(threads=4, timeout=30)
        r = runs(env)
        print(json.dumps({"after_close": after_close, "idle": totals["idle"], "rows": len(r),
                          "once": all(v == [1, 1] for v in r.values()),
                          "pending": env.status()["pending"]}))
        env.close()
        """,
        tmp_path,
        sleep=0.02,
    )
    after_close = result["after_close"]
    assert after_close["in_progress"] == 0, "close drains running observers"
    assert after_close["closed"] is True
    assert after_close.get("wait") == "ClosedError", "wait() on the closed handle must raise"
    assert after_close["pending"] > 0, "closed before the work was done"
    assert after_close["rows"] + after_close["pending"] == 200
    assert result == dict(result, idle=True, rows=200, once=True, pending=0)


def test_close_from_another_thread_while_wait_blocks(tmp_path):
    result = busy_child(
        """
        env = percolite.open(DB, app=app, sync="none")
        load(env, 200)
        env.start_workers(2)
        assert started.wait(20)
        closer = threading.Timer(0.1, env.close)
        closer.start()
        began = time.monotonic()
        try:
            outcome = "returned " + str(env.wait(timeout=20))
        except percolite.ClosedError:
            outcome = "ClosedError"
        elapsed = time.monotonic() - began
        closer.join()
        print(json.dumps({"outcome": outcome, "in_progress": in_progress[0],
                          "closed": env.closed, "elapsed": elapsed}))
        """,
        tmp_path,
        sleep=0.02,
    )
    assert result["closed"] is True
    assert result["in_progress"] == 0
    # wait() on a handle closed under it ends (it must not wait out its timeout).
    assert result["outcome"] in ("ClosedError", "returned False")
    assert result["elapsed"] < 10


def test_interpreter_exit_with_observers_running_does_not_hang(tmp_path):
    """A script that starts workers and simply ends: atexit stops them."""
    busy_child(
        """
        env = percolite.open(DB, app=app, sync="none")
        load(env, 200)
        env.start_workers(4)
        assert started.wait(20)
        print(json.dumps({}))
        # no stop_workers(), no close(): the interpreter exits with observers running
        """,
        tmp_path,
        sleep=0.02,
        timeout=30,
    )
    result = busy_child(
        """
        env = percolite.open(DB, app=app, sync="none")
        before = len(runs(env))
        pending = env.status()["pending"]
        totals = env.process(threads=4, timeout=30)
        r = runs(env)
        print(json.dumps({"before": before, "pending": pending, "rows": len(r),
                          "once": all(v == [1, 1] for v in r.values())}))
        env.close()
        """,
        tmp_path,
        sleep=0.0,
    )
    assert result["before"] + result["pending"] == 200
    assert result["rows"] == 200
    assert result["once"] is True


def test_wait_is_interruptible_while_an_observer_keeps_failing(tmp_path):
    result = run_isolated_json(
        """
        import json, os, signal, threading, time
        import percolite

        app = percolite.App()

        @app.observer(("doc", "content"))
        def never(tx, row, column):
            raise RuntimeError("never succeeds")

        env = percolite.open(DB, app=app, sync="none")
        with env.transaction() as tx:
            tx.set("doc:1", ("doc", "content"), "x")
        env.start_workers(2, retry_initial=0.01, retry_max=0.05)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        began = time.monotonic()
        try:
            env.wait()  # no timeout: only Ctrl-C ends it
            outcome = "returned"
        except KeyboardInterrupt:
            outcome = "KeyboardInterrupt"
        elapsed = time.monotonic() - began
        env.close()
        print(json.dumps({"outcome": outcome, "elapsed": elapsed}))
        """,
        DB=tmp_path / "db",
        timeout=30,
    )
    assert result["outcome"] == "KeyboardInterrupt"
    assert result["elapsed"] < 5


@pytest.mark.parametrize("call", ["stop_workers", "close"])
def test_stop_workers_or_close_called_inside_an_observer_does_not_crash(tmp_path, call):
    """Regression guard: an observer that stops its own workers (or closes the
    store) must not take the process down; it may be refused with
    percolite.Error (a counted failure) or take effect."""
    result = run_isolated_json(
        """
        import json
        import percolite

        app = percolite.App()
        holder, outcomes = {}, []

        @app.observer(("doc", "content"))
        def stopper(tx, row, column):
            if not outcomes:
                try:
                    getattr(holder["env"], CALL)()
                    outcomes.append("returned")
                except percolite.Error as e:
                    outcomes.append("percolite.Error")
                    raise
                except BaseException as e:
                    outcomes.append(f"{type(e).__name__}: {e}")
                    raise
            tx.set(row, ("doc", "done"), "1")

        env = holder["env"] = percolite.open(DB, app=app, sync="none")
        with env.transaction() as tx:
            tx.set("doc:1", ("doc", "content"), "x")
        env.start_workers(2, retry_initial=0.01, retry_max=0.05)
        try:
            env.wait(timeout=10)
        except percolite.ClosedError:
            pass
        env.close()
        print(json.dumps({"outcomes": outcomes}))
        """,
        DB=tmp_path / "db",
        CALL=call,
        timeout=30,
    )
    assert result["outcomes"][:1] in (["returned"], ["percolite.Error"])


# -- the command line ----------------------------------------------------------


def load_cli_fixture(db: Path, app_dir: Path) -> None:
    with percolite.open(db, app=load_app(app_dir), sync="none") as env:
        with env.transaction() as tx:
            for i in range(3):
                tx.set(f"doc:{i}", CONTENT, "one two three")
            tx.set_weak_notification("bucket:7", ("q", "bucket"))


def test_cli_status_scan_and_wait(tmp_path, app_dir):
    db = tmp_path / "db"
    load_cli_fixture(db, app_dir)

    status = run_command(cli("status", str(db)), timeout=30)
    assert status.returncode == 0, status.stderr
    assert "pending: 4 notifications" in status.stdout
    lines = status.stdout.splitlines()
    count_words = [line for line in lines if "count_words" in line]
    drain = [line for line in lines if "drain" in line]
    assert len(count_words) == 1 and len(drain) == 1, status.stdout
    assert "doc:content" in count_words[0] and "strong" in count_words[0]
    assert count_words[0].rstrip().endswith("pending 3")
    assert "q:bucket" in drain[0] and "weak" in drain[0]
    assert drain[0].rstrip().endswith("pending 1")

    as_json = run_command(cli("status", str(db), "--json"), timeout=30)
    assert as_json.returncode == 0, as_json.stderr
    parsed = json.loads(as_json.stdout)
    assert parsed["pending"] == 4
    assert {o["name"]: o["pending"] for o in parsed["observers"]} == {
        "count_words": 3,
        "log_event": 0,
        "drain": 1,
    }

    scan = run_command(cli("scan", str(db), "--notifications"), timeout=30)
    assert scan.returncode == 0, scan.stderr
    listed = sorted(line.split("\t")[:2] for line in scan.stdout.splitlines())
    assert listed == [
        ["bucket:7", "q:bucket"],
        ["doc:0", "doc:content"],
        ["doc:1", "doc:content"],
        ["doc:2", "doc:content"],
    ]
    assert all(line.split("\t")[2].isdigit() for line in scan.stdout.splitlines())

    began = time.monotonic()
    busy = run_command(cli("wait", str(db), "--timeout", "1"), timeout=30)
    assert busy.returncode == 1, "work stays pending with no workers"
    assert time.monotonic() - began >= 1.0
    assert "still busy" in busy.stderr

    worker = run_command(worker_command(db, "--threads", "2", "--until-idle"), cwd=app_dir)
    assert worker.returncode == 0, worker.stderr

    idle = run_command(cli("wait", str(db), "--timeout", "5"), timeout=30)
    assert idle.returncode == 0, idle.stderr
    scan = run_command(cli("scan", str(db), "--notifications"), timeout=30)
    assert scan.returncode == 0 and scan.stdout == ""
    status = run_command(cli("status", str(db)), timeout=30)
    assert "pending: 0 notifications" in status.stdout


def test_cli_wait_returns_once_another_process_finished_the_work(tmp_path, app_dir):
    db = tmp_path / "db"
    documents = make_documents(200)
    load_documents(db, app_dir, documents)
    worker = subprocess.Popen(
        worker_command(db, "--threads", "4"),  # runs until told to stop
        cwd=app_dir,
        env=environment(OBSERVER_SLEEP="0.005"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        waited = run_command(cli("wait", str(db), "--timeout", "60", "--quiet"), timeout=90)
        results = read_results(db)  # read at once, while the worker still runs
        assert worker.poll() is None
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert waited.returncode == 0, waited.stderr
    assert_exactly_once(results, documents)
    assert worker.returncode == 0, err


def test_cli_scan_lists_every_pending_notification_across_chunks(tmp_path, app_dir):
    db = tmp_path / "db"
    rows = [f"doc:{i:04}" + ("x" * 700 if i % 7 == 0 else "") for i in range(600)]
    with percolite.open(db, app=load_app(app_dir), sync="none") as env:
        with env.transaction() as tx:
            for row in rows:
                tx.set(row, CONTENT, "x")
    scan = run_command(cli("scan", str(db), "--notifications", "--limit", "5000"), timeout=30)
    assert scan.returncode == 0, scan.stderr
    listed = [line.split("\t")[0] for line in scan.stdout.splitlines()]
    assert sorted(listed) == sorted(rows)
    limited = run_command(cli("scan", str(db), "--notifications", "--limit", "550"), timeout=30)
    assert len(limited.stdout.splitlines()) == 550


def test_sigterm_to_a_multi_process_worker_stops_its_worker_processes(tmp_path, app_dir):
    db = tmp_path / "db"
    load_documents(db, app_dir, make_documents(10))
    parent = subprocess.Popen(
        worker_command(db, "--processes", "2", "--threads", "1"),
        cwd=app_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the parent and its worker processes share this group
    )
    group = parent.pid
    try:
        with percolite.open(db, sync="none") as env:
            assert env.wait(timeout=30), "the worker processes did not do the work"
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 5
        left = True
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                left = False
                break
            time.sleep(0.05)
        assert not left, "worker processes kept running after their parent got SIGTERM"
        assert parent.returncode == 0, parent.stderr.read()
    finally:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if parent.poll() is None:
            parent.wait()
        parent.stderr.close()
