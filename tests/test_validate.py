"""``nbgrader validate`` of a correct notebook on a machine without a GPU says Success, with nothing to warn about.

Validate (JupyterLab's button, or the command) is a student's own check. A speed test cannot measure anything
there, so it must not score 0 ("you WILL NOT receive full credit"); a test cell that ends in a check must give
nbgrader no value it cannot read ("cannot be converted to a float"); and the heavy demos skip, as when grading.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import REPO


def _cell(source, grade_id=None, points=0):
    metadata = {}
    if grade_id:
        metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "locked": True, "points": points,
                                "schema_version": 3, "solution": False}
    return {"cell_type": "code", "execution_count": None, "metadata": metadata, "outputs": [], "source": source}


NOTEBOOK_CELLS = [
    _cell("import torch\nimport fuselab\n\n"
          "def make(shape, seed):\n    return (torch.randn(shape),)"),
    # a test cell that ends in a check's result, as the labs' test cells do
    _cell("fuselab.check(lambda x, out: out.copy_(x.exp()), torch.exp, make, [(1,), (7,), (3, 5)], name='exp')\n"
          "fuselab.check(lambda x, out: out.copy_(2 * x), lambda x: 2 * x, make, [(4,)], name='double')",
          "test_checks", points=2),
    # the demos ask grading_mode() whether to skip their heavy GPU work
    _cell("assert fuselab.grading_mode(), 'Validate must skip the heavy demos, as grading does'", "test_mode", 1),
    # a speed cell, as the labs write it: nothing to measure without a GPU, and nothing is called
    _cell("def never(*args, **kwargs):\n    raise AssertionError('nothing may be timed here')\n\n"
          "points = fuselab.speed.speedup_test('lab0.add_relu_mul', candidate=never, reference_op=never,\n"
          "    reference=never, make_inputs=never, module=None, max_points=4)\npoints",
          "test_speedup", points=4),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path of Validate")
def test_validate_of_a_correct_notebook_without_a_gpu_says_success(tmp_path):
    notebook = {"cells": NOTEBOOK_CELLS, "nbformat": 4, "nbformat_minor": 5,
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}
    path = tmp_path / "lab.ipynb"
    path.write_text(json.dumps(notebook))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    for name in ("FUSELAB_GRADING", "FUSELAB_GRADE_LOG", "NBGRADER_VALIDATING"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(path)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said
    assert "Success! Your notebook passes all the tests." in result.stdout, said
    assert "cannot be converted" not in said and "WILL NOT" not in said, said


def test_validate_with_the_students_configuration_shows_a_failed_checks_explanation_whole(tmp_path):
    # nbgrader cuts each line of a failure at Validator.width (90 by default); a check's explanation is one line
    # of hundreds of characters, and the cut took the part that named the bug
    explanation = "the result depends on the order the threads of a block run in: " + "x" * 300 + " missing barrier"
    cells = [_cell(f"raise AssertionError({explanation!r})", "test_long", points=1)]
    notebook = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}
    (tmp_path / "lab.ipynb").write_text(json.dumps(notebook))
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(REPO / "student"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    for name in ("FUSELAB_GRADING", "FUSELAB_GRADE_LOG", "NBGRADER_VALIDATING"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-m", "nbgrader", "validate", "lab.ipynb"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert explanation in result.stdout, result.stdout[-2000:]


def _validate_with_the_students_configuration(tmp_path, cells):
    notebook = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}
    (tmp_path / "lab.ipynb").write_text(json.dumps(notebook))
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(REPO / "student"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    for name in ("FUSELAB_GRADING", "FUSELAB_GRADE_LOG", "NBGRADER_VALIDATING"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "nbgrader", "validate", "lab.ipynb"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_validates_dividers_keep_nbgraders_width_while_explanations_stay_whole(tmp_path):
    # the configuration's width kept explanations whole, and stretched every divider to 1000 '=' with them
    explanation = "the K loop drops the last partial tile: " + "y" * 300 + " K tail"
    result = _validate_with_the_students_configuration(
        tmp_path, [_cell(f"raise AssertionError({explanation!r})", "test_one", points=1),
                   _cell(f"raise AssertionError({explanation!r})", "test_two", points=1)])
    dividers = [line for line in result.stdout.splitlines() if line and set(line) == {"="}]
    assert len(dividers) == 2 and all(len(line) <= 100 for line in dividers), result.stdout[-2000:]
    assert explanation in result.stdout, result.stdout[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path of Validate")
def test_validate_without_a_gpu_says_how_many_points_it_did_not_measure(tmp_path):
    result = _validate_with_the_students_configuration(tmp_path, NOTEBOOK_CELLS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success! Your notebook passes all the tests." in result.stdout, result.stdout
    assert "4 points not measured here (no GPU): test_speedup" in result.stdout, result.stdout
    assert result.stdout.count("points not measured here") == 1, result.stdout
    # nothing of the kernel's own start reaches the student (ipykernel warns of every kernel over plain TCP)
    assert "without encryption" not in result.stdout + result.stderr, result.stderr[-2000:]
