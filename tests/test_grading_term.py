"""A TA's term in one course folder, on the CPU: everyone accounted for, late work, a second lab a week later, a
regrade of one student that keeps the class, a misspelled name refused, hand grading and the LMS export.

The intake and roster checks at the top are cheap (no grading). The term is graded once (a module fixture):
week 1 a Canvas zip of lab 0 (a resubmission, a late one, an .html upload) with a Canvas roster naming a
student who submitted nothing; week 2 lab 1 from a folder with nbgrader's timestamp.txt, late against --due;
week 5 a regrade of one student. Three notebooks are graded, the cheapest that show it (a correct Lab 0, a Lab 0
that does not compile, Lab 1 as released); the reference runs are the session's (conftest.py), kept in the folder.
"""

import csv
import html
import io
import json
import os
import zipfile
from pathlib import Path

import pytest
import torch

from fuselab import course
from fuselab.grading.run import cli, pipeline
from fuselab.grading.outputs import export
from fuselab.grading.records import intake, nbgrader_run, roster, term
from fuselab.grading.gpus import schedule

from . import formgrader_api

LABS = {"lab0": "lab0.ipynb", "lab1": "lab1.ipynb"}
NB = json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []})
EXAMPLES = course.GRADER / "examples"


def _write(path, text=NB):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------- intake, roster


def test_every_entry_of_a_canvas_zip_is_graded_or_says_why(tmp_path):
    bulk = tmp_path / "canvas.zip"
    with zipfile.ZipFile(bulk, "w") as zf:
        zf.writestr("smithjohn_1002_9001_lab0-1.ipynb", NB)        # a resubmission: Canvas renames it lab0-1
        zf.writestr("smithjohn_1002_9003_lab0.html", "<html>")    # beside it: a note, not a second entry
        zf.writestr("doejane_LATE_1003_9002_lab0.ipynb", NB)
        zf.writestr("nguyenbao_1005_5005_lab0.html", "<html>")    # the only upload: not a notebook
    subs, problems = intake.collect(bulk, tmp_path / "staging", LABS)
    by = {s.student: s for s in subs}
    assert sorted(by) == ["doejane_1003", "smithjohn_1002"]
    assert by["doejane_1003"].late and not by["smithjohn_1002"].late
    assert (by["doejane_1003"].lms_id, by["doejane_1003"].lms) == ("1003", "canvas")
    assert any("lab0.html" in w and "not a notebook" in w for w in by["smithjohn_1002"].warnings)
    [problem] = problems
    assert (problem.student, problem.lab) == ("nguyenbao_1005", "lab0")
    assert "wrong file type" in problem.message and ".ipynb" in problem.message


def test_moodle_flat_download_and_a_path_too_long_to_read(tmp_path):
    root = tmp_path / "in"
    _write(root / "John Smith_1234_assignsubmission_file_lab0.ipynb")
    _write(root / "Ann Lee_1235_assignsubmission_file_" / "lab0.ipynb")
    # a notebook below a path longer than the system's limit (made one folder at a time, relative to the last)
    deep = root / "Bo Park_1236_assignsubmission_file_"
    deep.mkdir()
    folder = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(40):
        os.mkdir("d" * 200, dir_fd=folder)
        inner = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=folder)
        os.close(folder)
        folder = inner
    handle = os.open("lab0.ipynb", os.O_WRONLY | os.O_CREAT, dir_fd=folder)
    os.write(handle, NB.encode())
    os.close(handle)
    os.close(folder)
    subs, problems = intake.collect(root, tmp_path / "staging", LABS)
    assert sorted((s.student, s.lab, s.lms) for s in subs) == [("Ann_Lee_1235", "lab0", "moodle"),
                                                               ("John_Smith_1234", "lab0", "moodle")]
    [problem] = problems
    assert problem.student == "Bo_Park_1236" and "too long" in problem.message.lower()


def test_nbgraders_timestamp_is_kept_and_the_roster_reads_both_lmss(tmp_path):
    root = tmp_path / "in"
    _write(root / "alice" / "lab0" / "lab0.ipynb")
    _write(root / "alice" / "lab0" / "timestamp.txt", "2026-09-15 01:30:00.000000 UTC")
    [sub], problems = intake.collect(root, tmp_path / "staging", LABS)
    assert problems == [] and sub.submitted == "2026-09-15T01:30:00"
    canvas = _write(tmp_path / "canvas.csv", "Student,ID,SIS User ID,SIS Login ID,Section,Lab 0 (777)\n"
                                             "    Points Possible,,,,,12\n\"Smith, John\",1002,s1,jsmith,A,\n"
                                             "\"Lee, Ann\",1004,s4,alee,A,\n")
    people = roster.read(canvas)
    assert [(p["student"], p["lms_id"], p["sis_login"]) for p in people] == [
        ("smithjohn_1002", "1002", "jsmith"), ("leeann_1004", "1004", "alee")]
    moodle = _write(tmp_path / "moodle.csv", "Identifier,Full name,Email address,Status\n"
                                             "Participant 1234,John Smith,js@uni.edu,Submitted\n")
    assert [(p["student"], p["email"]) for p in roster.read(moodle)] == [("John_Smith_1234", "js@uni.edu")]
    with pytest.raises(roster.RosterError, match="Student, ID"):
        roster.read(_write(tmp_path / "other.csv", "name,score\nx,1\n"))


def test_a_roster_that_is_not_a_csv_is_refused_saying_what_to_give(tmp_path, monkeypatch):
    """A zip (an .xlsx is one), random bytes, text not in UTF-8 or what csv cannot parse is a ``RosterError``
    naming the file and the LMS's CSV export to give, never a csv or decoding traceback."""
    import random
    canvas = "Student,ID,SIS User ID,SIS Login ID,Section,Lab 0 (777)\n\"M\u00fcller, J\u00fcrgen\",1002,s2,jm,A,\n"
    with zipfile.ZipFile(tmp_path / "grades.xlsx", "w") as zf:
        zf.writestr("xl/workbook.xml", "<workbook/>")
    noise = random.Random(0).randbytes(4096)
    (tmp_path / "noise.csv").write_bytes(noise)
    (tmp_path / "noise-no-nul.csv").write_bytes(noise.replace(b"\0", b""))
    (tmp_path / "latin1.csv").write_bytes(canvas.encode("latin-1"))
    (tmp_path / "huge-field.csv").write_text('Student,ID\n"' + "x" * 200_000 + '",1\n')
    first_u = canvas.index("\u00fc")  # Latin-1's byte 0xfc: where the UTF-8 decoding stops
    for name, why in (("grades.xlsx", "a zip archive"), ("noise.csv", "NUL bytes"),
                      ("noise-no-nul.csv", "not UTF-8 text"),
                      ("latin1.csv", f"not UTF-8 text (byte 0xfc at offset {first_u})"),
                      ("huge-field.csv", "field larger than field limit")):
        with pytest.raises(roster.RosterError) as refused:
            roster.read(tmp_path / name)
        said = str(refused.value)
        assert said.startswith(f"{tmp_path / name}: ") and why in said, said
        assert "Canvas's gradebook export (Grades > Export)" in said and "Moodle's grading worksheet" in said
    # the same roster in UTF-8, with a BOM and rows ended by \r alone (an old Mac's CSV), is read
    (tmp_path / "mac.csv").write_bytes(b"\xef\xbb\xbf" + canvas.replace("\n", "\r").encode())
    assert [(p["name"], p["lms_id"]) for p in roster.read(tmp_path / "mac.csv")] == [("M\u00fcller, J\u00fcrgen", "1002")]
    # a roster cut at MAX_ROSTER_BYTES inside a character is read up to the cut, not refused as not UTF-8
    longer = (canvas[:canvas.index("\n") + 1] + '"Smith, John",1003,s3,js,A,\n' + canvas[canvas.index("\n") + 1:]).encode()
    (tmp_path / "long.csv").write_bytes(longer)
    monkeypatch.setattr(roster, "MAX_ROSTER_BYTES", longer.index("\u00fc".encode()) + 1)
    assert [p["lms_id"] for p in roster.read(tmp_path / "long.csv")] == ["1003"]


def _moodle_download(tmp_path, ann, ann_text=NB):
    """Moodle's download of lab 0 (John's folder, and ``ann``), taken in; and an empty course folder."""
    root = tmp_path / "in"
    _write(root / "John Smith_1234_assignsubmission_file_" / "lab0.ipynb")
    _write(root / ann, ann_text)
    subs, problems = intake.collect(root, tmp_path / "staging", LABS)
    (tmp_path / "course").mkdir()
    return subs, problems, tmp_path / "course"


# a Moodle grading worksheet's header, and its row of a submission two hours late
WORKSHEET_HEADER = "Identifier,Full name,Email address,Status,Grade,Last modified (submission)\n"
JOHN_TWO_HOURS_LATE = ("Participant 1234,John Smith,js@uni.edu,Submitted for grading - 2 hours late,,"
                       "\"Tuesday, 15 September 2026, 1:59 AM\"\n")


def test_a_moodle_worksheet_gives_late_marks_times_and_the_missing(tmp_path, monkeypatch):
    subs, problems, out = _moodle_download(tmp_path, "Ann Lee_1235_assignsubmission_file_lab0.html", "<html>")
    sheet = _write(tmp_path / "worksheet.csv",
                   WORKSHEET_HEADER + JOHN_TWO_HOURS_LATE +
                   "Participant 1235,Ann Lee,al@uni.edu,Submitted for grading,,-\n"
                   "Participant 1236,Bo Park,bp@uni.edu,No submission,,-\n")
    entries = term.record_course(out, subs, {("John_Smith_1234", "lab0")}, problems, {"lab0"}, roster.read(sheet))
    assert term.load_entries(out) == entries
    from fuselab.grading.records.results import SubmissionResult
    graded = SubmissionResult("John_Smith_1234", "lab0", total=3.0, max_total=10.0)
    import datetime
    rows = {s.student: s for s in term.standings([graded], entries, roster.load(out),
                                                 {"lab0": datetime.datetime(2026, 9, 14, 23, 59)})}
    assert sorted(rows) == ["Ann_Lee_1235", "Bo_Park_1236", "John_Smith_1234"]
    john = rows["John_Smith_1234"]
    assert john.late and john.submitted == "2026-09-15T01:59:00" and john.person["email"] == "js@uni.edu"
    assert rows["Ann_Lee_1235"].status == term.NOT_GRADED and "wrong file type" in rows["Ann_Lee_1235"].why
    assert rows["Bo_Park_1236"].status == term.MISSING and rows["Bo_Park_1236"].lms_id == "1236"
    # the export: Moodle's grading worksheet of lab 0, nbgrader's points (a grade set as formgrader would)
    (out / "work" / "John_Smith_1234" / "lab0").mkdir(parents=True)
    pipeline._write_result(out / "work" / "John_Smith_1234" / "lab0" / "result.json", graded)
    (out / "course").mkdir()
    import sys
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # its alembic
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        gradebook.add_assignment("lab0")
        gradebook.add_notebook("lab0", "lab0")
        gradebook.add_grade_cell("test_fused", "lab0", "lab0", max_score=10, cell_type="code")
        gradebook.add_grade_cell("answer", "lab0", "lab0", max_score=2, cell_type="markdown")
        gradebook.add_student("John_Smith_1234")
        gradebook.add_submission("lab0", "John_Smith_1234")
        gradebook.find_grade("test_fused", "lab0", "lab0", "John_Smith_1234").auto_score = 3
        gradebook.find_grade("answer", "lab0", "lab0", "John_Smith_1234").manual_score = 1.5
        gradebook.db.commit()
    done = export.write(out)
    with open(out / "export" / "moodle-lab0.csv", encoding="utf-8") as handle:
        sheet_rows = list(csv.reader(handle))
    assert sheet_rows == [["Identifier", "Full name", "Email address", "Grade", "Maximum Grade"],
                          ["Participant 1235", "Ann Lee", "al@uni.edu", "", "12"],
                          ["Participant 1236", "Bo Park", "bp@uni.edu", "0", "12"],
                          ["Participant 1234", "John Smith", "js@uni.edu", "4.5", "12"]]
    assert [(s, lab) for s, lab, _ in done.not_graded] == [("Ann_Lee_1235", "lab0")]
    assert not (out / "export" / "canvas-grades.csv").exists()
    # the LMS it has no ids of is said, not skipped in silence (docs/ta-guide.md)
    assert [p for p in done.problems if p.startswith("no Canvas file: no student of")] == done.problems != []


