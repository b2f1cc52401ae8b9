"""The console's server and JSON API over real HTTP: who may ask (token,
Host, Origin), what it answers (status, graph, history, failures, cells,
metrics), what its actions do, and ``percolite ui`` on bad input.

The page itself is tested in a real browser: test_console_browser.py."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import percolite
import pytest
from children import console_app
from percolite.ui import Console
from prometheus_client.parser import text_string_to_metric_families

TESTS = Path(__file__).parent


@pytest.fixture
def shop(tmp_path, monkeypatch):
    """A store with the console app, its work done: one parked failure,
    totals folded and exported. Yields (env, console)."""
    monkeypatch.setenv("CONSOLE_FIXED", str(tmp_path / "fixed"))
    app = console_app.make_app(str(tmp_path / "sink.jsonl"))
    env = percolite.open(str(tmp_path / "db"), app=app, sync="none")
    console_app.load(env, 40, bad=2)
    env.process(2)
    console = Console(env, port=0, sample_seconds=0.2).start()
    yield env, console
    console.close()
    env.close()


def request(
    console, method, path, *, token="header", host=None, origin=None, body=None, cookie=None
):
    """(status, headers, body) of one request; ``token`` says where the
    token goes: "header", "query", "cookie", None or a wrong one."""
    connection = http.client.HTTPConnection("127.0.0.1", console.port, timeout=30)
    headers = {"Host": host or f"127.0.0.1:{console.port}"}
    if token == "header":
        headers["X-Percolite-Token"] = console.token
    elif token == "query":
        path += ("&" if "?" in path else "?") + f"token={console.token}"
    elif token == "cookie":
        headers["Cookie"] = f"percolite_console={console.token}"
    elif token is not None:
        headers["X-Percolite-Token"] = token
    if cookie:
        headers["Cookie"] = cookie
    if origin:
        headers["Origin"] = origin
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    connection.request(method, path, body=data, headers=headers)
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    if response.getheader("Content-Type", "").startswith("application/json"):
        payload = json.loads(payload)
    return response.status, response, payload


def get(console, path):
    status, _response, body = request(console, "GET", path)
    assert status == 200, body
    return body


# -- who may ask -----------------------------------------------------------------


def test_every_request_needs_the_token(shop):
    _env, console = shop
    for path in ("/", "/api/status", "/api/graph.svg", "/static/console.js", "/api/metrics"):
        status, _r, body = request(console, "GET", path, token=None)
        assert status == 403 and "token" in body["error"], (path, body)
        status, _r, _body = request(console, "GET", path, token="x" * 32)
        assert status == 403, path
    status, response, page = request(console, "GET", "/", token="query")
    assert status == 200 and b"percolite console" in page
    cookie = response.getheader("Set-Cookie")
    assert cookie.startswith(f"percolite_console={console.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert request(console, "GET", "/api/status", token="cookie")[0] == 200
    assert request(console, "GET", "/api/status", token="header")[0] == 200


def test_the_page_may_load_nothing_from_elsewhere(shop):
    _env, console = shop
    status, response, page = request(console, "GET", "/", token="query")
    policy = response.getheader("Content-Security-Policy")
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "connect-src 'self'" in policy
    assert response.getheader("Referrer-Policy") == "no-referrer"  # the token is in the URL
    assert b"http://" not in page and b"https://" not in page


def test_a_foreign_host_header_is_refused(shop):
    _env, console = shop
    for host in ("evil.example", f"evil.example:{console.port}", "127.0.0.1:1"):
        status, _r, body = request(console, "GET", "/api/status", host=host)
        assert status == 403 and "Host" in body["error"], host
    assert request(console, "GET", "/api/status", host=f"localhost:{console.port}")[0] == 200


def test_an_action_needs_the_token_in_a_header_and_its_own_origin(shop):
    env, console = shop
    parked = len(env.parked())
    assert parked == 2
    own = f"http://127.0.0.1:{console.port}"
    refused = [
        dict(token="cookie", origin=own),  # a cookie alone: what another site's form could send
        dict(token=None, origin=own),
        dict(token="x" * 32, origin=own),
        dict(token="header", origin="http://evil.example"),
        dict(token="header", origin=f"http://evil.example:{console.port}"),
    ]
    for how in refused:
        status, _r, body = request(console, "POST", "/api/retry", body={}, **how)
        assert status == 403, (how, body)
        assert len(env.parked()) == parked, how  # nothing changed
    status, _r, done = request(console, "POST", "/api/retry", body={}, origin=own)
    assert status == 200 and done == {"retried": 2, "what": "all parked work"}
    assert env.parked() == []


# -- what it answers -----------------------------------------------------------------


def test_status_shows_observers_queues_sinks_and_the_same_figures_as_env_status(shop):
    env, console = shop
    status = get(console, "/api/status")
    expected = env.status()
    assert status["pending"] == expected["pending"] == 0
    assert status["parked"] == expected["parked"] == 2
    assert status["store"]["backend"] == "lmdb" and status["store"]["app"] == "shop"
    assert status["store"]["identity"]["store"] == env.identity["store"]
    assert status["store"]["size_bytes"] > 0
    rows = {o["name"]: o for o in status["observers"]}
    assert set(rows) == {"count", "combine queue totals", "export queue out"}
    count = rows["count"]
    assert count["kind"] == "observer" and count["parked"] == 2 and count["failures"] == 2
    assert count["last_error_type"] == "ValueError"
    assert count["last_error_message"].startswith("cannot parse order bad")
    assert rows["combine queue totals"]["depth"] == 0
    assert rows["export queue out"]["sink"] == "ok"
    assert status["sinks"]["out"]["state"] == "ok"


def test_the_graph_is_learned_from_the_runs(shop):
    _env, console = shop
    graph = get(console, "/api/graph")
    nodes = {n["id"]: n for n in graph["nodes"]}
    edges = {(e["source"], e["target"]): e for e in graph["edges"]}
    assert set(nodes) == {
        "family:order",
        "observer:count",
        "family:seen",
        "queue:totals",
        "queue:out",
        "sink:out",
    }
    # Declared: the observed column; the export queue's sink.
    assert edges[("family:order", "observer:count")]["kind"] == "strong notifications"
    assert ("queue:out", "sink:out") in edges
    # Learned: what the committed runs wrote (40 good orders, one cell and one update each).
    assert edges[("observer:count", "family:seen")]["count"] == 40
    assert edges[("observer:count", "queue:totals")]["count"] == 40
    # The change observer's adds: one per product changed, at most 5 per fold.
    assert edges[("queue:totals", "queue:out")]["count"] >= 5
    svg = get(console, "/api/graph.svg").decode()
    assert svg.startswith("<svg") and 'data-node="observer:count"' in svg
    assert 'data-edge="observer:count -&gt; queue:totals"' in svg


def test_a_hostile_name_is_escaped_in_the_graph(tmp_path):
    app = percolite.App("x")

    @app.observer(("f", "q"), name="<script>alert(1)</script>")
    def observer(tx, row, column):
        tx.set(row, ("<b>", "q"), b"1")

    with percolite.open(str(tmp_path / "db"), app=app, sync="none") as env:
        with env.transaction() as tx:
            tx.set("r", ("f", "q"), "v")
        env.process(1)
        with Console(env, port=0).start() as console:
            svg = get(console, "/api/graph.svg").decode()
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert "<b>" not in svg and "&lt;b&gt;" in svg


def test_history_has_rates_and_commit_latency(shop):
    env, console = shop
    with env.transaction() as tx:
        for i in range(20):
            tx.set(f"late{i}", ("order", "item"), "p1")
    env.process(2)
    env.metrics()  # this process's counts into the store now
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        history = get(console, "/api/history")
        if any(history["commits_per_second"]) and any(history["commit_latency_ms"]):
            break
        time.sleep(0.2)
    assert len(history["unix"]) >= 1
    assert any(v for v in history["commits_per_second"])
    latencies = [v for v in history["commit_latency_ms"] if v is not None]
    assert latencies and all(v > 0 for v in latencies)
    assert any(v is not None and v > 0 for v in history["transactions_per_sync"])


def test_metrics_are_prometheus_text_with_the_commit_histogram_and_the_edges(shop):
    env, console = shop
    env.metrics()
    text = get(console, "/api/metrics").decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    histogram = families["percolite_commit_seconds"]
    assert histogram.type == "histogram"
    buckets = [s for s in histogram.samples if s.name.endswith("_bucket")]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and buckets[-1].labels["le"] == "+Inf"
    count = next(s.value for s in histogram.samples if s.name.endswith("_count"))
    assert count == counts[-1] > 0
    writes = {
        (s.labels["observer"], s.labels["target"]): s.value
        for s in families["percolite_observer_writes"].samples
    }
    assert writes[("count", "queue:totals")] == 40
    assert writes[("count", "family:seen")] == 40


def test_failures_are_grouped_with_their_tracebacks_and_filtered(shop):
    _env, console = shop
    work = get(console, "/api/parked?status=parked")
    assert work["total"] == 2
    (group,) = work["groups"]
    assert group["observer"] == "count" and group["count"] == 2
    item = group["items"][0]
    assert item["row"].startswith("bad") and item["column"] == ["order", "item"]
    assert item["attempts"] == 1 and item["parked"] is True
    assert item["error"]["type"] == "ValueError"
    assert (
        "Traceback" in item["error"]["traceback"]
        and "raise ValueError" in item["error"]["traceback"]
    )
    assert get(console, "/api/parked?status=failing")["total"] == 0
    assert get(console, "/api/parked?observer=nobody")["total"] == 0
    failures = get(console, "/api/failures")["failures"]
    assert failures["count"]["parked"] == 2


def test_retry_one_item_then_an_observers(shop, tmp_path):
    env, console = shop
    (tmp_path / "fixed").touch()  # the cause is fixed
    first, second = get(console, "/api/parked")["groups"][0]["items"]
    status, _r, done = request(console, "POST", "/api/retry", body={"item": first["item"]})
    assert status == 200 and done["retried"] == 1
    assert [r["row"].decode() for r in env.parked()] == [second["row"]]
    status, _r, done = request(console, "POST", "/api/retry", body={"observer": "count"})
    assert status == 200 and done["retried"] == 1
    env.process(2)
    assert env.parked() == []
    with env.transaction() as tx:
        assert tx.get(first["row"], ("seen", "at")) == b"1"


def test_the_cell_browser_pages_without_gaps_and_decodes_queue_values(shop):
    env, console = shop
    seen = []
    after = None
    while True:
        query = "/api/cells?prefix=o0&limit=7" + (f"&after={after}" if after else "")
        page = get(console, query)
        seen += [(c["row"], c["family"], c["qualifier"]) for c in page["cells"]]
        after = page["next"]
        if after is None:
            break
    with env.transaction() as tx:
        expected = [
            (c.row.decode(), c.column.family.decode(), c.column.qualifier.decode())
            for c in tx.scan(prefix=b"o0")
        ]
    assert seen == expected and len(seen) == 80  # 40 orders, 2 cells each
    hexed = get(console, "/api/cells?start=o00000&end=o00001&form=hex")["cells"]
    assert [c["value"] for c in hexed] == ["70 30", "31"]  # "p0", "1"
    values = get(console, "/api/cells?queue=totals")["values"]
    with env.transaction() as tx:
        assert values == [{"key": k, "value": v} for k, v in env.app._queues["totals"].scan(tx)]
    assert {v["key"] for v in values} == {f"p{i}" for i in range(5)}


@pytest.mark.parametrize(
    "path, message",
    [
        ("/api/cells?limit=0", "limit must be from 1 to 500, not 0"),
        ("/api/cells?limit=x", "limit must be a whole number, not 'x'"),
        ("/api/parked?limit=", "limit must be a whole number, not ''"),
        ("/api/cells?form=octal", "form must be 'text' or 'hex'"),
        ("/api/cells?prefix=a&start=b", "either prefix or start/end"),
        ("/api/cells?after=!!", "not a cursor"),
        ("/api/cells?queue=nope", "no combine queue named 'nope'"),
        ("/api/cells?queue=out", "'out' is an export queue: its entries leave for its sink"),
        ("/api/parked?status=gone", "status must be 'parked', 'failing' or 'all'"),
    ],
)
def test_bad_queries_get_400_naming_the_problem(shop, path, message):
    _env, console = shop
    status, _r, body = request(console, "GET", path)
    assert status == 400 and message in body["error"], body


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/api/retry", b"not json", 400, "JSON object"),
        ("/api/retry", [1], 400, "JSON object"),
        ("/api/retry", {"item": "garbage"}, 400, "not a parked item's handle"),
        ("/api/retry", {"observer": 5}, 400, "observer must be a string"),
        ("/api/retry", {"observer": "nobody"}, 400, "no observer named 'nobody' in this store"),
        ("/api/retry", {"queue": "nope"}, 400, "no queue named 'nope' in this store"),
        ("/api/retry", {"observe": "count"}, 400, "takes observer, queue, item, not observe"),
        ("/api/retry", {"observer": "count", "queue": "totals"}, 400, "one of observer, queue"),
        ("/api/take-over", {"queue": "out", "force": 1}, 400, "takes queue, not force"),
        ("/api/take-over", {}, 400, "queue must be the export queue's id"),
        ("/api/take-over", {"queue": "totals"}, 400, "no export queue named 'totals'"),
        ("/api/nothing", {}, 404, "no action at /api/nothing"),
    ],
)
def test_bad_actions_get_a_clear_answer_and_change_nothing(shop, path, body, status, message):
    env, console = shop
    got, _r, answer = request(console, "POST", path, body=body)
    assert got == status and message in answer["error"], answer
    assert len(env.parked()) == 2


def test_unknown_paths_are_404_and_other_methods_405(shop):
    _env, console = shop
    status, _r, body = request(console, "GET", "/api/nothing")
    assert status == 404 and "nothing at /api/nothing" in body["error"]
    status, _r, body = request(console, "GET", "/api/retry")
    assert status == 405 and "POST it" in body["error"]
    for method in ("PUT", "DELETE", "PATCH"):
        status, _r, body = request(console, method, "/api/retry", body={})
        assert status == 405 and f"{method} is not served here" in body["error"]


def test_the_page_asks_for_its_script_and_style_with_the_token(shop):
    """A notebook served from another address (localhost against 127.0.0.1)
    sends no cookie to the console: the page's own URLs carry the token."""
    _env, console = shop
    _status, _r, page = request(console, "GET", "/", token="query")
    for asset in ("/static/console.js", "/static/console.css"):
        assert f"{asset}?token={console.token}".encode() in page
        assert request(console, "GET", asset, token=None)[0] == 403
        assert request(console, "GET", f"{asset}?token={console.token}", token=None)[0] == 200


