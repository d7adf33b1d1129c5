"""Hand grading a graded run: ``fuselab formgrader RUN`` serves that run's gradebook (from the venv, without an
exchange), a manual grade entered through formgrader's own web API reaches ``grades.csv``, the report's totals and
the feedback page on the next ``fuselab grade`` of the run (nothing regraded), and nbgrader's own feedback
buttons never show a hidden test, even of a submitted notebook that holds them.

The run is made without grading anything (the results a grading run saves, written directly), so the test is
cheap; the outputs step and the resume are the real ones.
"""

import csv
import json
import os
import re
import shutil
import sys
import urllib.request
from pathlib import Path

import pytest

from fuselab import course
from fuselab import notebook as ipynb
from fuselab.grading.outputs import formgrader
from fuselab.grading.records import nbgrader_run
from fuselab.grading.run import pipeline
from fuselab.grading.records.results import CellResult, SubmissionResult

from . import formgrader_api
from .conftest import REPO

LAB = "lab0"
STUDENTS = ("ann", "bob")


def _instructor():
    return json.loads((course.SOLUTIONS / LAB / nbgrader_run.notebook_name(LAB)).read_text())


def _saved_result(out: Path, student: str, notebook: Path) -> None:
    """What a grading run saves for one submission: full marks on every autograded test."""
    instructor = _instructor()
    cells = {ipynb.grade_id(c): CellResult(points=float(ipynb.points(c)), max_points=float(ipynb.points(c)),
                                           status="passed")
             for c in instructor["cells"] if ipynb.grade_id(c) and ipynb.is_graded(c) and not ipynb.is_hand_graded(c)}
    result = SubmissionResult(student=student, lab=LAB, cells=cells, total=sum(c.points for c in cells.values()),
                              max_total=sum(c.max_points for c in cells.values()),
                              manual_cells=pipeline.hand_graded(instructor), notebook=str(notebook),
                              notebook_sha=pipeline._sha(notebook), sandbox=True)
    work = out / "work" / student / LAB
    work.mkdir(parents=True, exist_ok=True)
    (work / "result.json").write_text(json.dumps(result.to_json()))


@pytest.fixture
def graded_run(tmp_path, monkeypatch):
    """A run of two students on lab0, as ``fuselab grade`` leaves it: ann handed in the instructor's notebook (its
    hidden tests in it), bob the lab as released."""
    source = tmp_path / "class"
    for student in STUDENTS:
        folder = source / student / LAB
        folder.mkdir(parents=True)
        given = course.SOLUTIONS if student == "ann" else course.LABS
        shutil.copy(given / LAB / nbgrader_run.notebook_name(LAB), folder)
    (source / "bob" / LAB / "timestamp.txt").write_text("2026-09-14 20:00:00 UTC")  # a time, as nbgrader's own
    out = tmp_path / "run"
    monkeypatch.setattr(pipeline, "reference_run", lambda lab, *a, **k: {"cells": {}, "broken": []})
    monkeypatch.setattr(pipeline, "check_sandbox", lambda settings: None)
    # the first run: each submission's result saved as a grading run saves it, then the outputs
    monkeypatch.setattr(pipeline, "grade_submission", lambda sub, *a, **k: _fake_grade(sub, out))
    pipeline.grade(source, pipeline.Settings(out=out, labs=[LAB], progress=False))
    # from now on a run of the same --out must keep every result: nothing may be graded again
    monkeypatch.setattr(pipeline, "grade_submission", lambda *a, **k: pytest.fail("a kept result was regraded"))
    return source, out, pipeline.Settings(out=out, labs=[LAB], progress=False)


def _fake_grade(sub, out):
    _saved_result(out, sub.student, Path(sub.notebook))
    return SubmissionResult.from_json(json.loads((out / "work" / sub.student / LAB / "result.json").read_text()))


def _hidden_lines():
    """The hidden tests' lines that the students' notebook does not have anyway."""
    release = (course.LABS / LAB / nbgrader_run.notebook_name(LAB)).read_text()
    lines = set()
    for cell in _instructor()["cells"]:
        for block in ipynb.hidden_test_blocks(ipynb.source(cell)):
            lines |= {line.strip() for line in block.splitlines() if len(line.strip()) > 12}
    lines = {line for line in lines if json.dumps(line)[1:-1] not in release}
    assert lines
    return lines


