"""``fuselab export``: the course's grades as the LMS's own import files.

The points are nbgrader's, from the course gradebook (``<course>/course/gradebook.db``): each graded lab's
autograded points and what a TA gave by hand in formgrader (a manual score replaces the automatic one, as in
nbgrader), less nbgrader's late penalty; the maximum is nbgrader's for the lab (hand-graded cells included), the
one grades.csv and the report show. Only labs the course has graded are written. Who gets a row is the course's
standings (``term.standings``): a graded student their points, a roster student who submitted nothing 0, a
submission that could not be graded nothing (the LMS keeps what it has; the report says why).

Written into ``--to`` (default: ``<course>/export``):

- ``canvas-grades.csv``: Canvas's gradebook import (Grades > Import): ``Student, ID, SIS User ID, SIS Login ID,
  Section``, a "Points Possible" row, a column per lab (named as in the roster's Canvas export where it has one,
  so Canvas fills that assignment; else the lab's name, which Canvas offers to create);
- ``moodle-<lab>.csv``: Moodle's grading worksheet for that lab's assignment (Assignment > Upload grading
  worksheet): ``Identifier`` ("Participant N", the number in Moodle's download), ``Full name``, ``Email address``,
  ``Grade``, ``Maximum Grade``;
- ``totals.csv``: every student and lab, whatever the LMS (folders of plain names have no LMS id).

What the LMS holds is never changed behind the TA's back: where the roster's Canvas export gives an
assignment's points and they differ from the lab's maximum, the export stops (``ExportError``) unless
``--scale`` asks for the points scaled to Canvas's. Every file that cannot be written is said, with what to do:
asked for with ``--lms``, it is an error (exit status 2); else a line of the output. A row the LMS cannot
match (no LMS id from intake or the roster) is left out of that LMS's file and listed. A written answer nobody
has graded yet counts 0 in nbgrader's total: the output says, per lab, whose (the report's "to grade by hand").
"""

from __future__ import annotations

import csv
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..records import handgrading, nbgrader_run, roster, term
from ..records.intake import printable
from .report import to_grade_by_hand
from .terminal import shown, spreadsheet_cell


@dataclass
class Export:
    files: list = field(default_factory=list)
    labs: list = field(default_factory=list)
    unmatched: list = field(default_factory=list)    # (student, lms): no id that LMS can match
    not_graded: list = field(default_factory=list)   # (student, lab, why): left blank
    notes: list = field(default_factory=list)        # what the TA must know about a file written
    problems: list = field(default_factory=list)     # a file not written, and what to do
    by_hand: list = field(default_factory=list)      # per lab, the submissions whose written answers wait


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
    """The roster's Canvas column for ``lab`` ("Lab 0 (12345)" for lab0; "Lab 0 Fusion (12345)" where only one
    column starts so), else the lab's name. Two columns that both could be it ("Lab 0 Fusion", "Lab 0 Quiz") are
    an ``ExportError``: an import into the wrong one would overwrite another assignment's grades."""
    exact, starting = [], []
    for header in columns:
        squeezed = re.sub(r"[^a-z0-9]", "", re.sub(r"\(\d+\)\s*$", "", header).lower())
        if squeezed == lab.lower():
            exact.append(header)
        elif re.fullmatch(re.escape(lab.lower()) + r"[a-z]+", squeezed):
            starting.append(header)
    found = exact or starting
    if len(found) > 1:
        raise ExportError(f"the roster's Canvas gradebook has {len(found)} columns that could be {lab}: "
                          f"{', '.join(found)}. Name the lab's assignment in Canvas so that only one column "
                          f"reads as {lab} (e.g. \"{lab.capitalize()}\"), download the roster again and give it "
                          "to the next `fuselab grade` as --roster")
    return found[0] if found else lab


def _number(value: float) -> str:
    return f"{value:g}"


LMSS = ("canvas", "moodle")


class ExportError(ValueError):
    """The export cannot do what was asked; the message says what to do."""


