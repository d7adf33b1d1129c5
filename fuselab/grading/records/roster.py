"""The class list, from the LMS's own CSV export: who should have submitted.

Read as it comes out of the LMS (``fuselab grade --roster FILE``):

- Canvas's gradebook export (Grades > Export): ``Student`` ("Last, First"), ``ID`` (the user id Canvas puts in
  its submission file names), and where it has them ``SIS User ID``, ``SIS Login ID``, ``Section``; the
  assignments' columns are those named as Canvas names them, ``Title (assignment id)``, wherever they stand
  (its totals, "Current Score" and the like, are none); its "Points Possible" row gives each assignment's points
  in Canvas (``fuselab export`` never changes them), the test student is skipped;
- Moodle's grading worksheet (Assignment > Download grading worksheet): ``Identifier`` ("Participant 1234", the
  number Moodle puts in its submission names), ``Full name``, ``Email address``, and for that assignment
  ``Status`` (Moodle says "... late") and ``Last modified (submission)``: when the run covers that one lab,
  they are its late marks and timestamps (read as UTC: set Moodle's time zone to UTC in your profile, or
  give ``--due`` in Moodle's);
- Moodle's grade export or participants list: ``First name``, ``Last name``, ``Email address`` (matched to the
  submissions by name: those names carry no number).

Each person gets the student id intake gives their submissions (matched by the LMS's id, else by name), so a
roster student with nothing submitted is one row, not two. The roster is saved in the course folder
(``roster.json``) and kept by later runs until another ``--roster`` replaces it.

Moodle numbers each student anew in every assignment, so a grading worksheet's people get the id of their email
address (``email_id``, the same in every lab of the term; ``by_email``), and each keeps the participant number of
every lab whose worksheet named them (``lab_ids``): a later lab's worksheet adds its numbers to the people kept.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import re
from pathlib import Path

from .intake import printable, student_id
from .nbgrader_run import own_due_key
from .whole import write_whole

ROSTER = "roster.json"
MAX_ROSTER_BYTES = 20 * 2**20


# Canvas's name of an assignment's column: its title and its id, "Lab 0 (5001)"
CANVAS_ASSIGNMENT = re.compile(r".*\S\s*\(\d+\)")


class RosterError(ValueError):
    """The file is not a roster this reads: says which columns it looked for."""


def _canvas_name(name: str) -> str:
    """Canvas's own name in its submission files: "Smith, Jane" → "smithjane"."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def read(path: Path) -> list:
    """The people of an LMS roster CSV: ``[{"student", "name", "email", "lms_id", "lms", ...}]``."""
    raw = Path(path).read_bytes()[:MAX_ROSTER_BYTES]
    rows = _csv_rows(path, raw)
    if not rows:
        raise RosterError(f"{path}: empty; give the LMS's CSV export of the class")
    header = [h.strip() for h in rows[0]]
    lower = [h.lower() for h in header]
    people = []
    if "student" in lower and "id" in lower:  # Canvas
        at = {name: lower.index(name) for name in ("student", "id", "sis user id", "sis login id", "section")
              if name in lower}
        # the assignments by name, wherever they are: Canvas's identity columns before them vary (SIS, Integration
        # ID, Root Account, Section, each optional) and its totals ("Current Score", "Final Grade") follow them
        assignments = [i for i, h in enumerate(header) if CANVAS_ASSIGNMENT.fullmatch(h)]
        possible = None  # Canvas's "Points Possible" row: each assignment's points in Canvas
        for row in rows[1:]:
            cell = {name: (row[i].strip() if i < len(row) else "") for name, i in at.items()}
            # Canvas's own row comes before the students' and has no id: a student whose name reads "Points
            # Possible" is a student, whose scores are never taken for the assignments' points
            if cell["student"].lower() == "points possible" and not cell["id"] and possible is None and not people:
                possible = {header[i]: _points(row[i]) for i in assignments if i < len(row)}
                continue
            if not cell["id"].isdigit() or cell["student"].lower() == "student, test":
                continue
            people.append({"student": student_id(f"{_canvas_name(cell['student'])}_{cell['id']}"),
                           "name": cell["student"], "lms_id": cell["id"], "lms": "canvas",
                           "sis_id": cell.get("sis user id", ""), "sis_login": cell.get("sis login id", ""),
                           "section": cell.get("section", ""), "email": ""})
        # an assignment column: its points in Canvas
        columns = {header[i]: (possible or {}).get(header[i]) for i in assignments}
    elif "identifier" in lower and "full name" in lower:  # Moodle's grading worksheet
        at = {name: lower.index(name) for name in ("identifier", "full name", "email address", "status",
                                                   "last modified (submission)", "maximum grade") if name in lower}
        for row in rows[1:]:
            cell = {name: (row[i].strip() if i < len(row) else "") for name, i in at.items()}
            number = re.sub(r"\D", "", cell["identifier"])
            if not number:
                continue
            people.append({"student": student_id(f"{cell['full name']}_{number}"), "name": cell["full name"],
                           "lms_id": number, "lms": "moodle", "email": cell.get("email address", ""),
                           "identifier": cell["identifier"],
                           "worksheet": {"late": "late" in cell.get("status", "").lower(),
                                         "submitted": _moodle_time(cell.get("last modified (submission)", "")),
                                         "maximum": _points(cell.get("maximum grade", "")),
                                         "extension": _moodle_extension(cell.get("status", ""))}})
        columns = {}
    elif "first name" in lower and "last name" in lower:  # Moodle's grade export, participants
        at = {name: lower.index(name) for name in ("first name", "last name", "email address", "id number")
              if name in lower}
        for row in rows[1:]:
            cell = {name: (row[i].strip() if i < len(row) else "") for name, i in at.items()}
            name = f"{cell['first name']} {cell['last name']}".strip()
            if name:
                people.append({"student": student_id(name), "name": name, "lms_id": None, "lms": "moodle",
                               "email": cell.get("email address", ""), "id_number": cell.get("id number", ""),
                               "first_name": cell["first name"], "last_name": cell["last name"]})
        columns = {}
    elif {"student", "sis user id", "sis login id"} & set(lower) or any(map(CANVAS_ASSIGNMENT.fullmatch, header)):
        # Canvas's columns, but not the two every person is known by: a roster edited, or another tool's export
        # (an "ID" alone says nothing: many a CSV has one)
        lacking = [name for name in ("Student", "ID") if name.lower() not in lower]
        raise RosterError(f"{path}: a Canvas gradebook export without its {' and '.join(lacking)} column"
                          f"{'s' if len(lacking) > 1 else ''} (its columns: "
                          f"{', '.join(printable(h) for h in header[:8])}): Student (\"Last, First\") and ID (Canvas's "
                          "user id, in its submission file names) say who each row is. Download it again from "
                          "Canvas (Grades > Export) and give it unedited")
    else:
        # a spreadsheet set to a language whose decimal mark is a comma saves "CSV" with semicolons: one column
        semicolons = ("; its columns are separated by semicolons (a spreadsheet saved it so): give the LMS's own "
                      "download, unedited, or save it as CSV with commas") if len(header) == 1 and ";" in header[0] \
            else ""
        raise RosterError(f"{path}: not a roster this reads (its columns: {', '.join(printable(h) for h in header[:8])}"
                          f"{semicolons}). Give Canvas's gradebook export (Student, ID, ...) or Moodle's grading "
                          "worksheet (Identifier, Full name, ...) or grade export (First name, Last name, ...)")
    for person in people:
        person["columns"] = columns  # Canvas: its assignment columns and their points, for the export
    return people


