"""fuselab.check: each test runs a small pure-torch candidate with one known bug and asserts the report names it."""

import json
import re

import pytest
import torch
import torch.nn.functional as F

from fuselab.check import CheckFailed, CheckResult, OutputComparison, assert_close, check, compare, default_tolerance
from fuselab.check.poison import GuardedOutput, poison_mask
from fuselab.errors import FuselabError

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]),
]
SHAPES = [(1, 1, 1, 1), (1, 3, 5, 5), (2, 5, 7, 9), (3, 2, 1, 13)]  # size 1, odd sizes, 1-row images


# --- a conv + bias + ReLU lab in miniature --------------------------------------------------------------------


def conv_inputs(device="cpu", dtype=torch.float32):
    def make_inputs(shape, seed):
        n, c, h, w = shape
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, c, h, w, generator=g)
        weight = torch.randn(c, c, 3, 3, generator=g)
        bias = torch.randn(c, generator=g)
        return tuple(t.to(device=device, dtype=dtype) for t in (x, weight, bias))

    return make_inputs


def conv_relu(x, weight, bias):
    return F.relu(F.conv2d(x, weight, bias, padding=1))


def good_conv_relu(x, weight, bias, y):
    y.copy_(F.relu(F.conv2d(x.float(), weight.float(), bias.float(), padding=1)))


def failure_of(candidate, make_inputs, shapes=SHAPES, reference=conv_relu, **kwargs) -> CheckFailed:
    with pytest.raises(CheckFailed) as caught:
        check(candidate, reference, make_inputs, shapes, **kwargs)
    return caught.value


@pytest.mark.parametrize("device", DEVICES)
def test_a_correct_candidate_passes_every_shape_and_seed(device):
    seen = []

    def candidate(x, weight, bias, y):
        seen.append((tuple(x.shape), y.device.type, y.is_contiguous()))
        good_conv_relu(x, weight, bias, y)

    result = check(candidate, conv_relu, conv_inputs(device), SHAPES, seeds=(0, 1, 2))
    assert result.passed and not result.failures
    assert len(result.cases) == len(SHAPES) * 3
    assert {shape for shape, _, _ in seen} == set(SHAPES)
    assert all(kind == torch.device(device).type and contiguous for _, kind, contiguous in seen)
    text = repr(result)
    assert text.count("✓") == 12 and "✗" not in text and "all 12 cases passed" in text


@pytest.mark.parametrize("device", DEVICES)
def test_an_unwritten_element_is_reported_as_not_written(device):
    def skips_one(x, weight, bias, y):
        full = conv_relu(x, weight, bias)
        mask = torch.ones_like(full, dtype=torch.bool)
        mask[0, 1, 2, 3] = False
        y[mask] = full[mask]

    error = failure_of(skips_one, conv_inputs(device), shapes=[(1, 3, 5, 5)], seeds=(0,))
    comparison = error.result.cases[0].comparisons[0]
    assert comparison.n_not_written == 1 and comparison.n_bad == 1
    assert comparison.first_bad.index == (0, 1, 2, 3) and comparison.first_bad.kind == "not written"
    message = str(error)
    assert "1 never written" in message and "y[0, 1, 2, 3]: got nothing (still fuselab's poison NaN)" in message


def test_a_grid_that_stops_early_gets_the_round_up_hint():
    def short_grid(x, weight, bias, y):  # covers 256 elements, like one block of 256 threads
        flat = conv_relu(x, weight, bias).reshape(-1)
        y.view(-1)[:256] = flat[:256]

    error = failure_of(short_grid, conv_inputs(), shapes=[(2, 5, 7, 9)], seeds=(0,))
    comparison = error.result.cases[0].comparisons[0]
    assert comparison.n_not_written == 2 * 5 * 7 * 9 - 256
    assert "from y[0, 4, 0, 4] on" in comparison.hint and "never written" in comparison.hint


@pytest.mark.parametrize("device", DEVICES)
def test_a_write_past_the_end_is_caught_by_the_guard_band(device):
    def overruns(x, weight, bias, y):
        good_conv_relu(x, weight, bias, y)
        # What a kernel without `if (i < n)` does: the last block writes on through the buffer.
        torch.as_strided(y, (y.numel() + 3,), (1,))[y.numel() :] = 0.0

    error = failure_of(overruns, conv_inputs(device), shapes=[(1, 3, 5, 5)], seeds=(0,))
    case = error.result.cases[0]
    assert case.comparisons[0].passed  # the values themselves are right
    assert case.problems[0].startswith("wrote 3 elements past the end of `y`: out-of-bounds writes")
    # a 1 × 3 × 5 × 5 output: each index against its size, or one flat `i < n` (the kernel may index it either way)
    assert "1 × 3 × 5 × 5 output" in case.problems[0] and "`i < n` over all 75 elements" in case.problems[0]


def test_a_write_before_the_start_is_caught_too():
    def underruns(x, weight, bias, y):
        good_conv_relu(x, weight, bias, y)
        torch.as_strided(y, (1,), (1,), y.storage_offset() - 7).fill_(1.0)

    error = failure_of(underruns, conv_inputs(), shapes=[(1, 3, 5, 5)], seeds=(0,))
    assert "wrote 1 element before the start of `y` (the farthest 7 elements before it)" in str(error)


def test_guarded_outputs_are_poisoned_contiguous_and_aligned():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8):
        output = GuardedOutput((3, 5, 7), dtype, "cpu")
        assert output.view.is_contiguous() and output.view.shape == (3, 5, 7)
        assert (output.view.data_ptr() - output.buffer.data_ptr()) % 256 == 0  # float4 / half2 stores stay legal
        assert bool(poison_mask(output.buffer).all()) and not output.damage().any
        if dtype.is_floating_point:
            assert bool(torch.isnan(output.view).all())


