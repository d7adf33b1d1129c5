"""A lab's reference run's kernels, compiled side by side before its cells build them one after another.

    python -m fuselab.grading.run.build_ahead LAB

The grader starts it beside a lab's reference run on a GPU (``start``), with the environment the run's checker
gets (``recheck.runner_env``: its build cache, the shared builds, its GPU, and no compiler setting of the TA's
that the checker would not see), without importing anything from its working folder, in a session of its own.
It compiles the instructor notebook's builds and the lab's fixed kernels (``labs.build_plan``) side by side, at
most its CPU share at once (``kernelbuild.compile_ahead``), and builds the course's tuned solution, which the run's
speed test times for the feedback pages (``speed.tuned``). The run's own builds find them done, or wait
for them under each build's lock. Nothing here is a verdict: what fails is built again by the run, which says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ... import config, course
from ...kernelbuild import compile_ahead, job_ahead
from ...labs import build_plan, registry
from ...speed import tuned
from ..recheck.clean import python_module, runner_env
from ..records import nbgrader_run


def start(lab: str, env: dict, workdir: Path, device) -> subprocess.Popen | None:
    """This module as a process for ``lab``, with the environment the run's checker in ``workdir`` gets from
    ``env``, in that folder's parent (the grader's), its output discarded; None where it cannot start."""
    try:
        workdir.parent.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(python_module(__name__, lab), env=runner_env(env, workdir, device),
                                cwd=workdir.parent,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError:
        return None


def stop(process: subprocess.Popen | None) -> None:
    """The run is over: whatever this process and its compilers still do, the run has built itself meanwhile."""
    if process is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # its session: the compilers too
        process.wait()


def main(lab: str) -> int:
    notebook = json.loads((course.SOLUTIONS / lab / nbgrader_run.notebook_name(lab)).read_text())
    builds = build_plan.notebook_builds(notebook) + build_plan.reference_builds(lab)
    # the jobs made on this thread (they parse the launchers, and ast.parse is not safe in two threads at once);
    # only their compilers, processes of their own, run from the pool
    jobs = [job_ahead(b["source"], b["launchers"], name=b["name"]) for b in builds]
    with ThreadPoolExecutor(max_workers=config.cpu_threads()) as pool:
        compiling = [pool.submit(compile_ahead, job) for job in jobs if job is not None]
        built = [tuned.build(test.id) for test in registry.lab(lab).graded_tests]  # here, meanwhile
        done = [future.result() for future in compiling] + built
    return 0 if all(done) and None not in jobs else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
