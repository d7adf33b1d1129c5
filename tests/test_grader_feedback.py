"""The feedback page: built from the student's submitted notebook, the lab's release cells and the grader's
verdicts only; every flag said next to the test it cost; any notebook shape gives a page, and the report takes
any name. Recorded results, no grading run here: ``test_grader_samples.py`` grades ``write_nosy_submission``'s
student with the sample class (sharing its reference run) and checks its page with ``check_nosy_feedback``.
"""

import hashlib
import os
import html
import json
import re
import secrets
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuselab import course
from fuselab.course import sample_class as samples
from fuselab.grading.outputs import feedback, report
from fuselab.grading.records import intake
from fuselab.grading.records.results import SubmissionResult
from fuselab.grading.run import pipeline

LAB = "lab0"
SOURCES = feedback.lab_sources([LAB])


def _notebook(name=LAB):
    return json.loads((course.SOLUTIONS / name / f"{name}.ipynb").read_text())


def _release():
    return json.loads((course.LABS / LAB / f"{LAB}.ipynb").read_text())


def _hidden_lines():
    """Lines that appear only in the instructor's hidden test blocks (not in any visible cell)."""
    visible = "\n".join(feedback._text(c.get("source")) for c in _release()["cells"])
    return sorted(line for line in feedback.hidden_test_lines(_notebook()) if line not in visible)


