"""The console in a real browser: Debian's headless Chromium, driven by its
chromedriver, opens ``percolite ui`` on a store whose app has a failing
observer, a combine queue with a backlog and an export queue, while a real
worker group (``percolite worker``) runs, and checks what a person sees.

A screenshot of each step is kept in the test's temporary directory (its
path is printed when a test fails)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import percolite
import pytest
from _postgres import both_servers
from children import POSTGRES_VARIABLE, console_app, store_target
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

TESTS = Path(__file__).parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT = 90  # seconds for anything the page should come to show


@pytest.fixture
def browser(tmp_path):
    for program in (CHROMIUM, CHROMEDRIVER):
        assert os.path.exists(program), (
            f"{program} is missing: scripts/bootstrap.sh installs Debian's chromium and "
            "chromium-driver"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,2400",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture
def shots(tmp_path):
    """Saves numbered screenshots in tmp_path (pytest shows where when the test fails)."""
    folder = tmp_path / "screenshots"
    folder.mkdir()
    taken = []

    def shoot(driver, name):
        path = folder / f"{len(taken) + 1:02d}-{name}.png"
        driver.save_screenshot(str(path))
        taken.append(path)
        return path

    print(f"console screenshots: {folder}")
    yield shoot


def wait_for(what, check, timeout=WAIT):
    """Polls ``check`` until it returns something true; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as e:  # noqa: BLE001 - the page is still drawing
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.2)
    raise AssertionError(f"the console never showed {what} (last: {last!r})")


def text(driver, selector):
    return driver.find_element(By.CSS_SELECTOR, selector).text