@pytest.mark.parametrize("device", DEVICES)
def test_an_input_modified_in_place_is_reported(device):
    def relu_in_place(x, weight, bias, y):
        good_conv_relu(x, weight, bias, y)
        x.relu_()  # the course's pitfall: an in-place ReLU on a tensor still needed

    error = failure_of(relu_in_place, conv_inputs(device), shapes=[(1, 3, 5, 5)], seeds=(0,))
    (problem,) = error.result.cases[0].problems
    assert problem.startswith("input `x` was modified:") and "first x[" in problem and "now 0" in problem
    assert error.result.cases[0].comparisons[0].passed


def test_input_check_is_bitwise_and_nan_safe():
    def make_inputs(shape, seed):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        x[0] = float("nan")  # NaN != NaN must not count as a change
        return (x,)

    def reference(x):
        return torch.nan_to_num(x, nan=0.0)

    assert check(lambda x, y: y.copy_(reference(x)), reference, make_inputs, [(5,)]).passed

    def writes_zero_sign(x, y):
        y.copy_(reference(x))
        x[1] = 0.0
        x[1] = -x[1]  # -0.0 == 0.0 numerically, but the bits changed

    assert "input `x` was modified: 1 of 5 elements changed" in str(failure_of(writes_zero_sign, make_inputs, [(5,)], reference))


@pytest.mark.parametrize("device", DEVICES)
def test_nan_in_the_output_never_passes(device):
    def divides_zero_by_zero(x, weight, bias, y):
        good_conv_relu(x, weight, bias, y)
        y[0, 0, 0, 0] = torch.tensor(0.0) / torch.tensor(0.0)

    error = failure_of(divides_zero_by_zero, conv_inputs(device), shapes=[(1, 3, 5, 5)], seeds=(0,), atol=1e9)
    comparison = error.result.cases[0].comparisons[0]
    assert comparison.n_nan == 1 and comparison.n_not_written == 0  # a computed NaN is not the poison
    assert "y[0, 0, 0, 0]: got NaN" in str(error) and "NaN (not-a-number)" in comparison.hint


def test_nan_and_inf_pass_only_where_the_reference_has_them():
    got = torch.tensor([float("nan"), 1.0, float("inf")], dtype=torch.float16)
    assert compare(got, torch.tensor([float("nan"), 1.0, 70000.0], dtype=torch.float64)).passed  # 70000 overflows fp16
    assert not compare(got, torch.tensor([0.5, 1.0, 70000.0], dtype=torch.float64)).passed
    assert not compare(got, torch.tensor([float("nan"), 1.0, 60000.0], dtype=torch.float64)).passed
    poisoned = GuardedOutput((3,), torch.float16, "cpu").view
    verdict = compare(poisoned, torch.tensor([float("nan")] * 3, dtype=torch.float64))
    assert not verdict.passed and verdict.n_not_written == 3  # the poison never passes, even for a NaN reference


def test_one_wrong_element_is_named_with_its_values():
    def off_at_one_index(x, weight, bias, y):
        good_conv_relu(x, weight, bias, y)
        y[1, 2, 3, 4] += 0.01

    error = failure_of(off_at_one_index, conv_inputs(), shapes=[(2, 5, 7, 9)], seeds=(0,))
    comparison = error.result.cases[0].comparisons[0]
    expected = float(conv_relu(*(t.double() for t in conv_inputs()((2, 5, 7, 9), 0)))[1, 2, 3, 4])
    assert comparison.n_bad == 1 and comparison.first_bad.index == (1, 2, 3, 4)
    assert comparison.first_bad.expected == pytest.approx(expected)
    assert comparison.max_abs_error == pytest.approx(0.01, rel=1e-3)
    message = str(error)
    assert f"y[1, 2, 3, 4]: got {comparison.first_bad.got:.7g}, expected {expected:.7g}" in message
    assert "1 of 630 elements bad (0.16%)" in message


# --- tolerances ------------------------------------------------------------------------------------------------


def gemm_inputs(m, k, n, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)


def accumulate_in(a, b, dtype):
    """a @ b summed term by term in ``dtype``: what a kernel with a ``dtype`` accumulator computes."""
    total = torch.zeros(a.shape[0], b.shape[1], dtype=dtype)
    for k in range(a.shape[1]):
        total = total + a[:, k : k + 1].to(dtype) * b[k : k + 1, :].to(dtype)
    return total


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tolerances_separate_fp32_accumulation_from_half_accumulation(dtype):
    a, b = gemm_inputs(16, 1024, 16, dtype=dtype)
    expected = a.double() @ b.double()
    assert compare(expected.to(dtype), expected).passed  # correctly rounded
    assert compare(accumulate_in(a, b, torch.float32).to(dtype), expected).passed  # fp32 accumulator
    half_accumulated = compare(accumulate_in(a, b, dtype), expected)
    assert not half_accumulated.passed and half_accumulated.n_bad > 10
    # ... and a correctly rounded half result would fail an fp32 tolerance: the tolerance follows the dtype.
    assert not compare(expected.to(dtype), expected, rtol=default_tolerance(torch.float32).rtol, atol=0).passed


def test_fp32_tolerance_passes_long_sums_and_fails_tf32_or_a_missing_term():
    a, b = gemm_inputs(16, 4096, 16)
    expected = a.double() @ b.double()
    sequential = accumulate_in(a, b, torch.float32)
    assert compare(sequential, expected).passed
    assert not compare(sequential, expected, atol=0.0).passed  # a purely relative test fails a correct sum
    missing_term = sequential - a[:, :1] * b[:1, :]
    assert not compare(missing_term, expected).passed

    def tf32(t):  # keep 10 mantissa bits, as tensor cores do for fp32 inputs
        return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)

    assert not compare(tf32(a) @ tf32(b), expected).passed