def _text_of(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def _result(tmp_path, nb, **extra) -> dict:
    path = tmp_path / "submitted.ipynb"
    data = nb if isinstance(nb, bytes) else json.dumps(nb).encode()
    path.write_bytes(data)
    result = {
        "student": "alice", "lab": LAB, "notebook": str(path), "notebook_sha": hashlib.sha256(data).hexdigest(),
        "cells": {
            "test_dram_bytes": {"points": 1.0, "max_points": 1.0, "status": "passed", "message": ""},
            "test_unfused": {"points": 3.0, "max_points": 3.0, "status": "passed", "message": ""},
            "test_fused": {"points": 0.0, "max_points": 2.0, "status": "failed",
                           "message": "AssertionError: add_relu_mul: wrong at index 1023 of shape (1025,)"},
            "test_speedup": {"points": 0.0, "max_points": 4.0, "status": "not measured (no GPU)", "message": "",
                             "speed": [{"test": "lab0.add_relu_mul", "speedup": None,
                                        "status": "not measured (no GPU)"}]}},
        "total": 4.0, "max_total": 10.0, "manual_cells": ["answer_naive_timing", "answer_sweep"],
        "flags": ["fused_source: the kernel source was dropped: it assigns the attribute 'fuselab.check'"],
        "notes": []}
    result.update(extra)
    return result


def _student_notebook():
    """The release notebook as a student submits it: solution cells filled in, outputs of their own."""
    nb = _release()
    for cell in nb["cells"]:
        if feedback._grade_id(cell) == "fused_source":
            cell["source"] = "FUSED_SOURCE = r'''__global__ void k() {}'''  # my kernel\n"
        if cell.get("cell_type") == "code":
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ran on my laptop\n"]}]
    return nb


def _verdict_block(page: str, grade_id: str) -> str:
    start = page.index(f"id='t-{grade_id}'")
    return page[start: page.index("</div></div>", start)]


def test_verdicts_flags_and_notes_are_said_next_to_their_tests(tmp_path):
    result = _result(tmp_path, _student_notebook(),
                     notes=["two notebooks for lab0: graded lab0.ipynb, left out lab0-old.ipynb"],
                     flags=["fused_source: the kernel source was dropped: it assigns the attribute 'fuselab.check'",
                            "test_dram_bytes: the notebook's test cell was changed", "a flag with no cell"])
    # flags are the TA's: not on the page until a TA decides (flags-shown.txt), then next to their tests
    hidden, _ = feedback.write_one(result, tmp_path / "undecided", SOURCES)
    assert "assigns the attribute" not in hidden.read_text() and "test cell was changed" not in hidden.read_text()
    assert "left out lab0-old.ipynb" in _text_of(hidden.read_text())  # the grader's notes are still said
    path, problem = feedback.write_one(result, tmp_path / "feedback", SOURCES, show_flags=True)
    assert problem == "" and path == tmp_path / "feedback" / "alice" / f"{LAB}.html"
    page = path.read_text()
    text = _text_of(page)
    assert "Automatically graded: 4 of 10 points" in text
    summary = text[: text.index("Your notebook")]
    for grade_id in result["cells"]:
        assert grade_id in summary
    assert "answer_sweep" in summary and "to be graded by hand" in summary
    assert "AssertionError: add_relu_mul: wrong at index 1023" in summary  # why test_fused lost its points
    # the flag on the kernel's cell is said in the verdicts of the tests that use that cell, not in the others
    flag = "it assigns the attribute 'fuselab.check'"
    for test in ("test_fused", "test_speedup"):
        assert flag in _text_of(_verdict_block(page, test)), test
    assert flag not in _text_of(_verdict_block(page, "test_dram_bytes"))
    assert "test cell was changed" in _text_of(_verdict_block(page, "test_dram_bytes"))
    assert "a flag with no cell" in text
    assert "not measured" in _text_of(_verdict_block(page, "test_speedup"))
    assert "left out lab0-old.ipynb" in text
    # the student's own submitted outputs are shown
    assert "ran on my laptop" in text and "my kernel" in text


def test_a_build_error_in_the_pages_table_is_the_compilers_own_line(tmp_path):
    """A test that failed because the student's kernel did not compile: the table at the top of the page gives the
    compiler's error on the student's line, not a cut that stops before it; the whole message is at the test."""
    message = ("NameError: name 'fused' is not defined: cell build_fused, which defines it, failed with BuildError: "
               "fused.cu failed to compile (1 error):\n\nfused.cu: In function 'void add_relu_mul_kernel(const "
               "float*, const float*, const float*, float*, int64_t)':\nfused.cu:4:56: error: expected ';' before "
               "'}' token\n    4 |     if (i < n) out[i] = a[i]\n      |                         ^")
    cells = {"test_fused": {"points": 0.0, "max_points": 2.0, "status": "failed", "message": message}}
    path, _ = feedback.write_one(_result(tmp_path, _student_notebook(), cells=cells), tmp_path / "fb", SOURCES)
    text = _text_of(path.read_text())
    table = text[: text.index("Your notebook")]
    assert "fused.cu:4:56: error: expected ';' before '}' token (the whole message: at the test, below)" in table
    assert "more characters not shown" not in table
    assert "fused.cu:4:56" in _text_of(_verdict_block(path.read_text(), "test_fused"))
    assert report.lost_points(SubmissionResult.from_json(
        _result(tmp_path, _student_notebook(), cells=cells))).endswith("expected ';' before '}' token)")


def test_a_test_a_ta_scored_is_not_called_automatically_graded(tmp_path):
    """A test a TA re-scored in formgrader: its points count, and the page's headline says so instead of calling the
    tests' points automatic; without such a score it stays "Automatically graded"."""
    result = _result(tmp_path, _student_notebook())
    result["cells"]["test_fused"].update(points=1.0, by_hand={"points": 1.0, "grader": 0.0})
    path, _ = feedback.write_one(result, tmp_path / "fb", SOURCES)
    text = _text_of(path.read_text())
    assert "Automatically graded" not in text
    assert "Tests: 5 of 10 points, a teaching assistant's score on test_fused included." in text
    assert "points given by a teaching assistant" in text
    plain, _ = feedback.write_one(_result(tmp_path, _student_notebook()), tmp_path / "plain", SOURCES)
    assert "Automatically graded: 4 of 10 points." in _text_of(plain.read_text())


def test_the_page_carries_nothing_of_the_grader_runs(tmp_path, monkeypatch):
    secret = "tok-" + "7f3a9c1e5d" * 2
    monkeypatch.setenv("FUSELAB_TEST_SECRET", secret)
    hidden = _hidden_lines()
    assert hidden, "lab0 has hidden tests"
    leaky = "\n".join(hidden)
    # what the recheck printed: a page built from it would show the hidden tests
    nb = _student_notebook()
    for cell in nb["cells"]:  # the student edited a test cell: the page shows the lab's version
        if feedback._grade_id(cell) == "test_dram_bytes":
            cell["source"] = "print('my own test cell')\n"
    result = _result(tmp_path, nb)
    result["cells"]["test_unfused"]["output"] = leaky + secret
    result["cells"]["test_fused"]["message"] = "ValueError: " + secret + "\n### BEGIN HIDDEN TESTS\n" + leaky
    result["notes"] = [f"a note quoting what a run met: {leaky} {secret}"]
    path, _ = feedback.write_one(result, tmp_path / "feedback", SOURCES)
    text = _text_of(path.read_text())
    assert [line for line in hidden if line in text] == []
    assert secret not in text and "HIDDEN TESTS" not in text and "my own test cell" not in text
    release_test = next(c for c in _release()["cells"] if feedback._grade_id(c) == "test_dram_bytes")
    assert feedback._text(release_test["source"]).splitlines()[1] in text
    assert "0 of 2 points" in text and "ValueError" in text


def test_a_notebook_changed_after_grading_is_not_shown(tmp_path):
    result = _result(tmp_path, _student_notebook())
    Path(result["notebook"]).write_text(json.dumps(_notebook()))  # e.g. native code rewrote the copy
    path, problem = feedback.write_one(result, tmp_path / "feedback", SOURCES)
    text = _text_of(path.read_text())
    assert "changed after it was graded" in problem and "changed after it was graded" in text
    assert [line for line in _hidden_lines() if line in text] == []
    assert "0 of 2 points" in text


def test_notebook_html_and_scripts_are_shown_as_text(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "<script>alert(1)</script> **bold**"},
                    {"cell_type": "code", "metadata": {}, "source": "x", "outputs": [
                        {"output_type": "display_data", "data": {
                            "text/html": "<img src=x onerror=alert(2)>", "text/plain": "<IPython.HTML>",
                            "application/javascript": "alert(3)"}},
                        {"output_type": "display_data", "data": {"image/png": "not base64!!"}}]}]}
    path, _ = feedback.write_one(_result(tmp_path, nb), tmp_path / "feedback", SOURCES)
    page = path.read_text()
    assert "<script>" not in page and "onerror" not in page and "alert(3)" not in page
    assert "&lt;script&gt;alert(1)" in page and "&lt;IPython.HTML&gt;" in page and "not valid base64" in page
    assert "default-src 'none'" in page