def test_a_later_run_of_the_lab_without_the_worksheet_keeps_its_late_marks(tmp_path):
    """The guide's hand-grading step runs the lab again with the same download and no --roster: the worksheet's late
    mark and time stay the lab's (they went, and with them nbgrader's late penalty). A later worksheet or an LMS
    time of the submission's own still counts."""
    subs, problems, out = _moodle_download(tmp_path, "Ann Lee_1235_assignsubmission_file_/lab0.ipynb")
    sheet = _write(tmp_path / "worksheet.csv",
                   WORKSHEET_HEADER + JOHN_TWO_HOURS_LATE +
                   "Participant 1235,Ann Lee,al@uni.edu,Submitted for grading,,"
                   "\"Monday, 14 September 2026, 9:00 PM\"\n")
    graded = {("John_Smith_1234", "lab0"), ("Ann_Lee_1235", "lab0")}
    term.record_course(out, subs, graded, problems, {"lab0"}, roster.read(sheet))
    again = term.record_course(out, subs, graded, problems, {"lab0"})  # the same download, no --roster
    john, ann = again[("John_Smith_1234", "lab0")], again[("Ann_Lee_1235", "lab0")]
    assert john.late and john.submitted == "2026-09-15T01:59:00"
    assert not ann.late and ann.submitted == "2026-09-14T21:00:00"
    assert term.load_entries(out) == again
    # a run of lab 1 (the worksheet was lab 0's) marks nothing of lab 1
    root = tmp_path / "in"
    _write(root / "John Smith_1234_assignsubmission_file_" / "lab1.ipynb")
    subs1, problems1 = intake.collect(root, tmp_path / "staging1", LABS)
    later = term.record_course(out, subs1, {("John_Smith_1234", "lab1")}, problems1, {"lab1"})
    assert not later[("John_Smith_1234", "lab1")].late and later[("John_Smith_1234", "lab0")].late


def test_a_student_graded_in_one_lab_and_not_on_the_roster_is_missing_in_the_next():
    """A Canvas student the roster does not name (enrolled late) handed in lab 0 and not lab 1: lab 1 shows them
    missing with 0, as it does the roster's, instead of a blank that grades.csv, the report and the export never
    mention. A Moodle id is one assignment's (Moodle numbers a student anew in each): it is left to the worksheet."""
    from fuselab.grading.records.results import SubmissionResult
    entries = {("kimlee_1007", "lab0"): term.Entry("kimlee_1007", "lab0", term.GRADED, lms_id="1007", lms="canvas"),
               ("doejane_1003", "lab1"): term.Entry("doejane_1003", "lab1", term.GRADED, lms_id="1003",
                                                    lms="canvas"),
               ("Ann_Lee_1235", "lab0"): term.Entry("Ann_Lee_1235", "lab0", term.GRADED, lms_id="1235", lms="moodle"),
               (term.nobodys("lab0.ipynb"), "lab0"): term.Entry(term.nobodys("lab0.ipynb"), "lab0",
                                                                term.NOT_GRADED, why="whose?")}
    results = [SubmissionResult(s, lab, total=1.0, max_total=10.0)
               for s, lab in [("kimlee_1007", "lab0"), ("doejane_1003", "lab1"), ("Ann_Lee_1235", "lab0")]]
    people = [{"student": "doejane_1003", "lms_id": "1003", "lms": "canvas"}]
    rows = {(s.student, s.lab): s for s in term.standings(results, entries, people)}
    kim = rows[("kimlee_1007", "lab1")]
    assert kim.status == term.MISSING and kim.lms_id == "1007" and kim.lms == "canvas"
    assert rows[("doejane_1003", "lab0")].status == term.MISSING  # the roster's, as before
    assert ("Ann_Lee_1235", "lab1") not in rows
    assert not any(student.startswith(term.NOBODY) and lab == "lab1" for student, lab in rows)
    # the run's own output names them too, for the labs it graded (a run of lab 1 here)
    standings = list(rows.values())
    assert cli.missing_line(standings, {"lab1"}) == "missing (nothing submitted, 0 in grades.csv): kimlee_1007/lab1"
    assert cli.missing_line(standings, {"lab0", "lab1"}, most=1).endswith(" and 1 more (report.html)")
    assert cli.missing_line(standings, {"lab2"}) == ""
    # and the report's To look at names whom the roster does not list, to download it again (not the upload of
    # no student, nor anyone when no roster was given)
    from fuselab.grading.outputs import report
    [line] = report._not_on_the_roster(standings)
    said = "".join(text for _, text in line)
    assert "not on the roster" in said and "2 student(s)" in said and "Ann_Lee_1235, kimlee_1007" in said, said
    assert "doejane_1003" not in said and term.NOBODY not in said
    assert report._not_on_the_roster([s for s in standings if not s.person]) == []  # no roster given: no line


def test_a_student_whose_only_upload_was_not_graded_is_missing_in_the_other_labs():
    """A student known only by an upload that could not be graded (not a notebook, say) is of the class: the lab
    they handed nothing in for shows them missing with 0, as it does a student graded there."""
    from fuselab.grading.records.results import SubmissionResult
    entries = {("ann", "lab0"): term.Entry("ann", "lab0", term.GRADED),
               ("ann", "lab1"): term.Entry("ann", "lab1", term.GRADED),
               ("dave", "lab1"): term.Entry("dave", "lab1", term.NOT_GRADED, why="not a notebook")}
    results = [SubmissionResult("ann", lab, total=1.0, max_total=10.0) for lab in ("lab0", "lab1")]
    rows = {(s.student, s.lab): s for s in term.standings(results, entries, [])}
    assert rows[("dave", "lab0")].status == term.MISSING and rows[("dave", "lab1")].status == term.NOT_GRADED


def test_uploads_of_no_student_and_duplicate_members_are_rows_of_every_run(tmp_path, monkeypatch):
    """A notebook at the top of the class zip (whose, nobody can tell) and two zip members of one name (which copy
    is bob's, nobody can tell) are rows of grades.csv and the report, "not graded" and why, and stay rows when a
    later run of the term grades another lab. Graded cheaply: each submission's result written as a grading run
    writes it (tests/test_hand_grading.py), the intake, entries and outputs the real ones."""
    from .test_hand_grading import _fake_grade
    bulk = tmp_path / "class.zip"
    with zipfile.ZipFile(bulk, "w") as zf:
        zf.write(course.LABS / "lab0" / "lab0.ipynb", "ann/lab0/lab0.ipynb")
        zf.write(course.LABS / "lab0" / "lab0.ipynb", "lab0.ipynb")  # at the top: nobody's
        zf.write(course.LABS / "lab0" / "lab0.ipynb", "bob/lab0/lab0.ipynb")
        with pytest.warns(UserWarning, match="Duplicate name"):  # Python's zipfile says so too
            zf.write(course.SOLUTIONS / "lab0" / "lab0.ipynb", "bob/lab0/lab0.ipynb")  # the same name again
    out = tmp_path / "course"
    _grading_faked(monkeypatch, lambda sub, *a, **k: _fake_grade(sub, out))
    pipeline.grade(bulk, pipeline.Settings(out=out, labs=["lab0"], progress=False))

    def check(*graded):
        rows = _rows(out / "grades.csv")
        nobody = term.nobodys("lab0.ipynb")
        assert sorted(rows) == sorted([nobody, "bob", *graded])
        assert [rows[who]["lab0 status"] for who in graded] == ["graded"] * len(graded)
        assert rows[nobody]["lab0 status"].startswith("not graded: ") and "top level" in rows[nobody]["lab0 status"]
        assert rows["bob"]["lab0 status"].startswith("not graded: ") and "duplicate" in rows["bob"]["lab0 status"]
        assert rows["bob"]["lab0 total"] == rows[nobody]["lab0 total"] == ""
        report = (out / "report.md").read_text()
        for who, why in ((nobody, "top level"), ("bob", "duplicate")):
            line = next(line for line in report.splitlines() if line.startswith(f"| {who} |"))
            assert "not graded: " in line and why in line, line
        assert f"{len(graded) + 2} student(s)" in report

    check("ann")
    # a later run of the term, of a late student alone: the rows of the first run stay, reasons and all
    later = tmp_path / "later"
    _write(later / "carol" / "lab0" / "lab0.ipynb", (course.LABS / "lab0" / "lab0.ipynb").read_text())
    pipeline.grade(later, pipeline.Settings(out=out, labs=["lab0"], progress=False))
    check("ann", "carol")


def _fake_grade_lab(sub, out):
    """What a grading run saves for one submission of any lab (full marks on its autograded tests), without
    grading: the intake, ids, entries and outputs around it are the real ones."""
    from fuselab import notebook as ipynb
    from fuselab.grading.records.results import CellResult, SubmissionResult
    instructor = json.loads((course.SOLUTIONS / sub.lab / nbgrader_run.notebook_name(sub.lab)).read_text())
    cells = {ipynb.grade_id(c): CellResult(points=float(ipynb.points(c)), max_points=float(ipynb.points(c)),
                                           status="passed")
             for c in instructor["cells"] if ipynb.grade_id(c) and ipynb.is_graded(c) and not ipynb.is_hand_graded(c)}
    result = SubmissionResult(student=sub.student, lab=sub.lab, cells=cells,
                              total=sum(c.points for c in cells.values()),
                              max_total=sum(c.max_points for c in cells.values()),
                              manual_cells=pipeline.hand_graded(instructor), notebook=str(sub.notebook),
                              notebook_sha=pipeline._sha(Path(sub.notebook)), sandbox=True)
    (out / "work" / sub.student / sub.lab).mkdir(parents=True, exist_ok=True)
    pipeline._write_result(out / "work" / sub.student / sub.lab / "result.json", result)
    return result


