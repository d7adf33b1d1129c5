"""What a student sees for the typical bugs of the labs, on the CPU (emulation), with random inputs.

Each test writes the bug as a student would, runs what the lab's test cell runs, and reads the message: it must
name the bug (and say the fix once).
"""

import random
import re
import textwrap

import pytest
import torch

import fuselab
from fuselab.labs import lab0


FUSED = r'''
__global__ void add_relu_mul_kernel(const float* a, const float* b, const float* e, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (BOUND) out[i] = fmaxf(a[i] + b[i], 0.0f) * e[i];
}

void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, cudaStream_t stream) {
    LAUNCH add_relu_mul_kernel<<<GRID, 256, 0, stream>>>(a, b, e, out, n);
}
'''


def fused_module(bound="i < n", grid="(unsigned)((n + 255) / 256)", launch="if (n > 0)", name="msg_fused"):
    source = FUSED.replace("BOUND", bound).replace("GRID", grid).replace("LAUNCH", launch)
    return fuselab.build(source, [lab0.FUSED], name=name, backend="emulate")


def make(shape, seed):
    return lab0.make_inputs(shape, seed, device="cpu")


def test_a_grid_that_rounds_down_says_round_up():
    mod = fused_module(grid="n / 256", name="msg_grid_down")
    n = random.Random(1).randint(1, 255)
    a, b, e = make((n,), 0)
    with pytest.raises(fuselab.LaunchError) as raised:
        mod.add_relu_mul(a, b, e, torch.empty_like(a), n)
    said = str(raised.value)
    assert "grid (0,1,1)" in said and "rounds down" in said and "(n + 255) / 256" in said, said
    assert "n = 0" not in said, said  # there is work to do: not the empty-tensor advice


def test_a_grid_taller_than_cuda_allows_says_where_the_count_goes():
    """A grid of 65600 blocks in z: the emulation's launch error said only CUDA's limits; it now says that y and z
    hold 65535 blocks each, and the loop that covers the rest."""
    source = textwrap.dedent("""\
        __global__ void planes_kernel(float* out, int planes) {
            int p = blockIdx.z;
            if (p < planes) out[p] = 1.0f;
        }
        void planes(float* out, int planes, cudaStream_t stream) {
            if (planes > 0) planes_kernel<<<dim3(1, 1, planes), 1, 0, stream>>>(out, planes);
        }
        """)
    mod = fuselab.build(source, ["void planes(float* out, int planes, cudaStream_t stream)"], name="msg_grid_z",
                        backend="emulate")
    with pytest.raises(fuselab.LaunchError) as raised:
        mod.planes(torch.empty(65600), 65600)
    said = str(raised.value)
    assert "(1,1,65600)" in said and "at most 65535 blocks each" in said and "p += gridDim.z" in said, said


def test_an_empty_tensor_says_guard_the_launch_once():
    mod = fused_module(launch="", name="msg_n_zero")
    with pytest.raises(AssertionError) as raised:
        lab0.check_n_zero(mod.add_relu_mul, 3, name="add_relu_mul")
    said = str(raised.value)
    assert "n = 0" in said and said.count("if (n > 0)") == 1, said


def test_an_off_by_one_bound_is_named_as_one():
    mod = fused_module(bound="i <= n", name="msg_off_by_one")
    shapes = [(random.Random(2).randint(1, 255),), (1000,)]
    result = fuselab.check(lab0.fused(mod), lab0.reference, make, shapes, seeds=(0,), verbose=False,
                           raise_on_fail=False)
    report = result.report()
    assert not result.passed and "off-by-one" in report and "`i <= n`" in report, report


def test_a_bound_one_short_leads_with_the_cases_and_not_with_an_unwritten_output():
    """`i < n - 1` (grader/examples/edge_bug): the 1-element case writes nothing, every other case all but its last
    element. The feedback page (a message's first 600 characters) showed only the 1-element case, hinting that
    nothing was written (did the kernel launch?), while "1 of 1000 bad, first at out[999]" was cut off."""
    from fuselab.grading.outputs import feedback
    mod = fused_module(bound="i < n - 1", name="msg_one_short")
    result = fuselab.check(lab0.fused(mod), lab0.reference, make, lab0.SMALL_SHAPES, verbose=False,
                           raise_on_fail=False)
    page = feedback.clean_text(f"CheckFailed: {result.report()}", feedback.MAX_MESSAGE_CHARS)
    page = page.split("\n… (")[0]  # what the page shows
    assert "nothing was written" not in result.report() and "Did the kernel launch" not in result.report()
    for n in (7, 255, 1000, 4099):
        assert f"✗ shape=({n},)  out: 1 of {n} bad, first at out[{n - 1}]" in page, page
    assert "everything from out[6] on is never written" in page, page


def test_a_missing_bounds_check_is_named_as_one():
    mod = fused_module(bound="true", name="msg_no_bound")
    result = fuselab.check(lab0.fused(mod), lab0.reference, make, [(random.Random(3).randint(1, 200),)], seeds=(0,),
                           verbose=False, raise_on_fail=False)
    report = result.report()
    assert not result.passed and "missing `if (i < n)` bounds check" in report and "off-by-one" not in report, report


def test_a_read_one_past_the_end_is_named_not_blamed_on_the_relu():
    """A kernel that reads `a[i + 1]` at the last element reads the NaN past the input, which fmaxf turns into 0:
    the report blamed "a ReLU where none belongs". Only the last element wrong, though written, now asks about a
    read past the end."""
    source = FUSED.replace("BOUND", "i < n").replace("LAUNCH", "if (n > 0)").replace(
        "GRID", "(unsigned)((n + 255) / 256)").replace("a[i] + b[i]", "a[i + (i == n - 1)] + b[i]")
    mod = fuselab.build(source, [lab0.FUSED], name="msg_read_past", backend="emulate")
    result = fuselab.check(lab0.fused(mod), lab0.reference, make, [(300,), (1000,)], seeds=(0, 1, 2), verbose=False,
                           raise_on_fail=False)
    report = result.report()
    assert not result.passed and "read one past the end of an input" in report, report
    assert "a ReLU where none belongs" not in report, report


def test_a_launcher_ignoring_its_stream_is_named_once_for_all_cases():
    source = FUSED.replace("BOUND", "i < n").replace("LAUNCH", "if (n > 0)").replace(
        "<<<GRID, 256, 0, stream>>>", "<<<(unsigned)((n + 255) / 256), 256>>>")
    mod = fuselab.build(source, [lab0.FUSED], name="msg_no_stream", backend="emulate")
    rng = random.Random(4)
    shapes = [(rng.randint(1, 3000),) for _ in range(4)]
    result = fuselab.check(lab0.fused(mod), lab0.reference, make, shapes, verbose=False, raise_on_fail=False)
    report = result.report()
    assert not result.passed and len(result.failures) == 12, report
    assert report.count("put work on another stream") == 1 and "each of the 12 failing cases" in report, report
    assert "stream 0" in report and "add_relu_mul_kernel" in report, report


def test_a_speed_cell_without_a_gpu_says_the_course_measures_it_when_grading(capsys, monkeypatch):
    from fuselab import speed
    for name in ("FUSELAB_GRADING", "NBGRADER_VALIDATING", "FUSELAB_GRADE_LOG"):
        monkeypatch.delenv(name, raising=False)
    mod = fused_module(name="msg_speed")
    points = speed.speedup_test("lab0.add_relu_mul", candidate=lab0.fused(mod), reference_op=lab0.fused(mod),
                                reference=lab0.reference, make_inputs=make, module=mod, max_points=4)
    said = capsys.readouterr().out
    assert points == 0.0 and "not measured (no GPU)" in said, said
    assert "The course measures it when it grades your notebook on its GPU, for up to 4 points" in said, said
    # and what it would grade there: the setting, the threshold, partial credit, the plain solution's speedup
    from fuselab.speed import policy_entry
    test, entry, _ = policy_entry("lab0.add_relu_mul", "NVIDIA H200")
    assert f"full 4 points from {entry['threshold']:.2f}x" in said and "partial credit linear from 0 at 1.00x" in said
    assert f"plain fused solution at {entry['plain_speedup']:.2f}x" in said and "device time" in said, said
    monkeypatch.setenv("FUSELAB_GRADING", "1")  # the grader's own run without a GPU: the 0 is the score
    assert speed.speedup_test("lab0.add_relu_mul", candidate=lab0.fused(mod), reference_op=lab0.fused(mod),
                              reference=lab0.reference, make_inputs=make, module=mod, max_points=4) == 0.0
    said = capsys.readouterr().out
    assert "0 of 4 points" in said and "only given on a GPU" in said, said


def test_lab1_visible_cases_span_several_blocks_on_every_grid_axis():
    """A conv kernel that ignores blockIdx.x (one block of 256 output pixels per plane) or a depthwise kernel that
    covers one 32 × 8 patch must fail the visible tests: the hidden tests' larger images would catch it."""
    from fuselab.labs import lab1
    pixels = [lab1.conv_output_size(c.H, c.R, c.stride, c.pad) * lab1.conv_output_size(c.W, c.R, c.stride, c.pad)
              for c in lab1.SMALL_CONV_CASES]
    assert max(pixels) > 2 * 256, pixels
    assert max(c.W for c in lab1.SMALL_DEPTHWISE_CASES) > 32 and max(c.H for c in lab1.SMALL_DEPTHWISE_CASES) > 8