MALFORMED = {
    "cell without source": {"cells": [{"cell_type": "code", "metadata": {}}]},
    "source as a list with non-strings": {"cells": [{"cell_type": "code", "source": ["a", 1, None, ["b"]],
                                                     "outputs": "not a list"}]},
    "cells that are not objects": {"cells": [1, "two", None, [], {"cell_type": 3}]},
    "metadata of every wrong type": {"cells": [{"cell_type": "code", "source": "", "metadata": []},
                                               {"cell_type": "code", "source": "", "metadata": {"nbgrader": "x"}},
                                               {"cell_type": "code", "source": "", "metadata": {"nbgrader": {
                                                   "grade_id": ["test_fused"], "solution": "yes"}}}]},
    "a grade_id of another cell kind": {"cells": [{"cell_type": "raw", "source": "r", "metadata": {
        "nbgrader": {"grade_id": "test_fused"}}}]},
    "no cells": {"nbformat": 4},
    "cells not a list": {"cells": {"a": 1}},
    "a list, not an object": [1, 2, 3],
    "lone surrogates and control characters": {"cells": [{"cell_type": "code", "source": "x = '\ud800\x00\x1b[31m'",
                                                          "outputs": [{"output_type": "stream",
                                                                       "text": "\udcff\x07"}]}]},
    "ten thousand cells": {"cells": [{"cell_type": "code", "source": f"x{i} = {i}", "metadata": {},
                                      "outputs": [{"output_type": "stream", "text": "y" * 2000}]}
                                     for i in range(10_000)]},
    "enormous outputs": {"cells": [{"cell_type": "code", "source": "print(...)", "outputs": [
        {"output_type": "stream", "text": "z" * (30 * 2**20)},
        {"output_type": "error", "ename": "E", "evalue": "v" * 10**6, "traceback": ["t" * 10**6] * 3},
        {"output_type": "display_data", "data": {"image/png": "A" * (3 * 2**20)}}]}]},
}


@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_any_notebook_shape_gets_a_page_with_the_verdicts(tmp_path, shape):
    result = _result(tmp_path, MALFORMED[shape])
    path, problem = feedback.write_one(result, tmp_path / "feedback", SOURCES)
    page = path.read_bytes().decode("utf-8")  # always valid UTF-8
    assert "Automatically graded: 4 of 10 points" in page and "test_fused" in page
    assert len(page) < feedback.MAX_PAGE_CHARS + 2 * 2**20
    if shape == "ten thousand cells":
        assert "more cells: past the size this page shows" in page
    if shape == "enormous outputs":
        assert "z" * (feedback.MAX_OUTPUT_CHARS + 1) not in page and "too large to show" in page


@pytest.mark.parametrize("raw, why", [
    (b"\xff\xfe{not json", "not valid JSON"),
    (b'{"cells": [{"cell_type": "markdown", "source": "caf\xe9"}]}', ""),  # Latin-1, not UTF-8: still shown
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),               # deeper than Python's recursion
    (b"", "not valid JSON"),
])
def test_unreadable_notebooks_say_why(tmp_path, raw, why):
    path, problem = feedback.write_one(_result(tmp_path, raw), tmp_path / "feedback", SOURCES)
    text = _text_of(path.read_text())
    assert why in problem and why in text and "Automatically graded" in text


def test_missing_file_and_broken_results_never_stop_the_class(tmp_path):
    good = _result(tmp_path, _student_notebook())
    missing = dict(good, student="bob", notebook=str(tmp_path / "gone.ipynb"))
    broken = {"student": "carol", "lab": LAB, "cells": {"test_fused": "not a dict", "x": {"points": "many"}},
              "flags": "not a list", "notes": [None, 3], "manual_cells": None}
    unknown_lab = dict(good, student="dave", lab="lab99")
    pages, problems = feedback.write_all([good, missing, broken, unknown_lab, "not a result"], tmp_path / "fb",
                                         SOURCES)
    assert set(pages[LAB]) == {"alice", "bob", "carol"} and set(pages["lab99"]) == {"dave"}
    assert "could not be read" in dict(((s, l), p) for s, l, p in problems)[("bob", LAB)]
    assert "Automatically graded" in pages[LAB]["carol"].read_text()


def test_a_flag_on_a_solution_cell_reaches_the_tests_that_use_it():
    # computed from the release notebook's names: the kernel's cell → its build cell → the tests that call it
    uses = SOURCES[LAB].uses
    assert "fused_source" in uses["test_fused"] and "fused_source" in uses["test_speedup"]
    assert "fused_source" not in uses["test_dram_bytes"] and uses["test_dram_bytes"] == ["dram_bytes"]


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
                     lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=5), max_leaves=30)
_cell = st.fixed_dictionaries({}, optional={
    "cell_type": st.sampled_from(["code", "markdown", "raw", 7]) | st.text(max_size=5),
    "source": st.text() | st.lists(st.text() | _json, max_size=4) | _json,
    "metadata": st.fixed_dictionaries({}, optional={"nbgrader": st.fixed_dictionaries({}, optional={
        "grade_id": st.sampled_from(["test_fused", "fused_source", "setup", "answer_sweep"]) | _json,
        "solution": _json, "grade": _json})}) | _json,
    "outputs": st.lists(st.fixed_dictionaries({}, optional={
        "output_type": st.sampled_from(["stream", "error", "display_data", "execute_result"]) | _json,
        "text": st.text() | _json, "data": st.dictionaries(
            st.sampled_from(["text/plain", "image/png", "text/html"]), st.text() | _json),
        "ename": _json, "evalue": _json, "traceback": _json}), max_size=3) | _json})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nb=st.fixed_dictionaries({"cells": st.lists(_cell | _json, max_size=6)}, optional={"metadata": _json}) | _json)