def test_the_cells_a_person_grades_come_from_the_instructors_notebook():
    def cell(grade_id, **meta):
        return {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": grade_id, **meta}}, "source": ""}
    instructor = {"cells": [cell("answer", grade=True, solution=True), cell("test_fused", grade=True, solution=False),
                            cell("fused_source", grade=False, solution=True), cell("task", task=True),
                            dict(cell("written", grade=True), cell_type="markdown"),
                            {"cell_type": "markdown", "metadata": {}, "source": "text"}]}
    assert pipeline.hand_graded(instructor) == ["answer", "task", "written"]


def test_the_course_of_a_run_is_found_and_anything_else_is_refused(graded_run, tmp_path):
    _, out, _ = graded_run
    assert formgrader.course_folder(out) == (out / "course").resolve()
    assert formgrader.course_folder(out / "course") == (out / "course").resolve()
    with pytest.raises(formgrader.NotACourse, match="holds no gradebook"):
        formgrader.course_folder(tmp_path / "class")


def test_nbgrader_feedback_never_shows_hidden_tests(graded_run):
    """formgrader's "Generate feedback" (nbgrader generate_feedback), also of a notebook handed in with them."""
    _, out, _ = graded_run
    root = out / "course"
    stored = (root / "autograded" / "ann" / LAB / nbgrader_run.notebook_name(LAB)).read_text()
    hidden = _hidden_lines()
    assert not [line for line in hidden if line in stored]
    course.nbgrader("generate_feedback", LAB, *nbgrader_run.course_args(root))
    for student in STUDENTS:
        page = (root / "feedback" / student / LAB / "lab0.html").read_text()
        assert "Feedback" in page or "lab0" in page
        leaked = [line for line in hidden if line in page]
        assert not leaked, f"{student}'s nbgrader feedback shows hidden tests: {leaked[:3]}"


def test_hidden_test_regions_are_cut_from_any_notebook(tmp_path):
    nb = {"cells": [{"cell_type": "code", "source": "a = 1\n### BEGIN HIDDEN TESTS\nsecret()\n### END HIDDEN TESTS\nb",
                     "outputs": [{"output_type": "stream", "text": "secret() said"}]},
                    {"cell_type": "code", "source": ["x\n", "### BEGIN HIDDEN TESTS\n", "unclosed secret"],
                     "outputs": []},
                    "not a cell"]}
    path = tmp_path / "in.ipynb"
    path.write_text(json.dumps(nb))
    nbgrader_run.write_without_hidden_tests(path, tmp_path / "out.ipynb", course.LABS / LAB / f"{LAB}.ipynb")
    cells = json.loads((tmp_path / "out.ipynb").read_text())["cells"]
    assert cells[0]["source"] == "a = 1\nb" and cells[0]["outputs"] == []  # what a hidden test printed goes too
    assert cells[1]["source"] == "x" and cells[2] == "not a cell"


def test_a_manual_grade_in_formgrader_reaches_grades_csv_report_and_feedback(graded_run, tmp_path):
    source, out, settings = graded_run
    # formgrader's copy carries the release's graded cells: the written answer's box, its points the release's
    copy = json.loads((out / "course" / "autograded" / "ann" / LAB / f"{LAB}.ipynb").read_text())
    released = nbgrader_run.graded_cells(out / "course" / "release" / LAB / f"{LAB}.ipynb")
    boxes = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"] for c in copy["cells"]
             if "nbgrader" in c["metadata"]}
    assert boxes["answer_sweep"]["points"] == released["answer_sweep"]["metadata"]["nbgrader"]["points"]
    assert boxes["test_speedup"]["points"] == released["test_speedup"]["metadata"]["nbgrader"]["points"]
    before = list(csv.DictReader((out / "grades.csv").open()))
    ann = next(r for r in before if r["student"] == "ann")
    assert ann["lab0/answer_sweep"] == ""  # not yet graded by hand
    auto_total, maximum = float(ann["lab0 total"]), float(ann["lab0 max"])
    # the report's "To look at" says whose written answers wait for a person, one line for the lab
    [waiting] = [line for line in (out / "report.md").read_text().splitlines() if "to grade by hand" in line]
    assert f"written answers of {len(STUDENTS)} submission(s)" in waiting and all(s in waiting for s in STUDENTS)

    # `fuselab formgrader RUN` from the venv's own bin, with a PATH that does not hold it
    exchange = tmp_path / "exchange"  # where nbgrader's exchange would be (grader/nbgrader_config.py reads this)
    with formgrader_api.serving(out, tmp_path, FUSELAB_EXCHANGE=str(exchange)) as server:
        assignments = server.get("assignments")
        assert [a["name"] for a in assignments] == [LAB], assignments  # the run's gradebook, not the repository's
        # formgrader's Manage Assignments and Manual Grading count the run's submissions (kept in autograded/ only),
        # and list them graded, one with a submission time (which nbgrader would read from submitted/) included
        assert assignments[0]["num_submissions"] == len(STUDENTS), assignments
        listed = {s["student"]: s for s in server.get(f"submissions/{LAB}")}
        assert sorted(listed) == sorted(STUDENTS) and all(s["autograded"] and s["score"] > 0 for s in listed.values())
        assert listed["bob"]["timestamp"].startswith("2026-09-14T20:00"), listed["bob"]
        server.grade(LAB, LAB, "ann", "answer_sweep", 1.5, "Good sweep, but say why L2.")
        # as the TA guide says: a test cell has no comment box; what a TA says of a test goes on the solution cell
        boxes = server.comment_boxes(LAB, LAB, "ann")
        assert "fused_source" in boxes and "answer_sweep" in boxes and "test_fused" not in boxes, boxes
        server.comment(LAB, LAB, "ann", "fused_source", "test_fused: your kernel reads x twice.")
        with urllib.request.urlopen(f"{server.base}/lab?token={server.token}", timeout=30) as response:
            page = response.read().decode()  # no student panels
        config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                      page, re.S).group(1))
        assert set(formgrader.STUDENT_LAB_PLUGINS) <= set(config["disabledExtensions"]), config["disabledExtensions"]
        assert "@jupyter/nbgrader:formgrader" not in config["disabledExtensions"]
        # nbgrader's own buttons that reach students through the exchange: each refused, nothing written
        course_files = sorted(p.relative_to(out) for p in out.rglob("*"))
        assert server.post(f"assignment/{LAB}/generate_feedback")["success"]  # stays in the run (hidden tests cut)
        for step in (f"assignment/{LAB}/release_feedback", f"assignment/{LAB}/ann/release_feedback",
                     f"assignment/{LAB}/release", f"assignment/{LAB}/collect"):
            answer = server.post(step)
            assert answer["success"] is False and "without an exchange" in answer.get("error", "") + \
                answer.get("log", ""), (step, answer)
        assert not exchange.exists()
        written = sorted(set(p.relative_to(out) for p in out.rglob("*")) - set(course_files))
        assert all(p.parts[:2] == ("course", "feedback") for p in written), written
        logged = server.log.read_text()
        assert "Unwritable directory" not in logged and "exchange" not in logged.lower(), logged[-3000:]
        assert "alembic" not in logged, logged[-3000:]
        # what to run next, as the TA guide says it: each hand-graded lab's download, that lab, this course
        assert f"that lab's download, as graded> --labs <lab> --out {out}" in " ".join(logged.split()), logged[:800]

    # the next `fuselab grade` of the run: nothing regraded (the fixture fails on a regrade)
    pipeline.grade(source, settings)
    after = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert after["ann"]["lab0/answer_sweep"] == "1.5"
    assert float(after["ann"]["lab0 total"]) == auto_total + 1.5
    assert float(after["ann"]["lab0 max"]) == maximum and float(after["ann"]["total"]) == auto_total + 1.5
    assert float(after["bob"]["lab0 total"]) == auto_total
    report = (out / "report.md").read_text()
    assert f"**{auto_total + 1.5:g}** / {maximum:g}" in report
    hand_columns = [k for k in after["ann"] if k.startswith("lab0/") and not k.endswith(" speedup")
                    and after["bob"][k] == ""]  # bob graded by nobody: his blanks are the written answers
    ann_waits = any(after["ann"][k] == "" for k in hand_columns)
    [waiting] = [line for line in report.splitlines() if "to grade by hand" in line]
    assert "bob" in waiting and ("ann" in waiting) == ann_waits, (waiting, hand_columns)
    page = (out / "feedback" / "ann" / "lab0.html").read_text()
    assert "Good sweep, but say why L2." in page and f"Total: {auto_total + 1.5:g} of {maximum:g}" in page
    assert "test_fused: your kernel reads x twice." in page  # the solution cell's comment reaches the student