def test_lab1_conv_that_ignores_blockidx_fails_the_visible_test():
    from fuselab.labs import lab1
    solution = _lab_source("lab1", "CONV_SOURCE")
    for bug in ("int pq = threadIdx.x;", None):
        text = solution.replace("int pq = blockIdx.x * blockDim.x + threadIdx.x;", bug) if bug else \
            solution.replace("dim3 grid((P * Q + 255) / 256, K, N);", "dim3 grid(1, K, N);")
        assert text != solution
        mod = fuselab.build(text, lab1.SOLUTION_SOURCES["CONV_SOURCE"], name="msg_conv_block", backend="emulate")
        result = fuselab.check(lab1.conv(mod), lab1.conv_only_reference,
                               lambda case, seed: lab1.make_conv_inputs(case, seed), lab1.SMALL_CONV_CASES,
                               seeds=(random.Random(5).randint(0, 99),), verbose=False, raise_on_fail=False)
        assert not result.passed, bug


def _lab_source(lab, variable):
    """A solution notebook's CUDA source, without its solution markers (what a student writes)."""
    import re

    from fuselab.notebook_sources import string_assignments

    from .conftest import REPO
    text = string_assignments(REPO / "solutions" / lab / f"{lab}.ipynb")[variable]
    return re.sub(r"^.*(BEGIN|END) SOLUTION.*\n?", "", text, flags=re.M)


def test_the_h200_l2_size_is_stated_in_one_unit_and_agrees_with_the_measured_ceiling():
    """Lab 0's text and Lab 1's printout name the H200's L2 the same way: 60 MiB (not 60 MB next to '63 MB')."""
    import json
    import re

    from fuselab import notebook as ipynb
    from fuselab.labs import lab1

    from .conftest import REPO
    mib = lab1.H200_CEILINGS["l2_bytes"] / 2**20
    lab0_text = "".join(ipynb.source(c) for c in json.loads((REPO / "solutions/lab0/lab0.ipynb").read_text())["cells"])
    stated = re.search(r"\((\d+) MiB on an H200\)", lab0_text)
    assert stated and int(stated.group(1)) == round(mib), (stated, mib)
    lab1_text = "".join(ipynb.source(c) for c in json.loads((REPO / "solutions/lab1/lab1.ipynb").read_text())["cells"])
    assert "l2_bytes / 2**20:.0f} MiB L2" in lab1_text and "l2_bytes / 1e6:.0f} MB L2" not in lab1_text


def test_lab2_question_premise_holds_in_the_saved_results():
    """Lab 2's question says BN in registers was slower than folding 'by much less than either was faster than
    the unfused pipeline': true at every saved shape, or the question misleads."""
    from fuselab.labs import lab2
    for row in lab2.saved_results(lab2.CONTEXT_RESULTS)["rows"]:
        t = row["median_us"]
        registers = t["BN in registers"] / t["plain fused (folded)"] - 1
        reference_vs_registers = t["lab reference (3 kernels)"] / t["BN in registers"] - 1
        assert 0 < registers < reference_vs_registers / 2, (row["shape"], registers, reference_vs_registers)


def test_a_padding_bound_off_by_one_is_not_called_a_short_grid():
    """`ih > H` for `ih >= H` in Lab 1's conv: the last output row is written but wrong. The hint must point at the
    edge's bounds condition, not say the grid stops short (which would send the student to the launcher)."""
    from fuselab.labs import lab1
    text = _lab_source("lab1", "CONV_SOURCE").replace("if (ih < 0 || ih >= H) continue;", "if (ih < 0 || ih > H) continue;")
    mod = fuselab.build(text, lab1.SOLUTION_SOURCES["CONV_SOURCE"], name="msg_conv_edge", backend="emulate")
    case = lab1.ConvCase(1, 2, random.Random(6).randint(18, 30), 29, 3, 3, 1, 1, True, "none")
    result = fuselab.check(lab1.conv(mod), lab1.conv_only_reference, lambda c, seed: lab1.make_conv_inputs(c, seed),
                           [case], seeds=(0, 1), verbose=False, raise_on_fail=False)
    report = result.report()
    assert not result.passed and "grid or loop stops" not in report, report
    assert "though written" in report and "ih >= H" in report, report


def test_size_arguments_name_the_bug_float_division_none_and_a_wrong_h():
    from fuselab.labs import lab1
    mod = fuselab.build(_lab_source("lab1", "CONV_SOURCE"), lab1.SOLUTION_SOURCES["CONV_SOURCE"], name="msg_sizes",
                        backend="emulate")
    rng = random.Random(7)
    h, w = rng.randint(5, 12), rng.randint(13, 20)
    x, wt, y, none = torch.randn(1, 2, h, w), torch.randn(3, 2, 3, 3), torch.empty(1, 3, h, w), torch.empty(0)
    sizes = dict(N=1, C=2, H=h, W=w, K=3, R=3, S=3, P=h, Q=w, stride=1, pad=1)
    mod.conv2d(x, wt, none, y, **sizes)  # right: runs
    for wrong, said in [(dict(H=w, W=h), f"argument 'H' of conv2d is {w}, but argument 'x' has H={h}"),
                        (dict(P=h * 2 / 2), "`/` is float division"),
                        (dict(P=h + 1), f"pass P={h}")]:
        with pytest.raises((TypeError, ValueError)) as raised:
            mod.conv2d(x, wt, none, y, **{**sizes, **wrong})
        assert said in str(raised.value), (wrong, str(raised.value))
    with pytest.raises(TypeError) as raised:
        mod.conv2d(x, wt, None, y, **sizes)
    assert "pass an empty tensor" in str(raised.value), str(raised.value)


def test_a_bias_on_the_wrong_axis_is_not_called_a_short_grid():
    """Lab 3's classic bug, bias[row] for bias[col], on a one-row output: element 0 is right, the rest written
    but wrong. The hint must say what each element reads, not that the grid stops short."""
    from fuselab.labs import lab3
    text = _lab_source("lab3", "FUSED_SOURCE").replace("(bias ? bias[col] : 0.0f)", "(bias ? bias[row] : 0.0f)")
    mod = fuselab.build(text, [lab3.FUSED_F32], name="msg_bias_axis", backend="emulate")
    n = random.Random(8).randint(9, 40)
    result = fuselab.check(lab3.fused(mod), lab3.reference, lambda s, seed: lab3.make_inputs(s, seed, device="cpu"),
                           [(1, n, 33, True, False)], seeds=(0, 1), verbose=False, raise_on_fail=False)
    report = result.report()
    assert not result.passed and "grid covers too few" not in report, report
    assert "though written" in report and "bias[row] instead of bias[col]" in report, report


def test_half_precision_accumulation_is_named_in_the_visible_test():
    """Lab 3's template with an fp16 accumulator: the visible fp16 test must fail (the hidden tests' K = 4096
    would), and say that the arithmetic is done in fp16."""
    from fuselab.labs import lab3
    text = (_lab_source("lab3", "TEMPLATE_SOURCE")
            .replace("float acc = 0.0f;  // fp32 accumulation, whatever T is", "T acc = T(0.0f);")
            .replace("acc += a_tile[ty][kk] * b_tile[kk][tx];", "acc = acc + T(a_tile[ty][kk] * b_tile[kk][tx]);")
            .replace("float v = acc + (bias ?", "float v = to_float(acc) + (bias ?"))
    mod = fuselab.build(text, lab3.FUSED_LAUNCHERS, name="msg_half_acc", backend="emulate")
    make16 = lambda s, seed: lab3.make_inputs(s, seed, device="cpu", dtype=torch.float16)  # noqa: E731
    result = fuselab.check(lab3.fused(mod), lab3.reference, make16, lab3.SMALL_SHAPES, verbose=False,
                           raise_on_fail=False)
    report = result.report()
    assert not result.passed and "accumulate in a `float`" in report and "fp16 accumulator" in report, report
    fine = fuselab.check(lab3.fused(mod), lab3.reference, lambda s, seed: lab3.make_inputs(s, seed, device="cpu"),
                         [(random.Random(9).randint(2, 40), 17, 70, True, True)], verbose=False, raise_on_fail=False)
    assert fine.passed  # fp32 is right: the bug is only in half precision


WILD = r'''
__global__ void k(const float* a, const float* b, const float* e, float* out, int64_t n, long long stride) {
    __shared__ float tile[256];
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? a[i] : 0.0f;
    if (SYNC) __syncthreads();
    if (i < n) out[i * stride] = tile[threadIdx.x];  // a wrong stride: far outside `out`
}
void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) k<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, e, out, n, STRIDE);
}
'''

WILD_SCRIPT = """
import random, sys, torch, fuselab
from fuselab.labs import lab0
source = sys.argv[1]
mod = fuselab.build(source, [lab0.FUSED], name="msg_wild_" + sys.argv[2], backend="emulate")
n = random.Random(10).randint(300, 2000)
for attempt in range(2):  # the process survives, and the module keeps working after the fault
    try:
        a, b, e = lab0.make_inputs((n,), attempt)
        mod.add_relu_mul(a, b, e, torch.empty(n), n)
        print("no error")
    except fuselab.LaunchError as error:
        print("LaunchError:", error)
print("alive")
"""


@pytest.mark.parametrize("sync", [0, 1], ids=["loop", "fibers"])
def test_a_wild_pointer_is_a_launch_error_not_a_dead_kernel(sync, tmp_path):
    """A kernel that writes far outside its tensors must not kill the Python process (a student's Jupyter
    kernel): the emulation reports the fault as cudaErrorIllegalAddress, names the kernel and the thread, and the
    module keeps working."""
    import os
    import subprocess
    import sys

    from .conftest import REPO
    source = WILD.replace("SYNC", str(sync)).replace("STRIDE", str(1 << 40))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", WILD_SCRIPT, source, str(sync)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    said = done.stdout
    assert done.returncode == 0 and said.rstrip().endswith("alive"), (done.returncode, said, done.stderr[-2000:])
    assert said.count("cudaErrorIllegalAddress") == 2 and "illegal memory access" in said, said
    assert "kernel k launched at" in said and "thread (" in said, said


