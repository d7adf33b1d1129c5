"""The GPU self-check's stages, declared: one ``Stage`` each, in ``STAGES``, in the order a full run takes them.

A stage is a name (what ``--stages`` and ``selfcheck.json`` call it), what it needs of the machine, one line on
what it checks, the function that runs it (``run(out) -> dict``, a JSON-able result) and how its rows of the
closing table read. The labs' stages are not written here: one per lab of the registry
(``fuselab/labs/registry.py``), run by its module in ``lab_checks/``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import partial
from typing import Callable

from . import counters, grading_runs, machine, notebooks

# what a stage needs of the machine, as ``--list`` shows it (a stage missing one fails or skips, saying why)
GPU = "a GPU"
TWO_GPUS = "2 GPUs"
NBGRADER = "nbgrader"
NBCLIENT = "nbclient"


def status_and_headline(name: str, result: dict) -> list:
    """The row of a stage whose result says its ``status`` (default "ok") and its ``headline``."""
    return [(name, result.get("status", "ok"), result.get("headline", "")[:90])]


@dataclass(frozen=True)
class Stage:
    """One stage of the GPU self-check.

    name: its name on the command line (``--stages``) and its key in ``selfcheck.json``.
    run: ``run(out) -> dict``, given the results folder; what it returns is the stage's result.
    checks: one line: what it checks.
    needs: what it needs of the machine (``GPU``, ``TWO_GPUS``, ``NBGRADER``, ``NBCLIENT``).
    default: whether a run without ``--stages`` takes it.
    rows: ``rows(name, result)``: its rows of the closing table, ``(label, status, text)``.
    before: ``before(results so far, out)``, called just before it runs.
    """

    name: str
    run: Callable[..., dict]
    checks: str
    needs: tuple = ()
    default: bool = True
    rows: Callable[[str, dict], list] = status_and_headline
    before: Callable | None = None

    def table_rows(self, result: dict) -> list:
        if "error" in result:
            return [(self.name, "ERROR", result["error"].strip().splitlines()[-1][:90])]
        return self.rows(self.name, result)


def lab_check(name: str):
    """The lab's stage module, ``lab_checks/<name>.py`` (``run(out) -> dict``)."""
    return importlib.import_module(f"{__package__}.lab_checks.{name}")


def _run_lab(name: str, out):
    return lab_check(name).run(out)


def lab_stages() -> list:
    """One stage per registered lab, named after it, run by ``lab_checks/<lab>.py`` (``run(out)``)."""
    from ...labs.registry import all_labs
    return [Stage(name, partial(_run_lab, name), needs=(GPU,),
                  checks=f"{declared.title}: the solution's kernels built, checked on the GPU shapes and timed "
                         "against the lab's unfused reference, PyTorch eager, torch.compile and the measured "
                         "ceilings; the graded speedup test")
            for name, declared in all_labs().items()]


def _stages() -> list:
    return [
        Stage("env", machine.stage_env, rows=machine.env_rows,
              checks="versions: GPU, torch, CUDA, nvcc, triton, the commit; fuselab doctor's findings"),
        Stage("build", machine.stage_build, needs=(GPU,), rows=machine.build_rows,
              checks="build times: first build, rebuild after an edit, reload in a fresh process"),
        Stage("timing", machine.stage_timing, needs=(GPU,), rows=machine.timing_rows,
              checks="timing accuracy: the spread of repeated medians, agreement with triton's do_bench"),
        Stage("emulation", machine.stage_emulation, needs=(GPU,),
              checks="the emulated and the real builds of the test kernels agree"),
        Stage("transfer", machine.stage_transfer, needs=(GPU,),
              checks="a launch's buffers between the grader's checker and kernel worker: pinned against pageable"),
        *lab_stages(),
        Stage("counters", counters.stage_counters, needs=(GPU,),
              checks="Lab 0's unfused chain and fused kernel through the hardware counters (Nsight Compute): DRAM "
                     "bytes, L2 and L1 hit rates, inside and beyond L2"),
        Stage("grade", notebooks.stage_grade, needs=(GPU, NBGRADER), rows=notebooks.grade_rows,
              before=notebooks.calibrate_for_grading,
              checks="nbgrader autograde with the thresholds the lab stages measured: solutions full marks, blank "
                     "labs zero; the autograded notebooks' errors and stderr"),
        Stage("notebooks", notebooks.stage_notebooks, needs=(GPU, NBCLIENT),
              checks="every solution notebook top to bottom with its demo cells, as an instructor runs it"),
        Stage("samples", grading_runs.stage_samples, needs=(GPU, NBGRADER),
              checks="the grader's sample class: every sample gets the grade it deserves"),
        Stage("throughput", grading_runs.stage_throughput, needs=(GPU, NBGRADER),
              checks="grading time and CPU per phase on copies of the correct samples (120 by default), then "
                     "one student's regrade reusing the reference runs"),
        Stage("multigpu", grading_runs.stage_multigpu, needs=(TWO_GPUS, NBGRADER),
              checks="one class graded on one GPU and on all: same grades, no two timings on one GPU at once"),
        Stage("tests", machine.stage_tests, needs=(GPU,), rows=machine.tests_rows,
              checks="the pytest suite's GPU tests (the notebook tests too where nbclient is installed)"),
    ]


STAGES = _stages()


def by_name() -> dict:
    """``{name: Stage}`` over ``STAGES``, in order."""
    return {stage.name: stage for stage in STAGES}


def default_names() -> list:
    return [stage.name for stage in STAGES if stage.default]
