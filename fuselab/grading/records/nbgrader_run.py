"""nbgrader's side of grading: the course folder, the gradebook, the export.

The run's course folder (``<out>/course``) has its own ``source/`` (a copy of ``solutions/``), ``release/``,
``autograded/``, ``feedback/`` and ``gradebook.db``; the repository's folders are only read. No student code runs
through nbgrader: the trusted grader records the clean recheck's scores in the course gradebook and each notebook
as submitted, hidden tests cut, in ``autograded/`` (``record``), where formgrader, ``generate_feedback`` and
``export`` find them. ``autograde`` is nbgrader's own run, for the GPU self-check's solutions and blank labs only.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

from ...course import GRADER, SOLUTIONS, generate_assignments, nbgrader
from .whole import write_whole


NBGRADER_CONFIG = GRADER / "nbgrader_config.py"  # the course's: its late-penalty plugin settings are used


def notebook_name(lab: str) -> str:
    return next((SOLUTIONS / lab).glob("*.ipynb")).name


def course_args(root: Path, db: Path | None = None, autograded="autograded") -> list:
    db = db or root / "gradebook.db"
    return [f"--CourseDirectory.root={root}", "--CourseDirectory.source_directory=source",
            "--CourseDirectory.release_directory=release", "--CourseDirectory.submitted_directory=submitted",
            f"--CourseDirectory.autograded_directory={autograded}", "--CourseDirectory.feedback_directory=feedback",
            f"--CourseDirectory.db_url=sqlite:///{db}", "--CourseDirectory.course_id=fuselab"]


def prepare_course(root: Path, labs) -> None:
    """The run's course folder: the labs' sources, their release versions, a gradebook that knows them. Only the
    labs whose source changed (or that have no release yet) are generated again, all in one nbgrader process."""
    root.mkdir(parents=True, exist_ok=True)
    stale = []
    for lab in labs:
        target = root / "source" / lab
        fresh = not (target / notebook_name(lab)).exists() or \
            (target / notebook_name(lab)).read_bytes() != (SOLUTIONS / lab / notebook_name(lab)).read_bytes()
        if fresh or not (root / "release" / lab / notebook_name(lab)).is_file():
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(SOLUTIONS / lab, target, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
            stale.append(lab)
    if stale:
        generate_assignments(stale, *course_args(root))


# One student's own due date for a lab (an extension), ``{"lab:student": ISO 8601 UTC}``, beside the gradebook:
# nbgrader keeps an extension on a submission, which a student who has not handed in yet does not have; each
# recording sets it from here (``_record_one``)
STUDENT_DUE = "student-due-dates.json"


def own_due_key(lab: str, student: str) -> str:
    """The key of ``student``'s own due date for ``lab`` among the due dates (``due_dates``)."""
    return f"{lab}:{student}"


def is_own_due(key: str) -> bool:
    """Whether a due dates' key is one student's own (``own_due_key``) rather than a lab's."""
    return ":" in key


def set_due_dates(db: Path, due: dict) -> None:
    """Each lab's due date (``{lab: datetime in UTC}``) in the course gradebook, where nbgrader's late penalty
    and formgrader read it; a lab not given keeps the one it has. A key ``"lab:student"`` is that student's own
    due date for the lab (``STUDENT_DUE``), kept until another is given."""
    if not due:
        return
    from nbgrader.api import Gradebook
    labs = {key: when for key, when in due.items() if not is_own_due(key)}
    if labs:
        with Gradebook(f"sqlite:///{db}") as gradebook:
            for lab, when in labs.items():
                gradebook.update_or_create_assignment(lab, duedate=when)
    own = {key: when.isoformat() for key, when in due.items() if is_own_due(key)}
    if own:
        path = Path(db).parent / STUDENT_DUE
        write_whole(path, json.dumps({**_student_due_texts(path), **own}, indent=1, sort_keys=True))


def _student_due_texts(path: Path) -> dict:
    try:
        kept = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in kept.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(kept, dict) else {}