def write(course_folder: Path, to: Path | None = None, lms: list | None = None, scale: bool = False) -> Export:
    """Write the export files. ``lms``: the LMSs asked for (None: every one the course has ids for); ``scale``:
    a lab's points scaled to the LMS's maximum where they differ (else that is an ``ExportError``)."""
    course_folder = Path(course_folder)
    db = course_folder / "course" / "gradebook.db"
    if not db.exists():
        raise FileNotFoundError(f"{course_folder} is not a graded course folder (no course/gradebook.db): give the "
                                "--out of your fuselab grade runs")
    entries = term.load_entries(course_folder)
    # the hand grading only says which written answers wait (the points written are nbgrader's, below)
    results = handgrading.apply(term.course_results(course_folder, [], entries), db)
    standings = term.standings(results, entries, roster.load(course_folder),
                               nbgrader_run.due_dates(db))
    scores, maxima = nbgrader_scores(db)
    labs = sorted({s.lab for s in standings if s.status == term.GRADED})
    if not labs:
        raise ExportError(f"nothing graded yet in {course_folder}: run fuselab grade with --out {course_folder} "
                          "first")
    done = Export(labs=labs)
    # the report's own lines: a written answer not graded yet counts 0 in nbgrader's total, so a total uploaded
    # now is partial, and the TA who reads only the export's output must know it
    done.by_hand = ["".join(part[1] for part in line) + ". Their totals in these files count those answers 0: "
                    "export again once they are graded" for line in to_grade_by_hand(standings)]
    cells: dict = {}  # (student, lab) → the grade (None where not graded)
    for s in standings:
        if s.lab not in labs:
            continue
        if s.status == term.GRADED:
            cells[(s.student, s.lab)] = scores.get((s.student, s.lab), 0.0)
        elif s.status == term.MISSING:
            cells[(s.student, s.lab)] = 0.0
        else:
            cells[(s.student, s.lab)] = None
            done.not_graded.append((s.student, s.lab, s.why))
    people: dict = {}
    for s in standings:
        person = people.setdefault(s.student, {"name": s.person.get("name") or s.student, "ids": {},
                                               "person": s.person})
        if s.lms_id:
            person["ids"].setdefault(s.lms or s.person.get("lms") or "", {})[s.lab] = s.lms_id
    has = {name: any(name in p["ids"] for p in people.values()) for name in LMSS}
    # every LMS unless one was named: one the course has no ids of is a line of the output, never left unsaid
    asked = list(lms) if lms else list(LMSS) if any(has.values()) else []
    problems = []  # a file that could not be written and what to do: an error where it was asked for by name
    refused = []   # a file the export will not write until the TA decides: always an error
    for name in asked:
        if not has[name]:
            problems.append(f"no {_title(name)} file: no student of {course_folder} has a {_title(name)} id "
                            f"({_where_ids(name)})")
    if not any(has.values()):
        done.notes.append("no LMS file written: no student has a Canvas or Moodle id (the submissions were a "
                          "folder of plain names and no --roster was given); upload totals.csv by hand, or grade "
                          "the LMS's own download (or give its roster with --roster) and export again")

    def table(path: Path, header: list, rows: list) -> None:
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "w", newline="", encoding="utf-8", errors="backslashreplace") as handle:
            writer = csv.writer(handle)
            writer.writerow([spreadsheet_cell(cell) for cell in header])
            writer.writerows([spreadsheet_cell(cell) for cell in row] for row in rows)
        temporary.replace(path)  # a file the TA may upload is whole or not there
        done.files.append(path)

    def grade(student, lab, factor=1.0) -> str:
        value = cells.get((student, lab))
        return "" if value is None else _number(round(value * factor, 4))

    to = Path(to) if to else course_folder / "export"
    to.mkdir(parents=True, exist_ok=True)
    table(to / "totals.csv", ["student", "name"] + [f"{lab} ({_number(maxima.get(lab, 0))})" for lab in labs],
          [[student, printable(p["name"])] + [grade(student, lab) for lab in labs]
           for student, p in sorted(people.items())])

    canvas = {student: p for student, p in people.items() if "canvas" in p["ids"]}
    if "canvas" in asked and canvas:
        columns = next((p["person"].get("columns") for p in canvas.values() if p["person"].get("columns")), {})
        header, possible, factors, wrong = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"], [], {}, []
        for lab in labs:
            column = _canvas_column(lab, columns or {})
            ours = maxima.get(lab, 0.0)
            theirs = (columns or {}).get(column)
            theirs = theirs if isinstance(theirs, (int, float)) and not isinstance(theirs, bool) else None
            header.append(column)
            if theirs is None or abs(theirs - ours) < 1e-9:
                possible.append(_number(theirs if theirs is not None else ours))
                factors[lab] = 1.0
                if column not in (columns or {}):
                    done.notes.append(f"canvas-grades.csv: {lab} has no column in the roster's Canvas export: "
                                      f"Canvas will offer to create an assignment \"{lab}\" worth {_number(ours)}")
            elif scale and theirs > 0 and ours > 0:
                possible.append(_number(theirs))
                factors[lab] = theirs / ours
                done.notes.append(f"canvas-grades.csv: {lab} scaled from {_number(ours)} points to Canvas's "
                                  f"{_number(theirs)} (\"{column}\")")
            else:
                wrong.append(f"{lab} is worth {_number(ours)} points, Canvas's \"{column}\" {_number(theirs)}")
        owners: dict = {}  # Canvas id → the students of the course folder under it
        for student, p in canvas.items():
            owners.setdefault(next(iter(p["ids"]["canvas"].values())), []).append(student)
        shared = {lms_id: sorted(students) for lms_id, students in owners.items() if len(students) > 1}
        if shared:  # Canvas takes the rows one after the other: a second row's blanks and zeros replace the first's
            (to / "canvas-grades.csv").unlink(missing_ok=True)
            refused.append("no canvas-grades.csv: " + "; ".join(
                f"Canvas ID {lms_id} is {' and '.join(students)}" for lms_id, students in sorted(shared.items())) +
                " in this course folder (a student renamed in Canvas between two labs, graded by an older "
                "fuselab): two rows of one Canvas student, the later row's grades would replace the earlier's. "
                "Enter that student's grades in Canvas by hand, from totals.csv")
        elif wrong:  # a decision for the TA, whatever was asked: never a silent change of Canvas's points
            (to / "canvas-grades.csv").unlink(missing_ok=True)  # nor an earlier export's file left to upload
            refused.append("no canvas-grades.csv: " + "; ".join(wrong) + ". Set the assignment's points in Canvas "
                            "to the lab's and export its gradebook again as --roster of the next fuselab grade, or "
                            "give fuselab export --scale to write the points scaled to Canvas's")
        else:
            rows = [["    Points Possible", "", "", "", ""] + possible]
            for student, p in sorted(canvas.items()):
                person = p["person"]
                ids = p["ids"]["canvas"]
                rows.append([printable(p["name"]), next(iter(ids.values())), person.get("sis_id", ""),
                             person.get("sis_login", ""), person.get("section", "")] +
                            [grade(student, lab, factors[lab]) for lab in labs])
            table(to / "canvas-grades.csv", header, rows)
    if "moodle" in asked and has["moodle"]:
        for lab in labs:
            rows, theirs = [], set()
            ours = maxima.get(lab, 0.0)
            for student, p in sorted(people.items()):
                number = p["ids"].get("moodle", {}).get(lab)
                if number is None or (student, lab) not in cells:
                    continue
                sheet = p["person"].get("worksheet") if p["person"].get("lms_id") == number else None
                if not isinstance(sheet, dict) or sheet.get("lab", lab) != lab:
                    sheet = None  # the worksheet kept is another lab's (ids by email keep the latest)
                most = (sheet or {}).get("maximum")
                if isinstance(most, (int, float)) and most > 0:
                    theirs.add(float(most))  # the worksheet's Maximum Grade: the assignment's in Moodle
                rows.append([f"Participant {number}", printable(p["name"]), p["person"].get("email", ""),
                             student, lab])
            factor = 1.0
            if theirs and any(abs(t - ours) > 1e-9 for t in theirs):
                moodle_most = max(theirs)
                if scale and len(theirs) == 1 and ours > 0:
                    factor = moodle_most / ours
                    done.notes.append(f"moodle-{lab}.csv: {lab} scaled from {_number(ours)} points to Moodle's "
                                      f"maximum grade {_number(moodle_most)}")
                else:  # Moodle refuses a grade above its maximum: a decision for the TA, never a silent change
                    (to / f"moodle-{lab}.csv").unlink(missing_ok=True)
                    refused.append(f"no moodle-{lab}.csv: {lab} is worth {_number(ours)} points, the Moodle "
                                   f"assignment's maximum grade (its grading worksheet) "
                                   f"{', '.join(_number(t) for t in sorted(theirs))}. Set the maximum grade in "
                                   "Moodle to the lab's and give its new grading worksheet as --roster of the lab's "
                                   "next fuselab grade, or give fuselab export --scale to write the points scaled "
                                   "to Moodle's")
                    continue
            rows = [row[:3] + [grade(row[3], row[4], factor), _number(ours * factor)] for row in rows]
            if rows:
                table(to / f"moodle-{lab}.csv", ["Identifier", "Full name", "Email address", "Grade",
                                                 "Maximum Grade"], rows)
                done.notes.append(f"moodle-{lab}.csv: grades out of {_number(ours * factor)}: the Moodle "
                                  f"assignment's maximum grade must be {_number(ours * factor)} (Moodle keeps "
                                  "its own; a grade above it is refused)")
            else:
                (to / f"moodle-{lab}.csv").unlink(missing_ok=True)
                problems.append(f"no moodle-{lab}.csv: no student of {lab} has a Moodle participant number "
                                f"({_where_ids('moodle')}, for {lab}'s assignment)")
    done.unmatched = sorted(student for student, p in people.items() if not p["ids"])
    done.problems = problems
    if refused or (lms and problems):  # asked for by name: what could not be written is an error
        raise ExportError("; ".join(refused + (problems if lms else [])), done)
    return done


