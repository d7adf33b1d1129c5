"""Lab 3's sample submissions for the grader's sample class (see fuselab/samples.py).

grade ids: test_bias_act (1), test_fused (3), test_template (3), test_dram_bytes (1); written answers are graded by hand
and not listed. Lab 3 grades no speedup: on the H200 the plain fused kernel gained only 1.01-1.03x (docs/RESULTS.md).
"""

from ..samples import Sample


def _replace(old, new):
    def change(source):
        if old not in source:
            raise ValueError(f"sample pattern not found: {old!r}")
        return source.replace(old, new)
    return change


def _chain(*changes):
    def change(source):
        for step in changes:
            source = step(source)
        return source
    return change


SAMPLES = {
    "correct": Sample(why="the instructor's plain solution"),
    "missing_barrier": Sample(
        changes={"fused_source": _replace("        __syncthreads();  // the tiles are complete before anyone reads them\n",
                                          ""),
                 "template_source": _replace("        __syncthreads();\n        for (int kk", "        for (int kk")},
        expect={"test_fused": "zero", "test_template": "zero"},
        # On a GPU the race may go unseen on some shapes; the emulation sees it every time.
        expect_gpu={"test_fused": "any", "test_template": "any"},
        why="no __syncthreads() between loading a tile and reading it: threads read tile elements not yet loaded "
            "(NaN under the emulation; racy on a GPU)"),
    "wrong_broadcast_axis": Sample(
        changes={"bias_act_source": _replace("bias[i % N]", "bias[i / N]"),
                 "fused_source": _replace("bias ? bias[col] : 0.0f", "bias ? bias[row] : 0.0f"),
                 "template_source": _replace("bias ? to_float(bias[col])", "bias ? to_float(bias[row])")},
        expect={"test_bias_act": "zero", "test_fused": "zero", "test_template": "zero"},
        why="the bias indexed by the row instead of the column: wrong wherever a bias is added"),
    "cheat_cublas": Sample(
        changes={"dram_bytes": lambda s: s + (
            "\n\n# make the 'fused' op call cuBLAS (torch.addmm) instead of a kernel of my own\n"
            "import torch as _torch\n"
            "from fuselab.labs import lab3 as _lab3\n"
            "_lab3.fused = lambda module: (lambda a, b, bias, relu, out: out.copy_(\n"
            "    _torch.relu(_torch.addmm(bias, a, b)) if relu else _torch.addmm(bias, a, b)))\n")},
        why="the fused op is rebound to cuBLAS (torch.addmm): Lab 3 grades no speedup, and its correctness tests "
            "check the student's own kernels, so the cheat gains nothing (the clean recheck drops the rebinding)"),
}