def _canvas_zip(path: Path, **uploads) -> Path:
    """A Canvas download at ``path``: each upload (``<name>_<Canvas id>_<upload number>``) the released notebook of
    its lab, named as Canvas names it."""
    with zipfile.ZipFile(path, "w") as zf:
        for upload, lab in uploads.items():
            zf.write(course.LABS / lab / f"{lab}.ipynb", f"{upload}_{lab}.ipynb")
    return path


def _grading_faked(monkeypatch, grade) -> None:
    """The pipeline around ``grade`` (its ``grade_submission``) as it is, without reference runs or a sandbox
    check: the intake, ids, entries and outputs are the real ones."""
    monkeypatch.setattr(pipeline, "reference_run", lambda lab, *a, **k: {"cells": {}, "broken": []})
    monkeypatch.setattr(pipeline, "check_sandbox", lambda settings: None)
    monkeypatch.setattr(pipeline, "grade_submission", grade)

def _moodle_lab(base, lab, people, sheet=True):
    """Moodle's download of ``lab`` (``people``: (name, email, participant number, submitted?)) and its grading
    worksheet."""
    root = base / f"{lab}-download"
    for name, _, number, submitted in people:
        if submitted:
            _write(root / f"{name}_{number}_assignsubmission_file_" / f"{lab}.ipynb",
                   (course.LABS / lab / nbgrader_run.notebook_name(lab)).read_text())
    rows = "".join(f"Participant {number},{name},{email},Submitted for grading,,-\n"
                   for name, email, number, _ in people)
    return root, _write(base / f"{lab}-worksheet.csv", WORKSHEET_HEADER + rows)


def test_a_moodle_term_in_one_course_folder(tmp_path, monkeypatch, capsys):
    """Two Moodle labs, each graded with its grading worksheet, into one course folder: Moodle numbers everyone anew
    in lab 1, yet each student is one row of grades.csv and one student of the gradebook (their id is their email
    address's), who handed in nothing is missing, and the export writes each lab's worksheet with that lab's
    numbers. A lab's download without its worksheet is refused, saying what to give; nothing is written."""
    out = tmp_path / "course"
    _grading_faked(monkeypatch, lambda sub, *a, **k: _fake_grade_lab(sub, out))
    lab0, sheet0 = _moodle_lab(tmp_path, "lab0", [("John Smith", "js@uni.edu", "1234", True),
                                                  ("Ann Lee", "al@uni.edu", "1235", True),
                                                  ("Bo Park", "bp@uni.edu", "1236", False)])
    lab1, sheet1 = _moodle_lab(tmp_path, "lab1", [("John Smith", "js@uni.edu", "2201", True),
                                                  ("Ann Lee", "AL@uni.edu", "2202", False),
                                                  ("Bo Park", "bp@uni.edu", "2203", True)])
    john, ann, bo = (roster.email_id(e) for e in ("js@uni.edu", "al@uni.edu", "bp@uni.edu"))
    assert len({john, ann, bo}) == 3 and all(intake.student_id(s) == s for s in (john, ann, bo))
    pipeline.grade(lab0, pipeline.Settings(out=out, labs=["lab0"], roster=sheet0, progress=False))
    # lab 1's download alone: its numbers are new, so it is refused until its worksheet is given
    before = {p: p.read_bytes() for p in (out / "entries.json", out / "grades.csv", out / "roster.json")}
    assert cli.main(["grade", str(lab1), "--out", str(out), "--labs", "lab1"]) != 0
    err = capsys.readouterr().err
    assert "--roster" in err and "worksheet" in err and "--out" in err and "John_Smith_2201" in err, err
    assert {p: p.read_bytes() for p in before} == before and not list(out.glob("work/*/lab1"))
    second = pipeline.grade(lab1, pipeline.Settings(out=out, labs=["lab1"], roster=sheet1, progress=False))
    rows = _rows(out / "grades.csv")
    assert sorted(rows) == sorted([john, ann, bo])
    assert rows[john]["lab0 status"] == rows[john]["lab1 status"] == "graded"
    assert rows[ann]["lab0 status"] == "graded" and rows[ann]["lab1 status"] == "missing"
    assert rows[bo]["lab0 status"] == "missing" and rows[bo]["lab1 status"] == "graded"
    assert cli.missing_line(second.standings, {"lab1"}) == f"missing (nothing submitted, 0 in grades.csv): {ann}/lab1"
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        assert sorted(s.id for s in gradebook.students) == sorted([john, ann, bo])
        assert gradebook.find_student(bo).email == "bp@uni.edu"
    # the lab again without its worksheet (after hand grading): the numbers kept for lab 0 still say who is who
    pipeline.grade(lab0, pipeline.Settings(out=out, labs=["lab0"], progress=False))
    assert sorted(_rows(out / "grades.csv")) == sorted([john, ann, bo])
    export.write(out)
    for lab, numbers in (("lab0", {"1234": "John Smith", "1235": "Ann Lee", "1236": "Bo Park"}),
                         ("lab1", {"2201": "John Smith", "2202": "Ann Lee", "2203": "Bo Park"})):
        with open(out / "export" / f"moodle-{lab}.csv", encoding="utf-8") as handle:
            sheet = {row["Identifier"]: row for row in csv.DictReader(handle)}
        assert {k: row["Full name"] for k, row in sheet.items()} == {f"Participant {n}": name
                                                                     for n, name in numbers.items()}
        missing = "1236" if lab == "lab0" else "2202"
        assert sheet[f"Participant {missing}"]["Grade"] == "0"


def test_a_course_folder_of_participant_numbers_keeps_its_one_lab(tmp_path, monkeypatch, capsys):
    """A course folder whose Moodle students are under participant numbers (a lab graded without its worksheet,
    as every Moodle lab was before ids by email) grades that lab again as before, worksheet or not; another lab there
    is refused, saying to give it its own folder, nothing written."""
    out = tmp_path / "course"
    _grading_faked(monkeypatch, lambda sub, *a, **k: _fake_grade_lab(sub, out))
    lab0, sheet0 = _moodle_lab(tmp_path, "lab0", [("John Smith", "js@uni.edu", "1234", True)])
    lab1, sheet1 = _moodle_lab(tmp_path, "lab1", [("John Smith", "js@uni.edu", "2201", True)])
    pipeline.grade(lab0, pipeline.Settings(out=out, labs=["lab0"], progress=False))
    pipeline.grade(lab0, pipeline.Settings(out=out, labs=["lab0"], roster=sheet0, progress=False))
    assert sorted(_rows(out / "grades.csv")) == ["John_Smith_1234"]
    before = (out / "entries.json").read_bytes()
    assert cli.main(["grade", str(lab1), "--out", str(out), "--labs", "lab1", "--roster", str(sheet1)]) != 0
    err = capsys.readouterr().err
    assert "participant numbers" in err and "own --out" in err and "new course folder" in err, err
    assert (out / "entries.json").read_bytes() == before and not list(out.glob("work/*/lab1"))


def test_a_moodle_lab_again_keeps_its_numbers_and_a_number_off_the_worksheet_is_refused(tmp_path):
    """A worksheet row without an email address keeps its participant number's id: the lab graded again is the same
    student, not a second one. A number of the download that the worksheet does not name (another lab's worksheet)
    is refused, saying which."""
    lab0, sheet0 = _moodle_lab(tmp_path, "lab0", [("John Smith", "js@uni.edu", "1234", True),
                                                  ("Cy Ray", "", "1237", True)])
    out = tmp_path / "course"
    out.mkdir()
    settings = pipeline.Settings(out=out, labs=["lab0"], roster=sheet0, progress=False)
    pipeline.check_identities(lab0, settings)  # an empty folder
    john = roster.email_id("js@uni.edu")
    term.save_entries(out, {(john, "lab0"): term.Entry(john, "lab0", term.GRADED, lms_id="1234", lms="moodle"),
                            ("Cy_Ray_1237", "lab0"): term.Entry("Cy_Ray_1237", "lab0", term.GRADED, lms_id="1237",
                                                                lms="moodle")})
    pipeline.check_identities(lab0, settings)  # the folder that run leaves, graded again
    other = _write(tmp_path / "other.csv", WORKSHEET_HEADER + "Participant 1234,John Smith,js@uni.edu,,,-\n")
    with pytest.raises(pipeline.GradingRefused, match="1237 of the download are not on the grading worksheet"):
        pipeline.check_identities(lab0, pipeline.Settings(out=out, labs=["lab0"], roster=other, progress=False))


def test_a_slurm_class_takes_its_moodle_ids_and_due_dates_as_one_host_does(tmp_path, monkeypatch):
    """``--slurm`` with a Moodle grading worksheet and a due date: the plan's students get their ids by email, as
    one host's intake gives them, the roster is copied beside the plan for the merge job, and the due date rides
    in the plan. A worksheet that does not name the download's numbers is refused there, before anything is
    submitted (sbatch is never called in this test)."""
    from fuselab.grading.run import slurm
    submitted = []
    monkeypatch.setattr(slurm, "queued", lambda out: {"shards": {}, "merge": {}})
    monkeypatch.setattr(slurm, "submit_shards", lambda out, plan, indices, reason: submitted.append(indices) or
                        {"array": "1", "merge": "2"})
    lab0, sheet0 = _moodle_lab(tmp_path, "lab0", [("John Smith", "js@uni.edu", "1234", True)])
    out = tmp_path / "course"
    other = _write(tmp_path / "other.csv", WORKSHEET_HEADER + "Participant 999,Al Bo,al@uni.edu,,,-\n")
    with pytest.raises(SystemExit, match="1234 of the download are not on the grading worksheet"):
        cli.main(["grade", str(lab0), "--slurm", "--out", str(out), "--labs", "lab0", "--roster", str(other)])
    assert not (out / "slurm").exists() and submitted == []
    assert cli.main(["grade", str(lab0), "--slurm", "--out", str(out), "--labs", "lab0", "--roster", str(sheet0),
                     "--due", "lab0=2026-09-14T23:59"]) == 0
    plan = slurm.read_json(out / "slurm" / "plan.json")
    assert [e["student"] for e in plan["submissions"]] == [roster.email_id("js@uni.edu")] and submitted == [[0]]
    assert slurm.roster_copy(out, plan["options"]["roster_sha"]).read_bytes() == sheet0.read_bytes()
    assert plan["options"]["due"] == {"lab0": "2026-09-14T23:59"} and plan["options"]["roster_sha"]


