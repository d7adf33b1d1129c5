"""A submission's two runs: nbgrader's run of the notebook starts beside the clean recheck once the recheck starts
its first speed test (its builds and correctness tests done), never earlier, and not at all after a grader error."""

import threading
import time
from types import SimpleNamespace

import pytest

from fuselab.grading import pipeline
from fuselab.labs import registry


def _run(lab="lab0"):
    return SimpleNamespace(sub=SimpleNamespace(student="ann", lab=lab), clean=None, notebook_run=None)


def test_the_notebook_run_starts_when_the_recheck_starts_a_speed_test(monkeypatch):
    speed_cell = sorted(registry.speed_grade_ids("lab0"))[0]
    events = []
    inside_speed_test = threading.Event()

    def recheck(run, on_cell=None):
        for grade_id in ("test_unfused", None, "test_fused"):
            on_cell(grade_id)
            events.append(("recheck", grade_id))
            time.sleep(0.05)
        on_cell(speed_cell)
        events.append(("recheck", speed_cell))
        inside_speed_test.set()
        time.sleep(0.3)  # the speed test: the notebook run goes on meanwhile
        events.append(("recheck", "end"))
        run.clean = "clean"

    def notebook(run):
        assert inside_speed_test.wait(5)
        events.append(("notebook", "start"))
        run.notebook_run = "notebook"

    monkeypatch.setattr(pipeline, "clean_recheck", recheck)
    monkeypatch.setattr(pipeline, "notebook_run", notebook)
    run = _run()
    pipeline.both_runs(run)
    assert (run.clean, run.notebook_run) == ("clean", "notebook")
    started = events.index(("notebook", "start"))
    assert events.index(("recheck", speed_cell)) < started < events.index(("recheck", "end"))


def test_without_a_speed_test_the_notebook_run_comes_after_the_recheck(monkeypatch):
    events = []
    monkeypatch.setattr(pipeline, "clean_recheck",
                        lambda run, on_cell=None: (on_cell("test_fused"), events.append("recheck")))
    monkeypatch.setattr(pipeline, "notebook_run", lambda run: events.append("notebook"))
    pipeline.both_runs(_run())
    assert events == ["recheck", "notebook"]


def test_a_grader_error_in_the_recheck_starts_no_notebook_run(monkeypatch):
    started = []

    def broken(run, on_cell=None):
        raise pipeline.GradingRefused("the sandbox stopped working")

    monkeypatch.setattr(pipeline, "clean_recheck", broken)
    monkeypatch.setattr(pipeline, "notebook_run", lambda run: started.append(run))
    with pytest.raises(pipeline.GradingRefused):
        pipeline.both_runs(_run())
    assert started == []


def test_an_error_of_the_notebook_run_reaches_the_submission(monkeypatch):
    monkeypatch.setattr(pipeline, "clean_recheck", lambda run, on_cell=None: None)

    def broken(run):
        raise OSError("disk full")

    monkeypatch.setattr(pipeline, "notebook_run", broken)
    with pytest.raises(OSError, match="disk full"):
        pipeline.both_runs(_run())
