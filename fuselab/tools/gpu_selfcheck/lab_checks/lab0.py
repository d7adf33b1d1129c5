"""Lab 0 on the GPU: the instructor's kernels, built from solutions/, checked, timed and graded."""

import datetime
import json
from pathlib import Path

import torch

from .... import build, check, ceilings, compare, speed
from ....course import REPO
from ....notebook_sources import string_assignments
from ....timing import full_points_threshold
from ....timing.policy import MIN_GRADABLE_SPEEDUP
from ....labs import lab0

NOTEBOOK = REPO / "solutions" / lab0.NOTEBOOK


def run(out):
    sources = string_assignments(NOTEBOOK)
    unfused_mod = build(sources["UNFUSED_SOURCE"], lab0.UNFUSED_LAUNCHERS, name="unfused")
    plain_mod = build(sources["FUSED_SOURCE"], [lab0.FUSED], name="fused")
    tuned_mod = build(sources["TUNED_SOURCE"], [lab0.FUSED], name="tuned")
    reference_mod = build(lab0.REFERENCE_UNFUSED_SOURCE, lab0.UNFUSED_LAUNCHERS, name="lab0_reference")
    plain, tuned = lab0.fused(plain_mod), lab0.fused(tuned_mod)
    reference_op, student_unfused = lab0.unfused(reference_mod), lab0.unfused(unfused_mod)

    def make(shape, seed):
        return lab0.make_inputs(shape, seed, device="cuda")

    shapes = lab0.GPU_SHAPES + [lab0.TIMED_SHAPE]
    for name, op in (("plain", plain), ("tuned", tuned), ("unfused", student_unfused), ("reference", reference_op)):
        check(op, lab0.reference, make, shapes, seeds=(1, 2), name=name)

    a, b, e = make(lab0.TIMED_SHAPE, seed=3)
    out_t = torch.empty_like(a)
    eager = lambda: torch.relu(a + b) * e  # noqa: E731
    compiled_fn = torch.compile(lambda a, b, e: torch.relu(a + b) * e)
    compiled_fn(a, b, e)
    result = compare({"lab reference": lambda: reference_op(a, b, e, out_t),
                      "student unfused": lambda: student_unfused(a, b, e, out_t),
                      "eager": eager, "torch.compile": lambda: compiled_fn(a, b, e),
                      "plain fused": lambda: plain(a, b, e, out_t),
                      "tuned fused": lambda: tuned(a, b, e, out_t)},
                     baseline="lab reference", mode="device", budget_s=8, progress=False)
    ceil = ceilings()
    moved = lab0.bytes_moved(a.numel())
    s_plain = result.speedup("plain fused").value
    timings = {name: {"median_us": result[name].median * 1e6, "speedup_vs_reference": result.speedup(name).value,
                      "ci": [result.speedup(name).low, result.speedup(name).high]} for name in result.names}
    for name in ("plain fused", "tuned fused"):
        rate = moved["fused"] / result[name].median
        timings[name]["GBps"] = rate / 1e9
        timings[name]["fraction_of_copy"] = rate / ceil.copy_bytes_per_s
    a = b = e = out_t = None  # not del: the lambdas above close over these names
    torch.cuda.empty_cache()

    rows = lab0.sweep(reference_op, plain, budget_s=0.6, progress=False)
    sweep = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "rows": rows,
             "copy_GBps": ceil.copy_bytes_per_s / 1e9, "l2_bytes": torch.cuda.get_device_properties(0).L2_cache_size,
             "note": "plain fused kernel vs the lab's unfused reference, device time, L2 flushed"}
    (Path(out) / lab0.SWEEP_RESULTS).write_text(json.dumps(sweep, indent=2))
    torch.cuda.empty_cache()

    points = speed.speedup_test(lab0.GRADED_TEST, candidate=plain, reference_op=reference_op,
                                reference=lab0.reference, make_inputs=make, module=plain_mod, max_points=4)
    threshold = full_points_threshold(s_plain) if s_plain >= MIN_GRADABLE_SPEEDUP else None
    tuned_frac = timings["tuned fused"]["fraction_of_copy"]
    return {"status": "ok", "plain_speedup": s_plain,
            "graded": {lab0.GRADED_TEST: {**lab0.GRADED_SETTINGS, "plain_speedup": s_plain}}, "threshold_from_plain": threshold,
            "graded_points_plain": points, "timings_64M": timings, "sweep_rows": len(rows),
            "copy_GBps": ceil.copy_bytes_per_s / 1e9,
            "headline": f"S={s_plain:.2f}x -> threshold {threshold:.2f}x, plain graded {points:.1f}/4, tuned "
                        f"{tuned_frac:.0%} of copy, eager {timings['eager']['speedup_vs_reference']:.2f}x, "
                        f"compile {timings['torch.compile']['speedup_vs_reference']:.2f}x"}
