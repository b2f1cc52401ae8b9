"""``percolite phrasecount``, end to end through the command line: counts read
back from the sink equal a plain-Python reference (``reference_counts``) on a
corpus with duplicates, before and after files are edited, deleted, duplicated
and added; with worker processes; with PostgreSQL; and bad input. lmdb only:
the command line opens the store at its ``--db`` path.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
from _isolated import run_command
from percolite.phrasecount.corpus import Document
from percolite.phrasecount.reference import reference_counts, synthetic_corpus


def write_corpus(root: Path, n: int = 240, seed: int = 3) -> list[Path]:
    """``n`` synthetic documents (about 5% exact duplicates) as files in nested directories."""
    files = []
    for i, doc in enumerate(synthetic_corpus(n, seed, duplicates=0.08, words_per_doc=(40, 120))):
        path = root / f"part{i % 4}" / f"sub{i % 3}" / f"doc{i:04d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(doc.content, encoding="utf-8")
        files.append(path)
    return files


def reference_for(root: Path) -> dict:
    """The expected counts, from the files as plain Python reads them."""
    documents = []
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            try:
                documents.append(Document(str(path), path.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError):
                continue
    return reference_counts(doc for doc in documents if "\0" not in doc.content)


def exported_sqlite(path: Path) -> dict:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT phrase, doc_count, total_count FROM phrase_counts").fetchall()
    return {phrase: (d, t) for phrase, d, t in rows}


def phrasecount(*args, timeout: float = 180):
    return run_command(
        [sys.executable, "-m", "percolite", "phrasecount", "--quiet", *map(str, args)],
        timeout=timeout,
    )


def edit_delete_duplicate(files: list[Path], root: Path) -> dict:
    """Edits 6 files, deletes 5, duplicates 4 under new names, adds 1 new file."""
    for path in files[:6]:
        path.write_text(path.read_text(encoding="utf-8") + " an edited tail of five words")
    for path in files[6:11]:
        path.unlink()
    for i, path in enumerate(files[11:15]):
        shutil.copy(path, root / "part0" / f"copy{i}.txt")
    (root / "new.txt").write_text("a brand new document with a few words in it")
    return {"changed": 6 + 4 + 1, "removed": 5}


def summary_numbers(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("documents:"))


def test_counts_equal_the_reference_and_follow_edits(tmp_path):
    root, db = tmp_path / "corpus", tmp_path / "db"
    files = write_corpus(root)
    sink = tmp_path / "out.sqlite"
    first = phrasecount(root, "--db", db, "--export", f"sqlite:{sink}", "--threads", "3")
    assert first.returncode == 0, first.stderr
    expected = reference_for(root)
    assert len(expected) > 5000
    assert exported_sqlite(sink) == expected
    assert "240 read, 240 new or changed, 0 removed" in summary_numbers(first.stdout)
    assert "top phrases" in first.stdout

    changes = edit_delete_duplicate(files, root)
    second = phrasecount(root, "--db", db, "--export", f"sqlite:{sink}")
    assert second.returncode == 0, second.stderr
    line = summary_numbers(second.stdout)
    assert f"{changes['changed']} new or changed, {changes['removed']} removed" in line, line
    assert exported_sqlite(sink) == reference_for(root)

    third = phrasecount(root, "--db", db, "--export", f"sqlite:{sink}")  # nothing changed
    assert "0 new or changed, 0 removed" in summary_numbers(third.stdout)


def test_default_sink_is_next_to_the_db_and_files_can_be_named_one_by_one(tmp_path):
    root, db = tmp_path / "corpus", tmp_path / "db"
    files = write_corpus(root, n=20, seed=5)
    result = phrasecount(*files[:10], "--db", db)
    assert result.returncode == 0, result.stderr
    sink = tmp_path / "db.phrases.sqlite"
    named = [Document(str(p), p.read_text(encoding="utf-8")) for p in files[:10]]
    assert exported_sqlite(sink) == reference_counts(named)
    # A file PATH covers only itself: files loaded earlier but not named now stay.
    again = phrasecount(*files[:5], "--db", db)
    assert "0 new or changed, 0 removed" in summary_numbers(again.stdout)
    assert exported_sqlite(sink) == reference_counts(named)


@pytest.mark.parametrize("processes", ["0", "2"])
def test_workers_in_the_loading_process_or_in_two_worker_processes(tmp_path, processes):
    """The default (one worker process) is tested above; 0 runs the workers
    in the process that loads, 2 in a group of two beside it."""
    root, db = tmp_path / "corpus", tmp_path / "db"
    files = write_corpus(root, n=220, seed=11)
    sink = tmp_path / "out.sqlite"
    first = phrasecount(root, "--db", db, "--export", f"sqlite:{sink}", "--processes", processes)
    assert first.returncode == 0, first.stderr
    assert exported_sqlite(sink) == reference_for(root)
    edit_delete_duplicate(files, root)
    second = phrasecount(root, "--db", db, "--export", f"sqlite:{sink}", "--processes", processes)
    assert second.returncode == 0, second.stderr
    assert exported_sqlite(sink) == reference_for(root)


def test_postgresql_sink(tmp_path, postgres_dsn):
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(postgres_dsn)
    url = "postgresql://{user}@/{dbname}?host={host}&port={port}".format(**params)
    root, db = tmp_path / "corpus", tmp_path / "db"
    files = write_corpus(root, n=200, seed=17)

    def exported() -> dict:
        with psycopg.connect(postgres_dsn) as conn:
            rows = conn.execute("SELECT phrase, doc_count, total_count FROM phrase_counts")
            return {phrase: (d, t) for phrase, d, t in rows.fetchall()}

    first = phrasecount(root, "--db", db, "--export", url)
    assert first.returncode == 0, first.stderr
    assert exported() == reference_for(root)
    edit_delete_duplicate(files, root)
    second = phrasecount(root, "--db", db, "--export", url)
    assert second.returncode == 0, second.stderr
    assert exported() == reference_for(root)


def test_builtin_corpus(tmp_path):
    """The README's main job: the stdlib's docstrings, one document per module."""
    from percolite.phrasecount.corpus import stdlib_documents

    db = tmp_path / "db"
    result = phrasecount("--db", db, "--threads", "4", timeout=300)
    assert result.returncode == 0, result.stderr
    documents = list(stdlib_documents())
    assert len(documents) >= 200
    assert exported_sqlite(tmp_path / "db.phrases.sqlite") == reference_counts(documents)
    assert f"{len(documents):,} read" in summary_numbers(result.stdout)


# -- loading: one loader, many transactions in flight --------------------------


@pytest.fixture
def in_process(monkeypatch):
    """``cli.run`` in this process; the sink it names for its workers
    (an environment variable) is unset again afterwards."""
    from percolite.phrasecount import app as pc
    from percolite.phrasecount import cli

    monkeypatch.setenv(pc.EXPORT_VARIABLE, "unset")
    monkeypatch.delenv(pc.EXPORT_VARIABLE)
    return cli, pc


def test_a_document_that_fails_to_load_fails_the_run_with_its_error(
    tmp_path, in_process, monkeypatch
):
    cli, pc = in_process
    root = tmp_path / "corpus"
    write_corpus(root, n=40, seed=31)
    real_load = pc.load

    def load(tx, location, content, content_id):
        if location.endswith("doc0007.txt"):
            raise RuntimeError("cannot load doc0007")
        return real_load(tx, location, content, content_id)

    monkeypatch.setattr(pc, "load", load)
    with pytest.raises(RuntimeError, match="cannot load doc0007"):
        cli.run([str(root)], tmp_path / "db", progress=False)


def test_documents_larger_than_the_text_allowed_in_flight_load_one_at_a_time(
    tmp_path, in_process, monkeypatch
):
    """Every document is larger than the text allowed in flight: each waits
    for the one before to commit (its transaction sees every earlier
    location), and the counts are still exact."""
    cli, pc = in_process
    monkeypatch.setattr(cli, "LOADER_IN_FLIGHT_CHARS", 1)
    real_load, locations_seen = pc.load, []

    def load(tx, location, content, content_id):
        locations_seen.append(len(pc.locations(tx)))
        return real_load(tx, location, content, content_id)

    monkeypatch.setattr(pc, "load", load)
    root = tmp_path / "corpus"
    write_corpus(root, n=30, seed=37)
    sink = tmp_path / "out.sqlite"
    summary = cli.run([str(root)], tmp_path / "db", export=f"sqlite:{sink}", progress=False)
    assert (summary.documents, summary.loaded) == (30, 30)
    assert locations_seen == list(range(30))
    assert exported_sqlite(sink) == reference_for(root)


# -- bad input -----------------------------------------------------------------


def test_unreadable_and_binary_files_are_skipped_and_reported(tmp_path):
    root, db = tmp_path / "corpus", tmp_path / "db"
    write_corpus(root, n=10, seed=23)
    (root / "image.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00binary")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (root / "dangling").symlink_to(root / "nowhere")
    sink = tmp_path / "out.sqlite"
    result = phrasecount(root, "--db", db, "--export", f"sqlite:{sink}")
    assert result.returncode == 0, result.stderr
    report = result.stdout + result.stderr
    assert "image.bin" in report and "binary" in report
    assert "latin1.txt" in report and "UTF-8" in report
    assert "dangling" in report
    assert "10 read" in summary_numbers(result.stdout)
    assert exported_sqlite(sink) == reference_for(root)


def test_missing_path_fails_after_doing_the_rest(tmp_path):
    root, db = tmp_path / "corpus", tmp_path / "db"
    write_corpus(root, n=5, seed=29)
    result = phrasecount(root, tmp_path / "no-such-dir", "--db", db)
    assert result.returncode != 0
    assert "no-such-dir" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "export, message",
    [
        ("ftp://example.com/x", "unknown export target 'ftp://example.com/x'"),
        ("sqlite:", "needs a file name"),
        ("mysql://localhost/db", "use sqlite:FILE or a postgresql:// URL"),
    ],
)
def test_bad_export_targets_fail_before_loading(tmp_path, export, message):
    db = tmp_path / "db"
    result = phrasecount(tmp_path, "--db", db, "--export", export)
    assert result.returncode == 2
    assert message in result.stderr
    assert not db.exists(), "nothing was created for a run that could not start"


def test_db_path_that_is_a_file(tmp_path):
    db = tmp_path / "db"
    db.write_text("not a store")
    result = phrasecount(tmp_path, "--db", db)
    assert result.returncode == 2
    assert "not a percolite store: it is a file" in result.stderr


def test_a_store_of_another_phrasecount_layout_is_refused_untouched(tmp_path):
    """A store whose phrase counts sit in another number of buckets (an
    earlier version's) cannot be bound to this app without its totals going
    wrong: the run refuses it, naming the difference, and changes nothing."""
    import percolite
    from percolite.phrasecount import app as pc

    older = percolite.App("phrasecount")
    older.combine_queue("phrases", buckets=pc.phrase_counts.buckets // 4, value_codec="int64s:2")
    db = tmp_path / "db"
    percolite.open(db, app=older).close()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("one two three four five six seven\n")
    result = phrasecount(tmp_path / "docs", "--db", db)
    assert result.returncode == 2, result.stderr
    assert "made by another version of phrasecount (" in result.stderr
    assert f"combine queue 'phrases': buckets 16 -> {pc.phrase_counts.buckets}" in result.stderr
    assert "Traceback" not in result.stderr and "upgrade" not in result.stderr
    with percolite.open(db) as env, env.transaction() as tx:
        assert next(iter(tx.scan(prefix="loc:")), None) is None  # nothing was loaded
    percolite.open(db, app=older).close()  # still bound to the app that made it


def test_sqlite_sink_in_a_missing_directory(tmp_path):
    result = phrasecount(tmp_path, "--db", tmp_path / "db", "--export", "sqlite:/no/such/dir/x.db")
    assert result.returncode != 0
    assert "/no/such/dir" in result.stderr


def test_an_export_file_that_is_not_a_database_fails_at_once(tmp_path):
    """Before the fix the workers retried the export forever and the job
    waited for them: a hang. The file is left as it was."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    result = phrasecount(tmp_path, "--db", tmp_path / "db", "--export", f"sqlite:{notes}")
    assert result.returncode == 2, result.stderr
    assert f"{notes}: not an SQLite database (file is not a database)" in result.stderr
    assert "Traceback" not in result.stderr
    assert notes.read_text() == "my notes\n"


def test_unreachable_postgresql(tmp_path):
    dsn = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"
    result = phrasecount(tmp_path, "--db", tmp_path / "db", "--export", dsn, timeout=60)
    assert result.returncode != 0
    assert "127.0.0.1" in result.stderr
