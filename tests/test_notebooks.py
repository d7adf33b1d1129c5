"""Every solution notebook runs top to bottom, headless, with no error and nothing on stderr.

Without a GPU this runs the kernels under the CPU emulation; the GPU self-check runs the same notebooks on a GPU.
"""

import pytest

from fuselab import course
from fuselab import notebook as ipynb

from .notebook_runner import errors, run_cells, streams


def _code_cells(path):
    return ipynb.code_sources(path)


@pytest.mark.parametrize("lab", course.lab_names())
def test_solution_notebook_runs_headless(lab, tmp_path):
    notebook = next((course.SOLUTIONS / lab).glob("*.ipynb"))
    nb = run_cells(_code_cells(notebook), cwd=str(notebook.parent), timeout=900)
    assert errors(nb) == {}
    assert streams(nb, "stderr") == {}
