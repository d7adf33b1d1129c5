"""``measure``: time one callable until its median is known well enough, or the time budget is spent."""

import contextlib
import time

import torch

from . import gpu, stats
from .modes import parse_mode
from .progress import Progress
from .results import Measurement
from .samplers import make_sampler

# A batch of timed calls is queued, then collected with one synchronization: long enough that the sync is
# cheap next to it, short enough that the stopping rule is checked often.
_BATCH_SECONDS = 0.02
_MAX_BATCH = 1000


def check_budget(target_rse, min_reps, max_reps, budget_s, warmup_s, unit="reps"):
    """Reject settings that cannot work, with the argument's name in the message."""
    if not (target_rse > 0):
        raise ValueError(f"target_rse must be positive (0.01 means 1%), got {target_rse!r}")
    if int(min_reps) < 2:
        raise ValueError(f"min_{unit} must be at least 2 to estimate a spread, got {min_reps!r}")
    if int(max_reps) < int(min_reps):
        raise ValueError(f"max_{unit} ({max_reps}) must be at least min_{unit} ({min_reps})")
    if not (budget_s > 0):
        raise ValueError(f"budget_s must be positive seconds, got {budget_s!r}")
    if warmup_s < 0:
        raise ValueError(f"warmup_s must not be negative, got {warmup_s!r}")


def warm_up(samplers, warmup_s, clock=time.perf_counter, min_calls=2, max_calls=1000):
    """Untimed calls of every sampler, round-robin, for ``warmup_s`` seconds and at least ``min_calls`` each:
    they load modules, compile, create handles, raise GPU clocks and fill the host-cost estimates.
    Returns the wall time of one call of each (seconds, after the first call)."""
    wall = {}
    for name, sampler in samplers.items():
        sampler.collect([sampler.enqueue()])  # the first call pays one-time costs: keep it out of the estimate
        wall[name] = []
    started = clock()
    calls = 0
    while calls < max_calls and (calls < min_calls or clock() - started < warmup_s):
        for name, sampler in samplers.items():
            t0 = clock()
            sampler.collect([sampler.enqueue()])
            wall[name].append(clock() - t0)
        calls += 1
    return {name: max(stats.median(w), 1e-7) for name, w in wall.items()}


def measure(fn, *, mode="device", label=None, flush=True, target_rse=0.01, min_reps=10, max_reps=100_000,
            budget_s=1.0, warmup_s=0.05, device=None, emulated=None, progress=None, clock=time.perf_counter,
            sampler=None) -> Measurement:
    """Time ``fn()`` and return a :class:`Measurement` of its median and spread.

    Repeats until the relative standard error of the median is at most ``target_rse`` (after ``min_reps``
    samples), or ``budget_s`` seconds or ``max_reps`` samples are spent; ``stop_reason`` says which.

    mode: ``"device"`` (GPU time, launch latency hidden), ``"latency"`` (launch included, from an idle GPU),
        or ``"graph"`` (CUDA-graph replay); see :class:`fuselab.timing.Mode`.
    flush: overwrite the L2 (twice its size) before every call, outside the timed region.
    warmup_s: untimed calls first, for at least this long.
    emulated: force (True) or forbid (False) host-clock timing; by default detected from ``fn``.
    progress: True / False / None (a bar on stdout only for long runs).
    clock: host clock for the budget and for the no-GPU fallback (tests pass a fake one).
    sampler: a ready-made timing source (advanced; overrides mode, flush, device and emulated).

    Without a GPU, or for emulated code, ``fn`` is timed with the host clock and the result says so
    (``on_gpu=False``): it is never a GPU number.
    """
    mode = parse_mode(mode)
    check_budget(target_rse, min_reps, max_reps, budget_s, warmup_s)
    min_reps, max_reps = int(min_reps), int(max_reps)
    if sampler is None:
        sampler = make_sampler(fn, mode, flush=flush, device=device, emulated=emulated, clock=clock)
    label = label or getattr(fn, "__name__", None) or type(fn).__name__

    started = clock()
    with on_device_of(sampler):
        times, stop_reason = _sample(sampler, label, started, target_rse, min_reps, max_reps, budget_s, warmup_s,
                                     progress, clock)
    return measurement_from(sampler, label, mode, times, target_rse, stop_reason)


def measurement_from(sampler, label, mode, times, target_rse, stop_reason, extra_notes=()) -> Measurement:
    """The :class:`Measurement` of ``times`` taken by ``sampler``."""
    return Measurement(
        label=label,
        mode=mode.value,
        times=tuple(times),
        device=gpu.device_name(sampler.device) if sampler.on_gpu else gpu.host_name(),
        clock=sampler.clock,
        on_gpu=sampler.on_gpu,
        flushed=sampler.flushed,
        target_rse=target_rse,
        stop_reason=stop_reason,
        notes=tuple(sampler.notes) + tuple(extra_notes),
    )


def on_device_of(sampler):
    """Make the sampler's GPU the current device, so events and launches land on the same stream."""
    return torch.cuda.device(sampler.device) if sampler.on_gpu else contextlib.nullcontext()


def _sample(sampler, label, started, target_rse, min_reps, max_reps, budget_s, warmup_s, progress, clock):
    per_call = warm_up({label: sampler}, min(warmup_s, budget_s / 4), clock=clock)[label]
    batch = int(min(_MAX_BATCH, max(1, _BATCH_SECONDS / per_call)))
    times = []
    stop_reason = ""
    with Progress(budget_s, f"timing {label}", enabled=progress, clock=clock) as bar:
        while True:
            # The first batch takes min_reps at once: the stopping rule needs them anyway.
            calls = min(max(batch, min_reps - len(times)), max_reps - len(times))
            times += sampler.collect([sampler.enqueue() for _ in range(calls)])
            rse = stats.relative_standard_error(times)
            elapsed = clock() - started
            bar.update(elapsed, n=len(times), rse=f"{rse:.2%}")
            if len(times) >= min_reps and rse <= target_rse:
                stop_reason = "converged"
            elif len(times) >= max_reps:
                stop_reason = "max_reps reached"
            elif elapsed >= budget_s:
                stop_reason = "time budget spent"
            if stop_reason:
                break

    return times, stop_reason
