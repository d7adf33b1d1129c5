"""The notebook run (nbgrader autograde in a scratch course) as the grader reads it back."""

import json
import os

import pytest

from fuselab import notebook as ipynb
from fuselab.grading.sandbox import isolate
from fuselab.grading.records import nbgrader_run
from fuselab.grading.run import pipeline
from fuselab.grading.recheck import clean as recheck

from .conftest import REPO as ROOT


@pytest.mark.slow
def test_a_notebook_nbgrader_cannot_finish_scores_nothing_rather_than_zero(tmp_path):
    """nbgrader keeps a 0 for every cell of a notebook it could not run to the end, passed tests included; read
    as scores, an honest student's hang would show as the notebook run disagreeing with the clean recheck on the
    tests before it (seen on the H200 with the ``endless`` sample)."""
    course = tmp_path / "course"
    nbgrader_run.prepare_course(course, ["lab0"])
    nbgrader_run.add_students(course / "gradebook.db", ["s"])
    notebook = json.loads((ROOT / "grader" / "examples" / "correct" / "lab0" / "lab0.ipynb").read_text())
    hung = [c for c in notebook["cells"] if ipynb.grade_id(c) == "unfused_source"]
    assert hung, "the lab 0 notebook lost its unfused_source cell"
    # after test_dram_bytes, which passes; deaf to the interrupt nbgrader sends at the time limit, like a kernel
    # that never ends (an interruptible cell would just fail and nbgrader would go on)
    hung[0]["source"] = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)\n"
    submitted = tmp_path / "lab0.ipynb"
    submitted.write_text(json.dumps(notebook))

    run = nbgrader_run.autograde_one(course, "s", "lab0", submitted, tmp_path / "work", cell_timeout=5,
                                     wall_timeout=180, limits=isolate.Limits(),
                                     env=dict(os.environ, FUSELAB_CACHE_DIR=str(tmp_path / "cache")))
    assert run["autograded"] is None and "could not run the notebook to the end" in run["error"]
    assert run["cells"]["test_dram_bytes"] == [None, 1.0]
    assert all(score is None for score, _ in run["cells"].values())

    sub = type("Sub", (), {"student": "s", "lab": "lab0"})()
    clean = recheck.CleanResult(cells={"test_dram_bytes": recheck.CellVerdict("test_dram_bytes", 1.0, 1.0, "passed")})
    notes = []
    result = pipeline.combine(sub, clean, run, notes)
    assert result["total"] == 1.0 and result["disagreements"] == []
    assert result["cells"]["test_dram_bytes"]["notebook_points"] is None
    assert notes == [run["error"]]  # the report and feedback still say why the notebook run has no scores
