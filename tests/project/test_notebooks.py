"""The example notebooks: committed without outputs, and every cell runs top to bottom in a
python3 kernel (nbclient) on the real reference models (slow: ~20 s, ~15 s, ~40 s and ~3 min on
2 CPU cores).

Needs `pip install nbclient nbformat ipykernel`; skipped when missing, except under CI (CI=true).
"""
import os
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = ["quickstart.ipynb", "syntax.ipynb", "patching.ipynb", "ioi.ipynb"]
CELL_TIMEOUT_S = 900


def _require(module: str):
    try:
        return __import__(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed: CI must install the dev extra", pytrace=False)
        pytest.skip(f"needs {module} (pip install nbclient nbformat ipykernel)")


def test_every_example_notebook_is_here_and_run():
    """Without nbformat too: a notebook that disappears fails, not skips; a new one joins NOTEBOOKS."""
    assert sorted(path.name for path in EXAMPLES.glob("*.ipynb")) == sorted(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_has_no_outputs(name):
    nbformat = _require("nbformat")
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code, f"{name} has no code cells"
    for i, cell in enumerate(code):
        assert cell.outputs == [], f"{name}: code cell {i} has outputs (strip them before committing)"
        assert cell.execution_count is None, f"{name}: code cell {i} has an execution count"
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.fixture
def kernel_of_this_python(tmp_path, monkeypatch):
    """A `python3` kernelspec that runs this interpreter (not whatever `python` is on PATH)."""
    _require("ipykernel")
    from ipykernel.kernelspec import write_kernel_spec

    write_kernel_spec(tmp_path / "kernels" / "python3")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))  # searched before the system's kernelspecs
    return "python3"


def _outputs(nb, mime: str) -> list:
    return [o["data"][mime] for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
            if o.output_type in ("execute_result", "display_data") and mime in o.get("data", {})]


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name, kernel_of_this_python):
    nbformat = _require("nbformat")
    nbclient = _require("nbclient")
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=kernel_of_this_python,
                                     resources={"metadata": {"path": str(EXAMPLES)}})
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        assert cell.execution_count is not None, f"{name}: code cell {i} did not run"
        assert not [o for o in cell.outputs if o.output_type == "error"], f"{name}: code cell {i} failed"
    if name == "quickstart.ipynb":
        shown = [html for html in _outputs(nb, "text/html") if "headscope-analysis" in html]
        assert len(shown) == 1 and "* plotly.js v" in shown[0]  # the analysis, with plotly.js for the page
    if name == "ioi.ipynb":  # the AtP heatmap and the circuit's graph
        assert len(_outputs(nb, "application/vnd.plotly.v1+json")) == 2, f"{name} did not show its two figures"
    figures = _outputs(nb, "application/vnd.plotly.v1+json") + _outputs(nb, "text/html")
    assert figures, f"{name} showed no figure"


def test_kernelspec_fixture_points_at_this_interpreter(kernel_of_this_python):
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(kernel_of_this_python)
    assert spec.argv[0] == sys.executable