@contextlib.contextmanager
def ui(target):
    """``percolite ui TARGET --port 0``: yields the URL it printed."""
    with subprocess.Popen(
        [sys.executable, "-m", "percolite", "ui", target, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=TESTS,
    ) as child:
        try:
            url = child.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:"), (url, child.stderr.read())
            yield url
        finally:
            child.terminate()
            _out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err


@contextlib.contextmanager
def worker_group(target, environment, threads=2):
    """A real worker group: ``percolite worker children.console_app:app``."""
    env = dict(os.environ, **environment, PERCOLITE_DB=target)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    with subprocess.Popen(
        [sys.executable, "-m", "percolite", "worker", "children.console_app:app"]
        + ["--threads", str(threads)],
        env=env,
        cwd=TESTS,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            yield child
        finally:
            child.terminate()
            child.communicate(timeout=60)


def requested_origins(driver):
    """Every scheme://host the page's requests went to since the last call,
    from the browser's network log (the browser's own chrome:// pages, such
    as the blank tab it starts with, left out)."""
    origins = set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            parts = urllib.parse.urlsplit(message["params"]["request"]["url"])
            if parts.scheme not in ("data", "chrome"):
                origins.add(f"{parts.scheme}://{parts.netloc}")
    return origins


def test_an_operator_watches_the_work_drain_reads_the_failure_and_retries_it(
    browser, shots, tmp_path
):
    sink = str(tmp_path / "sink.jsonl")
    fixed = tmp_path / "fixed"
    db = str(tmp_path / "db")
    orders = 400
    with percolite.open(db, app=console_app.make_app(sink)) as env:
        console_app.load(env, orders, bad=2)
    with ui(db) as url:
        origin = "http://" + urllib.parse.urlsplit(url).netloc
        requested_origins(browser)  # what the blank tab asked, left out
        browser.get(url)
        browser.execute_script("window.stillTheSamePage = true;")
        wait_for("the backlog", lambda: text(browser, "#pending-count") == f"{orders + 2}")
        assert text(browser, "#parked-count") == "0"
        shots(browser, "backlog")

        seen = []
        environment = {"CONSOLE_SINK": sink, "CONSOLE_FIXED": str(fixed), "CONSOLE_DELAY": "0.01"}
        with worker_group(db, environment):

            def drained():
                shown = text(browser, "#pending-count").replace(",", "")
                if not seen or seen[-1] != shown:
                    seen.append(shown)
                return shown == "0"

            wait_for("the pending count falling to 0", drained)
            wait_for("the two parked failures", lambda: text(browser, "#parked-count") == "2")
            row = browser.find_element(By.CSS_SELECTOR, '#observers tr[data-name="count"]')
            assert "ValueError: cannot parse order bad" in row.text
            wait_for(
                "the worker group's lease",
                lambda: browser.find_elements(By.CSS_SELECTOR, "#groups tr[data-owner]"),
            )
            shots(browser, "drained")
            # The page drew every step itself: no reload, and counts in between.
            assert browser.execute_script("return window.stillTheSamePage === true;")
            counts = [int(s) for s in seen if s.isdigit()]
            assert counts[0] == orders + 2 and counts[-1] == 0
            assert any(0 < n < orders + 2 for n in counts), seen

            # The graph: nodes and the edges learned from the runs.
            nodes = wait_for(
                "the graph's nodes",
                lambda: (
                    {
                        e.get_attribute("data-node")
                        for e in browser.find_elements(By.CSS_SELECTOR, "#graph [data-node]")
                    }
                    >= {"family:order", "observer:count", "queue:totals", "queue:out", "sink:out"}
                    and {
                        e.get_attribute("data-node")
                        for e in browser.find_elements(By.CSS_SELECTOR, "#graph [data-node]")
                    }
                ),
            )
            assert "family:seen" in nodes
            edges = {
                e.get_attribute("data-edge")
                for e in browser.find_elements(By.CSS_SELECTOR, "#graph [data-edge]")
            }
            assert {
                "family:order -> observer:count",
                "observer:count -> queue:totals",
                "queue:totals -> queue:out",
                "queue:out -> sink:out",
            } <= edges, edges

            # The traceback after a click.
            traceback = browser.find_element(By.ID, "traceback")
            assert not traceback.is_displayed()
            browser.find_element(By.CSS_SELECTOR, '[data-observer="count"] .show-traceback').click()
            wait_for("the traceback", traceback.is_displayed)
            assert "Traceback (most recent call last)" in traceback.text
            assert 'raise ValueError(f"cannot parse order' in traceback.text
            shots(browser, "traceback")

            # The cause fixed, a retry from the page empties the parked work.
            fixed.touch()
            browser.find_element(By.ID, "retry-all").click()
            wait_for("the parked count at 0", lambda: text(browser, "#parked-count") == "0")
            wait_for(
                "the failing rows done",
                lambda: (
                    text(browser, "#pending-count") == "0"
                    and "Nothing here" in text(browser, "#failures")
                ),
            )
            shots(browser, "retried")

        # Nothing was asked of any host but the console.
        assert requested_origins(browser) == {origin}
    with percolite.open(db) as env, env.transaction() as tx:
        assert tx.get("bad0", ("seen", "at")) == b"1"


def test_a_postgresql_store_shows_both_worker_groups(
    browser, shots, tmp_path, postgres_server, monkeypatch
):
    if not os.environ.get(POSTGRES_VARIABLE):
        monkeypatch.setenv(POSTGRES_VARIABLE, postgres_server.uri)
    target = store_target("postgresql", tmp_path / "db")
    sink = str(tmp_path / "sink.jsonl")
    with percolite.open(target, app=console_app.make_app(sink)) as env:
        console_app.load(env, 20, bad=0)
    environment = {"CONSOLE_SINK": sink}
    with worker_group(target, environment), worker_group(target, environment, threads=3):
        with ui(target) as url:
            browser.get(url)

            def groups():
                found = browser.find_elements(By.CSS_SELECTOR, "#groups .group")
                live = browser.find_elements(By.CSS_SELECTOR, "#groups tr[data-owner]:not(.dead)")
                return len(found) == 2 and len(live) == 2 and found

            found = wait_for("two worker groups with a live lease each", groups)
            threads = sorted(
                row.find_elements(By.TAG_NAME, "td")[2].text
                for group in found
                for row in group.find_elements(By.CSS_SELECTOR, "tr[data-owner]")
            )
            assert threads == ["2", "3"]
            assert text(browser, "#store .backend") == "postgresql"
            assert "password" not in text(browser, "#store")
            # The server reached, with no reconnection by any process yet.
            server = f"{postgres_server.socket_dir}:{postgres_server.port}"
            assert text(browser, "#store #server") == f"server {server}"
            assert text(browser, "#store #reconnections") == "0 reconnections, 0 failovers"
            shots(browser, "postgresql-groups")


def test_a_failover_shows_in_the_store_bar(browser, shots, primary_and_standby):
    primary, standby = primary_and_standby
    target = both_servers(primary, standby, "&schema=console_failover")
    with percolite.open(target) as env:
        env.run(lambda tx: tx.set("r", ("f", "q"), b"before"))
        primary.kill()
        standby.promote()
        env.run(lambda tx: tx.set("r", ("f", "q"), b"after"))  # reconnects to the standby
        env.metrics()  # records what it saw, for every process to read
    with ui(target) as url:
        browser.get(url)
        wait_for(
            "the failover in the store bar",
            lambda: text(browser, "#store #reconnections") == "1 reconnection, 1 failover",
        )
        shown = browser.find_element(By.CSS_SELECTOR, "#store #reconnections")
        assert "failed-over" in shown.get_attribute("class")
        old, new = (f"{server.socket_dir}:{server.port}" for server in (primary, standby))
        assert f"{old} -> {new}" in shown.get_attribute("title")
        assert text(browser, "#store #server") == f"server {new}"
        shots(browser, "failed-over")
