"""A term's course folder: one gradebook that every ``fuselab grade`` run adds to.

``--out`` names the course folder (default ``grader/runs/term``); lab 0 in week 1, lab 1 in week 2 and a regrade
in week 5 all go to the same one. Besides the graded results (``work/<student>/<lab>/result.json``) it keeps:

- ``entries.json``: every (student, lab) any run's intake met, graded or not graded and why, with what the LMS
  said (late, when handed in, its id for the student). A run replaces the entries it met again and keeps every
  other, so a run over some students or labs changes exactly their rows;
- ``roster.json``: the class list (``--roster``, the LMS's own CSV export, ``roster.py``), kept for later runs:
  who is on it and submitted nothing for a lab the course has graded is "missing", with 0.

``standings`` puts the two together: one ``Standing`` per (student, lab) for grades.csv, the report and the
LMS export.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import nbgrader_run
from .results import SubmissionResult
from .whole import write_whole

ENTRIES = "entries.json"
GRADED, NOT_GRADED, MISSING = "graded", "not graded", "missing"
UNKNOWN_LAB = ""  # an entry intake could not give a lab (a file of no lab in a run over several labs)


@dataclass
class Entry:
    student: str
    lab: str
    status: str                   # GRADED or NOT_GRADED
    why: str = ""                 # for NOT_GRADED: what was wrong; for GRADED: notes from intake
    where: str = ""               # the entry's name in the submissions
    late: bool = False
    submitted: str | None = None  # ISO 8601, where the LMS's download said
    lms_id: str | None = None
    lms: str | None = None        # "canvas" or "moodle": whose id ``lms_id`` is
    late_from: str | None = None  # roster.WORKSHEET: ``late``/``submitted`` came from a Moodle grading worksheet


@dataclass
class Standing:
    """One student's standing in one lab: a graded result, or why there is none."""
    student: str
    lab: str
    status: str                    # GRADED, NOT_GRADED or MISSING
    why: str = ""
    late: bool = False
    submitted: str | None = None
    lms_id: str | None = None
    lms: str | None = None
    result: SubmissionResult | None = None
    person: dict = field(default_factory=dict)   # the roster's row for the student (name, email, ids)


def load_entries(out: Path) -> dict:
    path = Path(out) / ENTRIES
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    entries = {}
    for item in data if isinstance(data, list) else []:
        try:
            entry = Entry(**item)
        except TypeError:
            continue
        entries[(entry.student, entry.lab)] = entry
    return entries


def save_entries(out: Path, entries: dict) -> None:
    """Written whole or not at all."""
    write_whole(Path(out) / ENTRIES, json.dumps([asdict(e) for _, e in sorted(entries.items())], indent=1))


NOBODY = "(no student) "  # the start of the row name of an upload no student could be told for


def nobodys(where: str) -> str:
    """The row of an upload whose student cannot be told (a notebook at the top of the class folder, an
    unreadable name): named after the upload, so that it is a row of grades.csv and the report like any other."""
    return NOBODY + " ".join(str(where).split())[:200]


def record_run(out: Path, submissions: list, graded: set, problems: list, run_labs) -> dict:
    """Add this run's entries to the course's and save them; returns them all.

    ``submissions``: intake's; ``graded``: the (student, lab) of those that have a result now; ``problems``:
    intake's and the grader's. A problem with no lab belongs to the run's lab where the run covers one lab; one
    with no student is an entry of its own (``nobodys``): every upload is accounted for."""
    from .roster import WORKSHEET
    entries = load_entries(out)
    run_labs = sorted(run_labs)
    new: dict = {}
    for problem in problems:
        if problem.note:
            continue  # about the run, or an older upload skipped: listed in the report's "to look at" of this run
        student = problem.student or nobodys(problem.where)
        lab = problem.lab or (run_labs[0] if len(run_labs) == 1 else UNKNOWN_LAB)
        entry = new.get((student, lab))
        if entry is None or entry.status == GRADED:
            entry = new[(student, lab)] = Entry(student, lab, NOT_GRADED, where=problem.where,
                                                lms_id=problem.lms_id, lms=problem.lms)
        entry.why = "; ".join(filter(None, [entry.why, f"{problem.where}: {problem.message}"]))
    for sub in submissions:
        key = (sub.student, sub.lab)
        if key in graded:  # graded; a problem beside it (a link skipped in their zip) stays as a note
            noted = new.get(key)
            new[key] = Entry(sub.student, sub.lab, GRADED, why=noted.why if noted else "", where=sub.origin)
        if key in new:
            new[key].late, new[key].submitted = sub.late, sub.submitted
            new[key].lms_id, new[key].lms = sub.lms_id, sub.lms
    for key, entry in new.items():
        before = entries.get(key)
        if before is not None and before.late_from == WORKSHEET and not entry.late and not entry.submitted:
            # the worksheet given with an earlier run of this lab still says when they handed in: a later run of the
            # lab without it (hand grades put in, a regrade) keeps that, as it keeps the roster
            entry.late, entry.submitted, entry.late_from = before.late, before.submitted, WORKSHEET
        if before is not None and before.status == GRADED and entry.status == NOT_GRADED:
            entry.why += " (an earlier run graded a notebook of theirs for this lab: its result stays in work/)"
        entries[key] = entry
    for student, lab in [k for k in new if k[1] != UNKNOWN_LAB]:
        entries.pop((student, UNKNOWN_LAB), None)  # now known for a lab
    save_entries(out, entries)
    return entries