def test_atol_and_rtol_can_be_overridden():
    expected = torch.tensor([1.0, 2.0], dtype=torch.float64)
    got = torch.tensor([1.05, 2.0])
    assert not compare(got, expected).passed
    assert compare(got, expected, atol=0.1).passed
    assert compare(got, expected, rtol=0.06).passed
    assert "1 of 2 elements bad" in repr(compare(got, expected))


# --- the report, the exception, the API --------------------------------------------------------------------------


def test_check_failed_is_an_assertion_error_with_a_student_readable_message():
    def off_in_one_channel(x, weight, bias, y):
        good_conv_relu(x, weight, bias, y)
        if x.shape[1] > 3:
            y[:, 3] += 1.0

    error = failure_of(off_in_one_channel, conv_inputs(), name="conv_relu")
    assert isinstance(error, AssertionError) and isinstance(error, FuselabError)
    assert isinstance(error.result, CheckResult)
    message = str(error)
    assert message.startswith("conv_relu: 3 of 12 cases failed.")
    assert "✗ conv_relu, shape=(2, 5, 7, 9), seed=0" in message
    assert "y (float32, shape (2, 5, 7, 9)): 126 of 630 elements bad (20.00%)" in message
    assert "first bad element   y[0, 3, 0, 0]" in message and "max abs error 1" in message
    assert "allowed             |got - expected| <= " in message
    assert "passed: shape=(1, 1, 1, 1), seed=0" in message
    json.dumps(error.result.to_dict())  # the grader stores it


def test_raise_on_fail_false_returns_the_result():
    result = check(lambda x, weight, bias, y: None, conv_relu, conv_inputs(), [(1, 2, 3, 3)], seeds=(0, 1), raise_on_fail=False)
    assert not result.passed and len(result.failures) == 2
    assert "✗ shape=(1, 2, 3, 3), seed=0" in repr(result)
    assert "nothing was written to `y`" in result.failures[0].comparisons[0].hint


def test_an_exception_in_the_candidate_fails_its_case_and_is_chained():
    def blank(x, weight, bias, y):
        raise NotImplementedError()

    error = failure_of(blank, conv_inputs(), shapes=[(1, 2, 3, 3)], seeds=(0,))
    assert "the candidate raised NotImplementedError" in str(error)
    assert isinstance(error.__cause__, NotImplementedError)


def test_candidates_that_return_their_output():
    result = check(lambda x, w, b: conv_relu(x, w, b), conv_relu, conv_inputs(), SHAPES[:2], outputs="return")
    assert result.passed
    error = failure_of(lambda x, w, b: conv_relu(x, w, b).double(), conv_inputs(), SHAPES[:1], outputs="return", seeds=(0,))
    assert "the result is torch.float64, expected torch.float32" in str(error)


def test_several_outputs_integer_outputs_and_out_dtype():
    def reference(x):
        return x.amax(dim=1), x.argmax(dim=1)

    def make_inputs(shape, seed):
        return (torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float16),)

    def good(x, values, indices):
        values.copy_(x.amax(dim=1))
        indices.copy_(x.argmax(dim=1))

    assert check(good, reference, make_inputs, [(3, 5), (1, 1)]).passed

    def forgets_indices(x, values, indices):
        values.copy_(x.amax(dim=1))

    error = failure_of(forgets_indices, make_inputs, [(3, 5)], reference, seeds=(0,))
    assert "indices (int64, shape (3,)): 3 of 3 elements bad (100.00%): 3 never written" in str(error)

    seen = []
    check(lambda x, v, i: (seen.append(v.dtype), good(x, v, i)), reference, make_inputs, [(2, 2)], seeds=(0,), out_dtype=[torch.float32, None])
    assert seen == [torch.float32]


def test_the_reference_runs_in_float64_and_must_stay_there():
    seen = {}

    def reference(x):
        seen["input"] = x.dtype
        seen["default"] = torch.zeros(1).dtype  # a reference that builds a tensor without a dtype
        return x * 2

    check(lambda x, y: y.copy_(x * 2), reference, lambda shape, seed: (torch.randn(shape, dtype=torch.float16),), [(4,)], seeds=(0,))
    assert seen == {"input": torch.float64, "default": torch.float64}
    assert torch.get_default_dtype() == torch.float32  # restored
    with pytest.raises(TypeError, match="must compute in float64"):
        check(lambda x, y: None, lambda x: x.float(), lambda shape, seed: (torch.randn(shape),), [(4,)], seeds=(0,))
    # caught at the cast, before a float32 (TF32 on a GPU) matmul runs, even though the result is float64 again
    with pytest.raises(TypeError, match=r"computed in torch.float32 \(in float\)"):
        check(lambda a, y: None, lambda a: (a.float() @ a.float()).double(), lambda shape, seed: (torch.randn(shape),),
              [(4, 4)], seeds=(0,))


def test_seeds_give_different_reproducible_inputs_and_leave_the_global_rng_alone():
    inputs = []

    def make_inputs(shape, seed):
        x = torch.randn(shape)  # no generator: check seeds the global RNG for it
        inputs.append(x.clone())
        return (x,)

    state = torch.get_rng_state()
    check(lambda x, y: y.copy_(x), lambda x: x, make_inputs, [(8,)], seeds=(0, 1, 0))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(inputs[0], inputs[2]) and not torch.equal(inputs[0], inputs[1])


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (lambda a, b, y: y.copy_((a @ b).T.reshape(y.shape)), "looks transposed"),
        (lambda a, b, y: y.zero_(), "every element of `y` is 0"),
        (lambda a, b, y: y.copy_(a @ b * 2), "2 × the expected one"),
        (lambda a, b, y: y.copy_(a @ b + 0.5), "off by 0.5"),
        (lambda a, b, y: y.copy_(torch.roll(a @ b, 1, dims=1)), "shifted by one along dimension 1"),
    ],
)
def test_recognizable_patterns_get_a_hint(candidate, hint):
    def make_inputs(shape, seed):
        return gemm_inputs(*shape, seed=seed)

    error = failure_of(candidate, make_inputs, [(6, 5, 7)], reference=lambda a, b: a @ b, seeds=(0,))
    assert hint in str(error)


