"""Hidden tests' inputs never reach a student's feedback, whatever the student's code does with them.

A student's function, run by the solution worker for a hidden test, could raise an error quoting its arguments
(``raise ValueError(repr(args))``), return values that the test's check then quoted, print or warn them; a kernel
could fail on them with a message naming the block. The clean recheck keeps, of a hidden test's failure, only its
type and where the student's own code raised it; nbgrader's run (the hidden tests in the student's Jupyter
kernel) never reaches the page at all. Visible tests keep their full messages."""

import json
import random
import re

import pytest

from fuselab.grading.recheck import failures, clean as recheck
from fuselab.grading.outputs import feedback
from fuselab.grading.sandbox import isolate

PROTO = "void scale(const float* x /*[n]*/, float* out /*[n]*/, int64_t n, cudaStream_t stream)"


def _cell(source, grade_id, graded=False, solution=False, points=0):
    meta = {"nbgrader": {"grade_id": grade_id, "grade": graded, "solution": solution, "locked": not solution,
                         "schema_version": 3, **({"points": points} if graded else {})}}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [], "execution_count": None}


@pytest.fixture
def secret():
    """A size and a value only the hidden tests hold: random, so no message holds them by chance."""
    return random.randint(1000, 9999), round(random.uniform(1, 2), 7)


def _instructor(n, value):
    hidden = ("### BEGIN HIDDEN TESTS\n"
              f"secret = torch.full(({n},), {value!r}, dtype=torch.float64)\n"
              f"fuselab.assert_close(peek(secret, {n}), 2 * secret)\n"
              "### END HIDDEN TESTS\n")
    kernel_hidden = ("### BEGIN HIDDEN TESTS\n"
                     f"x = torch.full(({n},), {value!r})\nout = torch.empty_like(x)\n"
                     f"mod.scale(x, out, {n})\nassert torch.equal(out, 2 * x)\n"
                     "### END HIDDEN TESTS\n")
    return [
        _cell("import torch\nimport fuselab\n", "setup"),
        _cell("def peek(x, n):\n    return 2 * x\n", "sol_peek", solution=True),
        _cell("x = torch.randn(5, dtype=torch.float64)\nfuselab.assert_close(peek(x, 5), 2 * x)\n" + hidden,
              "test_peek", graded=True, points=2),
        _cell("ones = torch.ones(3, dtype=torch.float64)\nfuselab.assert_close(peek(ones, 3), 2 * ones)\n",
              "test_visible", graded=True, points=1),
        _cell("SOURCE = r'''__global__ void k(const float* x, float* out, int64_t n) {}'''", "sol_kernel",
              solution=True),
        _cell(f"mod = fuselab.build(SOURCE, [{PROTO!r}], name='hidden_scale', backend='emulate')", "build"),
        _cell("x = torch.randn(5)\nout = torch.empty_like(x)\nmod.scale(x, out, 5)\nassert torch.equal(out, 2 * x)\n"
              + kernel_hidden, "test_kernel", graded=True, points=2),
    ]


# raises on the hidden input with its arguments in the message, after printing and warning them; a visible
# failure of its own in test_visible
RAISES = ("import sys, warnings\n"
          "def peek(x, n):\n"
          "    print('saw', n, x.tolist())\n"
          "    print('saw', n, x.tolist(), file=sys.stderr)\n"
          "    warnings.warn(f'saw {n} {x.tolist()}')\n"
          "    if n > 5:\n"
          "        raise ValueError(f'peeked at {n}: {x.tolist()}')\n"   # line 7
          "    if n == 3:\n"
          "        raise KeyError(f'my visible error at n={n}')\n"
          "    return 2 * x\n")
# passes the visible line, then returns the hidden input's size as its values: the test's own check quotes them
RETURNS = "def peek(x, n):\n    return 2 * x if n <= 5 else x * 0 + n\n"
# the kernel: right for the visible size; for a large one, an out-of-bounds write whose error names the block
KERNEL = ("__global__ void scale_kernel(const float* x, float* out, int64_t n) {\n"
          "    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;\n"
          "    if (i < n) out[i] = 2.0f * x[i];\n"
          "    if (n > 5 && i == n - 1) out[i + ((int64_t)1 << 40)] = 0.0f;\n"
          "}\n"
          "void scale(const float* x, float* out, int64_t n, cudaStream_t stream) {\n"
          "    scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, out, n);\n"
          "}\n")


