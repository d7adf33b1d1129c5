"""The self-check's stages that run the grader on a class: ``samples`` (the grader's sample class: every sample
must get the grade it deserves), ``throughput`` (grading time per submission on copies of the correct samples) and
``multigpu`` (the same class graded on one GPU and on all of them: same grades, no two timings on one GPU at once,
the wall-time ratio; skipped with fewer than 2 GPUs)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .archive import pack


def _sandbox():
    """``(sandbox, why)``: grade in the sandbox where it works on this machine (the grader's default); where it
    does not, the self-check grades without it and every stage that graded says so in its headline."""
    from ...grading.sandbox import isolate
    problem = isolate.sandbox_problem()
    return (False, f"sandbox off: {problem}") if problem else (True, "sandboxed")


def _listed(variable: str):
    """The comma-separated names in an environment variable, or None (all) where it is unset or empty."""
    return [name for name in os.environ.get(variable, "").split(",") if name] or None


def stage_samples(out):
    """The grader's sample class on this GPU (``FUSELAB_SAMPLES``: only these samples, ``FUSELAB_SAMPLE_LABS``:
    only these labs, each comma-separated, so that a class too large for one command runs as parts): every sample
    must get the grade it deserves."""
    from ...grading.run.samplecheck import grade_examples
    work = Path(tempfile.mkdtemp(prefix="fuselab-samples-"))
    chosen = _listed("FUSELAB_SAMPLES")  # default: all
    sandbox, sandboxed = _sandbox()
    result = grade_examples(work, labs=_listed("FUSELAB_SAMPLE_LABS"), samples=chosen, cell_timeout=30,
                            submission_timeout=240, progress=False, sandbox=sandbox)
    pack(out, "samples-run.tar.gz", work / "run",
          ["report.*", "grades.csv", "work/*/*/result.json", "reference/*/reference.json", "feedback/c*/*.html"])
    print(result["table"], flush=True)
    n = len(result["rows"])
    result["wall_bound"] = wall_bound_summary(work / "run")
    result["headline"] = (f"{sum(r['ok'] for r in result['rows'])}/{n} samples graded as they deserve, "
                          f"{result['seconds']:.0f} s, {sandboxed}; {result['wall_bound']['line']}")
    return result


def wall_bound_summary(run: Path) -> dict:
    """How the speedups the solution worker measured compare with the checker's own wall-clock bound, over every
    graded speed test of a run (``grading.recheck.kernels.SpeedCheck``): the numbers that set ``WALL_TOLERANCE``."""
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


# What grading at the GPU's pace means on one H200, each target asked of the stage's own measurement:
# (name, what is compared, at most). A class of 120 submission-labs all-in in 5 minutes needs the others.
TARGETS = (
    ("class of 120 all-in, s", "class_all_in_s", 300.0),
    ("submissions phase per submission-lab, s", "submission_s", 1.5),
    ("CPU per submission-lab, core-s", "cpu_s", 15.0),
    ("fixed cost of the class's run, s", "fixed_s", 15.0),
    ("one student's regrade all-in, s", "regrade_s", 30.0),
    ("16 sharing the GPU over 10 sharing it, time ratio", "jobs_16_over_10", 1.0),
)
CLASS_OF = 120  # submission-labs the all-in target speaks of


def cpu_each(run: dict) -> float:
    """CPU per submission-lab over the submissions phase: every process's, as the load sampler counted it
    (``cpu_by_process``, short processes included), where the run has it. The grader's own count (its children's
    resource usage, ``cpu_seconds_each``) misses every process reaped by none of its waits (a sandbox's processes
    ended with its PID namespace): on the H200 at 3717e62 it read 14.4 core-s where the sampler saw 30.0."""
    by_process = run.get("cpu_by_process")
    count = run["phases"]["submissions"]["count"]
    if by_process and count:
        return max(sum(by_process.values()) / count, run["phases"]["submissions"]["cpu_seconds_each"])
    return run["phases"]["submissions"]["cpu_seconds_each"]


def targets(runs: list, regrade: dict | None) -> list:
    """Each target with what this stage measured for it: ``{"target", "at_most", "measured", "met"}``; ``measured``
    and ``met`` are None where the stage did not measure it (a class of fewer than 120, one number of jobs, no
    regrade), so a smaller run never reads as the target met. The best run (fewest seconds per submission) speaks
    for the class."""
    best = min(runs, key=lambda r: r["submission_phase_per_submission"])
    phases = best["phases"]
    by_jobs = {r["jobs"]: r["submission_phase_per_submission"] for r in runs}
    measured = {
        "class_all_in_s": phases["wall_seconds"] if phases["submissions"]["count"] >= CLASS_OF else None,
        "submission_s": phases["submissions"]["seconds_each"],
        "cpu_s": cpu_each(best),
        "fixed_s": runs[0]["phases"]["fixed"]["seconds"],
        "regrade_s": regrade["wall_seconds"] if regrade else None,
        "jobs_16_over_10": by_jobs[16] / by_jobs[10] if 10 in by_jobs and 16 in by_jobs else None,
    }
    return [{"target": name, "at_most": limit, "measured": measured[key],
             "met": None if measured[key] is None else measured[key] <= limit} for name, key, limit in TARGETS]


def targets_table(rows: list) -> str:
    """The targets as lines: met, missed, or not measured by this run."""
    word = {True: "met", False: "MISSED", None: "not measured"}
    return "\n".join(f"  {row['target']}: at most {row['at_most']:g}; "
                     f"{'-' if row['measured'] is None else format(row['measured'], '.3g')} ({word[row['met']]})"
                     for row in rows)


def stage_throughput(out, copies=None, labs=None, regrade=None):
    """Grading time per submission: ``copies`` (``FUSELAB_THROUGHPUT_COPIES``, default 30: a class of 120) copies
    of each lab's correct sample (``FUSELAB_THROUGHPUT_LABS``: only these labs), graded as one class, once per
    number of submissions sharing the GPU in ``FUSELAB_THROUGHPUT_JOBS`` (comma-separated; default: the grader's
    own choice), with how busy the CPU and the GPU's memory were and where the time and the CPU went, phase by
    phase (``phases``). The runs share one course folder, as a term's runs do: the first runs the references, the
    others reuse them. Then (``FUSELAB_THROUGHPUT_REGRADE``, default 1; skipped where the stage already ran
    ``FUSELAB_THROUGHPUT_REGRADE_BEFORE_S``, default 450) one student's ``--force`` regrade in the same folder, a
    TA's most common run: its fixed cost and all-in time."""
    if copies is None:
        copies = int(os.environ.get("FUSELAB_THROUGHPUT_COPIES", "30"))
    labs = labs if labs is not None else _listed("FUSELAB_THROUGHPUT_LABS")
    if regrade is None:
        regrade = os.environ.get("FUSELAB_THROUGHPUT_REGRADE", "1") not in ("0", "")
    # the regrade only where it still fits in one device command (600 s) after the class
    regrade_before = float(os.environ.get("FUSELAB_THROUGHPUT_REGRADE_BEFORE_S", "450"))
    started = time.monotonic()
    work = _class_of_copies(copies, labs)
    jobs = list(dict.fromkeys(int(j) for j in os.environ.get("FUSELAB_THROUGHPUT_JOBS", "").split(",")
                              if j.strip())) or [None]
    if any(j < 1 for j in jobs if j is not None):
        raise ValueError(f"FUSELAB_THROUGHPUT_JOBS must list numbers of at least 1, not {jobs}")
    runs = []
    for j in jobs:
        runs.append(_throughput_run(work, "term", j)[0])
        print(runs[-1]["headline"] + "\n" + phase_table(runs[-1]["phases"]) + "\n" + by_process(runs[-1]), flush=True)
    best = min(runs, key=lambda r: r["submission_phase_per_submission"])
    headline = "; ".join(r["headline"] for r in runs)
    result = {**best, "runs": runs}
    if regrade and time.monotonic() - started > regrade_before:
        regrade = False
        headline += f"; one student's regrade skipped (the class took over {regrade_before:.0f} s)"
    if regrade:
        one, _ = _throughput_run(work, "term", jobs[-1], students=["student00"])
        print(one["headline"] + "\n" + phase_table(one["phases"]), flush=True)
        result["one_student_regrade"] = one
        headline += (f"; one student's regrade: {one['wall_seconds']:.0f} s all-in, "
                     f"{one['phases']['fixed']['seconds']:.0f} s fixed (references "
                     f"{'reused' if one['phases']['references_reused'] else 'run again'})")
    result["targets"] = targets(runs, result.get("one_student_regrade"))
    print("targets:\n" + targets_table(result["targets"]), flush=True)
    missed = [row["target"] for row in result["targets"] if row["met"] is False]
    unmeasured = [row["target"] for row in result["targets"] if row["met"] is None]
    result["target_met"] = not missed and not unmeasured
    headline += (f"; targets missed: {', '.join(missed)}" if missed else "") + \
        (f"; not measured: {', '.join(unmeasured)}" if unmeasured else "")
    # every copy of a correct sample full marks, in the grading time a class needs
    ok = all(r["status"] == "ok" for r in runs + ([result["one_student_regrade"]] if regrade else []))
    return {**result, "headline": headline, "status": "ok" if result["target_met"] and ok else "MISS"}