def test_a_wrong_leaky_relu_slope_in_bfloat16_gets_a_hint():
    def make_inputs(shape, seed):
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16), 0.1

    def leaky(x, slope):
        return torch.where(x > 0, x, x * slope)

    assert check(lambda x, slope, y: y.copy_(leaky(x, slope)), leaky, make_inputs, [(4, 9), (1, 1)]).passed
    error = failure_of(lambda x, slope, y: y.copy_(leaky(x, 0.2)), make_inputs, [(4, 9)], reference=leaky, seeds=(0,))
    assert "only negative values are wrong, all by a factor 2" in str(error) and "LeakyReLU slope" in str(error)


def test_a_missing_per_channel_bias_and_wrong_padding_get_hints():
    no_bias = failure_of(lambda x, w, b, y: y.copy_(F.relu(F.conv2d(x, w, padding=1) + 100)), conv_inputs(), [(2, 5, 7, 9)],
                         reference=lambda x, w, b: F.conv2d(x, w, b, padding=1) + 100, seeds=(0,))
    assert "depends only on the index along dimension 1" in str(no_bias)

    def replicate_padding(x, w, b, y):  # edge pixels repeated instead of zeros outside the image
        y.copy_(F.relu(F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), w, b)))

    border = failure_of(replicate_padding, conv_inputs(), [(2, 5, 7, 9)], seeds=(0,))
    assert "only elements on the border" in str(border)


def test_a_few_bad_elements_of_a_short_vector_that_happen_to_sit_at_its_ends_are_not_called_a_border_bug():
    """Lab 0's fused kernel with `e[i]` typed as `b[i]`: under the ReLU about half the elements of every case are
    wrong, scattered. In one 7-element case the two bad ones were out[0] and out[6], and the report's only hint was
    "only elements on the border are wrong: check the padding", while the 4099-element cases were wrong everywhere.
    Two of seven land on the ends by chance 8 % of the time: no hint is better than that one."""
    from fuselab.labs import lab0

    def typo(a, b, e, out):
        out.copy_(torch.relu(a + b) * b)

    report = str(failure_of(typo, lambda shape, seed: lab0.make_inputs(shape, seed, device="cpu"), lab0.SMALL_SHAPES,
                            reference=lab0.reference))
    assert "shape=(7,), seed=0  out: 2 of 7 bad" in report, report  # the case that drew the hint
    assert "border" not in report, report
    # a real border bug of a large enough output is still named
    x = torch.arange(1.0, 50.0, dtype=torch.float64).reshape(7, 7)
    got = x.clone()
    got[0, :] += 1
    got[:, -1] += 1
    from fuselab.check.hints import Evidence, hint_for
    bad = got != x
    assert "only elements on the border" in hint_for(Evidence(got, x, bad, torch.zeros_like(bad), torch.zeros_like(x),
                                                              "y", torch.float32))


def test_an_extent_equal_to_a_setting_by_chance_is_not_offered_as_the_cause():
    """Lab 1's conv with the bias added once per input channel: right where C == 1 or there is no bias. The report's
    headline said "every case with K == stride passes … Somewhere one is used where the other belongs", an output
    channel count against a stride, equal only by the case list's chance; the hint under it (a per-index term along
    dimension 1) was the true one. Extents are compared with extents, settings with settings."""
    import torch.nn.functional as F

    from fuselab.labs import lab1

    def bias_per_channel(x, w, bias, stride, pad, act, slope, out):
        y = F.conv2d(x, w, None, stride=stride, padding=pad)
        out.copy_(y if bias is None else y + x.shape[1] * bias.reshape(1, -1, 1, 1))

    result = check(bias_per_channel, lab1.conv_only_reference, lambda c, seed: lab1.make_conv_inputs(c, seed),
                   lab1.SMALL_CONV_CASES, seeds=(0,), verbose=False, raise_on_fail=False)
    report = result.report()
    assert not result.passed and "== stride" not in report and "K == " not in report, report
    assert "depends only on the index along dimension 1" in report, report


def test_every_channel_with_channel_0s_weights_names_the_channel_index():
    """Lab 1's depthwise kernel with `c = p / C` (the batch index) where `c = p % C` belongs: with N = 1 every plane
    reads channel 0's filter and bias. Only `out[:, 0]` is right, every other channel written; the hint blamed the
    offset of each item alone (a stride), which is right here. It now names the channel index of the parameters, and
    leads with it: rerunning the reference with channel 0's filter and bias in every channel gives every wrong value,
    which no stride explains."""
    import torch.nn.functional as F

    from fuselab.labs import lab1

    def channel_zero(x, w, bias, act, slope, out):
        c = x.shape[1]
        y = F.conv2d(x, w[:1].expand(c, 1, 3, 3), None if bias is None else bias[:1].expand(c), padding=1, groups=c)
        out.copy_(lab1.activate(y, act, slope))

    result = check(channel_zero, lab1.depthwise_reference, lab1.make_depthwise_inputs,
                   [lab1.DepthwiseCase(1, 4, 9, 8, True, "none")], seeds=(0,), verbose=False, raise_on_fail=False)
    report = result.report()
    assert "every wrong element holds what channel 0's values give" in report, report
    assert "applied from the wrong channel" in report and "`p % C`" in report and "stride" not in report, report


