"""The policy file (``fuselab/speed/policy.json``): each graded speedup test's fixed settings and, per GPU model, the
threshold for full points that ``fuselab calibrate`` measured (docs/design.md §3)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..timing.policy import MIN_GRADABLE_SPEEDUP

POLICY_PATH = Path(__file__).with_name("policy.json")
REFERENCE_GPU = "NVIDIA H200"


def load_policy(path=None) -> dict:
    return json.loads(Path(path or os.environ.get("FUSELAB_POLICY") or POLICY_PATH).read_text())


def policy_entry(test_id, gpu_name=None, policy=None):
    """``(test settings, GPU entry, note)`` for ``test_id`` on ``gpu_name``.

    A GPU with no entry, or whose plain solution was too close to the reference to grade (S < 1.3), is graded
    with the H200's entry, and the note says so.
    """
    policy = policy or load_policy()
    if test_id not in policy["tests"]:
        raise KeyError(f"no graded speedup test {test_id!r} in the policy file")
    test = policy["tests"][test_id]
    gpus = test.get("gpus", {})
    note = ""
    entry = gpus.get(gpu_name)
    if entry is None or entry.get("gradable") is False:
        why = "no policy entry" if entry is None else \
            f"too small a plain speedup to grade (S < {MIN_GRADABLE_SPEEDUP})"
        note = (f"{why} for {gpu_name or 'this machine'}: using the {REFERENCE_GPU}'s threshold "
                f"(`fuselab calibrate` on this GPU makes one)")
        entry = gpus.get(REFERENCE_GPU)
        if entry is None or entry.get("gradable") is False:
            raise KeyError(f"{test_id} has no gradable threshold on the {REFERENCE_GPU}: it must not be graded")
    return test, entry, note