def test_a_fold_that_scales_the_conv_weight_in_place_is_told_so():
    """Lab 2: `conv_w.mul_(scale)` changed the input; the check compared with a fold of the changed weight and
    reported '215 of 216 elements bad' instead of naming the in-place change."""
    from fuselab.labs import lab2

    def fold(conv_w, conv_b, mean, var, eps, gamma, beta):
        scale = torch.rsqrt(var + eps) * (gamma if gamma is not None else 1)
        w = conv_w.data.mul_(scale.reshape((-1,) + (1,) * (conv_w.dim() - 1)))  # the bug
        b = ((conv_b if conv_b is not None else torch.zeros_like(mean)) - mean) * scale
        return w, b + (beta if beta is not None else 0)

    case = random.Random(11).choice([c for c in lab2.FOLD_CASES if c.get("dtype", torch.float32) == torch.float32])
    with pytest.raises(AssertionError) as raised:
        lab2.check_fold_weights(fold, [case])
    assert "modified its input conv_w in place" in str(raised.value), str(raised.value)


@pytest.mark.parametrize("mistake", ["no eps", "eps outside"])
def test_a_fold_without_eps_under_the_root_says_so(mistake):
    """Lab 2's eps pitfall: the weight check names it instead of 'every wrong value is 1.000049 × the expected'."""
    from fuselab.labs import lab2

    def fold(conv_w, conv_b, mean, var, eps, gamma, beta):
        root = torch.sqrt(var) if mistake == "no eps" else torch.sqrt(var) + eps
        scale = (gamma if gamma is not None else 1) / root
        w = conv_w * scale.reshape((-1,) + (1,) * (conv_w.dim() - 1))
        b = ((conv_b if conv_b is not None else torch.zeros_like(mean)) - mean) * scale
        return w, b + (beta if beta is not None else 0)

    # where eps is large enough to matter in fp32 (with eps = 1e-5 and unit variances the fold is within tolerance)
    cases = [c for c in lab2.FOLD_CASES if c.get("dtype", torch.float32) == torch.float32 and c.get("eps", 1e-5) >= 1e-3]
    assert cases
    expected = "eps is left out" if mistake == "no eps" else "eps is added outside the square root"
    for case in cases:
        with pytest.raises(AssertionError) as raised:
            lab2.check_fold_weights(fold, [case], seed=random.Random(12).randint(0, 99))
        assert expected in str(raised.value), (case["name"], str(raised.value))


# ------------------------------------------------------------------------------------------ fp16: rounding twice
ACC_STORE = "float v = acc + (bias ? to_float(bias[col]) : 0.0f);  // bias added in fp32, before the single rounding"
# Lab 3's template rounding twice, as students write it: A·B rounded to half, then the bias added (in half, or
# after converting back, or by a second kernel over C, the unfused pipeline in disguise)
DOUBLE_ROUNDINGS = {
    "converted back": (ACC_STORE, "float v = __half2float(__float2half(acc)) + (bias ? to_float(bias[col]) : 0.0f);"),
    "added in half": (ACC_STORE, "float v = to_float(T(acc) + (bias ? bias[col] : T(0.0f)));"),
    "second kernel": None,  # the sample's unfused pipeline in disguise, with the bias in its second kernel
}


def _double_rounding_template(kind):
    source = _lab_source("lab3", "TEMPLATE_SOURCE")
    if DOUBLE_ROUNDINGS[kind]:
        old, new = DOUBLE_ROUNDINGS[kind]
        assert old in source
        return source.replace(old, new)
    # the GEMM stores A·B (one rounding) and a kernel of the student's own adds the bias to it (a second)
    old = "        store(&c[(int64_t)row * N + col], relu ? fmaxf(v, 0.0f) : v);"
    launch = "    gemm_bias_act_kernel<T><<<grid, block, 0, stream>>>(a, b, bias, c, M, N, K, relu);\n"
    assert old in source and launch in source
    second = ("template <typename T>\n__global__ void bias_act_in_place(T* c, const T* bias, int M, int N, int relu) {\n"
              "    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
              "    if (i >= (int64_t)M * N) return;\n"
              "    float v = to_float(c[i]) + (bias ? to_float(bias[i % N]) : 0.0f);\n"
              "    store(&c[i], relu ? fmaxf(v, 0.0f) : v);\n}\n\n")
    source = source.replace(ACC_STORE, "float v = acc;").replace(old, "        store(&c[(int64_t)row * N + col], v);")
    source = source.replace("template <typename T>\nstatic void launch(", second + "template <typename T>\nstatic void launch(")
    return source.replace(launch, launch + "    bias_act_in_place<T><<<(unsigned)(((int64_t)M * N + 255) / 256), 256, 0, "
                                           "stream>>>(c, bias, M, N, relu);\n")


@pytest.mark.parametrize("kind", list(DOUBLE_ROUNDINGS))
def test_lab3_rounding_twice_in_fp16_fails_the_visible_test_and_says_round_once(kind):
    """A·B rounded to half before the bias is added: within the fp16 tolerance on random inputs (the intermediate is
    as large as the result), so the visible test needs cases where the bias cancels A·B; they must fail, and say to
    add the bias to the fp32 accumulator and round once. The same cases pass the solution's single rounding."""
    from fuselab.labs import lab3
    make16 = lambda s, seed: lab3.make_inputs(s, seed, device="cpu", dtype=torch.float16)  # noqa: E731
    seeds = (random.Random(13).randint(0, 99),)
    for name, source in (("right", _lab_source("lab3", "TEMPLATE_SOURCE")),
                         (kind, _double_rounding_template(kind))):
        mod = fuselab.build(source, lab3.FUSED_LAUNCHERS, name=f"msg_round_{name.replace(' ', '_')}",
                            backend="emulate")
        random_inputs = fuselab.check(lab3.fused(mod), lab3.reference, make16, lab3.SMALL_SHAPES, seeds=seeds,
                                      verbose=False, raise_on_fail=False)
        assert random_inputs.passed, (name, random_inputs.report())  # why a case built for it is needed
        for shapes in (lab3.CANCELLING_SHAPES, lab3.HIDDEN_CANCELLING_SHAPES):  # the visible test, the hidden one
            result = fuselab.check(lab3.fused(mod), lab3.reference, make16, shapes, seeds=seeds, verbose=False,
                                   raise_on_fail=False)
            if name == "right":
                assert result.passed, result.report()
                continue
            report = result.report()
            assert len(result.failures) == len(shapes), report
            assert "Round once: add the bias to the fp32 accumulator before converting to half" in report, report
            assert report.count("Round once") == 1, report  # said once, not once per failing case


# ------------------------------------------------------------------------------------------ empty inputs, Labs 1-3
def _empty_guard_cases():
    """(id, lab, source variable, (guard as written, without it), op, reference, make_inputs, the notebook's visible
    cases, the guard the message must name) for every launcher of Labs 1-3 that the visible tests check."""
    from fuselab.labs import lab1, lab2, lab3

    def conv_make(case, seed):
        return lab1.make_conv_inputs(case, seed)

    def depthwise_make(case, seed):
        return lab1.make_depthwise_inputs(case, seed)

    def bias_act(mod):  # the notebook's bias_act and make_bias_act (Lab 3, Exercise A.1)
        return lambda x, bias, relu, out: mod.bias_act_f32(x, bias, out, x.shape[0], x.shape[1], relu)

    def bias_act_make(shape, seed):
        m, n, _, has_bias, relu = lab3.full_shape(shape)
        return torch.randn(m, n), torch.randn(n) if has_bias else torch.empty(0), int(relu)

    def bias_act_reference(x, bias, relu):
        y = x + bias if bias.numel() else x
        return torch.relu(y) if relu else y

    def activation_make(shape, seed):
        return torch.randn(shape), "leaky_relu", 0.1

    conv_guard = ("    if (N <= 0 || K <= 0 || P <= 0 || Q <= 0) return;\n", "")
    gemm_guard = ("    if (M <= 0 || N <= 0) return;\n", "")
    return [
        ("lab1 conv2d", "lab1", "CONV_SOURCE", conv_guard, lab1.conv, lab1.conv_only_reference, conv_make,
         lab1.SMALL_CONV_CASES, "if (N > 0 && K > 0 && P > 0 && Q > 0)"),
        ("lab1 activation", "lab1", "CONV_SOURCE", ("if (n > 0) activation_kernel", "activation_kernel"),
         lab1.activation_op, lambda x, a, s: lab1.activate(x, a, s), activation_make, [(1,), (257,), (3, 5, 7), (0,)],
         "if (n > 0)"),
        ("lab1 conv2d_act", "lab1", "CONV_ACT_SOURCE", conv_guard, lab1.conv_fused, lab1.conv_reference, conv_make,
         lab1.SMALL_CONV_CASES, "if (N > 0 && K > 0 && P > 0 && Q > 0)"),
        ("lab1 depthwise", "lab1", "DEPTHWISE_SOURCE", ("    if (planes <= 0 || H <= 0 || W <= 0) return;\n", ""),
         lab1.depthwise_fused, lab1.depthwise_reference, depthwise_make, lab1.SMALL_DEPTHWISE_CASES,
         "if (N > 0 && C > 0 && H > 0 && W > 0)"),
        ("lab2 fused", "lab2", "FUSED_SOURCE", ("    if (total > 0)\n", ""), lab2.fused, lab2.reference,
         lab2.make_inputs, lab2.SMALL_SHAPES, "if (N > 0 && C > 0 && H > 0 && W > 0)"),
        ("lab2 in registers", "lab2", "IN_REGISTERS_SOURCE", ("    if (total > 0)\n", ""), lab2.in_registers,
         lab2.reference, lab2.make_inputs, lab2.SMALL_SHAPES, "if (N > 0 && C > 0 && H > 0 && W > 0)"),
        ("lab3 bias_act", "lab3", "BIAS_ACT_SOURCE", ("if (n > 0) bias_act_kernel", "bias_act_kernel"), bias_act,
         bias_act_reference, bias_act_make, lab3.SMALL_SHAPES, "if (M > 0 && N > 0)"),
        ("lab3 fused", "lab3", "FUSED_SOURCE", gemm_guard, lab3.fused, lab3.reference,
         lambda s, seed: lab3.make_inputs(s, seed), lab3.SMALL_SHAPES, "if (M > 0 && N > 0)"),
        ("lab3 template", "lab3", "TEMPLATE_SOURCE", gemm_guard, lab3.fused, lab3.reference,
         lambda s, seed: lab3.make_inputs(s, seed, dtype=torch.float16), lab3.SMALL_SHAPES, "if (M > 0 && N > 0)"),
    ]


