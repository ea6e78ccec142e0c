"""The notebooks: stored without outputs, identical to what notebooks/make_notebooks.py writes, and they run top to
bottom on the bundled sample (each notebook asserts its own results: stats vs frames, export vs source)."""

from __future__ import annotations

import importlib.util
import os

import nbformat
import pytest

from helpers import REPO

NOTEBOOKS = REPO / "notebooks"
NAMES = ["explore.ipynb", "build_subset.ipynb"]


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", NOTEBOOKS / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", NAMES)
def test_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name}: stale outputs; run make_notebooks.py"


@pytest.mark.parametrize("name", NAMES)
def test_stored_notebook_is_what_the_generator_writes(name):
    stored = nbformat.read(NOTEBOOKS / name, as_version=4)
    fresh = _generator().build(_generator().NOTEBOOKS[name])
    assert [(c.cell_type, c.source) for c in stored.cells] == [(c.cell_type, c.source) for c in fresh.cells], (
        f"{name} differs from notebooks/make_notebooks.py: edit the generator and rerun it")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(name, tmp_path):
    NotebookClient = pytest.importorskip(
        "nbclient", reason="nbclient, ipykernel are in the test-slow extra (pip install -e '.[test-slow]')").NotebookClient

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # The kernel inherits this process's environment: the per-session LSQL_CACHE_DIR and a temp dir for exports.
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path)
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        if old is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert images, f"{name} drew no figure"
