"""Lab 2 (Conv+BN folding) on the CPU: the lab's inputs and reference kernels, the instructor's solutions (Python
folds and emulated kernels), and the sample submissions failing exactly the tests they claim to fail.

The graded checks run here the way nbgrader runs them: the solution notebook's test cells (hidden tests
included) executed after the submission's solution cells, without starting a kernel.
"""

import json

import pytest
import torch

import fuselab
from fuselab import course
from fuselab.labs import lab2
from fuselab.labs.lab2.samples import SAMPLES
from fuselab.course.sample_class import expected, make_submission

NOTEBOOK = course.SOLUTIONS / lab2.NOTEBOOK
# what a graded test cell needs defined before it runs
SETUP_CELLS = ("setup", "build_fused", "build_in_registers")


def _cells(nb):
    return {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"]) if isinstance(c["source"], list)
            else c["source"] for c in nb["cells"] if c["cell_type"] == "code"}


def _solution_cell_ids(nb):
    return [c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"]
            if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("solution")]


def _grade(submission: dict) -> dict:
    """grade_id -> "full" or "zero" for every graded code cell but the speed test (0 without a GPU)."""
    solution = json.loads(NOTEBOOK.read_text())
    tests, answers = _cells(solution), _cells(submission)
    namespace = {}
    exec(tests["setup"], namespace)  # noqa: S102 - the lab's own notebook
    for grade_id in _solution_cell_ids(solution):
        exec(answers[grade_id], namespace)  # noqa: S102
    for grade_id in SETUP_CELLS[1:]:
        try:
            exec(tests[grade_id], namespace)  # noqa: S102
        except Exception:  # noqa: BLE001 - a kernel that does not build fails its tests below, as in nbgrader
            pass
    verdicts = {}
    for grade_id in [g for g in tests if g and g.startswith("test_") and g != "test_speedup"]:
        try:
            exec(tests[grade_id], namespace)  # noqa: S102
            verdicts[grade_id] = "full"
        except Exception:  # noqa: BLE001 - any failure is a zero, as nbgrader scores it
            verdicts[grade_id] = "zero"
    return verdicts


def test_the_instructor_solution_passes_every_graded_test_hidden_ones_included():
    verdicts = _grade(json.loads(NOTEBOOK.read_text()))
    assert verdicts and set(verdicts.values()) == {"full"}, verdicts


@pytest.mark.parametrize("name", [n for n in SAMPLES if n != "correct"])
def test_samples_fail_exactly_the_tests_they_declare(name):
    sample = SAMPLES[name]
    want = {k: v for k, v in expected("lab2", sample, on_gpu=False).items() if k != "test_speedup"}
    assert _grade(make_submission("lab2", sample)) == want


def test_folded_inputs_come_from_torch_and_nothing_is_zero():
    x, w, b, mean, var, gamma, beta, w_f, b_f = lab2.make_inputs((2, 5, 4, 3), seed=3)
    torch_w, torch_b = torch.nn.utils.fusion.fuse_conv_bn_weights(w, b, mean, var, lab2.EPS, gamma, beta)
    fuselab.assert_close(w_f, torch_w.detach())
    fuselab.assert_close(b_f, torch_b.detach())
    for t in (x, w, b, mean, var, gamma, beta):
        assert bool((t != 0).all())
    assert float(var.min()) >= 0.05 and (gamma < 1).any()


@pytest.fixture(scope="module")
def reference_module():
    return lab2.build_reference()


def test_the_lab_reference_pipeline_matches_float64(reference_module):
    fuselab.check(lab2.unfused(reference_module), lab2.reference, lab2.make_inputs,
                  lab2.SMALL_SHAPES + lab2.HIDDEN_SMALL_SHAPES, seeds=(0,), name="lab reference")


def test_the_starter_conv_on_folded_parameters_is_bn_of_conv(reference_module):
    starter = lab2.build_starter()
    x, w, b, mean, var, gamma, beta, w_f, b_f = lab2.make_inputs((3, 5, 9, 33), seed=1)
    y = torch.empty_like(x)
    starter.depthwise_conv(x, w_f, b_f, y, *x.shape)
    fuselab.assert_close(y, lab2.conv_bn(*[t.double() for t in (x, w, b, mean, var, gamma, beta)]))