GIVE = ("give the LMS's class list as the CSV file it downloads: Canvas's gradebook export (Grades > Export) or "
        "Moodle's grading worksheet (Assignment > Download grading worksheet) or grade export")


def _csv_rows(path, raw: bytes) -> list:
    """The rows of a roster's bytes; ``RosterError`` saying what to give where they are not CSV text: a zip (an
    .xlsx is one), other binary, text not in UTF-8, or what Python's csv cannot parse."""
    if raw.startswith(b"PK\x03\x04"):
        raise RosterError(f"{path}: a zip archive (an Excel .xlsx, or a download of submissions), not a CSV; {GIVE}")
    if b"\x00" in raw[:4096]:  # no CSV has NUL bytes; UTF-16, .xls or another program's file does
        raise RosterError(f"{path}: not a CSV in UTF-8 (it has NUL bytes: a spreadsheet's own format, or UTF-16 "
                          f"text); {GIVE}")
    try:
        # strict: a name's bytes replaced would reach the gradebook and the LMS export wrong, and quietly. Not
        # final where the file was cut at MAX_ROSTER_BYTES: a character cut in two there is no error.
        text = codecs.getincrementaldecoder("utf-8-sig")().decode(raw, final=len(raw) < MAX_ROSTER_BYTES)
    except UnicodeDecodeError as exc:
        at = exc.start + len(raw) - len(exc.object)  # the decoder's offsets leave out a BOM
        raise RosterError(f"{path}: not UTF-8 text (byte 0x{raw[at]:02x} at offset {at}); {GIVE}, "
                          "unedited: a spreadsheet program that saved it again must save it as CSV UTF-8") from None
    try:
        # newline="" as csv asks: a row may end in \r alone (an old Mac's CSV) and a quoted name keeps its line ends
        return list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise RosterError(f"{path}: not a CSV this can read ({exc}); {GIVE}") from None


