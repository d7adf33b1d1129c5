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
- ``nbgrader_run``: nbgrader's own autograde of each submission in a scratch course of its own (and of a set of
  notebooks at once, unsandboxed, for the GPU self-check: ``autograde``);
- ``schedule``: one worker per GPU (``CUDA_VISIBLE_DEVICES``), so timings never share a GPU;
- ``feedback``, ``report``, ``calibrate``; ``pipeline`` ties them together (``fuselab grade``).
"""
