"""Every phase of a grading run shows its progress on the grader's stderr (course set-up, reference runs,
submissions, gradebook, feedback and report), a one-student regrade too, and nothing of it reaches stdout."""

from fuselab.grading.run import pipeline

from .test_hand_grading import _fake_grade, graded_run  # noqa: F401 - the fixture: a small run, graded cheaply

PHASES = ("course set-up", "reference runs", "gradebook", "feedback", "export and report")


def test_a_one_student_regrade_shows_every_phase_on_stderr(graded_run, capsys, monkeypatch):
    source, out, settings = graded_run
    capsys.readouterr()
    regraded = []
    monkeypatch.setattr(pipeline, "grade_submission",
                        lambda sub, *a, **k: regraded.append(sub.student) or _fake_grade(sub, out))
    settings.students, settings.force, settings.progress = ["ann"], True, True
    result = pipeline.grade(source, settings)
    said = capsys.readouterr()
    assert regraded == ["ann"]
    # the regrade succeeded: ann's result is this run's, nothing failed in the grader
    assert [(r.student, r.lab) for r in result.results] == [("ann", "lab0")] and result.graded_now == 1
    assert not [p for p in result.problems if p.grader_failed], result.problems
    assert result.results[0].total == result.results[0].max_total > 0
    for phase in (*PHASES, "grading"):
        assert f"{phase}: 100%" in said.err, (phase, said.err[-2000:])
    assert said.out == ""


def test_without_progress_nothing_is_drawn(graded_run, capsys):
    source, out, settings = graded_run
    capsys.readouterr()
    settings.progress = False
    pipeline.grade(source, settings)
    said = capsys.readouterr()
    assert not any(phase in said.err for phase in PHASES) and said.out == ""
