"""How a measured speedup turns into points (docs/design.md §3). Pure functions: the grader builds on them."""

import math

# Below this speedup of the plain solution, a lab shows the speedup but does not grade it.
MIN_GRADABLE_SPEEDUP = 1.3
# Full points from 1 + 0.6 (S - 1), S being the plain solution's speedup.
THRESHOLD_FRACTION = 0.6


def full_points_threshold(plain_speedup: float) -> float:
    """The speedup that earns full points, from the plain solution's measured speedup ``S``: 1 + 0.6 (S - 1).

    Raises ValueError where ``S`` < 1.3: such a speedup is too small to grade robustly.
    """
    if not plain_speedup >= MIN_GRADABLE_SPEEDUP:
        raise ValueError(
            f"a plain solution's speedup of {plain_speedup:.3g}x is below {MIN_GRADABLE_SPEEDUP}x: "
            "show it, don't grade it"
        )
    return 1.0 + THRESHOLD_FRACTION * (plain_speedup - 1.0)


def speedup_points(speedup, threshold: float, max_points: float) -> float:
    """Points for a measured speedup: 0 at 1.0x or less, ``max_points`` at ``threshold`` or more, linear between.

    ``speedup`` None (not measured, e.g. no GPU) or NaN scores 0.0: never full marks without a measurement.
    """
    if not threshold > 1.0:
        raise ValueError(f"threshold must be above 1.0x, got {threshold!r}")
    if not max_points >= 0:
        raise ValueError(f"max_points must not be negative, got {max_points!r}")
    if speedup is None or math.isnan(speedup):
        return 0.0
    if speedup <= 1.0:
        return 0.0
    if speedup >= threshold:
        return float(max_points)
    return float(max_points) * (speedup - 1.0) / (threshold - 1.0)
