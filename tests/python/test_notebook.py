"""The notebooks run from top to bottom, twice in one kernel: every cell,
no errors, and what they show is there.

The kernel must be this interpreter (the venv's), with percolite installed.
The test does not rely on whatever ``python3`` kernelspec the machine has (a
user-level one may point at another Python): it writes a kernelspec for
``sys.executable`` into a temporary ``JUPYTER_PATH``, which Jupyter searches
first, then checks from inside the kernel that ``sys.prefix`` is ours.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CHECK_INTERPRETER = "import sys; print(sys.prefix)"


@pytest.fixture
def jupyter_env(tmp_path, monkeypatch):
    """Jupyter's paths confined to ``tmp_path``, a ``python3`` kernelspec
    for this interpreter, and a non-interactive matplotlib backend."""
    # Opt in to platformdirs: some jupyter_core versions otherwise warn (DeprecationWarning,
    # an error under this suite's filterwarnings) that Jupyter's paths are moving there.
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    from ipykernel.kernelspec import write_kernel_spec

    write_kernel_spec(tmp_path / "jupyter" / "kernels" / "python3")  # argv[0]: sys.executable
    return tmp_path


def run_notebook(name, jupyter_env):
    """The notebook ``name`` run twice in one kernel; its cells with their outputs."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), (
        "commit the notebook without outputs (clear them) so diffs stay small"
    )
    nb.cells.insert(0, nbformat.v4.new_code_cell(CHECK_INTERPRETER))
    workdir = jupyter_env / "work"
    workdir.mkdir()
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    # Top to bottom twice in one kernel, as a notebook user re-runs it: declaring
    # the apps again and binding them again must work without a restart.
    with client.setup_kernel():
        for _round in range(2):
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)  # raises CellExecutionError when a cell fails

    kernel_prefix = nb.cells[0].outputs[0].text.strip()
    assert kernel_prefix == sys.prefix, f"the kernel ran {kernel_prefix}, not this venv"
    errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.output_type == "error"]
    assert not errors
    return nb.cells


def test_the_phrasecount_notebook_runs(jupyter_env):
    cells = run_notebook("phrasecount.ipynb", jupyter_env)
    # The rebinding cell: the first title went through the old observer, the second the new.
    printed = [
        o.text for cell in cells for o in cell.get("outputs", []) if o.output_type == "stream"
    ]
    assert any("b'ON SNAPSHOTS!' b'ON LEASES!!'" in text for text in printed), printed


def test_the_console_notebook_shows_cards_frames_and_the_console(jupyter_env):
    cells = run_notebook("console.ipynb", jupyter_env)

    def html_of(source):
        (cell,) = [c for c in cells if c.cell_type == "code" and c.source.strip() == source]
        return "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)

    assert "percolite.App" in html_of("app") and "<svg" in html_of("app")
    assert 'data-node="observer:count_words"' in html_of("app")
    frames = [html_of(c.source.strip()) for c in cells if "to_pandas()" in c.source]
    assert any("dataframe" in frame and "empty" in frame for frame in frames), frames
    view = html_of("view = percolite.ui.show(env, height=700)\nview")
    assert "<iframe" in view and "http://127.0.0.1:" in view and "token=" in view
    printed = "".join(
        o.text for c in cells for o in c.get("outputs", []) if o.output_type == "stream"
    )
    assert printed.strip().splitlines()[-1] == "3"  # documents with "the": d1, d2, d3 fixed


def test_the_webindex_notebook_loads_edits_and_reranks(jupyter_env):
    cells = run_notebook("webindex.ipynb", jupyter_env)
    printed = "".join(
        o.text for c in cells for o in c.get("outputs", []) if o.output_type == "stream"
    )
    assert "loaded 4 pages; 5 URIs known, 6 links" in printed
    assert "read 3 pages: 1 loaded, 1 removed" in printed
    # The notebook ran twice: the first round's load, then its edit.
    before, after = printed.split("most linked-to now:")[:2]
    after = after.split("loaded 4 pages")[0]
    # The FAQ page is gone but two pages link to it now; the guide lost the FAQ's link.
    assert "2 in, 0 out  https://example.org/faq.html  (not loaded)" in after
    assert "('https://example.org/api.html', 'guide')" in after
    assert "docs.python.org" in before and "docs.python.org" not in after
