"""Intake: a folder or zip of submissions → one notebook per (student, lab), and a list of what was wrong.

Accepted layouts (mixed freely):

- ``<root>/<student>/<lab>/<notebook>.ipynb`` (nbgrader's own layout) or ``<root>/<student>/<lab>.ipynb``;
- ``<root>/<student>.zip`` holding that student's files, in any of the layouts above;
- an LMS bulk download, as a folder or a zip: Canvas names files ``<student>_<id>_<id>_<original name>``
  (``<student>_LATE_<id>_...`` when late), Moodle makes a folder ``<Full Name>_<id>_assignsubmission_file_``
  ("download submissions in folders") or names each file ``<Full Name>_<id>_assignsubmission_file_<name>``.

What the LMS says about a submission is kept on it: its id there (``lms_id``: Canvas's user id, Moodle's
participant number), late (Canvas's ``LATE_``), and the time it was handed in where the download has one
(nbgrader's ``<student>/<lab>/timestamp.txt``).

The lab a notebook belongs to is the nearest folder named after a lab, else its file name (``lab0.ipynb``,
``lab0-1.ipynb``, ``Lab0 (2).ipynb``). Canvas's download of a notebook uploaded again (``lab0.ipynb``,
``lab0-1.ipynb``) is graded from the latest upload by Canvas's numbering (``canvas_uploads_in_order``), the earlier
ones named in a note on it. A malformed submission (not a notebook, an unknown lab, two notebooks
for one lab, an unsafe zip, a zip member that cannot be unpacked, a link that leads out of the student's folder,
a hidden folder) becomes a ``Problem`` listed in the report; it never stops the others, whatever its file names
(any length, any bytes) or JSON (any shape, any depth). Every entry is accounted for: a file that is not a notebook
(an ``.html`` export), a folder that cannot be read (a path too long or too deep) is a ``Problem`` too, or, beside
a notebook that is graded for the same lab, a note on it.

Identity: an LMS's student id is part of the student id (Canvas ``smithjane_123``, Moodle ``John_Smith_1234``), so
two students with one display name stay two; a Moodle download graded with its grading worksheet gives each
student the id of their email address instead (``roster.email_id``), since Moodle's number is one assignment's;
two folders whose names clean up to one id are both refused, never merged. A zip holding one folder is that folder's content only when what is inside looks like students (a zip of
``alice/lab0/...`` is alice's).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import unicodedata
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

MAX_UNZIPPED_BYTES = 500 * 2**20  # a class's notebooks are a few MB each; more is a zip bomb or a mistake
MAX_ZIP_MEMBERS = 20_000
MAX_JSON_DEPTH = 200  # a notebook is a few levels deep, its outputs' JSON a few dozen; more is an attack
# Parsing JSON costs memory per value, not per byte: 450 MB of "[]," is 150 million lists, ~10 GB in Python. A
# notebook is read only below both limits, so that one file cannot take the grader's memory (a few MB and some
# thousands of values are usual; outputs with plots or long logs stay far below).
MAX_NOTEBOOK_BYTES = 100 * 2**20
MAX_JSON_VALUES = 5_000_000
MAX_CLASS_UNZIPPED_BYTES = 4 * 2**30  # all archives of one intake together (a class of 300 needs a few hundred MB)
_IGNORED = ("__MACOSX", ".ipynb_checkpoints", ".DS_Store")
_CANVAS = re.compile(r"^(?P<student>[^_]+)_(?:LATE_)?\d+_\d+_(?P<rest>.+)$")
_MOODLE = re.compile(r"^(?P<student>.+?)_(?P<id>\d+)_assignsubmission_\w*?_?$")
_CANVAS_ID = re.compile(r"^(?P<student>[^_]+)_(?P<late>LATE_)?(?P<id>\d+)_(?P<file>\d+)_(?P<rest>.+)$")
_CANVAS_COPY = re.compile(r"^(?P<base>.+?)(?:-(?P<copy>\d+))?(?P<ext>\.ipynb)$", re.IGNORECASE)  # lab0-1.ipynb
_MOODLE_MARK = re.compile(r"_\d+_assignsubmission_")  # what follows a Moodle entry's full name, once
_MOODLE_FILE = re.compile(r"^(?P<student>.+?)_(?P<id>\d+)_assignsubmission_(?:file|onlinetext)_(?P<rest>.+)$")
MAX_TIMESTAMP_BYTES = 200
MAX_MEMBER_PARTS = 64  # folders deep a zip's member may be: deeper is no submission's layout, and Python's walks
                       # and ``mkdir(parents=True)`` recurse once per level


@dataclass
class Submission:
    student: str
    lab: str
    notebook: Path          # the copy in the staging folder
    origin: str             # where it came from, for messages
    warnings: list = field(default_factory=list)
    late: bool = False              # the LMS marked it late (Canvas's LATE_)
    lms_id: str | None = None       # the student's id in the LMS (Canvas user id, Moodle participant number)
    lms: str | None = None          # "canvas" or "moodle", where the names say
    submitted: str | None = None    # when it was handed in (ISO 8601, UTC), where the download says


def printable(text) -> str:
    """``text`` safe to print and write as UTF-8: undecodable bytes of a file name (surrogates) become ``\\xNN``."""
    text = str(text)
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class Problem:
    where: str
    message: str
    student: str | None = None
    lab: str | None = None
    grader_failed: bool = False  # the grader's own failure, not the submission's: a run again grades it
    of_the_run: bool = False     # about the run itself (the shared builds changed), not about an upload
    older_upload: bool = False   # an upload older than the one graded: skipped, the graded one's entry unchanged
    graded_before: bool = False  # about a student's lab the course folder graded before: that entry stays
    lms_id: str | None = None    # the student's id in the LMS, where the upload's name says (roster.match by it)
    lms: str | None = None

    @property
    def note(self) -> bool:
        """Told in the report's "to look at", and no entry of the course: no upload went ungraded for it."""
        return self.of_the_run or self.older_upload or self.graded_before

    def __post_init__(self):
        self.where, self.message = printable(self.where), printable(self.message)