def test_stopping_the_formgrader_command_stops_its_server(tmp_path):
    """A TA's script (or a closed terminal) stopping ``fuselab formgrader`` with SIGTERM left its jupyter child
    serving the gradebook on the port: the server now ends with the command."""
    import signal
    import subprocess
    import sys
    import time
    marker = f"fuselab-formgrader-child-{os.getpid()}"
    script = ("import sys\nfrom pathlib import Path\nfrom fuselab.grading.outputs import formgrader\n"
              f"formgrader.course_folder = lambda target: Path({str(tmp_path)!r})\n"
              "formgrader.write_config = lambda course: None\n"
              "formgrader.server_command = lambda *a: ([sys.executable, '-c', 'import time; time.sleep(300)', "
              f"{marker!r}], None)\n"
              "sys.exit(formgrader.main())\n")
    command = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)

    def alive():
        found = []
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                if marker.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                    found.append(pid)
            except OSError:
                continue
        return found

    try:
        assert "open:" in command.stdout.readline() + command.stdout.readline()
        deadline = time.monotonic() + 20
        while not alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(), "the server did not start"
        command.send_signal(signal.SIGTERM)
        command.wait(timeout=20)
        deadline = time.monotonic() + 10
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(), "the formgrader's server outlived the command"
    finally:
        command.kill()
        for pid in alive():
            os.kill(int(pid), signal.SIGKILL)