def test_the_tuned_kernel_handles_partial_tiles_and_unaligned_widths():
    from fuselab.notebook_sources import string_assignments
    tuned = fuselab.build(string_assignments(NOTEBOOK)["TUNED_SOURCE"], [lab2.FOLDED], name="tuned")
    shapes = lab2.SMALL_SHAPES + lab2.HIDDEN_SMALL_SHAPES + [(2, 3, 8, 8), (1, 2, 5, 12)]
    fuselab.check(lab2.fused(tuned), lab2.reference, lab2.make_inputs, shapes, seeds=(2,), name="tuned")


def test_torchs_own_fold_in_fp16_fails_the_dead_channel_case():
    """Why the lab insists on folding fp16 in fp32: eps=1e-8 is 0 in fp16, and rsqrt(0 + 0) is inf."""
    def torch_fold(*args):
        w, b = torch.nn.utils.fusion.fuse_conv_bn_weights(*args)
        return w.detach(), b.detach()
    dead = [c for c in lab2.HIDDEN_FOLD_CASES if c.get("dead_channel")]
    with pytest.raises(AssertionError, match="inf"):
        lab2.check_fold_weights(torch_fold, dead)


def test_network_counts_cover_every_kind_of_block():
    kinds = set()
    for seed in lab2.HIDDEN_NETWORK_SEEDS:
        model, count, _ = lab2.random_network(seed)
        kinds |= {type(m).__name__ for m in model.body}
        assert count >= 1
    assert {"BNAfterActivation", "SharedConvOutput", "ResidualConvBN", "DepthwiseSeparable"} <= kinds


def test_bytes_moved_counts_six_passes_unfused_and_two_fused():
    assert lab2.bytes_moved((2, 3, 4, 5)) == {"unfused": 6 * 120 * 4, "fused": 2 * 120 * 4}


def test_a_fold_computed_in_half_precision_fails_a_visible_case():
    """The text's warning, caught before grading: var = 0 and eps = 1e-8 give var + eps = 0 in fp16, so ±inf."""
    def half_fold(conv_w, conv_b, mean, var, eps, gamma, beta):
        scale = torch.rsqrt(var + eps)  # in the parameters' dtype: fp16 for fp16 parameters
        scale = scale * gamma if gamma is not None else scale
        b = (conv_b if conv_b is not None else torch.zeros_like(mean)) - mean
        return conv_w * scale.reshape(-1, *[1] * (conv_w.dim() - 1)), b * scale + (beta if beta is not None else 0)

    lab2.check_fold_weights(half_fold, [c for c in lab2.FOLD_CASES if "dtype" not in c])  # right in fp32
    dead = [c for c in lab2.FOLD_CASES if c.get("dead_channel")]
    assert dead and all(c["dtype"] == torch.float16 and c["eps"] == 1e-8 for c in dead)
    with pytest.raises(AssertionError, match="inf"):
        lab2.check_fold_weights(half_fold, dead)


def test_a_fold_in_half_precision_fails_the_visible_cases_and_says_why():
    """The pitfall the text warns about must not pass the visible tests: fp16 arithmetic turns eps=1e-8 into 0,
    so a channel whose variance is 0 gets rsqrt(0) = inf."""
    def half_fold(conv_w, conv_b, mean, var, eps, gamma, beta):
        scale = torch.rsqrt(var + eps)  # in the parameters' dtype: fp16 for fp16 parameters
        if gamma is not None:
            scale = scale * gamma
        w = conv_w * scale.reshape((-1,) + (1,) * (conv_w.dim() - 1))
        b = ((torch.zeros_like(mean) if conv_b is None else conv_b) - mean) * scale
        return w, b if beta is None else b + beta
    with pytest.raises(AssertionError, match="fold them in float32"):
        lab2.check_fold_weights(half_fold, lab2.FOLD_CASES)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_the_network_is_timed_both_ways_on_a_gpu():
    net = lab2.mobilenet(**lab2.TINY_MOBILENET).cuda().eval()
    row = lab2.time_network_both_ways(net, net, batch=1, budget_s=0.3)
    assert set(row["speedup"]) == {"device", "stream"}
    for mode in ("device", "stream"):
        assert all(t > 0 for t in row["median_ms"][mode].values())
        assert 0.8 < row["speedup"][mode] < 1.25  # the same model against itself
