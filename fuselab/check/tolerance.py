"""How far a result may be from the float64 reference, per output dtype.

An element passes when

    |got - expected| <= atol + rtol * |expected|

where, unless you pass ``atol`` yourself, ``atol`` is *scale-aware*:

    atol = atol_scale * max|expected|      (never below the dtype's smallest normal number)

Why scale-aware: a conv or GEMM output element is a sum of K products. Its rounding error grows with the size
of the terms, not with the (possibly cancelled, near-zero) result, so a purely relative test fails correct
kernels on elements close to zero, and a fixed absolute test is meaningless when outputs are ~1000. Measured
with sequential fp32 accumulation (random normal inputs): error / max|expected| is 1e-7 at K=9, 5e-7 at K=576,
2.3e-6 at K=4096; leaving out a single term costs 1.7e-2 at K=4096; TF32 inputs cost ~2.5e-4. The defaults
below sit between those.

    dtype      rtol    atol_scale  why
    float64    1e-10   1e-10       float64 candidates are rare; anything close to exact passes
    float32    1e-5    2e-5        sequential fp32 sums pass up to K ~ 64K; TF32 or a missing term fails
    float16    1e-3    1e-3        ~1 ulp: a correctly rounded result (0.5 ulp) passes, as does fp32
                                   accumulation with one or two fp16 roundings; fp16 accumulation over a
                                   long sum (5e-3 at K=576) fails
    bfloat16   8e-3    8e-3        ~2 ulp: bf16 has 8 bits of mantissa; fp32 accumulation is ~2.7e-3
    integers   0       0           exact

Two roundings pass because the tolerance is set by the output's own scale: with random inputs an intermediate
(A·B before a bias is added, say) is about as large as the result, so rounding it to fp16 first costs at most
0.5 ulp at the result's scale. Where an intermediate is much larger than the result (a bias that nearly cancels
A·B) that first rounding is larger than the whole tolerance: a test that must tell one rounding from two needs
such a case (Lab 3's ``lab3.Cancelling``), not a tighter tolerance, which would fail correct fp32 accumulation.
"""

from dataclasses import dataclass

import torch

# dtype -> (rtol, atol_scale)
_DEFAULTS = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 2e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (8e-3, 8e-3),
}


@dataclass(frozen=True)
class Tolerance:
    """The rule one output is judged by. ``atol=None`` means "scale-aware": ``atol_scale * max|expected|``."""

    rtol: float
    atol_scale: float
    atol: float | None = None
    atol_floor: float = 0.0

    def absolute_for(self, expected_scale: float) -> float:
        """The absolute part of the tolerance for an output whose largest finite |expected| is ``expected_scale``."""
        if self.atol is not None:
            return float(self.atol)
        return max(self.atol_scale * float(expected_scale), self.atol_floor)

    def describe(self, expected_scale: float) -> str:
        atol = self.absolute_for(expected_scale)
        if self.rtol == 0 and atol == 0:
            return "exact match"
        rule = f"|got - expected| <= {atol:.2g} + {self.rtol:.2g}·|expected|"
        if self.atol is None and atol > self.atol_floor:
            rule += f"  (where {atol:.2g} = {self.atol_scale:.2g} × max|expected|, and max|expected| = {expected_scale:.4g})"
        return rule


def default_tolerance(dtype: torch.dtype) -> Tolerance:
    """The default rule for outputs of ``dtype`` (see the module docstring for the numbers and why)."""
    if dtype in _DEFAULTS:
        rtol, atol_scale = _DEFAULTS[dtype]
        # The floor keeps an all-zero expected output from demanding bit-exact zeros (flush-to-zero of subnormals).
        return Tolerance(rtol=rtol, atol_scale=atol_scale, atol_floor=float(torch.finfo(dtype).tiny))
    if dtype.is_floating_point or dtype.is_complex:
        # Other float types (e.g. float8): be as lenient as bfloat16 per ulp would suggest.
        eps = float(torch.finfo(dtype).eps) if dtype.is_floating_point else 1e-5
        return Tolerance(rtol=2 * eps, atol_scale=2 * eps)
    return Tolerance(rtol=0.0, atol_scale=0.0)


def tolerance_for(dtype: torch.dtype, atol: float | None = None, rtol: float | None = None) -> Tolerance:
    """The dtype's default rule with the caller's ``atol`` (a fixed absolute number) and/or ``rtol`` put in."""
    base = default_tolerance(dtype)
    return Tolerance(
        rtol=base.rtol if rtol is None else float(rtol),
        atol_scale=base.atol_scale,
        atol=None if atol is None else float(atol),
        atol_floor=base.atol_floor,
    )
