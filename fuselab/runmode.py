"""Who is running this notebook: a student, the course's grader, or ``nbgrader validate``.

The student runtime reads it (heavy demo cells skip themselves while grading or validating); the speed test reads
it to decide between "measured when the course grades" and a score. The grader sets ``FUSELAB_GRADING``.
"""

import os

GRADING_ENV = "FUSELAB_GRADING"
VALIDATING_ENV = "NBGRADER_VALIDATING"  # nbgrader validate (and JupyterLab's Validate button) sets it in the kernel
# the grader's run of the instructor's own notebook (the reference run, calibration): its kernels load in the checker
INSTRUCTORS_RUN_ENV = "FUSELAB_KERNELS_IN_CHECKER"


def grading_mode() -> bool:
    """True while the grader or ``nbgrader validate`` runs a notebook: heavy demo cells (sweeps, torch.compile)
    skip themselves. Validate runs the whole notebook to say whether it would pass, not to show the demos."""
    return graded_by_the_course() or validating()


def graded_by_the_course() -> bool:
    """True while fuselab's grader runs a notebook (its scores count)."""
    return os.environ.get(GRADING_ENV, "") not in ("", "0")


def validating() -> bool:
    """True under ``nbgrader validate``: a student's check, whose scores count for nothing."""
    return os.environ.get(VALIDATING_ENV, "") not in ("", "0")


def instructors_run() -> bool:
    """True while the grader runs the instructor's own notebook (the reference run before any student, or
    ``fuselab calibrate``): the speed test then also times the course's tuned solution for the feedback pages."""
    return graded_by_the_course() and os.environ.get(INSTRUCTORS_RUN_ENV, "") not in ("", "0")