def _run(tmp_path, n, value, peek):
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": _instructor(n, value)}
    student = json.loads(json.dumps(nb))
    for cell in student["cells"]:
        grade_id = cell["metadata"]["nbgrader"]["grade_id"]
        if grade_id == "sol_peek":
            cell["source"] = peek
        elif grade_id == "sol_kernel":
            cell["source"] = f"SOURCE = r'''{KERNEL}'''"
    return nb, recheck.run_clean(nb, student, tmp_path, cell_timeout=120, total_timeout=400,
                                 limits=isolate.Limits(memory_bytes=4 * 2**30))


def _quotes(text, n, value) -> bool:
    return str(n) in text or repr(value)[:6] in text or str(n * 2) in text


def test_a_hidden_tests_failure_says_its_type_and_where_never_the_inputs(tmp_path, secret):
    n, value = secret
    nb, result = _run(tmp_path, n, value, RAISES)
    cells = result.cells
    assert {k: v.points for k, v in cells.items()} == {"test_peek": 0, "test_visible": 0, "test_kernel": 0}, cells
    for grade_id in ("test_peek", "test_kernel"):
        verdict = cells[grade_id]
        assert not _quotes(verdict.message + verdict.output, n, value), (grade_id, verdict)
        assert failures.HIDDEN_NOTE in verdict.message, verdict.message
    assert "ValueError" in cells["test_peek"].message and "line 7 of your cell sol_peek" in cells["test_peek"].message
    assert "LaunchError" in cells["test_kernel"].message and "launcher scale" in cells["test_kernel"].message
    # a visible test keeps its full message: the student's own error, as in their notebook
    assert "KeyError" in cells["test_visible"].message and "my visible error at n=3" in cells["test_visible"].message

    # the page the student gets
    submitted = json.loads(json.dumps(nb))
    for cell in submitted["cells"]:
        cell["source"] = feedback.ipynb.without_hidden_tests(cell["source"])
    release = [c for c in submitted["cells"]]
    sources = feedback.LabSources(release={c["metadata"]["nbgrader"]["grade_id"]: c for c in release},
                                  uses=feedback.test_uses(release), hidden_lines=feedback.hidden_test_lines(nb))
    page_result = {"student": "alice", "lab": "lab0",
                   "cells": {k: {"points": v.points, "max_points": v.max_points, "status": v.status,
                                 "message": v.message, "output": v.output} for k, v in cells.items()},
                   "flags": result.flags}
    text = re.sub(r"<[^>]+>", " ", feedback.build_page(page_result, sources, submitted))
    assert not _quotes(text, n, value) and "line 7 of your cell sol_peek" in text
    assert "my visible error at n=3" in text


def test_values_a_hidden_tests_check_compares_are_not_quoted(tmp_path, secret):
    n, value = secret
    _, result = _run(tmp_path, n, value, RETURNS)
    verdict = result.cells["test_peek"]
    assert verdict.points == 0 and not _quotes(verdict.message + verdict.output, n, value), verdict
    assert verdict.message.startswith("CheckFailed in a hidden test (the test's check of your result failed)")
    assert result.cells["test_visible"].points == 1


def test_which_part_of_a_test_cell_failed():
    source = "def helper(v):\n    assert v, 'visible helper'\nhelper(1)\n### BEGIN HIDDEN TESTS\nhelper(0)\n" \
             "### END HIDDEN TESTS\n"
    cell = {"index": 3, "grade_id": "test_x", "source": source}

    def failure(code):
        try:
            exec(compile(code, "<cell test_x>", "exec"), {})
        except AssertionError as exc:
            return exc
    # a visible helper called from the hidden part fails in the hidden part; the same helper from a visible line
    # does not
    assert failures.in_hidden_part(failure(source), cell)
    assert not failures.in_hidden_part(failure(source.replace("helper(1)", "helper(0)")), cell)
    assert failures.in_hidden_part(AssertionError("raised outside the cell"), cell)
    assert not failures.in_hidden_part(AssertionError("no hidden tests"), dict(cell, source="helper(0)\n"))
    # the worker's word about where: only a solution cell of the plan, and a line that cell has
    plan = [{"index": 0, "grade_id": "sol_a", "solution": True, "source": "a\nb\n"}, cell]
    error = ValueError("x")
    for frames, said in [((("cell sol_a", 2),), "at line 2 of your cell sol_a"),
                         ((("cell sol_a", 3),), "raised in your code"),
                         ((("cell test_x", 1), ("cell sol_a", 1)), "at line 1 of your cell sol_a"),
                         ((("cell sol_b 12345", 1),), "raised in your code")]:
        error.fuselab_origin = ("solution", frames)
        assert said in failures.hidden_message(error, plan), frames