def test_a_filter_read_transposed_is_told_by_the_filter_size_that_fails():
    """Lab 1's conv with the filter read as w[s][r]: every 3×3 case fails and every 1×1 case passes (a 1×1 filter
    is its own transpose). The report had no headline at all: `R > 1` counted as a size past which the code breaks,
    which silenced the rule that names a choice of the cases. The filter size is a setting, like a flag."""
    import torch.nn.functional as F

    from fuselab.labs import lab1

    def transposed(x, w, bias, stride, pad, act, slope, out):
        out.copy_(F.conv2d(x, w.transpose(2, 3), bias, stride=stride, padding=pad))

    report = check(transposed, lab1.conv_only_reference, lambda c, seed: lab1.make_conv_inputs(c, seed),
                   lab1.SMALL_CONV_CASES, seeds=(0,), verbose=False, raise_on_fail=False).report()
    assert "every case with R=3 fails, and every case with R=1 passes: look at what your code does with R" in report, \
        report


def test_compare_and_assert_close():
    expected = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    assert isinstance(compare(expected.float(), expected), OutputComparison)
    assert assert_close(expected.float(), expected).passed
    with pytest.raises(CheckFailed, match=r"out\[1, 2\]: got 0, expected 5"):
        assert_close(torch.tensor([[0.0, 1, 2], [3, 4, 0]]), expected)
    assert "has shape (3, 2), expected shape (2, 3)" in compare(expected.T.float(), expected).report()


def test_nothing_reaches_stderr(capfd):
    result = check(lambda x, weight, bias, y: x.relu_(), conv_relu, conv_inputs(), SHAPES, raise_on_fail=False)
    assert not result.passed
    str(result), repr(result), result.report()
    assert capfd.readouterr().err == ""


# --- what a student reads in a test cell ----------------------------------------------------------------------


def test_an_index_without_blockidx_says_only_the_first_block_is_right():
    # `i = threadIdx.x` with blocks of 256: every block writes out[0..255], nothing else is written
    def first_block_only(a, b, out):
        out[:256] = (a + b)[:256]

    error = failure_of(first_block_only, lambda shape, seed: (torch.randn(shape), torch.randn(shape)), [(1000,)],
                       reference=lambda a, b: a + b, seeds=(0,))
    hint = error.result.cases[0].comparisons[0].hint
    assert "only the first 256 elements of `out` in memory order are right" in hint
    assert "everything from out[256] on is never written" in hint
    assert "blockIdx" in hint and "i = blockIdx.x * blockDim.x + threadIdx.x" in hint


def test_a_grid_short_by_a_few_elements_names_where_it_stops():
    def short(a, b, out):  # n / 3 blocks of 3: rounded down
        out[:999] = (a + b)[:999]

    error = failure_of(short, lambda shape, seed: (torch.randn(shape), torch.randn(shape)), [(1001,)],
                       reference=lambda a, b: a + b, seeds=(0,))
    hint = error.result.cases[0].comparisons[0].hint
    assert "only the first 999 elements" in hint and "from out[999] on" in hint and "(n + block - 1) / block" in hint


def test_named_cases_print_their_field_names():
    from collections import namedtuple
    Case = namedtuple("Case", "N C act")

    def make_inputs(case, seed):
        return (torch.randn(case.N, case.C),)

    error = failure_of(lambda x, y: y.copy_(x * 3), make_inputs, [Case(2, 3, "relu")], reference=lambda x: x * 2,
                       seeds=(5,))
    assert "Case(N=2, C=3, act='relu'), seed=5" in str(error)
    assert "shape=(2, 3, 'relu')" not in str(error) and "shape=(2, 3, relu)" not in str(error)


def test_each_check_prints_one_summary_line_and_details_only_on_failure(capsys):
    make = lambda shape, seed: (torch.randn(shape),)  # noqa: E731
    check(lambda x, y: y.copy_(x.exp()), torch.exp, make, [(3,), (5, 7)], seeds=(0, 1, 2), name="exp")
    check(lambda x, y: y.copy_(x * 2), lambda x: x * 2, make, [(4,)], name="double")
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2
    assert out[0].startswith("✓ exp: 6 cases passed, largest error ") and "of what the tolerance allows" in out[0]
    assert out[1] == "✓ double: 3 cases passed, every output exact"
    with pytest.raises(CheckFailed) as caught:
        check(lambda x, y: y.copy_(x), lambda x: x * 2, make, [(4,)], seeds=(0,), name="wrong")
    assert capsys.readouterr().out == "✗ wrong: 1 of 1 case failed\n"
    assert "first bad element" in str(caught.value)
    check(lambda x, y: y.copy_(x), lambda x: x, make, [(4,)], verbose=False)
    assert capsys.readouterr().out == ""


def test_a_missing_name_stops_the_check_at_the_first_case_with_one_message(capsys):
    def candidate(a, out):
        unfused_mod.add(a, a, out, a.numel())  # noqa: F821 - the build cell above did not run

    error = failure_of(candidate, lambda shape, seed: (torch.randn(shape),), [(1,), (7,), (255,)],
                       reference=lambda a: a + a, seeds=(0, 1, 2))
    message = str(error)
    assert len(error.result.cases) == 1 and not error.result.passed
    assert message.count("name 'unfused_mod' is not defined") == 1
    assert message.startswith("candidate could not run: name 'unfused_mod' is not defined. `unfused_mod` is made "
                              "by a cell above this one, which failed or has not run yet")
    assert isinstance(error.__cause__, NameError)
    assert capsys.readouterr().out == "✗ candidate: could not run: name 'unfused_mod' is not defined\n"


def test_a_check_result_gives_nbgrader_no_value_to_read():
    # IPython asks _ipython_display_ first and then sends no execute_result: nbgrader sees no value, no warning
    from IPython.core.formatters import DisplayFormatter
    result = check(lambda x, y: y.copy_(x), lambda x: x, lambda shape, seed: (torch.randn(shape),), [(3,)],
                   verbose=False)
    assert DisplayFormatter().format(result) == ({}, {})


