"""The sample class through the whole grader on the CPU: every sample gets the verdict it deserves, speed tests
are "not measured (no GPU)", feedback hides the hidden tests, the gradebook holds the final scores, a second run
resumes instead of regrading, and the course's own folders are untouched.

What CI grades: every Lab 0 sample but those that differ only on a GPU (`samplecheck.GPU_ONLY`) or that CI grades
beside CPU hogs (`samplecheck.GRADED_APART`, tests/test_grader_load.py), the "correct" sample of every other lab, and the samples that prove the clean
recheck's isolation boundary outside Lab 0 (`samplecheck.CI_SAMPLES`: a lying int, honest fold idioms, a network
"folded" into functional batch norms); the labs' other samples run on the GPU self-check, where time is cheaper
than on CI's two cores.
"""

import hashlib
import html
import json
import re
import time
from pathlib import Path

import pytest
import torch

from fuselab import course
from fuselab.course import sample_class as samples
from fuselab import notebook as ipynb
from fuselab.grading.run import pipeline, samplecheck
from fuselab.grading.gpus import schedule

from . import test_grader_feedback

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU grading path (the GPU self-check "
                                                                  "grades the sample class on a GPU)")
CELL_TIMEOUT = 30  # a test's own time: three times what the slowest honest one needs on CI


def _ci_class():
    return samplecheck.ci_class()


