"""A grading run, intake to report: the commands (``cli``), the run loop (``pipeline``), a class as a Slurm job array
(``python -m fuselab.grading.run.slurm shard OUT``, then ``merge OUT``), the sample class (``samplecheck``),
``fuselab calibrate`` (``calibrate``), progress on stderr (``run_progress``).
"""