def test_fuzz_any_notebook_json_gets_a_page(tmp_path, nb):
    result = _result(tmp_path, json.dumps(nb).encode())
    path, _ = feedback.write_one(result, tmp_path / "feedback", SOURCES)
    page = path.read_bytes().decode("utf-8")
    assert "Automatically graded: 4 of 10 points" in page
    assert "<script" not in page.lower()


@settings(max_examples=60, deadline=None)
@given(result=st.dictionaries(st.sampled_from(["cells", "flags", "notes", "manual_cells", "student", "lab",
                                               "notebook"]), _json))
def test_fuzz_any_result_json_gets_a_page(result):
    page = feedback.build_page(result, SOURCES[LAB], None, "no notebook")
    assert page.startswith("<!doctype html>") and page.encode("utf-8")


def test_the_report_takes_any_name_and_flag(tmp_path):
    names = ["a|b <script>alert(1)</script>", "caf\udce9_\udcff", "*bold* [x](javascript:1) `code`", "\ud800",
             "bob\x1b[2J\x1b[31mALL SUBMISSIONS PASSED\x1b[0m", "mal\u202eyrt"]
    results = []
    for i, name in enumerate(names):
        results.append({"student": name, "lab": LAB, "cells": {"test_fused": {
            "points": 1.0, "max_points": 2.0, "status": "crashed", "message": f"<b>boom</b> | {name}",
            "speed": []}}, "total": 1.0, "max_total": 2.0, "flags": [f"fused_source: {name}\nnext | line"],
            "notes": [f"note {name}"], "seconds": 1.0 + i})
    problems = [intake.Problem(where="submissions/\udcff\udcfe/lab0.ipynb", message="not a <notebook>\x1b[2J",
                               student="\udcff|", lab=LAB)]
    class_result = pipeline.ClassResult(out=tmp_path, results=results, problems=problems,
                                        feedback_problems=[("x|y", LAB, "its page: <b>")])
    report.write_grades_csv(results, tmp_path / "grades.csv")
    report.write_report(class_result, tmp_path)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "<script>" not in page and "<b>boom" not in page and 'href="javascript' not in page
    assert "a|b &lt;script&gt;" in page and "caf\\xe9_\\xff" in page and "\\xff\\xfe" in page
    rows = [line for line in (tmp_path / "report.md").read_text().splitlines() if "*crashed*" in line]
    assert len(rows) == len(names)
    columns = "| student | test_fused | total | late | reason | feedback | time |"
    assert all(len(re.split(r"(?<!\\)\|", row)) == len(columns.split("|"))
               for row in rows)  # no name adds a column
    # written, not a crash: bytes that are not UTF-8 as \xNN, as the report shows them
    assert "caf\\xe9_\\xff" in (tmp_path / "grades.csv").read_text(encoding="utf-8")
    for written in ("grades.csv", "report.md", "report.html"):  # no escape sequence or override reaches a reader
        text = (tmp_path / written).read_text(encoding="utf-8", errors="replace")
        assert "\x1b" not in text and "\u202e" not in text, written


# ---------------------------------------------------------------------------------------------- end to end

NOSY = "nosy_feedback"    # the student's name in the graded class
SECRET_ENV = "FUSELAB_TEST_SECRET"
NOSY_CELL = """\
import os, pathlib
print("HISTORY", In, Out)
root = pathlib.Path(os.environ["PYTHONPATH"].split(os.pathsep)[0]) if os.environ.get("PYTHONPATH") else None
for candidate in [root, pathlib.Path.cwd(), *pathlib.Path.cwd().parents]:
    if candidate and (candidate / "solutions").is_dir():
        print("SOLUTIONS", (candidate / "solutions" / "lab0" / "lab0.ipynb").read_text())
        break
print("SECRET", os.environ.get("FUSELAB_TEST_SECRET"))
"""

NOSY_DRAM_BYTES = """\
def dram_bytes(n, bytes_per_element=4):
    # reads the grader's files and environment from inside the clean recheck, and raises them as its message
    os_module = torch.sys.modules["os"]
    env = os_module.environ
    text = env.get("FUSELAB_TEST_SECRET", "") + "\\n"
    for folder in env.get("PYTHONPATH", "").split(os_module.pathsep):
        path = folder + "/solutions/lab0/lab0.ipynb"
        if os_module.path.exists(path):
            cells = torch.sys.modules["json"].loads(torch.sys.modules["io"].open(path).read())["cells"]
            source = "".join("".join(c["source"]) for c in cells)
            text += source[source.find("### BEGIN " + "HIDDEN" + " TESTS"):]
    raise ValueError(text)
"""


