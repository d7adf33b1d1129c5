"""Lab 1's own pieces: its inputs and references, its fixed kernels under the emulation, its GPU self-check stage
(a dry run on tiny shapes, so that a typo never costs GPU time) and its samples."""

import json

import pytest
import torch
import torch.nn.functional as F

import fuselab
from fuselab.labs import lab1
from fuselab.labs.lab1 import samples as lab1_samples
from fuselab.tools.gpu_selfcheck.lab_checks import lab1 as lab1_selfcheck
from fuselab.course.sample_class import make_submission


def test_conv_output_size_matches_pytorch():
    for case in lab1.SMALL_CONV_CASES + lab1.HIDDEN_SMALL_CONV_CASES:
        x, w, bias, stride, pad, act, slope = lab1.make_conv_inputs(case, seed=0)
        y = F.conv2d(x, w, bias, stride=stride, padding=pad)
        assert y.shape[2:] == (lab1.conv_output_size(case.H, case.R, stride, pad),
                               lab1.conv_output_size(case.W, case.R, stride, pad)), case


def test_inputs_are_random_never_zero_and_follow_the_case():
    x, w, bias, stride, pad, act, slope = lab1.make_conv_inputs(lab1.ConvCase(2, 3, 5, 7, 4, 3, 2, 0, False, "none"), 1)
    assert x.shape == (2, 3, 5, 7) and w.shape == (4, 3, 3, 3) and bias is None and (stride, pad, act) == (2, 0, "none")
    assert (x != 0).all() and x.std() > 0.5 and 0 < slope < 1
    x, w, bias, act, slope = lab1.make_depthwise_inputs((2, 5, 4, 3), seed=2)
    assert w.shape == (5, 1, 3, 3) and bias.shape == (5,) and act == "relu"
    again = lab1.make_depthwise_inputs((2, 5, 4, 3), seed=2)
    assert torch.equal(again[0], x) and not torch.equal(lab1.make_depthwise_inputs((2, 5, 4, 3), seed=3)[0], x)


def test_case_sets_cover_what_the_issue_asks():
    for cases in (lab1.SMALL_CONV_CASES, lab1.GPU_CONV_CASES):
        assert {c.stride for c in cases} == {1, 2} and {c.pad for c in cases} == {0, 1}
        assert {c.R for c in cases} == {1, 3} and {c.bias for c in cases} == {True, False}
        assert {c.act for c in cases} == set(lab1.ACTIVATIONS) and any(c.N == 1 for c in cases)
    for cases in (lab1.SMALL_DEPTHWISE_CASES, lab1.GPU_DEPTHWISE_CASES):
        assert {c.bias for c in cases} == {True, False} and {c.act for c in cases} == set(lab1.ACTIVATIONS)
        assert any(c.W % 32 and c.W > 32 for c in cases) and any(c.N == 1 for c in cases)
    small_work = max(c.N * c.C * c.H * c.W for c in lab1.SMALL_DEPTHWISE_CASES + lab1.SMALL_CONV_CASES)
    assert small_work < 5_000, "small cases run under the emulation: keep them small"
    assert lab1.depthwise_bytes(*lab1.DEPTHWISE_TIMED)["fused"] / 2 > 5 * 60e6, "the graded tensor must dwarf the L2"


def test_references_are_activations_of_pytorchs_conv():
    y = torch.randn(100, dtype=torch.float64)
    assert torch.equal(lab1.activate(y, "leaky_relu", 0.2), torch.where(y > 0, y, 0.2 * y))
    with pytest.raises(ValueError):
        lab1.activate(y, "gelu", 0.0)


@pytest.fixture(scope="module")
def fixed_modules():
    reference = fuselab.build(lab1.REFERENCE_SOURCE, lab1.REFERENCE_LAUNCHERS, name="lab1_reference", backend="emulate")
    candidates = fuselab.build(lab1.CANDIDATE_SOURCE, lab1.CANDIDATE_LAUNCHERS, name="lab1_candidates",
                               backend="emulate")
    return reference, candidates


def test_the_labs_reference_pair_is_right(fixed_modules):
    reference, _ = fixed_modules
    fuselab.check(lab1.depthwise_unfused(reference), lab1.depthwise_reference, lab1.make_depthwise_inputs,
                  lab1.SMALL_DEPTHWISE_CASES, seeds=(0,), name="reference pair")


def test_the_self_checks_candidate_pipelines_are_right(fixed_modules):
    reference, candidates = fixed_modules
    cases = [c for c in lab1.SMALL_DEPTHWISE_CASES if c.bias]
    for name, op in lab1_selfcheck._pipelines(reference, candidates).items():
        fuselab.check(op, lab1.depthwise_reference, lab1.make_depthwise_inputs, cases, seeds=(0,), name=name)
    for op in lab1_selfcheck._fp16_ops(candidates):
        fuselab.check(op, lab1.depthwise_reference,
                      lambda case, seed: lab1.make_depthwise_inputs(case, seed, dtype=torch.float16),
                      lab1.SMALL_DEPTHWISE_CASES, seeds=(0,), name="fp16")


