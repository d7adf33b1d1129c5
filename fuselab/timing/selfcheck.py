"""``selfcheck``: the numbers that say whether fuselab's timing can be trusted on this GPU.

Goals: the medians of one kernel measured five times spread by at most 1%, and fuselab agrees with
``triton.testing.do_bench`` within 5% on a memory-bound kernel.
"""

import time

import torch

from . import gpu, stats
from .compare import compare
from .measure import measure
from .overhead import launch_overhead
from .roofline import ceilings


def _spread_pct(values):
    return (max(values) - min(values)) / stats.median(values) * 100.0


def _do_bench_median_s(fn):
    """triton's median in seconds, or None where triton is missing."""
    try:
        from triton.testing import do_bench
    except Exception:
        return None
    return do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e3


def selfcheck(device=None, repeats=5, elements=1 << 26, refresh_ceilings=False) -> dict:
    """Run the timing checks on a GPU and return their numbers (times in us, rates in GB/s or TFLOP/s).

    A memory-bound kernel (``y = 2 x`` in fp32, ``elements`` long, 512 MB moved by default) is measured
    ``repeats`` times; the spread of its medians and its distance to do_bench are the accuracy goals.
    Then: a small kernel in all three modes, interleaved self-comparisons, launch overhead and the ceilings.
    """
    if not gpu.cuda_ready():
        raise gpu.NoGPUError("selfcheck needs a GPU")
    device = gpu.resolve_device(device)
    started = time.perf_counter()
    out = {"device": gpu.device_name(device), "torch": torch.__version__}
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:
        out["triton"] = None

    with torch.cuda.device(device):
        x = torch.randn(elements, device=device)
        y = torch.empty_like(x)

        def scale():
            torch.mul(x, 2.0, out=y)

        runs = [measure(scale, mode="device", label="scale", device=device, progress=False) for _ in range(repeats)]
        medians = [m.median for m in runs]
        out["big_kernel_medians_us"] = [round(m * 1e6, 3) for m in medians]
        out["big_kernel_n"] = [m.n for m in runs]
        out["big_kernel_rse_pct"] = [round(m.rse * 100, 4) for m in runs]
        out["spread_pct"] = _spread_pct(medians)
        out["big_kernel_GBps"] = 2 * x.numel() * x.element_size() / stats.median(medians) / 1e9
        reference = _do_bench_median_s(scale)
        out["do_bench_us"] = None if reference is None else reference * 1e6
        out["vs_do_bench_pct"] = None if reference is None else (stats.median(medians) / reference - 1) * 100

        # A small kernel: where the modes differ, and where spread is hardest.
        small_x = torch.randn(1 << 14, device=device)
        small_y = torch.empty_like(small_x)

        def small():
            torch.mul(small_x, 2.0, out=small_y)

        small_runs = [measure(small, mode="device", device=device, progress=False) for _ in range(repeats)]
        out["small_kernel_device_us"] = [round(m.median * 1e6, 3) for m in small_runs]
        out["small_spread_pct"] = _spread_pct([m.median for m in small_runs])
        for mode in ("latency", "graph"):
            out[f"small_kernel_{mode}_us"] = measure(small, mode=mode, device=device, progress=False).median * 1e6
        out["small_kernel_device_noflush_us"] = measure(small, mode="device", flush=False, device=device,
                                                        progress=False).median * 1e6
        small_reference = _do_bench_median_s(small)
        out["small_do_bench_us"] = None if small_reference is None else small_reference * 1e6

        def scale_twice():
            scale()
            scale()

        same = compare({"a": scale, "b": scale}, mode="device", device=device, progress=False)
        out["self_speedup"] = same.speedups["b"].value
        out["self_speedup_ci"] = [same.speedups["b"].low, same.speedups["b"].high]
        # Interleaved speedups repeated: their spread is what a grade would see from run to run.
        doubles = [compare({"twice": scale_twice, "once": scale}, mode="device", device=device, progress=False)
                   for _ in range(3)]
        out["once_vs_twice_speedups"] = [d.speedups["once"].value for d in doubles]
        out["once_vs_twice_cis"] = [[d.speedups["once"].low, d.speedups["once"].high] for d in doubles]
        out["once_vs_twice_spread_pct"] = _spread_pct(out["once_vs_twice_speedups"])
        small_doubles = [compare({"twice": lambda: (small(), small()), "once": small}, mode="device", device=device,
                                 progress=False) for _ in range(3)]
        out["small_once_vs_twice_speedups"] = [d.speedups["once"].value for d in small_doubles]
        out["small_once_vs_twice_spread_pct"] = _spread_pct(out["small_once_vs_twice_speedups"])
        x = y = None  # not del: the lambdas above close over these names
        torch.cuda.empty_cache()

        overhead = launch_overhead(device)
        out.update({f"launch_{k}": v for k, v in overhead.to_dict().items() if k not in ("device",)})
        limits = ceilings(device, refresh=refresh_ceilings)
        out["copy_GBps"] = limits.copy_bytes_per_s / 1e9
        out["fp32_TFLOPs"] = limits.fp32_flops_per_s / 1e12
        out["fp16_TFLOPs"] = limits.fp16_flops_per_s / 1e12
    out["goal_spread_ok"] = out["spread_pct"] <= 1.0
    out["goal_do_bench_ok"] = None if out["vs_do_bench_pct"] is None else abs(out["vs_do_bench_pct"]) <= 5.0
    out["selfcheck_s"] = time.perf_counter() - started
    return out