@pytest.mark.parametrize("case", _empty_guard_cases(), ids=lambda case: case[0])
def test_a_launcher_without_an_empty_input_guard_fails_the_visible_test_and_names_the_guard(case):
    """Labs 1-3 as Lab 0 (tests/test_lab0.py): an empty input (batch 0, M = 0, N = 0, n = 0) must launch nothing,
    since CUDA refuses a grid of 0 blocks ("invalid configuration argument"; the emulation fails the same way). The
    visible cases include an empty one; the solution passes it, the launcher without its guard fails it, and the
    message names the guard as Lab 0's does: the size that is 0 and `if (... > 0) kernel<<<...>>>(...)`."""
    label, lab, variable, (guard, unguarded), op, reference, make_inputs, shapes, condition = case
    solution = _lab_source(lab, variable)
    assert solution.count(guard) >= 1, label
    from fuselab.labs import lab_modules
    launchers = lab_modules()[lab].SOLUTION_SOURCES[variable]
    empty = [s for s in shapes if any(v == 0 and not isinstance(v, bool) for v in tuple(s)[:4])]  # a size of 0
    assert empty, f"{label}: no empty case among the visible ones"
    seeds = (random.Random(14).randint(0, 99),)
    name = "msg_guard_" + label.replace(" ", "_")
    right = fuselab.build(solution, launchers, name=name + "_right", backend="emulate")
    fuselab.check(op(right), reference, make_inputs, shapes, seeds=seeds, verbose=False)
    wrong = fuselab.build(solution.replace(guard, unguarded), launchers, name=name, backend="emulate")
    result = fuselab.check(op(wrong), reference, make_inputs, shapes, seeds=seeds, verbose=False, raise_on_fail=False)
    assert [tuple(f.shape) for f in result.failures] == [tuple(s) for s in empty], result.report()
    report = result.report()
    assert "invalid configuration argument" in report and "there is nothing to compute" in report, report
    assert f"`{condition} kernel<<<...>>>(...)`" in report, report
    assert "= 0: there is nothing to compute" in report, report  # the size that is 0, named


def test_a_grid_that_rounds_down_is_not_called_empty_when_a_flag_or_the_padding_is_0():
    """A size argument of 0 that is not a size (Lab 3's `relu`, Lab 1's `pad`) while the output has elements: the
    grid of 0 blocks is a rounding-down bug, and the message must say so, not "relu = 0: nothing to compute"."""
    from fuselab.labs import lab1, lab3
    text = _lab_source("lab3", "FUSED_SOURCE").replace("grid((N + TILE - 1) / TILE,", "grid(N / TILE,")
    mod = fuselab.build(text, [lab3.FUSED_F32], name="msg_gemm_round_down", backend="emulate")
    n = random.Random(15).randint(2, 15)
    a, b, bias, relu = lab3.make_inputs((3, n, 5, True, False), 0)
    with pytest.raises(fuselab.LaunchError) as raised:
        lab3.fused(mod)(a, b, bias, relu, torch.empty(3, n))
    said = str(raised.value)
    assert "rounds down" in said and "nothing to compute" not in said and "relu = 0" not in said, said
    text = _lab_source("lab1", "CONV_SOURCE").replace("dim3 grid((P * Q + 255) / 256, K, N);",
                                                      "dim3 grid(P * Q / 256, K, N);")
    mod = fuselab.build(text, lab1.SOLUTION_SOURCES["CONV_SOURCE"], name="msg_conv_round_down", backend="emulate")
    x, w, bias, stride, pad, act, slope = lab1.make_conv_inputs(lab1.ConvCase(1, 2, 9, 11, 3, 3, 1, 0), 0)
    with pytest.raises(fuselab.LaunchError) as raised:
        lab1.conv(mod)(x, w, bias, stride, pad, act, slope, torch.empty(1, 3, 7, 9))
    said = str(raised.value)
    assert "rounds down" in said and "nothing to compute" not in said and "pad = 0" not in said, said


# ------------------------------------------------------------------------------------------ Lab 2: eps left out
def _lab2_functions():
    """The solution notebook's fold_conv_bn_weights and fold_conv_bn, as a student's cells define them."""
    import copy
    import json

    from fuselab import notebook as ipynb

    from .conftest import REPO
    namespace = {"torch": torch, "nn": torch.nn, "copy": copy}
    for cell in json.loads((REPO / "solutions/lab2/lab2.ipynb").read_text())["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") in ("fold_weights", "fold_module"):
            exec(ipynb.source(cell), namespace)
    return namespace


def test_a_fold_without_eps_fails_at_the_default_eps_and_says_eps_is_left_out():
    """`sqrt(var)` for `sqrt(var + eps)` with eps = 1e-5: running variances of about 1 hide it (a 5e-6 relative
    change, within fp32's tolerance), so the visible and the hidden fold checks have default-eps cases with some
    channels' variances between 1e-6 and 1e-4; there the fold must fail, and the hint name the mistake."""
    from fuselab.labs import lab2
    namespace = _lab2_functions()
    right = namespace["fold_conv_bn_weights"]

    def no_eps(conv_w, conv_b, mean, var, eps, gamma, beta):  # the bug: eps never reaches the square root
        return right(conv_w, conv_b, mean, var, 0.0, gamma, beta)

    def fold_conv_bn(conv, bn):  # the student's module fold, calling their weight fold
        namespace["fold_conv_bn_weights"] = no_eps
        try:
            return namespace["fold_conv_bn"](conv, bn)
        finally:
            namespace["fold_conv_bn_weights"] = right

    seed = random.Random(16).randint(0, 99)
    for cases in (lab2.FOLD_CASES, lab2.HIDDEN_FOLD_CASES):  # what test_fold_weights and test_fold_module check
        default = [c for c in cases if c.get("eps", 1e-5) == 1e-5 and c.get("small_variances")]
        assert default, "no case where eps = 1e-5 matters"
        lab2.check_fold_weights(right, default, seed=seed)
        lab2.check_fold_module(namespace["fold_conv_bn"], default, seed=seed)
        for case in default:
            for check, fold in ((lab2.check_fold_weights, no_eps), (lab2.check_fold_module, fold_conv_bn)):
                with pytest.raises(AssertionError) as raised:
                    check(fold, [case], seed=seed)
                said = str(raised.value)
                assert "eps is left out: the scale is 1/sqrt(var), not 1/sqrt(var + eps)" in said, (case["name"], said)


# ------------------------------------------------------------------------------------------ reads past an input
def test_a_read_past_the_end_of_an_input_fails_every_time_with_the_nan_hint():
    """Lab 3's A tile loaded without `k0 + tx < K`: the value read past a row (or past A) is multiplied by a zero
    of the B tile, so with whatever memory lies there the case passed or failed by chance (a hidden result that
    changed from run to run). Inputs sit between NaN bands in every check: NaN * 0 is NaN, and the read shows."""
    from fuselab.labs import lab3
    good = "a_tile[ty][tx] = (row < M && k0 + tx < K) ? a[(int64_t)row * K + k0 + tx] : 0.0f;"
    text = _lab_source("lab3", "FUSED_SOURCE")
    assert good in text
    mod = fuselab.build(text.replace(good, "a_tile[ty][tx] = (row < M) ? a[(int64_t)row * K + k0 + tx] : 0.0f;"),
                        [lab3.FUSED_F32], name="msg_read_past_a", backend="emulate")
    make = lambda s, seed: lab3.make_inputs(s, seed)  # noqa: E731
    seeds = (random.Random(17).randint(0, 99),)
    for _ in range(2):  # the same verdict each time
        result = fuselab.check(lab3.fused(mod), lab3.reference, make, lab3.SMALL_SHAPES, seeds=seeds, verbose=False,
                               raise_on_fail=False)
        assert not result.passed
        assert "an input read out of bounds (the tests put NaN just before and after every input" in result.report()
    right = fuselab.build(text, [lab3.FUSED_F32], name="msg_read_past_a_right", backend="emulate")
    fuselab.check(lab3.fused(right), lab3.reference, make, lab3.SMALL_SHAPES, seeds=seeds, verbose=False)


