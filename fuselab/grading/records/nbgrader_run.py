"""nbgrader's side of grading: the course folder, each submission's autograde, the gradebook, the export.

The run's course folder (``<out>/course``) has its own ``source/`` (a copy of ``solutions/``), ``release/``,
``autograded/``, ``feedback/`` and ``gradebook.db``; the repository's folders are only read.

Each submission is autograded in a scratch course of its own (``<out>/work/<student>/<lab>/nbgrader``, with a
copy of the gradebook): the student's code runs inside that autograde, and must not reach the real gradebook or
anyone else's files. The trusted parent then records the final scores (the clean recheck's) in the course
gradebook, where formgrader, ``generate_feedback`` and ``export`` find them.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

from ...course import GRADER, REPO, SOLUTIONS, nbgrader
from ...kernelbuild import shared as shared_builds
from ..sandbox import isolate
from ..sandbox.untrusted import Folder, Refused


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
    """The run's course folder: the labs' sources, their release versions, a gradebook that knows them."""
    root.mkdir(parents=True, exist_ok=True)
    for lab in labs:
        target = root / "source" / lab
        fresh = not (target / notebook_name(lab)).exists() or \
            (target / notebook_name(lab)).read_bytes() != (SOLUTIONS / lab / notebook_name(lab)).read_bytes()
        if fresh or not (root / "release" / lab).exists():
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(SOLUTIONS / lab, target, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
            nbgrader("generate_assignment", lab, "--force", *course_args(root))


def set_due_dates(db: Path, due: dict) -> None:
    """Each lab's due date (``{lab: datetime in UTC}``) in the course gradebook, where nbgrader's late penalty
    and formgrader read it; a lab not given keeps the one it has."""
    if not due:
        return
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{db}") as gradebook:
        for lab, when in due.items():
            gradebook.update_or_create_assignment(lab, duedate=when)


def due_dates(db: Path) -> dict:
    """``{lab: due date (datetime, UTC)}`` of the labs the course gradebook has one for."""
    if not Path(db).exists():
        return {}
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{db}") as gradebook:
        return {a.name: a.duedate for a in gradebook.assignments if a.duedate is not None}


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


OUTPUT_LIMIT = 256 * 2**20  # what is read back of nbgrader's autograded notebook and gradebook
GATE_ENV = "FUSELAB_NOTEBOOK_GATE"
GATE_NAME = ".notebook-may-start"
STOP = "stop"  # what the gate file says when the notebook run must not go on (the recheck failed)
# An IPython startup file of the grader's, run in the notebook's kernel before its first cell (``gate``)
GATE_STARTUP = f"""# written by fuselab's grader: what the setup cell imports is imported while the clean recheck runs; the
# notebook's first cell waits until the grader opens the gate (the recheck's builds copied, its tests done)
import os as _fuselab_os, time as _fuselab_time
try:
    import torch as _fuselab_torch, fuselab as _fuselab_fuselab
    del _fuselab_torch, _fuselab_fuselab
except Exception:
    pass
while not _fuselab_os.path.exists(_fuselab_os.environ.get("{GATE_ENV}", "")):
    _fuselab_time.sleep(0.05)
with open(_fuselab_os.environ["{GATE_ENV}"]) as _fuselab_gate:
    if _fuselab_gate.read().strip() == "{STOP}":
        _fuselab_os._exit(3)  # the submission is not graded: no cell runs