def stage_multigpu(out, copies=None, jobs_per_gpu=None):
    """The grader on every visible GPU against one GPU: the same class (``copies`` copies of each lab's correct
    sample, ``FUSELAB_MULTIGPU_COPIES``, default 2), the same number of submissions sharing each GPU
    (``jobs_per_gpu``, ``FUSELAB_MULTIGPU_JOBS``, default 1); see ``multigpu_check``."""
    from .. import multigpu_check
    from ...grading.gpus import schedule
    gpus = schedule.visible_gpus()
    if len(gpus) < 2:
        return {"status": "skipped", "headline": f"needs 2 GPUs, {len(gpus)} visible"}
    if copies is None:
        copies = int(os.environ.get("FUSELAB_MULTIGPU_COPIES", "2"))
    if jobs_per_gpu is None:
        jobs_per_gpu = int(os.environ.get("FUSELAB_MULTIGPU_JOBS", "1"))
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


def _class_of_copies(copies, only_labs=None):
    """A class of ``copies`` students, each with every lab's correct sample (or ``only_labs``'): ``<work>/class``;
    returns ``work``."""
    from ...course import lab_names, sample_class
    work = Path(tempfile.mkdtemp(prefix="fuselab-throughput-"))
    sample_class.write_examples(work / "examples")
    labs = [lab for lab in lab_names() if (work / "examples" / "correct" / lab).is_dir()
            and (not only_labs or lab in only_labs)]
    for k in range(copies):
        for lab in labs:
            shutil.copytree(work / "examples" / "correct" / lab, work / "class" / f"student{k:02d}" / lab)
    return work