def write_nosy_submission(class_folder: Path) -> str:
    """A Lab 0 submission (the correct sample's kernels) that tries to read the hidden tests and the grader's
    secrets into its own feedback: its last cell prints IPython's ``In``/``Out`` history (a run of the whole
    notebook would hold the hidden tests there), ``solutions/`` and an environment variable of the grader's shell; its
    ``dram_bytes`` raises an error quoting the same inside the clean recheck. Returns the secret to put in the
    grader's environment under ``SECRET_ENV``."""
    nb = json.loads((samples.EXAMPLES / "correct" / LAB / f"{LAB}.ipynb").read_text())
    for cell in nb["cells"]:
        if feedback._grade_id(cell) == "dram_bytes":
            cell["source"] = NOSY_DRAM_BYTES
    nb["cells"].append({"cell_type": "code", "execution_count": 1, "metadata": {}, "source": NOSY_CELL,
                        "outputs": [{"output_type": "stream", "name": "stdout", "text": "what I saw at home\n"}]})
    target = Path(class_folder) / NOSY / LAB / f"{LAB}.ipynb"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(nb))
    return "s3cret-" + secrets.token_hex(12)


def check_nosy_feedback(class_result, secret: str) -> None:
    """The nosy student's page: its verdicts, its submitted outputs, and nothing of what its code read."""
    graded = next(r for r in class_result.results if r.student == NOSY)
    page = (class_result.out / "feedback" / NOSY / f"{LAB}.html").read_text()
    text = _text_of(page)
    hidden = _hidden_lines()
    # formgrader's copy, which nbgrader's own feedback buttons render, holds none of them
    stored = next(class_result.out.glob(f"course/autograded/{NOSY}/{LAB}/*.ipynb")).read_text()
    assert [line for line in hidden if json.dumps(line)[1:-1] in stored] == []
    # and none of it is in the page
    assert [line for line in hidden if line in text] == []
    assert secret not in text and "HIDDEN TESTS" not in text
    assert f"Automatically graded: {graded.total:g} of {graded.max_total:g} points" in text
    for grade_id in graded.cells:
        assert f"Grader: {grade_id}:" in text
    assert graded.cells["test_dram_bytes"].points == 0
    assert graded.cells["test_fused"].points == graded.cells["test_fused"].max_points
    assert "what I saw at home" in text  # the outputs the student submitted
    flat = " ".join(text.split())
    for flag in graded.flags:  # the grader's flags are the TA's (the report's), not on the page
        assert " ".join(flag.partition(": ")[2].split())[:60] not in flat, flag
    # a teaching assistant grades a written answer in formgrader: the next feedback pass shows score and comment
    from nbgrader.api import Gradebook
    db = class_result.out / "course" / "gradebook.db"
    with Gradebook(f"sqlite:///{db}") as gradebook:
        grade = gradebook.find_grade("answer_sweep", LAB, LAB, NOSY)
        grade.manual_score = grade.max_score
        gradebook.find_comment("answer_sweep", LAB, LAB, NOSY).manual_comment = "Clear <answer>, well argued."
        gradebook.db.commit()
    pages, _ = feedback.write_all([graded], class_result.out / "feedback-again", feedback.lab_sources([LAB]), db)
    text = _text_of(pages[LAB][NOSY].read_text())
    assert "Clear <answer>, well argued." in text and "graded by hand" in text
    assert [line for line in hidden if line in text] == [] and secret not in text


# ---------------------------------------------------------------------------------------------- the speed picture

GPU = "NVIDIA H200"


def _speed_record(speedup=1.9, gpu=GPU, **extra):
    return {"test": "lab0.add_relu_mul", "max_points": 4, "points": 0.07 * 4, "speedup": speedup,
            "ci": [speedup - 0.01, speedup + 0.01], "threshold": 1.837, "mode": "device", "gpu": gpu,
            "shape": [67108864], "status": "measured", "reference_s": 6.7e-4, "student_s": 6.7e-4 / speedup, **extra}


def _reference_run(gpu=GPU, copy=4.4e12, plain=2.397, reference_s=6.69e-4, tuned=2.561):
    record = _speed_record(plain, gpu, reference_s=reference_s, copy_bytes_per_s=copy,
                           **({"tuned_speedup": tuned, "tuned_status": "measured"} if tuned else {}))
    return {"cells": {"test_speedup": {"points": 4.0, "max_points": 4.0, "status": "passed", "speed": [record]}}}


def _measured_result(tmp_path, record):
    result = _result(tmp_path, _student_notebook())
    result["cells"]["test_speedup"] = {"points": 2.0, "max_points": 4.0, "status": "partial", "message": "",
                                       "speed": [record]}
    return result


def _standing_block(page):
    start = page.index("<h2>Where your kernel stands</h2>")
    return page[start: page.index("<h2>", start + 5)]


def _pictures(block):
    return re.findall(r"<img class='standing'[^>]*src='data:image/png;base64,([A-Za-z0-9+/=]+)'", block)