def _hostile_notebook() -> dict:
    """A submission whose every part nbconvert could write into formgrader's page as markup tries to run script
    there: each attempt calls a function named ``PWN<n>``."""
    def code(outputs, **extra):
        return {"cell_type": "code", "metadata": extra.pop("metadata", {}), "source": "x = 1", "outputs": outputs,
                "execution_count": extra.pop("execution_count", 1), **extra}

    def shown(data, **metadata):
        return {"output_type": "display_data", "data": data, "metadata": metadata}

    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"title": "</title><script>PWN1()</script>",
                         "widgets": {"application/vnd.jupyter.widget-state+json": {
                             "state": {}, "version_major": 2, "version_minor": 0,
                             "x": "</script><script>PWN2()</script>"}}},
            "cells": [
                {"cell_type": "markdown", "metadata": {"nbgrader": {"grade_id": "written", "grade": True,
                                                                    "solution": True, "points": 2}},
                 "source": "My answer <img src=x onerror=PWN3()> <script>PWN4()</script> [see](javascript:PWN5()) "
                           "<javascript:PWN6()> ```` ~~~"},
                {"cell_type": "markdown", "metadata": {"tags": ['"><script>PWN7()</script>']},
                 "attachments": {"a.svg": {"image/svg+xml": "<svg onload='PWN8()'></svg>"}},
                 "source": "![a](attachment:a.svg)"},
                {"cell_type": "raw", "metadata": {"raw_mimetype": "text/html", "format": "text/html"},
                 "source": "<script>PWN10()</script>"},
                code([shown({"text/html": "<script>PWN11()</script>"}),
                      shown({"application/javascript": "PWN12()"}),
                      shown({"image/svg+xml": "<svg onload='PWN13()'></svg>"}),
                      shown({"text/markdown": "<img src=x onerror=PWN14()>"}),
                      shown({"text/latex": "$\\href{javascript:PWN15()}{x}$"}),
                      shown({"image/png": "\"><script>PWN16()</script>"}),
                      shown({"image/png": "iVBORw0KGgo="}, **{"image/png": {"width": '"><script>PWN17()</script>'}}),
                      {"output_type": "stream", "name": "stdout", "text": "<script>PWN18()</script>"},
                      {"output_type": "error", "ename": "E", "evalue": "<script>PWN19()</script>",
                       "traceback": ["<script>PWN20()</script>"]}],
                     metadata={"nbgrader": {"grade_id": 'x"><script>PWN22()</script>', "grade": True,
                                            "points": '"><script>PWN23()</script>'},
                               "tags": ['"><script>PWN24()</script>']})]}