def _cluster_faked(monkeypatch):
    """``slurm``, with sbatch and squeue replaced and the grading faked (``_fake_grade_lab``, into each run's own
    folder: one host's, or a shard's), so a test runs ``run_shard`` and ``merge_outputs`` itself."""
    from fuselab.grading.run import slurm
    _grading_faked(monkeypatch, lambda sub, device, settings, *a, **k: _fake_grade_lab(sub, settings.out))
    monkeypatch.setattr(slurm, "queued", lambda out: {"shards": {}, "merge": {}})
    monkeypatch.setattr(slurm, "submit_shards", lambda *a, **k: {"array": "1", "merge": "2"})
    return slurm


def test_a_moodle_lab_merged_on_slurm_is_recorded_as_one_host_records_it(tmp_path, monkeypatch):
    """The same Moodle lab and grading worksheet, graded on one host and through --slurm's shard and merge (sbatch
    replaced, the grading faked on both sides): the same students by email, the same entries (who is missing),
    the same roster with the lab's participant numbers, the same grades.csv."""
    slurm = _cluster_faked(monkeypatch)
    lab0, sheet0 = _moodle_lab(tmp_path, "lab0", [("John Smith", "js@uni.edu", "1234", True),
                                                  ("Bo Park", "bp@uni.edu", "1236", False)])
    one, cluster = tmp_path / "one", tmp_path / "cluster"
    pipeline.grade(lab0, pipeline.Settings(out=one, labs=["lab0"], roster=sheet0, progress=False))
    assert cli.main(["grade", str(lab0), "--slurm", "--gpus-per-task", "0", "--out", str(cluster), "--labs", "lab0",
                     "--roster", str(sheet0)]) == 0
    assert slurm.run_shard(cluster, 0) == 0
    assert slurm.merge_outputs(cluster, slurm.read_json(cluster / "slurm" / "plan.json")) == 0

    def recorded(out):
        entries = {k: (e.status, e.lms_id, e.late) for k, e in term.load_entries(out).items()}
        people = sorted((p["student"], p.get("lab_ids")) for p in roster.load(out))
        return entries, people, (out / "grades.csv").read_text()
    assert recorded(cluster) == recorded(one)
    entries, people, _ = recorded(one)
    assert dict(people)[roster.email_id("bp@uni.edu")] == {"lab0": "1236"}  # who handed in nothing: by email too
    assert roster.email_id("bp@uni.edu") in _  # and listed in grades.csv


def test_a_no_sandbox_class_merged_on_slurm_leaves_its_results_unbelieved(tmp_path, monkeypatch):
    """A --no-sandbox class on the cluster: its submissions could write their own result.json (here one that claims
    a sandboxed grading). The merge's copies in <out>/work are marked as one host's --no-sandbox run marks its
    folder, so a later sandboxed run there grades them again rather than believe them."""
    from fuselab.grading.records import unsandboxed
    slurm = _cluster_faked(monkeypatch)  # the fake grading's result says "sandbox": true
    lab0, _ = _moodle_lab(tmp_path, "lab0", [("John Smith", "js@uni.edu", "1234", True)])
    out = tmp_path / "cluster"
    assert cli.main(["grade", str(lab0), "--slurm", "--no-sandbox", "--gpus-per-task", "0", "--out", str(out),
                     "--labs", "lab0"]) == 0
    assert slurm.run_shard(out, 0) == 0
    assert slurm.merge_outputs(out, slurm.read_json(out / "slurm" / "plan.json")) == 0
    [copy] = out.glob("work/*/lab0/result.json")
    assert json.loads(copy.read_text())["sandbox"] is True and not unsandboxed.believed(copy, out)


# ------------------------------------------------------------------------------------------------- the term

CANVAS_ROSTER = ("Student,ID,SIS User ID,SIS Login ID,Section,Lab 0 (777)\n"
                 "    Points Possible,,,,,12\n"
                 "\"Smith, John\",1002,s2,jsmith,A,\n\"Doe, Jane\",1003,s3,jdoe,A,\n"
                 "\"Nguyen, Bao\",1005,s5,bnguyen,A,\n\"Lee, Ann\",1004,s4,alee,A,\n")


def _rows(path):
    return {row["student"]: row for row in csv.DictReader(Path(path).open(encoding="utf-8"))}


def _settings(out, **more):
    return pipeline.Settings(out=out, cell_timeout=60, submission_timeout=400, progress=False,
                             cpu_workers=min(2, schedule.available_cores()), **more)


@pytest.fixture(scope="module")
def term_folder(tmp_path_factory, instructor_references):
    if torch.cuda.is_available():
        pytest.skip("the CPU grading path (the GPU self-check grades on a GPU)")
    base = tmp_path_factory.mktemp("term")
    out = base / "fall"
    week1 = base / "lab0-submissions.zip"
    with zipfile.ZipFile(week1, "w") as zf:
        zf.write(EXAMPLES / "compile_error" / "lab0" / "lab0.ipynb", "smithjohn_1002_9000_lab0.ipynb")  # replaced:
        zf.write(EXAMPLES / "correct" / "lab0" / "lab0.ipynb", "smithjohn_1002_9001_lab0-1.ipynb")  # Canvas's -1
        zf.write(EXAMPLES / "compile_error" / "lab0" / "lab0.ipynb", "doejane_LATE_1003_9002_lab0.ipynb")
        zf.writestr("nguyenbao_1005_5005_lab0.html", "<html><body>my notebook</body></html>")
    roster_csv = _write(base / "canvas-roster.csv", CANVAS_ROSTER)
    instructor_references.into(out, ["lab0", "lab1"])  # the term's subject is its course folder, not the references
    first = pipeline.grade(week1, _settings(out, roster=roster_csv))
    grades_week1 = (out / "grades.csv").read_text()
    # week 2: lab 1 from a folder of nbgrader's layout, handed in after its due date
    week2 = base / "lab1-submissions"
    _write(week2 / "smithjohn_1002" / "lab1" / "lab1.ipynb", (course.LABS / "lab1" / "lab1.ipynb").read_text())
    _write(week2 / "smithjohn_1002" / "lab1" / "timestamp.txt", "2026-09-22 03:00:00 UTC")
    config = _write(base / "grader" / "nbgrader_config.py",
                    nbgrader_run.NBGRADER_CONFIG.read_text() + '\nc.LateSubmissionPlugin.penalty_method = "zero"\n')
    # the TA's choice of nbgrader's penalty from week 2 on, for the rest of the term: late work scores zero
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nbgrader_run, "NBGRADER_CONFIG", config)
        second = pipeline.grade(week2, _settings(out, due={"lab1": "2026-09-21T23:59"}))
        before = {path.relative_to(out): path.read_bytes() for path in
                  [out / "grades.csv", *sorted((out / "feedback").rglob("*.html")),
                   *sorted(out.glob("work/*/*/result.json"))]}
        yield {"out": out, "first": first, "second": second, "week1": week1, "grades_week1": grades_week1,
               "before": before, "base": base}


def test_week_one_accounts_for_everyone_on_the_roster(term_folder):
    rows = _rows(term_folder["out"] / "grades.csv")
    assert sorted(rows) == ["doejane_1003", "leeann_1004", "nguyenbao_1005", "smithjohn_1002"]
    assert rows["smithjohn_1002"]["lab0 status"] == "graded" and rows["smithjohn_1002"]["name"] == "Smith, John"
    assert float(rows["smithjohn_1002"]["lab0 total"]) == 6  # the correct sample: every test but the speed test
    assert rows["doejane_1003"]["lab0 late"] == "late" and rows["smithjohn_1002"]["lab0 late"] == ""
    assert rows["nguyenbao_1005"]["lab0 status"].startswith("not graded: ")
    assert "wrong file type" in rows["nguyenbao_1005"]["lab0 status"]
    assert rows["leeann_1004"]["lab0 status"] == "missing" and rows["leeann_1004"]["lab0 total"] == "0"
    assert rows["leeann_1004"]["lms id"] == "1004"
    report = (term_folder["out"] / "report.md").read_text()
    assert "| late | reason | feedback |" in report
    doe = next(line for line in report.splitlines() if line.startswith("| doejane_1003 |"))
    assert "late" in doe and "test_fused" in doe and "[page](feedback/doejane_1003/lab0.html)" in doe
    assert "wrong file type" in next(line for line in report.splitlines() if line.startswith("| nguyenbao_1005 |"))
    late_page = (term_folder["out"] / "feedback" / "doejane_1003" / "lab0.html").read_text()
    assert "Marked late (handed in after the due date); no late penalty was taken off here" in late_page
    assert "Marked late" not in (term_folder["out"] / "feedback" / "smithjohn_1002" / "lab0.html").read_text()
    # the re-upload is graded (6 above, the correct sample's), and the TA and the student are told which
    taken = ("Canvas's latest upload for lab0 was graded: smithjohn_1002_9001_lab0-1.ipynb; not graded, as "
             "earlier uploads: smithjohn_1002_9000_lab0.ipynb")
    assert f"smithjohn_1002/lab0: note: {taken}" in report
    assert taken in html.unescape((term_folder["out"] / "feedback" / "smithjohn_1002" / "lab0.html").read_text())


def test_a_second_lab_a_week_later_adds_to_the_course(term_folder):
    out = term_folder["out"]
    rows = _rows(out / "grades.csv")
    assert sorted(rows) == ["doejane_1003", "leeann_1004", "nguyenbao_1005", "smithjohn_1002"]
    john = rows["smithjohn_1002"]
    assert john["lab0 status"] == john["lab1 status"] == "graded" and float(john["lab0 total"]) == 6
    assert john["lab1 late"] == "late" and john["lab1 submitted"] == "2026-09-22T03:00:00"
    assert rows["doejane_1003"]["lab0 late"] == "late" and rows["doejane_1003"]["lab1 status"] == "missing"
    assert "wrong file type" in rows["nguyenbao_1005"]["lab0 status"]  # week 1's reasons are kept
    # what week 1 wrote of lab 0 is unchanged, column for column
    week1 = {r["student"]: r for r in csv.DictReader(io.StringIO(term_folder["grades_week1"]))}
    for student, row in week1.items():
        assert {k: v for k, v in rows[student].items() if k.startswith("lab0")} == \
               {k: v for k, v in row.items() if k.startswith("lab0")}
    # nbgrader has the timestamp and due date, and its configured late penalty
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission("lab1", "smithjohn_1002")
        assert submission.total_seconds_late > 0
        penalty = gradebook.find_submission_notebook("lab1", "lab1", "smithjohn_1002").late_submission_penalty
        assert penalty is not None and penalty == submission.score  # "zero": all of it
    assert ",2026-09-21 23:59:00," in (out / "nbgrader-grades.csv").read_text()


