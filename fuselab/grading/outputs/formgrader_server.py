"""The JupyterLab process of ``fuselab formgrader``: nbgrader's formgrader, with a run's graded submissions counted.

nbgrader counts an assignment's submissions in the course's ``submitted/`` folder. A run keeps each submission
only in ``autograded/`` (with its gradebook entry): nothing is in ``submitted/``, so formgrader's *Autograde*
finds nothing to run outside the grader's sandbox. Its *Manage Assignments* and *Manual Grading* pages would
then say 0 submissions for every lab (and offer no link to them); here a submission in the gradebook with its
``autograded/`` folder counts as submitted, and nothing else changes.
"""

from __future__ import annotations

import os
import sys


def count_autograded_as_submitted() -> None:
    """Make nbgrader's API count a run's submissions: one in the gradebook with its ``autograded/`` folder and no
    ``submitted/`` folder is submitted and autograded (nbgrader would see neither: it reads ``submitted/``, and
    an autograded submission's time there)."""
    from nbgrader.api import Student, SubmittedAssignment
    from nbgrader.apps.api import NbGraderAPI

    if getattr(NbGraderAPI, "fuselab_counts", False):
        return
    submitted, autograded = NbGraderAPI.get_submitted_students, NbGraderAPI.get_autograded_students

    def kept(self, assignment_id) -> set:
        if assignment_id == "*":
            return set()
        with self.gradebook as gb:
            graded = {sid for (sid,) in gb.db.query(Student.id).join(SubmittedAssignment)
                      .filter(SubmittedAssignment.name == assignment_id).all()}

        def folder(kind, sid):
            return os.path.isdir(self.coursedir.format_path(kind, student_id=sid, assignment_id=assignment_id))
        return {sid for sid in graded if folder(self.coursedir.autograded_directory, sid)
                and not folder(self.coursedir.submitted_directory, sid)}

    NbGraderAPI.get_submitted_students = lambda self, a: set(submitted(self, a)) | kept(self, a)
    NbGraderAPI.get_autograded_students = lambda self, a: set(autograded(self, a)) | kept(self, a)
    NbGraderAPI.fuselab_counts = True


def main() -> None:
    count_autograded_as_submitted()
    from jupyterlab.labapp import main as lab
    sys.argv[0] = "jupyter-lab"
    sys.exit(lab())


if __name__ == "__main__":
    main()
