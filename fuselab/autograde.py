"""Autograde notebooks with nbgrader in a scratch course folder, and read the scores back.

The course's own folders are never written: the scratch course gets a copy of ``solutions/`` as its source, its
own gradebook, and the submissions under ``submitted/<student>/<lab>/``. The GPU self-check uses this to prove
that the solutions score full marks and the blank labs score zero; the grader builds on it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .course import SOLUTIONS, nbgrader


def _overrides(workdir: Path) -> list:
    return [f"--CourseDirectory.root={workdir}", "--CourseDirectory.source_directory=source",
            "--CourseDirectory.release_directory=release", "--CourseDirectory.submitted_directory=submitted",
            "--CourseDirectory.autograded_directory=autograded", "--CourseDirectory.feedback_directory=feedback",
            f"--CourseDirectory.db_url=sqlite:///{workdir / 'gradebook.db'}"]


def autograde(submissions: dict, workdir, timeout=None) -> dict:
    """Grade ``{student: {lab: notebook path}}``; return ``{student: {lab: {"score", "max_score", "cells"}}}``.

    ``cells`` maps each graded cell's id to ``(score, max)``; ``autograded_score``/``autograded_max`` count only
    the code cells nbgrader scores itself (written answers wait for a person).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    args = _overrides(workdir)
    if timeout is not None:
        args.append(f"--Execute.timeout={int(timeout)}")
    labs = sorted({lab for per_student in submissions.values() for lab in per_student})
    for lab in labs:
        shutil.copytree(SOLUTIONS / lab, workdir / "source" / lab, dirs_exist_ok=True)
        nbgrader("generate_assignment", lab, "--force", *args)
    for student, per_student in submissions.items():
        nbgrader("db", "student", "add", student, *args[-1:])
        for lab, notebook in per_student.items():
            target = workdir / "submitted" / student / lab
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(notebook, target / next((SOLUTIONS / lab).glob("*.ipynb")).name)
    logs = {}
    for lab in labs:
        logs[lab] = nbgrader("autograde", lab, "--force", *args, check=False)
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