def test_a_regrade_of_one_student_keeps_everyone_else(term_folder):
    out = term_folder["out"]
    result = pipeline.grade(term_folder["week1"], _settings(out, students=["doejane_1003"], force=True))
    assert [(r.student, r.lab) for r in result.results] == [("doejane_1003", "lab0")] and result.graded_now == 1
    before = term_folder["before"]
    after = {path: (out / path).read_bytes() for path in before}
    changed = sorted(str(path) for path in before if before[path] != after[path])
    # only the regraded student's result and page (and the grades file, for their row: its time) may change
    assert set(changed) <= {"grades.csv", "work/doejane_1003/lab0/result.json", "feedback/doejane_1003/lab0.html"}
    old = {r["student"]: r for r in csv.DictReader(io.StringIO(before[Path("grades.csv")].decode()))}
    new = _rows(out / "grades.csv")
    assert old == new  # the same verdicts: every row identical
    assert "4 student(s)" in (out / "report.md").read_text()


def test_a_misspelled_student_or_lab_fails_listing_the_names(term_folder, capsys):
    out = term_folder["out"]
    stamp = (out / "grades.csv").read_bytes()
    code = cli.main(["grade", str(term_folder["week1"]), "--out", str(out), "--students", "doejane"])
    err = capsys.readouterr().err
    assert code != 0 and "doejane" in err and "doejane_1003" in err and "smithjohn_1002" in err
    code = cli.main(["grade", str(term_folder["week1"]), "--out", str(out), "--labs", "lab9"])
    err = capsys.readouterr().err
    assert code != 0 and "lab9" in err and "lab0" in err
    assert (out / "grades.csv").read_bytes() == stamp


def _report_rows(report: str) -> dict:
    """``{(lab, student): the row's cells}`` of report.md's per-lab tables."""
    rows, lab = {}, None
    for line in report.splitlines():
        if line.startswith("## "):
            lab = line[3:].strip()
        elif line.startswith("| ") and not line.startswith(("| student", "| ---")):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[(lab, cells[0])] = cells
    return rows


def test_a_hand_grade_in_formgrader_reaches_every_student_output_and_the_lms_export(term_folder, tmp_path):
    """Week 6: a TA hand-grades John's written answers through formgrader's own web API (``fuselab formgrader``),
    one of lab 0 and both of his late lab 1, then runs ``fuselab grade`` of week 1 again (nothing regraded):
    every student's every lab is where it should be in grades.csv, the report, the feedback page and the LMS
    export, the non-submitter, the late one and the .html one included; lab 1's late penalty (the term's "zero")
    takes John's hand points away in every one of them alike."""
    out = term_folder["out"]
    with formgrader_api.serving(out, tmp_path) as server:
        assert {"lab0", "lab1"} <= {a["name"] for a in server.get("assignments")}  # the course's gradebook
        server.grade("lab0", "lab0", "smithjohn_1002", "answer_sweep", 0.5, "A good sweep; say why it flattens.")
        server.grade("lab1", "lab1", "smithjohn_1002", "answer_roofline", 1)
        server.grade("lab1", "lab1", "smithjohn_1002", "answer_in_place", 1)
    rerun = pipeline.grade(term_folder["week1"], _settings(out))
    assert rerun.graded_now == 0  # the hand grade needs no regrading

    # grades.csv: (total, max, status, late) of each student's each lab, and the row's totals
    rows = _rows(out / "grades.csv")
    expected = {"smithjohn_1002": {"lab0": ("6.5", "12", "graded", ""), "lab1": ("0", "17", "graded", "late")},
                "doejane_1003": {"lab0": ("4", "12", "graded", "late"), "lab1": ("0", "17", "missing", "")},
                "leeann_1004": {"lab0": ("0", "12", "missing", ""), "lab1": ("0", "17", "missing", "")},
                "nguyenbao_1005": {"lab0": ("", "12", "not graded", ""), "lab1": ("0", "17", "missing", "")}}
    assert sorted(rows) == sorted(expected)
    for student, labs in expected.items():
        row = rows[student]
        for lab, (total, maximum, status, late) in labs.items():
            assert (row[f"{lab} total"], row[f"{lab} max"], row[f"{lab} status"].split(":")[0], row[f"{lab} late"]) \
                == (total, maximum, status, late), (student, lab, row)
        # a lab not graded leaves the total unknown: blank, as that lab's own
        total = "" if any(status == "not graded" for _, _, status, _ in labs.values()) else \
            f"{sum(float(t or 0) for t, *_ in labs.values()):g}"
        assert (row["total"], row["max"]) == (total, "29"), row
    john = rows["smithjohn_1002"]
    assert john["lab0/answer_sweep"] == "0.5" and john["lab0/answer_naive_timing"] == ""  # the other: not yet
    # lab 1: 2 points by hand, all taken by the late penalty, its own column; lab 0 was not late
    assert (john["lab1/answer_roofline"], john["lab1/answer_in_place"], john["lab1 late penalty"]) == ("1", "1", "2")
    assert [row["lab0 late penalty"] for row in rows.values()] == ["", "", "", ""]
    assert rows["doejane_1003"]["lab1 late penalty"] == ""
    assert [john[f"lab0/{t}"] for t in ("test_dram_bytes", "test_unfused", "test_fused", "test_speedup")] == \
        ["1", "3", "2", "0"]
    assert rows["doejane_1003"]["lab0/answer_sweep"] == "" and rows["doejane_1003"]["lab0/test_fused"] == "0"
    assert "wrong file type" in rows["nguyenbao_1005"]["lab0 status"]

    # the report: each lab's row of each student, its total out of the lab's maximum
    table = _report_rows((out / "report.md").read_text())
    shown_totals = {"smithjohn_1002": {"lab0": "**6.5** / 12", "lab1": "**0** / 17"},
                    "doejane_1003": {"lab0": "**4** / 12", "lab1": "0 / 17"},
                    "leeann_1004": {"lab0": "0 / 12", "lab1": "0 / 17"},
                    "nguyenbao_1005": {"lab0": "- / 12", "lab1": "0 / 17"}}
    for student, labs in shown_totals.items():
        for lab, total in labs.items():
            assert total in table[(lab, student)], (student, lab, table[(lab, student)])
    assert "late" in table[("lab0", "doejane_1003")] and "late (2026-09-22T03:00:00)" in table[("lab1", "smithjohn_1002")]
    assert "[page](feedback/smithjohn_1002/lab0.html)" in table[("lab0", "smithjohn_1002")]
    report = (out / "report.md").read_text()
    lab0, lab1 = report[report.index("## lab0"):report.index("## lab1")], report[report.index("## lab1"):]
    assert "| late penalty | total |" in lab1 and "late penalty" not in lab0  # only where a lab has one
    assert "| -2 | **0** / 17 |" in next(line for line in lab1.splitlines() if line.startswith("| smithjohn_1002 |"))
    assert "4 student(s)" in (out / "report.md").read_text()

    # John's page: the hand points, the comment, the total with them; Jane's: no hand points yet
    page = (out / "feedback" / "smithjohn_1002" / "lab0.html").read_text()
    assert "A good sweep; say why it flattens." in page and "Total: 6.5 of 12 points" in page
    assert "Graded by hand: 0.5 of 2 points (1 answer(s) still to be graded)" in page and "Late penalty" not in page
    page = (out / "feedback" / "smithjohn_1002" / "lab1.html").read_text()
    assert "Graded by hand: 2 of 2 points. Total: 2 of 17 points." in page
    assert "Late penalty: 2 points (handed in after the due date). Total after it: 0 of 17 points." in page
    assert "Total: 4 of 12 points" in (out / "feedback" / "doejane_1003" / "lab0.html").read_text()
    assert not (out / "feedback" / "nguyenbao_1005").exists() and not (out / "feedback" / "leeann_1004").exists()

    # the LMS export: nbgrader's totals (the hand points in), every student's every lab
    to = term_folder["base"] / "upload"
    assert cli.main(["export", str(out), "--to", str(to)]) == 0
    with open(to / "canvas-grades.csv", encoding="utf-8") as handle:
        header, possible, *lines = list(csv.reader(handle))
    assert header == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 0 (777)", "lab1"]
    assert possible[0].strip() == "Points Possible" and possible[5:] == ["12", "17"]  # the hand-graded cells in
    by_id = {line[1]: line for line in lines}
    assert by_id == {"1002": ["Smith, John", "1002", "s2", "jsmith", "A", "6.5", "0"],   # lab 1 late: "zero"
                     "1003": ["Doe, Jane", "1003", "s3", "jdoe", "A", "4", "0"],        # late by Canvas, lab 1 missing
                     "1004": ["Lee, Ann", "1004", "s4", "alee", "A", "0", "0"],         # submitted nothing: 0
                     "1005": ["Nguyen, Bao", "1005", "s5", "bnguyen", "A", "", "0"]}    # the .html: left blank
    for student, labs in expected.items():  # the export and grades.csv agree wherever there is a grade
        mine = by_id[rows[student]["lms id"]]
        assert [mine[5] or "", mine[6]] == [labs["lab0"][0], labs["lab1"][0]], student
    totals = _rows(to / "totals.csv")
    assert sorted(totals) == sorted(expected) and totals["smithjohn_1002"]["lab0 (12)"] == "6.5"
    nbgrader_csv = {(r["assignment"], r["student_id"]): r for r in csv.DictReader((out / "nbgrader-grades.csv").open())}
    john_lab1 = nbgrader_csv[("lab1", "smithjohn_1002")]
    assert (john_lab1["raw_score"], john_lab1["late_submission_penalty"], john_lab1["score"]) == ("2.0", "2.0", "0.0")
    assert not list(to.glob("moodle-*.csv"))  # nobody came from Moodle


