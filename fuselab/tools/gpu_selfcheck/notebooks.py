"""The self-check's stages that run the solution notebooks whole: ``grade`` (nbgrader autograde: solutions full
marks, blank labs zero; autograding runs every solution notebook top to bottom, headless, and its errors and
stderr are reported too) and ``notebooks`` (every solution notebook top to bottom with its demo cells, as an
instructor runs it: not in grading mode)."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from .archive import pack
from .machine import git_commit


def _problems(path):
    """Errors and stderr outputs of an executed notebook."""
    nb = json.loads(Path(path).read_text())
    errors = [f"cell {i}: {o['ename']}: {o['evalue'][:300]}" for i, c in enumerate(nb["cells"])
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    stderr = [f"cell {i}: {''.join(o['text'])[:300]}" for i, c in enumerate(nb["cells"])
              for o in c.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    return {"errors": errors, "stderr": stderr}


def _cell_seconds(cell) -> float:
    """How long a code cell's last run took, from the times nbclient records in its metadata (0 where missing)."""
    def stamp(text):
        try:
            return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except (AttributeError, TypeError, ValueError):
            return None
    execution = cell.get("metadata", {}).get("execution", {})
    began, ended = stamp(execution.get("iopub.execute_input")), stamp(execution.get("shell.execute_reply"))
    return ended - began if began is not None and ended is not None and began <= ended else 0.0


def stage_notebooks(out, cell_timeout=420):
    """Every solution notebook top to bottom with its demo cells (grading mode off), as an instructor runs it
    (``FUSELAB_NOTEBOOKS``: only these labs, comma-separated).

    Executed copies go into ``$OUT/notebooks.tar.gz``; errors and stderr output fail the stage.
    """
    import nbformat
    from nbclient import NotebookClient
    from ... import notebook as ipynb
    from ...course import SOLUTIONS, lab_names
    results = {}
    executed = Path(tempfile.mkdtemp(prefix="fuselab-notebooks-"))
    saved_env = dict(os.environ)
    os.environ.pop("FUSELAB_GRADING", None)
    os.environ["MPLBACKEND"] = "Agg"
    try:
        chosen = [lab for lab in saved_env.get("FUSELAB_NOTEBOOKS", "").split(",") if lab] or lab_names()
        for lab in chosen:
            path = next((SOLUTIONS / lab).glob("*.ipynb"))
            nb = nbformat.read(path, as_version=4)
            started = time.perf_counter()
            print(f"   {lab}: running {path.name} with its demo cells", flush=True)
            client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                                    record_timing=True, resources={"metadata": {"path": str(path.parent)}})
            try:
                client.execute()
                crash = None
            except Exception as exc:  # noqa: BLE001 - a dead kernel or a timeout is this lab's result
                crash = f"{type(exc).__name__}: {str(exc)[:300]}"
            target = executed / f"executed-{lab}.ipynb"
            nbformat.write(nb, target)
            slowest = sorted(((round(_cell_seconds(c), 1), ipynb.grade_id(c)
                               or f"cell {i}") for i, c in enumerate(nb.cells) if c.cell_type == "code"),
                             reverse=True)[:4]
            results[lab] = {**_problems(target), "crash": crash, "seconds": time.perf_counter() - started,
                            "slowest_cells": slowest}
            print(f"   {lab}: {results[lab]['seconds']:.0f} s, {len(results[lab]['errors'])} error(s), "
                  f"{len(results[lab]['stderr'])} stderr output(s){', ' + crash if crash else ''}", flush=True)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    pack(out, "notebooks.tar.gz", executed, ["*.ipynb"])
    shutil.rmtree(executed, ignore_errors=True)
    bad = [lab for lab, r in results.items() if r["errors"] or r["stderr"] or r["crash"]]
    durations = ", ".join(f"{lab} {r['seconds']:.0f}s" for lab, r in results.items())
    return {"status": "FAIL" if bad else "ok", "labs": results,
            "headline": f"with demos: {durations}" if not bad else f"problems in {', '.join(bad)}"}


def stage_grade(out):
    """Autograde the solutions (they must score full marks) and the blank labs (zero).

    Autograding executes every solution notebook top to bottom, headless, on this GPU, in grading mode: their
    errors and stderr output are reported in the ``graded nb`` row.
    """
    from ...grading.records.nbgrader_run import autograde
    from ...course import LABS, SOLUTIONS, lab_names
    submissions = {"solution": {lab: next((SOLUTIONS / lab).glob("*.ipynb")) for lab in lab_names()},
                   "blank": {lab: next((LABS / lab).glob("*.ipynb")) for lab in lab_names()}}
    started = time.perf_counter()
    notebooks = {}
    with tempfile.TemporaryDirectory(prefix="fuselab-autograde-") as workdir:
        scores = autograde(submissions, workdir)
        for executed in sorted((Path(workdir) / "autograded" / "solution").glob("*/*.ipynb")):
            notebooks[executed.parent.name] = _problems(executed)
    return {"seconds": time.perf_counter() - started, "scores": scores, "notebooks": notebooks}


def grade_rows(name, res):
    """The autograde scores, and a ``graded nb`` row for the errors and stderr of the notebooks it ran."""
    text = "; ".join(f"{s}/{lab} {v['autograded_score']}/{v['autograded_max']}"
                     for s, labs in res["scores"].items() for lab, v in labs.items() if "autograded_score" in v)
    bad = {k: v for k, v in res["notebooks"].items() if v["errors"] or v["stderr"]}
    return [(name, "ok", f"{text} ({res['seconds']:.0f}s)"[:90]),
            ("graded nb", "ok" if not bad else "FAIL",
             ("ran headless: " + ", ".join(res["notebooks"])) if not bad else str(bad)[:90])]


def calibrate_for_grading(results, out):
    """Before ``grade``: grade with thresholds measured in this very run by the labs' stages (as ``fuselab
    calibrate`` would write them)."""
    from ...speed import load_policy, policy_entries
    graded = {test: entry for res in results.values() if isinstance(res, dict)
              for test, entry in res.get("graded", {}).items()}
    if not graded or not torch.cuda.is_available():
        return
    policy = policy_entries.calibrated(load_policy(), torch.cuda.get_device_name(), graded, git_commit())
    os.environ["FUSELAB_POLICY"] = str(policy_entries.write(policy, Path(out) / "policy.json"))
    print(f"== calibrated policy for this GPU: {', '.join(graded)} -> {out}/policy.json", flush=True)
