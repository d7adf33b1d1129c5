"""``fuselab calibrate``: measure the plain solutions on this GPU and write its entry in the policy file.

The instructor's solution notebook of each lab runs through the clean recheck (as a submission would), a few
times; each graded speedup test logs the plain solution's speedup S over the lab's fixed unfused reference.
The median S gives this GPU's threshold, 1 + 0.6 (S - 1) (docs/design.md §3). A test whose S is below 1.3 on this GPU
is recorded as not gradable on this GPU (grading then falls back to the H200's entry, and says so).

``--set-threshold TEST=SPEEDUP`` sets a threshold by hand instead (``set_thresholds``): a term's own choice, no GPU needed.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import tempfile
from pathlib import Path

from ... import course
from ...speed import policy_entries
from ...speed.policy import POLICY_PATH, load_policy
from ...timing.policy import MIN_GRADABLE_SPEEDUP
from ..records import nbgrader_run
from ..recheck import clean as recheck


def measure(labs=None, repeats=3, cell_timeout=600.0) -> dict:
    """``{test_id: {"speedups": [...], "gpu": name}}`` from ``repeats`` clean runs of each lab's solution."""
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("calibrate needs a GPU: speedups cannot be measured under the CPU emulation")
    found: dict = {}
    with tempfile.TemporaryDirectory(prefix="fuselab-calibrate-") as tmp:
        env = dict(os.environ, FUSELAB_CACHE_DIR=os.environ.get("FUSELAB_CACHE_DIR", str(Path(tmp) / "cache")))
        env.pop("FUSELAB_SHARED_BUILDS", None)
        for lab in labs or course.lab_names():
            nb = json.loads((course.SOLUTIONS / lab / nbgrader_run.notebook_name(lab)).read_text())
            for k in range(repeats):
                result = recheck.run_clean(nb, nb, Path(tmp) / f"{lab}-{k}", cell_timeout=cell_timeout,
                                           total_timeout=cell_timeout * 4, env=env,
                                           kernels_in_worker=False)  # the instructor's own kernels
                for cell in result.cells.values():
                    for record in cell.speed:
                        if record.get("speedup") is not None:
                            entry = found.setdefault(record["test"], {"speedups": [], "gpu": record["gpu"],
                                                                      "lab": lab})
                            entry["speedups"].append(record["speedup"])
    return found


def calibrate(labs=None, repeats=3, policy_path=None, write=True) -> list:
    """Measure and (``write``) store this GPU's entries; returns one line per test for the teacher."""
    path = Path(policy_path or os.environ.get("FUSELAB_POLICY") or POLICY_PATH)
    policy = load_policy(path)
    lines = []
    for test_id, found in sorted(measure(labs, repeats).items()):
        s = statistics.median(found["speedups"])
        if test_id not in policy["tests"]:
            lines.append(f"{test_id}: not in the policy file; add its mode, shape and dtype first")
            continue
        entry = policy_entries.entry_for(s, note=f"fuselab calibrate: median of {len(found['speedups'])} clean runs "
                                              f"of the solution ({', '.join(f'{x:.3f}' for x in found['speedups'])})")
        policy["tests"][test_id].setdefault("gpus", {})[found["gpu"]] = entry
        if "threshold" in entry:
            lines.append(f"{test_id}: plain solution {s:.2f}x on {found['gpu']} → full points from "
                         f"{entry['threshold']:.2f}x")
        else:  # recorded as not gradable: grading falls back to the H200's entry and says so
            lines.append(f"{test_id}: plain solution {s:.2f}x on {found['gpu']} is below the "
                         f"{MIN_GRADABLE_SPEEDUP}x floor: not gradable on this GPU")
    if write:
        path.write_text(json.dumps(policy, indent=2) + "\n")
        lines.append(f"written to {path}")
    return lines


def set_thresholds(assignments, gpu: str | None = None, policy_path=None, write=True) -> list:
    """``fuselab calibrate --set-threshold TEST=SPEEDUP``: a term's own full-points threshold, without a GPU.

    Each ``TEST=SPEEDUP`` replaces ``threshold`` in that test's entry for ``gpu`` (default: the H200's, which
    every GPU without an entry of its own is graded with) and says where it came from; the measured
    ``plain_speedup`` stays beside it, so ``fuselab calibrate`` on a GPU (which writes the measured rule again)
    undoes it. Grading reads the threshold from this file, so the next ``fuselab grade --force`` uses it."""
    from ...speed.policy import REFERENCE_GPU
    gpu = gpu or REFERENCE_GPU
    path = Path(policy_path or os.environ.get("FUSELAB_POLICY") or POLICY_PATH)
    policy = load_policy(path)
    lines = []
    for assignment in assignments:
        test_id, _, value = str(assignment).partition("=")
        if test_id not in policy["tests"]:
            raise ValueError(f"no graded speedup test {test_id!r}: the tests are {', '.join(sorted(policy['tests']))}")
        try:
            threshold = float(value)
        except ValueError:
            raise ValueError(f"{assignment!r}: give TEST=SPEEDUP, e.g. {test_id}=1.5") from None
        if not threshold > 1.0:
            raise ValueError(f"{assignment!r}: a full-points threshold must be a speedup above 1.0")
        entry = policy["tests"][test_id].setdefault("gpus", {}).setdefault(gpu, {})
        before = entry.get("threshold")
        entry.pop("gradable", None)  # a threshold set by hand is gradable by decision
        entry["threshold"] = round(threshold, 3)
        entry["threshold_source"] = (f"set by hand ({datetime.date.today().isoformat()}; was "
                                     f"{before if before is not None else 'none'})")
        lines.append(f"{test_id}: full points from {threshold:.3g}x on {gpu} (was {before or 'none'})")
    if write:
        path.write_text(json.dumps(policy, indent=2) + "\n")
        lines.append(f"written to {path}")
    return lines
