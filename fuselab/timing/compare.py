"""``compare``: time several callables interleaved and report speedups over a baseline with confidence intervals.

Timing A fully and then B lets any drift (clocks, temperature, a neighbour's job) land on one of them. Here every
round times each candidate once (a short block of calls), in an order rotated each round, so drift and order
effects hit all candidates alike and cancel in the ratios; the interval comes from resampling whole rounds.
"""

import math
import time

import numpy as np

from . import gpu, stats
from .measure import check_budget, measurement_from, on_device_of, warm_up
from .modes import parse_mode
from .progress import Progress
from .results import Comparison, Speedup
from .samplers import make_sampler

_BLOCK_SECONDS = 0.002  # one candidate's share of a round
_MAX_BLOCK = 100


def rotated(names, round_index):
    """The order of round ``round_index``: ``names`` rotated left by that many places."""
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def compare(candidates, baseline=None, *, mode="device", flush=True, target_rse=0.01, min_rounds=10,
            max_rounds=2000, budget_s=None, warmup_s=0.05, block=None, confidence=0.95, device=None,
            emulated=None, progress=None, clock=time.perf_counter, samplers=None, seed=0) -> Comparison:
    """Time ``candidates`` (name -> callable) interleaved and return a :class:`Comparison`.

    baseline: the name speedups are relative to (default: the first candidate). A speedup is
        median(baseline) / median(candidate), so 2.0 means twice as fast, with a ``confidence`` bootstrap
        interval over paired rounds.
    Rounds continue until every candidate's median has relative standard error at most ``target_rse``
    (after ``min_rounds``), or ``max_rounds`` or ``budget_s`` (default: 1 s per candidate) run out.
    block: calls of each candidate per round (default: about 2 ms worth).
    mode, flush, warmup_s, device, emulated, progress, clock: as in :func:`measure`.
    samplers: ready-made timing sources by name (advanced; overrides mode, flush, device, emulated).

    If any candidate runs under CPU emulation, or there is no GPU, all are timed on the host clock and the
    result's ``verdict_allowed`` is False.
    """
    mode = parse_mode(mode)
    names = list(candidates)
    if len(names) < 2:
        raise ValueError("compare needs at least two candidates (a baseline and one to compare with it)")
    baseline = names[0] if baseline is None else baseline
    if baseline not in candidates:
        raise ValueError(f"baseline {baseline!r} is not one of the candidates: {', '.join(map(repr, names))}")
    budget_s = float(len(names)) if budget_s is None else budget_s
    check_budget(target_rse, min_rounds, max_rounds, budget_s, warmup_s, unit="rounds")
    if not (0 < confidence < 1):
        raise ValueError(f"confidence must lie between 0 and 1, got {confidence!r}")

    notes = []
    if samplers is None:
        if emulated is None and any(gpu.is_emulated(fn) for fn in candidates.values()):
            emulated = True
            notes.append("a candidate runs under CPU emulation: all were timed on the host clock")
        samplers = {name: make_sampler(candidates[name], mode, flush=flush, device=device, emulated=emulated,
                                       clock=clock) for name in names}
    missing = set(names) - set(samplers)
    if missing:
        raise ValueError(f"no sampler for {', '.join(sorted(missing))}")

    with on_device_of(samplers[names[0]]):
        rounds, stop_reason, blocks = _interleave(samplers, names, block, target_rse, min_rounds, max_rounds,
                                                  budget_s, warmup_s, progress, clock)
    round_index = len(rounds[names[0]])

    measurements = {}
    for name in names:
        interleaving = (f"interleaved with {len(names) - 1} other(s), {blocks[name]} call(s) per round, "
                        f"{round_index} rounds",)
        measurements[name] = measurement_from(samplers[name], name, mode, np.ravel(rounds[name]), target_rse,
                                              stop_reason, interleaving)
    base = np.asarray(rounds[baseline])
    speedups = {}
    for name in names:
        if name == baseline:
            speedups[name] = Speedup(name, 1.0, 1.0, 1.0, confidence)
            continue
        value, low, high = stats.bootstrap_speedup(base, np.asarray(rounds[name]), confidence=confidence, seed=seed)
        speedups[name] = Speedup(name, value, low, high, confidence)
    if stop_reason != "converged":
        notes.append(f"stopped before the target rse {target_rse:.2%}: {stop_reason}")
    return Comparison(measurements=measurements, baseline=baseline, speedups=speedups, mode=mode.value,
                      rounds=round_index, confidence=confidence, notes=tuple(notes))


def _interleave(samplers, names, block, target_rse, min_rounds, max_rounds, budget_s, warmup_s, progress, clock):
    """Rounds of timed calls in rotating order; returns ({name: [[seconds per call] per round]}, why it stopped,
    {name: calls per round})."""
    started = clock()
    wall = warm_up(samplers, min(warmup_s, budget_s / 4), clock=clock)
    blocks = {name: int(block) if block else int(min(_MAX_BLOCK, max(1, math.ceil(_BLOCK_SECONDS / wall[name]))))
              for name in names}
    if min(blocks.values()) < 1:
        raise ValueError(f"block must be at least 1, got {block!r}")
    rounds = {name: [] for name in names}
    stop_reason = ""
    with Progress(budget_s, f"comparing {len(names)}", enabled=progress, clock=clock) as bar:
        round_index = 0
        while True:
            order = rotated(names, round_index)
            pending = {n: [samplers[n].enqueue() for _ in range(blocks[n])] for n in order}
            for n in order:
                rounds[n].append(samplers[n].collect(pending[n]))
            round_index += 1
            worst = max(stats.relative_standard_error(np.ravel(rounds[n])) for n in names)
            elapsed = clock() - started
            bar.update(elapsed, rounds=round_index, worst_rse=f"{worst:.2%}")
            if round_index >= min_rounds and worst <= target_rse:
                stop_reason = "converged"
            elif round_index >= max_rounds:
                stop_reason = "max_rounds reached"
            elif elapsed >= budget_s:
                stop_reason = "time budget spent"
            if stop_reason:
                break
    return rounds, stop_reason, blocks