class _Active(__import__("html.parser").parser.HTMLParser):
    """Where ``PWN`` reaches a page as anything but text: an attribute, a script or style, a ``javascript:``
    link."""

    def __init__(self):
        super().__init__()
        self.found, self._in = [], []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            value = value or ""
            if "PWN" in value or "PWN" in name or value.strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}={value[:80]!r}>")
        if tag in ("script", "style"):
            self._in.append(tag)

    def handle_endtag(self, tag):
        if self._in and tag == self._in[-1]:
            self._in.pop()

    def handle_data(self, data):
        if self._in and "PWN" in data:
            self.found.append(f"in <{self._in[-1]}>: {data.strip()[:80]!r}")


def test_formgraders_copy_of_a_submission_runs_nothing_in_the_tas_browser(tmp_path):
    """formgrader renders ``autograded/`` with nbconvert, unsanitised, at the Jupyter server's own address: a
    student's HTML, JavaScript or SVG output, the raw HTML or ``javascript:`` link of a markdown answer, an image's
    data, or metadata (tags, ids, a grade id) would run as script in the TA's formgrader, with their server's
    rights. The copy the grader keeps shows all of it as text, and keeps what a TA grades."""
    from nbconvert import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config import Config
    submitted = tmp_path / "lab0.ipynb"
    submitted.write_text(json.dumps(_hostile_notebook()))
    copy = tmp_path / "autograded.ipynb"
    release = tmp_path / "release.ipynb"  # the written answer's grade, as the lab's release has it
    release.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": "Answer here", "metadata": {
        "nbgrader": {"grade_id": "written", "grade": True, "solution": True, "locked": False, "points": 2}}}]}))
    nbgrader_run.write_without_hidden_tests(submitted, copy, release)
    config = Config()  # nbgrader's formgrader extension (FormgradeExtension.build_extra_config) renders so
    config.HTMLExporter.template_name = "formgrade"
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    page, _ = HTMLExporter(config=config).from_filename(str(copy), resources={
        "assignment_id": LAB, "notebook_id": "lab0", "submission_id": "1", "index": 0, "total": 1, "base_url": "",
        "student": "mallory", "last_name": "", "first_name": "", "notebook_path": "autograded/lab0.ipynb"})
    active = _Active()
    active.feed(page)
    assert not active.found, active.found
    kept = json.loads(copy.read_text())
    # what a TA grades is still there, as text: the answer, the outputs, the graded cell's nbgrader metadata
    assert "My answer" in page and "PWN11()" in page and "PWN18()" in page
    assert kept["cells"][0]["metadata"]["nbgrader"] == {"grade_id": "written", "grade": True, "solution": True,
                                                        "locked": False, "points": 2}
    assert kept["cells"][3]["outputs"][6]["data"]["image/png"] == "iVBORw0KGgo="


def test_a_students_name_runs_nothing_in_formgrader(tmp_path, monkeypatch):
    """formgrader's submission page writes the student's first and last name from the gradebook unescaped, and a
    student sets their own name in many an LMS (Moodle's profile): the roster put ``<img onerror=...>`` there as
    given. The gradebook keeps a name without the characters HTML reads as markup."""
    from nbconvert import HTMLExporter
    from nbgrader.api import Gradebook
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config import Config
    from fuselab.grading.records import roster
    db = tmp_path / "gradebook.db"
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))  # alembic
    with Gradebook(f"sqlite:///{db}"):
        pass
    roster.to_gradebook(db, [{"student": "mallory", "first_name": "<img src=x onerror=PWN1()>",
                              "last_name": "O'Brien<script>PWN2()</script>", "email": "m@x\"><script>PWN3()</script>"}])
    with Gradebook(f"sqlite:///{db}") as gradebook:
        student = gradebook.find_student("mallory")
        first, last, email = student.first_name, student.last_name, student.email
    assert last.startswith("O'Brien") and "img src=x onerror=PWN1()" in first  # the words stay, as text
    copy = tmp_path / "autograded.ipynb"
    copy.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 4, "metadata": nbgrader_run.PYTHON_METADATA,
                                "cells": []}))
    config = Config()  # nbgrader's formgrader extension (FormgradeExtension.build_extra_config) renders so
    config.HTMLExporter.template_name = "formgrade"
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    page, _ = HTMLExporter(config=config).from_filename(str(copy), resources={
        "assignment_id": LAB, "notebook_id": "lab0", "submission_id": "1", "index": 0, "total": 1, "base_url": "",
        "student": "mallory", "last_name": last, "first_name": first, "notebook_path": "autograded/lab0.ipynb"})
    active = _Active()
    active.feed(page)
    assert not active.found, active.found
    assert "PWN1()" in page
    assert not set('<>&"`') & set(first + last + email), (first, last, email)  # nor where a page quotes them