def _tree_digest(*folders):
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file() and ".ipynb_checkpoints" not in path.parts:
                digest.update(str(path).encode() + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def graded(tmp_path_factory, instructor_references):
    out = tmp_path_factory.mktemp("grading")
    examples = out / "examples"
    wanted = _ci_class()
    samplecheck.stage(examples, wanted)  # only the CI class, from the committed examples
    secret = test_grader_feedback.write_nosy_submission(examples)  # and one that reads secrets into its feedback
    before = _tree_digest(course.SOLUTIONS, course.LABS, course.GRADER / "nbgrader_config.py")
    # the session's reference runs, kept in the run's folder: the grading reuses them (the references' own cache is
    # tests/test_grader_reference_cache.py); their verdicts still reach result.reference, checked below
    instructor_references.into(out / "run", sorted({lab for _, lab in wanted}))
    # two submissions at once where there are two cores (CI's machine): each submission keeps about one core busy
    settings = pipeline.Settings(out=out / "run", cell_timeout=CELL_TIMEOUT, submission_timeout=400,
                                 progress=False, cpu_workers=min(2, schedule.available_cores()))
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(test_grader_feedback.SECRET_ENV, secret)  # in the grader's environment, as a TA's token
        result = pipeline.grade(examples, settings)
    seconds = time.monotonic() - started
    return {"result": result, "examples": examples, "settings": settings, "before": before, "seconds": seconds,
            "wanted": wanted, "secret": secret}


def test_every_sample_gets_the_grade_it_deserves(graded):
    result = graded["result"]
    assert result.problems == []
    rows = samplecheck.compare(result.results, on_gpu=False)
    assert sorted((r["sample"], r["lab"]) for r in rows) == graded["wanted"]
    assert all(r["ok"] for r in rows), "\n" + samplecheck.table(rows)
    for lab, reference in result.reference.items():
        assert reference["broken"] == [], f"the instructor's {lab} fails on this machine: {reference}"


def test_speed_tests_are_not_measured_without_a_gpu(graded):
    for r in graded["result"].results:
        for grade_id, cell in r.cells.items():
            if grade_id.startswith("test_speedup") and cell.status not in ("crashed", "timed out", "not run",
                                                                           "failed"):
                assert cell.points == 0 and cell.status == "not measured (no GPU)", (r.student, cell)
    grades = (graded["result"].out / "grades.csv").read_text()
    assert "not measured (no GPU)" in grades
    assert "not measured (no GPU)" in (graded["result"].out / "report.md").read_text()


def test_cheats_are_flagged(graded):
    by = {(r.student, r.lab): r for r in graded["result"].results}
    monkeypatch = by[("cheat_monkeypatch", "lab0")]
    assert any("fl.check" in f for f in monkeypatch.flags)
    report = (graded["result"].out / "report.md").read_text()
    assert "cheat_monkeypatch/lab0: **flag**" in report
    wrapped = by[("cheat_wrap_launcher", "lab0")]  # Python that fixes a zero kernel's output never meets it
    assert wrapped.cells["test_fused"].points == 0.0
    fault = by[("fault", "lab0")]
    assert fault.cells["test_unfused"].points == fault.cells["test_unfused"].max_points
    # on a GPU the fault kills the test's process; under the CPU emulation it is a launch error (the emulation
    # turns a wild pointer into cudaErrorIllegalAddress, so a student's Jupyter kernel survives it): 0 either way
    assert fault.cells["test_fused"].points == 0.0
    if torch.cuda.is_available():
        assert fault.cells["test_fused"].status == "crashed"
    else:
        assert fault.cells["test_fused"].status == "failed"
        assert "illegal memory access" in fault.cells["test_fused"].message


def _hidden_lines(lab):
    """Lines that appear only inside hidden test blocks (a visible test may share a line with a hidden one)."""
    nb = json.loads((course.SOLUTIONS / lab / next((course.SOLUTIONS / lab).glob("*.ipynb")).name).read_text())
    hidden, visible = set(), []
    for cell in nb["cells"]:
        source = ipynb.source(cell)
        for block in ipynb.hidden_test_blocks(source):
            hidden |= {line.strip() for line in block.splitlines() if len(line.strip()) > 12}
        visible.append(ipynb.without_hidden_tests(source))
    visible_text = "\n".join(visible)
    return sorted(line for line in hidden if line not in visible_text)


def test_feedback_shows_scores_but_never_the_hidden_tests(graded):
    result = graded["result"]
    for name, lab in graded["wanted"]:
        page = result.out / "feedback" / name / f"{lab}.html"
        assert page.exists(), f"no feedback for {name}/{lab}"
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        assert "Automatically graded:" in text and "HIDDEN TESTS" not in text
        leaked = [line for line in _hidden_lines(lab) if line in text]
        assert leaked == [], f"{name}/{lab} feedback shows hidden tests: {leaked[:3]}"
    # formgrader's copy, which nbgrader's own feedback buttons render, holds none
    stored = next(result.out.glob("course/autograded/correct/lab0/*.ipynb")).read_text()
    assert "HIDDEN TESTS" not in stored
    assert [line for line in _hidden_lines("lab0") if json.dumps(line)[1:-1] in stored] == []


def test_feedback_holds_nothing_a_submission_read_while_graded(graded):
    test_grader_feedback.check_nosy_feedback(graded["result"], graded["secret"])


def test_gradebook_and_csv_hold_the_final_scores(graded):
    from nbgrader.api import Gradebook
    result = graded["result"]
    with Gradebook(f"sqlite:///{result.out / 'course' / 'gradebook.db'}") as gradebook:
        for r in result.results:
            submission = gradebook.find_submission(r.lab, r.student)
            auto = sum(g.score for nb in submission.notebooks for g in nb.grades if g.cell.cell_type == "code")
            assert auto == pytest.approx(r.total), (r.student, r.lab)
    rows = (result.out / "grades.csv").read_text().splitlines()
    assert rows[0].startswith("student,") and len(rows) == 1 + len({s for s, _ in graded["wanted"]}) + 1  # + nosy
    assert (result.out / "report.html").exists() and list(result.out.glob("*-figures.png"))


def test_a_second_run_resumes_and_nothing_in_the_course_is_touched(graded):
    result = graded["result"]
    stamps = {p: p.stat().st_mtime for p in result.out.glob("work/*/*/result.json")}
    started = time.monotonic()
    again = pipeline.grade(graded["examples"], graded["settings"])
    assert {p: p.stat().st_mtime for p in result.out.glob("work/*/*/result.json")} == stamps
    assert [r.total for r in again.results] == [r.total for r in result.results]
    assert time.monotonic() - started < graded["seconds"] / 2
    assert _tree_digest(course.SOLUTIONS, course.LABS, course.GRADER / "nbgrader_config.py") == graded["before"]


def test_the_committed_sample_class_matches_the_recipes(tmp_path):
    written = samples.write_examples(tmp_path)
    stale = [str(p.relative_to(tmp_path)) for p in written
             if not (samples.EXAMPLES / p.relative_to(tmp_path)).exists()
             or (samples.EXAMPLES / p.relative_to(tmp_path)).read_text() != p.read_text()]
    assert stale == [], "run `fuselab samples` and commit grader/examples"