def test_the_page_draws_the_students_kernel_among_the_runs_measurements(tmp_path):
    """A measured speed test: a picture of the student's speedup beside the lab's unfused reference, the plain
    solution and the floor, all from this grading run on this GPU, and the numbers said in words beside it."""
    from fuselab.labs import floors
    reference = _reference_run()
    path, _ = feedback.write_one(_measured_result(tmp_path, _speed_record(1.9)), tmp_path / "fb", SOURCES,
                                 references={LAB: reference})
    block = _standing_block(path.read_text())
    pictures = _pictures(block)
    assert len(pictures) == 1
    import base64
    assert base64.b64decode(pictures[0]).startswith(b"\x89PNG")
    words = _text_of(block)
    floor = 6.69e-4 / (floors.min_bytes("lab0.add_relu_mul", [67108864], "float32") / 4.4e12)
    assert "1.90x faster" in words and "full marks from 1.84x" in words and "NVIDIA H200" in words
    assert "plain solution, measured in the same grading run, ran 2.40x" in words
    assert "tuned solution (the lab's optional part; full marks do not need it) ran 2.56x" in words
    assert f"No kernel can pass {floor:.2f}x" in words
    # a reference run that could not time the tuned solution: a picture of one bar fewer, and a word why
    untuned, _ = feedback.write_one(_measured_result(tmp_path, _speed_record(1.9)), tmp_path / "fb-untuned",
                                    SOURCES, references={LAB: _reference_run(tuned=None)})
    untuned_block = _standing_block(untuned.read_text())
    assert "tuned solution was not measured in this grading run" in _text_of(untuned_block)
    assert "ran 2.56x" not in _text_of(untuned_block)
    assert _pictures(untuned_block) != pictures
    # the floor moves with the copy bandwidth the run measured, not with saved course data
    slower = _reference_run(copy=2.2e12)
    again, _ = feedback.write_one(_measured_result(tmp_path, _speed_record(1.9)), tmp_path / "fb2", SOURCES,
                                  references={LAB: slower})
    assert f"No kernel can pass {floor / 2:.2f}x" in _text_of(_standing_block(again.read_text()))


def test_without_a_gpu_the_page_says_so_instead_of_a_picture(tmp_path):
    path, _ = feedback.write_one(_result(tmp_path, _student_notebook()), tmp_path / "fb", SOURCES,
                                 references={LAB: _reference_run()})
    block = _standing_block(path.read_text())
    assert _pictures(block) == [] and "<img" not in block
    assert "not measured: the grading machine has no GPU, so there is no picture" in _text_of(block)


def test_the_picture_leaves_out_what_this_run_did_not_measure_on_this_gpu(tmp_path):
    """A reference run on another GPU model (or none: a run without its reference.json) draws neither the plain
    and tuned solutions nor the floor, and says so."""
    for name, references in (("other", {LAB: _reference_run(gpu="NVIDIA A100")}), ("none", {}),
                             ("no bandwidth", {LAB: _reference_run(copy=None)})):
        path, _ = feedback.write_one(_measured_result(tmp_path, _speed_record(1.5)), tmp_path / name, SOURCES,
                                     references=references)
        block = _standing_block(path.read_text())
        words = _text_of(block)
        assert len(_pictures(block)) == 1 and "1.50x faster" in words, name
        assert "No kernel can pass" not in words and "floor (the fewest bytes" in words, name
        assert ("ran 2.40x" in words) == ("ran 2.56x" in words) == (name == "no bandwidth"), name


def test_the_picture_is_drawn_from_numbers_only(tmp_path):
    """Strings of a record (its test id, the GPU's name) reach the page escaped and the picture not at all: the
    same numbers give the same image whatever those strings say."""
    evil = "<script>alert(1)</script>"
    plain_page, _ = feedback.write_one(_measured_result(tmp_path, _speed_record(1.7)), tmp_path / "a", SOURCES,
                                       references={LAB: _reference_run()})
    record = _speed_record(1.7, gpu=GPU + evil)
    reference = _reference_run(gpu=GPU + evil)
    odd_page, _ = feedback.write_one(_measured_result(tmp_path, record), tmp_path / "b", SOURCES,
                                     references={LAB: reference})
    page = odd_page.read_text()
    assert "<script" not in page.lower() and "&lt;script&gt;" in page
    assert _pictures(_standing_block(page)) == _pictures(_standing_block(plain_page.read_text()))


def test_write_all_reads_the_runs_reference_beside_the_feedback_folder(tmp_path):
    out = tmp_path / "run"
    (out / "reference" / LAB).mkdir(parents=True)
    (out / "reference" / LAB / "reference.json").write_text(json.dumps(_reference_run()))
    pages, problems = feedback.write_all([_measured_result(tmp_path, _speed_record(2.1))], out / "feedback", SOURCES)
    assert problems == []
    words = _text_of(_standing_block(pages[LAB]["alice"].read_text()))
    assert "ran 2.40x" in words and "No kernel can pass" in words


def test_the_page_is_rendered_by_the_autoescaping_template():
    """No hand-built HTML: the page comes from templates/feedback.html, with autoescaping on."""
    source = Path(feedback.__file__).read_text()
    assert "html.escape" not in source and "<div" not in source
    assert feedback._environment().autoescape is True
    assert (feedback.TEMPLATES / "feedback.html").is_file()


