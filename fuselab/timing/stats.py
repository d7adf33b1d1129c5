"""Robust summaries of timing samples: median, IQR, the standard error of the median, speedup intervals.

Timing samples have long right tails (a context switch, a clock change), so everything here is built on
quantiles rather than the mean and standard deviation.
"""

import math

import numpy as np

# For normal data, sigma = IQR / 1.349 and the standard error of the median is sqrt(pi/2) * sigma / sqrt(n).
IQR_TO_SIGMA = 1.349
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)  # 1.2533


def median(samples) -> float:
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        return math.nan
    return float(np.median(values))


def quartiles(samples) -> tuple:
    """(q1, q3) with linear interpolation; NaNs for no samples."""
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        return (math.nan, math.nan)
    q1, q3 = np.percentile(values, [25, 75])
    return float(q1), float(q3)


def iqr(samples) -> float:
    q1, q3 = quartiles(samples)
    return q3 - q1


def robust_sigma(samples) -> float:
    """Spread estimated from the IQR, falling back to the standard deviation when the IQR is 0
    (coarse clocks can make most samples identical)."""
    values = np.asarray(samples, dtype=float)
    if values.size < 2:
        return math.inf
    sigma = iqr(values) / IQR_TO_SIGMA
    if sigma == 0.0:
        sigma = float(np.std(values, ddof=1))
    return sigma


def median_standard_error(samples) -> float:
    values = np.asarray(samples, dtype=float)
    if values.size < 2:
        return math.inf
    return MEDIAN_SE_FACTOR * robust_sigma(values) / math.sqrt(values.size)


def relative_standard_error(samples) -> float:
    """Standard error of the median divided by the median (0.01 means 1%); ``inf`` below two samples."""
    m = median(samples)
    if not m or math.isnan(m):
        return math.inf
    return median_standard_error(samples) / abs(m)


def bootstrap_speedup(baseline_rounds, candidate_rounds, confidence=0.95, resamples=2000, seed=0):
    """Speedup median(baseline) / median(candidate) with a paired bootstrap confidence interval.

    Both arguments are arrays of shape (rounds, samples_per_round), taken in the same interleaved rounds.
    Resampling whole rounds, the same rounds for both, keeps the pairing: drift that slowed both in one round
    cancels in the ratio. Returns (speedup, low, high); the interval is NaN with fewer than two rounds.
    """
    base = np.atleast_2d(np.asarray(baseline_rounds, dtype=float))
    cand = np.atleast_2d(np.asarray(candidate_rounds, dtype=float))
    if base.shape[0] != cand.shape[0]:
        raise ValueError("baseline and candidate need the same number of rounds to be paired")
    speedup = median(base) / median(cand)
    rounds = base.shape[0]
    if rounds < 2:
        return speedup, math.nan, math.nan
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    # Chunks bound the memory of (chunk, rounds, samples_per_round) index arrays.
    per_resample = rounds * max(base.shape[1], cand.shape[1])
    chunk = max(1, min(resamples, 4_000_000 // per_resample))
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        picks = rng.integers(0, rounds, size=(stop - start, rounds))
        base_medians = np.median(base[picks].reshape(stop - start, -1), axis=1)
        cand_medians = np.median(cand[picks].reshape(stop - start, -1), axis=1)
        ratios[start:stop] = base_medians / cand_medians
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(ratios, [tail, 100.0 - tail])
    return speedup, float(low), float(high)