def test_a_wrong_due_date_or_roster_stops_the_run_before_grading(tmp_path, capsys):
    _write(tmp_path / "class" / "alice" / "lab0" / "lab0.ipynb")
    with zipfile.ZipFile(tmp_path / "class.zip", "w") as zf:  # the submissions' zip given as the roster
        zf.write(tmp_path / "class" / "alice" / "lab0" / "lab0.ipynb", "alice/lab0/lab0.ipynb")
    out = tmp_path / "course"
    for wrong, said in ((["--due", "lab9=2026-09-14"], "lab9"), (["--due", "lab0=someday"], "not a date"),
                        (["--due", "lab0=2026-09-14"], "lab0=2026-09-14: give a date and time, e.g. "
                                                       "lab0=2026-09-14T23:59"),
                        (["--roster", str(_write(tmp_path / "r.csv", "name,score\n"))], "Student, ID"),
                        (["--roster", str(tmp_path / "class.zip")], "a zip archive")):
        assert cli.main(["grade", str(tmp_path / "class"), "--out", str(out), *wrong]) != 0
        assert said in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:  # refused as every other argument the run refuses
        cli.main(["grade", str(tmp_path / "class"), "--out", str(out), "--due", "lab0"])
    assert stopped.value.code == 3 and "write it as LAB=WHEN" in capsys.readouterr().err
    # a date and its time as two words (unquoted in a shell), after the submissions or before them
    semicolons = _write(tmp_path / "semi.csv", "Student;ID;SIS User ID;Section\nAnn Lee;1;a1;S1\n")
    for argv in (["grade", str(tmp_path / "class"), "--due", "lab0=2026-09-14", "23:59", "--out", str(out)],
                 ["grade", "--due", "lab0=2026-09-14", "23:59", str(tmp_path / "class"), "--out", str(out)],
                 ["grade", "--due=lab0=2026-09-14", "23:59", "--due", "lab1=2026-09-21T23:59", str(tmp_path / "class"),
                  "--out", str(out)]):
        with pytest.raises(SystemExit) as stopped:
            cli.main(argv)
        assert stopped.value.code == 2
        assert "--due lab0=2026-09-14 23:59: a date and its time are one word, joined by a T: " \
               "--due lab0=2026-09-14T23:59" in capsys.readouterr().err
    assert cli.main(["grade", str(tmp_path / "class"), "--out", str(out), "--roster", str(semicolons)]) != 0
    assert "separated by semicolons" in capsys.readouterr().err
    assert cli.main(["grade", str(tmp_path / "no-such-class"), "--out", str(tmp_path / "other")]) == 3
    assert "no such folder or zip: " in capsys.readouterr().err and not (tmp_path / "other").exists()
    assert not (out / "work").exists() and not (out / "grades.csv").exists()


def test_due_takes_an_iso_date_and_time_only():
    """--due is an ISO 8601 date and time (UTC unless it has an offset or Z), kept as nbgrader keeps it (UTC, no
    zone); a date alone, a day number or a date in a local order is refused naming the value and the form."""
    from datetime import datetime
    for when, kept in (("2026-09-14T23:59", datetime(2026, 9, 14, 23, 59)),
                       ("2026-09-14T23:59:30", datetime(2026, 9, 14, 23, 59, 30)),
                       ("2026-09-14T23:59Z", datetime(2026, 9, 14, 23, 59)),
                       ("2026-09-14T23:59-05:00", datetime(2026, 9, 15, 4, 59)),
                       ("2026-09-15T01:00+02:00", datetime(2026, 9, 14, 23, 0))):
        assert pipeline._due_dates({"lab0": when}) == {"lab0": kept}, when
    with pytest.raises(pipeline.GradingRefused) as refused:
        pipeline._due_dates({"lab0": "2026-09-14"})
    assert str(refused.value).startswith("--due lab0=2026-09-14: give a date and time, e.g. lab0=2026-09-14T23:59")
    for when in ("14", "03/09/2026", "14/09/2026", "Sept 14", "2026-09-14 23:59 EST", "2026-09-14 23:59",
                 "2026-02-30T23:59", "2026-09-14T24:00", "2026-W37-1T23:59", ""):
        with pytest.raises(pipeline.GradingRefused) as refused:
            pipeline._due_dates({"lab0": when})
        assert f"--due lab0={when}: " in str(refused.value) and "e.g. lab0=2026-09-14T23:59" in str(refused.value)


def test_a_misspelled_student_is_said_before_a_sandbox_that_does_not_work(tmp_path, capsys, monkeypatch):
    """On a machine whose sandbox cannot start, a TA's misspelled --students id is the first thing said: the
    name error, listing the ids, not the sandbox's; nothing is written."""
    from fuselab.grading.sandbox import isolate
    _write(tmp_path / "class" / "doejane_1003" / "lab0" / "lab0.ipynb")
    _write(tmp_path / "class" / "smithjohn_1002" / "lab0" / "lab0.ipynb")
    checked = []
    monkeypatch.setattr(isolate, "sandbox_problem",
                        lambda *a, **k: checked.append(1) or "bubblewrap cannot start a sandbox here")
    out = tmp_path / "course"
    code = cli.main(["grade", str(tmp_path / "class"), "--out", str(out), "--students", "doejane"])
    err = capsys.readouterr().err
    assert code != 0 and "no such student(s)" in err and "doejane_1003" in err and "smithjohn_1002" in err, err
    assert "sandbox" not in err and checked == [] and not out.exists()
    with pytest.raises(pipeline.UnknownNames, match="lab9"):
        pipeline.grade(tmp_path / "class", pipeline.Settings(out=out, labs=["lab9"], progress=False))
    assert checked == [] and not out.exists()
    # spelled right, the sandbox is checked next, and refuses
    with pytest.raises(pipeline.GradingRefused, match="sandbox does not work"):
        pipeline.grade(tmp_path / "class", pipeline.Settings(out=out, students=["doejane_1003"], progress=False))
    assert checked == [1]


def test_an_older_download_graded_again_never_replaces_a_resubmission(tmp_path, monkeypatch, capsys):
    """Canvas's first download of a lab, graded again after its second (a resubmission in it): the older upload is
    not graded over the newer one. The newer grade, notebook, late mark and entry stay, and a note says what was
    skipped and how to grade it anyway; naming the student in a --force run does. The same holds by nbgrader's
    times handed in, where the uploads have no Canvas numbers."""
    first, second = tmp_path / "canvas-lab0.zip", tmp_path / "canvas-lab0-v2.zip"
    honest, newer = course.LABS / "lab0" / "lab0.ipynb", course.SOLUTIONS / "lab0" / "lab0.ipynb"
    with zipfile.ZipFile(first, "w") as zf:
        zf.write(honest, "parkkim_1005_5005_lab0.ipynb")
        zf.write(honest, "leeann_1004_5001_lab0.ipynb")
    with zipfile.ZipFile(second, "w") as zf:
        zf.write(honest, "parkkim_1005_5005_lab0.ipynb")
        zf.write(newer, "parkkim_LATE_1005_5006_lab0-1.ipynb")
        zf.write(honest, "leeann_1004_5001_lab0.ipynb")
    out = tmp_path / "course"
    graded = []

    def grade(sub, *args, **kwargs):
        graded.append((sub.student, pipeline._sha(Path(sub.notebook))))
        return _fake_grade_lab(sub, out)
    _grading_faked(monkeypatch, grade)
    pipeline.grade(second, pipeline.Settings(out=out, labs=["lab0"], progress=False))
    shas = dict(graded)  # of the notebooks as staged
    newer_sha, honest_sha = shas["parkkim_1005"], shas["leeann_1004"]
    assert len(graded) == 2 and newer_sha != honest_sha
    staged = out / "submissions" / "parkkim_1005" / "lab0" / "lab0.ipynb"

    def unchanged():
        assert pipeline._sha(staged) == newer_sha  # the newer notebook stays where formgrader and resume read it
        entry = term.load_entries(out)[("parkkim_1005", "lab0")]
        assert entry.status == term.GRADED and entry.late and entry.where == "parkkim_LATE_1005_5006_lab0-1.ipynb"
        saved = json.loads((out / "work" / "parkkim_1005" / "lab0" / "result.json").read_text())
        assert saved["notebook_sha"] == newer_sha
        assert _rows(out / "grades.csv")["parkkim_1005"]["lab0 status"] == "graded"

    for force in (False, True):  # the whole class again from the first download, and a --force regrade of it
        graded.clear()
        pipeline.grade(first, pipeline.Settings(out=out, labs=["lab0"], force=force, progress=False))
        assert [who for who, _ in graded] == (["leeann_1004"] if force else [])
        unchanged()
        said = capsys.readouterr().out + (out / "report.md").read_text()
        assert "parkkim_1005/lab0: note: parkkim_1005_5005_lab0.ipynb: older than the upload of lab0 graded " \
               "before (parkkim_LATE_1005_5006_lab0-1.ipynb)" in said.replace("**", "")
        assert "--students parkkim_1005 --labs lab0 --force" in said

    graded.clear()  # the TA names the student: the older upload is graded in the newer one's place
    pipeline.grade(first, pipeline.Settings(out=out, labs=["lab0"], students=["parkkim_1005"], force=True,
                                            progress=False))
    assert graded == [("parkkim_1005", honest_sha)]
    assert term.load_entries(out)[("parkkim_1005", "lab0")].where == "parkkim_1005_5005_lab0.ipynb"

    # nbgrader's collected layout: the times handed in say which upload is older
    later_out = tmp_path / "course-by-time"
    for folder, given, when in (("new", newer, "2026-09-15 10:00:00 UTC"), ("old", honest, "2026-09-14 10:00:00 UTC")):
        _write(tmp_path / folder / "ann" / "lab0" / "lab0.ipynb", given.read_text())
        _write(tmp_path / folder / "ann" / "lab0" / "timestamp.txt", when)
    monkeypatch.setattr(pipeline, "grade_submission", lambda sub, *a, **k: _fake_grade_lab(sub, later_out))
    pipeline.grade(tmp_path / "new", pipeline.Settings(out=later_out, labs=["lab0"], progress=False))
    pipeline.grade(tmp_path / "old", pipeline.Settings(out=later_out, labs=["lab0"], progress=False))
    saved = json.loads((later_out / "work" / "ann" / "lab0" / "result.json").read_text())
    assert saved["notebook_sha"] == newer_sha and "older than the upload of lab0" in (later_out / "report.md").read_text()


def test_a_download_of_another_lab_says_so(tmp_path, monkeypatch, capsys):
    """``--labs lab0`` given lab 1's download: nothing is graded, and the run says which labs the download holds."""
    source = tmp_path / "lab1-download"
    _write(source / "ann" / "lab1" / "lab1.ipynb", (course.LABS / "lab1" / "lab1.ipynb").read_text())
    out = tmp_path / "course"
    _grading_faked(monkeypatch, lambda *a, **k: pytest.fail("nothing of lab0 to grade"))
    pipeline.grade(source, pipeline.Settings(out=out, labs=["lab0"], progress=False))
    said = capsys.readouterr().out + (out / "report.md").read_text()
    assert "no notebook of lab0 in these submissions (it holds notebooks of lab1): nothing of lab0 was graded" in said