def test_a_page_is_drawn_again_only_when_what_it_shows_changed(tmp_path, monkeypatch):
    """A term's later runs write every page of the course: a page whose inputs are the same is kept as drawn (its
    picture is the slow part), and any change of what it shows (the verdicts, a TA's hand grade, flags shown,
    the run's reference, the notebook file, the drawing code) draws it again."""
    drawn = []
    real = feedback.build_page
    monkeypatch.setattr(feedback, "build_page", lambda *a, **k: drawn.append(1) or real(*a, **k))
    result, reference = _measured_result(tmp_path, _speed_record(1.9)), {LAB: _reference_run()}
    first, _ = feedback.write_one(result, tmp_path / "fb", SOURCES, references=reference)
    page = first.read_bytes()
    again, problem = feedback.write_one(result, tmp_path / "fb", SOURCES, references=reference)
    assert (again, problem, again.read_bytes(), len(drawn)) == (first, "", page, 1)
    # what it was drawn from is kept outside the folder students receive (a digest of hidden verdicts is not theirs)
    assert [p.name for p in (tmp_path / "fb").rglob("*") if p.is_file()] == [first.name]
    changes = [
        dict(result={**result, "points": 1.0}),
        dict(manual={(result["student"], LAB): {"test_fused": {"max": 2.0, "score": 1.0, "comment": "see me"}}}),
        dict(show_flags=True),
        dict(references={LAB: _reference_run(copy=2.2e12)}),
    ]
    for n, change in enumerate(changes, start=2):
        args = {"result": result, "manual": None, "show_flags": False, "references": reference, **change}
        feedback.write_one(args.pop("result"), tmp_path / "fb", SOURCES, **args)
        feedback.write_one(result, tmp_path / "fb", SOURCES, references=reference)  # and back
        assert len(drawn) == 2 * n - 1, change
    os.utime(result["notebook"], ns=(1, 1))  # the notebook file touched
    feedback.write_one(result, tmp_path / "fb", SOURCES, references=reference)
    assert len(drawn) == 2 * len(changes) + 2
    monkeypatch.setattr(feedback, "_drawer_digest", lambda: b"other drawing code")
    feedback.write_one(result, tmp_path / "fb", SOURCES, references=reference)
    assert len(drawn) == 2 * len(changes) + 3


def test_a_kept_page_must_be_the_plain_file_the_grader_drew(tmp_path, monkeypatch):
    """A page that is not the grader's drawing from these inputs (cut short, a link to another page, a page with
    a problem to report) is drawn again, and its problem said again."""
    result, reference = _measured_result(tmp_path, _speed_record(1.9)), {LAB: _reference_run()}
    first, _ = feedback.write_one(result, tmp_path / "fb", SOURCES, references=reference)
    drawn = []
    real = feedback.build_page
    monkeypatch.setattr(feedback, "build_page", lambda *a, **k: drawn.append(1) or real(*a, **k))
    first.write_bytes(first.read_bytes()[:-10])
    feedback.write_one(result, tmp_path / "fb", SOURCES, references=reference)
    other = tmp_path / "other.html"
    other.write_bytes(first.read_bytes())
    first.unlink()
    first.symlink_to(other)
    feedback.write_one(result, tmp_path / "fb", SOURCES, references=reference)
    assert len(drawn) == 2
    changed = {**result, "notebook_sha": "0" * 64}  # the notebook is not the one graded: a problem each time
    for _ in range(2):
        _, problem = feedback.write_one(changed, tmp_path / "fb", SOURCES, references=reference)
        assert "changed after it was graded" in problem
    assert len(drawn) == 4


def _class_of(tmp_path, count):
    base = _measured_result(tmp_path, _speed_record(2.1))
    results = []
    for k in range(count):
        result = json.loads(json.dumps(base))
        result["student"] = f"s{k:03d}"
        if k % 3 == 0:  # pages that differ: a failed test, and a notebook that cannot be read
            result["cells"]["test_speedup"]["points"] = 0.0
        if k % 7 == 0:
            result["notebook"] = str(tmp_path / "gone.ipynb")
        results.append(result)
    return results