del _fuselab_os, _fuselab_time, _fuselab_gate
"""


def open_gate(gate: Path, go: bool = True) -> None:
    """Let a gated notebook run go (``go``) or stop it: the gate file, made new (never through a link or over a
    file that is there: the folder is the notebook run's)."""
    gate.parent.mkdir(parents=True, exist_ok=True)
    written = gate.with_name(gate.name + f".{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        written.unlink()  # a link is removed, never followed
    descriptor = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "w") as handle:
        handle.write("go" if go else STOP)
    os.replace(written, gate)  # whole, at once: the kernel never reads it half written


def autograde_one(course_root: Path, student: str, lab: str, notebook: Path, workdir: Path, *, cell_timeout,
                  wall_timeout, limits: isolate.Limits, env: dict, sandbox=False, hide=(), lease=None,
                  gate: Path | None = None) -> dict:
    """nbgrader autograde of one submission in its own scratch course; returns the notebook's verdict.

    ``{"cells": {grade_id: [score or None, max]}, "autograded": path or None, "error": text or None, "seconds"}``;
    a score is None where nbgrader never scored the cell (it could not run the notebook to the end).

    ``gate``: a file (in a folder the run sees) that does not exist yet: nbgrader and the notebook's kernel start,
    import torch and fuselab, and the first cell waits until the file exists (the kernel's start may wait up to
    ``wall_timeout``).
    """
    scratch = workdir / "nbgrader"
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "source").mkdir(parents=True)
    shutil.copytree(course_root / "source" / lab, scratch / "source" / lab)
    shutil.copy(course_root / "gradebook.db", scratch / "gradebook.db")
    add_students(scratch / "gradebook.db", [student])
    submitted = scratch / "submitted" / student / lab
    submitted.mkdir(parents=True)
    shutil.copy(notebook, submitted / notebook_name(lab))
    runtime = scratch / "runtime"
    runtime.mkdir()
    env = dict(env, JUPYTER_RUNTIME_DIR=str(runtime), IPYTHONDIR=str(runtime / "ipython"),
               MPLCONFIGDIR=str(runtime / "mpl"), PYTHONDONTWRITEBYTECODE="1",
               # the kernel imports the grader's own fuselab, whatever else the environment has installed
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")])),
               PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""))
    command = [sys.executable, "-m", "nbgrader", "autograde", lab, "--student", student, "--force",
               *course_args(scratch), f"--Execute.timeout={int(cell_timeout)}",
               # the notebook is saved from nbgrader's own copy: the kernel need not tear down its GPU context first
               "--Execute.shutdown_kernel=immediate"]
    if gate is not None:
        startup = runtime / "ipython" / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-fuselab-gate.py").write_text(GATE_STARTUP)
        env[GATE_ENV] = str(gate)
        # the wait at the gate is bounded by the run's own wall limit (which leaves out pauses), not by nbclient's
        command.append(f"--Execute.startup_timeout={int(wall_timeout) * 10}")
    if sandbox:
        # only its scratch course and build cache: the submission's folder holds result.json, which it must not
        # write; nbgrader and its kernel talk over the sandbox's own loopback
        command = isolate.sandboxed(command, own=[scratch, Path(env["FUSELAB_CACHE_DIR"])], hide=list(hide),
                                    readonly=shared_builds.readonly(env))
    # nbgrader talks to its kernel over loopback: a bare network namespace (loopback down) would stop it, so
    # only bubblewrap (which brings loopback up) takes the network away here.
    limits = isolate.Limits(**{**limits.__dict__, "wall_s": wall_timeout, "no_network": False})
    started = time.time()
    outcome = isolate.run(command, limits=limits, env=env, cwd=str(GRADER), registry=lease)
    result = {"cells": {}, "autograded": None, "error": None, "seconds": outcome.seconds, "phases": {}}
    # its outputs are in the scratch course the student's run could write: read through ``untrusted`` into copies
    # of the grader's own beside it (``workdir``, which no sandbox writes), never opened where they lie
    graded = Path(workdir) / "autograded.ipynb"
    gradebook_copy = Path(workdir) / "nbgrader-gradebook.db"
    try:
        with Folder(workdir) as box:
            notebook_bytes = box.read_bytes(f"nbgrader/autograded/{student}/{lab}/{notebook_name(lab)}",
                                            OUTPUT_LIMIT)
            gradebook_bytes = box.read_bytes("nbgrader/gradebook.db", OUTPUT_LIMIT)
            box.remove(graded.name)
            if notebook_bytes is not None:
                box.write_bytes(graded.name, notebook_bytes)
            box.write_bytes(gradebook_copy.name, gradebook_bytes or b"")
    except Refused as exc:
        result["error"] = (f"nbgrader's output was replaced by a link, a special file or too much: not read "
                           f"({exc}; nbgrader {outcome.describe()})")
        return result
    if notebook_bytes is not None:
        result["autograded"] = str(graded)
        try:
            result["phases"] = phases(json.loads(notebook_bytes), started, started + outcome.seconds)
        except (ValueError, RecursionError):  # written by the student's run: any bytes at all
            pass
    if notebook_bytes is None:
        result["error"] = ("nbgrader could not run the notebook to the end (its kernel died or a cell hit the time "
                           f"limit; nbgrader {outcome.describe()})")
    elif not outcome.ok:
        result["error"] = f"nbgrader autograde {outcome.describe()}"
    try:
        from nbgrader.api import Gradebook, MissingEntry
        with Gradebook(f"sqlite:///{gradebook_copy}") as gradebook:
            submission = gradebook.find_submission(lab, student)
            for nb in submission.notebooks:
                for grade in nb.grades:
                    # a cell nbgrader never scored (the run stopped before it could save any) has no score, which
                    # its ``score`` reports as 0: that would read as the notebook run failing tests that passed
                    scored = grade.auto_score is not None or grade.manual_score is not None
                    result["cells"][grade.name] = [grade.score if scored else None, grade.max_score]
    except MissingEntry:
        result["error"] = (result["error"] or "nbgrader did not grade the notebook") + ": " + \
            (outcome.stdout + outcome.stderr).strip()[-800:]
    return result


def execution_span(cell) -> tuple | None:
    """``(started, ended)`` in epoch seconds of a code cell's last run, from the times nbclient records in its
    metadata; None where they are missing or malformed."""
    def stamp(text):
        try:
            return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except (AttributeError, TypeError, ValueError):
            return None
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    execution = metadata.get("execution") if isinstance(metadata, dict) else None
    if not isinstance(execution, dict):
        return None
    began, ended = stamp(execution.get("iopub.execute_input")), stamp(execution.get("shell.execute_reply"))
    return (began, ended) if began is not None and ended is not None and began <= ended else None