# ------------------------------------------------------------------------------------------ hints on tiny cases
def test_a_bug_that_only_some_cases_show_is_named_by_what_sets_them_apart_not_by_the_tiny_first_case():
    """Lab 1's depthwise kernel that ignores the bias: the first failing case is a 1×1 output that the ReLU makes 0,
    which read as "the kernel stores zeros (integer division?)"; the telling fact is that every case with
    bias=True fails and every case with bias=False passes. Patterns need enough elements to mean something."""
    from fuselab.labs import lab1
    text = _lab_source("lab1", "DEPTHWISE_SOURCE")
    assert "float acc = bias ? bias[c] : 0.0f;" in text
    mod = fuselab.build(text.replace("float acc = bias ? bias[c] : 0.0f;", "float acc = 0.0f;"),
                        lab1.SOLUTION_SOURCES["DEPTHWISE_SOURCE"], name="msg_bias_ignored", backend="emulate")
    result = fuselab.check(lab1.depthwise_fused(mod), lab1.depthwise_reference, lab1.make_depthwise_inputs,
                           lab1.SMALL_DEPTHWISE_CASES, seeds=(random.Random(18).randint(0, 99),), verbose=False,
                           raise_on_fail=False)
    report = result.report()
    assert not result.passed
    assert "every case with bias=True fails, and every case with bias=False passes" in report, report
    assert "the kernel stores zeros" not in report and "integer division" not in report, report


def test_a_3x3_output_is_too_small_to_blame_its_border():
    """8 of a 3×3 output's 9 elements are border: a missing ReLU there is no padding bug."""
    from fuselab.check.hints import Evidence, hint_for
    expected = torch.tensor([[[-1.0, 2.0, -3.0], [4.0, 5.0, -6.0], [7.0, -8.0, 9.0]]], dtype=torch.float64)
    got = expected.clone()
    expected = expected.clamp(min=0)  # the ReLU the kernel forgot; the centre (5) is right either way
    bad = (got - expected).abs() > 0
    hint = hint_for(Evidence(got, expected, bad, torch.zeros_like(bad), torch.zeros_like(got), "y", torch.float32))
    assert "border" not in hint and "ReLU" in hint, hint


# ------------------------------------------------------------------------------------------ index mistakes
def _conv_check(text, name, cases, seeds=(0,)):
    from fuselab.labs import lab1
    mod = fuselab.build(text, lab1.SOLUTION_SOURCES["CONV_SOURCE"], name=name, backend="emulate")
    return fuselab.check(lab1.conv(mod), lab1.conv_only_reference, lambda c, seed: lab1.make_conv_inputs(c, seed),
                         cases, seeds=seeds, verbose=False, raise_on_fail=False)


def _depthwise_check(text, name, cases=None, seeds=(0,)):
    from fuselab.labs import lab1
    mod = fuselab.build(text, lab1.SOLUTION_SOURCES["DEPTHWISE_SOURCE"], name=name, backend="emulate")
    return fuselab.check(lab1.depthwise_fused(mod), lab1.depthwise_reference, lab1.make_depthwise_inputs,
                         cases or lab1.SMALL_DEPTHWISE_CASES, seeds=seeds, verbose=False, raise_on_fail=False)


@pytest.mark.parametrize("bug", ["n = 0", "one block along z", "first plane only"])
def test_a_batch_or_plane_index_that_is_not_the_grids_says_only_the_first_item_is_right(bug):
    """The batch (or plane) index taken as 0, or a grid with one block along z: only out[0] (the first plane) is
    right. The hint said the grid stops short and to round the block count up, which points at the launcher's x."""
    from fuselab.labs import lab1
    seeds = (random.Random(19).randint(0, 99),)
    if bug == "first plane only":
        text = _lab_source("lab1", "DEPTHWISE_SOURCE")
        loop = "for (int p = blockIdx.z; p < planes; p += gridDim.z) {"
        assert loop in text
        result = _depthwise_check(text.replace(loop, "for (int p = 0; p < 1; ++p) {"), "msg_first_plane", seeds=seeds)
        said = "(index 0 along dimension 1) is right"  # a batch of 1: its planes are its channels
    else:
        text = _lab_source("lab1", "CONV_SOURCE")
        old, new = {"n = 0": ("int k = blockIdx.y, n = blockIdx.z;", "int k = blockIdx.y, n = 0;"),
                    "one block along z": ("dim3 grid((P * Q + 255) / 256, K, N);",
                                          "dim3 grid((P * Q + 255) / 256, K, 1);")}[bug]
        assert old in text
        result = _conv_check(text.replace(old, new), "msg_batch_" + bug.replace(" ", "_"), lab1.SMALL_CONV_CASES, seeds)
        said = "only `out[0]` (index 0 along dimension 0) is right"
    report = result.report()
    assert not result.passed and said in report and "every thread works on the first one" in report, report
    assert "blockIdx.z" in report and "round the number of blocks up" not in report, report


def test_a_wrong_batch_stride_says_the_offset_of_each_item_is_wrong():
    """`x + (n + c) * H * W` for `x + (n * C + c) * H * W`: every batch item is written, and only item 0 (whose
    offset is 0 whatever the stride) is right. The hint said every thread works on the first item, use blockIdx.z."""
    from fuselab.labs import lab1
    old = "const float* xc = x + ((size_t)n * C + c) * H * W;"
    text = _lab_source("lab1", "CONV_SOURCE")
    assert old in text
    result = _conv_check(text.replace(old, "const float* xc = x + ((size_t)n + c) * H * W;"), "msg_batch_stride",
                         lab1.SMALL_CONV_CASES, (random.Random(30).randint(0, 99),))
    report = result.report()
    assert not result.passed and "only `out[0]` (index 0 along dimension 0) is right" in report, report
    assert "written, but wrong" in report and "offset of each item is computed wrongly" in report, report
    assert "every thread works on the first one" not in report and "blockIdx.z" not in report, report


def test_a_size_used_as_the_batch_index_says_every_write_landed_outside():
    """`n = C` (a size where blockIdx.z belongs): every write lands past the output. "Nothing was written: did the
    kernel launch?" pointed away from the index."""
    from fuselab.labs import lab1
    rng = random.Random(20)
    text = _lab_source("lab1", "CONV_SOURCE").replace("int k = blockIdx.y, n = blockIdx.z;",
                                                      "int k = blockIdx.y, n = C;")
    case = lab1.ConvCase(1, 1, rng.randint(4, 9), rng.randint(4, 9), rng.randint(1, 3), 3, 1, 1, True, "none")
    report = _conv_check(text, "msg_batch_size", [case]).report()
    assert "nothing was written inside `out`, but" in report and "a size (N, C, K, ...) where an index" in report, \
        report
    assert "Did the kernel launch" not in report, report


@pytest.mark.parametrize("bug", ["conv input row", "conv bound", "conv output pixel", "depthwise input row",
                                 "depthwise bound"])
def test_h_and_w_swapped_says_only_square_images_are_right(bug):
    """H for W in an index or a bound: right exactly where H == W. The visible cases hold square images, and the
    report says that every square case passes and every other fails."""
    variable, old, new = {
        "conv input row": ("CONV_SOURCE", "acc += xc[(size_t)ih * W + iw]", "acc += xc[(size_t)ih * H + iw]"),
        "conv bound": ("CONV_SOURCE", "if (iw < 0 || iw >= W) continue;", "if (iw < 0 || iw >= H) continue;"),
        "conv output pixel": ("CONV_SOURCE", "int p = pq / Q, q = pq % Q;", "int p = pq / P, q = pq % P;"),
        "depthwise input row": ("DEPTHWISE_SOURCE", "acc += xp[(size_t)ih * W + iw]",
                                "acc += xp[(size_t)ih * H + iw]"),
        "depthwise bound": ("DEPTHWISE_SOURCE", "if (iw < 0 || iw >= W) continue;",
                            "if (iw < 0 || iw >= H) continue;"),
    }[bug]
    text = _lab_source("lab1", variable)
    assert old in text, bug
    name, seeds = "msg_hw_" + bug.replace(" ", "_"), (random.Random(21).randint(0, 99),)
    from fuselab.labs import lab1
    result = (_conv_check(text.replace(old, new), name, lab1.SMALL_CONV_CASES, seeds) if variable == "CONV_SOURCE"
              else _depthwise_check(text.replace(old, new), name, seeds=seeds))
    report = result.report()
    assert not result.passed, bug
    assert "every case with H == W passes, and " in report and "with H != W fail" in report, report
    assert "a square image" in report, report


@pytest.mark.parametrize("kernel", ["gemm", "depthwise"])
def test_a_grid_with_x_and_y_swapped_is_not_called_a_grid_that_rounds_down(kernel):
    """The blocks along x computed from the rows and along y from the columns: rows (or columns) from some index on
    are never written. The hint said to round the block count up, which the launcher already does; the index
    where the output stops is the other dimension's size rounded up (Lab 3), or no rounding of this one (Lab 1)."""
    seeds = (random.Random(22).randint(0, 99),)
    if kernel == "gemm":
        from fuselab.labs import lab3
        text = _lab_source("lab3", "FUSED_SOURCE")
        old = "grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE)"
        assert old in text
        mod = fuselab.build(text.replace(old, "grid((M + TILE - 1) / TILE, (N + TILE - 1) / TILE)"), [lab3.FUSED_F32],
                            name="msg_grid_swap_gemm", backend="emulate")
        result = fuselab.check(lab3.fused(mod), lab3.reference, lambda s, seed: lab3.make_inputs(s, seed),
                               lab3.SMALL_SHAPES, seeds=seeds, verbose=False, raise_on_fail=False)
        said = "rounded up to a multiple of 16"
    else:
        text = _lab_source("lab1", "DEPTHWISE_SOURCE")
        old = "dim3 grid((W + 31) / 32, (H + 7) / 8,"
        assert old in text
        result = _depthwise_check(text.replace(old, "dim3 grid((H + 7) / 8, (W + 31) / 32,"), "msg_grid_swap_dw",
                                  seeds=seeds)
        said = "is not 19 rounded down to a block size"
    report = result.report()
    assert not result.passed and said in report and "Are the grid's x and y swapped" in report, report
    assert "only the first 16 elements" not in report, report


