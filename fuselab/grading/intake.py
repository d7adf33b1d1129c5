"""Intake: a folder or zip of submissions → one notebook per (student, lab), and a list of what was wrong.

Accepted layouts (mixed freely):

- ``<root>/<student>/<lab>/<notebook>.ipynb`` (nbgrader's own layout) or ``<root>/<student>/<lab>.ipynb``;
- ``<root>/<student>.zip`` holding that student's files, in any of the layouts above;
- an LMS bulk download, as a folder or a zip: Canvas names files ``<student>_<id>_<id>_<original name>``
  (``<student>_LATE_<id>_...`` when late), Moodle makes a folder ``<Full Name>_<id>_assignsubmission_file_``.

The lab a notebook belongs to is the nearest folder named after a lab, else its file name (``lab0.ipynb``,
``lab0-1.ipynb``, ``Lab0 (2).ipynb``). A malformed submission (not a notebook, an unknown lab, two notebooks
for one lab, an unsafe zip) becomes a ``Problem`` listed in the report; it never stops the others.
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_UNZIPPED_BYTES = 500 * 2**20  # a class's notebooks are a few MB each; more is a zip bomb or a mistake
MAX_ZIP_MEMBERS = 20_000
_IGNORED = ("__MACOSX", ".ipynb_checkpoints", ".DS_Store")
_CANVAS = re.compile(r"^(?P<student>[^_]+)_(?:LATE_)?\d+_\d+_(?P<rest>.+)$")
_MOODLE = re.compile(r"^(?P<student>.+?)_\d+_assignsubmission_\w*?_?$")


@dataclass
class Submission:
    student: str
    lab: str
    notebook: Path          # the copy in the staging folder
    origin: str             # where it came from, for messages
    warnings: list = field(default_factory=list)


@dataclass
class Problem:
    where: str
    message: str
    student: str | None = None
    lab: str | None = None


def student_id(raw: str) -> str:
    """An nbgrader-safe student id: letters, digits, ``_ . -``; case kept."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", raw.strip()).strip("._")
    return cleaned or "unnamed"


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


def safe_extract(archive: Path, target: Path) -> list:
    """Unzip ``archive`` into ``target``; refuse absolute paths, ``..``, links and zip bombs. Returns problems."""
    problems = []
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            if len(members) > MAX_ZIP_MEMBERS:
                return [f"{archive.name}: {len(members)} files is too many for a submission; not unpacked"]
            total = sum(m.file_size for m in members)
            if total > MAX_UNZIPPED_BYTES:
                return [f"{archive.name}: unpacks to {total / 2**20:.0f} MB (limit {MAX_UNZIPPED_BYTES >> 20} MB); "
                        "not unpacked"]
            for member in members:
                name = member.filename
                if name.startswith("/") or ".." in Path(name).parts or ":" in Path(name).parts[0]:
                    problems.append(f"{archive.name}: skipped unsafe path {name!r}")
                    continue
                if (member.external_attr >> 16) & 0o170000 == 0o120000:
                    problems.append(f"{archive.name}: skipped symbolic link {name!r}")
                    continue
                zf.extract(member, target)
    except zipfile.BadZipFile:
        problems.append(f"{archive.name}: not a readable zip file")
    return problems


def check_notebook(path: Path) -> str | None:
    """Why ``path`` is not a gradable notebook, or None."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"not a valid notebook (JSON: {exc})"
    if not isinstance(nb, dict) or nb.get("nbformat") != 4 or not isinstance(nb.get("cells"), list):
        return "not a Jupyter notebook in format 4"
    return None


def _visible(path: Path) -> bool:
    return not any(p.startswith(".") and p not in (".", "..") or p in _IGNORED for p in path.parts)


def _owner(relative: Path):
    """Student name of a file at ``relative`` (from the root) and the part of the path below the student."""
    first = relative.parts[0]
    if len(relative.parts) == 1:
        match = _CANVAS.match(first)
        if match:
            return match["student"], Path(match["rest"])
        return None, relative
    moodle = _MOODLE.match(first)
    return (moodle["student"] if moodle else first), Path(*relative.parts[1:])


def collect(source: Path, staging: Path, labs: dict, students=None, only_labs=None):
    """Find every submission under ``source`` (a folder or a zip) and copy it to ``staging/<student>/<lab>/``.

    ``labs``: ``{lab: notebook file name}`` of the course. Returns ``(submissions, problems)``.
    """
    source = Path(source)
    staging = Path(staging)
    unpacked = staging.parent / (staging.name + "-unpacked")
    shutil.rmtree(unpacked, ignore_errors=True)
    problems: list = []
    if not source.exists():
        raise FileNotFoundError(f"no such folder or zip: {source}")
    if source.is_file():
        root = unpacked / "root"
        problems += [Problem(str(source), p) for p in safe_extract(source, root)]
        entries = [p for p in root.iterdir()] if root.exists() else []
        if len(entries) == 1 and entries[0].is_dir() and not _CANVAS.match(entries[0].name) \
                and entries[0].name.lower() not in labs and any(p.is_dir() for p in entries[0].iterdir()):
            root = entries[0]  # a zip of the submissions folder itself
    else:
        root = source

    found: dict = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if not path.is_file() or not _visible(relative):
            continue
        owner, below = _owner(relative)
        if path.suffix.lower() == ".zip":
            if owner is None:  # <student>.zip at the top
                owner, below = path.stem, Path()
            inner = unpacked / "zips" / student_id(owner) / path.stem
            problems += [Problem(str(relative), p, student=student_id(owner)) for p in safe_extract(path, inner)]
            for nb in sorted(inner.rglob("*.ipynb")):
                if _visible(nb.relative_to(inner)):
                    found.setdefault(student_id(owner), []).append((nb, f"{relative}:{nb.relative_to(inner)}",
                                                                  below / nb.relative_to(inner)))
            continue
        if path.suffix.lower() != ".ipynb":
            continue
        if owner is None:
            problems.append(Problem(str(relative), "a notebook at the top level: put it in a folder named after "
                                                   "the student (<student>/<lab>/<notebook>.ipynb)"))
            continue
        found.setdefault(student_id(owner), []).append((path, str(relative), below))

    submissions = []
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
        for lab, candidates in sorted(per_lab.items()):
            if only_labs and lab not in only_labs:
                continue
            if len(candidates) > 1:
                problems.append(Problem(", ".join(o for _, o in candidates),
                                        f"{len(candidates)} notebooks for {lab}: keep exactly one",
                                        student=student, lab=lab))
                continue
            path, origin = candidates[0]
            why = check_notebook(path)
            if why:
                problems.append(Problem(origin, why, student=student, lab=lab))
                continue
            target = staging / student / lab / labs[lab]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            submissions.append(Submission(student, lab, target, origin))
    shutil.rmtree(unpacked, ignore_errors=True)
    return submissions, problems