def test_the_pages_processes_start_before_the_gradebook_is_recorded_and_draw_the_pages(graded_run, monkeypatch):
    """The outputs' processes that draw the pages are started (every one of them) before the class is recorded in
    the gradebook, so their start runs beside that; the pages left to draw go to those same processes, and they
    are the pages one process draws."""
    from fuselab.grading.gpus import schedule
    from fuselab.grading.outputs import feedback
    from fuselab.grading.run.pipeline import ClassResult
    _, out, settings = graded_run
    results = [SubmissionResult.from_json(json.loads((out / "work" / s / LAB / "result.json").read_text()))
               for s in STUDENTS]
    alone = {s: (out / "feedback" / s / f"{LAB}.html").read_bytes() for s in STUDENTS}  # the first run's, drawn here
    shutil.rmtree(out / "feedback")
    monkeypatch.setattr(feedback, "PAGES_PER_PROCESS", 1)
    monkeypatch.setattr(schedule, "available_cores", lambda: 2)
    events = []

    class Seen(feedback.Drawers):
        def __init__(self, pages):
            super().__init__(pages)
            self.started = set(self.pool._processes) if self.pool else set()
            events.append(("started", len(self.started)))

        def draw(self, results, shared):
            events.append(("drawn by them", self.pool is not None and set(self.pool._processes) == self.started))
            return super().draw(results, shared)

    def record(*args, real=nbgrader_run.record, **kwargs):
        events.append(("recorded",))
        return real(*args, **kwargs)
    monkeypatch.setattr(feedback, "Drawers", Seen)
    monkeypatch.setattr(nbgrader_run, "record", record)
    pipeline.write_outputs(ClassResult(out=out, results=results, problems=[], reference={}, graded_now=2), settings)
    assert events == [("started", 2), ("recorded",), ("drawn by them", True)]
    assert {s: (out / "feedback" / s / f"{LAB}.html").read_bytes() for s in STUDENTS} == alone
    # a run that graded nothing now (outputs again, say after hand grading) starts none: its pages are kept
    events.clear()
    pipeline.write_outputs(ClassResult(out=out, results=results, problems=[], reference={}, graded_now=0), settings)
    assert events == [("started", 0), ("recorded",)]


