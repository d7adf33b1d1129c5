"""What a student sees for the typical bugs of the labs, on the CPU (emulation), with random inputs.

Each test writes the bug as a student would, runs what the lab's test cell runs, and reads the message: it must
name the bug (and say the fix once).
"""

import random

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


def test_a_missing_bounds_check_is_named_as_one():
    mod = fused_module(bound="true", name="msg_no_bound")
    result = fuselab.check(lab0.fused(mod), lab0.reference, make, [(random.Random(3).randint(1, 200),)], seeds=(0,),
                           verbose=False, raise_on_fail=False)
    report = result.report()
    assert not result.passed and "missing `if (i < n)` bounds check" in report and "off-by-one" not in report, report


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
    from fuselab import grade
    for name in ("FUSELAB_GRADING", "NBGRADER_VALIDATING", "FUSELAB_GRADE_LOG"):
        monkeypatch.delenv(name, raising=False)
    mod = fused_module(name="msg_speed")
    points = grade.speedup_test("lab0.add_relu_mul", candidate=lab0.fused(mod), reference_op=lab0.fused(mod),
                                reference=lab0.reference, make_inputs=make, module=mod, max_points=4)
    said = capsys.readouterr().out
    assert points == 0.0 and "not measured (no GPU)" in said, said
    assert "The course measures it when it grades your notebook on its GPU, for up to 4 points" in said, said
    monkeypatch.setenv("FUSELAB_GRADING", "1")  # the grader's own run without a GPU: the 0 is the score
    assert grade.speedup_test("lab0.add_relu_mul", candidate=lab0.fused(mod), reference_op=lab0.fused(mod),
                              reference=lab0.reference, make_inputs=make, module=mod, max_points=4) == 0.0
    said = capsys.readouterr().out
    assert "0 of 4 points" in said and "only given on a GPU" in said, said