def graded_uploads(out: Path, keep_out=()) -> dict:
    """``{(student, lab): (origin, submitted)}`` of the uploads the course folder graded (``intake.collect``'s
    ``graded``), but for the students in ``keep_out``. A time a Moodle worksheet gave is not the download's, so it
    is left out."""
    from .roster import WORKSHEET
    return {key: (entry.where, entry.submitted if entry.late_from != WORKSHEET else None)
            for key, entry in load_entries(out).items() if entry.status == GRADED and key[0] not in keep_out}


def canvas_ids(out: Path) -> dict:
    """``{Canvas user id: student id}`` of the students the course folder has Canvas entries of (``intake.collect``'s
    ``canvas_ids``): Canvas names a download's files after the student's name as it is that week, but the id is
    the person's, so a student renamed between two labs stays one student. Where records made before this give
    one id two students, the one with more entries keeps it."""
    held: dict = {}
    for entry in load_entries(out).values():
        if entry.lms == "canvas" and entry.lms_id and not entry.student.startswith(NOBODY):
            held.setdefault(entry.lms_id, []).append(entry.student)
    return {lms_id: min(set(students), key=lambda s: (-students.count(s), s)) for lms_id, students in held.items()}


def _left_out(before: list, now: list) -> list:
    """The people of the roster kept ``before`` whom the one given ``now`` does not list, by Canvas id (the one id
    of a person that holds from one download to the next: a name changes, and Moodle numbers each assignment's
    participants anew, its worksheets keeping each lab's own)."""
    listed = {p.get("lms_id") for p in now if p.get("lms") == "canvas" and p.get("lms_id")}
    return [p for p in before if p.get("lms") == "canvas" and p.get("lms_id") and p["lms_id"] not in listed]


def unrelated_roster(people: list, students: set, lms_ids: set, out: Path) -> str | None:
    """Why ``people`` (a ``--roster`` just read) is not this course's, or None: it names none of ``students`` (this
    run's, whose LMS ids are ``lms_ids``) nor any student of the course folder ``out``, by LMS id or by id. Told
    only of an LMS's downloads (the students' LMS ids known): a folder of names matches no roster by design.
    Another course's export would put its people in every lab as "missing" (0 in the export, under its
    assignments' columns) and take this course's names and missing students out of grades.csv."""
    import re
    entries = load_entries(out).values()
    known = {e.student for e in entries if not e.student.startswith(NOBODY)} | set(students)
    known.discard(None)
    ids = {e.lms_id for e in entries if e.lms_id} | set(lms_ids)
    if not people or not known or not ids:
        return None  # a folder of names carries no LMS id to tell another course's roster by
    for person in people:
        student = str(person.get("student") or "")
        if student in known or (person.get("lms_id") and person["lms_id"] in ids) or \
                any(re.fullmatch(re.escape(student) + r"_\d+", s) for s in known):  # Moodle's grade export
            return None
    return (f"the roster names none of the {len(known)} students of these submissions or of {out} (e.g. "
            f"{', '.join(sorted(known)[:3])}), by LMS id or name; its {len(people)} people are others (e.g. "
            f"{', '.join(sorted(str(p.get('name') or p.get('student')) for p in people)[:3])}). Is it another "
            "course's or assignment's download? Give this course's: Canvas's Grades > Export, or Moodle's grading "
            "worksheet of the lab graded")


def by_participant_number(entry: Entry) -> bool:
    """A Moodle entry under ``<Full Name>_<participant number>`` (graded without its lab's grading worksheet, or by
    a fuselab before ids by email): that id is its lab's alone."""
    return entry.lms == "moodle" and bool(entry.lms_id) and entry.student.endswith(f"_{entry.lms_id}")


def record_course(out: Path, submissions: list, graded: set, problems: list, run_labs, people=None) -> dict:
    """``record_run``, and the roster: this run's (``people``, read from ``--roster``) or the one kept, matched
    to the entries' ids and saved; a Moodle grading worksheet's late marks and times go to the run's one lab, and
    its participant numbers are kept as that lab's (``roster.with_lab_ids``)."""
    from . import roster
    before = roster.load(out)
    labs_before = sorted({lab for (_, lab), e in load_entries(out).items() if e.status == GRADED})
    entries = record_run(out, submissions, graded, problems, run_labs)
    kept = people if people is not None else before
    if people and len(set(run_labs)) == 1:
        kept = roster.with_lab_ids(people, before, next(iter(run_labs)))
    if kept:
        kept = roster.match(kept, entries)
        if people:  # a Canvas student the roster kept before listed and this one does not has left (dropped)
            kept += [{**person, "left": True, "enrolled_labs": person.get("enrolled_labs", labs_before)}
                     for person in _left_out(before, kept)]
        roster.save(out, kept)
    if people and len(set(run_labs)) == 1:  # a grading worksheet is one assignment's: this run's lab
        extended = roster.worksheet_facts(people, entries, next(iter(run_labs)))
        save_entries(out, entries)
        if extended:  # Moodle's extensions: the students' own due dates, as --due LAB:STUDENT gives them
            nbgrader_run.set_due_dates(Path(out) / "course" / "gradebook.db", extended)
    return entries