def test_two_indices_taken_from_each_others_grid_axis_are_called_swapped():
    """`n = blockIdx.y, k = blockIdx.z` in Lab 1's conv: the channels from N on are never written and the writes of
    the batch items past the first land past the output; the hint said the grid stops short along the channels."""
    from fuselab.labs import lab1
    text = _lab_source("lab1", "CONV_SOURCE").replace("int k = blockIdx.y, n = blockIdx.z;",
                                                      "int n = blockIdx.y, k = blockIdx.z;")
    rng = random.Random(23)
    case = lab1.ConvCase(2, 2, rng.randint(5, 9), rng.randint(5, 9), rng.randint(4, 6), 3, 1, 1, True, "none")
    report = _conv_check(text, "msg_index_swap", [case]).report()
    assert "2 is the size of dimension 0" in report and "Are the two indices swapped" in report, report
    assert "round the number of blocks up" not in report, report


# ------------------------------------------------------------------------------------------ barriers
def _lab3_barrier_bug(variable, old, new, name):
    from fuselab.labs import lab3
    text = _lab_source("lab3", variable)
    assert old in text, old
    launchers = [lab3.FUSED_F32] if variable == "FUSED_SOURCE" else lab3.FUSED_LAUNCHERS
    mod = fuselab.build(text.replace(old, new), launchers, name=name, backend="emulate")
    result = fuselab.check(lab3.fused(mod), lab3.reference, lambda s, seed: lab3.make_inputs(s, seed),
                           lab3.SMALL_SHAPES, seeds=(random.Random(24).randint(0, 99),), verbose=False,
                           raise_on_fail=False)
    return mod, text.replace(old, new), result


@pytest.mark.parametrize("variable", ["FUSED_SOURCE", "TEMPLATE_SOURCE"])
def test_a_missing_second_barrier_is_called_a_race_from_a_rerun_in_another_thread_order(variable):
    """Lab 3 without the `__syncthreads()` after the tile loop: the next iteration's loads overwrite tiles other
    threads still read. Under the emulation that is wrong every time, with no hint at all; the check reruns the
    first failing case with the threads in reverse order, sees the result change, and says it is a race."""
    second = "        __syncthreads();  // everyone is done reading before the next iteration overwrites them\n"
    old = {"FUSED_SOURCE": second,
           "TEMPLATE_SOURCE": "        for (int kk = 0; kk < TILE; ++kk) acc += a_tile[ty][kk] * b_tile[kk][tx];\n"
                              "        __syncthreads();\n"}[variable]
    new = "" if variable == "FUSED_SOURCE" else old.replace("        __syncthreads();\n", "")
    mod, _, result = _lab3_barrier_bug(variable, old, new, f"msg_race_{variable.lower()}")
    report = result.report()
    assert not result.passed and "the result depends on the order the threads of a block run in" in report, report
    assert "set_thread_order(\"reverse\")" in report and "`__syncthreads()`" in report, report
    assert report.count("the result depends on the order") == 1, report  # one rerun per check, said once
    # observed evidence first; and the only square shapes, (1, 1, 1) and (16, 16, 16), have K within one tile,
    # which separates the same cases: no "one is used where the other belongs"
    assert report.split("\n\n")[1].startswith("the emulation saw, in "), report
    assert "one is used where the other belongs" not in report, report
    assert mod.thread_order == ("forward", 0), mod.thread_order  # the rerun put the order back


@pytest.mark.parametrize("bug", ["barrier in a branch", "return before the loop"])
def test_a_barrier_that_not_every_thread_reaches_is_named_with_its_line(bug):
    """A `__syncthreads()` inside an `if` that only the threads of C take, or a `return` before the tile loop: the
    report said NaN (or nothing), and now says which barrier not every thread of the block reached."""
    first = "        __syncthreads();  // the tiles are complete before anyone reads them\n"
    old, new = {
        "barrier in a branch": (first, "        if (row < M && col < N) __syncthreads();\n"),
        "return before the loop": ("    float acc = 0.0f;\n",
                                   "    float acc = 0.0f;\n    if (row >= M || col >= N) return;\n"),
    }[bug]
    _, text, result = _lab3_barrier_bug("FUSED_SOURCE", old, new, "msg_divergent_" + bug.replace(" ", "_"))
    line = 1 + text[:text.index("__syncthreads();")].count("\n")
    report = result.report()
    assert not result.passed and re.search(rf"the __syncthreads\(\) at line {line}\b", report), report
    if bug == "barrier in a branch":
        assert "threads met at two different barriers" in report and "a branch that not every thread" in report
    else:
        assert "had exited without reaching it" in report, report


# ------------------------------------------------------------------------------------------ Lab 2: eps in registers
@pytest.mark.parametrize("bug", ["/ (sqrtf(var[c]) + eps)", "* (1.0f / (sqrtf(var[c]) + eps))"])
def test_eps_outside_the_square_root_in_registers_says_the_error_grows_where_the_variance_is_small(bug):
    """Lab 2's BN in registers with `1/(sqrtf(var) + eps)`: a few percent off in the channels with small variances,
    nearly right in the others. The visible cases include one with variances over six decades; the report reads
    from the data that the error is where `var` is small, and names eps outside the square root."""
    from fuselab.labs import lab2
    text = _lab_source("lab2", "IN_REGISTERS_SOURCE")
    old = "/ sqrtf(var[c] + eps)"
    assert old in text
    mod = fuselab.build(text.replace(old, bug), lab2.SOLUTION_SOURCES["IN_REGISTERS_SOURCE"],
                        name="msg_eps_registers_" + str(len(bug)), backend="emulate")
    assert any(isinstance(s, lab2.VarianceSpread) for s in lab2.SMALL_SHAPES)
    result = fuselab.check(lab2.in_registers(mod), lab2.reference, lab2.make_inputs, lab2.SMALL_SHAPES,
                           seeds=(random.Random(25).randint(0, 99),), verbose=False, raise_on_fail=False)
    report = result.report()
    assert not result.passed and "the error grows where `var` is smallest" in report, report
    assert "eps outside the square root" in report, report


# ------------------------------------------------------------------------------------------ Lab 2: channel index
@pytest.mark.parametrize("variable", ["FUSED_SOURCE", "IN_REGISTERS_SOURCE"])
@pytest.mark.parametrize("bug", ["int c = (int)(plane / C);", "int c = (int)(i % C);",
                                 "int c = (int)((plane + 1) % C);"])
def test_a_wrong_channel_index_says_the_per_channel_values_came_from_another_channel(variable, bug):
    """Lab 2's kernels with the channel of a plane p = n * C + c taken as `p / C` (the batch index), as `i % C` of
    the flat index, or off by one channel: the visible test's first hint said every output was 0 and asked whether
    the values before the ReLU were NaN (an input read out of bounds), which pointed away from the index. The
    report now says that each wrong value is what another channel's per-channel values give there, which the check
    tests by rerunning the reference, and names the channel index; the N = 1 case whose channel 0 gives only
    negative values before the ReLU (an all-zero output) names it first, before the NaN guess."""
    from fuselab.labs import lab2
    text = _lab_source("lab2", variable)
    old = "int c = (int)(plane % C);"
    assert old in text
    mod = fuselab.build(text.replace(old, bug), lab2.SOLUTION_SOURCES[variable],
                        name=f"msg_channel_{variable[:3].lower()}_{len(bug)}", backend="emulate")
    candidate = lab2.fused(mod) if variable == "FUSED_SOURCE" else lab2.in_registers(mod)
    seeds = (0, 1, 2) if "plane / C" in bug else (random.Random(33).randint(0, 99),)  # the visible test's seeds
    result = fuselab.check(candidate, lab2.reference, lab2.make_inputs, lab2.SMALL_SHAPES, seeds=seeds,
                           verbose=False, raise_on_fail=False)
    report = result.report()
    hints = [line.strip() for line in report.splitlines() if line.strip().startswith("hint:")]
    assert not result.passed and hints, report
    assert all("applied from the wrong channel" in hint and "`p % C`" in hint for hint in hints), report
    assert "another channel's per-channel values" in report, report
    assert "NaN" not in hints[0].split("applied from the wrong channel")[0], report  # the index first, any guess after
    said = {"int c = (int)(plane / C);": "`p / C`", "int c = (int)(i % C);": "changes from element to element",
            "int c = (int)((plane + 1) % C);": "each (n, c) plane holds another channel's values"}[bug]
    assert said in report, report


def test_the_channel_hint_stays_silent_where_no_other_channels_values_fit():
    """The channel rule reruns the reference with each channel's per-channel values: a wrong value no channel's
    values give (a missing bias, a constant shift) is not blamed on the channel index."""
    from fuselab.check.hints import Evidence, _channel_index_wrong
    from fuselab.labs import lab2
    made = lab2.make_inputs((2, 3, 5, 7), seed=4, dtype=torch.float64)
    x, w_f = made[0], made[7]
    inputs = dict(zip(["x", "w", "b", "mean", "var", "gamma", "beta", "w_folded", "b_folded"], made))

    def recompute(changed):
        return lab2.reference(*[changed.get(n, v) for n, v in inputs.items()])

    expected = recompute({})
    for got in (torch.nn.functional.conv2d(x, w_f.unsqueeze(1), None, padding=1, groups=3).relu(),  # no bias
                expected + 0.5):
        bad = (got - expected).abs() > 1e-9
        assert int(bad.sum()) >= 4
        ev = Evidence(got, expected, bad, torch.zeros_like(bad), torch.full_like(got, 1e-9), "out", torch.float32,
                      inputs, recompute=recompute)
        assert _channel_index_wrong(ev) == ""
    # and where one channel's values were read for another's, it speaks
    got = expected.clone()
    swapped = recompute({n: v[[1, 0, 2]] for n, v in inputs.items() if n != "x"})
    got[:, 0] = swapped[:, 0]
    bad = (got - expected).abs() > 1e-9
    ev = Evidence(got, expected, bad, torch.zeros_like(bad), torch.full_like(got, 1e-9), "out", torch.float32, inputs,
                  recompute=recompute)
    assert "holds what channel 1's values give there" in _channel_index_wrong(ev)