def test_values_are_shown_readable_and_cut(shop):
    env, console = shop
    with env.transaction() as tx:
        tx.set("zz1", ("v", "lines"), "first\nsecond\tthird")
        tx.set("zz2", ("v", "\x00bin"), b"\x01\xffok")
        tx.set("zz3", ("v", "long"), "x" * 5000)
    cells = {c["row"]: c for c in get(console, "/api/cells?prefix=zz")["cells"]}
    assert cells["zz1"]["value"] == "first\nsecond\tthird"
    assert cells["zz2"]["qualifier"] == "\\x00bin" and cells["zz2"]["value"] == "\\x01\\xffok"
    assert cells["zz3"]["value"] == "x" * 2000 + " \u2026 (3,000 more bytes)"
    assert cells["zz3"]["size"] == 5000


def test_retrying_a_recorded_queue_and_taking_over_need_what_they_need(tmp_path, shop):
    """Without the app's code, a queue the store recorded is still known to
    retry; a take-over says it needs --app."""
    env, _console = shop
    with percolite.open(env.path, sync="none") as bare, Console(bare, port=0) as console:
        status, _r, done = request(console, "POST", "/api/retry", body={"queue": "totals"})
        assert status == 200 and done == {"retried": 0, "what": "queue 'totals'"}
        status, _r, body = request(console, "POST", "/api/take-over", body={"queue": "out"})
        assert status == 409 and "needs the app's code" in body["error"]
        assert "--app MODULE:APP" in body["error"]


