"""The API reference is pdoc's rendering of the docstrings
(scripts/build-api-docs.sh, run in CI): it builds without a warning, names
every public name of percolite, percolite.exporters and percolite.codecs,
and each of those has a docstring."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import percolite
import percolite.codecs
import percolite.exporters
import pytest
from _isolated import run_command

ROOT = Path(__file__).resolve().parents[2]
MODULES = (percolite, percolite.exporters, percolite.codecs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("api-docs")
    result = run_command([ROOT / "scripts" / "build-api-docs.sh", out], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_the_reference_builds_without_warnings(reference):
    assert (reference / "index.html").exists()
    assert (reference / "percolite.html").exists()


def test_every_public_name_has_a_place_in_the_reference(reference):
    for module in MODULES:
        page = reference.joinpath(*module.__name__.split(".")).with_suffix(".html")
        html = page.read_text(encoding="utf-8")
        for name in module.__all__:
            if inspect.ismodule(getattr(module, name)):  # a page of its own
                assert page.with_suffix("").joinpath(f"{name}.html").exists(), name
            else:
                assert f'id="{name}"' in html, f"{module.__name__}.{name} missing from {page.name}"


def test_every_public_name_has_a_docstring():
    missing = []
    for module in MODULES:
        for name in module.__all__:
            value = getattr(module, name)
            if (inspect.isclass(value) or callable(value)) and not inspect.getdoc(value):
                missing.append(f"{module.__name__}.{name}")
    assert not missing, f"public names without a docstring: {', '.join(missing)}"


def test_a_warning_fails_the_build(tmp_path):
    """The check itself: a module whose annotation cannot be resolved makes
    pdoc warn, and with warnings as errors the build fails."""
    (tmp_path / "broken.py").write_text(
        "from __future__ import annotations\n"
        "from typing import NamedTuple\n"
        "class Record(NamedTuple):\n"
        '    """A record."""\n'
        "    field: Undefined\n"
    )
    result = run_command(
        [sys.executable, "-W", "error", "-m", "pdoc", "broken", "-o", tmp_path / "out"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert result.returncode != 0 and "Undefined" in result.stderr
