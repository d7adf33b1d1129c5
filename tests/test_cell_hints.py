"""A NameError after a failed cell names that cell (fuselab/cell_hints.py), in a real kernel (nbclient), once."""

from .notebook_runner import errors, run_cells, streams

BROKEN_BUILD = '''FUSED_SOURCE = r"""
__global__ void k(float* out, int64_t n) { int64_t i = threadIdx.x; if (i < n) out[i] = 1.0f }
void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, cudaStream_t stream) {
    k<<<1, 256, 0, stream>>>(out, n);
}
"""'''


def test_a_name_error_after_a_failed_build_cell_names_that_cell_once():
    cells = ["import torch\nimport fuselab\nfrom fuselab.labs import lab0",
             BROKEN_BUILD,
             "fused_mod = fuselab.build(FUSED_SOURCE, [lab0.FUSED], name='msg_broken', backend='emulate')\n"
             "fused = lab0.fused(fused_mod)",
             "n = 5\nfused(*lab0.make_inputs((n,), 0), torch.empty(n), n)",
             # a check whose candidate needs the missing name says the same, once
             "fuselab.check(lambda a, b, e, out: fused(a, b, e, out), lab0.reference, "
             "lambda s, seed: lab0.make_inputs(s, seed), [(3,)])",
             "fused_typo_never_assigned"]
    nb = run_cells(cells, timeout=300)
    found = errors(nb)
    assert found[2].startswith("BuildError") and "^" in "".join(
        "".join(o.get("traceback", [])) for o in nb.cells[2].outputs), found
    direct, in_check = found[3], found[4]
    for said in (direct, "".join("".join(o.get("traceback", [])) for o in nb.cells[4].outputs)):
        assert "`fused` is assigned by the cell In [3]" in said and "BuildError" in said, said
        assert said.count("is assigned by the cell") == 1, said
    assert direct.startswith("NameError") and in_check.startswith("CheckFailed"), found
    assert "assigned by the cell" not in found[5], found[5]  # a name no failed cell assigns: Python's own message
    assert streams(nb, "stderr") == {}


def test_the_hint_goes_once_the_failed_cell_is_fixed():
    cells = ["import fuselab\nfrom fuselab.labs import lab0",
             "x = 1\ny = 1 / 0",
             "y",
             "x = 1\ny = 2",
             "del y\ny"]
    nb = run_cells(cells, timeout=300)
    found = errors(nb)
    assert "ZeroDivisionError" in found[1] and "assigned by the cell In [2]" in found[2], found
    assert 3 not in found and "assigned by the cell" not in found[4], found  # that cell ran again and succeeded
