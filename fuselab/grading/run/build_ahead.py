"""A lab's reference run's kernels, compiled side by side before its cells build them one after another.

    python -m fuselab.grading.run.build_ahead LAB

The grader starts it beside a lab's reference run on a GPU (``start``), with the run's environment: its build
cache (the shared builds) and its GPU. It compiles the instructor notebook's builds and the lab's fixed kernels
(``labs.build_plan``) in parallel (``kernelbuild.compile_ahead``), and builds the course's tuned solution, which
the run's speed test times for the feedback pages (``speed.tuned``). The run's own builds find them done, or wait
for them under each build's lock. Nothing here is a verdict: what fails is built again by the run, which says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from ... import course
from ...kernelbuild import compile_ahead
from ...labs import build_plan, registry
from ...speed import tuned
from ..records import nbgrader_run


def start(lab: str, env: dict) -> subprocess.Popen | None:
    """This module as a process for ``lab``, with ``env``, its output discarded; None where it cannot start."""
    try:
        return subprocess.Popen([sys.executable, "-m", __name__, lab], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None


def stop(process: subprocess.Popen | None) -> None:
    """The run is over: whatever this process still compiles, the run has built itself meanwhile."""
    if process is not None:
        if process.poll() is None:
            process.kill()
        process.wait()


def main(lab: str) -> int:
    notebook = json.loads((course.SOLUTIONS / lab / nbgrader_run.notebook_name(lab)).read_text())
    builds = build_plan.notebook_builds(notebook) + build_plan.reference_builds(lab)
    tests = [test.id for test in registry.lab(lab).graded_tests]
    with ThreadPoolExecutor(max_workers=max(1, len(builds) + len(tests))) as pool:
        done = list(pool.map(lambda b: compile_ahead(b["source"], b["launchers"], name=b["name"]), builds))
        done += list(pool.map(tuned.build, tests))
    return 0 if all(done) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