def test_the_same_force_command_after_a_stop_finishes_the_regrade(tmp_path, monkeypatch):
    """A ``--force`` regrade of the class stopped half-way: the same command again grades only what the stopped run
    did not (what it graded is kept, as a resume keeps it); once finished, the command regrades everyone again."""
    source = tmp_path / "class"
    for who in ("ann", "bob", "cy", "dee"):
        _write(source / who / "lab0" / "lab0.ipynb", (course.LABS / "lab0" / "lab0.ipynb").read_text())
    out = tmp_path / "course"
    graded, stop_after = [], [None]

    def grade(sub, *args, **kwargs):
        if stop_after[0] is not None and len(graded) >= stop_after[0]:
            raise pipeline.GradingRefused("stopped")  # the run ends here, as Ctrl-C ends it
        graded.append(sub.student)
        return _fake_grade_lab(sub, out)
    _grading_faked(monkeypatch, grade)

    def run(**options):
        graded.clear()
        pipeline.grade(source, pipeline.Settings(out=out, labs=["lab0"], progress=False, cpu_workers=1, **options))
        return sorted(graded)
    assert run() == ["ann", "bob", "cy", "dee"]
    stop_after[0] = 2
    with pytest.raises(pipeline.GradingRefused):
        run(force=True)
    first_two = sorted(graded)
    stop_after[0] = None
    assert run(force=True) == sorted({"ann", "bob", "cy", "dee"} - set(first_two))
    assert not (out / pipeline.FORCED_RUN).exists()
    assert run(force=True) == ["ann", "bob", "cy", "dee"]  # finished: the command regrades anew
    assert run() == []
    stop_after[0] = 1  # another --force command (of the one student graded since) is not the stopped one's rest
    with pytest.raises(pipeline.GradingRefused):
        run(force=True)
    [regraded] = graded
    stop_after[0] = None
    assert run(force=True, students=[regraded]) == [regraded]
    stop_after[0] = 2  # nor is the same command with other grading options (a longer test time, say)
    with pytest.raises(pipeline.GradingRefused):
        run(force=True)
    stop_after[0] = None
    assert run(force=True, cell_timeout=600.0) == ["ann", "bob", "cy", "dee"]


def test_the_consoles_table_says_a_late_penalty_beside_the_tests():
    """The console's table is the tests' points; nbgrader's late penalty (set on the results by the outputs'
    ``handgrading.apply``) comes off the lab's total in grades.csv, so the table says it on the lab's line."""
    from fuselab.grading.records.results import CellResult, SubmissionResult
    late = SubmissionResult("alice", "lab0", cells={"test_fused": CellResult(points=6.0, max_points=10.0)},
                            total=6.0, max_total=10.0, late_penalty=6.0)
    on_time = SubmissionResult("bob", "lab0", cells={"test_fused": CellResult(points=6.0, max_points=10.0)},
                               total=6.0, max_total=10.0)
    table = cli.grade_table([late, on_time]).splitlines()
    assert table[0].endswith("fused=6/10  late penalty -6 (grades.csv)") and "late" not in table[1]


def test_a_student_renamed_in_canvas_between_two_labs_stays_one_student(tmp_path, monkeypatch):
    """Canvas names a download's files after the student's name that week and their Canvas id: a student renamed
    between lab 0 and lab 1 (Lee Ann, then Park Ann, id 1004) is one student of the course, one row of grades.csv
    and one row of Canvas's import, and lab 0's download graded again keeps its grade where it was."""
    lab0 = _canvas_zip(tmp_path / "canvas-lab0.zip", leeann_1004_5004="lab0", smithjohn_1002_5002="lab0")
    lab1 = _canvas_zip(tmp_path / "canvas-lab1.zip", parkann_1004_6004="lab1", smithjohn_1002_6002="lab1")
    out = tmp_path / "course"
    graded = []

    def grade(sub, *args, **kwargs):
        graded.append((sub.student, sub.lab))
        return _fake_grade_lab(sub, out)
    _grading_faked(monkeypatch, grade)
    pipeline.grade(lab0, pipeline.Settings(out=out, labs=["lab0"], progress=False))
    pipeline.grade(lab1, pipeline.Settings(out=out, labs=["lab1"], progress=False))
    assert sorted(graded) == [("leeann_1004", "lab0"), ("leeann_1004", "lab1"), ("smithjohn_1002", "lab0"),
                              ("smithjohn_1002", "lab1")]
    entries = term.load_entries(out)
    assert {student for student, _ in entries} == {"leeann_1004", "smithjohn_1002"}
    assert entries[("leeann_1004", "lab1")].where == "parkann_1004_6004_lab1.ipynb"
    rows = _rows(out / "grades.csv")
    assert set(rows) == {"leeann_1004", "smithjohn_1002"}
    assert rows["leeann_1004"]["lab0 status"] == rows["leeann_1004"]["lab1 status"] == "graded"

    # a --students run names the student by the id they have in the course
    graded.clear()
    pipeline.grade(lab1, pipeline.Settings(out=out, labs=["lab1"], students=["leeann_1004"], force=True,
                                           progress=False))
    assert graded == [("leeann_1004", "lab1")]

    done = export.write(out)
    canvas = list(csv.reader((out / "export" / "canvas-grades.csv").open(encoding="utf-8")))
    assert [row[1] for row in canvas[2:]].count("1004") == 1, canvas
    assert done is not None


def test_the_canvas_import_is_refused_where_two_students_share_one_canvas_id(tmp_path, monkeypatch):
    """A course folder whose records give one Canvas id two students (graded before ids were kept by Canvas id):
    their two rows would be one Canvas student's, the later replacing the earlier's grades. No canvas-grades.csv;
    the error names both ids."""
    out = tmp_path / "course"
    _grading_faked(monkeypatch, lambda sub, *a, **k: _fake_grade_lab(sub, out))
    for lab, name in (("lab0", "leeann_1004_5004_lab0.ipynb"), ("lab1", "parkann_1004_6004_lab1.ipynb")):
        with zipfile.ZipFile(tmp_path / f"{lab}.zip", "w") as zf:
            zf.write(course.LABS / lab / f"{lab}.ipynb", name)
        monkeypatch.setattr(term, "canvas_ids", lambda out: {})  # as a fuselab without ids by Canvas id did
        pipeline.grade(tmp_path / f"{lab}.zip", pipeline.Settings(out=out, labs=[lab], progress=False))
    assert {s for s, _ in term.load_entries(out)} == {"leeann_1004", "parkann_1004"}
    with pytest.raises(export.ExportError, match="Canvas ID 1004 is leeann_1004 and parkann_1004"):
        export.write(out)
    assert not (out / "export" / "canvas-grades.csv").exists()


def test_a_moodle_extension_is_the_students_own_due_date(tmp_path, monkeypatch):
    """A grading worksheet's "Extension granted until ..." is that student's own due date: handed in after the
    lab's due date but before their own, they are not late, and nbgrader's late penalty takes nothing off."""
    import datetime
    import sys
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # its alembic
    subs, problems, out = _moodle_download(tmp_path, "Ann Lee_1235_assignsubmission_file_/lab0.ipynb")
    sheet = _write(tmp_path / "worksheet.csv", WORKSHEET_HEADER + JOHN_TWO_HOURS_LATE +
                   "Participant 1235,Ann Lee,al@uni.edu,\"Submitted for grading - Extension granted until Friday, "
                   "18 September 2026, 11:59 PM\",,\"Wednesday, 16 September 2026, 10:00 AM\"\n")
    due = {"lab0": datetime.datetime(2026, 9, 14, 23, 59)}
    db = out / "course" / "gradebook.db"
    db.parent.mkdir()
    nbgrader_run.set_due_dates(db, due)
    graded = {("John_Smith_1234", "lab0"), ("Ann_Lee_1235", "lab0")}
    entries = term.record_course(out, subs, graded, problems, {"lab0"}, roster.read(sheet))
    kept = nbgrader_run.due_dates(db)
    assert kept == {"lab0": due["lab0"], "lab0:Ann_Lee_1235": datetime.datetime(2026, 9, 18, 23, 59)}
    from fuselab.grading.records.results import SubmissionResult
    results = [SubmissionResult(s, "lab0", total=3.0, max_total=10.0) for s, _ in sorted(graded)]
    rows = {s.student: s for s in term.standings(results, entries, roster.load(out), kept)}
    assert rows["John_Smith_1234"].late and not rows["Ann_Lee_1235"].late
    # nbgrader's penalty (every point off where late, the plugin told so) reads the student's own due date
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{db}") as gradebook:
        gradebook.add_notebook("lab0", "lab0")
        gradebook.add_grade_cell("test_fused", "lab0", "lab0", max_score=10, cell_type="code")

    class Zero:
        class plugin_inst:
            @staticmethod
            def late_submission_penalty(student, score, seconds):
                return score
    monkeypatch.setattr(nbgrader_run, "notebook_name", lambda lab: "lab0.ipynb")
    nbgrader_run.record(out / "course", [
        nbgrader_run.Recorded(s.student, "lab0", {"test_fused": 3.0}, None, s.submitted)
        for s in rows.values() if s.status == term.GRADED], late_penalties=Zero)
    with Gradebook(f"sqlite:///{db}") as gradebook:
        penalty = {s: gradebook.find_submission_notebook("lab0", "lab0", s).late_submission_penalty
                   for s in ("John_Smith_1234", "Ann_Lee_1235")}
    assert penalty == {"John_Smith_1234": 3.0, "Ann_Lee_1235": None}


def test_one_students_own_due_date_is_given_with_due_lab_colon_student(tmp_path, monkeypatch, capsys):
    """``--due lab0:ann=WHEN`` gives one student their own due date, kept in the course folder for later runs;
    a lab-wide --due in a --students run, which would move everyone's late marks, is refused saying how to give
    the student theirs; a --due given twice with two dates, or a student's own for a lab with none, is refused."""
    import datetime
    root = tmp_path / "in"
    for student, when in (("ann", "2026-09-16 10:00:00 UTC"), ("bob", "2026-09-16 10:00:00 UTC")):
        _write(root / student / "lab0" / "lab0.ipynb", (course.LABS / "lab0" / "lab0.ipynb").read_text())
        _write(root / student / "lab0" / "timestamp.txt", when)
    out = tmp_path / "course"
    _grading_faked(monkeypatch, lambda sub, *a, **k: _fake_grade_lab(sub, out))
    pipeline.grade(root, pipeline.Settings(out=out, labs=["lab0"], progress=False,
                                           due={"lab0": "2026-09-14T23:59", "lab0:ann": "2026-09-18T23:59"}))
    rows = _rows(out / "grades.csv")
    assert rows["bob"]["lab0 late"] == "late" and rows["ann"]["lab0 late"] == ""
    # a later run without --due keeps both
    pipeline.grade(root, pipeline.Settings(out=out, labs=["lab0"], force=True, progress=False))
    rows = _rows(out / "grades.csv")
    assert rows["bob"]["lab0 late"] == "late" and rows["ann"]["lab0 late"] == ""
    assert nbgrader_run.due_dates(out / "course" / "gradebook.db")["lab0:ann"] == datetime.datetime(2026, 9, 18, 23, 59)
    # bob's extension the wrong way: the lab's due date in a run over bob alone
    with pytest.raises(pipeline.GradingRefused, match="--due lab0:bob=2026-09-17T23:59"):
        pipeline.grade(root, pipeline.Settings(out=out, labs=["lab0"], students=["bob"], force=True,
                                               progress=False, due={"lab0": "2026-09-17T23:59"}))
    assert _rows(out / "grades.csv")["bob"]["lab0 late"] == "late"
    pipeline.grade(root, pipeline.Settings(out=out, labs=["lab0"], students=["bob"], force=True, progress=False,
                                           due={"lab0:bob": "2026-09-17T23:59"}))
    rows = _rows(out / "grades.csv")
    assert rows["bob"]["lab0 late"] == rows["ann"]["lab0 late"] == ""
    # a student's own due date for a lab with none, and one --due given twice
    with pytest.raises(pipeline.GradingRefused, match="lab1 has no due date"):
        pipeline.check_due(out, {"lab1:ann": "2026-09-18T23:59"}, None)
    with pytest.raises(SystemExit) as stopped:
        cli._due_arguments(["lab0=2026-09-14T23:59", "lab0=2026-09-15T23:59"])
    assert stopped.value.code == 3 and "--due lab0 is given twice" in capsys.readouterr().err


