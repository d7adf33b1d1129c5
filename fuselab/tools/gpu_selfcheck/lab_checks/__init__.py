"""Each lab's stage of the GPU self-check, one module a lab named after it (``lab0.py`` ...), each ``run(out) ->
dict``: the instructor's kernels built from solutions/, checked on the GPU shapes, timed against the lab's unfused
reference, PyTorch eager, ``torch.compile`` and the measured ceilings, and the graded speedup test run."""
