"""What teaching assistants entered in formgrader, onto the graded results, for the class's outputs.

The course gradebook (``<out>/course/gradebook.db``) is where hand grading lives: formgrader writes a written
answer's score, a changed score of an autograded test, and comments there. The outputs step
(``pipeline.write_outputs``) reads them back on every run, so the next ``fuselab grade`` of the same ``--out``
puts them in ``grades.csv``, the report's totals and the feedback pages without regrading anything (a kept
result is never graded again). ``result.json`` never holds them: the gradebook stays the one place they are.

A cell's points are nbgrader's own rule (``Grade.score``): the hand-given score where a person gave one, else the
grader's, plus any extra credit a person gave.
The maxima are nbgrader's too: every hand-graded cell counts in a lab's maximum, graded yet or not.

Late work: the late penalty nbgrader's plugin gave a submission (``nbgrader_run.record``, as the course's
``grader/nbgrader_config.py`` configures it) is read back with the rest, so grades.csv, the report and the
feedback page show it and a total after it, the same total ``fuselab export`` gives the LMS.
"""

from __future__ import annotations

from pathlib import Path

from .results import SubmissionResult


def read(gradebook_db: Path) -> dict:
    """``{(student, lab): {grade_id: {"manual": score or None, "auto": nbgrader's score or None, "extra": extra
    credit (0 where none), "max": max points, "comment": text}}}``: what a person entered in formgrader, and
    nbgrader's own score beside it."""
    found: dict = {}
    for assignment, submission in _submissions(gradebook_db):
        cells = found.setdefault((submission.student_id, assignment.name), {})
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                cells[grade.name] = {"manual": grade.manual_score, "auto": grade.auto_score,
                                     "extra": grade.extra_credit or 0.0, "max": grade.max_score, "comment": ""}
            for comment in notebook.comments:
                if (comment.manual_comment or "").strip():
                    cells.setdefault(comment.name, {"manual": None, "auto": None, "extra": 0.0,
                                                    "max": None})["comment"] = \
                        comment.manual_comment
    return found


def score(cell: dict) -> float | None:
    """nbgrader's ``Grade.score`` of a cell as ``read`` gives it: the person's score, else nbgrader's own, plus any
    extra credit; None where neither is given (a written answer not graded yet)."""
    given = cell.get("manual") if cell.get("manual") is not None else cell.get("auto")
    return None if given is None else given + (cell.get("extra") or 0.0)


def late_penalties(gradebook_db: Path) -> dict:
    """``{(student, lab): points}``: nbgrader's late penalty of each submission that has one (its notebooks'
    ``late_submission_penalty``, summed as nbgrader's own export does)."""
    found: dict = {}
    for assignment, submission in _submissions(gradebook_db):
        penalty = submission.late_submission_penalty or 0.0
        if penalty > 0:
            found[(submission.student_id, assignment.name)] = float(penalty)
    return found


def _submissions(gradebook_db: Path):
    """``(assignment, submission)`` of every submission in nbgrader's gradebook (none where it has none yet)."""
    if not Path(gradebook_db).exists():
        return
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{gradebook_db}") as gradebook:
        for assignment in gradebook.assignments:
            for submission in assignment.submissions:
                yield assignment, submission


def apply(results: list, gradebook_db: Path) -> list:
    """``results`` (SubmissionResults) with the gradebook's hand grading applied: each result's ``hand_graded``
    (grade_id → points or None while ungraded, max_points, comment) and an autograded test a person re-scored or
    gave extra credit (``by_hand`` on its cell, and ``total``). Only these in-memory copies change; nothing is
    saved."""
    entered = read(gradebook_db)
    penalties = late_penalties(gradebook_db)
    applied = []
    for result in map(SubmissionResult.of, results):
        mine = entered.get((result.student, result.lab), {})
        for grade_id, cell in result.cells.items():
            entry = mine.get(grade_id) or {}
            manual, extra = entry.get("manual"), entry.get("extra") or 0.0
            points = (cell.points if manual is None else float(manual)) + extra
            if abs(points - cell.points) > 1e-9:
                cell.by_hand = {"points": points, "grader": cell.points}
                cell.points = points
        hand = {}
        for grade_id in result.manual_cells:
            entry = mine.get(grade_id) or {}
            hand[grade_id] = {"points": score(entry), "max_points": entry.get("max"),
                              "comment": entry.get("comment") or ""}
        result.hand_graded = hand
        result.late_penalty = penalties.get((result.student, result.lab), 0.0)
        # ``total`` stays the autograded tests' (a person's re-score included), ``max_total`` theirs: what the
        # sample check and the self-check's full marks compare; ``totals`` adds the written answers
        result.total = sum(c.points for c in result.cells.values())
        applied.append(result)
    return applied


def totals(result) -> tuple:
    """``(points, maximum)`` of a result with its hand-graded cells, less nbgrader's late penalty (never below 0),
    as nbgrader counts them: what ``grades.csv``, the report and ``fuselab export`` show (a written answer not
    graded yet counts 0 of its maximum)."""
    result = SubmissionResult.of(result)
    hand = hand_graded(result).values()
    points = result.total + sum(h["points"] or 0.0 for h in hand)
    return (max(0.0, points - (result.late_penalty or 0.0)) if result.late_penalty else points,
            result.max_total + sum(h["max_points"] or 0.0 for h in hand))


def hand_graded(result) -> dict:
    """grade_id → {"points", "max_points", "comment"} of a result's hand-graded cells (empty before ``apply``)."""
    return SubmissionResult.of(result).hand_graded