def test_a_case_built_for_one_bug_adds_its_hint_once_when_its_values_are_wrong():
    from typing import NamedTuple

    class Scaled(NamedTuple):
        n: int
        hint = "this case scales by 3: a factor left out?"

    def make(case, seed):
        return (torch.randn(tuple(case)[0]),)

    def reference(x):
        return 3 * x

    def wrong(x, out):
        out.copy_(x)

    def unwritten(x, out):
        pass

    cases = [Scaled(5), Scaled(7), (6,)]
    report = check(wrong, reference, make, cases, seeds=(0, 1), raise_on_fail=False, verbose=False).report()
    assert report.count("this case: this case scales by 3") == 1, report  # once, not once per failing case
    right = check(lambda x, out: out.copy_(3 * x), reference, make, cases, seeds=(0,), verbose=False)
    assert right.passed and "this case" not in repr(right)
    report = check(unwritten, reference, make, cases[:1], seeds=(0,), raise_on_fail=False, verbose=False).report()
    assert "never written" in report and "this case:" not in report, report  # not a wrong value: not its bug


# --- patterns of where the bad elements are, from the data alone -----------------------------------------------


def _hint(got, expected, name="y", **evidence):
    from fuselab.check.hints import Evidence, hint_for
    got, expected = got.double(), expected.double()
    not_written = torch.isnan(got)
    bad = not_written | ((got - expected).abs() > 1e-6)
    return hint_for(Evidence(got, expected, bad, not_written, torch.full_like(got, 1e-6), name, torch.float32,
                             **evidence))


def test_only_the_first_plane_right_is_said_so_with_the_grid_axis_that_walks_the_planes():
    expected = torch.randn(2, 3, 5, 6)
    got = torch.full_like(expected, float("nan"))
    got[0, 0] = expected[0, 0]  # a plane index that is 0 for every thread
    hint = _hint(got, expected)
    assert "only `y[0, 0]` (the first plane" in hint and "the other 5 of the 6 planes are never written" in hint
    assert "blockIdx.z" in hint, hint
    batch = torch.randn(3, 2, 4, 5)
    copies = batch[:1].expand_as(batch).clone()  # every batch item computed from the inputs of item 0
    assert "the other 2 indices along it each hold what `y[0]` should hold" in _hint(copies, batch)


def test_a_tail_from_the_other_dimensions_rounded_up_size_suggests_swapped_grid_axes():
    expected = torch.randn(40, 50)
    got = expected.clone()
    got[:, 48:] = float("nan")  # blocks along x from the 40 rows: 3 × 16 = 48 columns
    hint = _hint(got, expected)
    assert "48 is the other dimension's size (40, dimension 0) rounded up to a multiple of 16" in hint, hint
    assert "Are the grid's x and y swapped?" in hint and "rounds down" in hint, hint  # 50 / 16 = 3 blocks, too


@pytest.mark.parametrize("rows, stop", [(40, 8), (40, 16), (3, 16)])
def test_a_tail_that_no_size_in_the_data_explains_is_not_called_swapped_grid_axes(rows, stop):
    """A grid of one block along x (a constant), or a loop that stops at a constant: the columns from `stop` on are
    never written. `stop` is no rounding of the 50 columns, and the other dimension's size rounds up to it only where
    it fits in one block (3 rows: any size up to 16 does): nothing says which size the grid came from.
    The hint said it was computed from another size, with the grid's x and y swapped."""
    expected = torch.randn(rows, 50)
    got = expected.clone()
    got[:, stop:] = float("nan")
    hint = _hint(got, expected)
    assert f"stops at {stop}, which is not 50 rounded down to a block size" in hint, hint
    assert "swapped" not in hint and "round the number of blocks up" not in hint, hint


@pytest.mark.parametrize("shape", [(33, 1), (1000,)])
def test_a_stop_far_short_of_the_size_is_not_called_a_grid_that_rounds_down(shape):
    """Everything from index 16 on never written, out of 33 rows of one column (a grid of one 16-row block along y)
    or of 1000 elements: a count of blocks that rounds down stops less than one block short, so this is no rounding
    of the size. The hints said to round the block count up, or that the grid's x and y were swapped."""
    expected = torch.randn(shape)
    got = expected.clone()
    got[16:] = float("nan")
    hint = _hint(got, expected)
    assert f"stops at 16, which is not {shape[0]} rounded down to a block size" in hint, hint
    assert "swapped" not in hint and "round the number of blocks up" not in hint, hint


def test_a_grid_that_rounds_down_keeps_the_round_up_hint():
    expected = torch.randn(3, 37)
    got = expected.clone()
    got[:, 32:] = float("nan")
    hint = _hint(got, expected)  # 32 is 37 rounded down to 32, and 3 rounded up to 32: the rounding comes first
    assert "either the number of blocks along it rounds down (37 / block: round it up" in hint, hint
    assert hint.index("round it up") < hint.index("x and y swapped"), hint


def test_two_indices_swapped_when_a_dimension_stops_at_another_ones_size_and_writes_land_past_the_end():
    expected = torch.randn(2, 5, 3, 4)
    got = expected.clone()
    got[:, 2:] = float("nan")
    hint = _hint(got, expected, wrote_outside=72)
    assert "2 is the size of dimension 0" in hint and "Are the two indices swapped" in hint, hint
    assert "Are the two indices swapped" not in _hint(got, expected)  # nothing written outside: a short grid