def test_self_check_stage_runs_end_to_end_as_a_dry_run(tmp_path):
    result = lab1_selfcheck.run(tmp_path, lab1_selfcheck.dry_run_plan())
    assert result["headline"].startswith("S=") and set(result["goals"]) == {
        "graded S >= 1.3", "tuned >= 50% of copy", "tuned beats torch.compile"}
    assert set(result["speedup_by_pipeline"]) >= {"conv+bias -> relu (graded)", "conv -> bias -> relu",
                                                  "fp16 conv+bias -> relu", "launch-bound"}
    saved = json.loads((tmp_path / lab1.DEPTHWISE_RESULTS).read_text())
    assert saved["rows"][0]["baseline"] == "conv+bias -> relu (graded)" and len(saved["rows"]) == 5
    assert "unfused pair" in json.loads((tmp_path / lab1.CONV_RESULTS).read_text())["times_us"]


@pytest.mark.parametrize("name", sorted(lab1_samples.SAMPLES))
def test_every_sample_applies(name):
    make_submission("lab1", lab1_samples.SAMPLES[name])


def test_an_output_size_computed_with_true_division_is_caught():
    lab1.check_output_size(lab1.conv_output_size)
    with pytest.raises(AssertionError, match=r"conv_output_size\(5, 3, 2, 1\) returned 3.0, a float: .* \(use // for integer division"):
        lab1.check_output_size(lambda size, kernel, stride, pad: (size + 2 * pad - kernel) / stride + 1)
    with pytest.raises(AssertionError, match=r"returned 3, expected 2"):  # an int, but 2.5 rounded up
        lab1.check_output_size(lambda size, kernel, stride, pad: round((size + 2 * pad - kernel) / stride + 1.01))


def test_the_conv_launchers_output_size_rule_is_the_labs():
    from fuselab.prototypes import evaluate, parse
    y = parse(lab1.CONV).params[3]
    assert y.name == "y" and dict(y.rules)["P"] == "(H + 2*pad - R)/stride + 1"
    for case in lab1.SMALL_CONV_CASES + lab1.HIDDEN_SMALL_CONV_CASES:
        values = {"H": case.H, "W": case.W, "R": case.R, "S": case.R, "stride": case.stride, "pad": case.pad}
        assert (evaluate(dict(y.rules)["P"], values), evaluate(dict(y.rules)["Q"], values)) == \
            (lab1.conv_output_size(case.H, case.R, case.stride, case.pad),
             lab1.conv_output_size(case.W, case.R, case.stride, case.pad)), case


def _graded_cell(lab, grade_id, hidden=True):
    """A graded test cell of the solution notebook, with or without its hidden tests."""
    import re
    from fuselab import course
    nb = json.loads((course.SOLUTIONS / lab / f"{lab}.ipynb").read_text())
    source = next("".join(c["source"]) for c in nb["cells"]
                  if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    return source if hidden else re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "", source, flags=re.S)


@pytest.mark.parametrize("hidden", [False, True])
def test_float_division_in_conv_output_size_fails_with_a_message_that_names_it(hidden):
    cell = _graded_cell("lab1", "test_output_size", hidden)
    exec(cell, {"lab1": lab1, "conv_output_size": lab1.conv_output_size})  # the right answer passes
    with pytest.raises(AssertionError, match="//"):
        exec(cell, {"lab1": lab1, "conv_output_size": lambda size, kernel, stride, pad:
                    (size + 2 * pad - kernel) / stride + 1})


def test_the_in_place_demo_shows_most_outputs_wrong_under_the_emulation():
    """Lab 1's pitfall text says that under the CPU emulation "most outputs read a neighbour that an earlier thread
    has already overwritten": the demo's own case, run with the solution's depthwise kernel in place, must print a
    majority of wrong outputs (68 % when this test was written), and the ReLU in place must stay exact."""
    import re

    from fuselab import notebook as ipynb
    from fuselab.notebook_sources import string_assignments
    from .conftest import REPO
    path = REPO / "solutions" / "lab1" / "lab1.ipynb"
    notebook = ipynb.load(path)
    words = "most outputs read a neighbour that an earlier thread has already overwritten"
    markdown = " ".join(ipynb.source(c) for c in notebook["cells"] if c["cell_type"] == "markdown")
    assert words in re.sub(r"\s+", " ", markdown)
    demo = next(ipynb.source(c) for c in notebook["cells"] if ipynb.grade_id(c) == "in_place_demo")
    case = eval(re.search(r"lab1\.DepthwiseCase\([^)]*\)", demo).group(0), {"lab1": lab1})
    seed = int(re.search(r"make_depthwise\(case, seed=(\d+)\)", demo).group(1))
    module = fuselab.build(string_assignments(path)["DEPTHWISE_SOURCE"], [lab1.DEPTHWISE_ACT], name="depthwise",
                           backend="emulate")
    x, w, bias, act, slope = lab1.make_depthwise_inputs(case, seed)
    expected = lab1.depthwise_reference(x.double(), w.double(), bias.double(), act, slope)
    clobbered = x.clone()
    lab1.depthwise_fused(module)(clobbered, w, bias, act, slope, clobbered)
    wrong = ((clobbered.double() - expected).abs() > 1e-4 * expected.abs().max()).double().mean().item()
    assert wrong > 0.5, f"in place, only {wrong:.0%} of the outputs are wrong: the text says most"
