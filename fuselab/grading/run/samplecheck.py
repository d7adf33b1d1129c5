"""The sample class: grade ``grader/examples`` and compare every test's verdict with what the sample deserves.

    from fuselab.grading.run.samplecheck import grade_examples
    summary = grade_examples(out)          # {"status": "ok" | "MISS", "rows": [...], "table": "...", ...}

The students of the sample class are named after the samples (declared in ``fuselab/labs/labN/samples.py``,
written by ``fuselab/course/sample_class.py``), so each result can be checked against its ``Sample.expect``
(``expect_gpu`` on a GPU).
"""

from __future__ import annotations

import time
from pathlib import Path

from ...course import sample_class
from ..records.results import SubmissionResult
from ..outputs.terminal import shown


def verdict_class(points: float, maximum: float) -> str:
    if points >= maximum - 1e-9:
        return "full"
    if points <= 1e-9:
        return "zero"
    return "partial"


def compare(results: list, on_gpu: bool) -> list:
    """One row per graded sample: ``(sample, lab, total, max, ok, mismatches, why)``."""
    declared = sample_class.all_samples()
    rows = []
    for r in map(SubmissionResult.of, results):
        sample = declared.get((r.student, r.lab))
        if sample is None:
            continue
        expected = sample_class.expected(r.lab, sample, on_gpu)
        mismatches = []
        for grade_id, want in expected.items():
            cell = r.cells.get(grade_id)
            got = verdict_class(cell.points, cell.max_points) if cell else "missing"
            if want != "any" and got != want:
                mismatches.append(f"{grade_id}: got {got} ({cell.status if cell else ''}), expected {want}")
        rows.append({"sample": r.student, "lab": r.lab, "total": r.total, "max": r.max_total,
                     "ok": not mismatches, "mismatches": mismatches, "why": sample.why,
                     "cells": {k: (c.points, c.max_points, c.status) for k, c in r.cells.items()},
                     "flags": r.attention, "seconds": r.seconds if r.seconds is not None else 0.0,
                     "clean_seconds": r.clean_seconds,
                     "gpu_wait_seconds": r.gpu_wait_seconds})
    return rows


def table(rows: list) -> str:
    lines = []
    width = max([len(shown(f"{r['sample']}/{r['lab']}")) for r in rows] + [10])
    for r in rows:
        mark = "ok  " if r["ok"] else "MISS"
        tests = " ".join(f"{shown(k.replace('test_', ''))}={p:g}/{m:g}" for k, (p, m, _) in r["cells"].items())
        lines.append(f"{mark} {shown(r['sample'] + '/' + r['lab']):<{width}} {r['total']:>5g}/{r['max']:<4g} {tests}"
                     f"{'  [' + str(r['flags']) + ' flag(s)]' if r['flags'] else ''}  {r['seconds']:.0f}s")
        lines.append(f"     {'':<{width}} {r['why']}")
        for miss in r["mismatches"]:
            lines.append(f"     {'':<{width}} !! {shown(miss)}")
    return "\n".join(lines)


def grade_examples(out, labs=None, samples=None, examples: Path | None = None, progress=True, **settings) -> dict:
    """Grade the sample class and check each verdict; the GPU self-check calls this on the GPU.

    ``examples``: a folder of ``<sample>/<lab>/<notebook>`` (default: written fresh from the recipes into
    ``out/examples``). ``samples``: only these sample names. Other keyword arguments go to ``Settings``.
    """
    import torch

    from .pipeline import Settings, grade
    out = Path(out)
    if examples is None:
        examples = out / "examples"
        sample_class.write_examples(examples)
    started = time.monotonic()
    result = grade(examples, Settings(out=out / "run", labs=labs, students=samples, progress=progress, **settings))
    rows = compare(result.results, on_gpu=torch.cuda.is_available())
    return {"status": "ok" if rows and all(r["ok"] for r in rows) and not result.problems else "MISS",
            "rows": rows, "table": table(rows), "seconds": time.monotonic() - started,
            "report": str(result.report), "grades_csv": str(result.grades_csv),
            "problems": [f"{p.where}: {p.message}" for p in result.problems],
            "reference": result.reference}


def ci_class() -> list:
    """The part of the sample class graded without a GPU: every Lab 0 sample but those that differ only on a GPU
    (``GPU_ONLY``) or that CI grades in a class of their own (``GRADED_APART``), every lab's correct sample, and
    the samples that prove the isolation boundary outside Lab 0 (``CI_SAMPLES``)."""
    return sorted((name, lab) for name, lab in sample_class.all_samples()
                  if (lab == "lab0" and name not in GPU_ONLY | GRADED_APART) or name == "correct"
                  or (name, lab) in CI_SAMPLES)


CI_SAMPLES = {("lying_int", "lab1"), ("honest_idioms", "lab2"), ("cheat_functional_bn", "lab2")}
# Lab 0 samples whose only difference from a correct submission shows on a GPU: a fault or hang at the timing
# demo's size (which the emulation never runs), an early return at the timed size (never timed without a GPU).
# Without a GPU each would cost CI a submission's grading to confirm a speed test's 0 that every submission gets.
GPU_ONLY = {"demo_fault", "demo_hang", "cheat_timed_size"}
# Lab 0 samples CI grades beside CPU hogs instead (tests/test_grader_load.py's busy class, with the same verdicts
# checked): ``endless`` spends its test's whole own-time limit, the longest submission of the class by far.
GRADED_APART = {"endless"}


def stage(target: Path, chosen=None, examples: Path | None = None) -> Path:
    """Copy the chosen ``(sample, lab)`` submissions of ``examples`` (default grader/examples) into ``target``."""
    import shutil
    examples = Path(examples or sample_class.EXAMPLES)
    target = Path(target)
    shutil.rmtree(target, ignore_errors=True)
    for name, lab in chosen if chosen is not None else ci_class():
        if (examples / name / lab).is_dir():
            shutil.copytree(examples / name / lab, target / name / lab)
    return target