def _throughput_run(work, name, jobs_per_gpu, gpus="auto", students=None):
    """Grade ``<work>/class`` (``students``: only these) into ``<work>/<name>``, regrading what is there:
    ``(summary, the grader's ClassResult)``."""
    from ...grading.run.pipeline import Settings, grade
    from ...grading.outputs.report import median_steps
    from ...grading.gpus.schedule import describe
    from ...grading.sandbox import cgroup
    from ..load_sampler import LoadSampler
    sandbox, sandboxed = _sandbox()
    started = time.perf_counter()
    with LoadSampler(processes=True) as load:
        # the grader's own progress bars on stderr: a run cut short by the device's time limit still says how far
        # it got and how long each phase took
        result = grade(work / "class", Settings(out=work / name, progress=True, cell_timeout=120, gpus=gpus,
                                                submission_timeout=600, jobs_per_gpu=jobs_per_gpu, force=True,
                                                sandbox=sandbox, students=students))
    wall = time.perf_counter() - started
    phases = result.phase_seconds
    grading = phases.get("submissions", 0.0)
    per = [{k: getattr(r, k) for k in ("student", "lab", "total", "max_total", "seconds", "clean_seconds",
                                       "gpu_wait_seconds", "gpu_held_seconds", "clean_timeline", "clean_cpu")}
           for r in result.results]
    for r, full_result in zip(per, result.results):
        r.update(cells_told(full_result))
    full = sum(r.full_marks for r in result.results)
    n = len(per)
    sharing = len(result.workers) // max(1, len(set(result.workers)))  # per GPU
    per_submission = grading / max(n, 1)
    summary = {
        "status": "ok" if full == n else "MISS",  # every copy of a correct sample full marks
        "jobs": sharing, "workers": describe(result.workers),
        "submissions": per, "wall_seconds": wall,
        "reference_seconds": {lab: ref.get("seconds") for lab, ref in result.reference.items()},
        "phase_seconds": phases, "submission_phase_per_submission": per_submission,
        "load_while_grading": load.summary(*result.phase_spans["submissions"]),
        "cpu_by_process": load.cpu_by_kind(*result.phase_spans["submissions"]),
        # who held the GPU's memory (NVML's per-process view): what limits how many submissions share it
        "gpu_memory_by_process": load.gpu_memory_by_kind(*result.phase_spans["submissions"]),
        "cpu_in_kernel_by_process": load.cpu_by_kind(*result.phase_spans["submissions"], kernel=True),
        "time_by_lab": median_steps(result.results),
        # the part that cannot overlap: timings with the GPU to themselves
        "gpu_held_seconds_total": sum(r.get("gpu_held_seconds") or 0.0 for r in per),
        "seconds_per_submission": wall / max(n, 1), "full_marks": full,
        "phases": phases_of(result, wall),
        "cpu_seconds_per_submission": round((result.phase_cpu or {}).get("submissions", 0.0) / max(n, 1), 2),
        "headline": f"{describe(result.workers)}: {n} submissions graded in {grading:.0f} s = "
                    f"{per_submission:.1f} s each ({(result.phase_cpu or {}).get('submissions', 0.0) / max(n, 1):.1f} "
                    f"s CPU each), {wall:.0f} s in all; {full}/{n} full marks; "
                    f"{sandboxed}", "sandbox": sandboxed,
        # who counts each child's memory: the kernel (a memory cgroup a child) or the limit watchers' /proc scans,
        # whose CPU is the "grader: limit watchers" above
        "memory_counted_by": "memory cgroup" if cgroup.available() else "the watchers' scans of /proc"}
    return summary, result