def _title(lms: str) -> str:
    return {"canvas": "Canvas", "moodle": "Moodle"}.get(lms, lms)


def _where_ids(lms: str) -> str:
    return {"canvas": "its ids come from Canvas's bulk download (name_ID_..._file) or its gradebook export as "
                      "--roster",
            "moodle": "its participant numbers come from Moodle's download (Name_NUMBER_assignsubmission_...) or "
                      "its grading worksheet as --roster"}[lms]


def main(args) -> int:
    lms = None if getattr(args, "lms", None) in (None, "all") else [args.lms]
    try:
        done = write(Path(args.course), args.to, lms=lms, scale=getattr(args, "scale", False))
    except FileNotFoundError as exc:
        print(f"fuselab export: {exc}", file=sys.stderr)
        return 2
    except ExportError as exc:
        written = exc.args[1] if len(exc.args) > 1 else None
        for path in getattr(written, "files", []):
            print(f"wrote {path}")
        for line in getattr(written, "by_hand", []) if getattr(written, "files", []) else []:
            print(f"partial totals: {shown(line)}")
        for problem in [] if written is None or getattr(args, "lms", None) not in (None, "all") else written.problems:
            print(f"not written: {problem}")
        print(f"fuselab export: {exc.args[0]}", file=sys.stderr)
        return 2
    for path in done.files:
        print(f"wrote {path}")
    print(f"labs: {', '.join(done.labs)}")
    for line in done.by_hand:
        print(f"partial totals: {shown(line)}")
    for note in done.notes:
        print(note)
    for problem in done.problems:
        print(f"not written: {problem}")
    for student, lab, why in done.not_graded:
        print(f"left blank (not graded): {shown(student)}/{lab}: {shown(' '.join(printable(why).split())[:200])}")
    if done.unmatched:
        print(f"no LMS id (only in totals.csv): {', '.join(shown(s) for s in done.unmatched)}")
    return 0
