"""Compare one output tensor with its (float64) expected value: the verdict, the numbers and a readable report."""

from dataclasses import asdict, dataclass

import torch

from .errors import CheckFailed
from .formatting import format_error, format_index, format_value, plural
from .hints import Evidence, hint_for
from .poison import poison_mask
from .tolerance import tolerance_for


@dataclass
class BadElement:
    """One element that failed: where it is, what the candidate wrote, what was expected."""

    index: tuple
    got: float
    expected: float
    kind: str  # "not written" | "NaN" | "inf" | "wrong"

    def describe(self, name: str) -> str:
        got = format_value(self.got)
        if self.kind == "not written":
            got = "nothing (still fuselab's poison NaN)" if isinstance(self.got, float) else "nothing (still fuselab's poison value)"
        return f"{format_index(name, self.index)}: got {got}, expected {format_value(self.expected)}"


@dataclass
class OutputComparison:
    """The verdict on one output. ``repr`` is the report a student reads."""

    name: str
    shape: tuple
    dtype: str
    passed: bool
    numel: int = 0
    n_bad: int = 0
    n_not_written: int = 0
    n_nan: int = 0
    n_inf: int = 0
    max_abs_error: float | None = None
    max_rel_error: float | None = None  # over elements whose expected value is not 0
    expected_scale: float = 0.0  # max |expected| over finite elements
    tolerance_used: float | None = None  # max over finite elements of |error| / allowed: 1 is the limit
    atol: float = 0.0  # the absolute tolerance in force (already scaled)
    rtol: float = 0.0
    tolerance: str = ""  # the rule in words
    first_bad: BadElement | None = None
    worst: BadElement | None = None  # the finite element with the largest error
    hint: str = ""
    problem: str = ""  # set when the values could not be compared at all (shape mismatch, ...)

    @property
    def fraction_bad(self) -> float:
        return self.n_bad / self.numel if self.numel else 0.0

    def summary(self, share: bool = True) -> str:
        """One line; ``share=False`` leaves out the share of elements bad (the counts say it)."""
        if self.problem:
            return f"{self.name}: {self.problem}"
        if self.passed:
            return f"{self.name}: max abs error {format_error(self.max_abs_error)}"
        where = f", first at {format_index(self.name, self.first_bad.index)}" if self.first_bad else ""
        percent = f" ({self.fraction_bad:.1%})" if share else ""
        return f"{self.name}: {self.n_bad} of {self.numel} bad{percent}{where}"

    def report(self, indent: str = "") -> str:
        """Several lines, for a student."""
        lines = [self._headline()]
        if not self.problem and not self.passed:
            if self.first_bad:
                lines.append(f"  first bad element   {self.first_bad.describe(self.name)}")
            if self.worst and self.worst.index != (self.first_bad.index if self.first_bad else None):
                lines.append(f"  largest error       {self.worst.describe(self.name)}")
            if self.worst is not None:
                lines.append(f"  max abs error {format_error(self.max_abs_error)}, max rel error {format_error(self.max_rel_error)}")
                lines.append(f"  allowed             {self.tolerance}")
            elif self.max_abs_error is not None:
                lines.append(f"  the other elements are within tolerance (max abs error {format_error(self.max_abs_error)})")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(indent + line for line in lines)

    def _headline(self) -> str:
        what = f"{self.name} ({self.dtype}, shape {tuple(self.shape)})"
        if self.problem:
            return f"{what}: {self.problem}"
        if self.passed:
            return f"{what}: all {self.numel} elements within tolerance (max abs error {format_error(self.max_abs_error)})"
        kinds = []
        if self.n_not_written:
            kinds.append(f"{self.n_not_written} never written")
        if self.n_nan:
            kinds.append(f"{self.n_nan} NaN")
        if self.n_inf:
            kinds.append(f"{self.n_inf} inf")
        wrong = self.n_bad - self.n_not_written - self.n_nan - self.n_inf
        if kinds and wrong:
            kinds.append(f"{wrong} wrong value{'s' if wrong != 1 else ''}")
        detail = f": {', '.join(kinds)}" if kinds else ""
        return f"{what}: {self.n_bad} of {plural(self.numel, 'element')} bad ({self.fraction_bad:.2%}){detail}"

    def to_dict(self) -> dict:
        result = asdict(self)
        result["fraction_bad"] = self.fraction_bad
        return result

    def __repr__(self) -> str:
        return self.report()


