"""The grader: a folder or zip of submissions → fair grades, feedback and a class report, with one command.

nbgrader does the notebook mechanics (autograde, gradebook, feedback, export). This package adds what GPU kernel
labs need on top:

- ``intake``: folders and LMS zips → one notebook per (student, lab), with clear problems for malformed ones;
- ``isolate``: run untrusted work in a child process with limits, a timeout that kills the whole process tree
  (``keeper`` keeps every process it starts inside that tree), a memory watchdog, and the sandbox (the default):
  bubblewrap entered as a user without rights (``enter_sandbox``) that sees only the submission's own folder;
- ``recheck``, ``cellrunner``, ``solution_worker``, ``wire``, ``remote``: the clean recheck. The instructor's
  notebook runs in a checker process that never runs student Python; the student's solution cells run in a
  solution worker, and what the tests need crosses back as plain data rebuilt by type; a fault or hang costs
  only the test that met it. ``sanitize`` flags solution cells that look like tampering, for a TA;
- ``nbgrader_run``: nbgrader's own autograde of each submission in a scratch course of its own;
- ``schedule``: one worker per GPU (``CUDA_VISIBLE_DEVICES``), so timings never share a GPU;
- ``feedback``, ``report``, ``calibrate``; ``pipeline`` ties them together (``fuselab grade``).
"""

import os

GRADING_ENV = "FUSELAB_GRADING"
VALIDATING_ENV = "NBGRADER_VALIDATING"  # nbgrader validate (and JupyterLab's Validate button) sets it in the kernel


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