# the clean recheck's timeline labels (``recheck``) that are waits for the GPU inside a speed test's time
_TIMING_WAITS = ("waiting for a speed test slot", "waiting for the GPU alone", "stopped for others' timings")
_HELD = "the GPU held alone"


def cells_told(result) -> dict:
    """What the throughput stage keeps of a submission's cells: their seconds, the speed tests' phases, why a cell
    lost points (a copy of a correct sample should lose none) and why one was run again alone."""
    return {
        "cell_seconds": {k: round(c.seconds or 0.0, 2) for k, c in result.cells.items()},
        "speed_phases": {k: record.get("phases") for k, c in result.cells.items()
                         for record in c.speed or [] if isinstance(record, dict) and record.get("phases")},
        "lost": {k: f"{c.status}: {(c.message or '')[:300]}" for k, c in result.cells.items()
                 if c.points < c.max_points},
        # what stopped a test's first try (a wall-clock backstop, the shared GPU's memory)
        "retried": {k: str(c.retry.get("first_try", ""))[:300] for k, c in result.cells.items() if c.retry},
    }


def phases_of(result, wall: float) -> dict:
    """Where a run's time and CPU went: the fixed phases (intake and course set-up, with the reference runs beside
    it; then what is left of the reference runs; the outputs), the submissions phase, and per submission-lab the medians of its steps summed by kind (process
    starts, builds, tests, of the tests the waits for the GPU and its holds, the rest)."""
    import statistics
    seconds, cpu = result.phase_seconds, getattr(result, "phase_cpu", {}) or {}
    n = max(1, result.graded_now or len(result.results))
    fixed_names = ("intake and course", "reference runs")
    out_names = ("gradebook", "feedback", "export and report")
    steps: dict = {"start": [], "build": [], "tests": [], "timing waits": [], "GPU held": [], "other": []}
    cpu_steps: dict = {}  # (step kind, process) → CPU seconds, summed over the submission-labs
    for r in result.results:
        kinds = dict.fromkeys(steps, 0.0)
        for label, value in (r.clean_timeline or {}).items():
            kinds[_step_kind(label)] += value
        for kind, value in kinds.items():
            steps[kind].append(value)
        for label, used in (r.clean_cpu or {}).items():
            for role, value in used.items():
                key = (_step_kind(label), role)
                cpu_steps[key] = cpu_steps.get(key, 0.0) + value
    return {
        "wall_seconds": round(wall, 1),
        "fixed": {"seconds": round(sum(seconds.get(k, 0.0) for k in fixed_names), 1),
                  "cpu_seconds": round(sum(cpu.get(k, 0.0) for k in fixed_names), 1),
                  **{k: {"seconds": round(seconds.get(k, 0.0), 1), "cpu_seconds": round(cpu.get(k, 0.0), 1)}
                     for k in fixed_names}},
        "references_reused": bool(result.reference) and all(r.get("reused") for r in result.reference.values()),
        "submissions": {"seconds": round(seconds.get("submissions", 0.0), 1),
                        "cpu_seconds": round(cpu.get("submissions", 0.0), 1), "count": n,
                        "seconds_each": round(seconds.get("submissions", 0.0) / n, 2),
                        "cpu_seconds_each": round(cpu.get("submissions", 0.0) / n, 2)},
        "outputs": {"seconds": round(sum(seconds.get(k, 0.0) for k in out_names), 1),
                    "cpu_seconds": round(sum(cpu.get(k, 0.0) for k in out_names), 1),
                    **{k: {"seconds": round(seconds.get(k, 0.0), 1), "cpu_seconds": round(cpu.get(k, 0.0), 1)}
                       for k in out_names}},
        # per submission-lab, the median of each kind (the clean recheck's own clock, waits included)
        "per_submission_median": {k: round(statistics.median(v), 2) if v else 0.0 for k, v in steps.items()},
        # per submission-lab, the mean CPU seconds of each kind of step in each process (sampled every half second,
        # so a mean over many, not one submission's exact split)
        "cpu_per_submission_mean": {f"{kind}, {role}": round(value / n, 2) for (kind, role), value
                                    in sorted(cpu_steps.items(), key=lambda kv: -kv[1])},
    }