def _canvas_lab0_with_a_stray(tmp_path):
    """Lab 0's Canvas download: John's lab 0, Kim's lab 1 uploaded to lab 0's assignment, and Ann's lab 0 with a
    lab 1 notebook beside it."""
    return _canvas_zip(tmp_path / "canvas-lab0.zip", smithjohn_1002_5002="lab0", leekim_1005_5005="lab1",
                       doeann_1004_5004="lab0", doeann_1004_5014="lab1")


def test_a_notebook_of_another_lab_in_an_lms_download_is_said_never_dropped(tmp_path, monkeypatch):
    """An LMS's download is one assignment's: a lab 1 notebook in lab 0's is a stray. With --labs lab0, the
    student who uploaded only that is "not graded" in lab 0 with the reason (not "missing", nothing submitted),
    and one who uploaded both has a note on the lab 0 graded. Without --labs the run is refused before anything
    is graded or written (each stray would open lab 1 for the whole class, everyone else "missing" there)."""
    bulk = _canvas_lab0_with_a_stray(tmp_path)
    subs, problems = intake.collect(bulk, tmp_path / "staging", LABS, only_labs=["lab0"])
    by = {s.student: s for s in subs}
    assert sorted(by) == ["doeann_1004", "smithjohn_1002"]
    assert any("also uploaded a lab1 notebook (doeann_1004_5014_lab1.ipynb)" in w for w in by["doeann_1004"].warnings)
    [stray] = problems
    assert (stray.student, stray.lab, stray.lms_id) == ("leekim_1005", "lab0", "1005")
    assert "a lab1 notebook, in a download graded for lab0: not graded" in stray.message and not stray.note
    # Kim's lab 0 graded by an earlier run (another download): the stray is a note, that grade's entry stays
    _, problems = intake.collect(bulk, tmp_path / "staging2", LABS, only_labs=["lab0"],
                                 graded={("leekim_1005", "lab0"): ("leekim_1005_4005_lab0.ipynb", None)})
    [stray] = problems
    assert stray.note and stray.graded_before and "also uploaded a lab1 notebook" in stray.message

    out = tmp_path / "course"
    _grading_faked(monkeypatch, lambda sub, *a, **k: _fake_grade_lab(sub, out))
    with pytest.raises(pipeline.GradingRefused, match=r"holds notebooks of 2 labs .*give --labs"):
        pipeline.grade(bulk, pipeline.Settings(out=out, progress=False))
    assert not (out / "grades.csv").exists() and not term.load_entries(out)
    roster_file = tmp_path / "roster.csv"
    roster_file.write_text("Student,ID,SIS User ID,SIS Login ID,Section,Lab 0 (777),Lab 1 (778)\n"
                           "    Points Possible,,,,,12,17\n\"Smith, John\",1002,S2,js,A,,\n\"Lee, Kim\",1005,S5,kl,A,,\n"
                           "\"Doe, Ann\",1004,S4,ad,A,,\n")
    pipeline.grade(bulk, pipeline.Settings(out=out, labs=["lab0"], roster=roster_file, progress=False))
    rows = _rows(out / "grades.csv")
    assert rows["leekim_1005"]["lab0 status"].startswith("not graded")
    assert "lab1 status" not in rows["leekim_1005"] or rows["leekim_1005"]["lab1 status"] == ""


def test_an_upload_not_graded_keeps_its_canvas_id_and_its_student(tmp_path, monkeypatch):
    """Canvas's file name carries the student's Canvas id: an upload that cannot be graded (not JSON) keeps it, so
    the roster finds its student by id even where the names differ (renamed, or a name Canvas spells otherwise),
    and grades.csv has one row for them, "not graded", not a second one "missing"."""
    bulk = tmp_path / "canvas-lab0.zip"
    with zipfile.ZipFile(bulk, "w") as zf:
        zf.write(course.LABS / "lab0" / "lab0.ipynb", "smithjohn_1002_5002_lab0.ipynb")
        zf.writestr("doeanne_1004_5004_lab0.ipynb", (course.LABS / "lab0" / "lab0.ipynb").read_text()[:5000])
    roster_file = tmp_path / "roster.csv"
    roster_file.write_text("Student,ID,SIS User ID,SIS Login ID,Section,Lab 0 (777)\n    Points Possible,,,,,12\n"
                           "\"Smith, John\",1002,S2,js,A,\n\"Doe, Ann\",1004,S4,ad,A,\n")
    out = tmp_path / "course"
    _grading_faked(monkeypatch, lambda sub, *a, **k: _fake_grade_lab(sub, out))
    pipeline.grade(bulk, pipeline.Settings(out=out, labs=["lab0"], roster=roster_file, progress=False))
    rows = _rows(out / "grades.csv")
    assert sorted(rows) == ["doeanne_1004", "smithjohn_1002"]
    assert rows["doeanne_1004"]["lab0 status"].startswith("not graded")


def test_a_roster_of_another_course_is_refused_before_grading(tmp_path, monkeypatch):
    """A --roster that names none of the submissions' students (by Canvas id or id), nor any of the course
    folder's, is another course's: refused before anything is graded, saying so; the course folder unchanged."""
    bulk = _canvas_lab0_with_a_stray(tmp_path)
    wrong = tmp_path / "other-course.csv"
    wrong.write_text("Student,ID,SIS User ID,SIS Login ID,Section,Lab 0 (9001)\n    Points Possible,,,,,12\n"
                     "\"Other, One\",8001,S1,o1,B,\n\"Other, Two\",8002,S2,o2,B,\n")
    out = tmp_path / "course"
    _grading_faked(monkeypatch, lambda *a, **k: pytest.fail("nothing is graded"))
    with pytest.raises(pipeline.GradingRefused, match=r"names none of the 3 students .*another course"):
        pipeline.grade(bulk, pipeline.Settings(out=out, labs=["lab0"], roster=wrong, progress=False))
    assert not (out / "grades.csv").exists() and not roster.load(out)
    # one student of the course on it (a late enrolment's fresh download) is this course's
    assert term.unrelated_roster([{"student": "x", "lms_id": "1004"}], {"doeann_1004"}, {"1004"}, out) is None
    # a folder of names (no LMS ids) matches no roster by design, and is graded as before, the roster's people
    # missing
    assert term.unrelated_roster([{"student": "absentann_4242", "lms_id": "4242"}], {"edge_bug"}, set(), out) is None


def test_a_student_who_left_the_roster_is_not_missing_in_later_labs(tmp_path, monkeypatch):
    """Bo is on lab 0's roster and graded in lab 0, then dropped the course: lab 1's fresh roster does not list
    him. His lab 0 grade stays; lab 1 does not count him "missing" (0 in grades.csv and in Canvas's import); the
    report says he left the roster. Back on a later roster, he is counted again."""
    lab0 = _canvas_zip(tmp_path / "canvas-lab0.zip", amesann_1001_5001="lab0", bellbo_1002_5002="lab0")
    lab1 = _canvas_zip(tmp_path / "canvas-lab1.zip", amesann_1001_6001="lab1")
    header = "Student,ID,SIS User ID,SIS Login ID,Section,Lab 0 (777),Lab 1 (778)\n    Points Possible,,,,,12,17\n"
    both, ann_only = tmp_path / "roster-week1.csv", tmp_path / "roster-week2.csv"
    both.write_text(header + "\"Ames, Ann\",1001,S1,aa,A,,\n\"Bell, Bo\",1002,S2,bb,A,,\n")
    ann_only.write_text(header + "\"Ames, Ann\",1001,S1,aa,A,,\n")
    out = tmp_path / "course"
    _grading_faked(monkeypatch, lambda sub, *a, **k: _fake_grade_lab(sub, out))
    pipeline.grade(lab0, pipeline.Settings(out=out, labs=["lab0"], roster=both, progress=False))
    pipeline.grade(lab1, pipeline.Settings(out=out, labs=["lab1"], roster=ann_only, progress=False))
    rows = _rows(out / "grades.csv")
    assert rows["bellbo_1002"]["lab0 status"] == "graded" and rows["bellbo_1002"]["lab1 status"] == ""
    assert rows["amesann_1001"]["lab1 status"] == "graded"
    report = (out / "report.md").read_text()
    assert "left the roster" in report and "bellbo_1002" in report.split("left the roster")[1][:300]
    export.write(out)
    canvas = list(csv.reader((out / "export" / "canvas-grades.csv").open(encoding="utf-8")))
    column = canvas[0].index("Lab 1 (778)")
    assert all(row[column] in ("", None) for row in canvas[2:] if row[1] == "1002"), canvas
    # enrolled again: on the next roster, and missing where he has nothing
    pipeline.grade(lab1, pipeline.Settings(out=out, labs=["lab1"], roster=both, progress=False))
    assert _rows(out / "grades.csv")["bellbo_1002"]["lab1 status"].startswith("missing")


def test_a_lab_missed_before_leaving_the_roster_still_counts_missing():
    """Cy missed lab 0 while on the roster, then left it before lab 1: lab 0 still counts him missing (0, as it
    did); lab 1, graded after he left, does not. Only Canvas people leave (by their Canvas id): a Moodle grade
    export's people, whose ids are names, never do."""
    from fuselab.grading.records.results import SubmissionResult
    results = [SubmissionResult("ann", lab, total=1.0, max_total=1.0) for lab in ("lab0", "lab1")]
    cy = {"student": "cy", "lms_id": "1003", "lms": "canvas", "left": True, "enrolled_labs": ["lab0"]}
    standings = {(s.student, s.lab): s.status for s in term.standings(results, {}, [cy])}
    assert standings[("cy", "lab0")] == term.MISSING and ("cy", "lab1") not in standings
    before = [dict(cy, left=False, enrolled_labs=None), {"student": "Jane_Doe", "lms_id": None, "lms": "moodle"}]
    assert term._left_out(before, []) == [before[0]]
    assert term._left_out(before, [{"student": "renamed_1003", "lms_id": "1003", "lms": "canvas"}]) == []
