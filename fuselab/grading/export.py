"""``fuselab export``: the course's grades as the LMS's own import files.

The points are nbgrader's, from the course gradebook (``<course>/course/gradebook.db``): each graded lab's
autograded points and what a TA gave by hand in formgrader (a manual score replaces the automatic one, as in
nbgrader), less nbgrader's late penalty; the maximum is nbgrader's for the lab (hand-graded cells included).
Only labs the course has graded are written. Who gets a row is the course's standings (``term.standings``): a
graded student their points, a roster student who submitted nothing 0, a submission that could not be graded
nothing (the LMS keeps what it has; the report says why).

Written into ``--to`` (default: ``<course>/export``):

- ``canvas-grades.csv``: Canvas's gradebook import (Grades > Import): ``Student, ID, SIS User ID, SIS Login ID,
  Section``, a "Points Possible" row, a column per lab (named as in the roster's Canvas export where it has one,
  so Canvas fills that assignment; else the lab's name, which Canvas offers to create);
- ``moodle-<lab>.csv``: Moodle's grading worksheet for that lab's assignment (Assignment > Upload grading
  worksheet): ``Identifier`` ("Participant N", the number in Moodle's download), ``Full name``, ``Email address``,
  ``Grade``, ``Maximum Grade``;
- ``totals.csv``: every student and lab, whatever the LMS (folders of plain names have no LMS id).

A row the LMS cannot match (no LMS id from intake or the roster) is left out of that LMS's file and listed.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import nbgrader_run, roster, term
from .intake import printable


@dataclass
class Export:
    files: list = field(default_factory=list)
    labs: list = field(default_factory=list)
    unmatched: list = field(default_factory=list)    # (student, lms): no id that LMS can match
    not_graded: list = field(default_factory=list)   # (student, lab, why): left blank


def nbgrader_scores(db: Path) -> tuple:
    """``({(student, lab): score}, {lab: max})`` as nbgrader's own export computes them (score less the late
    penalty, never below 0)."""
    from nbgrader.api import Gradebook
    scores, maxima = {}, {}
    with Gradebook(f"sqlite:///{db}") as gradebook:
        for assignment in gradebook.assignments:
            maxima[assignment.name] = assignment.max_score
            for submission in assignment.submissions:
                penalty = submission.late_submission_penalty or 0.0
                scores[(submission.student_id, assignment.name)] = max(0.0, submission.score - penalty)
    return scores, maxima


def _canvas_column(lab: str, columns: dict) -> str:
    """The roster's Canvas column for ``lab`` ("Lab 0 (12345)" for lab0), else the lab's name."""
    for header in columns:
        squeezed = re.sub(r"[^a-z0-9]", "", re.sub(r"\(\d+\)\s*$", "", header).lower())
        if squeezed == lab.lower() or re.fullmatch(re.escape(lab.lower()) + r"[a-z]*", squeezed):
            return header
    return lab


def _number(value: float) -> str:
    return f"{value:g}"


def write(course_folder: Path, to: Path | None = None) -> Export:
    course_folder = Path(course_folder)
    db = course_folder / "course" / "gradebook.db"
    if not db.exists():
        raise FileNotFoundError(f"{course_folder} is not a graded course folder (no course/gradebook.db): give the "
                                "--out of your fuselab grade runs")
    to = Path(to) if to else course_folder / "export"
    to.mkdir(parents=True, exist_ok=True)
    entries = term.load_entries(course_folder)
    results = term.course_results(course_folder, [], entries)
    standings = term.standings(results, entries, roster.load(course_folder),
                               nbgrader_run.due_dates(db))
    scores, maxima = nbgrader_scores(db)
    labs = sorted({s.lab for s in standings if s.status == term.GRADED})
    done = Export(labs=labs)
    cells: dict = {}  # (student, lab) → the text of the grade ("" where not graded)
    for s in standings:
        if s.lab not in labs:
            continue
        if s.status == term.GRADED:
            cells[(s.student, s.lab)] = _number(scores.get((s.student, s.lab), 0.0))
        elif s.status == term.MISSING:
            cells[(s.student, s.lab)] = "0"
        else:
            cells[(s.student, s.lab)] = ""
            done.not_graded.append((s.student, s.lab, s.why))
    people: dict = {}
    for s in standings:
        person = people.setdefault(s.student, {"name": s.person.get("name") or s.student, "ids": {},
                                               "person": s.person})
        if s.lms_id:
            person["ids"].setdefault(s.lms or s.person.get("lms") or "", {})[s.lab] = s.lms_id

    def table(path: Path, header: list, rows: list) -> None:
        with open(path, "w", newline="", encoding="utf-8", errors="backslashreplace") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(rows)
        done.files.append(path)

    table(to / "totals.csv", ["student", "name"] + [f"{lab} ({_number(maxima.get(lab, 0))})" for lab in labs],
          [[student, printable(p["name"])] + [cells.get((student, lab), "") for lab in labs]
           for student, p in sorted(people.items())])

    canvas = {student: p for student, p in people.items() if "canvas" in p["ids"]}
    if canvas:
        columns = next((p["person"].get("columns") for p in canvas.values() if p["person"].get("columns")), {})
        header = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"] + \
                 [_canvas_column(lab, columns or {}) for lab in labs]
        rows = [["    Points Possible", "", "", "", ""] + [_number(maxima.get(lab, 0)) for lab in labs]]
        for student, p in sorted(canvas.items()):
            person = p["person"]
            ids = p["ids"]["canvas"]
            rows.append([printable(p["name"]), next(iter(ids.values())), person.get("sis_id", ""),
                         person.get("sis_login", ""), person.get("section", "")] +
                        [cells.get((student, lab), "") for lab in labs])
        table(to / "canvas-grades.csv", header, rows)
    for lab in labs:
        rows = []
        for student, p in sorted(people.items()):
            number = p["ids"].get("moodle", {}).get(lab)
            if number is None or (student, lab) not in cells:
                continue
            rows.append([f"Participant {number}", printable(p["name"]), p["person"].get("email", ""),
                         cells[(student, lab)], _number(maxima.get(lab, 0))])
        if rows:
            table(to / f"moodle-{lab}.csv", ["Identifier", "Full name", "Email address", "Grade", "Maximum Grade"],
                  rows)
    done.unmatched = sorted(student for student, p in people.items() if not p["ids"])
    return done


def main(args) -> int:
    try:
        done = write(Path(args.course), args.to)
    except FileNotFoundError as exc:
        print(f"fuselab export: {exc}")
        return 2
    for path in done.files:
        print(f"wrote {path}")
    print(f"labs: {', '.join(done.labs) or '(none graded yet)'}")
    for student, lab, why in done.not_graded:
        print(f"left blank (not graded): {student}/{lab}: {printable(why)[:200]}")
    if done.unmatched:
        print(f"no LMS id (only in totals.csv): {', '.join(done.unmatched)}")
    return 0