def test_a_console_on_every_address_accepts_its_ip_addresses_not_other_names(shop):
    env, _console = shop
    with Console(env, host="0.0.0.0", port=0) as console:
        assert console.url.startswith(f"http://{socket.gethostname()}:{console.port}/?token=")
        for host in (
            f"127.0.0.1:{console.port}",
            f"10.1.2.3:{console.port}",
            f"localhost:{console.port}",
        ):
            assert request(console, "GET", "/api/status", host=host)[0] == 200, host
        for host in (f"evil.example:{console.port}", f"10.1.2.3:{console.port + 1}"):
            assert request(console, "GET", "/api/status", host=host)[0] == 403, host


def test_a_console_used_as_a_context_serves_and_closes_for_good(shop):
    env, _console = shop
    with Console(env, port=0) as console:
        assert get(console, "/api/status")["parked"] == 2
    with pytest.raises(RuntimeError, match="the console is closed: make a new one"):
        console.start()


def test_bad_console_arguments_are_refused(shop):
    env, console = shop
    with pytest.raises(ValueError, match=f"port {console.port} on 127.0.0.1 is already in use"):
        Console(env, port=console.port)
    with pytest.raises(ValueError, match="port must be a number from 0 to 65535"):
        Console(env, port=70000)
    with pytest.raises(ValueError, match="host '203.0.113.9' is not an address of this machine"):
        Console(env, host="203.0.113.9", port=0)
    with pytest.raises(ValueError, match="token must be a str of at least 16"):
        Console(env, port=0, token="short")