def compare(got: torch.Tensor, expected: torch.Tensor, atol: float | None = None, rtol: float | None = None, *,
            name: str = "out", inputs: dict | None = None, wrote_outside: int = 0,
            recompute=None) -> OutputComparison:
    """Judge ``got`` against ``expected`` (ideally a float64 reference) with ``got.dtype``'s tolerance.

    ``atol`` (absolute) and ``rtol`` override the defaults of ``fuselab.check.tolerance``. NaN or inf in ``got``
    pass only where ``expected`` has NaN, or the same infinity once rounded to ``got.dtype``. Elements that
    still hold fuselab's poison are reported as never written, not as wrong values. ``inputs`` (name -> tensor),
    the inputs that computed ``expected``, let a hint relate where the error is to an input's values;
    ``wrote_outside``, the elements the candidate wrote around ``got`` (its guard bands), what an unwritten one means;
    ``recompute({name: tensor})``, ``expected`` from some inputs changed, lets a hint test what a bug computed.
    """
    got = torch.as_tensor(got)
    expected = torch.as_tensor(expected).to(got.device)
    if tuple(got.shape) != tuple(expected.shape):
        return OutputComparison(
            name=name, shape=tuple(got.shape), dtype=str(got.dtype).replace("torch.", ""), passed=False, numel=got.numel(),
            problem=f"has shape {tuple(got.shape)}, expected shape {tuple(expected.shape)}",
        )
    with torch.no_grad():
        return _compare_values(got, expected, tolerance_for(got.dtype, atol, rtol), name, inputs or {},
                               wrote_outside, recompute)


def _compare_values(got, expected, tolerance, name, inputs, wrote_outside, recompute=None) -> OutputComparison:
    poisoned = poison_mask(got)
    exact = not (got.dtype.is_floating_point or got.dtype.is_complex)
    wide = torch.complex128 if got.is_complex() or expected.is_complex() else torch.float64
    g, e = got.to(wide), expected.to(wide)

    finite = torch.isfinite(g) & torch.isfinite(e)
    error = torch.where(finite, (g - e).abs(), torch.zeros((), dtype=torch.float64, device=g.device))
    finite_expected = e.abs()[torch.isfinite(e)]
    scale = float(finite_expected.max()) if finite_expected.numel() else 0.0
    atol = tolerance.absolute_for(scale)
    allowed = atol + tolerance.rtol * e.abs()

    if exact and not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        ok = got.to(torch.int64) == expected.to(torch.int64)  # int64 beyond 2**53 is not exact in float64
    else:
        ok = finite & (error <= allowed)
        ok |= torch.isnan(g) & torch.isnan(e) & ~poisoned
        if got.dtype.is_floating_point:
            # A reference that overflows got's dtype expects that dtype's infinity, e.g. 70000 in float16.
            ok |= torch.isinf(g) & (g == expected.to(got.dtype).to(wide))
    bad = ~ok
    not_written = poisoned & bad

    result = OutputComparison(
        name=name, shape=tuple(got.shape), dtype=str(got.dtype).replace("torch.", ""), passed=not bool(bad.any()),
        numel=got.numel(), n_bad=int(bad.sum()), n_not_written=int(not_written.sum()),
        n_nan=int((torch.isnan(g) & bad & ~poisoned).sum()), n_inf=int((torch.isinf(g) & bad).sum()),
        expected_scale=scale, atol=atol, rtol=tolerance.rtol,
        tolerance="exact match" if exact else tolerance.describe(scale),
    )
    if bool(finite.any()):
        result.max_abs_error = float(error[finite].max())
        err, limit = error[finite], allowed[finite]
        # an exact rule (allowed 0) is used up by any error at all
        used = torch.where(limit > 0, err / limit.clamp_min(1e-300), torch.where(err > 0, float("inf"), 0.0))
        result.tolerance_used = float(used.max())
        nonzero = finite & (e != 0)
        if bool(nonzero.any()):
            result.max_rel_error = float((error[nonzero] / e.abs()[nonzero]).max())
    if result.passed or got.numel() == 0:
        return result

    def element(flat_index: int) -> BadElement:
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), got.shape)) if got.dim() else ()
        gv, ev = g.reshape(-1)[flat_index].item(), e.reshape(-1)[flat_index].item()
        if exact:
            gv, ev = int(got.reshape(-1)[flat_index].item()), (ev if not float(ev).is_integer() else int(ev))
        kind = "not written" if bool(poisoned.reshape(-1)[flat_index]) else "NaN" if gv != gv else "inf" if abs(gv) == float("inf") else "wrong"
        return BadElement(index=index, got=gv, expected=ev, kind=kind)

    result.first_bad = element(int(bad.reshape(-1).to(torch.uint8).argmax()))
    finite_bad = bad & finite
    if bool(finite_bad.any()):
        result.worst = element(int(torch.where(finite_bad, error, -1.0).reshape(-1).argmax()))
    if not got.is_complex():
        result.hint = hint_for(Evidence(g, e, bad, not_written, allowed, name, got.dtype, inputs, wrote_outside,
                                        recompute))
    return result


def assert_close(got: torch.Tensor, expected: torch.Tensor, atol: float | None = None, rtol: float | None = None, *, name: str = "out") -> OutputComparison:
    """``compare`` that raises ``CheckFailed`` (an AssertionError) with the report when ``got`` is wrong."""
    comparison = compare(got, expected, atol, rtol, name=name)
    if not comparison.passed:
        raise CheckFailed(comparison.report(), comparison)
    return comparison