def _hand_grade(out: Path, student: str, cell: str, points=None, comment=None, extra=None) -> None:
    """What formgrader saves for a cell: a score, extra credit, a comment (nbgrader's gradebook, as its web API
    writes it)."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        if points is not None:
            gradebook.find_grade(cell, LAB, LAB, student).manual_score = points
        if extra is not None:
            gradebook.find_grade(cell, LAB, LAB, student).extra_credit = extra
        if comment is not None:
            gradebook.find_comment(cell, LAB, LAB, student).manual_comment = comment
        gradebook.db.commit()


def _entered(out: Path, student: str, cell: str) -> tuple:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        grade = gradebook.find_grade(cell, LAB, LAB, student)
        try:
            comment = gradebook.find_comment(cell, LAB, LAB, student).manual_comment
        except Exception:  # noqa: BLE001 - a test cell has no comment
            comment = None
        return grade.manual_score, comment


def test_a_new_upload_sets_aside_the_hand_grades_it_made_stale(graded_run, monkeypatch):
    """A hand grade judged one upload. ann's new upload changed her written answer and now fails a test a TA had
    re-scored: both hand grades are set aside (the answer waits for a person again, the test takes the grader's
    score), kept in the course folder and said in the report; bob's, and a run that records the same notebooks
    again, keep theirs."""
    source, out, settings = graded_run
    _hand_grade(out, "ann", "answer_sweep", 0.5, "Half: the sweep misses the small sizes.", extra=0.25)
    _hand_grade(out, "ann", "test_fused", points=1.0)
    _hand_grade(out, "bob", "answer_sweep", 1.0, "Good.")
    pipeline.grade(source, settings)  # the same notebooks recorded again: every hand grade stays
    assert _entered(out, "ann", "answer_sweep") == (0.5, "Half: the sweep misses the small sizes.")
    assert _entered(out, "ann", "test_fused")[0] == 1.0
    assert not (out / "course" / nbgrader_run.SET_ASIDE).exists()

    notebook = source / "ann" / LAB / nbgrader_run.notebook_name(LAB)
    nb = json.loads(notebook.read_text())
    answer = next(c for c in nb["cells"] if ipynb.grade_id(c) == "answer_sweep")
    answer["source"] = "I did not have time to answer this."
    notebook.write_text(json.dumps(nb))

    def fails_test_fused(sub, *args, **kwargs):
        result = _fake_grade(sub, out)
        result.cells["test_fused"].points, result.cells["test_fused"].status = 0.0, "failed"
        result.total = sum(c.points for c in result.cells.values())
        (out / "work" / sub.student / LAB / "result.json").write_text(json.dumps(result.to_json()))
        return result

    monkeypatch.setattr(pipeline, "grade_submission", fails_test_fused)
    pipeline.grade(source, pipeline.Settings(out=out, labs=[LAB], students=["ann"], force=True, progress=False))
    assert _entered(out, "ann", "answer_sweep") == (None, None)
    assert _entered(out, "ann", "test_fused")[0] is None
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:  # the extra credit went with it
        assert not gradebook.find_grade("answer_sweep", LAB, LAB, "ann").extra_credit
    assert _entered(out, "bob", "answer_sweep") == (1.0, "Good.")
    kept = [json.loads(line) for line in (out / "course" / nbgrader_run.SET_ASIDE).read_text().splitlines()]
    assert sorted((k["cell"], k["points"], k["comment"], k["extra_credit"]) for k in kept) == [
        ("answer_sweep", 0.5, "Half: the sweep misses the small sizes.", 0.25), ("test_fused", 1.0, "", 0.0)]
    report = (out / "report.md").read_text()
    assert "hand grade set aside" in report and "answer_sweep" in report and "the answer changed" in report
    assert "re-scored by hand where the grader gave 2; the new upload scores 0" in report
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert rows["ann"]["lab0/answer_sweep"] == "" and float(rows["bob"]["lab0/answer_sweep"]) == 1.0
    assert float(rows["ann"]["lab0/test_fused"]) == 0.0
    [waiting] = [line for line in report.splitlines() if "to grade by hand" in line]
    assert "ann" in waiting  # her answer waits for a person again

    monkeypatch.setattr(pipeline, "grade_submission", lambda *a, **k: pytest.fail("a kept result was regraded"))
    pipeline.grade(source, settings)  # recorded again: nothing more is set aside
    assert len((out / "course" / nbgrader_run.SET_ASIDE).read_text().splitlines()) == 2

    def set_aside_said():
        return sorted(re.findall(r"ann/lab0: \*\*hand grade set aside\*\*: (\w+):", (out / "report.md").read_text()))
    # every later run still says them (a TA may not have read the run that set them aside), until a person grades
    # the cell again: the answer, and the test whose new score the TA keeps by entering it
    assert set_aside_said() == ["answer_sweep", "test_fused"]
    _hand_grade(out, "ann", "answer_sweep", 0.0, "No answer.")
    pipeline.grade(source, settings)
    assert set_aside_said() == ["test_fused"]
    _hand_grade(out, "ann", "test_fused", points=0.0)
    pipeline.grade(source, settings)
    assert set_aside_said() == []
    assert len((out / "course" / nbgrader_run.SET_ASIDE).read_text().splitlines()) == 2  # the record stays whole


def _moved(notebook: dict, moves) -> dict:
    """``notebook`` with each of ``moves`` done to its cells: (grade id, what), what one of "drop" (the cell's
    nbgrader metadata deleted), ("as", other id, points) (the cell claims another grade and its points), or
    ("decoy after", other id, points, text) (a markdown cell of the student's own claiming a grade, after it)."""
    cells = []
    for cell in notebook["cells"]:
        grading = cell["metadata"].get("nbgrader") or {}
        cells.append(cell)
        for grade_id, what in moves:
            if grading.get("grade_id") != grade_id:
                continue
            if what == "drop":
                del cell["metadata"]["nbgrader"]
            elif what[0] == "as":
                grading.update(grade_id=what[1], points=what[2])
            else:
                cells.append({"cell_type": "markdown", "source": what[3], "metadata": {"nbgrader": {
                    **grading, "grade_id": what[1], "points": what[2]}}})
    return {**notebook, "cells": cells}


@pytest.mark.parametrize("moves", [
    [("test_speedup", "drop"), ("answer_sweep", ("as", "test_speedup", 1))],
    [("test_speedup", "drop"), ("answer_sweep", ("decoy after", "test_speedup", 1, "Beyond the L2, continued"))],
    [("answer_sweep", ("decoy after", "test_unfused", 30, "see above")), ("answer_sweep", ("as", "test_fused", 9))],
    [("test_fused", ("as", "answer_sweep", 1))],
], ids=["renamed-answer", "decoy-cell", "two-claims", "test-as-answer"])
def test_a_student_cannot_move_a_grade_onto_a_cell_of_their_own_in_formgrader(tmp_path, moves):
    """formgrader builds each score box, its maximum and its id from the ``autograded/`` copy's nbgrader metadata,
    and a person's score on a test replaces the grader's: a student who deleted a test's metadata and gave its
    grade id to their written answer (or to a cell of their own, with the points they chose) had the TA's "full
    credit" on that answer land on the test. The copy's graded cells are the release's: each grade at most once,
    on a cell of the release's kind, with the release's points and flags, a locked cell with the release's text."""
    release = course.LABS / LAB / f"{LAB}.ipynb"
    truth = nbgrader_run.graded_cells(release)
    submitted = tmp_path / "lab0.ipynb"
    submitted.write_text(json.dumps(_moved(json.loads((REPO / "grader" / "examples" / "correct" / LAB /
                                                       f"{LAB}.ipynb").read_text()), moves)))
    copy = nbgrader_run.formgrader_copy(submitted, truth)
    seen = []
    for cell in copy["cells"]:
        grading = cell["metadata"].get("nbgrader")
        if grading is None:
            continue
        released = truth[grading["grade_id"]]
        seen.append(grading["grade_id"])
        assert cell["cell_type"] == released["cell_type"]
        for key in ("grade", "solution", "locked", "points"):
            assert grading.get(key) == released["metadata"]["nbgrader"].get(key), (grading["grade_id"], key)
        if grading.get("locked") and not grading.get("solution"):
            assert ipynb.source(cell) == ipynb.source(released)
    assert len(seen) == len(set(seen))
    for grade_id, what in moves:  # a grade claimed by the student's cell is on no cell of theirs
        claimed = what[1] if what != "drop" else None
        if claimed in truth and truth[claimed]["metadata"]["nbgrader"].get("locked"):
            holders = [c for c in copy["cells"] if (c["metadata"].get("nbgrader") or {}).get("grade_id") == claimed]
            assert all(ipynb.source(c) == ipynb.source(truth[claimed]) for c in holders)


def test_a_copied_answer_cell_is_graded_in_its_last_copy_as_nbgrader_keeps_it():
    """A written answer's cell copied in JupyterLab keeps its grade id; nbgrader's DeduplicateIds keeps the last
    copy, and so does formgrader's copy: the TA's box sits on the answer the student wrote last, not on the
    template left above it."""
    release = nbgrader_run.graded_cells(course.LABS / LAB / f"{LAB}.ipynb")
    nb = json.loads((REPO / "grader" / "examples" / "correct" / LAB / f"{LAB}.ipynb").read_text())
    index = next(i for i, c in enumerate(nb["cells"])
                 if (c["metadata"].get("nbgrader") or {}).get("grade_id") == "answer_sweep")
    template = json.loads(json.dumps(nb["cells"][index]))
    template["source"] = "YOUR ANSWER HERE"
    nb["cells"][index]["source"] = "My last answer: the L2 holds both inputs."
    nb["cells"].insert(index, template)
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "lab0.ipynb"
        path.write_text(json.dumps(nb))
        copy = nbgrader_run.formgrader_copy(path, release)
    holders = [c for c in copy["cells"] if (c["metadata"].get("nbgrader") or {}).get("grade_id") == "answer_sweep"]
    assert len(holders) == 1 and "My last answer" in ipynb.source(holders[0])
