"""The GPU self-check: everything that needs a GPU, in stages that can run alone (``--stages``).

    bash .ci/gpu-selfcheck                   # all stages
    bash .ci/gpu-selfcheck --stages lab0     # some

Stages: ``env`` (versions), ``tests`` (the pytest suite, GPU tests included), ``build`` (build-time targets),
``timing`` (timing accuracy against itself and triton's do_bench), ``emulation`` (emulated and real results of
the test kernels agree), one stage per lab (build the solution kernels from ``solutions/``, check them on the
GPU shapes, time them against the lab's unfused reference, PyTorch eager, ``torch.compile`` and the measured
ceilings, run the graded speedup test) and ``grade`` (nbgrader autograde: solutions full marks, blank labs zero; autograding runs every solution notebook
top to bottom, headless, and its errors and stderr are reported too), ``notebooks`` (every solution notebook top
to bottom with its demo cells, as an instructor runs it: not in grading mode), ``samples`` (the grader's sample
class: every sample must get the grade it deserves), ``throughput`` (grading time per submission on copies
of the correct samples) and ``multigpu`` (the same class graded on one GPU and on all of them: same grades, no
two timings on one GPU at once, the wall-time ratio; skipped with fewer than 2 GPUs). Full results go to ``$OUT`` (or ``--out``) as JSON; a short table is printed last.

Environment: ``FUSELAB_NOTEBOOKS=lab3`` and ``FUSELAB_SAMPLES=correct,cheat_cache`` narrow those stages;
``FUSELAB_THROUGHPUT_COPIES`` (default 3) and ``FUSELAB_THROUGHPUT_JOBS=10,16`` (submissions sharing the GPU,
one run each; default: the grader's own choice) shape the throughput stage, ``FUSELAB_MULTIGPU_COPIES``
(default 2) and ``FUSELAB_MULTIGPU_JOBS`` (submissions sharing each GPU, default 1: one worker per GPU) the
multigpu stage; ``FUSELAB_COMMIT`` names the
commit in the results where the GPU machine's copy has no up-to-date ``.git``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from ..course import REPO


def stage_env(out):
    from .. import doctor, toolchain
    info = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "capability": ".".join(map(str, torch.cuda.get_device_capability())) if torch.cuda.is_available() else None,
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "python": sys.version.split()[0],
            "nvcc": toolchain.nvcc_version(toolchain.find_cuda_home()),
            "commit": _git_commit(), "date": datetime.date.today().isoformat()}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info["doctor"] = [f"{f.status}: {f.topic}: {f.detail}" for f in doctor.run_checks()]
    return info


def stage_tests(out):
    files = ["tests/test_prototypes.py", "tests/test_build.py", "tests/test_check.py", "tests/test_timing.py",
             "tests/test_emulation.py", "tests/test_grader_gpu.py"]
    try:
        import nbclient  # noqa: F401 - the notebook tests need it (carried in the wheelhouse)
        files += ["tests/test_stderr_silence.py"]
    except ImportError:
        pass
    return _pytest(files, Path(out) / "pytest.txt", timeout=300)


def _pytest(files, log, timeout):
    """The repository's tests run by pytest in a child process (the package never imports ``tests/``)."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-rs"],
                            cwd=REPO, capture_output=True, text=True, timeout=timeout)
    log.write_text(result.stdout + result.stderr)
    summary = [line for line in result.stdout.splitlines() if " passed" in line or " failed" in line]
    return {"returncode": result.returncode, "summary": summary[-1] if summary else result.stdout[-500:],
            "seconds": time.perf_counter() - started}


def stage_build(out):
    from . import build_benchmark
    return build_benchmark.run("cuda")


def stage_timing(out):
    from .. import timing
    return timing.selfcheck()


def stage_emulation(out):
    """The emulated and the real build of each test kernel agree (``tests/test_emulation_agreement.py``)."""
    result = _pytest(["tests/test_emulation_agreement.py"], Path(out) / "pytest-emulation.txt", timeout=300)
    agree = result["returncode"] == 0 and " passed" in result["summary"] and "skipped" not in result["summary"]
    return {**result, "status": "ok" if agree else "DISAGREE",
            "headline": f"emulated vs real builds of the test kernels: {result['summary']}"}


