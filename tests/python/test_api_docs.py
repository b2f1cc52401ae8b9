"""docs/api.md is generated from the docstrings and must not go stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_api_docs.py"


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_api_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_up_to_date():
    text, _missing = load_generator().render()
    committed = (ROOT / "docs" / "api.md").read_text()
    assert committed == text, (
        "docs/api.md is stale: run `python scripts/gen_api_docs.py` "
        "(with the venv's python, after reinstalling the package)"
    )


def test_every_public_name_has_a_docstring():
    _text, missing = load_generator().render()
    assert not missing, f"public names without a docstring: {', '.join(missing)}"


def test_every_public_name_is_documented():
    import percolite
    import percolite.codecs
    import percolite.exporters

    page = (ROOT / "docs" / "api.md").read_text()
    for module in (percolite, percolite.exporters, percolite.codecs):
        for name in module.__all__:
            assert f"{module.__name__}.{name}" in page, f"{module.__name__}.{name} missing"
