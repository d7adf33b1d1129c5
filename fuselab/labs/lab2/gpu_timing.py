"""Lab 2 on the GPU: the fused kernel in context (eager, ``torch.compile``) and the folded network timed."""

import torch

from .kernels import CONTEXT_SHAPES, bytes_moved, eager, make_inputs
from .networks import NETWORK_BATCHES

# ------------------------------------------------------------------------------------------------ GPU timing
def measure_context(candidates, shapes=CONTEXT_SHAPES, budget_s=2.0, progress=None, device="cuda"):
    """Time the lab's ops (name -> ``op(*inputs, out)``, the first one the baseline) with PyTorch eager and
    ``torch.compile`` (of the unfolded three-op graph) at each shape, interleaved, device time, L2 flushed.

    Returns one row per shape: median µs, speedup over the baseline with its interval, and the effective
    bandwidth (the fused kernel's minimum traffic, x and out, over the time) of each candidate.
    """
    from ... import timing
    from ...quiet import captured_output
    compiled = torch.compile(eager, dynamic=False)
    baseline = next(iter(candidates))
    rows = []
    for shape in shapes:
        inputs = make_inputs(shape, seed=7, device=device)
        out = torch.empty_like(inputs[0])
        with captured_output():  # compile outside the timing, and keep its warnings off stderr
            compiled(*inputs)
        fns = {name: (lambda op=op: op(*inputs, out)) for name, op in candidates.items()}
        fns["PyTorch eager"] = lambda: eager(*inputs)
        fns["torch.compile"] = lambda: compiled(*inputs)
        result = timing.compare(fns, baseline=baseline, mode="device", budget_s=budget_s, progress=progress)
        moved = bytes_moved(shape)["fused"]
        rows.append({"shape": list(shape), "baseline": baseline,
                     "median_us": {n: result[n].median * 1e6 for n in result.names},
                     "speedup": {n: result.speedup(n).value for n in result.names},
                     "ci": {n: [result.speedup(n).low, result.speedup(n).high] for n in result.names},
                     "effective_GBps": {n: moved / result[n].median / 1e9 for n in result.names}})
        inputs = out = None  # not del: the lambdas above close over these names
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def plot_context(rows, ax=None, title=""):
    """Grouped bars: each candidate's speedup over the lab's unfused reference, per shape."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.8))
    names = list(rows[0]["speedup"])
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        values = [row["speedup"][name] for row in rows]
        bars = ax.bar([i + (k - (len(names) - 1) / 2) * width for i in range(len(rows))], values, width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(["N={} C={} {}x{}".format(*row["shape"]) for row in rows])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel(f"speedup over {rows[0]['baseline']}")
    ax.set_title(title or "depthwise 3x3 conv + BN + ReLU, fp32, device time")
    ax.legend(fontsize=8, ncol=2)
    return ax


def time_networks(models, batches=NETWORK_BATCHES, image=224, budget_s=2.0, progress=None, device="cuda"):
    """Device time of whole-network inference (name -> model on the GPU, the first one the baseline) per batch."""
    from ... import timing
    from ...quiet import captured_output
    rows = []
    for batch in batches:
        x = torch.randn(batch, 3, image, image, device=device)
        with torch.no_grad():
            with captured_output():  # torch.compile compiles on the first call; keep its warnings off stderr
                for model in models.values():
                    model(x)
            result = timing.compare({name: (lambda m=m: m(x)) for name, m in models.items()}, mode="device",
                                    budget_s=budget_s, progress=progress)
        rows.append({"batch": batch, "median_ms": {n: result[n].median * 1e3 for n in result.names},
                     "speedup": {n: result.speedup(n).value for n in result.names}})
    return rows


def time_network_stream(models, batch=1, image=224, calls=20, rounds=15, device="cuda"):
    """Throughput of a *stream* of forward passes (name -> model on the GPU, the first one the baseline): CUDA
    events around ``calls`` back-to-back calls, no L2 flush and no synchronization between them, ms per call,
    median over ``rounds`` rounds in rotating order.

    Unlike ``fuselab.compare`` (device mode: the GPU time of one call after an L2 flush, with the whole call queued
    before the GPU starts it), the host issues each call while the GPU runs the previous ones: where the host's
    launch work per call exceeds the GPU's work (eager PyTorch at batch 1), this time is the host's, and it counts
    every module call and launch that folding removed."""
    import statistics
    names = list(models)
    x = torch.randn(batch, 3, image, image, device=device)
    times = {name: [] for name in names}
    with torch.no_grad():
        for model in models.values():
            model(x)  # warm-up: cuDNN's algorithm choice, allocator
        torch.cuda.synchronize(device)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    models[name](x)
                end.record()
                torch.cuda.synchronize(device)
                times[name].append(start.elapsed_time(end) / calls)
    median = {name: statistics.median(t) for name, t in times.items()}
    return {"batch": batch, "median_ms": median, "speedup": {n: median[names[0]] / median[n] for n in names}}


def time_network_both_ways(unfolded, folded, batch=1, budget_s=2.0, device="cuda"):
    """Folded over unfolded at one batch size, timed two ways: ``device`` (``fuselab.compare``: GPU time of one
    forward pass after an L2 flush) and ``stream`` (back-to-back forward passes: what a program that runs one
    after another gets, launch costs included where they exceed the GPU's work)."""
    models = {"unfolded": unfolded, "folded": folded}
    device_row = time_networks(models, batches=(batch,), budget_s=budget_s, device=device)[0]
    stream_row = time_network_stream(models, batch=batch, device=device)
    return {"batch": batch,
            "median_ms": {"device": device_row["median_ms"], "stream": stream_row["median_ms"]},
            "speedup": {"device": device_row["speedup"]["folded"], "stream": stream_row["speedup"]["folded"]}}