def _points(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _moodle_time(text: str) -> str | None:
    """Moodle's "Monday, 14 September 2026, 11:59 PM" as ISO 8601 (read as UTC); None for "-" or no time."""
    if not text.strip() or text.strip() == "-":
        return None
    try:
        from nbgrader.utils import parse_utc
        return parse_utc(text.replace(",", " ")).isoformat()
    except (ValueError, OverflowError):
        return None


def _moodle_extension(status: str) -> str | None:
    """The due date of a Moodle extension in a worksheet's status ("... - Extension granted until Friday, 18
    September 2026, 11:59 PM"), as ISO 8601 (read as UTC, as its times are); None where there is none."""
    granted = re.search(r"extension granted until\s+([^\n]+?)\s*(?:\s-\s.*)?$", status, re.I)
    return _moodle_time(granted.group(1)) if granted else None


WORKSHEET = "worksheet"  # an entry's ``late_from``: its late mark and time came from a grading worksheet


def worksheet_facts(people: list, entries: dict, lab: str) -> dict:
    """A Moodle grading worksheet's late marks and times onto the entries of ``lab`` (the run's one lab) that
    have none of their own; returns its extensions, ``{"lab:student": due date}`` (``nbgrader_run.set_due_dates``:
    the students' own due dates)."""
    by_id = {p["student"]: p.get("worksheet") for p in people if p.get("worksheet")}
    from datetime import datetime
    extended = {own_due_key(lab, student): datetime.fromisoformat(facts["extension"]) for student, facts in by_id.items()
                if isinstance(facts.get("extension"), str)}
    for (student, entry_lab), entry in entries.items():
        facts = by_id.get(student)
        if entry_lab == lab and facts:
            if (facts["late"] and not entry.late) or (facts["submitted"] and not entry.submitted):
                entry.late_from = WORKSHEET  # kept by a later run of the lab without the worksheet
            entry.late = entry.late or facts["late"]
            entry.submitted = entry.submitted or facts["submitted"]
    return extended


EMAIL = "email"  # a person's ``identity``: their student id is their email address's (``email_id``)


def email_id(email: str) -> str:
    """The student id of an email address, the same in every lab: its name before the ``@`` (cleaned as every
    student id is) and 8 hex digits of its hash, so two addresses never share one."""
    normal = email.strip().lower()
    digest = hashlib.sha256(normal.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{student_id(normal.rsplit('@', 1)[0])[:40]}_{digest}"


def by_email(people: list) -> dict:
    """A grading worksheet's people with an email address under ``email_id`` (in place); returns ``{participant
    number: student id}`` for intake (``intake.collect``'s ``moodle_ids``). Raises ``RosterError`` for one address
    given to two participants (which of them is whose, nobody can tell)."""
    numbers, owners = {}, {}
    for person in people:
        email = str(person.get("email") or "")
        if person.get("lms") != "moodle" or not person.get("identifier") or "@" not in email:
            continue
        student = email_id(email)
        if owners.setdefault(student, person["lms_id"]) != person["lms_id"]:
            raise RosterError(f"participants {owners[student]} and {person['lms_id']} of the grading worksheet "
                              f"have one email address ({printable(email)}): correct it in Moodle and download "
                              "the worksheet again")
        person["student"], person["identity"] = student, EMAIL
        numbers[person["lms_id"]] = student
    return numbers


def worksheet_numbers(people: list, lab: str | None = None) -> set:
    """Every participant number a grading worksheet names (with an email address or not); ``lab``: of the roster
    kept, those of that lab's worksheet."""
    return {p["lms_id"] for p in people if p.get("lms") == "moodle" and p.get("identifier") and p.get("lms_id")
            and (lab is None or (p.get("worksheet") or {}).get("lab") == lab)}


def with_lab_ids(people: list, kept: list, lab: str) -> list:
    """The roster to keep after ``lab``'s grading worksheet (``people``, ids by email): its people, each with the
    participant numbers of the earlier labs (``kept``) and ``lab``'s, and the kept people it does not name (their
    earlier labs stay theirs)."""
    earlier = {p["student"]: p for p in kept if p.get("identity") == EMAIL}
    merged = []
    for person in people:
        if isinstance(person.get("worksheet"), dict):
            person = {**person, "worksheet": {**person["worksheet"], "lab": lab}}
        if person.get("identity") != EMAIL:
            merged.append(person)
            continue
        before = earlier.pop(person["student"], {})
        person = {**person, "lab_ids": {**(before.get("lab_ids") or {}), lab: person["lms_id"]}}
        merged.append(person)
    return merged + list(earlier.values())


def lab_numbers(people: list, lab: str) -> dict:
    """``{participant number: student id}`` of ``lab`` from the roster kept (the worksheets given for it)."""
    return {p["lab_ids"][lab]: p["student"] for p in people
            if p.get("identity") == EMAIL and isinstance(p.get("lab_ids"), dict) and lab in p["lab_ids"]}


def match(people: list, entries: dict) -> list:
    """Each person under the student id intake gave their submissions: the same LMS id, else (no id: Moodle's
    grade export) an id that is their name followed by a number."""
    by_lms = {e.lms_id: e.student for e in entries.values() if e.lms_id}
    students = {e.student for e in entries.values()}
    for person in people:
        if person.get("identity") == EMAIL:
            continue  # their id is their email's already, whatever number another lab gave someone
        if person.get("lms_id") and person["lms_id"] in by_lms:
            person["student"] = by_lms[person["lms_id"]]
        elif not person.get("lms_id"):
            named = sorted(s for s in students if re.fullmatch(re.escape(person["student"]) + r"_\d+", s))
            if len(named) == 1:
                person["student"] = named[0]
                person["lms_id"] = named[0].rsplit("_", 1)[1]
    return people


def first_and_last(person: dict) -> tuple:
    """A roster person's (first name, last name): as the roster gives them, else from the name (Canvas's
    "Last, First"; Moodle's "First Last", its last word the last name)."""
    if person.get("first_name") or person.get("last_name"):
        return person.get("first_name") or "", person.get("last_name") or ""
    name = " ".join(str(person.get("name") or "").split())
    if "," in name:
        last, first = name.split(",", 1)
        return first.strip(), last.strip()
    first, _, last = name.rpartition(" ")
    return first, last


# what HTML reads as markup: formgrader's submission page writes a student's first and last name from the gradebook
# into the page unescaped (nbconvert's templates), and a student sets their own name in many an LMS (Moodle's
# profile): ``<img src=x onerror=...>`` as a name ran script in the TA's formgrader
MARKUP = re.compile(r"[<>&\"`]")


def _no_markup(text) -> str:
    """``text`` as the gradebook keeps a roster's name or email: printable, at most 128 characters, without the
    characters HTML reads as markup (an apostrophe stays: O'Brien)."""
    return MARKUP.sub("", printable(text))[:128]


def to_gradebook(db: Path, people: list) -> None:
    """Every roster person as a student of nbgrader's gradebook with their first name, last name and email, so
    formgrader and nbgrader's own export show who they are; a roster student who submitted nothing is added too
    (nbgrader counts them 0, as grades.csv counts them missing). Nothing else of the gradebook changes."""
    if not people or not Path(db).is_file():
        return
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{db}") as gradebook:
        for person in people:
            first, last = first_and_last(person)
            details = {"first_name": _no_markup(first) or None, "last_name": _no_markup(last) or None,
                       "email": _no_markup(person.get("email") or "") or None}
            if person.get("lms_id"):
                details["lms_user_id"] = _no_markup(str(person["lms_id"]))
            gradebook.update_or_create_student(person["student"], **{k: v for k, v in details.items() if v})


def save(out: Path, people: list) -> None:
    write_whole(Path(out) / ROSTER, json.dumps(people, indent=1))


def load(out: Path) -> list:
    try:
        people = json.loads((Path(out) / ROSTER).read_text())
    except (OSError, ValueError):
        return []
    return [p for p in people if isinstance(p, dict) and isinstance(p.get("student"), str)] \
        if isinstance(people, list) else []