def student_id(raw: str) -> str:
    """An nbgrader-safe student id: letters, digits, ``_ . -``; case kept. Never starting with ``-``: nbgrader's
    command line would read ``--force`` or ``-rf`` as an option, and its run of that student would be lost."""
    # composed first: a folder zipped on a Mac names "Zoë" as "Zoe" and a combining mark (NFD), elsewhere as one
    # letter (NFC); both are one student's, so both give "Zo"
    cleaned = re.sub(r"^[-._]+|[._]+$", "", re.sub(r"[^A-Za-z0-9_.-]+", "_",
                                                   unicodedata.normalize("NFC", raw).strip()))
    return cleaned or "unnamed"


def _id_or_none(owner):
    return student_id(owner) if owner else None


def lab_of(path: Path, labs: dict) -> str | None:
    """The lab a notebook belongs to: a folder named after a lab, else the file name."""
    for part in reversed(path.parent.parts):
        if part.lower() in labs:
            return part.lower()
    stem = re.sub(r"[\s_-]*(\(\d+\)|-\d+)$", "", path.stem.lower()).replace(" ", "")
    for lab, notebook_name in labs.items():
        if stem in (lab, Path(notebook_name).stem.lower()):
            return lab
    for lab in labs:  # "lab0_final", "lab0-submission"
        if re.match(rf"^{re.escape(lab)}(?!\d)", stem):
            return lab
    return None


@dataclass
class UnpackBudget:
    """What one intake may still write to disk from archives, over all of them: a zip inside a zip counts at its
    compressed size when its parent is unpacked, so a per-archive limit alone lets a few MB of nested zips write
    gigabytes."""
    remaining: int = field(default_factory=lambda: MAX_CLASS_UNZIPPED_BYTES)


def _wanted(name: str) -> bool:
    """Members intake can use: notebooks, and zips that may hold them. Anything else is never written (only its
    name, as an empty file: intake lists it as not a notebook)."""
    return name.lower().endswith((".ipynb", ".zip"))


def _cut_name(name: str, most: int = 200) -> str:
    """A member's name (or a message quoting its path) as the problem shows it: whole up to ``most`` characters,
    else its start and end (a name of 15 KB is no one's to read)."""
    return repr(name) if len(name) <= most else f"{name[:most // 2]!r}...{name[-most // 2:]!r}"


def _too_deep(name: str) -> str:
    return f"{_cut_name(name)}: {len(Path(name).parts)} folders deep (at most {MAX_MEMBER_PARTS})"