def test_an_error_concentrated_where_an_input_is_smallest_names_it():
    var = torch.logspace(-4, 2, 12)[torch.randperm(12, generator=torch.Generator().manual_seed(3))]
    expected = torch.randn(1, 12, 4, 5) + 3
    got = expected * (1 + 1e-3 / var.sqrt()).reshape(1, 12, 1, 1)  # a relative error that grows as var shrinks
    hint = _hint(got, expected, inputs={"mean": torch.randn(12), "var": var})
    assert "the error grows where `var` is smallest" in hint and "eps outside the square root" in hint, hint
    shuffled = expected * (1 + 1e-3 * torch.rand(12, generator=torch.Generator().manual_seed(4))).reshape(1, 12, 1, 1)
    assert "grows where" not in _hint(shuffled, expected, inputs={"var": var})  # unrelated to var


def _bn_like(channels=8, seed=5):
    """A BN-like output (N, C, H, W) whose scale per channel grows as `var` shrinks, and `var` over four decades."""
    g = torch.Generator().manual_seed(seed)
    var = torch.logspace(-3, 1, channels, dtype=torch.float64)[torch.randperm(channels, generator=g)]
    x = torch.randn(2, channels, 4, 5, generator=g, dtype=torch.float64)
    return x / var.sqrt().reshape(1, channels, 1, 1), var, g


def test_one_wrong_channel_is_not_said_to_follow_an_input():
    """A bug in one of 8 channels, the one where `var` happens to be smallest: one index is the smallest or largest
    of some input one time in four. The hint said the error grows where `var` is smallest: eps outside the root."""
    expected, var, _ = _bn_like()
    got = expected.clone()
    wrong = int(var.argmin())
    got[:, wrong] = got[:, wrong] * 1.3 + 0.1
    assert "grows where" not in _hint(got, expected, inputs={"var": var})


def test_a_uniform_error_over_a_scale_that_follows_an_input_is_not_said_to_follow_it():
    """An error of about 1e-3 everywhere, on outputs whose scale grows as `var` shrinks: relative to each channel's
    scale it grows with `var`. The hint said the error grows where `var` is largest."""
    expected, var, g = _bn_like()
    got = expected + 1e-3 * (1 + torch.rand(expected.shape, generator=g, dtype=torch.float64))
    assert "grows where" not in _hint(got, expected, inputs={"var": var})


def test_an_error_that_depends_only_on_the_channel_says_so_before_it_follows_an_input():
    """A per-channel term that is wrong by 0.01 / sqrt(var): the error does grow where `var` is small, but that it
    depends only on the channel (a per-channel term: a bias, a BN shift) says more, and came second."""
    _, var, g = _bn_like()
    expected = torch.randn(2, 8, 4, 5, generator=g, dtype=torch.float64)
    got = expected + (1e-2 / var.sqrt()).reshape(1, 8, 1, 1)
    hint = _hint(got, expected, inputs={"var": var})
    assert "depends only on the index along dimension 1" in hint and "grows where" not in hint, hint


def test_a_check_says_when_exactly_the_square_cases_pass():
    def make_inputs(shape, seed):
        return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)),)

    def transpose_blindly(x, y):  # right only where rows == columns
        y.copy_(x.reshape(x.shape[1], x.shape[0]).T if x.shape[0] != x.shape[1] else x)

    shapes = [(3, 3), (6, 6), (4, 7), (9, 5), (2, 8)]
    result = check(transpose_blindly, lambda x: x, make_inputs, shapes, seeds=(0,), raise_on_fail=False,
                   verbose=False)
    assert "every case where `y` is as long along dimension 0 as along 1 passes, and every other case fails" in \
        result.report(), result.report()
    result = check(transpose_blindly, lambda x: x, make_inputs, [(1, 1), (4, 7), (9, 5)], seeds=(0, 1),
                   raise_on_fail=False, verbose=False)
    assert "as long along" not in result.report()  # one square shape, and a trivial one: no evidence


def test_items_past_the_first_written_but_wrong_say_the_offset_of_each_item_not_the_first_item_only():
    """A batch stride of H * W where C * H * W belongs: item 0 is right (its offset is 0 whatever the stride), the
    others are written from the wrong place. The hint said every thread works on the first item, use blockIdx.z."""
    x = torch.randn(3, 4, 5, 6)
    expected = x * 2
    flat = x.reshape(-1)
    got = torch.stack([flat[n * 5 * 6: n * 5 * 6 + 4 * 5 * 6].reshape(4, 5, 6) * 2 for n in range(3)])
    hint = _hint(got, expected)
    assert "only `y[0]` (index 0 along dimension 0) is right; the other 2 indices along it are written, but wrong" \
        in hint, hint
    assert "offset of each item is computed wrongly" in hint and "stride" in hint, hint
    assert "every thread works on the first one" not in hint and "blockIdx.z" not in hint, hint


# --- what sets the failing cases apart ----------------------------------------------------------------------


def _case(shape, passed, numel=12):
    from collections import namedtuple

    from fuselab.check import CaseResult
    Case = namedtuple("Case", "N C H W bias act")
    fields = Case(*shape)
    out = OutputComparison(name="out", shape=(fields.N, fields.C, fields.H, fields.W), dtype="float32",
                           passed=passed, numel=fields.N * fields.C * fields.H * fields.W,
                           n_bad=0 if passed else 1, n_not_written=0 if passed else 1)
    return CaseResult(name="run", shape=fields, seed=0, comparisons=[out])


