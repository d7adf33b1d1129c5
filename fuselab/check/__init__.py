"""fuselab.check: is a candidate kernel right, and if not, where?

    result = fuselab.check(candidate, reference, make_inputs, shapes, seeds=(0, 1, 2))

runs ``candidate`` on every shape × seed and judges every output against ``reference`` computed in float64,
with dtype-aware tolerances (``tolerance.py``). Outputs are poisoned and wrapped in guard bands
(``poison.py``), so "never written" and "wrote past the end" are reported as such, not as wrong values. Inputs
must come back bitwise unchanged. A failure raises ``CheckFailed`` (an ``AssertionError``) whose message names the
case, the first bad element as ``out[n, c, h, w]`` with got/expected values, the errors, the fraction of bad
elements and, where the pattern is recognizable, a hint (``hints.py``). As it finishes, a check prints one line to
stdout (✓/✗, name, cases passed, worst error), so every check of a test cell shows; nothing ever goes to stderr
(nbgrader scores a test cell that writes there 0). A ``CheckResult`` left as a cell's last value shows as that
line, never as a value nbgrader would try to read as the cell's score.

For a single pair of tensors: ``compare(got, expected)`` returns an ``OutputComparison``; ``assert_close`` raises.

NaN/inf policy: NaN in an output passes only where the float64 reference is NaN too (and never when it is
fuselab's poison); ±inf passes only where the reference, rounded to the output dtype, is the same infinity
(e.g. 70000 in float16).
"""

from .cases import check
from .outputs import BadElement, OutputComparison, assert_close, compare
from .errors import CheckFailed
from .report import CaseResult, CheckResult
from .tolerance import Tolerance, default_tolerance

__all__ = [
    "check",
    "compare",
    "assert_close",
    "CheckFailed",
    "CheckResult",
    "CaseResult",
    "OutputComparison",
    "BadElement",
    "Tolerance",
    "default_tolerance",
]
