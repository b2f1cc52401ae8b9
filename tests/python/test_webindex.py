"""webindex end to end: the exported tables equal those of a plain-Python
model of the web, and an incrementally kept store's tables equal those of a
fresh store loaded with the final pages, run after run."""

from __future__ import annotations

import collections
import itertools
import os
import subprocess
import sys
from urllib.parse import urlsplit

import percolite
import pytest
from percolite.webindex import app as wi
from percolite.webindex import cli, synthetic

_DATABASES = itertools.count()


@pytest.fixture
def postgres_database(postgres_server):
    """The URI of a new, empty database on the session's PostgreSQL server."""
    import psycopg

    name = f"webindex_{os.getpid()}_{next(_DATABASES)}"
    with psycopg.connect(postgres_server.dsn, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    return postgres_server.uri.replace("/postgres?", f"/{name}?")


def expected_tables(web):
    """The three tables computed from ``{uri: {target: anchor}}`` by the rules."""
    incount = collections.Counter(t for links in web.values() for t in links)
    known = set(web) | set(incount)
    host = {u: urlsplit(u).hostname for u in known}
    pages = sorted((u, host[u], incount[u], len(web.get(u, {})), int(u in web)) for u in known)
    inlinks = sorted((t, s, a) for s, links in web.items() for t, a in links.items())
    domains = collections.defaultdict(lambda: [0, 0])
    for u in known:
        domains[host[u]][0] += 1
        domains[host[u]][1] += incount[u]
    return {
        "webindex_pages": pages,
        "webindex_inlinks": inlinks,
        "webindex_domains": sorted((d, p, n) for d, (p, n) in domains.items()),
    }


def _index(env, paths, base_url=None):
    read, loaded, removed = cli.load_into(env, [str(p) for p in paths], base_url)
    assert env.wait(timeout=300)
    return read, loaded, removed


def _fresh_tables(tmp_path, name, paths, base_url=None):
    target = "sqlite:" + str(tmp_path / f"{name}.sqlite")
    wi.set_export(target)
    with percolite.open(":memory:", app=wi.app) as fresh:
        fresh.start_workers(4)
        _index(fresh, paths, base_url)
        fresh.stop_workers()
    return wi.read_tables(target)


def test_html_tree_incremental_equals_from_scratch_memory(tmp_path):
    web = synthetic.generate(600, seed=11)
    tree = tmp_path / "tree"
    kept = "sqlite:" + str(tmp_path / "kept.sqlite")
    with percolite.open(":memory:", app=wi.app) as env:
        for run in range(4):
            before = len(web)
            if run:
                web = synthetic.mutate(web, seed=run, edit=0.1, remove=0.03, add=0.03)
            synthetic.write_html(web, str(tree))
            wi.set_export(kept)
            env.start_workers(4)
            read, loaded, removed = _index(env, [tree], "http://")
            env.stop_workers()
            assert read == len(web)
            if run:
                assert 0 < loaded < len(web)
                assert removed == int(before * 0.03)
            tables = wi.read_tables(kept)
            assert tables == expected_tables(web)
            assert _fresh_tables(tmp_path, f"fresh{run}", [tree], "http://") == tables
        # Nothing changed: nothing is loaded, the tables stay.
        wi.set_export(kept)
        env.start_workers(2)
        assert _index(env, [tree], "http://") == (len(web), 0, 0)
        env.stop_workers()
        assert wi.read_tables(kept) == expected_tables(web)


def test_link_records_add_and_replace_memory(tmp_path):
    first = synthetic.generate(500, seed=12)
    second = synthetic.mutate(first, seed=7, edit=0.2, remove=0.1, add=0.05)
    synthetic.write_records(first, str(tmp_path / "first.jsonl"))
    synthetic.write_records(second, str(tmp_path / "second.jsonl"))
    merged = dict(first, **second)  # records remove no page: later ones replace
    synthetic.write_records(merged, str(tmp_path / "merged.jsonl"))
    kept = "sqlite:" + str(tmp_path / "kept.sqlite")
    wi.set_export(kept)
    with percolite.open(":memory:", app=wi.app) as env:
        env.start_workers(4)
        _index(env, [tmp_path / "first.jsonl"])
        assert wi.read_tables(kept) == expected_tables(first)
        _index(env, [tmp_path / "second.jsonl"])
        assert wi.read_tables(kept) == expected_tables(merged)
        # The same file again changes nothing.
        assert _index(env, [tmp_path / "second.jsonl"])[1:] == (0, 0)
        # Within one run, a later record of a URI replaces the earlier one.
        _index(env, [tmp_path / "first.jsonl", tmp_path / "second.jsonl"])
        env.stop_workers()
        assert wi.read_tables(kept) == expected_tables(merged)
    fresh = _fresh_tables(tmp_path, "fresh", [tmp_path / "merged.jsonl"])
    assert fresh == expected_tables(merged)


def test_the_page_observer_keeps_the_loaded_links_and_runs_once(tmp_path):
    """Indexing a page writes its links as indexed and leaves the loaded
    ones in place (no delete, so no tombstone per page); a page notified
    again with the links it has is not exported again."""
    web = synthetic.generate(200, seed=14)
    web = dict(web, **{"http://gone.example/": {}})
    synthetic.write_records(web, str(tmp_path / "web.jsonl"))
    kept = "sqlite:" + str(tmp_path / "kept.sqlite")
    wi.set_export(kept)

    def seqs():
        rows = wi._query(kept, "SELECT uri, from_uri, seq FROM webindex_inlinks ORDER BY 1, 2")
        return rows, wi._query(kept, "SELECT uri, in_seq, out_seq FROM webindex_pages ORDER BY 1")

    with percolite.open(str(tmp_path / "db"), app=wi.app) as env:
        env.start_workers(2)
        _index(env, [tmp_path / "web.jsonl"])
        with env.transaction() as tx:
            assert wi.remove_page(tx, "http://gone.example/")
        assert env.wait(timeout=300)
        del web["http://gone.example/"]
        assert wi.read_tables(kept) == expected_tables(web)
        with env.transaction() as tx:
            cells = {(row, column.qualifier): value for row, column, value in tx.scan(prefix="p:")}
        for uri in web:
            row = ("p:" + uri).encode()
            assert cells[row, b"new"] == cells[row, b"links"], uri
        assert cells[b"p:http://gone.example/", b"new"] == wi.REMOVED
        assert (b"p:http://gone.example/", b"links") not in cells
        before = seqs()
        with env.transaction() as tx:  # notified again, links unchanged
            for (row, qualifier), value in cells.items():
                if qualifier == b"new":
                    tx.set(row, wi.NEW, value)
        assert env.wait(timeout=300)
        assert seqs() == before
        assert wi.read_tables(kept) == expected_tables(web)


def test_lmdb_across_cli_runs(tmp_path):
    web = synthetic.generate(2000, seed=13)
    tree = tmp_path / "tree"
    db = tmp_path / "db"
    kept = "sqlite:" + str(tmp_path / "kept.sqlite")
    for run in range(3):
        if run:
            web = synthetic.mutate(web, seed=20 + run, edit=0.05, remove=0.01, add=0.01)
        synthetic.write_html(web, str(tree))
        summary = cli.run([str(tree)], db, export=kept, base_url="http://", progress=False)
        assert summary.pages == len(web) and not summary.problems
        tables = wi.read_tables(kept)
        assert tables == expected_tables(web)
        assert summary.uris == len(tables["webindex_pages"])
        fresh = cli.run(
            [str(tree)],
            tmp_path / f"fresh{run}",
            export="sqlite:" + str(tmp_path / f"fresh{run}.sqlite"),
            base_url="http://",
            processes=0,
            progress=False,
        )
        assert fresh.loaded == len(web)
        assert wi.read_tables("sqlite:" + str(tmp_path / f"fresh{run}.sqlite")) == tables


def test_postgresql_store_and_query_database_across_cli_runs(tmp_path, postgres_database):
    """The store and the query database on PostgreSQL, loaded by CLI runs
    with worker processes, then edited: the tables stay those of the rules,
    and equal those of a fresh store loaded once with the final pages."""
    web = synthetic.generate(1000, seed=17)
    tree = tmp_path / "tree"
    db = postgres_database + "&schema=store"
    for run in range(2):
        if run:
            web = synthetic.mutate(web, seed=30 + run, edit=0.05, remove=0.01, add=0.01)
        synthetic.write_html(web, str(tree))
        summary = cli.run(
            [str(tree)], db, export=postgres_database, base_url="http://", progress=False
        )
        assert summary.pages == len(web) and not summary.problems
        assert wi.read_tables(postgres_database) == expected_tables(web)
    fresh = "sqlite:" + str(tmp_path / "fresh.sqlite")
    cli.run([str(tree)], tmp_path / "fresh", export=fresh, base_url="http://", progress=False)
    assert wi.read_tables(fresh) == wi.read_tables(postgres_database)


def _cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-m", "percolite", "webindex", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_command_line_load_and_queries_with_bad_input(tmp_path):
    site = tmp_path / "site"
    (site / "docs").mkdir(parents=True)
    (site / "index.html").write_text(
        '<a href="docs/a.html">A</a> <a href="docs/b.html">B</a> <a href="http://[x">bad</a>'
    )
    (site / "docs" / "a.html").write_text('<a href="b.html">to b</a><a href="../">home</a>')
    (site / "docs" / "b.html").write_bytes(b"<a href='a.html'>caf\xe9</a>")
    (site / "docs" / "logo.png").write_bytes(b"\x89PNG\0")
    (site / "docs" / "blob.html").write_bytes(b"\0\0\0")
    done = _cli(
        "load",
        str(site),
        str(tmp_path / "gone"),
        "--db",
        str(tmp_path / "db"),
        "--base-url",
        "https://Example.org/",
        "--quiet",
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr  # a missing PATH
    assert "error: " + str(tmp_path / "gone") in done.stderr
    assert "pages: 3 read, 3 new or changed, 0 removed; known URIs: 4" in done.stdout
    assert "1 bad href" in done.stdout and "2 not HTML" in done.stdout
    assert "1 decoded with replacement" in done.stdout
    db = ["--db", str(tmp_path / "db")]
    top = _cli("top", *db, "-n", "2", cwd=tmp_path)
    assert top.returncode == 0, top.stderr
    assert top.stdout.splitlines()[1].split() == ["2", "2", "https://example.org/docs/a.html"]
    inlinks = _cli("inlinks", "https://example.org/docs/b.html", *db, cwd=tmp_path)
    assert "2 pages link to" in inlinks.stdout and "'to b'" in inlinks.stdout
    alone = _cli("inlinks", "https://example.org/", *db, cwd=tmp_path)
    assert "1 page links to" in alone.stdout
    domains = _cli("domains", *db, cwd=tmp_path)
    assert domains.stdout.splitlines()[1].split() == ["4", "5", "example.org"]
    # A page gone: its outlinks go, and the URI stays known while linked.
    (site / "docs" / "a.html").unlink()
    done = _cli(
        "load", str(site), *db, "--base-url", "https://example.org/", "--quiet", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "pages: 2 read, 0 new or changed, 1 removed; known URIs: 3" in done.stdout
    # Unchanged files are hashed, not parsed: index.html's bad href was
    # counted when it was loaded; blob.html was never loaded, so it is again.
    assert "bad href" not in done.stdout and "2 not HTML" in done.stdout
    target = "sqlite:" + str(tmp_path / "db.webindex.sqlite")
    frame = wi.read_domains(target).to_pandas()
    assert list(frame.columns) == ["domain", "pages", "incount"]
    assert frame.to_dict("records") == [{"domain": "example.org", "pages": 3, "incount": 3}]
    assert wi.read_top(target, 5) == [
        ("https://example.org/docs/a.html", 2, 0, 0),
        ("https://example.org/docs/b.html", 1, 1, 1),
        ("https://example.org/index.html", 0, 2, 1),
    ]


def test_command_line_names_what_is_wrong_with_a_target_or_a_base_url(tmp_path):
    """A query database that cannot be reached or does not exist, and a base
    URL that is not http(s): one line each, no traceback, nothing made."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "a.html").write_text('<a href="b.html">b</a>')
    unreachable = "postgresql://nobody:secret@127.0.0.1:1/x"
    for args in (
        ["load", "site", "--db", "db1", "--base-url", "https://e.org/", "--export", unreachable],
        ["top", "--export", unreachable],
    ):
        done = _cli(*args, cwd=tmp_path)
        assert done.returncode != 0
        assert "cannot connect to PostgreSQL at 'postgresql://nobody:***@" in done.stderr
        assert "secret" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "db1").exists()
    for args in (["top", "--db", "nowhere.db"], ["domains", "--export", "sqlite:nodir/x.db"]):
        done = _cli(*args, cwd=tmp_path)
        assert done.returncode != 0, done.stderr
        assert "no query database at" in done.stderr or "does not exist" in done.stderr
        assert "Traceback" not in done.stderr
    done = _cli("load", "site", "--db", "db2", "--base-url", "example.org", cwd=tmp_path)
    assert done.returncode != 0
    assert "--base-url must be an http(s) URL" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "db2").exists()
    # A file that is not an SQLite database: refused at once, left as it was.
    (tmp_path / "notes.txt").write_text("my notes\n")
    for args in (
        ["load", "site", "--db", "db3", "--base-url", "https://e.org/"],
        ["top"],
        ["inlinks", "https://e.org/b.html"],
    ):
        done = _cli(*args, "--export", "sqlite:notes.txt", cwd=tmp_path)
        assert done.returncode != 0, done.stderr
        assert "notes.txt: not an SQLite database" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
    assert not (tmp_path / "db3").exists()


def test_command_line_refuses_a_directory_without_base_url(tmp_path):
    done = _cli("load", str(tmp_path), "--db", str(tmp_path / "db"), "--quiet", cwd=tmp_path)
    assert done.returncode != 0
    assert "--base-url is needed" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "db").exists()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_pages_table_joins_two_sources_by_their_own_seq(tmp_path, kind, request):
    """Entries of the two sources of webindex_pages, in any order across
    calls: each applies only above its own source's seq for the URI, and
    writes only its own columns; the URI source decides whether the row
    exists. The query database's exporters, on SQLite and PostgreSQL."""
    from percolite import SequencedExport as E

    if kind == "sqlite":
        target = "sqlite:" + str(tmp_path / "q.sqlite")
    else:
        target = request.getfixturevalue("postgres_database")
    sink = wi.open_sink(target)
    sink.create()
    u = "http://e.org/a"

    def row():
        return wi.read_tables(target)["webindex_pages"]

    sink.outcounts([E(u, 3, 10)])  # before the row exists: kept, no row made
    assert row() == []
    sink.pages([E(u, ("e.org", 2, 1), 20)])
    assert row() == [(u, "e.org", 2, 3, 1)]
    sink.pages([E(u, ("e.org", 9, 1), 5)])  # older than the row's: ignored
    sink.outcounts([E(u, 7, 9)])
    assert row() == [(u, "e.org", 2, 3, 1)]
    sink.outcounts([E(u, 4, 30)])
    sink.pages([E(u, ("e.org", 5, 1), 25)])  # newer incount, outcount untouched
    assert row() == [(u, "e.org", 5, 4, 1)]
    sink.pages([E(u, None, 40)])  # no longer known
    sink.outcounts([E(u, 6, 41)])  # does not bring the row back
    sink.pages([E(u, ("e.org", 1, 0), 35)])  # older than the deletion: ignored
    assert row() == []
    sink.pages([E(u, ("e.org", 1, 1), 50)])  # back, with the outcount sent while it was gone
    assert row() == [(u, "e.org", 1, 6, 1)]
    sink.pages([E("http://e.org/z", ("e.org", 1, 0), 51)])  # never crawled: outcount 0
    assert row()[1] == ("http://e.org/z", "e.org", 1, 0, 0)
    # The inlinks: one entry per source page, replacing its rows.
    b, c = "http://e.org/b", "http://e.org/c"

    def inlinks():
        return wi.read_tables(target)["webindex_inlinks"]

    sink.inlinks([E(b, {u: "x", c: "y"}, 7)])
    assert inlinks() == [(u, b, "x"), (c, b, "y")]
    sink.inlinks([E(b, {c: "z"}, 9), E(b, {u: "w"}, 8)])  # newest wins
    assert inlinks() == [(c, b, "z")]
    sink.inlinks([E(b, None, 10)])  # the page is gone
    sink.inlinks([E(b, {u: "old"}, 6)])  # older than the deletion: ignored
    assert inlinks() == []
    sink.inlinks([E(b, {u: "back"}, 11)])
    sink.close()
    assert inlinks() == [(u, b, "back")]