# -- percolite ui ----------------------------------------------------------------------


def _ui(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "percolite", "ui", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=TESTS,
    )


def ui_process(db):
    """``percolite ui DB --port 0`` started as from a terminal: with SIGINT's
    default (a background job of a non-interactive shell, as a CI runner's
    is, starts with SIGINT ignored, and so would the child)."""
    return subprocess.Popen(
        [sys.executable, "-m", "percolite", "ui", db, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_percolite_ui_prints_the_url_first_and_serves_it(tmp_path):
    db = str(tmp_path / "db")
    percolite.open(db).close()
    with ui_process(db) as child:
        try:
            url = child.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:") and "/?token=" in url, url
            host_port = url.split("/")[2]
            token = url.split("token=")[1]
            connection = http.client.HTTPConnection(host_port, timeout=30)
            connection.request("GET", "/api/status", headers={"X-Percolite-Token": token})
            response = connection.getresponse()
            assert response.status == 200
            assert json.loads(response.read())["store"]["location"] == os.path.realpath(db)
            connection.close()
        finally:
            child.terminate()  # a supervisor's stop: a clean exit
            _out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err


def test_percolite_ui_on_a_missing_store_a_port_in_use_and_a_bad_host(tmp_path):
    missing = _ui(str(tmp_path / "nothing"), "--port", "0")
    assert missing.returncode == 2 and missing.stdout == ""
    assert (
        missing.stderr.strip()
        == f"percolite: {tmp_path / 'nothing'}: no such store: nothing is there"
    )
    bad_port = _ui(str(tmp_path / "nothing"), "--port", "99999")
    assert bad_port.returncode == 2
    assert bad_port.stderr.strip() == (
        "percolite: --port must be a port number from 1 to 65535, or 0 for a free one, not '99999'"
    )
    db = str(tmp_path / "db")
    percolite.open(db).close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = _ui(db, "--port", str(port))
    assert busy.returncode == 2 and busy.stdout == ""
    assert busy.stderr.strip() == f"percolite: --port {port} on 127.0.0.1 is already in use"
    bad_app = _ui(db, "--app", "nonsense:thing", "--port", "0")
    assert bad_app.returncode == 2
    assert bad_app.stderr.strip().startswith("percolite: cannot load app 'nonsense:thing': ")
    bad = _ui(db, "--host", "203.0.113.9", "--port", "0")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "percolite: host '203.0.113.9' is not an address of this machine"


@pytest.mark.parametrize("processes", [1, 2])
def test_a_worker_group_serves_the_console(tmp_path, processes):
    """``percolite worker ... --ui-port 0``: the URL first; the console shows
    the group's pools (with --processes 2 the parent serves it)."""
    db = str(tmp_path / "db")
    sink = str(tmp_path / "sink.jsonl")
    with percolite.open(db, app=console_app.make_app(sink)) as env:
        console_app.load(env, 10, bad=0)
    environment = dict(os.environ, CONSOLE_SINK=sink, PYTHONPATH=str(TESTS))
    argv = [sys.executable, "-m", "percolite", "worker", "children.console_app:app"]
    argv += ["--db", db, "--ui-port", "0", "--processes", str(processes), "--threads", "1"]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment, cwd=TESTS
    ) as child:
        try:
            url = child.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:") and "/?token=" in url, url
            host_port, token = url.split("/")[2], url.split("token=")[1]

            def status():
                connection = http.client.HTTPConnection(host_port, timeout=30)
                connection.request("GET", "/api/status", headers={"X-Percolite-Token": token})
                body = json.loads(connection.getresponse().read())
                connection.close()
                return body

            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                shown = status()
                pools = [p for g in shown["groups"] for p in g["pools"] if p["live"]]
                if len(pools) == processes and shown["pending"] == 0:
                    break
                time.sleep(0.2)
            assert len(pools) == processes and len(shown["groups"]) == 1, shown["groups"]
            assert shown["pending"] == 0 and shown["store"]["app"] == "shop"
            for pool in pools:  # the renewal as recorded, a lease before its expiry
                lease = pool["expires_unix"] - pool["renewed_unix"]
                assert lease == pytest.approx(percolite._core.DEFAULT_LEASE_SECONDS)
        finally:
            child.terminate()
            _out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err


def test_take_over_a_refused_sink_from_the_console(tmp_path):
    """Store A fed the sink first; store B's entries are refused (its queue
    blocked), until the console's take-over makes the sink B's."""
    sink = str(tmp_path / "sink.jsonl")
    with percolite.open(str(tmp_path / "a"), app=console_app.make_app(sink), sync="none") as a:
        console_app.load(a, 5, bad=0)
        a.process(1)
        first_owner = a.identity["store"]
    app = console_app.make_app(sink)
    with percolite.open(str(tmp_path / "b"), app=app, sync="none") as b:
        console_app.load(b, 7, bad=0)
        b.process(1)
        with Console(b, port=0).start() as console:
            assert get(console, "/api/status")["sinks"]["out"]["state"] == "refused"
            status, _r, done = request(console, "POST", "/api/take-over", body={"queue": "out"})
            assert status == 200, done
            assert done["owner"] == b.identity["store"] and done["retried"] >= 1
            assert done["previous_owner"] == first_owner
            b.process(1)
            assert get(console, "/api/status")["sinks"]["out"]["state"] == "ok"
        with b.transaction() as tx:
            expected = dict(app._queues["totals"].scan(tx))
    exported = {}
    with open(sink) as lines:
        for line in lines:
            entry = json.loads(line)
            if "key" in entry:
                exported[entry["key"]] = entry["value"]
    assert exported == expected  # store A's rows cleared, B's values in


def test_percolite_ui_is_there_after_import_percolite_and_loads_only_when_used():
    code = (
        "import sys, percolite\n"
        "assert 'percolite.ui' not in sys.modules\n"
        "assert percolite.ui.Console.__name__ == 'Console'\n"
        "assert 'percolite.ui' in sys.modules\n"
        "try:\n"
        "    percolite.nothing\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "module 'percolite' has no attribute 'nothing'"


def test_ctrl_c_stops_percolite_ui_with_130(tmp_path):
    db = str(tmp_path / "db")
    percolite.open(db).close()
    with ui_process(db) as child:
        assert child.stdout.readline().startswith("http://127.0.0.1:")
        child.send_signal(signal.SIGINT)
        _out, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
