"""The examples users copy first must work as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


@pytest.mark.parametrize(
    "document, index",
    [
        ("README.md", 0),
        ("docs/quickstart.md", 0),
        ("docs/notifications.md", 0),
        ("docs/transactions.md", 0),
        ("docs/transactions.md", 1),
        ("docs/transactions.md", 2),
        ("docs/combine_queue.md", 0),
        ("docs/combine_queue.md", 1),
        ("docs/sharded_counters.md", 0),
        ("docs/exporters.md", 0),
        ("docs/export_queue.md", 0),
        ("docs/operations.md", 0),
    ],
)
def test_example_runs(tmp_path, document, index):
    code = python_blocks(ROOT / document)[index]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_testing_guide_example_passes_under_plain_pytest(tmp_path):
    """docs/testing.md's example is a test file: saved as it says, plain
    pytest (no conftest: the fixtures come from the installed plugin) passes
    it, on the memory backend and on LMDB."""
    (tmp_path / "test_lengths.py").write_text(python_blocks(ROOT / "docs" / "testing.md")[0])
    for options in ([], ["--percolite-backend=lmdb"]):
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout


def test_simulation_guide_example_finds_the_missing_seq_guard(tmp_path):
    """docs/testing.md's simulation example passes as written, and with the
    guard left out (GUARDED = False) it fails, naming a seed."""
    code = python_blocks(ROOT / "docs" / "testing.md")[1]
    (tmp_path / "test_totals.py").write_text(code)
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_totals.py"]
    passed = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert passed.returncode == 0 and "21 passed" in passed.stdout, passed.stdout
    (tmp_path / "test_totals.py").write_text(code.replace("GUARDED = True", "GUARDED = False"))
    failed = subprocess.run(
        [*run, "-k", "test_totals and not any"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert failed.returncode == 1, failed.stdout
    assert re.search(r"FAILED test_totals.py::test_totals\[seed=\d+\]", failed.stdout)


def test_readme_example_prints_what_the_readme_says(tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = python_blocks(ROOT / "README.md")[0]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    printed = result.stdout.strip()
    assert printed == "[('be', 2), ('to', 2), ('do', 1), ('is', 1), ('not', 1), ('or', 1)]"
    assert f"This prints `{printed}`" in readme


def test_quickstart_runs_top_to_bottom(tmp_path):
    """The quickstart's blocks build on nothing but each other: run them in
    order as one program, and check the last output its comments promise."""
    code = "\n".join(python_blocks(ROOT / "docs" / "quickstart.md"))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "[('be', 2), ('never', 1), ('not', 1), ('now', 1), ('or', 2), ('to', 2)]"
    )


def test_combine_queue_export_to_example_prints_what_it_says(tmp_path):
    code = python_blocks(ROOT / "docs" / "combine_queue.md")[1]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "{'be': 1}"


def test_transactions_loader_examples_print_what_their_comments_say(tmp_path):
    """The loading section's two examples: a loader (durable futures, exact
    counts) and the same from asyncio."""
    blocks = python_blocks(ROOT / "docs" / "transactions.md")
    printed = []
    for code in blocks[1:3]:
        assert "loader" in code
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        printed.append(result.stdout.splitlines())
    assert printed == [["16000", "4000 2000"], ["500 k0 stored", "last"]]


def test_operations_memory_example_prints_what_its_comment_says(tmp_path):
    code = python_blocks(ROOT / "docs" / "operations.md")[0]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "memory False"


def test_operations_jupyter_example_prints_what_its_comment_says(tmp_path):
    code = python_blocks(ROOT / "docs" / "operations.md")[1]
    assert "to_pandas" in code
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[{'key': 'be', 'value': 2}, {'key': 'to', 'value': 2}]"


def relative_links(path: Path) -> list[str]:
    """The targets of the Markdown links in ``path`` that point into the repository."""
    targets = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and t.split("#")[0]]


@pytest.mark.parametrize(
    "document",
    [
        "README.md",
        "CONTRIBUTING.md",
        *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))),
    ],
)
def test_links_point_at_files_that_exist(document):
    path = ROOT / document
    missing = [t for t in relative_links(path) if not (path.parent / t).exists()]
    assert missing == [], f"{document} links to files that do not exist"