def saved_results(out: Path) -> dict:
    """Every graded result in the course folder: ``{(student, lab): SubmissionResult}``."""
    found = {}
    for path in sorted(Path(out).glob("work/*/*/result.json")):
        try:
            data = json.loads(path.read_text())
            result = SubmissionResult.from_json(data)
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        if (result.student, result.lab) == (path.parent.parent.name, path.parent.name):
            found[(result.student, result.lab)] = result
    return found


def course_results(out: Path, this_run: list, entries: dict) -> list:
    """The results the course's outputs show: this run's, and every other saved one whose entry is still
    graded (an entry a later run found not gradable keeps its result on disk, out of the totals)."""
    results = saved_results(out)
    if entries:
        results = {k: r for k, r in results.items() if k not in entries or entries[k].status == GRADED}
    results.update({(r.student, r.lab): r for r in map(SubmissionResult.of, this_run)})
    return [results[k] for k in sorted(results)]


def standings(results: list, entries: dict, people: list, due: dict | None = None) -> list:
    """One ``Standing`` per (student, lab): every result, every entry not graded, and for each student of the class
    (the roster's, and any the course graded a lab of, but under a Moodle id; for one a later roster left out,
    ``left``, only the labs graded before) with nothing for a lab the course has graded, MISSING. Sorted by
    student, then lab. Late: the LMS said so, or it was handed in after the lab's due date (``due``: ``{lab: datetime in UTC}``), or the student's own
    (``"lab:student"``: ``nbgrader_run.due_dates``)."""
    by_key: dict = {}
    for result in map(SubmissionResult.of, results):
        entry = entries.get((result.student, result.lab))
        by_key[(result.student, result.lab)] = Standing(
            result.student, result.lab, GRADED, late=bool(entry and entry.late),
            submitted=entry.submitted if entry else None, lms_id=entry.lms_id if entry else None,
            lms=entry.lms if entry else None, result=result)
    for key, entry in entries.items():
        if entry.status != GRADED and key not in by_key:
            by_key[key] = Standing(entry.student, entry.lab, entry.status, why=entry.why, late=entry.late,
                                   submitted=entry.submitted, lms_id=entry.lms_id, lms=entry.lms)
    graded_labs = {lab for (_, lab), s in by_key.items() if s.status == GRADED}
    people_by_id = {p["student"]: p for p in people}
    # the class: the roster, and whoever the course graded a lab of, under an id that is theirs in every lab (a
    # Canvas id or a folder's name; Moodle numbers a student anew in each assignment, so an id of its download is
    # one lab's: its worksheet, given as --roster, says who is missing there)
    # a Moodle student with an id by email (their worksheets') is of the class in each lab whose worksheet named
    # them, with that lab's participant number
    # (one whose upload could not be graded is of the class as much as one graded: missing in the other labs)
    known = {s.student: (s.lms_id, s.lms) for s in by_key.values()
             if s.status in (GRADED, NOT_GRADED) and s.lms != "moodle" and not s.student.startswith(NOBODY)}
    known.update({student: (p.get("lms_id"), p.get("lms")) for student, p in people_by_id.items()})
    for student, (lms_id, lms) in known.items():
        person = people_by_id.get(student, {})
        enrolled = person.get("enrolled_labs") if isinstance(person.get("enrolled_labs"), list) else []
        lab_ids = _lab_ids(people_by_id.get(student, {}))
        for lab in graded_labs:
            if lab_ids is not None and lab not in lab_ids:
                continue
            if person.get("left") and lab not in enrolled:
                continue  # dropped: a lab graded after they left the roster does not count them missing
            by_key.setdefault((student, lab), Standing(student, lab, MISSING, why="missing: nothing submitted",
                                                       lms_id=lab_ids[lab] if lab_ids is not None else lms_id,
                                                       lms=lms))
    for standing in by_key.values():
        when = (due or {}).get(nbgrader_run.own_due_key(standing.lab, standing.student), (due or {}).get(standing.lab))
        if when is not None and standing.submitted:
            from nbgrader.utils import parse_utc
            standing.late = standing.late or parse_utc(standing.submitted) > when
        standing.person = people_by_id.get(standing.student, {})
        if standing.lms_id is None:
            lab_ids = _lab_ids(standing.person)
            standing.lms_id = lab_ids.get(standing.lab) if lab_ids is not None else standing.person.get("lms_id")
            standing.lms = standing.person.get("lms")
    return [by_key[k] for k in sorted(by_key)]


def _lab_ids(person: dict) -> dict | None:
    """A Moodle person's participant number in each lab whose worksheet named them (``roster.with_lab_ids``);
    None for anyone else (one LMS id for the term)."""
    lab_ids = person.get("lab_ids")
    return lab_ids if isinstance(lab_ids, dict) else None
