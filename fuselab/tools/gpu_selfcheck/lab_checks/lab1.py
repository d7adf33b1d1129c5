"""Lab 1 on the GPU: the instructor's kernels, built from solutions/, checked, timed and graded.

Besides the graded pair (the lab's depthwise conv with bias, then a ReLU kernel) it times the other unfused
pipelines the graded test could use (a bias pass of its own; fp16 storage), the plain fused kernel at a
launch-bound shape and at an L2-sized one, so that the graded pipeline and its threshold come from numbers.
"""

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .... import build, ceilings, check, speed
from ....course import REPO
from ....notebook_sources import string_assignments
from ....timing import full_points_threshold
from ....timing.policy import MIN_GRADABLE_SPEEDUP
from ....labs import lab1

NOTEBOOK = REPO / "solutions" / lab1.NOTEBOOK
GRADED_FLOOR = MIN_GRADABLE_SPEEDUP  # docs/design.md §3: a speedup is graded only where the plain solution reaches it


def _pipelines(reference_mod, candidate_mod):
    """Unfused depthwise + ReLU pipelines, op(x, w, bias, act, slope, out) each."""
    act_code = lab1.ACTIVATIONS

    def planes(t):  # (N, C, H*W), sized by hand: an empty batch cannot infer a -1
        return t.view(t.shape[0], t.shape[1], t.shape[2] * t.shape[3])

    def conv_then_bias_act(x, w, bias, act, slope, out):
        t = torch.empty_like(out)
        reference_mod.depthwise_conv(x, w, x.new_empty(0), t, *x.shape)
        candidate_mod.bias_act(planes(t), bias, planes(out), x.shape[0], x.shape[1], x.shape[2] * x.shape[3],
                               act_code[act], slope)

    def conv_then_bias_then_act(x, w, bias, act, slope, out):
        t1, t2 = torch.empty_like(out), torch.empty_like(out)
        reference_mod.depthwise_conv(x, w, x.new_empty(0), t1, *x.shape)
        candidate_mod.bias_add(planes(t1), bias, planes(t2), x.shape[0], x.shape[1], x.shape[2] * x.shape[3])
        reference_mod.activation(t2, out, out.numel(), act_code[act], slope)

    return {"conv+bias -> relu (graded)": lab1.depthwise_unfused(reference_mod),
            "conv -> bias+relu": conv_then_bias_act,
            "conv -> bias -> relu": conv_then_bias_then_act}


def _fp16_ops(candidate_mod):
    def unfused(x, w, bias, act, slope, out):
        t = torch.empty_like(out)
        candidate_mod.depthwise_conv_f16(x, w, bias if bias is not None else x.new_empty(0), t, *x.shape)
        candidate_mod.activation_f16(t, out, out.numel(), lab1.ACTIVATIONS[act], slope)

    def fused(x, w, bias, act, slope, out):
        candidate_mod.depthwise_conv_act_f16(x, w, bias if bias is not None else x.new_empty(0), out, *x.shape,
                                             lab1.ACTIVATIONS[act], slope)
    return unfused, fused


@dataclass(frozen=True)
class Plan:
    """What the stage runs: shapes and time budgets. The GPU plan is the real one; a dry run shrinks it."""

    device: str = "cuda"
    backend: str | None = None  # fuselab.build's choice; the dry run forces "emulate"
    conv_cases: tuple = tuple(lab1.GPU_CONV_CASES)
    depthwise_cases: tuple = tuple(lab1.GPU_DEPTHWISE_CASES)
    conv_timed: tuple = lab1.CONV_TIMED
    graded: tuple = lab1.DEPTHWISE_TIMED
    launch_bound: tuple = lab1.DEPTHWISE_SMALL_TIMED
    l2_sized: tuple = lab1.DEPTHWISE_L2_TIMED
    budget_scale: float = 1.0


def dry_run_plan():
    """Tiny shapes under the CPU emulation: proves the stage runs end to end (tests/test_lab1.py), measures nothing."""
    return Plan(device="cpu", backend="emulate", conv_cases=(lab1.SMALL_CONV_CASES[0],),
                depthwise_cases=(lab1.SMALL_DEPTHWISE_CASES[2],), conv_timed=lab1.ConvCase(1, 2, 6, 5, 3, 3),
                graded=(1, 3, 9, 12), launch_bound=(1, 2, 5, 8), l2_sized=(2, 2, 4, 4), budget_scale=0.02)


