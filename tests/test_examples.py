"""The tutorials in examples/: committed without outputs, and executed end to end with the small settings.

Each notebook runs in a fresh IPython kernel on *this* interpreter (a kernelspec written to a temporary
JUPYTER_PATH, so a `python3` kernel registered elsewhere on the machine cannot be picked up instead), with
`HF_DSPARK_NOTEBOOK_SMALL=1`, torch threads as in the rest of the suite and a temporary working directory, so
nothing the notebooks write lands in the repository. Every cell that shows a plot must have produced a PNG.
"""

import json
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOKS = ["01_quickstart.ipynb", "02_train_your_own_drafter.ipynb", "03_scheduler_and_profiles.ipynb"]
CELL_TIMEOUT_S = 600  # per cell; each notebook takes well under a minute with the small settings on 2 cores


def test_examples_are_the_three_tutorials():
    assert sorted(p.name for p in EXAMPLES.glob("*.ipynb")) == NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebooks_have_no_outputs(name):
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "a tutorial without code"
    for i, cell in enumerate(code):
        assert cell.outputs == [], f"{name}: code cell {i} has outputs (strip them before committing)"
        assert cell.execution_count is None, f"{name}: code cell {i} has an execution count"
    assert "widgets" not in nb.metadata, f"{name}: widget state in the metadata"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "HF_DSPARK_NOTEBOOK_SMALL" in first.source, \
        f"{name}: the first cell must say what the small and the full settings are"


def _shows_a_plot(source: str) -> bool:
    return "plt.show()" in source or "display(Image(" in source


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_with_small_settings(name, tmp_path, monkeypatch):
    kernels = tmp_path / "jupyter" / "kernels" / "python3"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (hf_dspark tests)", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("HF_DSPARK_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the Hub
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("HF_DSPARK_TEST_THREADS", "1"))
    work = tmp_path / "work"
    work.mkdir()
    before = sorted(p.name for p in EXAMPLES.iterdir())

    nb = nbformat.read(EXAMPLES / name, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, allow_errors=False,
                            resources={"metadata": {"path": str(work)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError, with the traceback, on the first failing cell
    print(f"{name}: executed in {time.perf_counter() - t0:.1f} s")

    assert any(_shows_a_plot(c.source) for c in nb.cells if c.cell_type == "code"), "a tutorial without a plot"
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.source
        if _shows_a_plot(cell.source):
            assert any("image/png" in o.get("data", {}) for o in cell.outputs
                       if o.output_type in ("display_data", "execute_result")), f"no plot rendered by:\n{cell.source}"
    assert sorted(p.name for p in EXAMPLES.iterdir()) == before, "the notebook wrote into examples/"