# ------------------------------------------------------------------------------------------ template errors
def test_a_template_error_is_reported_once_with_the_instantiations_it_came_from():
    """Lab 3's template compiled for float and __half: a mistake in it was reported twice, as two errors."""
    from fuselab.labs import lab3
    text = _lab_source("lab3", "TEMPLATE_SOURCE")
    typo = random.Random(26).choice(["to_flaot", "to_floatt", "tofloat"])
    old = "? to_float(a[(int64_t)row * K + k0 + tx])"
    assert old in text
    with pytest.raises(fuselab.BuildError) as raised:
        fuselab.build(text.replace(old, old.replace("to_float", typo)), lab3.FUSED_LAUNCHERS,
                      name="msg_template_" + typo, backend="emulate")
    said = str(raised.value)
    assert len(re.findall(rf"[‘']{typo}[’'] was not declared", said)) == 1 and "(1 distinct error)" in said, said
    assert "2 instantiations of the template: T = float, T = __half" in said, said


def test_a_template_error_followed_by_a_note_keeps_its_instantiations_and_its_note_once():
    """g++ writes a note under an error (here: where the function is declared, later in the file), once per
    instantiation. The notes took the instantiations' labels meant for the errors, so the merged error no longer
    named its types, and the repeated note was reported as a repeated message of its own."""
    from fuselab.labs import lab3
    text = _lab_source("lab3", "TEMPLATE_SOURCE")
    name = random.Random(27).choice(["add_bias", "with_bias", "plus_bias"])
    old, launcher = "float v = acc + (bias ? to_float(bias[col]) : 0.0f);", "template <typename T>\nstatic void launch"
    assert old in text and launcher in text
    text = text.replace(old, f"float v = {name}(acc, bias ? to_float(bias[col]) : 0.0f);")
    text = text.replace(launcher, f"__device__ float {name}(float acc, float b) {{ return acc + b; }}\n\n{launcher}")
    with pytest.raises(fuselab.BuildError) as raised:
        fuselab.build(text, lab3.FUSED_LAUNCHERS, name="msg_template_note_" + name, backend="emulate")
    said, log = str(raised.value), raised.value.log
    assert len(re.findall(r"\berror:", log)) == 2 and len(re.findall(r"\bnote:", log)) == 2, log  # g++'s own
    assert len(re.findall(rf"error: [‘']{name}[’'] was not declared", said)) == 1, said
    assert "(1 distinct error)" in said, said
    assert "2 instantiations of the template: T = float, T = __half" in said, said
    assert said.count("declared here, later in the translation unit") == 1, said
    assert said.count("reported once for each") == 1 and "the compiler reported this" not in said, said


# ------------------------------------------------------------------------------------------ results that change run to run
SHARES = r'''
__global__ void sum_kernel(const float* x, float* total, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ADD;
}

__global__ void share_kernel(const float* x, const float* total, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] / *total;
}

void shares(const float* x, float* total, float* out, int64_t n, cudaStream_t stream) {
    unsigned blocks = (unsigned)((n + 255) / 256);
    ZERO
    sum_kernel<<<blocks, 256, 0, stream>>>(x, total, n);
    share_kernel<<<blocks, 256, 0, stream>>>(x, total, out, n);
}
'''
SHARES_LAUNCHER = ("void shares(const float* x /*[n]*/, float* total /*[1]*/, float* out /*[n]*/, int64_t n, "
                   "cudaStream_t stream)")


def _shares_check(add, zero, name, shapes, total=None):
    """x / x.sum() through a total the launcher adds into: ``total`` a workspace the candidate keeps from call to
    call, or a fresh one (zeroed by the launcher) each call."""
    mod = fuselab.build(SHARES.replace("ADD", add).replace("ZERO", zero), [SHARES_LAUNCHER], name=name,
                        backend="emulate")

    def candidate(x, out):
        mod.shares(x, total if total is not None else torch.empty(1), out, x.numel())

    def make_inputs(shape, seed):
        return (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) + 0.5,)

    result = fuselab.check(candidate, lambda x: x / x.sum(), make_inputs, shapes, seeds=(0,), verbose=False,
                           raise_on_fail=False)
    return mod, result


def test_a_candidate_that_keeps_its_workspace_is_not_called_a_race_between_threads():
    """A total kept from one call to the next and never reset: the first case is right, the next ones wrong, and
    every rerun differs from the one before. The rerun in reverse thread order differed, and the report called it a
    race between the threads of a block, a missing `__syncthreads()`: a rerun in the same order differs too."""
    n = random.Random(28).randint(300, 2000)
    mod, result = _shares_check("atomicAdd(total, x[i])", "", "msg_kept_workspace", [(n,), (n + 7,)],
                                total=torch.zeros(1))
    report = result.report()
    assert [case.passed for case in result.cases] == [True, False], report
    assert "the threads of a block" not in report and "__syncthreads" not in report, report
    assert "the result is not the same from run to run" in report and "from one call to the next" in report, report
    assert mod.thread_order == ("forward", 0) and mod.os_threads == 0, (mod.thread_order, mod.os_threads)


def test_a_race_between_blocks_is_not_called_a_race_between_the_threads_of_a_block():
    """`*total += x[i]` where atomicAdd belongs: blocks run at the same time (on the CPU's cores), the additions of
    one are lost to another's, and every run loses others. The rerun in reverse thread order differed, and the
    report blamed the order of a block's threads; the reruns now run the blocks one after another."""
    import os
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("blocks run at the same time only on two cores or more")
    shapes = [(random.Random(29).randint(1 << 19, 1 << 20),), (1 << 20,)]
    # on a 2-core machine busy with other work the blocks' threads may never overlap, and no addition is lost: the
    # race then did not happen, and there is nothing to report; a few tries, then a skip that says so
    for _ in range(3):
        mod, result = _shares_check("*total += x[i]", "cudaMemsetAsync(total, 0, sizeof(float), stream);",
                                    "msg_block_race", shapes)
        if not result.passed:
            break
    else:
        pytest.skip("the blocks never ran at the same time in three tries (a loaded machine): no race to report")
    report = result.report()
    assert "the threads of a block" not in report and "__syncthreads" not in report, report
    assert "the result is not the same from run to run" in report and "`atomicAdd` belongs" in report, report
    assert mod.thread_order == ("forward", 0) and mod.os_threads == 0, (mod.thread_order, mod.os_threads)


@pytest.mark.parametrize("bug", ["threadIdx only", "a loop from threadIdx"])
def test_a_plane_index_without_blockidx_says_so_not_round_the_blocks_up(bug):
    """`pq = threadIdx.x` for an (n, k) plane's output pixel (or a loop over the plane that starts at threadIdx.x and
    strides past it): in every plane exactly the first 256 pixels are written. With Q = 32 those are 8 whole rows,
    and the hint said everything from index 8 on along dimension 2 is never written: round the block count up."""
    from fuselab.labs import lab1
    text = _lab_source("lab1", "CONV_SOURCE")
    head = ("    int pq = blockIdx.x * blockDim.x + threadIdx.x;\n    int k = blockIdx.y, n = blockIdx.z;\n"
            "    if (pq >= P * Q) return;\n")
    tail = "    y[((size_t)n * K + k) * P * Q + pq] = acc;\n"
    assert head in text and tail in text
    if bug == "threadIdx only":
        text = text.replace(head, head.replace("blockIdx.x * blockDim.x + threadIdx.x", "threadIdx.x"))
    else:
        text = text.replace(head, "    int k = blockIdx.y, n = blockIdx.z;\n"
                                  "    for (int pq = threadIdx.x; pq < P * Q; pq += blockDim.x * gridDim.x) {\n")
        text = text.replace(tail, tail + "    }\n")
    rng = random.Random(31)
    cases = lab1.SMALL_CONV_CASES + [lab1.ConvCase(1, 2, rng.randint(10, 20), 32, 3, 3, 1, 1, True, "relu")]
    report = _conv_check(text, "msg_plane_" + bug.replace(" ", "_"), cases).report()
    assert "the index does not use blockIdx (everything from one block's worth on, in every plane" in report, report
    assert "round the number of blocks up" not in report and "along dimension 2" not in report, report


@pytest.mark.parametrize("kernel", ["pitfall", "fused"])
def test_a_bias_on_the_wrong_axis_with_a_relu_is_named_on_a_many_row_output(kernel):
    """Lab 3's `wrong_axis` pitfall (bias[i / N] for bias[i % N]) on (17, 31, 19) with a ReLU: no hint at all. The
    ReLU cuts some errors to 0, so no error is constant or depends on one dimension; where neither value is cut,
    each is off by exactly bias[row] - bias[col], and the diagonal is right."""
    from fuselab.labs import lab3
    rng = random.Random(32)
    if kernel == "pitfall":
        mod = fuselab.build(lab3.pitfall_source("wrong_axis"), lab3.UNFUSED_LAUNCHERS, name="msg_wrong_axis",
                            backend="emulate")
        op = lab3.unfused(mod)
    else:
        text = _lab_source("lab3", "FUSED_SOURCE")
        assert "(bias ? bias[col] : 0.0f)" in text
        mod = fuselab.build(text.replace("(bias ? bias[col] : 0.0f)", "(bias ? bias[row] : 0.0f)"), [lab3.FUSED_F32],
                            name="msg_wrong_axis_fused", backend="emulate")
        op = lab3.fused(mod)
    shapes = [(17, 31, 19, True, True), (rng.randint(5, 15), rng.randint(20, 40), rng.randint(2, 40), True, True)]
    result = fuselab.check(op, lab3.reference, lambda s, seed: lab3.make_inputs(s, seed), shapes,
                           seeds=(rng.randint(0, 99),), verbose=False, raise_on_fail=False)
    report = result.report()
    assert not result.passed and report.count("bias[row] instead of bias[col]") >= 2, report