def student_due_dates(course_root: Path) -> dict:
    """``{"lab:student": due date (datetime, UTC)}``: the students' own due dates (``STUDENT_DUE``)."""
    from datetime import datetime
    found = {}
    for key, text in _student_due_texts(Path(course_root) / STUDENT_DUE).items():
        try:
            found[key] = datetime.fromisoformat(text)
        except ValueError:
            continue
    return found


def due_dates(db: Path) -> dict:
    """``{lab: due date (datetime, UTC)}`` of the labs the course gradebook has one for, and ``{"lab:student":
    due date}`` of the students given their own (``student_due_dates``)."""
    if not Path(db).exists():
        return {}
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{db}") as gradebook:
        labs = {a.name: a.duedate for a in gradebook.assignments if a.duedate is not None}
    return {**labs, **student_due_dates(Path(db).parent)}


def late_penalty_plugin():
    """nbgrader's late-submission plugin as the course's ``grader/nbgrader_config.py`` configures it
    (``c.AssignLatePenalties.plugin_class``, ``c.LateSubmissionPlugin.penalty_method``), as autograde would."""
    from nbgrader.preprocessors import AssignLatePenalties
    from traitlets.config.loader import PyFileConfigLoader
    config = PyFileConfigLoader(NBGRADER_CONFIG.name, path=str(NBGRADER_CONFIG.parent)).load_config()
    assigner = AssignLatePenalties(config=config)
    assigner.init_plugin()
    return assigner


def add_students(db: Path, students) -> None:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{db}") as gradebook:
        for student in students:
            gradebook.update_or_create_student(student)


@dataclass(frozen=True)
class Recorded:
    """One submission's entry in the course gradebook: ``final`` is grade_id → points for the automatically
    graded cells; ``timestamp`` when it was handed in (ISO 8601, UTC), where the LMS said."""
    student: str
    lab: str
    final: dict
    notebook_copy: object = None
    timestamp: str | None = None


def record(course_root: Path, entries, late_penalties=None, progress=None) -> list:
    """Put each submission's final scores (``Recorded``) in the course gradebook and its notebook in
    ``autograded/``; returns the hand grades set aside (``SetAside``).

    Written answers keep whatever a person gave them (formgrader), as long as the notebook is the one they were
    given on. A new upload sets aside (``_set_aside``) a hand grade or comment of a cell whose text changed, and a
    re-scored test whose grader's score changed: the cell waits for a person again, and what they had entered is
    kept in ``SET_ASIDE`` (the course folder) and said in the report. With a submission's timestamp and the lab's
    due date, nbgrader's late-penalty plugin (``late_penalties``, default ``late_penalty_plugin()``) sets the
    notebook's penalty as its autograde would.
    One gradebook is opened for all: SQLAlchemy caches its compiled queries per engine, and a gradebook opened per
    submission compiled each again (36 ms a submission on the H200 machine; re-recording 30 submissions on the
    2-core machine took 2.2 s that way, 0.33 s through one opening). ``progress``: called once per entry recorded.
    """
    from nbgrader.api import Gradebook
    set_aside: list = []
    own_due = student_due_dates(course_root)
    releases: dict = {}  # lab → its release notebook's graded cells, read once
    with Gradebook(f"sqlite:///{course_root / 'gradebook.db'}") as gradebook:
        assigner = None
        for entry in entries:
            target = course_root / "autograded" / entry.student / entry.lab / notebook_name(entry.lab)
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry.notebook_copy and Path(entry.notebook_copy).is_file():  # an earlier run's copy may be gone
                if entry.lab not in releases:
                    release = course_root / "release" / entry.lab / notebook_name(entry.lab)
                    releases[entry.lab] = graded_cells(release)
                    if not releases[entry.lab]:  # every hand grade would look stale and be set aside: stop
                        raise RuntimeError(f"{release} cannot be read or has no graded cells: nothing was recorded; "
                                           "remove that folder and run again (it is made again from solutions/)")
                copy = formgrader_copy(Path(entry.notebook_copy), releases[entry.lab])
                set_aside += _set_aside(gradebook, entry, _cell_texts(target), _cell_texts(copy))
                _write_copy(copy, target)
            notebook, seconds_late = _record_one(gradebook, entry, own_due.get(own_due_key(entry.lab, entry.student)))
            notebook.late_submission_penalty = None
            if seconds_late > 0:
                assigner = assigner or late_penalties or late_penalty_plugin()
                penalty = assigner.plugin_inst.late_submission_penalty(entry.student, notebook.score, seconds_late)
                if penalty is not None:
                    notebook.late_submission_penalty = min(max(penalty, 0), notebook.score)
            gradebook.db.commit()
            if progress is not None:
                progress()
    if set_aside:  # appended, never rewritten: a hand grade is the TA's work
        with open(course_root / SET_ASIDE, "a", encoding="utf-8") as log:
            for item in set_aside:
                log.write(json.dumps(item.__dict__) + "\n")
    return set_aside


