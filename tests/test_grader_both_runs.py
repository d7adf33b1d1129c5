"""A submission's two runs: nbgrader's run of the notebook starts with the clean recheck, but its first cell waits
at a gate the grader opens once the recheck starts its first speed test (its builds copied, its correctness tests
done), never earlier; without a speed test, or after a grader error, the gate opens when the recheck ends."""

import time
from types import SimpleNamespace

import pytest

from fuselab.grading.records import nbgrader_run
from fuselab.grading.run import pipeline
from fuselab.labs import registry


def _run(tmp_path, lab="lab0"):
    workdir = tmp_path / "work"
    workdir.mkdir()
    return SimpleNamespace(sub=SimpleNamespace(student="ann", lab=lab), clean=None, notebook_run=None,
                           workdir=workdir, settings=SimpleNamespace(sandbox=False), notes=[])


def test_the_notebooks_first_cell_waits_until_the_recheck_starts_a_speed_test(tmp_path, monkeypatch):
    speed_cell = sorted(registry.speed_grade_ids("lab0"))[0]
    events = []

    def recheck(run, on_cell=None):
        for grade_id in ("test_unfused", None, "test_fused"):
            on_cell(grade_id)
            events.append(("recheck", grade_id))
            time.sleep(0.05)
        on_cell(speed_cell)
        events.append(("recheck", speed_cell))
        time.sleep(0.3)  # the speed test: the notebook run goes on meanwhile
        events.append(("recheck", "end"))
        run.clean = "clean"

    def notebook(run, gate):
        events.append(("notebook", "kernel started"))  # nbgrader and its kernel start at once
        while not gate.exists():
            time.sleep(0.01)
        events.append(("notebook", "first cell"))
        run.notebook_run = {"phases": {"start": 1.0, "cells": 1.0, "finish": 0.1}}

    monkeypatch.setattr(pipeline, "clean_recheck", recheck)
    monkeypatch.setattr(pipeline, "notebook_run", notebook)
    run = _run(tmp_path)
    pipeline.both_runs(run)
    assert run.clean == "clean"
    assert events.index(("notebook", "kernel started")) < events.index(("recheck", "test_fused"))
    first_cell = events.index(("notebook", "first cell"))
    assert events.index(("recheck", speed_cell)) < first_cell < events.index(("recheck", "end"))
    assert "waiting for the recheck" in run.notebook_run["phases"]


def test_without_a_speed_test_the_gate_opens_when_the_recheck_ends(tmp_path, monkeypatch):
    events = []

    def notebook(run, gate):
        while not gate.exists():
            time.sleep(0.01)
        events.append("notebook")

    monkeypatch.setattr(pipeline, "clean_recheck",
                        lambda run, on_cell=None: (on_cell("test_fused"), time.sleep(0.1), events.append("recheck")))
    monkeypatch.setattr(pipeline, "notebook_run", notebook)
    pipeline.both_runs(_run(tmp_path))
    assert events == ["recheck", "notebook"]


def test_a_grader_error_in_the_recheck_stops_the_notebook_run_at_its_gate(tmp_path, monkeypatch):
    said = []

    def broken(run, on_cell=None):
        raise pipeline.GradingRefused("the sandbox stopped working")

    def notebook(run, gate):
        while not gate.exists():
            time.sleep(0.01)
        said.append(gate.read_text())

    monkeypatch.setattr(pipeline, "clean_recheck", broken)
    monkeypatch.setattr(pipeline, "notebook_run", notebook)
    with pytest.raises(pipeline.GradingRefused):
        pipeline.both_runs(_run(tmp_path))
    assert said == [nbgrader_run.STOP]  # never left waiting, and told not to run a cell


def test_an_error_of_the_notebook_run_reaches_the_submission(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "clean_recheck", lambda run, on_cell=None: None)

    def broken(run, gate):
        raise OSError("disk full")

    monkeypatch.setattr(pipeline, "notebook_run", broken)
    with pytest.raises(OSError, match="disk full"):
        pipeline.both_runs(_run(tmp_path))


def _cpu_ticks(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _idle_after_start(process, timeout=120):
    """Wait until ``process`` stops using the CPU (its imports done); False if it ended or never settled."""
    deadline, last = time.monotonic() + timeout, -1
    while time.monotonic() < deadline and process.poll() is None:
        ticks = _cpu_ticks(process.pid)
        if ticks == last:
            return True
        last = ticks
        time.sleep(1.0)
    return False


@pytest.mark.parametrize("go", [True, False])
def test_the_gate_startup_file_imports_then_waits_for_the_gate(tmp_path, go):
    import os
    import subprocess
    import sys
    gate = tmp_path / nbgrader_run.GATE_NAME
    script = tmp_path / "startup.py"
    script.write_text(nbgrader_run.GATE_STARTUP + "\nimport sys\nprint('first cell', 'torch' in sys.modules, "
                      "sorted(k for k in dir() if 'fuselab' in k))\n")
    process = subprocess.Popen([sys.executable, str(script)], env=dict(os.environ, **{nbgrader_run.GATE_ENV: str(gate)}),
                               stdout=subprocess.PIPE, text=True)
    try:
        assert _idle_after_start(process)  # imported, and now idle: waiting at the gate, not importing
        nbgrader_run.open_gate(gate, go=go)
        out, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    if go:
        assert out.strip() == "first cell True []"  # torch already imported, no name of its own left behind
    else:
        assert out == "" and process.returncode == 3  # stopped: no cell runs


def test_by_default_only_the_clean_recheck_runs(tmp_path, monkeypatch):
    """nbgrader's own run is asked for (--notebook-run); without it the recheck's verdicts are all there is."""
    def recheck(run, on_cell=None):
        run.clean = "clean"

    def notebook(run, gate):
        raise AssertionError("nbgrader's run was not asked for")
    monkeypatch.setattr(pipeline, "clean_recheck", recheck)
    monkeypatch.setattr(pipeline, "notebook_run", notebook)
    run = _run(tmp_path)
    run.settings.notebook_run = False
    pipeline.graded_runs(run)
    assert run.clean == "clean" and run.notebook_run == pipeline.no_notebook_run()
    assert run.notebook_run["seconds"] is None and run.notebook_run["cells"] == {}


def test_the_cells_a_person_grades_come_from_the_instructors_notebook():
    def cell(grade_id, **meta):
        return {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": grade_id, **meta}}, "source": ""}
    instructor = {"cells": [cell("answer", grade=True, solution=True), cell("test_fused", grade=True, solution=False),
                            cell("fused_source", grade=False, solution=True), cell("task", task=True),
                            dict(cell("written", grade=True), cell_type="markdown"),
                            {"cell_type": "markdown", "metadata": {}, "source": "text"}]}
    assert pipeline.hand_graded(instructor) == ["answer", "task", "written"]


@pytest.mark.parametrize("flag", [True, False])
def test_the_notebook_run_is_asked_for_on_the_command_line(tmp_path, monkeypatch, flag):
    from fuselab.grading.run import cli
    seen = []

    def grade(submissions, settings):
        seen.append(settings)
        raise pipeline.GradingRefused("stop here")
    monkeypatch.setattr(pipeline, "grade", grade)
    (tmp_path / "class").mkdir()  # the course folder is never inside the submissions (the command refuses it)
    argv = ["grade", str(tmp_path / "class"), "--out", str(tmp_path / "out")] + (["--notebook-run"] if flag else [])
    assert cli.main(argv) == 3
    assert seen[0].notebook_run is flag
