"""Why a test failed reaches it: a test that needed what an earlier cell failed to make says that cell's error.

A student's CUDA with a missing semicolon fails the instructor's build cell (not graded), and every test after it
meets only ``NameError: name 'mod' is not defined``. The verdict of each such test carries the build cell's own
error, the compiler's message on the student's line, so the feedback and the report say what to fix."""

import json
import re

from fuselab.grading.recheck import failures, clean as recheck
from fuselab.grading.sandbox import isolate

PROTO = "void fill(float* out /*[n]*/, int64_t n, cudaStream_t stream)"
BROKEN = ("__global__ void fill_kernel(float* out, int64_t n) {\n"
          "    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
          "    if (i < n) out[i] = 1.0f\n"
          "}\n"
          "void fill(float* out, int64_t n, cudaStream_t stream) {\n"
          "    if (n > 0) fill_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, n);\n"
          "}\n")


def _cell(source, grade_id, graded=False, solution=False, points=0):
    meta = {"nbgrader": {"grade_id": grade_id, "grade": graded, "solution": solution, "locked": not solution,
                         "schema_version": 3, **({"points": points} if graded else {})}}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [], "execution_count": None}


def test_a_build_error_reaches_every_test_that_needed_the_build(tmp_path):
    cells = [_cell("import torch\nimport fuselab\n", "setup"),
             _cell(f"SOURCE = r'''{BROKEN}'''\n", "sol_fill", solution=True),
             _cell(f"mod = fuselab.build(SOURCE, [{PROTO!r}], name='fill')\n", "build_fill"),
             _cell("out = torch.zeros(5)\nmod.fill(out, 5)\nassert torch.equal(out, torch.ones(5))\n", "test_fill",
                   graded=True, points=2),
             _cell("assert 1 + 1 == 2\n", "test_other", graded=True, points=1)]
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}
    result = recheck.run_clean(nb, json.loads(json.dumps(nb)), tmp_path, cell_timeout=240, total_timeout=600,
                               limits=isolate.Limits(memory_bytes=4 * 2**30))
    failed = result.cells["test_fill"]
    assert failed.points == 0 and failed.message.startswith("NameError")
    # the compiler's own complaint, on the student's own line 3, where the semicolon is missing
    assert "BuildError" in failed.message and "build_fill" in failed.message
    assert "line 3" in failed.message or ":3:" in failed.message, failed.message
    assert re.search(r"expected .;. before", failed.message), failed.message
    assert result.cells["test_other"].points == 1  # a test that needed nothing of it is untouched


def test_only_a_missing_name_the_failed_cell_binds_is_explained():
    cell = {"source": "import torch.nn as nn\nmod = build()\nfused, (a, b) = f(mod), (1, 2)\n"
                      "def helper():\n    pass\nfor k in range(3):\n    pass\nwith open('x') as handle:\n    pass\n"}
    assert failures.bound_names(cell) == {"nn", "mod", "fused", "a", "b", "helper", "k", "handle"}
    assert failures.bound_names({"solution": True, "exports": ["SOURCE"], "source": "x = 1"}) == {"SOURCE"}
    unbound = {"mod": "cell build, which defines it, failed with BuildError: ..."}
    missing = NameError("name 'mod' is not defined", name="mod")
    assert failures.because("NameError: name 'mod' is not defined", missing, unbound).endswith(
        "failed with BuildError: ...")
    other = NameError("name 'other' is not defined", name="other")
    assert failures.because("NameError: x", other, unbound) == "NameError: x"
    assert failures.because("ValueError: x", ValueError("mod"), unbound) == "ValueError: x"
