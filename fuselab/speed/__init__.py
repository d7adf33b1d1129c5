"""Speed grading, in one place: the policy file and its lookup (``policy``), the graded speedup test that nbgrader
test cells call (``graded``), turning a GPU's measured plain speedups into policy entries (``policy_entries``), and the
timing's side of the grader's GPU lease (``lease``).

A notebook's speed cell calls ``fuselab.speed.speedup_test(test_id, ...)``. The student runtime below this floor
(build, check, timing) knows nothing of grading; ``fuselab.grading`` builds on this package.
"""

from .graded import launched_kernels, own_kernel_names, speedup_test
from .policy import REFERENCE_GPU, load_policy, policy_entry

__all__ = ["speedup_test", "policy_entry", "load_policy", "REFERENCE_GPU", "own_kernel_names", "launched_kernels"]