def run(out, plan=None):
    plan = plan or Plan()
    device, out = plan.device, Path(out)
    sources = string_assignments(NOTEBOOK)
    conv_mod = build(sources["CONV_SOURCE"], lab1.SOLUTION_SOURCES["CONV_SOURCE"], name="conv", backend=plan.backend)
    conv_act_mod = build(sources["CONV_ACT_SOURCE"], [lab1.CONV_ACT], name="conv_act", backend=plan.backend)
    plain_mod = build(sources["DEPTHWISE_SOURCE"], [lab1.DEPTHWISE_ACT], name="depthwise", backend=plan.backend)
    tuned_mod = build(sources["TUNED_SOURCE"], [lab1.DEPTHWISE_ACT], name="tuned", backend=plan.backend)
    reference_mod = build(lab1.REFERENCE_SOURCE, lab1.REFERENCE_LAUNCHERS, name="lab1_reference",
                          backend=plan.backend)
    candidate_mod = build(lab1.CANDIDATE_SOURCE, lab1.CANDIDATE_LAUNCHERS, name="lab1_candidates",
                          backend=plan.backend)
    plain, tuned = lab1.depthwise_fused(plain_mod), lab1.depthwise_fused(tuned_mod)
    reference_op = lab1.depthwise_unfused(reference_mod)
    pipelines = _pipelines(reference_mod, candidate_mod)
    fp16_unfused, fp16_fused = _fp16_ops(candidate_mod)

    def make_conv(case, seed):
        return lab1.make_conv_inputs(case, seed, device=device)

    def make_dw(case, seed, dtype=torch.float32):
        return lab1.make_depthwise_inputs(case, seed, device=device, dtype=dtype)

    # correctness on the GPU cases (the hidden tests' shapes), the timed shapes included
    conv_cases = list(plan.conv_cases)
    check(lab1.conv(conv_mod), lab1.conv_only_reference, make_conv, conv_cases, seeds=(1,), name="conv")
    check(lab1.conv_unfused(conv_mod), lab1.conv_reference, make_conv, conv_cases, seeds=(1,), name="conv unfused")
    check(lab1.conv_fused(conv_act_mod), lab1.conv_reference, make_conv, conv_cases + [plan.conv_timed], seeds=(1,),
          name="conv fused")
    dw_cases = list(plan.depthwise_cases) + [plan.graded, plan.launch_bound]
    for name, op in (("plain", plain), ("tuned", tuned)):
        check(op, lab1.depthwise_reference, make_dw, dw_cases, seeds=(1,), name=name)
    with_bias = [case for case in dw_cases if lab1.DepthwiseCase(*case).bias]  # the bias passes need one
    for name, op in pipelines.items():
        check(op, lab1.depthwise_reference, make_dw, with_bias, seeds=(1,), name=name)
    fp16_cases = [plan.launch_bound, lab1.DepthwiseCase(3, 17, 67, 45, False, "leaky_relu")]
    for name, op in (("fp16 unfused", fp16_unfused), ("fp16 fused", fp16_fused)):
        check(op, lab1.depthwise_reference, lambda s, seed: make_dw(s, seed, torch.float16), fp16_cases,
              seeds=(1,), name=name)
    _free(device)

    ceil = ceilings() if device == "cuda" else _h200_ceilings()
    copy = ceil.copy_bytes_per_s
    today = datetime.date.today().isoformat()
    gpu = torch.cuda.get_device_name() if device == "cuda" else "none (dry run under the emulation)"

    def timed(ops, shape, budget_s, **kwargs):
        return lab1.time_depthwise(ops, shape, budget_s=budget_s * plan.budget_scale, progress=False, device=device,
                                   **kwargs)[1]

    # Part A: compute-bound, so the epilogue pass is a few percent of the time
    _, conv_summary = lab1.time_conv_epilogue(conv_mod, conv_act_mod, case=plan.conv_timed,
                                              budget_s=3.0 * plan.budget_scale, progress=False, device=device)
    conv_summary.update(gpu=gpu, date=today, copy_GBps=copy / 1e9, fp32_TFLOPs=ceil.fp32_flops_per_s / 1e12,
                        note="the instructor's plain kernels, device time, L2 flushed")
    (out / lab1.CONV_RESULTS).write_text(json.dumps(conv_summary, indent=2))

    # Part B at the graded shape: every candidate pipeline, eager, torch.compile, plain and tuned
    compiled = torch.compile(lab1.depthwise_eager, dynamic=False) if device == "cuda" else lab1.depthwise_eager
    x, w, bias, act, slope = make_dw(plan.graded, 0)
    compiled(x, w, bias, act, slope)  # compile outside the timing
    del x, w, bias
    graded = "conv+bias -> relu (graded)"
    big = timed({**pipelines, "PyTorch eager": _returning(lab1.depthwise_eager), "torch.compile": _returning(compiled),
                 "plain fused": plain, "tuned fused": tuned}, plan.graded, 9.0, baseline=graded)
    big["label"] = "graded shape (output 308 MB, beyond L2)"
    _free(device)
    no_bias = timed({"conv -> relu": reference_op, "plain fused": plain}, (*plan.graded, False, "relu"), 2.0)
    no_bias["label"] = "no bias"
    half = timed({"fp16 conv+bias -> relu": fp16_unfused, "fp16 plain fused": fp16_fused}, plan.graded, 2.0,
                 dtype=torch.float16)
    half["label"] = "fp16 storage, fp32 arithmetic"
    _free(device)
    small_ops = {graded: reference_op, "PyTorch eager": _returning(lab1.depthwise_eager), "plain fused": plain,
                 "tuned fused": tuned}
    launch_bound = timed(small_ops, plan.launch_bound, 2.0)
    launch_bound["label"] = "launch-bound (batch 1, 1.6 MB)"
    l2_sized = timed(small_ops, plan.l2_sized, 2.0)
    l2_sized["label"] = "L2-sized (output 58 MB, about the L2)"
    rows = [big, no_bias, half, launch_bound, l2_sized]
    (out / lab1.DEPTHWISE_RESULTS).write_text(json.dumps(
        {"gpu": gpu, "date": today, "copy_GBps": copy / 1e9, "rows": rows,
         "note": "device time, L2 flushed; effective_GBps = minimum fused traffic (read x, write y) / time"},
        indent=2))
    _free(device)

    # S of the plain fused kernel over each candidate unfused pipeline, and the tuned kernel against the ceilings
    plain_us = big["times_us"]["plain fused"]
    s_by_pipeline = {name: big["times_us"][name] / plain_us for name in pipelines}
    s_by_pipeline.update({"no bias: conv -> relu": no_bias["speedups"]["plain fused"],
                          "fp16 conv+bias -> relu": half["speedups"]["fp16 plain fused"],
                          "launch-bound": launch_bound["speedups"]["plain fused"],
                          "L2-sized": l2_sized["speedups"]["plain fused"]})
    s_plain = s_by_pipeline[graded]
    tuned_fraction = big["effective_GBps"]["tuned fused"] * 1e9 / copy
    plain_fraction = big["effective_GBps"]["plain fused"] * 1e9 / copy
    tuned_vs_compile = big["times_us"]["torch.compile"] / big["times_us"]["tuned fused"]
    threshold = full_points_threshold(s_plain) if s_plain >= GRADED_FLOOR else None

    points = None
    if lab1.GRADED_TEST in speed.load_policy()["tests"]:
        points = speed.speedup_test(lab1.GRADED_TEST, candidate=plain, reference_op=reference_op,
                                    reference=lab1.depthwise_reference, make_inputs=make_dw, module=plain_mod,
                                    max_points=4, verbose=False)
    goals = {"graded S >= 1.3": s_plain >= GRADED_FLOOR, "tuned >= 50% of copy": tuned_fraction >= 0.5,
             "tuned beats torch.compile": tuned_vs_compile > 1.0}
    part_a = conv_summary["speedups"]["fused"]
    headline = (f"S={s_plain:.2f}x -> threshold {threshold:.2f}x" if threshold else f"S={s_plain:.2f}x (< 1.3)")
    headline += (f", bias pass {s_by_pipeline['conv -> bias -> relu']:.2f}x, fp16 "
                 f"{s_by_pipeline['fp16 conv+bias -> relu']:.2f}x, tuned {tuned_fraction:.0%} of copy and "
                 f"{tuned_vs_compile:.2f}x compile, part A {part_a:.3f}x")
    if points is not None:
        headline += f", graded {points:.1f}/4"
    graded = {lab1.GRADED_TEST: {**lab1.LAB.graded_test(lab1.GRADED_TEST).timed(), "plain_speedup": s_plain}}
    return {"status": "ok" if all(goals.values()) else "MISS", "goals": goals, "headline": headline, "graded": graded,
            "plain_speedup": s_plain, "threshold_from_plain": threshold, "graded_points_plain": points,
            "speedup_by_pipeline": s_by_pipeline, "plain_fraction_of_copy": plain_fraction,
            "tuned_fraction_of_copy": tuned_fraction, "tuned_vs_compile": tuned_vs_compile,
            "part_a_fusion_speedup": part_a, "copy_GBps": copy / 1e9, "depthwise_rows": rows, "conv": conv_summary}


def _returning(fn):
    """A PyTorch function as an op(x, w, bias, act, slope, out): it allocates its own output, as eager does."""
    def op(x, w, bias, act, slope, out):
        fn(x, w, bias, act, slope)
    return op


def _h200_ceilings():
    from ....timing import Ceilings
    return Ceilings("NVIDIA H200 (course self-check)", torch.__version__, lab1.H200_CEILINGS["copy_bytes_per_s"],
                    lab1.H200_CEILINGS["fp32_flops_per_s"], 0.0)


def _free(device):
    if device == "cuda":
        torch.cuda.empty_cache()