def test_a_flag_that_goes_with_a_size_is_not_offered_as_the_cause():
    """Lab 1's depthwise cases: the only ones with W > 16 have act='leaky_relu', so a column index without blockIdx
    (16-wide blocks) failed exactly those, and the report blamed act. Where a size past which every case fails
    separates the same cases, the flag is not offered; where no size does, it still is."""
    passing = [((1, 1, 1, 1, True, "relu"), True), ((1, 3, 5, 7, True, "relu"), True),
               ((1, 4, 9, 8, True, "none"), True), ((1, 3, 18, 2, False, "relu"), True)]
    wide = [((2, 5, 19, 17, False, "leaky_relu"), False), ((2, 2, 3, 37, True, "leaky_relu"), False)]
    result = CheckResult("run", [_case(shape, passed) for shape, passed in passing + wide])
    assert "look at what your code does with act" not in result.report(), result.report()
    # the same flag where sizes do not separate the cases (a narrow leaky_relu case fails too): offered
    narrow = [((1, 2, 4, 5, False, "leaky_relu"), False)]
    result = CheckResult("run", [_case(shape, passed) for shape, passed in passing + wide + narrow])
    assert "every case with act='leaky_relu' fails" in result.report(), result.report()


# --- NaN read from past an input --------------------------------------------------------------------------------


def _evidence(got, expected):
    from fuselab.check.hints import Evidence
    bad = ~((got - expected).abs() <= 1e-6)
    return Evidence(got, expected, bad, torch.zeros_like(bad), torch.full_like(got, 1e-6), "out", torch.float32)


def test_nan_in_the_output_wins_over_the_pattern_of_where_the_wrong_values_are():
    """Only item 0 right and the others written, some with NaN: a wrong stride that reads past an input's end (into
    the NaN around it). The NaN is the evidence, and the hint said only that each item's offset is wrong."""
    from fuselab.check.hints import hint_for
    g = torch.Generator().manual_seed(0)
    expected = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    got = expected.clone()
    got[1:] = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    got[2, 3, 1:] = float("nan")
    hint = hint_for(_evidence(got, expected))
    assert "an input read out of bounds" in hint and "offset of each item" not in hint, hint


def test_an_all_zero_relu_output_is_not_called_integer_division():
    """Every element 0 where the expected values are a ReLU's: the values before the ReLU may have been NaN (read past
    an input), which fmaxf(NaN, 0) makes 0. Without a ReLU (negative values expected) the old hint stays."""
    from fuselab.check.hints import hint_for
    expected = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    hint = hint_for(_evidence(torch.zeros_like(expected), expected.clamp(min=0)))
    assert "integer division" not in hint and "fmaxf(NaN, 0.0f)" in hint and "out of bounds" in hint, hint
    hint = hint_for(_evidence(torch.zeros_like(expected), expected))
    assert "integer division" in hint, hint


# --- what a report of many failing cases leads with ------------------------------------------------------------


def _doubled(shape, seed):
    return (torch.randn(shape),)


def test_a_bound_one_short_is_not_told_that_nothing_was_written():
    """`i < n - 1`: the 1-element case writes nothing, every larger case all but its last element. The tiny case,
    shown first, told the student that nothing was written (did the kernel launch?), which is true of no other
    failing case; the cases' lines (how many bad, where the first is) and the pattern of a larger case lead."""
    def all_but_the_last(x, out):
        out[: x.numel() - 1] = 2 * x[: x.numel() - 1]

    result = check(all_but_the_last, lambda x: 2 * x, _doubled, [(1,), (5,), (9,)], seeds=(0, 1),
                   raise_on_fail=False, verbose=False)
    report = result.report()
    assert "nothing was written" not in report and "Did the kernel launch" not in report, report
    assert result.to_dict()["cases"][0]["outputs"][0]["hint"] == ""  # what the grader keeps says no more
    lines = report.split("\n\n")[1].splitlines()
    assert lines == ["  ✗ shape=(1,)  out: 1 of 1 bad, first at out[0]",
                     "  ✗ shape=(5,)  out: 1 of 5 bad, first at out[4]",
                     "  ✗ shape=(9,)  out: 1 of 9 bad, first at out[8]"], report
    assert report.index("out[4] on is never written") < report.index("✗ all_but_the_last, shape=(1,)"), report
    assert "more failing case" not in report  # each case is on a line already
    # nothing written in any case: the hint is true, and said
    nothing = check(lambda x, out: None, lambda x: 2 * x, _doubled, [(1,), (5,)], seeds=(0,), raise_on_fail=False,
                    verbose=False)
    assert "nothing was written to `out`. Did the kernel launch" in nothing.report()


def test_the_cases_lines_say_the_seeds_only_where_not_every_seed_fails_alike():
    def wrong_for_seed_1(x, out):
        out.copy_(2 * x + (1.0 if float(x.flatten()[0]) == float(torch.randn(x.shape, generator=torch.Generator()
                                                                                  .manual_seed(1)).flatten()[0])
                           else 0.0))

    def seeded(shape, seed):
        return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)),)

    report = check(wrong_for_seed_1, lambda x: 2 * x, seeded, [(3,), (4,)], seeds=(0, 1, 2), raise_on_fail=False,
                   verbose=False).report()
    assert "  ✗ shape=(3,), seed=1  out: 3 of 3 bad, first at out[0]" in report, report
    assert "  ✗ shape=(4,), seed=1  out: 4 of 4 bad, first at out[0]" in report, report


def test_the_cases_lines_stop_short_enough_for_a_feedback_page_and_the_rest_follow():
    shapes = [(n,) for n in range(2, 40)]
    result = check(lambda x, out: out.copy_(3 * x), lambda x: 2 * x, _doubled, shapes, seeds=(0,),
                   raise_on_fail=False, verbose=False)
    report = result.report()
    overview = report.split("\n\n")[1]
    assert len(overview) < 500 and overview.splitlines()[0].startswith("  ✗ shape=(2,)  out: 2 of 2 bad"), report
    left = int(re.search(r"… and (\d+) more failing cases, below", overview).group(1))
    listed = len(overview.splitlines()) - 1
    assert listed + left == len(shapes) and f"\n\n{left} more failing cases:\n" in report, report
    assert "✗ shape=(39,), seed=0" in report  # every case said, once
