"""The clean recheck: ``clean`` starts three processes joined by pipes they inherit, and reads their verdicts.

- the checker: ``python -m fuselab.grading.recheck.cellrunner PLAN FD`` (its records to the grader: ``channel``);
- the solution worker: ``python -m fuselab.grading.recheck.solution_worker IN_FD OUT_FD``;
- the kernel worker: ``python -m fuselab.grading.recheck.kernel_worker IN_FD OUT_FD``.

What crosses between them: ``wire`` and ``remote`` (checker and solution worker), ``kernels`` and ``transfer``
(checker and kernel worker). What a verdict may say: ``failures``; what the recheck leaves out: ``demos``; what it
flags for a TA: ``sanitize``; plotting loaded on first use: ``lazy_plots``.
"""
