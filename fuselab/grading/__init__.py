"""The grader: a folder or zip of submissions -> fair grades, feedback and a class report, with one command.

nbgrader does the notebook mechanics (autograde, gradebook, feedback, export); this package adds what GPU kernel
labs need on top. Its rooms, low to high (a room imports only from those before it; docs/design.md §2.3):

- ``sandbox/``: Running a submission's work: limits, the process tree's keeper and kill, the sandbox (an
  allow-listed environment, a user without rights, bubblewrap), and the only way into a folder a submission can
  write.
- ``gpus/``: Sharing the GPUs: workers per GPU (``schedule``) and a graded timing's lease of its GPU (``lease``: the
  grader's side; ``fuselab/speed/lease.py`` is the timing's).
- ``recheck/``: The clean recheck: ``clean`` starts three processes joined by pipes they inherit, and reads their
  verdicts.
- ``records/``: The class's records: the submissions read in (``intake``), the class list (``roster``), the term's
  course folder (``term``), a graded submission (``results``), hand grading read back (``handgrading``), nbgrader's
  course, gradebook and export (``nbgrader_run``), the reference runs kept for the term (``reference_cache``).
- ``outputs/``: What a run writes for people: feedback pages (``feedback``), grades.csv and the class report
  (``report``), the LMS's import files (``export``), formgrader for hand grading (``formgrader``), a submission's
  text as a terminal shows it (``terminal``).
- ``run/``: A grading run, intake to report: the commands (``cli``), the run loop (``pipeline``), a class as a Slurm
  job array (``python -m fuselab.grading.run.slurm shard OUT``, then ``merge OUT``), the sample class
  (``samplecheck``), ``fuselab calibrate`` (``calibrate``), progress on stderr (``run_progress``).
"""