def phases(executed_nb: dict, started: float, ended: float) -> dict:
    """Where an autograde's time went, from the cells' execution times nbclient records: nbgrader and the
    kernel starting (before the first cell), the cells, and nbgrader finishing. Empty if they cannot be read.

    Only cells with code count (nbclient leaves an empty cell's metadata as the student's notebook had it), and
    only times inside the run: anything else in the metadata came from the submission.
    """
    times = []
    for cell in executed_nb.get("cells", []) if isinstance(executed_nb, dict) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code" or not str(cell.get("source", "")).strip():
            continue
        span = execution_span(cell)
        if span and all(started - 1 <= t <= ended + 1 for t in span):
            times.append(span)
    if not times:
        return {}
    first, last = min(a for a, _ in times), max(b for _, b in times)
    return {"start": round(first - started, 3), "cells": round(last - first, 3), "finish": round(ended - last, 3)}


def record(course_root: Path, student: str, lab: str, final: dict, notebook_copy: Path, timestamp=None,
           late_penalties=None) -> None:
    """Put one submission's final scores in the course gradebook and its notebook in ``autograded/``.

    ``final``: grade_id → points for the automatically graded cells. Written answers keep whatever a person gave
    them (formgrader); nothing a teaching assistant entered is overwritten. ``timestamp``: when it was handed
    in (ISO 8601, UTC), where the LMS said: with the lab's due date, nbgrader's late-penalty plugin
    (``late_penalties``, default ``late_penalty_plugin()``) sets the notebook's penalty as its autograde would.
    """
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.utils import parse_utc
    target = course_root / "autograded" / student / lab / notebook_name(lab)
    target.parent.mkdir(parents=True, exist_ok=True)
    if Path(notebook_copy).is_file():  # an earlier run's staged copy may be gone: the gradebook is what counts
        write_without_hidden_tests(Path(notebook_copy), target)
    with Gradebook(f"sqlite:///{course_root / 'gradebook.db'}") as gradebook:
        gradebook.update_or_create_student(student)
        try:
            gradebook.find_submission(lab, student)
        except MissingEntry:
            with warnings.catch_warnings():  # SQLAlchemy's autoflush chatter inside nbgrader, harmless
                warnings.simplefilter("ignore")
                gradebook.add_submission(lab, student)
        nb_name = Path(notebook_name(lab)).stem
        for grade_id, points in final.items():
            grade = gradebook.find_grade(grade_id, nb_name, lab, student)
            grade.auto_score = points
            grade.needs_manual_grade = False
        notebook = gradebook.find_submission_notebook(nb_name, lab, student)
        for grade in notebook.grades:
            if grade.name not in final and grade.auto_score is None and grade.manual_score is None:
                grade.needs_manual_grade = True  # a written answer waits for a person
        submission = gradebook.find_submission(lab, student)
        submission.timestamp = parse_utc(timestamp) if timestamp else None
        gradebook.db.commit()
        notebook.late_submission_penalty = None
        if submission.total_seconds_late > 0:
            assigner = late_penalties or late_penalty_plugin()
            penalty = assigner.plugin_inst.late_submission_penalty(student, notebook.score,
                                                                   submission.total_seconds_late)
            if penalty is not None:
                notebook.late_submission_penalty = min(max(penalty, 0), notebook.score)
        gradebook.db.commit()


HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"  # nbgrader's ClearHiddenTests delimiters


def write_without_hidden_tests(notebook: Path, target: Path) -> None:
    """``notebook`` into ``target`` (formgrader's ``autograded/``) with no hidden test in it: nbgrader's own
    "Generate feedback" renders that copy as it is (its feedback converter has no ClearHiddenTests), and
    "Release feedback" hands the page to the student. A hidden-test region is cut the way ClearHiddenTests cuts
    it (an unclosed one to the cell's end, never an error: the notebook is the student's), and the outputs of a
    cell that had one go with it. A notebook that is not JSON is copied as it is (nbgrader cannot show it)."""
    try:
        nb = json.loads(notebook.read_text())
        cells = nb["cells"]
        assert isinstance(cells, list)
    except (OSError, ValueError, KeyError, TypeError, AssertionError, RecursionError):
        shutil.copy(notebook, target)
        return
    for cell in cells:
        if not isinstance(cell, dict):
            continue
        text = cell.get("source", "")
        text = "".join(text) if isinstance(text, list) else str(text)
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
    target.unlink(missing_ok=True)
    target.write_text(json.dumps(nb, indent=1))


def export(course_root: Path, to: Path) -> None:
    nbgrader("export", *course_args(course_root), f"--CsvExportPlugin.to={to}", check=False)


def notebook_cells(path) -> dict:
    return json.loads(Path(path).read_text())


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
