"""Why a fused kernel's speedup is not its byte ratio: the line the labs print beside a plain kernel's speedup.

A memory-bound kernel's time is its bytes divided by the bandwidth it *reaches*. With ``f`` the fraction of a
yardstick rate (the copy bandwidth, or the rate of writing C once) that each version reaches on its own bytes,

    speedup = t_unfused / t_fused = byte ratio × f_fused / f_unfused,

an identity, not a model. A fused kernel gains exactly the byte ratio only when it moves its bytes as fast as the
unfused kernels move theirs; a plain one-output-per-thread kernel usually does not, and the line says by how much.
"""

from __future__ import annotations


def fractions(unfused_s: float, fused_s: float, unfused_bytes: float, fused_bytes: float, rate: float) -> tuple:
    """``(f_unfused, f_fused)``: each version's bytes per second as a fraction of ``rate`` (bytes per second)."""
    return unfused_bytes / unfused_s / rate, fused_bytes / fused_s / rate


def line(name: str, unfused_s: float, fused_s: float, unfused_bytes: float, fused_bytes: float, rate: float,
         yardstick: str = "the copy bandwidth") -> str:
    """One sentence: the speedup, the byte ratio, and the two fractions of ``yardstick`` that reconcile them."""
    f_unfused, f_fused = fractions(unfused_s, fused_s, unfused_bytes, fused_bytes, rate)
    ratio, speedup = unfused_bytes / fused_bytes, unfused_s / fused_s
    verdict = "short of" if speedup < ratio else "beyond"
    return (f"{name}: {speedup:.2f}x, {verdict} the byte ratio {ratio:.2f}x, because it moves its bytes at "
            f"{f_fused:.0%} of {yardstick} and the unfused kernels move theirs at {f_unfused:.0%} "
            f"({ratio:.2f}x × {f_fused:.0%} / {f_unfused:.0%} = {ratio * f_fused / f_unfused:.2f}x)")