def _problems(path):
    """Errors and stderr outputs of an executed notebook."""
    nb = json.loads(Path(path).read_text())
    errors = [f"cell {i}: {o['ename']}: {o['evalue'][:300]}" for i, c in enumerate(nb["cells"])
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    stderr = [f"cell {i}: {''.join(o['text'])[:300]}" for i, c in enumerate(nb["cells"])
              for o in c.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    return {"errors": errors, "stderr": stderr}


def _cell_seconds(cell) -> float:
    from ..grading.nbgrader_run import execution_span
    span = execution_span(cell)
    return span[1] - span[0] if span else 0.0


def _pack(out, name, folder, patterns):
    """Files of ``folder`` matching ``patterns`` into one archive, ``$OUT/name``: a stage leaves a few files, not
    one per submission."""
    import tarfile
    with tarfile.open(Path(out) / name, "w:gz") as tar:
        for pattern in patterns:
            for path in sorted(Path(folder).glob(pattern)):
                tar.add(path, arcname=str(path.relative_to(folder)))


def stage_notebooks(out, cell_timeout=420):
    """Every solution notebook top to bottom with its demo cells (grading mode off), as an instructor runs it
    (``FUSELAB_NOTEBOOKS``: only these labs, comma-separated).

    Executed copies go into ``$OUT/notebooks.tar.gz``; errors and stderr output fail the stage.
    """
    import nbformat
    from nbclient import NotebookClient
    from .. import notebook as ipynb
    from ..course import SOLUTIONS, lab_names
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
    _pack(out, "notebooks.tar.gz", executed, ["*.ipynb"])
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
    from ..grading.nbgrader_run import autograde
    from ..course import LABS, SOLUTIONS, lab_names
    submissions = {"solution": {lab: next((SOLUTIONS / lab).glob("*.ipynb")) for lab in lab_names()},
                   "blank": {lab: next((LABS / lab).glob("*.ipynb")) for lab in lab_names()}}
    started = time.perf_counter()
    notebooks = {}
    with tempfile.TemporaryDirectory(prefix="fuselab-autograde-") as workdir:
        scores = autograde(submissions, workdir)
        for executed in sorted((Path(workdir) / "autograded" / "solution").glob("*/*.ipynb")):
            notebooks[executed.parent.name] = _problems(executed)
    return {"seconds": time.perf_counter() - started, "scores": scores, "notebooks": notebooks}


def _sandbox():
    """``(sandbox, why)``: grade in the sandbox where it works on this machine (the grader's default); where it
    does not, the self-check grades without it and every stage that graded says so in its headline."""
    from ..grading import isolate
    problem = isolate.sandbox_problem()
    return (False, f"sandbox off: {problem}") if problem else (True, "sandboxed")


def stage_samples(out):
    """The grader's sample class on this GPU (``FUSELAB_SAMPLES``: only these, comma-separated): every sample
    must get the grade it deserves."""
    from ..grading.samplecheck import grade_examples
    work = Path(tempfile.mkdtemp(prefix="fuselab-samples-"))
    chosen = [name for name in os.environ.get("FUSELAB_SAMPLES", "").split(",") if name] or None  # default: all
    sandbox, sandboxed = _sandbox()
    result = grade_examples(work, samples=chosen, cell_timeout=30, submission_timeout=240, progress=False,
                            sandbox=sandbox)
    _pack(out, "samples-run.tar.gz", work / "run",
          ["report.*", "grades.csv", "work/*/*/result.json", "reference/*/reference.json", "feedback/c*/*.html"])
    print(result["table"], flush=True)
    n = len(result["rows"])
    result["wall_bound"] = wall_bound_summary(work / "run")
    result["headline"] = (f"{sum(r['ok'] for r in result['rows'])}/{n} samples graded as they deserve, "
                          f"{result['seconds']:.0f} s, {sandboxed}; {result['wall_bound']['line']}")
    return result


def wall_bound_summary(run: Path) -> dict:
    """How the speedups the solution worker measured compare with the checker's own wall-clock bound, over every
    graded speed test of a run (``grading.kernels.SpeedCheck``): the numbers that set ``WALL_TOLERANCE``."""
    rows = []
    for path in sorted(Path(run).glob("work/*/*/result.json")):
        result = json.loads(path.read_text())
        for cell in result.get("cells", {}).values():
            for record in cell.get("speed") or []:
                if record.get("wall_speedup") and record.get("worker_speedup"):
                    rows.append({"submission": "/".join(path.parts[-3:-1]), "test": record.get("test"),
                                 "worker": record["worker_speedup"], "wall": record["wall_speedup"],
                                 "ratio": record["worker_speedup"] / record["wall_speedup"],
                                 "capped": bool(record.get("flag"))})
    ratios = [r["ratio"] for r in rows]
    line = (f"worker/wall speedup ratio {min(ratios):.2f}-{max(ratios):.2f} over {len(rows)} speed tests, "
            f"{sum(r['capped'] for r in rows)} capped") if rows else "no speed test bounded by the wall clock"
    return {"rows": rows, "line": line}


def stage_throughput(out, copies=int(os.environ.get("FUSELAB_THROUGHPUT_COPIES", "3"))):
    """Grading time per submission: ``copies`` copies of each lab's correct sample, graded as one class, once per
    number of submissions sharing the GPU in ``FUSELAB_THROUGHPUT_JOBS`` (comma-separated; default: the grader's
    own choice), with how busy the CPU and the GPU's memory were."""
    work = _class_of_copies(copies)
    jobs = list(dict.fromkeys(int(j) for j in os.environ.get("FUSELAB_THROUGHPUT_JOBS", "").split(",")
                              if j.strip())) or [None]
    if any(j < 1 for j in jobs if j is not None):
        raise ValueError(f"FUSELAB_THROUGHPUT_JOBS must list numbers of at least 1, not {jobs}")
    runs = [_throughput_run(work, f"run-{j or 'default'}", j)[0] for j in jobs]
    best = min(runs, key=lambda r: r["submission_phase_per_submission"])
    headline = "; ".join(r["headline"] for r in runs)
    return {**best, "runs": runs, "headline": headline,
            "status": "ok" if all(r["status"] == "ok" for r in runs) else "MISS"}


def stage_multigpu(out, copies=int(os.environ.get("FUSELAB_MULTIGPU_COPIES", "2")),
                   jobs_per_gpu=int(os.environ.get("FUSELAB_MULTIGPU_JOBS", "1"))):
    """The grader on every visible GPU against one GPU: the same class (``copies`` copies of each lab's correct
    sample), the same number of submissions sharing each GPU (``jobs_per_gpu``); see ``multigpu_check``."""
    from . import multigpu_check
    from ..grading import schedule
    gpus = schedule.visible_gpus()
    if len(gpus) < 2:
        return {"status": "skipped", "headline": f"needs 2 GPUs, {len(gpus)} visible"}
    work = _class_of_copies(copies)
    single, single_result = _throughput_run(work, "one-gpu", jobs_per_gpu, gpus=1)
    (Path(out) / "multigpu-one-gpu.json").write_text(json.dumps(single, indent=1, default=str))  # if cut short
    several, several_result = _throughput_run(work, "all-gpus", jobs_per_gpu, gpus="auto")
    expected = sum(1 for _ in (work / "class").glob("*/*"))
    verdict = multigpu_check.verdict(single_result, several_result, expected)
    if single["status"] != "ok" or several["status"] != "ok":  # copies of the correct sample lost marks
        verdict["status"] = "MISS"
        verdict["problems"].append(f"full marks: {single['full_marks']} on one GPU, {several['full_marks']} on "
                                   f"several, of {expected}")
    return {**verdict, "one_gpu": single, "all_gpus": several,
            "timings": multigpu_check.timings(several_result.results, several_result.reference)}


def _class_of_copies(copies):
    """A class of ``copies`` students, each with every lab's correct sample: ``<work>/class``; returns ``work``."""
    from .. import samples as sample_recipes
    work = Path(tempfile.mkdtemp(prefix="fuselab-throughput-"))
    sample_recipes.write_examples(work / "examples")
    labs = sorted(p.name for p in (work / "examples" / "correct").iterdir())
    for k in range(copies):
        for lab in labs:
            shutil.copytree(work / "examples" / "correct" / lab, work / "class" / f"student{k:02d}" / lab)
    return work


def _throughput_run(work, name, jobs_per_gpu, gpus="auto"):
    """Grade ``<work>/class`` into ``<work>/<name>``: ``(summary, the grader's ClassResult)``."""
    from ..grading.pipeline import Settings, grade
    from ..grading.report import median_steps
    from ..grading.schedule import describe
    from .load_sampler import LoadSampler
    sandbox, sandboxed = _sandbox()
    started = time.perf_counter()
    with LoadSampler() as load:
        result = grade(work / "class", Settings(out=work / name, progress=False, cell_timeout=120, gpus=gpus,
                                                submission_timeout=600, jobs_per_gpu=jobs_per_gpu, force=True,
                                                sandbox=sandbox))
    wall = time.perf_counter() - started
    phases = result.phase_seconds
    grading = phases.get("submissions", 0.0)
    per = [{k: getattr(r, k) for k in ("student", "lab", "total", "max_total", "seconds", "nbgrader_seconds",
                                       "clean_seconds", "gpu_wait_seconds", "gpu_held_seconds", "clean_timeline",
                                       "nbgrader_phases")}
           for r in result.results]
    for r, full_result in zip(per, result.results):
        r["cell_seconds"] = {k: round(c.seconds or 0.0, 2) for k, c in full_result.cells.items()}
    full = sum(r.full_marks for r in result.results)
    n = len(per)
    sharing = len(result.workers) // max(1, len(set(result.workers)))  # per GPU
    summary = {
        "status": "ok" if full == n else "MISS", "jobs": sharing, "workers": describe(result.workers),
        "submissions": per, "wall_seconds": wall,
        "reference_seconds": {lab: ref.get("seconds") for lab, ref in result.reference.items()},
        "phase_seconds": phases, "submission_phase_per_submission": grading / max(n, 1),
        "load_while_grading": load.summary(*result.phase_spans["submissions"]),
        "time_by_lab": median_steps(result.results),
        # the part that cannot overlap: timings with the GPU to themselves
        "gpu_held_seconds_total": sum(r.get("gpu_held_seconds") or 0.0 for r in per),
        "seconds_per_submission": wall / max(n, 1), "full_marks": full,
        "headline": f"{describe(result.workers)}: {n} submissions graded in {grading:.0f} s = "
                    f"{grading / max(n, 1):.1f} s each (target 4), {wall:.0f} s in all; {full}/{n} full marks; "
                    f"{sandboxed}", "sandbox": sandboxed}
    return summary, result


def _lab_stages():
    from ..labs import selfcheck_modules
    return {lab: module.run for lab, module in selfcheck_modules().items()}


STAGES = {"env": stage_env, "build": stage_build, "timing": stage_timing, "emulation": stage_emulation,
          **_lab_stages(), "grade": stage_grade, "notebooks": stage_notebooks, "samples": stage_samples,
          "throughput": stage_throughput, "multigpu": stage_multigpu, "tests": stage_tests}


def _git_commit():
    try:
        # the GPU machine's copy of the tree may carry an older .git: the commit named by the caller wins
        return os.environ.get("FUSELAB_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return os.environ.get("FUSELAB_COMMIT", "unknown")


def _summary_rows(results):
    rows = []
    for name, res in results.items():
        if "error" in res:
            rows.append((name, "ERROR", res["error"].strip().splitlines()[-1][:90]))
        elif name == "env":
            rows.append((name, "ok", f"{res['gpu']} cc {res['capability']}, torch {res['torch']}, commit {res['commit']}"))
        elif name == "tests":
            rows.append((name, "ok" if res["returncode"] == 0 else "FAIL", res["summary"][:90]))
        elif name == "build":
            rows.append((name, "ok" if all(res["met"].values()) else "MISS",
                         f"first {res['first_build']:.2f}s, edit {res['rebuild_after_edit']:.2f}s, "
                         f"reload {res['reload_fresh_process']:.3f}s"))
        elif name == "timing":
            rows.append((name, "ok" if res.get("goal_spread_ok") and res.get("goal_do_bench_ok") else "MISS",
                         f"spread {res.get('spread_pct', float('nan')):.2f}%, vs do_bench "
                         f"{res.get('vs_do_bench_pct', float('nan')):+.2f}%"))
        elif name == "grade":
            text = "; ".join(f"{s}/{lab} {v['autograded_score']}/{v['autograded_max']}"
                             for s, labs in res["scores"].items() for lab, v in labs.items() if "autograded_score" in v)
            rows.append((name, "ok", f"{text} ({res['seconds']:.0f}s)"[:90]))
            bad = {k: v for k, v in res["notebooks"].items() if v["errors"] or v["stderr"]}
            rows.append(("graded nb", "ok" if not bad else "FAIL",
                         ("ran headless: " + ", ".join(res["notebooks"])) if not bad else str(bad)[:90]))
        else:
            rows.append((name, res.get("status", "ok"), res.get("headline", "")[:90]))
    return rows


def _calibrate_for_grading(results, out):
    """Grade with thresholds measured in this very run (as `fuselab calibrate` would write them)."""
    from ..speed import calibration, load_policy
    graded = {test: entry for res in results.values() if isinstance(res, dict)
              for test, entry in res.get("graded", {}).items()}
    if not graded or not torch.cuda.is_available():
        return
    policy = calibration.calibrated(load_policy(), torch.cuda.get_device_name(), graded, _git_commit())
    os.environ["FUSELAB_POLICY"] = str(calibration.write(policy, Path(out) / "policy.json"))
    print(f"== calibrated policy for this GPU: {', '.join(graded)} -> {out}/policy.json", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description="fuselab GPU self-check")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, from: {', '.join(STAGES)}")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "selfcheck-out"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.stages.split(","):
        if name == "grade":
            _calibrate_for_grading(results, out)
        started = time.perf_counter()
        print(f"== stage {name}", flush=True)
        try:
            results[name] = STAGES[name](out)
        except Exception:  # noqa: BLE001 - a failed stage is reported, the others still run
            results[name] = {"error": traceback.format_exc()}
            print(results[name]["error"], flush=True)
        results[name]["stage_seconds"] = time.perf_counter() - started
        (out / "selfcheck.json").write_text(json.dumps(results, indent=2, default=str))
    print("\nstage      status  result")
    for name, status, text in _summary_rows(results):
        print(f"{name:<10} {status:<7} {text}")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
