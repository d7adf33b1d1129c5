"""Turn measured plain-solution speedups into policy entries (docs/design.md §3): what ``fuselab calibrate``
(``fuselab/grading/run/calibrate.py``) and the GPU self-check write into the policy file.

A lab's GPU self-check stage reports, for each graded speedup test, the fixed settings (mode, shape, dtype) and the
plain fused solution's speedup S over the lab's unfused reference on this GPU, under ``result["graded"]``. This
module writes the entry for this GPU model: full points from ``1 + 0.6 (S − 1)``; a test whose S is below 1.3 is
recorded as not gradable. A test new to the policy file takes its ``speed_requires`` from the lab's ``GradedTest``.
"""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path

from ..timing.policy import MIN_GRADABLE_SPEEDUP, full_points_threshold


def entry_for(speedup: float, commit: str = "", note: str = "") -> dict:
    entry = {"plain_speedup": round(speedup, 3), "measured": datetime.date.today().isoformat()}
    if commit:
        entry["commit"] = commit
    if note:
        entry["source"] = note
    if speedup >= MIN_GRADABLE_SPEEDUP:
        entry["threshold"] = round(full_points_threshold(speedup), 3)
    else:
        entry["gradable"] = False
    return entry


def calibrated(policy: dict, gpu_name: str, graded: dict, commit: str = "") -> dict:
    """A copy of ``policy`` with this GPU's entries set from ``graded`` ({test id: {mode, shape, dtype, plain_speedup}})."""
    from ..labs.registry import graded_tests
    declared = graded_tests()
    policy = copy.deepcopy(policy)
    for test_id, measured in graded.items():
        test = policy["tests"].setdefault(test_id, {"gpus": {}})
        for key in ("mode", "shape", "dtype"):
            test[key] = measured[key]
        if test_id in declared:  # a new test's entry gets the rest of its settings from its GradedTest
            test.setdefault("speed_requires", list(declared[test_id].speed_requires))
        test.setdefault("gpus", {})[gpu_name] = entry_for(
            measured["plain_speedup"], commit,
            note="GPU self-check: plain fused solution vs the lab's unfused reference, L2 flushed")
    return policy


def write(policy: dict, path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(policy, indent=2) + "\n")
    return path