SET_ASIDE = "hand-grades-set-aside.jsonl"  # in the course folder: every hand grade a new upload set aside


@dataclass(frozen=True)
class SetAside:
    """A hand grade (or comment) given on an earlier upload of ``student``'s ``lab``, set aside by a new one."""
    student: str
    lab: str
    cell: str
    points: float | None
    comment: str
    why: str
    extra_credit: float = 0.0  # formgrader's extra credit on the cell, set aside with its score


def set_aside_waiting(course_root: Path) -> list:
    """The hand grades set aside (``SET_ASIDE``) that nobody has graded again: each cell's last record, while the
    gradebook holds no hand score on that cell (nor, for a comment alone, a comment). A TA's decision is theirs
    to enter, so the report says each one until it is (for a test, the grader's score entered by hand keeps it)."""
    from nbgrader.api import Gradebook, MissingEntry
    try:
        lines = (course_root / SET_ASIDE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    last: dict = {}
    for line in lines:
        try:
            item = SetAside(**json.loads(line))
        except (ValueError, TypeError):
            continue
        last[(item.student, item.lab, item.cell)] = item
    if not last:
        return []
    waiting = []
    with Gradebook(f"sqlite:///{course_root / 'gradebook.db'}") as gradebook:
        for item in last.values():
            try:
                notebook = gradebook.find_submission_notebook(Path(notebook_name(item.lab)).stem, item.lab,
                                                              item.student)
            except (MissingEntry, ValueError):  # a lab or student the gradebook no longer has
                continue
            scored = any(g.name == item.cell and g.manual_score is not None for g in notebook.grades)
            commented = any(c.name == item.cell and (c.manual_comment or "").strip() for c in notebook.comments)
            if not (scored or (item.points is None and commented)):
                waiting.append(item)
    return waiting


def _cell_texts(notebook) -> dict | None:
    """grade_id → source text of a formgrader copy (a path, or the notebook itself); None where there is none."""
    if isinstance(notebook, Path):
        try:
            notebook = json.loads(notebook.read_text())
        except (OSError, ValueError, RecursionError):
            return None
    texts = {}
    for cell in notebook.get("cells", []) if isinstance(notebook, dict) else []:
        grade_id = ((cell.get("metadata") or {}).get("nbgrader") or {}).get("grade_id")
        if isinstance(grade_id, str):
            source = cell.get("source", "")
            texts[grade_id] = "".join(source) if isinstance(source, list) else str(source)
    return texts


def _set_aside(gradebook, entry, before: dict | None, now: dict) -> list:
    """What a person entered on ``entry``'s earlier upload that the new one makes stale, taken out of the gradebook
    (``SetAside`` records): a score or comment on a cell whose text changed (the answer it judged is gone: the cell
    waits for a person again), and a test re-scored by hand whose grader's score changed (the fix it judged is
    graded now). Nothing where the notebook is the one they graded (a run that records the course again) or where
    there was none before."""
    from nbgrader.api import MissingEntry
    if before is None or before == now:
        return []
    try:
        notebook = gradebook.find_submission_notebook(Path(notebook_name(entry.lab)).stem, entry.lab, entry.student)
    except MissingEntry:
        return []
    comments = {c.name: c for c in notebook.comments if (c.manual_comment or "").strip()}
    found = []
    for grade in notebook.grades:
        changed = before.get(grade.name) != now.get(grade.name)
        comment = comments.pop(grade.name, None)
        text = comment.manual_comment if comment is not None else ""
        if grade.name in entry.final:  # a test: its score is the grader's, a person's only where they re-scored it
            rescored = grade.manual_score is not None and grade.auto_score is not None and \
                abs(grade.auto_score - entry.final[grade.name]) > 1e-9
            if not rescored:
                continue
            why = (f"re-scored by hand where the grader gave {grade.auto_score:g}; the new upload scores "
                   f"{entry.final[grade.name]:g}")
        elif changed and (grade.manual_score is not None or comment is not None):
            why = "the answer changed in the new upload"
        else:
            continue
        found.append(SetAside(entry.student, entry.lab, grade.name, grade.manual_score, text, why,
                              grade.extra_credit or 0.0))
        grade.manual_score = None
        grade.extra_credit = None  # given on the answer or fix now gone, as the score was
        if comment is not None:
            comment.manual_comment = None
    for name, comment in comments.items():  # a comment on an answer cell of no grade (a solution cell's)
        if before.get(name) != now.get(name):
            found.append(SetAside(entry.student, entry.lab, name, None, comment.manual_comment,
                                  "the cell changed in the new upload"))
            comment.manual_comment = None
    return found


def _record_one(gradebook, entry: Recorded, own_due=None):
    """``entry``'s scores and timestamp into an open gradebook, committed; its notebook and seconds late.
    ``own_due``: the student's own due date for the lab, nbgrader's extension of the lab's (which its late
    penalty and formgrader read)."""
    from nbgrader.api import MissingEntry
    from nbgrader.utils import parse_utc
    student, lab = entry.student, entry.lab
    gradebook.update_or_create_student(student)
    try:
        gradebook.find_submission(lab, student)
    except MissingEntry:
        with warnings.catch_warnings():  # SQLAlchemy's autoflush chatter inside nbgrader, harmless
            warnings.simplefilter("ignore")
            gradebook.add_submission(lab, student)
    nb_name = Path(notebook_name(lab)).stem
    for grade_id, points in entry.final.items():
        grade = gradebook.find_grade(grade_id, nb_name, lab, student)
        grade.auto_score = points
        grade.needs_manual_grade = False
    notebook = gradebook.find_submission_notebook(nb_name, lab, student)
    for grade in notebook.grades:
        if grade.name not in entry.final and grade.auto_score is None and grade.manual_score is None:
            grade.needs_manual_grade = True  # a written answer waits for a person
    submission = gradebook.find_submission(lab, student)
    submission.timestamp = parse_utc(entry.timestamp) if entry.timestamp else None
    if own_due is not None and submission.assignment.duedate is not None:
        submission.extension = own_due - submission.assignment.duedate
    gradebook.db.commit()
    return notebook, submission.total_seconds_late


HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"  # nbgrader's ClearHiddenTests delimiters


def write_without_hidden_tests(notebook: Path, target: Path, release: Path) -> None:
    """``notebook`` into ``target`` as ``formgrader_copy`` makes it, its graded cells those of ``release``."""
    _write_copy(formgrader_copy(notebook, graded_cells(release)), target)


def _write_copy(copy: dict, target: Path) -> None:
    target.unlink(missing_ok=True)  # a new file, never through whatever stands at that name
    target.write_text(json.dumps(copy, indent=1))


def graded_cells(release: Path) -> dict:
    """grade_id → cell of the lab's release notebook (the course folder's own, made by nbgrader from
    ``solutions/``): the graded cells a formgrader copy may have. Empty where it cannot be read."""
    try:
        cells = json.loads(Path(release).read_text())["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    found = {}
    for cell in cells:
        grading = cell.get("metadata", {}).get("nbgrader") or {}
        if isinstance(grading.get("grade_id"), str):
            found.setdefault(grading["grade_id"], cell)
    return found


def _graded_as_released(cells: list, release: dict) -> None:
    """Each cell's nbgrader metadata (which grade it is, its points, whether a person scores it), and a locked
    cell's text, made the release's: formgrader builds its score boxes, their maximum and their ids from the
    copy's metadata, and a person's score on a test replaces the grader's, so a student who moved a test's grade
    id onto their written answer (or wrote a cell of their own with it) would have the TA score that test there.
    A cell keeps a grade only where the release has that grade id, once (the last copy, as nbgrader's own
    ``DeduplicateIds`` keeps it and as the clean recheck runs it), and takes the release's cell type with it; any
    other cell's nbgrader metadata is dropped. A locked cell (a visible test, an
    instruction) shows the release's text, as nbgrader's own autograde restores it (``OverwriteCells``)."""
    taken = set()
    for cell in reversed(cells):  # the last copy of an id is the one graded
        if not isinstance(cell, dict):
            continue
        metadata = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        grading = metadata.get("nbgrader") if isinstance(metadata.get("nbgrader"), dict) else {}
        grade_id = grading.get("grade_id")
        released = release.get(grade_id) if isinstance(grade_id, str) and grade_id not in taken else None
        metadata = {k: v for k, v in metadata.items() if k != "nbgrader"}
        cell["metadata"] = metadata
        if released is None:
            continue
        taken.add(grade_id)
        truth = released["metadata"]["nbgrader"]
        metadata["nbgrader"] = dict(truth)
        if released.get("cell_type") != cell.get("cell_type"):
            cell["cell_type"] = released.get("cell_type")
            cell.pop("outputs", None)
        if truth.get("locked") and not truth.get("solution"):
            cell["source"] = released.get("source", "")


def formgrader_copy(notebook: Path, release: dict) -> dict:
    """``notebook`` as formgrader's ``autograded/`` holds it: with no hidden test in it and nothing that runs
    in a browser (``inert``): nbgrader's formgrader and "Generate feedback" render that copy with nbconvert as it
    is, at the Jupyter server's own address (its feedback converter has no ClearHiddenTests, and neither
    sanitises a notebook: a student's HTML output, markdown or cell metadata would run as script in the teaching
    assistant's formgrader, with their server's rights). A hidden-test region is cut the way ClearHiddenTests
    cuts it (an unclosed one to the cell's end, never an error: the notebook is the student's), and the outputs
    of a cell that had one go with it. Its graded cells are the release's (``release``, from ``graded_cells``:
    ``_graded_as_released``). A notebook that is not JSON is written as an empty notebook (nbgrader could not
    show it anyway)."""
    try:
        nb = json.loads(notebook.read_text())
        cells = nb["cells"]
        assert isinstance(cells, list)
    except (OSError, ValueError, KeyError, TypeError, AssertionError, RecursionError):
        nb, cells = {"cells": []}, []
    for cell in cells:
        if not isinstance(cell, dict):
            continue
        text = cell.get("source", "")
        text = "".join(str(t) for t in text) if isinstance(text, list) else str(text)
        kept, hidden, cut = [], False, False
        for line in text.split("\n"):
            if HIDDEN_BEGIN in line:
                hidden = cut = True
            elif HIDDEN_END in line and hidden:
                hidden = False
            elif not hidden:
                kept.append(line)
        if cut:
            cell["source"] = "\n".join(kept)
            if "outputs" in cell:
                cell["outputs"] = []
    _graded_as_released(cells, release)
    return inert(nb)


# what of a student's notebook nbconvert may put into formgrader's page: text it escapes, and images it can only
# show (a PNG or JPEG as base64, which it writes into an attribute unescaped: checked to be base64)
SHOWN_IMAGES = ("image/png", "image/jpeg")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
_GRADE_ID = re.compile(r"[A-Za-z0-9_\-]{1,200}")  # nbgrader's own rule for a grade id
_NBGRADER_FLAGS = ("grade", "solution", "locked", "task")
PYTHON_METADATA = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}


def inert(nb: dict) -> dict:
    """A student's notebook as formgrader may render it: nothing in it becomes markup, script or a link.

    nbconvert (formgrader's page, "Generate feedback") writes into the page unescaped a markdown cell's HTML and
    links (``javascript:``), HTML, SVG, JavaScript, markdown and LaTeX outputs, an image's data and size, a cell's
    tags, id and grade id, and the widget state in the notebook's metadata. So every cell is rebuilt from what
    is allowed: a code cell's source (highlighted, escaped) and its outputs as text (``text/plain``, streams,
    tracebacks: escaped) and PNG/JPEG images whose data is base64; a markdown or raw cell's source as text (a
    code block: a written answer reads as the student typed it); nbgrader's metadata with a grade id of
    nbgrader's own characters, its flags as booleans and its points as a number. Nothing else is kept."""
    cells = nb.get("cells") if isinstance(nb, dict) else None
    return {"nbformat": 4, "nbformat_minor": 4, "metadata": dict(PYTHON_METADATA),
            "cells": [_inert_cell(c) if isinstance(c, dict) else c for c in cells or [] if isinstance(cells, list)]}


def _text(value) -> str:
    return "".join(str(v) for v in value) if isinstance(value, list) else ("" if value is None else str(value))


def _as_text_block(text: str) -> str:
    """``text`` as a markdown code block that nothing in it can close: shown as written, never parsed."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _inert_cell(cell: dict) -> dict:
    kind = cell.get("cell_type")
    source = _text(cell.get("source", ""))
    metadata = {}
    grading = cell.get("metadata", {}).get("nbgrader") if isinstance(cell.get("metadata"), dict) else None
    if isinstance(grading, dict):
        kept = {flag: grading[flag] for flag in _NBGRADER_FLAGS if isinstance(grading.get(flag), bool)}
        if isinstance(grading.get("grade_id"), str) and _GRADE_ID.fullmatch(grading["grade_id"]):
            kept["grade_id"] = grading["grade_id"]
        points = grading.get("points")
        if isinstance(points, (int, float)) and not isinstance(points, bool) and math.isfinite(points):
            kept["points"] = points
        elif kept.get("grade") or kept.get("task"):
            kept["points"] = 0  # nbgrader's page needs a graded cell's points (the gradebook holds the real ones)
        if isinstance(grading.get("schema_version"), int) and not isinstance(grading["schema_version"], bool):
            kept["schema_version"] = grading["schema_version"]
        metadata["nbgrader"] = kept
    if kind != "code":
        return {"cell_type": "markdown", "metadata": metadata, "source": _as_text_block(source)}
    count = cell.get("execution_count")
    outputs = cell.get("outputs") if isinstance(cell.get("outputs"), list) else []
    return {"cell_type": "code", "metadata": metadata, "source": source,
            "execution_count": count if isinstance(count, int) and not isinstance(count, bool) else None,
            "outputs": [shown for shown in map(_inert_output, outputs) if shown is not None]}


def _inert_output(output) -> dict | None:
    if not isinstance(output, dict):
        return None
    kind = output.get("output_type")
    if kind == "stream":
        name = output.get("name") if output.get("name") in ("stdout", "stderr") else "stdout"
        return {"output_type": "stream", "name": name, "text": _text(output.get("text"))}
    if kind == "error":
        lines = output.get("traceback") if isinstance(output.get("traceback"), list) else []
        return {"output_type": "error", "ename": _text(output.get("ename")), "evalue": _text(output.get("evalue")),
                "traceback": [_text(line) for line in lines]}
    if kind not in ("display_data", "execute_result"):
        return None
    data = output.get("data") if isinstance(output.get("data"), dict) else {}
    shown = {}
    for image in SHOWN_IMAGES:
        encoded = _text(data.get(image))
        if encoded and _BASE64.fullmatch(encoded):
            shown[image] = encoded
    # HTML, SVG, JavaScript, markdown, LaTeX: as their text (the feedback page shows them so too)
    text = data.get("text/plain")
    if text is None:
        text = next((data[kind] for kind in sorted(data) if kind not in SHOWN_IMAGES and
                     isinstance(data[kind], (str, list))), None)
    if text is not None or not shown:
        shown["text/plain"] = _text(text)
    made = {"output_type": kind, "data": shown, "metadata": {}}
    if kind == "execute_result":
        count = output.get("execution_count")
        made["execution_count"] = count if isinstance(count, int) and not isinstance(count, bool) else None
    return made


def export(course_root: Path, to: Path) -> str | None:
    """nbgrader's own CSV export of the course's gradebook to ``to``; why it failed, or None. A failed export
    leaves the file of an earlier run in place, which the run must say rather than pass off as today's."""
    done = nbgrader("export", *course_args(course_root), f"--CsvExportPlugin.to={to}", check=False)
    if done.returncode == 0:
        return None
    said = (done.stderr or done.stdout or "").strip().splitlines()
    left = "is still an earlier run's" if Path(to).exists() else "is not written"
    return (f"nbgrader's export failed (status {done.returncode}): {said[-1] if said else 'it said nothing'}; "
            f"{Path(to).name} {left}")


def autograde(submissions: dict, workdir, timeout=None) -> dict:
    """nbgrader's autograde of ``{student: {lab: notebook path}}`` in a scratch course under ``workdir``, unsandboxed
    and with no recheck: the GPU self-check's proof that the solutions score full marks and the blank labs zero.

    Returns ``{student: {lab: {"score", "max_score", "cells"}}}``; ``cells`` maps each graded cell's id to
    ``(score, max)``; ``autograded_score``/``autograded_max`` count only the code cells nbgrader scores itself
    (written answers wait for a person).
    """
    workdir = Path(workdir)
    args = course_args(workdir)
    if timeout is not None:
        args.append(f"--Execute.timeout={int(timeout)}")
    labs = sorted({lab for per_student in submissions.values() for lab in per_student})
    prepare_course(workdir, labs)
    add_students(workdir / "gradebook.db", submissions)
    for student, per_student in submissions.items():
        for lab, notebook in per_student.items():
            target = workdir / "submitted" / student / lab
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(notebook, target / notebook_name(lab))
    logs = {lab: nbgrader("autograde", lab, "--force", *args, check=False) for lab in labs}
    return read_scores(workdir, submissions, logs)


def read_scores(workdir: Path, submissions: dict, logs=None) -> dict:
    from nbgrader.api import Gradebook
    scores = {}
    with Gradebook(f"sqlite:///{workdir / 'gradebook.db'}") as gradebook:
        for student, per_student in submissions.items():
            for lab in per_student:
                try:
                    submission = gradebook.find_submission(lab, student)
                except Exception as exc:  # noqa: BLE001 - nbgrader raises MissingEntry; report, don't crash
                    log = logs.get(lab) if logs else None
                    scores.setdefault(student, {})[lab] = {
                        "score": None, "max_score": None, "cells": {},
                        "error": f"not graded: {exc}; {(log.stdout + log.stderr)[-1500:] if log else ''}"}
                    continue
                cells, auto, auto_max = {}, 0.0, 0.0
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        cells[grade.name] = (grade.score, grade.max_score)
                        if grade.cell.cell_type == "code":  # markdown answers are graded by hand
                            auto += grade.score or 0.0
                            auto_max += grade.max_score
                scores.setdefault(student, {})[lab] = {"score": submission.score, "max_score": submission.max_score,
                                                       "autograded_score": auto, "autograded_max": auto_max,
                                                       "cells": cells}
    return scores