def _step_kind(label: str) -> str:
    """A clean-recheck timeline label's kind of step: start, build, tests, timing waits, GPU held or other."""
    if label == "process start":
        return "start"
    if label in _TIMING_WAITS:
        return "timing waits"
    if label == _HELD:
        return "GPU held"
    if "build" in label:
        return "build"
    return "tests" if label.startswith("test") else "other"


def by_process(run: dict) -> str:
    """The load sampler's CPU over the submissions phase by kind of process (the grader's own by thread), per
    submission, and the part of it in the kernel, as lines to read in the stage's output."""
    count = max(1, run["phases"]["submissions"]["count"])

    def line(key):
        return ", ".join(f"{kind} {seconds / count:.2f}" for kind, seconds in (run.get(key) or {}).items()
                         if seconds / count >= 0.005)
    lines = "  CPU per submission by process (core-s, the load sampler's scans): " + line("cpu_by_process")
    if run.get("cpu_in_kernel_by_process"):
        lines += "\n  of it in the kernel (system time; missed: interrupts and what no scan saw): " + \
            line("cpu_in_kernel_by_process")
    memory = run.get("gpu_memory_by_process") or {}
    if memory:
        lines += ("\n  GPU memory at its peak by process (GiB in processes): " +
                  ", ".join(f"{kind} {held['gib']:.2f} in {held['processes']}" +
                            (f" ({held['unknown']} of them unknown to NVML)" if held.get("unknown") else "")
                            for kind, held in memory["at_peak"].items()) +
                  "; the most one process held (GiB): " +
                  ", ".join(f"{kind} {gib:.2f}" for kind, gib in memory["one_process_peak_gib"].items()))
    return lines


def phase_table(phases: dict) -> str:
    """``phases_of``'s numbers as lines to read in the stage's output."""
    fixed, subs, outs = phases["fixed"], phases["submissions"], phases["outputs"]
    lines = [f"  fixed: {fixed['seconds']:.1f} s wall, {fixed['cpu_seconds']:.1f} s CPU "
             f"(intake and set-up {fixed['intake and course']['seconds']:.1f} s / "
             f"{fixed['intake and course']['cpu_seconds']:.1f} s CPU; the references' rest "
             f"{fixed['reference runs']['seconds']:.1f} s / {fixed['reference runs']['cpu_seconds']:.1f} s CPU, "
             f"{'reused' if phases['references_reused'] else 'run'})",
             f"  submissions: {subs['count']} in {subs['seconds']:.1f} s = {subs['seconds_each']:.2f} s each, "
             f"{subs['cpu_seconds_each']:.2f} s CPU each",
             "  per submission (median s; the tests' time holds the timing waits and the GPU held): "
             + ", ".join(f"{k} {v:.2f}" for k, v in phases["per_submission_median"].items()),
             "  CPU per submission (mean core-s by step and process): "
             + ", ".join(f"{k} {v:.2f}" for k, v in (phases.get("cpu_per_submission_mean") or {}).items()),
             f"  outputs: {outs['seconds']:.1f} s, {outs['cpu_seconds']:.1f} s CPU ("
             + "; ".join(f"{k} {outs[k]['seconds']:.1f} s / {outs[k]['cpu_seconds']:.1f} s CPU"
                         for k in ("gradebook", "feedback", "export and report") if k in outs) + ")",
             f"  all-in: {phases['wall_seconds']:.1f} s"]
    return "\n".join(lines)