def test_lab2_fold_checks_print_a_check_mark_when_they_pass(capsys):
    # the kernel tests print "✓ name: N cases passed"; the fold tests printed nothing, and a student could not
    # tell a passing cell from one that checked nothing
    import json

    from fuselab import notebook as ipynb
    from fuselab.labs import lab2

    from .conftest import REPO
    cells = json.loads((REPO / "solutions" / "lab2" / "lab2.ipynb").read_text())["cells"]
    by_id = {ipynb.grade_id(c): ipynb.source(c) for c in cells}
    namespace = {}
    for grade_id in ("setup", "fold_weights", "fold_module", "fold_network"):
        exec(by_id[grade_id], namespace)  # noqa: S102 - the course's own solution
    capsys.readouterr()
    lab2.check_fold_weights(namespace["fold_conv_bn_weights"], lab2.FOLD_CASES)
    lab2.check_fold_module(namespace["fold_conv_bn"], lab2.FOLD_CASES)
    lab2.check_refusals(namespace["fold_conv_bn"], fold_network=namespace["fold_network"])
    lab2.check_fold_network(namespace["fold_network"], lab2.visible_networks())
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 5 and all(line.startswith("✓ ") for line in said), said
    assert f"{len(lab2.FOLD_CASES)} cases passed" in said[0] and "training mode" in said[3], said


def test_lab1_output_size_without_plus_one_names_the_count_it_missed():
    # a bare `AssertionError: 2`, and the second assertion had no message at all
    from fuselab.labs import lab1
    for wrong in (lambda size, kernel, stride, pad: (size + 2 * pad - kernel) // stride,
                  lambda size, kernel, stride, pad: (size - kernel) // stride + 1):
        for case in lab1.VISIBLE_OUTPUT_SIZE_CASES:
            message = lab1.output_size_message(wrong(*case), *case)
            assert f"conv_output_size{case}" in message and str(lab1.conv_output_size(*case)) in message, message
    assert "+ 1" in lab1.output_size_message(2, 5, 3, 2, 1)
    assert "pad" in lab1.output_size_message(54, 56, 3, 1, 1)


def _lab3_fused_with(old, new, name):
    from fuselab.labs import lab3
    text = _lab_source("lab3", "FUSED_SOURCE")
    assert old in text
    mod = fuselab.build(text.replace(old, new), [lab3.FUSED_F32], name=name, backend="emulate")
    return fuselab.check(lab3.fused(mod), lab3.reference, lambda s, seed: lab3.make_inputs(s, seed, device="cpu"),
                         lab3.SMALL_SHAPES, verbose=False, raise_on_fail=False).report()


def test_a_k_loop_over_whole_tiles_only_is_named_as_the_dropped_k_tail():
    # the only hint suggested NaN or out-of-bounds reads; only the cases with K a multiple of 16 passed, unsaid
    report = _lab3_fused_with("for (int k0 = 0; k0 < K; k0 += TILE)", "for (int k0 = 0; k0 + TILE <= K; k0 += TILE)",
                              "msg_k_tail")
    assert "every case with K a multiple of 16 passes" in report and "tail of K" in report, report
    assert report.index("tail of K") < report.index("✗"), report  # before the cases, not after them


def test_a_load_guard_that_lets_k_reach_k_is_not_called_a_dropped_tail():
    """`k0 + tx <= K` in the A tile's guard: the partial tile reads one element past each row of A (past the end of
    A, NaN, on the last row), and only the cases with K a multiple of 16 pass. The headline said the loop stops
    before a partial step and drops the tail of K: the loop ran every step; a dropped tail gives no NaN."""
    report = _lab3_fused_with("(row < M && k0 + tx < K)", "(row < M && k0 + tx <= K)", "msg_k_guard")
    assert "every case with K a multiple of 16 passes" in report and "some with NaN" in report, report
    assert "`k0 + tx <= K` for `k0 + tx < K`" in report and "drops the tail" not in report, report


def test_a_b_stride_of_k_is_named_as_k_against_n():
    # named M-vs-N (the output's two sides) where the mix-up is K-vs-N
    report = _lab3_fused_with("b[(int64_t)(k0 + ty) * N + col]", "b[(int64_t)(k0 + ty) * K + col]", "msg_b_stride")
    assert "every case with N == K passes, and every case with N != K fails" in report, report
    assert "dimension 0 as along 1" not in report and "M == " not in report, report


def test_a_line_every_failing_case_repeats_is_said_once_with_a_count():
    from fuselab.check.report import _once
    hint = "    hint: NaN (not-a-number) values: a 0/0, a sqrt or log of a negative number, or a read of memory"
    report = _once("\n".join(["✗ case 1", hint, "✗ case 2", hint, "✗ case 3", hint]))
    assert report.count("hint: NaN") == 1 and "the same in 3 places" in report, report
    assert report.count("✗ case") == 3, report


GRID_Z_LOOP = "for (int p = blockIdx.z; p < planes; p += gridDim.z)"


@pytest.mark.parametrize("bug", ["no loop over gridDim.z", "the loop steps by one grid's worth of planes too many"])
def test_a_depthwise_kernel_without_the_loop_over_grid_z_fails_a_visible_test_that_names_why(bug):
    """No visible case had more than 65535 planes, so a kernel that takes its plane from blockIdx.z alone passed
    every visible test (only a note read from the source spoke of it). A visible case of 65600 one-pixel planes
    runs under the emulation in a second: it fails such a kernel, saying the planes past the grid's z were never
    computed and the loop that computes them; the solution passes it."""
    from fuselab.labs import lab1
    source = _lab_source("lab1", "DEPTHWISE_SOURCE")
    assert GRID_Z_LOOP in source
    wrong = {"no loop over gridDim.z": "for (int p = blockIdx.z; p < planes && p == blockIdx.z; ++p)",
             "the loop steps by one grid's worth of planes too many": GRID_Z_LOOP.replace("p += gridDim.z",
                                                                                          "p += 2 * gridDim.z")}[bug]
    assert lab1.MANY_PLANES_CASE.N * lab1.MANY_PLANES_CASE.C > 65535

    def op(text, name):
        mod = fuselab.build(text, lab1.SOLUTION_SOURCES["DEPTHWISE_SOURCE"], name=name, backend="emulate")
        return lab1.depthwise_fused(mod)

    lab1.check_many_planes(op(source, "msg_planes_ok"), lab1.make_depthwise_inputs)  # the solution passes
    buggy = op(source.replace(GRID_Z_LOOP, wrong), "msg_planes_" + str(len(bug)))
    # every other visible case passes: this is the one test that shows the bug before grading
    assert _depthwise_check(source.replace(GRID_Z_LOOP, wrong), "msg_planes_" + str(len(bug))).passed
    with pytest.raises(AssertionError) as raised:
        lab1.check_many_planes(buggy, lab1.make_depthwise_inputs)
    message = str(raised.value)
    assert "first 65535 planes are right" in message and "blockIdx.z alone" in message, message
    assert "p += gridDim.z" in message and "65 plane(s) past them are wrong (from plane 65535 on)" in message, message


def test_blocks_that_race_because_a_bounds_check_is_missing_are_told_so():
    """Lab 1's depthwise kernel without `if (ow >= W || oh >= H) return;`: the threads past the edge of a row write
    into the next row or plane, which another block computes. The report's first words were the emulation's "the
    result is not the same from run to run … blocks race … or the code keeps something from one call to the next",
    with nothing tying it to the out-of-bounds writes the cases listed below it. Where the same run wrote past an
    output's end, the note now says the race is that spill and names the bounds check. (Which block writes last
    varies with the machine's load: the first call is made to differ from the reruns, so the note always comes.)"""
    from fuselab.labs import lab1
    from fuselab.check.races import _not_reproducible
    text = _lab_source("lab1", "DEPTHWISE_SOURCE")
    guard = "    if (ow >= W || oh >= H) return;\n"
    assert guard in text
    kernel = lab1.depthwise_fused(fuselab.build(text.replace(guard, ""), [lab1.DEPTHWISE_ACT],
                                                name="msg_dw_no_guard", backend="emulate"))
    calls = []

    def op(x, w, bias, act, slope, out):
        kernel(x, w, bias, act, slope, out)
        calls.append(1)
        if len(calls) == 1:
            out.view(-1)[0] += 1.0  # the first run differs from the reruns, as a race's would

    report = fuselab.check(op, lab1.depthwise_reference, lab1.make_depthwise_inputs,
                           [lab1.DepthwiseCase(1, 3, 5, 7, True, "relu")], seeds=(0,), verbose=False,
                           raise_on_fail=False).report()
    assert "past the end of `out`" in report and "not the same from run to run" in report, report
    assert "threads past the edge of a row or plane (no bounds check on their index)" in report, report
    assert "Check each index against its own size" not in _not_reproducible("out", 1, 4, (0,), 0.0, 1.0, True)
