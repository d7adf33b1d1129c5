"""The grader: a folder or zip of submissions → fair grades, feedback and a class report, with one command.

nbgrader does the notebook mechanics (autograde, gradebook, feedback, export). This package adds what GPU kernel
labs need on top:

- ``intake``: folders and LMS zips → one notebook per (student, lab), with clear problems for malformed ones;
- ``isolate``: run untrusted work in a child process with limits, a timeout that kills the whole process tree
  (``keeper`` keeps every process it starts inside that tree), a memory watchdog, and the sandbox (the default):
  bubblewrap entered as a user without rights (``enter_sandbox``) that sees only the submission's own folder;
- ``sanitize`` and ``recheck``: the clean recheck. The student's sources are read from the graded cells without
  running their Python, dropped into the instructor's notebook, and every graded test reruns in a fresh process;
  a fault or hang costs only the test that met it;
- ``nbgrader_run``: nbgrader's own autograde of each submission in a scratch course of its own;
- ``schedule``: one worker per GPU (``CUDA_VISIBLE_DEVICES``), so timings never share a GPU;
- ``feedback``, ``report``, ``calibrate``; ``pipeline`` ties them together (``fuselab grade``).
"""

import os

GRADING_ENV = "FUSELAB_GRADING"


def grading_mode() -> bool:
    """True while the grader runs a notebook: heavy demo cells (sweeps, torch.compile) skip themselves."""
    return os.environ.get(GRADING_ENV, "") not in ("", "0")