def test_a_class_drawn_by_several_processes_gets_the_pages_one_process_draws(tmp_path, monkeypatch):
    """Over ``PAGES_PER_PROCESS`` pages per core, fresh processes draw them side by side: the same pages, byte for
    byte, and the same problems, in the class's order; and those processes import nothing from the grader's
    working folder (a ``multiprocessing`` planted there never runs)."""
    monkeypatch.setattr(feedback, "PAGES_PER_PROCESS", 4)  # two processes of 4 pages: the test's time
    from fuselab.grading.gpus import schedule
    monkeypatch.setattr(schedule, "available_cores", lambda: 3)
    planted = tmp_path / "cwd" / "multiprocessing"
    planted.mkdir(parents=True)
    ran = tmp_path / "planted-code-ran"
    (planted / "__init__.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    count = 8
    results = _class_of(tmp_path, count)
    references = {LAB: _reference_run()}
    spawned = []
    real = feedback._drawn_side_by_side
    monkeypatch.setattr(feedback, "_drawn_side_by_side", lambda *a: spawned.append(real(*a)) or spawned[-1])
    pages, problems = feedback.write_all(results, tmp_path / "side", SOURCES, references=references)
    assert len(spawned) == 1 and spawned[0] is not None  # drawn by the processes, not by the fallback
    assert not ran.exists() and "PYTHONSAFEPATH" not in os.environ  # set only while they started
    assert real(results[:4], (tmp_path / "x", SOURCES, {}, frozenset(), references)) is None  # one is enough
    monkeypatch.setattr(feedback, "_drawn_side_by_side", lambda *a: None)  # one process
    alone, alone_problems = feedback.write_all(results, tmp_path / "alone", SOURCES, references=references)
    assert sorted(pages[LAB]) == sorted(alone[LAB]) == [f"s{k:03d}" for k in range(count)]
    for student, path in pages[LAB].items():
        assert path.parent.parent == tmp_path / "side"
        assert path.read_bytes() == alone[LAB][student].read_bytes(), student
    assert problems == alone_problems and [p[0] for p in problems] == [f"s{k:03d}" for k in range(0, count, 7)]


def _die(*shared):
    os._exit(3)


def test_processes_that_die_leave_the_pages_to_the_grader_itself_and_say_so(tmp_path, monkeypatch, capsys):
    """Drawing processes that die (here as they start) break the pool: the grader draws every page itself, the
    pages one process draws, and says on stderr that the processes failed."""
    from fuselab.grading.gpus import schedule
    monkeypatch.setattr(schedule, "available_cores", lambda: 8)
    monkeypatch.setattr(feedback, "PAGES_PER_PROCESS", 2)
    results = _class_of(tmp_path, 4)
    references = {LAB: _reference_run()}
    monkeypatch.setattr(feedback, "_ready", _die)  # what each process runs first: here, its end
    pages, problems = feedback.write_all(results, tmp_path / "fb", SOURCES, references=references)
    assert "processes drawing 4 pages failed" in capsys.readouterr().err
    monkeypatch.setattr(feedback, "_drawn_side_by_side", lambda *a: None)
    alone, alone_problems = feedback.write_all(results, tmp_path / "alone", SOURCES, references=references)
    assert sorted(pages[LAB]) == sorted(alone[LAB]) and len(pages[LAB]) == len(results)
    assert all(path.read_bytes() == alone[LAB][student].read_bytes() for student, path in pages[LAB].items())
    assert problems == alone_problems


def test_only_the_pages_left_to_draw_go_to_the_drawing_processes(tmp_path, monkeypatch):
    """A run that finds most pages drawn from the same inputs before keeps them and draws only the rest; the
    processes are counted on those (and on the host's memory), not on the class."""
    sent = []
    monkeypatch.setattr(feedback, "_drawn_side_by_side", lambda todo, shared: sent.append(len(todo)))
    results = _class_of(tmp_path, 6)
    references = {LAB: _reference_run()}
    first, _ = feedback.write_all(results, tmp_path / "fb", SOURCES, references=references)
    results[4]["cells"]["test_speedup"]["points"] = 1.5  # one page's inputs changed
    second, _ = feedback.write_all(results, tmp_path / "fb", SOURCES, references=references)
    # the pages with a problem (an unreadable notebook: s000, s000 only) are drawn every run, as one is changed
    assert sent == [6, 2] and sorted(first[LAB]) == sorted(second[LAB])
    from fuselab.grading.gpus import schedule
    monkeypatch.setattr(schedule, "available_cores", lambda: 64)
    monkeypatch.setattr(schedule, "host_memory_gib", lambda: (64.0, 3.5))
    assert feedback._drawing_processes(1000) == 3  # 3.5 GiB available: three drawers of DRAWER_GIB
    monkeypatch.setattr(schedule, "host_memory_gib", lambda: None)
    assert feedback._drawing_processes(1000) == 50 and feedback._drawing_processes(10) == 0


def test_a_package_run_as_a_program_can_be_imported_again_without_running():
    """The drawing processes start fresh (``spawn``) and import the program's main module again: a ``__main__.py``
    whose top level runs the program would run it once per process."""
    import ast
    found = sorted((Path(feedback.__file__).parents[2]).rglob("__main__.py"))
    assert found
    for path in found:
        for node in ast.parse(path.read_text()).body:
            guarded = isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)
            docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            assert guarded or docstring or isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef)), \
                f"{path}: {ast.unparse(node)[:80]} runs on import"


def test_the_pages_are_asked_for_under_the_safe_path_so_a_process_started_late_keeps_it(monkeypatch):
    """A spawning pool starts a process at an ask when none is idle: one that finished its warm-up before the last
    warm-up ask leaves a process to start at the first page's ask. So the pages are asked for, as the processes
    were started, with ``PYTHONSAFEPATH`` set (and it is unset again after)."""
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    seen = []

    class Pool:
        def map(self, fn, *iterables):
            seen.append(os.environ.get("PYTHONSAFEPATH"))
            return [fn(*args) for args in zip(*iterables)]

        def shutdown(self, **kwargs):
            pass
    drawers = feedback.Drawers(0)  # too few pages for processes: none started
    drawers.pool, drawers.processes = Pool(), 2
    monkeypatch.setattr(feedback, "_draw_chunk", lambda shared, chunk: [(None, f"{shared}:{r}") for r in chunk])
    assert drawers.draw(["a", "b", "c"], "s") == [(None, "s:a"), (None, "s:b"), (None, "s:c")]
    assert seen == ["1"] and "PYTHONSAFEPATH" not in os.environ


def test_drawing_processes_that_failed_are_not_started_again(tmp_path, monkeypatch):
    """The caller's drawing processes sized for the class but failed (said once on stderr as they failed): the
    grader draws the pages itself rather than starting others."""
    results = _class_of(tmp_path, 2)
    drawers = feedback.Drawers(0)
    drawers.processes = 2  # sized for two, none running
    monkeypatch.setattr(feedback, "_drawn_side_by_side", lambda *a: pytest.fail("processes started again"))
    pages, _ = feedback.write_all(results, tmp_path / "fb", SOURCES, references={LAB: _reference_run()},
                                  drawers=drawers)
    assert sorted(pages[LAB]) == ["s000", "s001"]