def _name_only(members: list, target: Path, archive: Path) -> list:
    """An empty file for each member that is not a notebook or zip, where its name is a safe path: its bytes are
    never unpacked, its name is accounted for. Returns problems for names the disk cannot hold."""
    problems = []
    for member in members:
        name = member.filename
        parts = Path(name).parts
        if member.is_dir() or not parts or name.startswith("/") or ".." in parts or ":" in parts[0]:
            continue
        if len(parts) > MAX_MEMBER_PARTS:
            problems.append(_about(name, f"{archive.name}: skipped {_too_deep(name)}"))
            continue
        try:
            destination = target.joinpath(*parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            if not destination.exists() and not destination.is_symlink():
                destination.touch()
        except (OSError, ValueError) as exc:  # a name too long for the disk: said, as a notebook's would be
            problems.append(_about(name, f"{archive.name}: {_cut_name(name)} is not a notebook, and its name "
                                         f"cannot be unpacked here ({_cut_name(str(exc))})"))
    return problems


class MemberProblem(str):
    """A problem text about one member of a zip (``member``: its name), so intake can tell whose it is."""
    member: str = ""


def _about(member: str, text: str) -> MemberProblem:
    problem = MemberProblem(text)
    problem.member = member
    return problem


def safe_extract(archive: Path, target: Path, budget: UnpackBudget | None = None) -> list:
    """Unzip the notebooks and zips of ``archive`` into ``target``; refuse absolute paths, ``..``, links, zip bombs
    and notebooks too large to grade, within ``budget`` (one for the whole intake). Returns problems (those about
    one member are ``MemberProblem``s)."""
    problems = []
    budget = budget if budget is not None else UnpackBudget()
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            if len(members) > MAX_ZIP_MEMBERS:
                return [f"{archive.name}: {len(members)} files is too many for a submission; not unpacked"]
            others = [m for m in members if not _wanted(m.filename)]
            members = [m for m in members if _wanted(m.filename)]
            total = sum(m.file_size for m in members)
            if total > MAX_UNZIPPED_BYTES:
                return [f"{archive.name}: unpacks to {total / 2**20:.0f} MB (limit {MAX_UNZIPPED_BYTES >> 20} MB); "
                        "not unpacked"]
            if total > budget.remaining:
                return [f"{archive.name}: unpacking it would pass what the whole class may unpack "
                        f"({MAX_CLASS_UNZIPPED_BYTES >> 30} GB); not unpacked"]
            budget.remaining -= total
            counts: dict = {}
            for member in members:
                counts[member.filename] = counts.get(member.filename, 0) + 1
            duplicated = {name for name, count in counts.items() if count > 1}
            for name in sorted(duplicated):  # which copy is the student's cannot be told: neither is graded
                problems.append(_about(name, f"{archive.name}: duplicate: {counts[name]} files named {name!r}; none "
                                             "of them was unpacked (keep one)"))
            for member in members:
                name = member.filename
                if name in duplicated:
                    continue
                if name.startswith("/") or ".." in Path(name).parts or ":" in Path(name).parts[0]:
                    problems.append(_about(name, f"{archive.name}: skipped unsafe path {name!r}"))
                    continue
                if len(Path(name).parts) > MAX_MEMBER_PARTS:
                    problems.append(_about(name, f"{archive.name}: skipped {_too_deep(name)}"))
                    continue
                if (member.external_attr >> 16) & 0o170000 == 0o120000:
                    problems.append(_about(name, f"{archive.name}: skipped symbolic link {name!r}"))
                    continue
                if member.flag_bits & 0x1:
                    problems.append(_about(name, f"{archive.name}: skipped {name!r}: it is encrypted (password "
                                                 "protected)"))
                    continue
                if name.lower().endswith(".ipynb") and member.file_size > MAX_NOTEBOOK_BYTES:
                    problems.append(_about(name, f"{archive.name}: skipped {name!r}: "
                                                 f"{_too_large_to_grade(member.file_size)}"))
                    continue
                try:
                    zf.extract(member, target)
                except (OSError, RuntimeError, NotImplementedError, ValueError, EOFError, zlib.error,
                        zipfile.BadZipFile) as exc:
                    # a name too long for the disk, a path that is a file and a folder, a broken member
                    problems.append(_about(name, f"{archive.name}: could not unpack {_cut_name(name)}: "
                                                 f"{_cut_name(str(exc))}"))
            problems += _name_only(others, target, archive)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        problems.append(f"{archive.name}: not a readable zip file ({exc})")
    return problems


def _too_large_to_grade(size: int) -> str:
    return (f"too large to grade ({size / 2**20:.1f} MB; the limit is {MAX_NOTEBOOK_BYTES / 2**20:g} MB): clear the "
            "outputs (Kernel > Restart Kernel and Clear Outputs) and submit again")


def check_notebook(path: Path) -> str | None:
    """Why ``path`` is not a gradable notebook, or None. A notebook accepted here can be read by every later step
    (its cells are objects, their sources text, their metadata objects)."""
    try:
        size = path.stat().st_size
        if size > MAX_NOTEBOOK_BYTES:
            return _too_large_to_grade(size)
        data = path.read_bytes()
        values = data.count(b",") + data.count(b"[") + data.count(b"{") + 1  # at least as many as JSON holds
        if values > MAX_JSON_VALUES:
            return (f"not a notebook that can be graded: its JSON would hold up to {values:,} values (the limit is "
                    f"{MAX_JSON_VALUES:,}); clear the outputs and submit again")
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return f"not a valid notebook (JSON: {exc})"
    except RecursionError:
        return "not a valid notebook (JSON nested too deeply)"
    except MemoryError:
        return "too large to read in the grader's memory: clear the outputs and submit again"
    except OSError as exc:
        return f"cannot read it ({exc})"
    if _depth(nb) > MAX_JSON_DEPTH:
        return f"not a valid notebook (JSON nested more than {MAX_JSON_DEPTH} deep)"
    if not isinstance(nb, dict) or nb.get("nbformat") != 4 or not isinstance(nb.get("cells"), list):
        return "not a Jupyter notebook in format 4"
    if not isinstance(nb.get("metadata", {}), dict):
        return "not a valid notebook: its metadata is not an object"
    for number, cell in enumerate(nb["cells"]):
        why = _cell_problem(cell)
        if why:
            return f"not a valid notebook: cell {number} {why}"
    return None


def _depth(value) -> int:
    deepest, frontier = 0, [(value, 1)]
    while frontier:
        item, depth = frontier.pop()
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        frontier += [(child, depth + 1) for child in children if isinstance(child, (dict, list))]
    return deepest


def _cell_problem(cell) -> str | None:
    if not isinstance(cell, dict):
        return "is not an object"
    if not isinstance(cell.get("cell_type"), str):
        return "has no cell_type"
    source = cell.get("source", "")
    if not isinstance(source, str) and not (isinstance(source, list) and all(isinstance(s, str) for s in source)):
        return "has a source that is not text"
    metadata = cell.get("metadata", {})
    if not isinstance(metadata, dict):
        return "has metadata that is not an object"
    nbgrader = metadata.get("nbgrader", {})
    if nbgrader is not None and not isinstance(nbgrader, dict):
        return "has nbgrader metadata that is not an object"
    if isinstance(nbgrader, dict):
        if not isinstance(nbgrader.get("grade_id", ""), (str, type(None))):
            return "has a grade_id that is not text"
        points = nbgrader.get("points", 0)
        if points is not None and (isinstance(points, bool) or not isinstance(points, (int, float))):
            return "has points that are not a number"
    return None


def _staged_copy(path: Path, target: Path) -> None:
    """Copy a checked notebook, filling in what Jupyter always writes and some tools leave out (a cell's
    ``source`` and ``metadata``), so no later step trips on a missing key."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        cell.setdefault("source", "")
        cell.setdefault("metadata", {})
    target.write_text(json.dumps(nb))


def _hidden(path: Path) -> str | None:
    """``"junk"`` for what editors and archivers leave (checkpoints, ``__MACOSX``), ``"hidden"`` for any other name
    starting with a dot (``...`` included: listed as not graded), None for the rest."""
    if any(p in _IGNORED for p in path.parts):
        return "junk"
    if any(p.startswith(".") for p in path.parts):
        return "hidden"
    return None


def _owner(relative: Path):
    """Student id of a file at ``relative`` (from the root) and the part of the path below the student."""
    first = relative.parts[0]
    if len(relative.parts) == 1:
        match = _MOODLE_FILE.match(first) or _CANVAS_ID.match(first)  # Moodle's first: a Canvas name has no spaces
        if match:
            return f"{match['student']}_{match['id']}", Path(match["rest"])
        return None, relative
    moodle = _MOODLE.match(first)
    return (f"{moodle['student']}_{moodle['id']}" if moodle else first), Path(*relative.parts[1:])


def _lms_facts(relative: Path) -> dict:
    """What the LMS's own name for an entry says: its id there, and whether it was late."""
    first = relative.parts[0]
    moodle = (_MOODLE_FILE.match(first) if len(relative.parts) == 1 else None) or _MOODLE.match(first)
    if moodle:
        return {"lms_id": moodle["id"], "lms": "moodle"}
    canvas = _CANVAS_ID.match(first) if len(relative.parts) == 1 else None
    if canvas:
        return {"lms_id": canvas["id"], "late": bool(canvas["late"]), "lms": "canvas"}
    return {}


def _timestamp(notebook: Path, within: Path) -> str | None:
    """nbgrader's ``timestamp.txt`` beside a submitted notebook (its own collected layout), as ISO 8601 UTC; None
    where there is none or it does not read as a time. Read as data: at most a line, never followed as a link.
    Never in an LMS's download: there a ``timestamp.txt`` is one more file the student uploaded (a date of their
    choosing would set their late penalty, and which of two uploads is older)."""
    stamp = notebook.parent / "timestamp.txt"
    if notebook.parent == within or stamp.is_symlink() or not stamp.is_file():
        return None
    try:
        if _lms_facts(notebook.relative_to(within)):
            return None
    except ValueError:  # not below the class folder (a notebook from a student's zip): no time of nbgrader's
        return None
    try:
        with open(stamp, "rb") as handle:
            text = handle.read(MAX_TIMESTAMP_BYTES).decode("utf-8", "replace").strip()
        from nbgrader.utils import parse_utc
        return parse_utc(text).isoformat()
    except Exception:  # noqa: BLE001 - any text: no time rather than a stopped intake
        return None


def _files(root: Path, errors: list | None = None):
    """Every file under ``root``, as paths below it; links are yielded, never followed into folders. A folder
    that cannot be read (a path too long, no permission) goes to ``errors`` as its OSError."""
    for folder, dirs, names in os.walk(root, followlinks=False, onerror=None if errors is None else errors.append):
        for name in sorted(names + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
            yield Path(folder, name).relative_to(root)
        dirs.sort()


def _escapes(path: Path, within: Path) -> bool:
    """A link (anywhere along ``path`` below ``within``, ``within`` itself included) that leads out of ``within``
    (a path without links)."""
    try:
        return Path(within) not in Path(path).resolve().parents
    except (OSError, RuntimeError):  # a loop of links
        return True


def may_hold_moodle(source: Path, max_names: int = 200_000) -> bool:
    """Whether ``source`` (a folder or a zip) may hold a Moodle download: a name anywhere in it that Moodle writes
    (``<Full Name>_<number>_assignsubmission_...``), or a zip inside it (not opened here). Names only: nothing
    is unpacked, no link is followed; past ``max_names`` names, True."""
    def moodle(name: str) -> bool:
        return bool(_MOODLE.match(name) or _MOODLE_FILE.match(name)) or name.lower().endswith(".zip")

    source = Path(source)
    try:
        if source.is_file():
            with zipfile.ZipFile(source) as zf:
                names = zf.namelist()
            return len(names) > max_names or any(moodle(part) for n in names for part in n.split("/") if part)
        seen = 0
        for _folder, dirs, files in os.walk(source):
            seen += len(dirs) + len(files)
            if seen > max_names or any(moodle(name) for name in dirs + files):
                return True
        return False
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError):
        return True  # the intake says what is wrong with it


def _class_folder(root: Path, labs: dict) -> Path:
    """The folder the students are in: a zip of the class folder itself holds one folder of students; a zip of
    one student's folder (``alice/lab0/...``) is not that."""
    entries = list(root.iterdir()) if root.is_dir() else []
    if len(entries) != 1 or not entries[0].is_dir() or entries[0].is_symlink():
        return root
    single = entries[0]
    if _CANVAS.match(single.name) or _MOODLE.match(single.name) or single.name.lower() in labs:
        return root
    inside = list(single.iterdir())
    looks_like_a_student = any(p.name.lower() in labs or p.suffix.lower() == ".ipynb" for p in inside)
    return single if any(p.is_dir() for p in inside) and not looks_like_a_student else root


def collect(source: Path, staging: Path, labs: dict, students=None, only_labs=None, seen: set | None = None,
            moodle_ids: dict | None = None, graded: dict | None = None, labs_found: set | None = None,
            canvas_ids: dict | None = None):
    """Find every submission under ``source`` (a folder or a zip) and copy it to ``staging/<student>/<lab>/``.

    ``labs``: ``{lab: notebook file name}`` of the course. Returns ``(submissions, problems)``; ``seen``, where
    given, gets the id of every student in ``source`` (whatever ``students`` picks). ``moodle_ids``: ``{participant
    number: student id}`` from the lab's grading worksheet (``roster.by_email``): a Moodle entry whose number is
    there gets that id, the same in every lab, instead of ``<Full Name>_<number>``. ``canvas_ids``: ``{Canvas user
    id: student id}`` of the course folder (``term.canvas_ids``): a Canvas upload of a student renamed since keeps
    the id they were graded under. ``graded``: ``{(student, lab):
    (origin, submitted)}`` of the uploads the course folder graded: an upload older than that one
    (``older_than_graded``) is not staged, so an earlier download graded again never replaces a resubmission's
    grade or its notebook; a note says so. ``labs_found``, where given, gets every lab a notebook in ``source`` is
    of (whatever ``only_labs`` picks).
    """
    source = Path(source)
    staging = Path(staging)
    graded_before = dict(graded or {})
    unpacked = staging.parent / (staging.name + "-unpacked")
    shutil.rmtree(unpacked, ignore_errors=True)
    problems: list = []
    budget = UnpackBudget()
    if not source.exists():
        raise FileNotFoundError(f"no such folder or zip: {source}")
    if source.is_file():
        root = unpacked / "root"
        extracted = safe_extract(source, root, budget)
        root.mkdir(parents=True, exist_ok=True)  # an empty zip unpacks to nothing: a class folder of no files
        root = _class_folder(root.resolve(), labs)
        problems += [_zip_problem(source, p, root, unpacked / "root") for p in extracted]
    else:
        root = source.resolve()

    found: dict = {}
    raw_owners: dict = {}   # student id → the folder/file names it came from (two names, one id: refused)
    on_disk: dict = {}      # student id → the first folder or file of theirs, by its name on disk
    others: list = []       # (student id or None, path below the root, path below the student): not notebooks
    facts: dict = {}        # student id → what the LMS's names say (lms_id, late)
    renamed: dict = {}      # an LMS's name for an entry → the id it has (``moodle_ids``, ``canvas_ids``)
    unreadable: list = []
    files = 0
    for relative in _files(root, unreadable):
        files += 1
        path = root / relative
        if len(_MOODLE_MARK.findall(relative.parts[0])) > 1:
            # a Moodle name holds the student's full name, which a student may be able to edit, before its own
            # ``_<number>_assignsubmission_``: a name with two of them could be either participant's, never guessed
            problems.append(Problem(str(relative), "its name holds two Moodle participants' numbers "
                                                   "(_<number>_assignsubmission_ twice): not graded, as it could be "
                                                   "either's; look at it in Moodle", student=None))
            continue
        owner, below = _owner(relative)
        if (moodle_ids or canvas_ids) and owner is not None:
            said = _lms_facts(relative)
            known = (moodle_ids if said.get("lms") == "moodle" else canvas_ids if said.get("lms") == "canvas"
                     else None) or {}
            if said.get("lms_id") in known:
                renamed[student_id(owner)] = known[said["lms_id"]]
                owner = known[said["lms_id"]]
        hidden = _hidden(relative)
        if hidden == "junk":
            continue
        if hidden == "hidden":
            if path.suffix.lower() in (".ipynb", ".zip"):
                problems.append(Problem(str(relative), "in a hidden file or folder (its name starts with '.'): "
                                                       "not graded; rename it", student=_id_or_none(owner)))
            continue
        if path.is_symlink() and path.is_dir():
            problems.append(Problem(str(relative), "a link to a folder: not followed (submit the files "
                                                   "themselves)", student=_id_or_none(owner or relative.name)))
            continue
        if owner is None and path.suffix.lower() == ".zip":  # <student>.zip at the top
            owner, below = path.stem, Path()
        if owner is not None:
            raw_owners.setdefault(student_id(owner), set()).add(owner)
            on_disk.setdefault(student_id(owner), relative.parts[0])  # as named there (an LMS folder in full)
            facts.setdefault(student_id(owner), {}).update(_lms_facts(relative))
        if path.suffix.lower() not in (".ipynb", ".zip"):
            if not (path.name == "timestamp.txt" and len(relative.parts) > 1):  # nbgrader's, read with the notebook
                others.append((_id_or_none(owner), relative, below))
            continue
        if owner is None:
            problems.append(Problem(str(relative), "a notebook at the top level: put it in a folder named after "
                                                   "the student (<student>/<lab>/<notebook>.ipynb)"))
            continue
        student = student_id(owner)
        own_folder = root / relative.parts[0] if len(relative.parts) > 1 else root
        if path.is_symlink() or any(p.is_symlink() for p in path.parents if own_folder in p.parents or p == own_folder):
            if _escapes(path, own_folder) or not path.is_file():
                problems.append(Problem(str(relative), "a link that leads out of the student's own folder: not "
                                                       "graded (submit the notebook itself)", student=student))
                continue
        if not path.is_file():
            continue
        if path.suffix.lower() == ".zip":
            inner = unpacked / "zips" / student / f"{len(found.get(student, []))}-{path.stem}"[:100]
            problems += [Problem(str(relative), p, student=student) for p in safe_extract(path, inner, budget)]
            for nb_relative in _files(inner) if inner.exists() else []:
                nb = inner / nb_relative
                if nb.suffix.lower() != ".ipynb" or nb.is_symlink() or not nb.is_file():
                    continue
                hidden = _hidden(nb_relative)
                if hidden == "hidden":
                    problems.append(Problem(f"{relative}:{nb_relative}", "in a hidden file or folder (its name "
                                            "starts with '.'): not graded; rename it", student=student))
                if hidden:
                    continue
                found.setdefault(student, []).append((nb, f"{relative}:{nb_relative}", below / nb_relative))
            continue
        found.setdefault(student, []).append((path, str(relative), below))

    if seen is not None:
        seen.update(raw_owners)
    if not files and not unreadable and not problems:
        problems.append(Problem(str(source), f"the {'zip' if source.is_file() else 'folder'} holds no files: "
                                             "nothing was graded; is it the right download?", of_the_run=True))
    for error in unreadable:
        problems.append(_unreadable(error, root))
    for student, relative, below in others:  # a student with no notebook at all: the wrong file is the reason
        if student is None or (student not in found and len(raw_owners.get(student, ())) == 1):
            if not (students and student not in students):
                problems.append(Problem(str(relative), _wrong_type(relative), student=student,
                                        lab=lab_of(below, labs) if student else None))
    for student, names in sorted(raw_owners.items()):
        if len(names) > 1:
            listed = ", ".join(sorted(printable(n) for n in names))
            problems.append(Problem(listed, f"these folders all become student id {student!r}: none of them was "
                                            "graded (rename them so their ids differ)", student=student))
            found.pop(student, None)
    for student in sorted(set(raw_owners) - set(found)):
        if students and student not in students:
            continue
        if len(raw_owners[student]) == 1 and not any(p.student == student for p in problems):
            problems.append(Problem(printable(on_disk.get(student, next(iter(raw_owners[student])))),
                                    "no notebook found", student=student))

    submissions = []
    strays: list = []  # (student, lab, origins, whether they have a notebook of a lab asked for)
    for student, notebooks in sorted(found.items()):
        if students and student not in students:
            continue
        per_lab: dict = {}
        for path, origin, below in notebooks:
            lab = lab_of(below, labs)
            if lab is None:
                problems.append(Problem(origin, f"cannot tell which lab this notebook is (labs: "
                                                f"{', '.join(sorted(labs))}); name it or its folder after the lab",
                                        student=student))
                continue
            per_lab.setdefault(lab, []).append((path, origin))
        asked_here = [lab for lab in per_lab if not only_labs or lab in only_labs]
        for lab, candidates in sorted(per_lab.items()):
            if labs_found is not None:
                labs_found.add(lab)
            if only_labs and lab not in only_labs:
                if facts.get(student, {}).get("lms"):  # an LMS's download is one assignment's: a stray, said
                    strays.append((student, lab, [o for _, o in candidates], bool(asked_here)))
                continue
            earlier = []  # Canvas's earlier uploads of the notebook graded: listed on it, never dropped unsaid
            if len(candidates) > 1:
                ordered = canvas_uploads_in_order(candidates)
                if ordered is None:
                    problems.append(Problem(", ".join(o for _, o in candidates),
                                            f"{len(candidates)} notebooks for {lab}: keep exactly one",
                                            student=student, lab=lab))
                    continue
                candidates, earlier = ordered[-1:], [printable(o) for _, o in ordered[:-1]]
            path, origin = candidates[0]
            submitted = _timestamp(path, root)
            then = (graded or {}).get((student, lab))
            if then and older_than_graded(printable(origin), submitted, then):
                problems.append(Problem(origin, f"older than the upload of {lab} graded before ({then[0]}): not "
                                                "graded, and the newer upload's grade stays. To grade this one in "
                                                f"its place: --students {student} --labs {lab} --force",
                                        student=student, lab=lab, older_upload=True))
                continue
            why = check_notebook(path)
            if why:
                if earlier:  # the student's latest word stands: an earlier upload is never graded in its place
                    why += (f"; it is Canvas's latest upload for {lab}, so the earlier uploads were not graded "
                            f"either: {', '.join(earlier)}")
                problems.append(Problem(origin, why, student=student, lab=lab))
                continue
            target = staging / student / lab / labs[lab]
            target.parent.mkdir(parents=True, exist_ok=True)
            _staged_copy(path, target)
            submissions.append(Submission(student, lab, target, printable(origin),
                                          late=facts.get(student, {}).get("late", False),
                                          lms_id=facts.get(student, {}).get("lms_id"),
                                          lms=facts.get(student, {}).get("lms"),
                                          submitted=submitted))
            if earlier:
                submissions[-1].warnings.append(f"Canvas's latest upload for {lab} was graded: {printable(origin)}; "
                                                f"not graded, as earlier uploads: {', '.join(earlier)}")
    # a file beside notebooks: a note on the notebook graded for its lab, else a problem of its own
    graded = {(s.student, s.lab): s for s in submissions}
    beside: dict = {}
    for student, relative, below in others:
        if student is None or student not in found or (students and student not in students):
            continue
        lab = lab_of(below, labs)
        if lab is not None and (student, lab) in graded:
            beside.setdefault((student, lab), []).append(printable(relative.name))
        elif not (only_labs and lab and lab not in only_labs):
            problems.append(Problem(str(relative), _wrong_type(relative), student=student, lab=lab))
    for key, names in beside.items():  # one note, however many files
        graded[key].warnings.append(f"also uploaded {', '.join(names[:5])}{' and more' if len(names) > 5 else ''}"
                                    ": not a notebook, not graded")
    problems += _strays(strays, submissions, sorted(only_labs or []), graded_before)
    for problem in problems:  # a problem told by the name on disk (a zip member, an unreadable folder)
        problem.student = renamed.get(problem.student, problem.student)
        said = facts.get(problem.student or "", {})
        if problem.lms_id is None and said.get("lms_id"):  # its LMS id, that the roster knows them by
            problem.lms_id, problem.lms = said["lms_id"], said.get("lms")
    shutil.rmtree(unpacked, ignore_errors=True)
    return submissions, problems


def _strays(strays: list, submissions: list, asked: list, graded_before: dict) -> list:
    """A notebook of a lab not asked for (``--labs``) in an LMS's download, which is one assignment's: uploaded to
    the wrong assignment, most likely. Never dropped unsaid: a note on the student's graded notebook of the lab
    asked for, or, where they have none, the reason their entry for it is "not graded" (not "missing"); a note of
    the run where the course folder graded that lab of theirs before (``graded_before``): that grade stays."""
    problems = []
    by_key = {(s.student, s.lab): s for s in submissions}
    one = asked[0] if len(asked) == 1 else None
    for student, lab, origins, has_asked in strays:
        named = ", ".join(printable(o) for o in origins)
        graded = [by_key[(student, a)] for a in asked if (student, a) in by_key]
        also = f"also uploaded a {lab} notebook ({named}): not graded in this run (--labs {' '.join(asked)})"
        if graded:
            graded[0].warnings.append(also)
        elif one is not None and (student, one) in graded_before:  # their graded lab stays as it is
            problems.append(Problem(named, also, student=student, lab=one, graded_before=True))
        elif has_asked:  # their notebook of the lab asked for is not graded either: its reason, and this
            problems.append(Problem(named, also, student=student, lab=one))
        else:
            problems.append(Problem(named, f"a {lab} notebook, in a download graded for {' '.join(asked)}: not "
                                           f"graded. Uploaded to the wrong assignment? If it is the student's "
                                           f"{one or 'work for this lab'}, rename it after that lab and run again; "
                                           f"if it is {lab}'s, it is graded with {lab}'s download",
                                    student=student, lab=one))
    return problems


def mixed_download(submissions: list) -> str | None:
    """Why an LMS's download (Canvas's or Moodle's: one assignment's) that holds notebooks of several labs cannot be
    graded without ``--labs``, or None: each stray notebook would open a lab of its own for the whole class (every
    other student "missing" there, 0 in the export) and leave its student "missing" in the lab uploaded to."""
    held: dict = {}
    for sub in submissions:
        if sub.lms:
            held.setdefault(sub.lab, []).append(sub.student)
    if len(held) < 2:
        return None
    counts = "; ".join(f"{lab}: {len(students)} ({', '.join(sorted(students)[:3])}"
                       f"{', ...' if len(students) > 3 else ''})" for lab, students in sorted(held.items()))
    return (f"this {'Canvas' if any(s.lms == 'canvas' for s in submissions) else 'Moodle'} download holds "
            f"notebooks of {len(held)} labs ({counts}), and an LMS's download is one assignment's: give --labs "
            "with the lab of the assignment it was downloaded from; a notebook of another lab is then listed, "
            "not graded")


def canvas_upload_number(origin: str) -> int | None:
    """Canvas's number of an upload (a later upload has a larger one) from its name in Canvas's download
    (``<student>_[LATE_]<id>_<upload>_<name>``, at the top of it; a notebook in an uploaded zip, ``<zip's
    name>:<member>``, is the zip's), or None."""
    upload = origin.split(":", 1)[0]
    if "/" in upload or _MOODLE_FILE.match(upload):
        return None
    canvas = _CANVAS_ID.match(upload)
    return int(canvas["file"]) if canvas else None


def older_than_graded(origin: str, submitted: str | None, graded: tuple) -> bool:
    """Whether an upload is older than the one graded (``graded``: its ``(origin, submitted)``), by what both say:
    Canvas's upload numbers, else the times they were handed in. Where neither tells, it is not."""
    then_origin, then_submitted = graded
    mine, theirs = canvas_upload_number(origin), canvas_upload_number(then_origin or "")
    if mine is not None and theirs is not None:
        return mine < theirs
    if submitted and then_submitted:
        from nbgrader.utils import parse_utc
        try:
            return parse_utc(submitted) < parse_utc(then_submitted)
        except Exception:  # noqa: BLE001 - a time that does not read as one tells nothing
            return False
    return False


def canvas_uploads_in_order(candidates: list):
    """A student's notebooks for one lab in Canvas's download, oldest first, or None where they are not one
    notebook uploaded again. Canvas renames a file uploaded again under a name it has (``lab0.ipynb``,
    ``lab0-1.ipynb``, ``lab0-2.ipynb``) and numbers every upload (``<student>_<id>_<upload>_<name>``, a later
    upload a larger number): the order is the ``-N`` (none: 0), and only where the upload numbers agree with it;
    other names (``lab0_final.ipynb``), files from a zip or folder, or orders that disagree give None."""
    uploads = []
    for path, origin in candidates:
        canvas = _CANVAS_ID.match(origin) if "/" not in origin and ":" not in origin else None
        copy = _CANVAS_COPY.match(canvas["rest"]) if canvas and not _MOODLE_FILE.match(origin) else None
        if copy is None:
            return None
        uploads.append((int(copy["copy"] or 0), int(canvas["file"]), copy["base"].lower(), (path, origin)))
    by_copy, by_upload = sorted(uploads, key=lambda u: u[0]), sorted(uploads, key=lambda u: u[1])
    if len({u[2] for u in uploads}) > 1 or len({u[0] for u in uploads}) < len(uploads) or by_copy != by_upload:
        return None
    return [u[3] for u in by_copy]


def _wrong_type(relative: Path) -> str:
    return (f"wrong file type: {printable(relative.name)!r} is not a Jupyter notebook (.ipynb); not graded. In "
            "Jupyter, File > Download saves the .ipynb to submit")


def _unreadable(error: OSError, root: Path) -> Problem:
    """A folder the walk could not read: whose it is, and why (a path past the system's limit, most often)."""
    try:
        relative = Path(os.fsdecode(error.filename)).relative_to(root)
    except (TypeError, ValueError):
        relative = Path(str(error.filename or "?"))
    owner = _owner(relative)[0] if relative.parts else None
    why = error.strerror or str(error)
    advice = "a path this long or this deep cannot be read: submit the notebook nearer the top" \
        if error.errno in (errno.ENAMETOOLONG, errno.ELOOP) else "it cannot be read"
    return Problem(str(relative)[:300] + ("…" if len(str(relative)) > 300 else ""),
                   f"not graded: {why}; {advice}", student=_id_or_none(owner))


def _zip_problem(source: Path, text: str, root: Path, unpacked_root: Path) -> Problem:
    """A problem of the class zip, given to the student whose entry it is where the member's name says."""
    member = getattr(text, "member", "")
    student = None
    if member:
        parts = Path(member).parts
        if root != unpacked_root and len(parts) > 1:  # the zip's one top folder is the class folder
            parts = parts[1:]
        if parts and not (len(parts) == 1 and _owner(Path(parts[0]))[0] is None):
            student = _id_or_none(_owner(Path(*parts))[0])
    return Problem(str(source), text, student=student)
