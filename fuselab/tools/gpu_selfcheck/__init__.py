"""The GPU self-check: everything that needs a GPU, in stages that can run alone (``--stages``).

    bash .ci/gpu-selfcheck                   # every default stage, in order
    bash .ci/gpu-selfcheck --stages lab0     # some
    bash .ci/gpu-selfcheck --list            # the stages, what each needs and checks

Each stage is declared once, as a ``Stage`` in ``stages.STAGES`` (its name, what it needs, what it checks, the
function that runs it); the labs' stages come from the lab registry (``fuselab/labs/registry.py``), one per lab,
run by its module in ``lab_checks/``. Full results go to ``$OUT`` (or ``--out``) as JSON, ``selfcheck.json``,
rewritten after every stage; a short table is printed last.

- ``stages``: the declaration ``Stage`` and the one list of stages.
- ``machine``: the machine and the package: ``env``, ``tests``, ``build``, ``timing``, ``emulation``.
- ``notebooks``: the solution notebooks run whole: ``grade`` (nbgrader autograde), ``notebooks`` (with demos).
- ``grading_runs``: the grader on a class: ``samples``, ``throughput``, ``multigpu``.
- ``counters``: Lab 0 through the hardware counters (Nsight Compute): ``counters``.
- ``command``: the command line (``python -m fuselab.tools.gpu_selfcheck``).

Environment: ``FUSELAB_NOTEBOOKS=lab3`` and ``FUSELAB_SAMPLES=correct,cheat_cache`` narrow those stages;
``FUSELAB_THROUGHPUT_COPIES`` (default 30: a class of 120) and ``FUSELAB_THROUGHPUT_JOBS=10,16`` (submissions
sharing the GPU, one run each; default: the grader's own choice) shape the throughput stage,
``FUSELAB_MULTIGPU_COPIES`` (default 2) and ``FUSELAB_MULTIGPU_JOBS`` (submissions sharing each GPU, default 1:
one worker per GPU) the multigpu stage; ``FUSELAB_COMMIT`` names the commit in the results where the GPU machine's
copy has no up-to-date ``.git``.
"""
