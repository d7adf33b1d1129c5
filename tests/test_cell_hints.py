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


def _traceback_text(cell):
    import re
    text = "".join("\n".join(o.get("traceback", [])) for o in cell.outputs if o.get("output_type") == "error")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # IPython's colours


def test_a_build_error_shows_the_students_call_and_the_compiler_error_without_internal_frames():
    """A kernel that does not compile: the cell shows its own line that called build and the BuildError with the
    offending line and its caret, not the frames of fuselab and torch's cpp_extension that found the error. So does
    a kernel not written yet (nbgrader's stub), built through a helper of the student's own."""
    cells = ["import fuselab\nfrom fuselab.labs import lab0",
             BROKEN_BUILD,
             "fused_mod = fuselab.build(FUSED_SOURCE, [lab0.FUSED], name='msg_broken_tb', backend='emulate')",
             "def build_mine(source):\n    return fuselab.build(source, [lab0.FUSED], name='msg_stub', backend='emulate')\n",
             "stub_mod = build_mine('void add_relu_mul() {\\n    raise NotImplementedError()\\n}\\n')"]
    nb = run_cells(cells, timeout=300)
    found = errors(nb)
    shown = _traceback_text(nb.cells[2])
    assert found[2].startswith("BuildError"), found
    assert "fused_mod = fuselab.build(FUSED_SOURCE" in shown and "msg_broken_tb.cu:2:" in shown, shown
    caret = [line for line in shown.splitlines() if line.strip().startswith("|") and line.rstrip().endswith("^")]
    assert caret, shown
    for internal in ("fuselab/kernelbuild", "torch/utils/cpp_extension", "fuselab/", "site-packages"):
        assert internal not in shown, (internal, shown)
    stub = _traceback_text(nb.cells[4])
    assert found[4].startswith("NotWrittenError"), found
    assert "stub_mod = build_mine(" in stub and "return fuselab.build(source" in stub, stub  # both of theirs
    assert "fuselab/" not in stub and "site-packages" not in stub, stub
    assert streams(nb, "stderr") == {}


def test_a_build_error_in_plain_python_is_raised_from_build_itself(tmp_path):
    """Outside IPython: the student's call, then one frame (`build`, which raised it), then the error."""
    import os
    import subprocess
    import sys

    from .conftest import REPO
    script = tmp_path / "student.py"
    source = BROKEN_BUILD.split('"""')[1]
    script.write_text("import fuselab\nfrom fuselab.labs import lab0\n"
                      f"SOURCE = {source!r}\n"
                      "mod = fuselab.build(SOURCE, [lab0.FUSED], name='msg_broken_plain', backend='emulate')\n")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    said = done.stderr
    frames = [line for line in said.splitlines() if line.startswith('  File "')]
    assert done.returncode == 1 and "fuselab.errors.BuildError: msg_broken_plain.cu failed to compile" in said, said
    assert len(frames) == 2 and str(script) in frames[0] and "in build" in frames[1], said
    assert "cpp_extension" not in said and "_compile" not in said and said.rstrip().endswith("^"), said


OFF_BY_ONE = '''FUSED_SOURCE = r"""
__global__ void k(const float* a, const float* b, const float* e, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n - 1) out[i] = fmaxf(a[i] + b[i], 0.0f) * e[i];
}
void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) k<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, e, out, n);
}
"""'''


def test_a_failed_check_shows_the_students_call_and_the_report_not_fuselabs_frames():
    """A check that fails shows the student's cell line and the report; the candidate's first error (here none:
    wrong values) is shown only where the student's own Python raised it, with their line."""
    cells = ["import torch\nimport fuselab\nfrom fuselab.labs import lab0",
             OFF_BY_ONE,
             "mod = fuselab.build(FUSED_SOURCE, [lab0.FUSED], name='msg_off_by_one_tb', backend='emulate')\n"
             "fused = lab0.fused(mod)",
             "fuselab.check(fused, lab0.reference, lambda s, seed: lab0.make_inputs(s, seed), [(5,), (300,)])",
             "def mine(a, b, e, out):\n    raise ValueError('my wrapper is wrong')\n",
             "fuselab.check(mine, lab0.reference, lambda s, seed: lab0.make_inputs(s, seed), [(5,)])"]
    nb = run_cells(cells, timeout=300)
    found = errors(nb)
    wrong = _traceback_text(nb.cells[3])
    assert found[3].startswith("CheckFailed"), found
    assert "fuselab.check(fused, lab0.reference" in wrong and "✗" in wrong, wrong
    assert "fuselab/" not in wrong and "site-packages" not in wrong and "direct cause" not in wrong, wrong
    raised = _traceback_text(nb.cells[5])
    assert "raise ValueError('my wrapper is wrong')" in raised and "fuselab.check(mine" in raised, raised
    assert "fuselab/" not in raised and "site-packages" not in raised, raised
    assert streams(nb, "stderr") == {}
