"""``fuselab grade --slurm``: a class graded as a Slurm job array, one shard of submissions per task, then merged.

The submitting command does the intake once and writes the plan; each array task grades its shard with the
one-host pipeline (``pipeline.grade``) on the GPUs Slurm gave it; one dependent job (``afterany``) merges the
shards into the class's gradebook, grades.csv, feedback and report (``pipeline.write_outputs``, as a one-host run
ends). Everything lives under ``--out``, which every node must see (a shared file system):

    OUT/shard-007.zip                the shard's submissions (the intake's copies): the task's input
    OUT/slurm/plan.json              the shards, the grading and sbatch options, the intake's problems
    OUT/slurm/jobs.json              every job submitted for this folder
    OUT/slurm/shard-007/             the shard's one-host run, its --out (work/<student>/<lab>/result.json, ...)
    OUT/slurm/shard-007.done.json    written last, atomically: the shard is complete
    OUT/slurm/shard-007.attempts.jsonl   one line per task that started on the shard
    OUT/slurm/references/<GPU model>/    the instructor's reference runs and shared builds, once per GPU model
    OUT/slurm/logs/                  the jobs' output
    OUT/slurm/merged.json            which shard completions the class's outputs were made from
    OUT/grades.csv, report.*, feedback/, course/, nbgrader-grades.csv   the merged class

The shard zips sit at the top of ``OUT`` so that ``--sandbox`` (which hides the folder around the submissions it
is given) hides all of ``OUT`` from a submission, as on one host. Faults: a task that fails or is preempted
(``--requeue``) leaves its shard without ``done.json``; the merge job then resubmits those shards only (up to
``MAX_ATTEMPTS`` tasks per shard) with a new merge job after them, and rerunning the same command submits whatever
is still missing. A shard's submissions already graded are kept (the pipeline's own resume); the merge reads
only complete shards, one result per (student, lab), and rebuilds the outputs from them, so nothing is counted
twice.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ... import course, gpu_facts, locks
from ...kernelbuild import shared as shared_builds
from ..records import intake, nbgrader_run, roster, term, unsandboxed
from . import pipeline
from ..gpus import schedule
from ..gpus.lease import grading_lease
from ..records.results import SubmissionResult
from ..sandbox.untrusted import remove_tree

SUBMISSIONS_PER_SHARD = 40   # default shard size: ~2 min on an H200 at 10 sharing it (2.5 s each, docs/RESULTS.md)
MAX_ATTEMPTS = 3             # tasks per shard (the first and two resubmissions) before the merge gives up on it
JOB_NAME = "fuselab-grade"
ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                 "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"}


class SlurmError(RuntimeError):
    """Slurm refused or could not be reached; the message says what to do."""


@dataclass
class Options:
    """What ``fuselab grade --slurm`` was given: the grading options every shard uses, and sbatch's."""
    labs: list | None = None
    students: list | None = None
    cell_timeout: float = 300.0
    submission_timeout: float = 1200.0
    memory_bytes: int = 16 * 2**30
    sandbox: bool = False
    feedback: bool = True
    jobs_per_gpu: int | None = None
    cpu_workers: int | None = None       # None: the grader's default on each task's node
    shards: int | None = None            # default: one per SUBMISSIONS_PER_SHARD submissions
    partition: str | None = None
    account: str | None = None
    gpus_per_task: int = 1               # 0: the CPU emulation (no GPU asked for, none used)
    cpus_per_task: int | None = None
    time: str | None = None
    sbatch_args: list = field(default_factory=list)
    # the class's outputs only (the merge's): what one host does with them, its gradebook's due dates and late
    # penalties, its roster's missing students, names and Moodle worksheet. The shards grade without them; the
    # roster travels as a copy in the plan's folder named by its hash (``roster_copy``), which the merge job reads
    # on its node. As on one host, a submit without --roster applies none (the course folder keeps the last).
    due: dict = field(default_factory=dict)  # lab → due date as given (``pipeline._due_dates`` reads it)
    roster_sha: str | None = None            # the --roster given with the submit that made or updated the plan

    def grading(self) -> dict:
        """The options that decide grades: a rerun must give the same ones to resume (a GPU measures speed
        tests, the emulation does not, so a class is graded on one or the other)."""
        return {**{k: getattr(self, k) for k in ("labs", "students", "cell_timeout", "submission_timeout",
                                                 "memory_bytes", "sandbox", "feedback")},
                "on_gpu": bool(self.gpus_per_task)}


# --- files ------------------------------------------------------------------------------------------------------

def slurm_dir(out: Path) -> Path:
    return Path(out) / "slurm"


def roster_copy(out: Path, sha: str) -> Path:
    """A ``--roster`` the class was submitted with, copied where every node sees it; named by its hash, so a copy
    a plan names is never replaced by another submit's."""
    return slurm_dir(out) / f"roster-{sha[:16]}.csv"


def shard_zip(out: Path, index: int) -> Path:
    return Path(out) / f"shard-{index:03d}.zip"


def shard_dir(out: Path, index: int) -> Path:
    """The shard's one-host run: the pipeline's own --out, holding only what the pipeline writes there."""
    return slurm_dir(out) / f"shard-{index:03d}"


def done_file(out: Path, index: int) -> Path:
    return slurm_dir(out) / f"shard-{index:03d}.done.json"


def attempts_file(out: Path, index: int) -> Path:
    return slurm_dir(out) / f"shard-{index:03d}.attempts.jsonl"


def read_json(path: Path, default=None):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def write_json(path: Path, data) -> None:
    """Write whole or not at all: a reader on another node never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1))
    os.replace(temporary, path)


def locked(path: Path):
    """An exclusive lock on ``path``, waited for (``locks``: ``flock``, which Linux NFS clients take as a
    whole-file byte-range lock the server arbitrates, so Slurm nodes sharing ``--out`` exclude each other)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return locks.file_lock(path)


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --- planning: intake once, shards as zips ----------------------------------------------------------------------

def intake_class(source: Path, options: Options, moodle_ids: dict | None = None, graded: dict | None = None,
                 canvas_ids: dict | None = None) -> tuple:
    """The class's submissions as ``[{student, lab, sha, origin, path}]`` (sorted) and the intake's problems; the
    notebooks are copied into a temporary folder the caller removes. ``moodle_ids``: as one host's intake
    (``pipeline._moodle_ids``: a Moodle worksheet's ids by email); ``graded``: as one host's, the course folder's
    graded uploads, none of which an older upload replaces (``term.graded_uploads``); ``canvas_ids``: the course
    folder's students by Canvas id (``term.canvas_ids``)."""
    labs = [lab for lab in course.lab_names() if not options.labs or lab in options.labs]
    unknown = sorted(set(options.labs or []) - set(labs))
    if unknown:
        raise ValueError(f"no such lab(s): {', '.join(unknown)} (labs: {', '.join(course.lab_names())})")
    staging = Path(tempfile.mkdtemp(prefix="fuselab-intake-"))
    names = {lab: nbgrader_run.notebook_name(lab) for lab in course.lab_names()}
    submissions, problems = intake.collect(Path(source), staging / "submissions", names,
                                           students=options.students, only_labs=labs, moodle_ids=moodle_ids,
                                           graded=graded, canvas_ids=canvas_ids)
    mixed = None if options.labs else intake.mixed_download(submissions)
    if mixed:
        shutil.rmtree(staging, ignore_errors=True)
        raise ValueError(mixed)
    entries = sorted(({"student": s.student, "lab": s.lab, "sha": _sha(s.notebook), "origin": s.origin,
                       "path": str(s.notebook), "late": s.late, "lms_id": s.lms_id, "lms": s.lms,
                       "submitted": s.submitted} for s in submissions), key=lambda e: (e["student"], e["lab"]))
    return entries, [asdict(p) for p in problems], staging


def split(entries: list, shards: int | None) -> list:
    """Shard numbers for ``entries``: equal runs in (lab, student) order, so a shard mostly holds one lab and
    its task prepares (and, first on its GPU model, reference-runs) only that lab."""
    count = shards or math.ceil(len(entries) / SUBMISSIONS_PER_SHARD)
    count = max(1, min(count, len(entries)))
    order = sorted(range(len(entries)), key=lambda i: (entries[i]["lab"], entries[i]["student"]))
    shard_of = [0] * len(entries)
    for position, i in enumerate(order):
        shard_of[i] = position * count // len(entries)
    return shard_of


def write_plan(out: Path, source: Path, options: Options, moodle_ids: dict | None = None,
               graded: dict | None = None, people: list | None = None) -> dict:
    """Intake once, write one zip per shard and ``plan.json``; the plan. ``people``: the ``--roster`` given, which
    must name some student of the class (``term.unrelated_roster``)."""
    entries, problems, staging = intake_class(source, options, moodle_ids, graded, term.canvas_ids(out))
    try:
        if not entries:
            raise ValueError(f"no gradable submission under {source}" +
                             "".join(f"\n  {p['where']}: {p['message']}" for p in problems))
        unrelated = term.unrelated_roster(people, {e["student"] for e in [*entries, *problems] if e["student"]},
                                          {e["lms_id"] for e in [*entries, *problems] if e["lms_id"]}, out)
        if unrelated:
            raise ValueError(f"--roster: {unrelated}")
        shards = split(entries, options.shards)
        for index in sorted(set(shards)):
            target = shard_zip(out, index)
            temporary = target.with_name(f".{target.name}.tmp")
            with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as archive:
                for entry, shard in zip(entries, shards):
                    if shard == index:  # one folder above the students: a shard of one student stays unambiguous
                        archive.write(entry["path"], f"submissions/{entry['student']}/{entry['lab']}/"
                                                     f"{Path(entry['path']).name}")
            os.replace(temporary, target)
        for entry, shard in zip(entries, shards):
            entry["shard"] = shard
            del entry["path"]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    plan = {"source": str(Path(source).resolve()), "created": _now(), "options": asdict(options),
            "shards": max(shards) + 1, "submissions": entries, "problems": problems,
            "zips": {str(i): _sha(shard_zip(out, i)) for i in range(max(shards) + 1)}}
    write_json(slurm_dir(out) / "plan.json", plan)
    return plan


def same_class(plan: dict, source: Path, options: Options, moodle_ids: dict | None = None,
               canvas_ids: dict | None = None) -> str | None:
    """Why the submissions or grading options differ from the plan's (a rerun must not mix two classes), or None."""
    then = Options(**plan["options"]).grading()
    if then != options.grading():
        differ = ", ".join(f"{k} {then[k]!r} then, {v!r} now" for k, v in options.grading().items() if then[k] != v)
        return f"the grading options differ from the first run's ({differ})"
    entries, _, staging = intake_class(source, options, moodle_ids, canvas_ids=canvas_ids)
    shutil.rmtree(staging, ignore_errors=True)
    now = {(e["student"], e["lab"]): e["sha"] for e in entries}
    then = {(e["student"], e["lab"]): e["sha"] for e in plan["submissions"]}
    if now == then:
        return None
    added = sorted(set(now) - set(then))
    gone = sorted(set(then) - set(now))
    changed = sorted(k for k in set(now) & set(then) if now[k] != then[k])
    parts = [f"{len(items)} {what} ({', '.join('/'.join(k) for k in items[:3])}{', ...' if len(items) > 3 else ''})"
             for what, items in (("new", added), ("missing", gone), ("changed", changed)) if items]
    return "the submissions changed since this folder was planned: " + "; ".join(parts)


# --- Slurm's commands -------------------------------------------------------------------------------------------

def _slurm(command: list, what: str) -> str:
    if shutil.which(command[0]) is None:
        raise SlurmError(f"{command[0]} not found: run `fuselab grade --slurm` on a Slurm login node (or install "
                         "Slurm's client commands, slurm-client)")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SlurmError(f"{what} failed ({' '.join(shlex.quote(c) for c in command)}): "
                         f"{(done.stderr or done.stdout).strip()[-1500:]}")
    return done.stdout


def sbatch_options(out: Path, options: dict) -> list:
    """The options every job of this folder gets: account, partition, time, the chosen extras."""
    args = [f"--job-name={JOB_NAME}", f"--chdir={course.REPO}"]
    args += [f"--partition={options['partition']}"] * bool(options.get("partition"))
    args += [f"--account={options['account']}"] * bool(options.get("account"))
    args += [f"--time={options['time']}"] * bool(options.get("time"))
    args += [f"--cpus-per-task={options['cpus_per_task']}"] * bool(options.get("cpus_per_task"))
    return args + list(options.get("sbatch_args") or [])


def _python(*args) -> str:
    """The job's command: this Python, this checkout (``--chdir`` is the repository root, first on the path)."""
    return " ".join(shlex.quote(a) for a in [sys.executable, "-m", "fuselab.grading.run.slurm", *map(str, args)])


def submit_shards(out: Path, plan: dict, indices: list, reason: str) -> dict:
    """A job array for ``indices`` and a merge job after it (``afterany``: it runs when every task has ended, well
    or not, and resubmits what failed). Recorded in ``jobs.json``."""
    options = plan["options"]
    logs = slurm_dir(out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    gpus = int(options.get("gpus_per_task") or 0)
    array = _slurm(["sbatch", "--parsable", *sbatch_options(out, options),
                    f"--array={_ranges(indices)}",
                    *([f"--gres=gpu:{gpus}"] if gpus else []),
                    "--requeue",  # a preempted task starts again on its shard (the pipeline resumes it)
                    f"--output={logs}/shard-%a-job-%A.log", "--open-mode=append",
                    "--wrap", _python("shard", out)], "sbatch (the shards' job array)").strip().split(";")[0]
    merge = _slurm(["sbatch", "--parsable", *sbatch_options(out, options), f"--dependency=afterany:{array}",
                    f"--output={logs}/merge-job-%j.log", "--wrap", _python("merge", out)],
                   "sbatch (the merge job)").strip().split(";")[0]
    record = {"array": array, "merge": merge, "shards": sorted(indices), "submitted": _now(), "reason": reason}
    with locked(slurm_dir(out) / "jobs.lock"):
        jobs = read_json(slurm_dir(out) / "jobs.json", [])
        write_json(slurm_dir(out) / "jobs.json", jobs + [record])
    return record


def _indices(text: str) -> set:
    """Array task ids as squeue prints them: ``3``, ``0-7``, ``1,4-5``, ``0-9%2`` (a throttle), ``N/A``."""
    found = set()
    for part in text.split("%")[0].strip("[]").split(","):
        if re.fullmatch(r"\d+", part):
            found.add(int(part))
        elif re.fullmatch(r"\d+-\d+", part):
            low, high = map(int, part.split("-"))
            found.update(range(low, high + 1))
    return found


def queued(out: Path) -> dict:
    """This folder's jobs Slurm still holds: ``{"shards": {index: state}, "merge": {job id: state}}``."""
    jobs = read_json(slurm_dir(out) / "jobs.json", [])
    if not jobs:
        return {"shards": {}, "merge": {}}
    arrays = {j["array"] for j in jobs}
    merges = {j["merge"] for j in jobs}
    text = _slurm(["squeue", "--noheader", f"--name={JOB_NAME}", "--format=%F|%K|%i|%T"], "squeue")
    shards, merge = {}, {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4:
            continue
        array_id, tasks, job_id, state = fields
        if state not in ACTIVE_STATES:
            continue
        if array_id in arrays:
            for index in _indices(tasks):
                shards[index] = state
        elif job_id in merges:
            merge[job_id] = state
    return {"shards": shards, "merge": merge}


# --- the shard task ---------------------------------------------------------------------------------------------

def gpu_model() -> str:
    """The model of the first GPU this task may use (NVML's name), or "cpu"; a folder name."""
    visible = schedule.visible_gpus()
    if not visible:
        return "cpu"
    name = gpu_facts.model(visible[0]) or gpu_facts.model("0") or "unknown GPU"  # a MIG slice: its card's
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "gpu"


def shard_settings(out: Path, index: int, plan: dict, model: str) -> pipeline.Settings:
    options = plan["options"]
    references = slurm_dir(out) / "references" / model
    labs = sorted({e["lab"] for e in plan["submissions"] if e["shard"] == index})  # its course needs no others
    return pipeline.Settings(out=shard_dir(out, index), labs=labs, students=options["students"],
                             gpus="auto" if options.get("gpus_per_task") else 0,
                             jobs_per_gpu=options.get("jobs_per_gpu"), cpu_workers=options.get("cpu_workers"),
                             cell_timeout=options["cell_timeout"], submission_timeout=options["submission_timeout"],
                             memory_bytes=options["memory_bytes"], sandbox=options["sandbox"],
                             progress=False,
                             feedback=False, shared_builds=references / "shared-builds")


def reference_runs(out: Path, labs: list, settings: pipeline.Settings, model: str) -> None:
    """The instructor's solutions through the clean recheck, once per GPU model: the first task on a model runs
    them (holding the model's lock, so the others wait for its builds), later ones find them saved. Each shard's
    ``reference`` folder links to its model's, where the pipeline finds them."""
    references = slurm_dir(out) / "references" / model
    with locked(references / "lock"):
        device = schedule.devices_for(settings.gpus, 1)[0]
        if settings.sandbox:  # builds a --no-sandbox shard could have written are made again (``unsandboxed``)
            unsandboxed.fresh_builds(settings.shared_builds, settings.out)
        # the pipeline's own reference run, pointed at the model's folder (it skips a lab saved there already);
        # the labs side by side, their timings taking the GPU in turn, as on one host
        shared = pipeline.Settings(**{**settings.__dict__, "out": references})
        shared.cpu_threads = max(1, schedule.available_cores() // max(1, len(labs)))
        lease = grading_lease(device, settings.cell_timeout) if device is not None else None
        with ThreadPoolExecutor(max_workers=max(1, len(labs))) as pool:
            ran = dict(zip(labs, pool.map(lambda lab: pipeline.reference_run(lab, shared, device, lease), labs)))
        # kept with the builds they made, as one host keeps them, so that every shard reuses them
        shared.shared_digests, changed = shared_builds.record(shared.shared_builds)
        if not changed:
            pipeline.keep_references(ran, shared)
    link = settings.out / "reference"
    if not link.is_symlink():
        shutil.rmtree(link, ignore_errors=True)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(references / "reference", target_is_directory=True)


def run_shard(out: Path, index: int) -> int:
    """Grade shard ``index`` (an array task): its reference runs if its GPU model has none yet, the pipeline on its
    zip (resuming what an earlier task of the shard graded), then ``done.json``."""
    out = Path(out).resolve()
    plan = read_json(slurm_dir(out) / "plan.json")
    if plan is None:
        raise SlurmError(f"no plan in {slurm_dir(out)}: submit with `fuselab grade SUBMISSIONS --slurm --out {out}`")
    folder = shard_dir(out, index)
    folder.mkdir(parents=True, exist_ok=True)
    archive = shard_zip(out, index)
    done = read_json(done_file(out, index))
    if done and done.get("zip_sha") == plan["zips"][str(index)]:
        print(f"shard {index} is already graded")
        return 0
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID") or "local"
    with open(attempts_file(out, index), "a") as log:
        log.write(json.dumps({"job": job, "task": os.environ.get("SLURM_ARRAY_TASK_ID"), "host": socket.gethostname(),
                              "started": _now(), "restart": int(os.environ.get("SLURM_RESTART_COUNT", 0))}) + "\n")
    done_file(out, index).unlink(missing_ok=True)
    if not plan["options"].get("gpus_per_task"):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU emulation: no GPU of the node's is this task's
    model = gpu_model()
    settings = shard_settings(out, index, plan, model)
    reference_runs(out, settings.labs, settings, model)
    result = pipeline.grade(archive, settings)
    write_json(done_file(out, index), {
        "shard": index, "zip_sha": plan["zips"][str(index)], "completion": uuid.uuid4().hex, "finished": _now(),
        "job": job,
        "host": socket.gethostname(), "gpu_model": model, "graded_now": result.graded_now,
        "seconds": result.phase_seconds, "workers": result.workers,
        "results": [[r.student, r.lab] for r in result.results],
        "problems": [asdict(p) for p in result.problems]})
    print(f"shard {index}: {len(result.results)} submission(s) graded ({result.graded_now} now) on {model}")
    return 0


# --- the merge job ----------------------------------------------------------------------------------------------

def attempts(out: Path, index: int) -> int:
    path = attempts_file(out, index)
    return len(path.read_text().splitlines()) if path.exists() else 0


def shard_states(out: Path, plan: dict, in_queue: dict | None) -> dict:
    """Each shard's state: done, running, pending, failed (its last task ended without finishing) or not
    started; ``in_queue`` from ``queued`` (None: Slurm not asked)."""
    states = {}
    for index in range(plan["shards"]):
        done = read_json(done_file(out, index))
        queue_state = (in_queue or {}).get("shards", {}).get(index)
        if done and done.get("zip_sha") == plan["zips"][str(index)]:
            states[index] = "done"
        elif queue_state:
            states[index] = "running" if queue_state in ("RUNNING", "COMPLETING", "CONFIGURING") else "pending"
        elif attempts(out, index):
            states[index] = "failed"
        else:
            states[index] = "not started"
    return states


def merge(out: Path) -> int:
    """The dependent job: merge complete shards into the class's outputs, or resubmit the shards that failed
    (each up to ``MAX_ATTEMPTS`` tasks) with a new merge job after them. 0: merged or resubmitted."""
    out = Path(out).resolve()
    with locked(slurm_dir(out) / "merge.lock"):
        plan = read_json(slurm_dir(out) / "plan.json")
        in_queue = queued(out)
        states = shard_states(out, plan, in_queue)
        missing = [i for i, s in states.items() if s != "done"]
        if missing:
            waiting = [i for i in missing if states[i] in ("running", "pending")]
            if waiting:
                print(f"shards {waiting} are still queued or running: their own merge job merges them")
                return 0
            spent = [i for i in missing if attempts(out, i) >= MAX_ATTEMPTS]
            if spent:
                print(f"shard(s) {spent} failed {MAX_ATTEMPTS} times: see {slurm_dir(out) / 'logs'}; after fixing "
                      "the cause, rerun the same `fuselab grade --slurm` command", file=sys.stderr)
                return 1
            record = submit_shards(out, plan, missing, reason=f"shard(s) {missing} ended unfinished")
            print(f"resubmitted shard(s) {missing}: array job {record['array']}, merge job {record['merge']}")
            return 0
        return merge_outputs(out, plan)


def merged_from(out: Path, plan: dict) -> dict:
    """The completions (each shard's ``done.json`` token) the outputs would be made from now, and the due dates and
    roster they would show (a rerun that changes either merges again)."""
    return {**{str(i): (read_json(done_file(out, i)) or {}).get("completion") for i in range(plan["shards"])},
            "due": plan["options"].get("due") or {}, "roster": plan["options"].get("roster_sha")}


def _kept_in_course(out: Path, student: str, lab: str, saved: Path, result: SubmissionResult) -> SubmissionResult:
    """A shard's result, kept where a one-host run keeps it (``<out>/work/<student>/<lab>``): later runs into this
    folder (next week's lab), hand grades and ``fuselab export`` read the course's results there, never from the
    shards. A result there that was written after the shard's (a one-host regrade of that student since) stays,
    and is the one the outputs show: a merge run again for a new roster or due date never undoes it."""
    target, graded = out / "work" / student / lab / "result.json", saved.stat()
    try:
        if target.stat().st_mtime > graded.st_mtime:
            return SubmissionResult.from_json(json.loads(target.read_text()))
    except (OSError, ValueError, TypeError, AttributeError):
        pass  # none there, or none readable: the shard's
    target.parent.mkdir(parents=True, exist_ok=True)
    pipeline._write_result(target, result)
    os.utime(target, (graded.st_atime, graded.st_mtime))  # as old as the grading it records
    return result


def _submitted_roster(out: Path, sha: str | None) -> list | None:
    """The people of the roster given with the plan's submit (None: none given), from its copy."""
    if not sha:
        return None
    copy = roster_copy(out, sha)
    if not copy.is_file() or _sha(copy) != sha:
        raise RuntimeError(f"{copy}, the --roster this class was submitted with, is missing or changed: rerun the "
                           "same `fuselab grade --slurm` command with --roster to merge again")
    return roster.read(copy)


def merge_outputs(out: Path, plan: dict) -> int:
    """Every shard is complete: the class's gradebook, grades.csv, feedback and report, once per set of
    completions (``merged.json``)."""
    completions = merged_from(out, plan)
    if (read_json(slurm_dir(out) / "merged.json") or {}).get("from") == completions:
        print("already merged")
        return 0
    try:  # the course folder is one host's too (a regrade there, next week's lab): one run writes it at a time
        lock = pipeline.lock_out(out)
    except pipeline.GradingRefused as refused:
        print(f"not merged: {refused}; then rerun the same `fuselab grade --slurm` command", file=sys.stderr)
        return 1
    try:
        return _merge_locked(out, plan, completions)
    finally:
        lock.release()


def _merge_locked(out: Path, plan: dict, completions: dict) -> int:
    options = plan["options"]
    results, models, graded_now, seen = {}, set(), 0, set()
    problems = [intake.Problem(**p) for p in plan["problems"]]
    for index in range(plan["shards"]):
        done = read_json(done_file(out, index))
        models.add(done["gpu_model"])
        graded_now += done["graded_now"]
        problems += [intake.Problem(**p) for p in done["problems"]]
        for student, lab in done["results"]:
            if (student, lab) in seen:
                raise RuntimeError(f"{student}/{lab} was graded in two shards: the plan is damaged; regrade with "
                                   "--force")
            seen.add((student, lab))
            saved = shard_dir(out, index) / "work" / student / lab / "result.json"
            saved_result = read_json(saved)
            if saved_result is None:
                raise RuntimeError(f"{saved} is missing or unreadable although shard {index} finished: delete "
                                   f"{done_file(out, index)} and rerun the command to regrade it")
            results[(student, lab)] = _kept_in_course(out, student, lab, saved,
                                                      SubmissionResult.from_json(saved_result))
    if not options["sandbox"] or any(unsandboxed.marked(shard_dir(out, i)) for i in range(plan["shards"])):
        # the copies just made of results a --no-sandbox submission could have written: marked after them, so a
        # sandboxed run into this folder never believes their claim of a sandboxed grading (``unsandboxed``)
        unsandboxed.mark(out)
    reference = {}
    for model in sorted(models):
        for lab in sorted({lab for _, lab in results}):
            saved = read_json(slurm_dir(out) / "references" / model / "reference" / lab / "reference.json")
            if saved is not None:
                reference[lab if len(models) == 1 else f"{lab} on {model}"] = saved
    settings = pipeline.Settings(out=out, labs=options["labs"], feedback=options["feedback"])
    labs = [lab for lab in course.lab_names() if not options["labs"] or lab in options["labs"]]  # as on one host
    people = _submitted_roster(out, options.get("roster_sha"))
    nbgrader_run.prepare_course(out / "course", labs)
    nbgrader_run.set_due_dates(out / "course" / "gradebook.db", pipeline._due_dates(options.get("due") or {}))
    nbgrader_run.add_students(out / "course" / "gradebook.db", sorted({e["student"] for e in plan["submissions"]}))
    first = read_json(done_file(out, 0))
    class_result = pipeline.ClassResult(out=out, results=[results[k] for k in sorted(results)], problems=problems,
                                        reference=reference, graded_now=graded_now, workers=first["workers"])
    # the course's record of every entry, as a one-host run keeps it (term.py)
    merged = [intake.Submission(e["student"], e["lab"], Path("."), e.get("origin", ""), late=e.get("late", False),
                                lms_id=e.get("lms_id"), lms=e.get("lms"), submitted=e.get("submitted"))
              for e in plan["submissions"]]  # the staged notebooks are the shards' (the plan keeps no path)
    run_labs = options["labs"] or {e["lab"] for e in plan["submissions"]} | {p.lab for p in problems if p.lab}
    pipeline._moodle_ids(settings, people)  # a Moodle worksheet's people get their ids by email, as on one host
    term.record_course(out, merged, set(results), problems, run_labs, people)
    pipeline.write_outputs(class_result, settings)
    write_json(slurm_dir(out) / "merged.json", {"from": completions, "merged": _now(), "results": len(results),
                                                "gpu_models": sorted(models)})
    print(f"merged {plan['shards']} shard(s), {len(results)} submission(s): {out / 'grades.csv'}")
    return 0


# --- the commands -----------------------------------------------------------------------------------------------

def _merged(out: Path, plan: dict) -> bool:
    """The class's outputs were merged from the shards' current completions."""
    return (read_json(slurm_dir(out) / "merged.json") or {}).get("from") == merged_from(out, plan)


def submit(source, out: Path, options: Options, force: bool = False, roster_file: Path | None = None) -> str:
    """``fuselab grade SUBMISSIONS --slurm``: plan (once) and submit what is missing; what was done, in words.
    ``roster_file``: ``--roster``, read here (an unreadable one stops the run before anything is submitted) and
    copied beside the plan for the merge; without it, a roster given before stays the class's."""
    out = Path(out).resolve()
    pipeline.check_due(out, options.due, options.students)  # a --due that is no lab or no date stops it here
    settings = pipeline.Settings(out=out, labs=options.labs, students=options.students, roster=roster_file)
    try:
        people = roster.read(roster_file) if roster_file else None
        moodle_ids = pipeline._moodle_ids(settings, people)
    except (OSError, roster.RosterError) as exc:
        raise ValueError(f"--roster: {exc}") from None
    pipeline.check_identities(Path(source), settings)  # a Moodle lab that would make the course's students new ones
    out.mkdir(parents=True, exist_ok=True)
    with locked(slurm_dir(out) / "submit.lock"):
        if roster_file:  # by its hash: a plan that names another copy still finds its own
            options.roster_sha = _sha(roster_file)
            copy = roster_copy(out, options.roster_sha)
            temporary = copy.with_name(f".{copy.name}.{os.getpid()}.tmp")
            shutil.copyfile(roster_file, temporary)
            os.replace(temporary, copy)
        plan = read_json(slurm_dir(out) / "plan.json")
        in_queue = queued(out) if plan else {"shards": {}, "merge": {}}
        busy = in_queue["shards"] or in_queue["merge"]
        if plan and not force:  # a rerun must not mix two classes, whatever the queue holds
            why = same_class(plan, source, options, moodle_ids, term.canvas_ids(out))
            if why:
                raise ValueError(f"{why}: grade them into a new --out, or add --force to regrade the class in {out}")
        if plan and busy:
            if not force and not in_queue["shards"] and _merged(out, plan):
                # the merge is written (merged.json comes last); its job is only still leaving the queue
                return f"every shard is graded and merged: {out / 'grades.csv'}"
            return "this folder's jobs are still queued or running; nothing submitted\n" + status_text(out)
        if plan and force:
            for index in range(plan["shards"]):
                remove_tree(shard_dir(out, index))  # a shard's work: what its submissions left, of any depth
                for path in (shard_zip(out, index), done_file(out, index), attempts_file(out, index)):
                    path.unlink(missing_ok=True)
            shutil.rmtree(slurm_dir(out) / "references", ignore_errors=True)  # as on one host: run again
            (slurm_dir(out) / "merged.json").unlink(missing_ok=True)
            (slurm_dir(out) / "plan.json").unlink()
            plan = None
        if plan:
            plan["options"].update({k: v for k, v in asdict(options).items() if k not in options.grading()})
            write_json(slurm_dir(out) / "plan.json", plan)  # sbatch options may change between runs
        else:
            # as on one host: an upload older than the one graded is not graded over it, unless --force names them
            forced = options.students if force and options.students else ()
            plan = write_plan(out, source, options, moodle_ids, term.graded_uploads(out, keep_out=forced), people)
        states = shard_states(out, plan, None)
        missing = [i for i, s in states.items() if s != "done"]
        if missing:
            record = submit_shards(out, plan, missing, reason="submitted" if len(jobs_of(out)) == 0 else "rerun")
            return (f"{len(plan['submissions'])} submission(s) in {plan['shards']} shard(s); submitted shard(s) "
                    f"{_ranges(missing)} as array job {record['array']}, merge job {record['merge']} after it.\n"
                    f"Follow it with `fuselab grade --status {out}`.")
        if _merged(out, plan):
            return f"every shard is graded and merged: {out / 'grades.csv'}"
        record = submit_merge(out, plan)
        return f"every shard is graded; submitted the merge job {record['merge']}"


def submit_merge(out: Path, plan: dict) -> dict:
    logs = slurm_dir(out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    merge_job = _slurm(["sbatch", "--parsable", *sbatch_options(out, plan["options"]),
                        f"--output={logs}/merge-job-%j.log", "--wrap", _python("merge", out)],
                       "sbatch (the merge job)").strip().split(";")[0]
    record = {"array": None, "merge": merge_job, "shards": [], "submitted": _now(), "reason": "merge only"}
    with locked(slurm_dir(out) / "jobs.lock"):
        write_json(slurm_dir(out) / "jobs.json", jobs_of(out) + [record])
    return record


def jobs_of(out: Path) -> list:
    return read_json(slurm_dir(out) / "jobs.json", [])


def _ranges(indices) -> str:
    indices = sorted(indices)
    parts, start = [], None
    for i, value in enumerate(indices):
        start = value if start is None else start
        if i + 1 == len(indices) or indices[i + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ",".join(parts)


def status(out: Path) -> dict:
    """What is done, running, pending and failed in ``out``, as data (``status_text`` says it in words)."""
    out = Path(out).resolve()
    plan = read_json(slurm_dir(out) / "plan.json")
    if plan is None:
        raise ValueError(f"{out} holds no Slurm grading run (no {slurm_dir(out) / 'plan.json'})")
    try:
        in_queue, note = queued(out), None
    except SlurmError as exc:
        in_queue, note = None, f"Slurm not asked: {exc}"
    states = shard_states(out, plan, in_queue)
    per_state = {}
    for index, state in states.items():
        per_state.setdefault(state, []).append(index)
    graded = sum(1 for i in range(plan["shards"])
                 for _ in (read_json(done_file(out, i)) or {}).get("results", [])) + \
        sum(len(list(shard_dir(out, i).glob("work/*/*/result.json"))) for i, s in states.items() if s != "done")
    merged = read_json(slurm_dir(out) / "merged.json")
    return {"out": str(out), "shards": plan["shards"], "submissions": len(plan["submissions"]), "states": states,
            "by_state": per_state, "graded": graded, "attempts": {i: attempts(out, i) for i in states},
            "merged": bool(merged and merged.get("from") == merged_from(out, plan)),
            "merge_jobs": (in_queue or {}).get("merge", {}), "note": note}


def status_text(out: Path) -> str:
    s = status(out)
    lines = [f"{s['out']}: {s['submissions']} submission(s) in {s['shards']} shard(s), {s['graded']} graded"]
    for state in ("done", "running", "pending", "failed", "not started"):
        if s["by_state"].get(state):
            lines.append(f"  {state:<11} shard(s) {_ranges(s['by_state'][state])}")
    for index in s["by_state"].get("failed", []):
        logs = sorted((slurm_dir(out) / "logs").glob(f"shard-{index}-job-*.log"))
        lines.append(f"    shard {index}: {s['attempts'][index]} task(s) started, none finished"
                     f"{'; last log ' + str(logs[-1]) if logs else ''}")
    if s["merge_jobs"]:
        lines.append("  merge job " + ", ".join(f"{j} {state.lower()}" for j, state in s["merge_jobs"].items()))
    lines.append(f"  merged: {Path(s['out']) / 'grades.csv'}" if s["merged"] else "  not merged yet")
    if s["note"]:
        lines.append(f"  ({s['note']})")
    return "\n".join(lines)


def main_cli(args, due: dict | None = None) -> int:
    """``fuselab grade --slurm ...`` and ``fuselab grade --status OUT`` (the arguments are cli.py's; ``due``: its
    ``--due``, read)."""
    try:
        if args.status:
            print(status_text(Path(args.status)))
            return 0
        return _submit_from_cli(args, due or {})
    except (SlurmError, ValueError, FileNotFoundError, pipeline.GradingRefused) as exc:
        raise SystemExit(f"fuselab grade: {exc}") from None


def _submit_from_cli(args, due: dict) -> int:
    if not args.submissions or not args.out:
        raise SystemExit("fuselab grade --slurm needs the submissions and --out, a folder on a file system every "
                         "node of the cluster sees")
    options = Options(labs=args.labs, students=args.students, cell_timeout=args.cell_timeout,
                      submission_timeout=args.submission_timeout, memory_bytes=int(args.memory_gb * 2**30),
                      sandbox=args.sandbox, feedback=not args.no_feedback,
                      jobs_per_gpu=args.jobs_per_gpu,
                      cpu_workers=args.cpu_workers, shards=args.shards, partition=args.partition,
                      account=args.account, gpus_per_task=args.gpus_per_task, cpus_per_task=args.cpus_per_task,
                      time=args.time, sbatch_args=shlex.split(args.sbatch_args or ""), due=due)
    print(submit(args.submissions, Path(args.out), options, force=args.force,
                 roster_file=Path(args.roster) if args.roster else None))
    return 0


def main(argv=None) -> int:
    """The jobs' entry point: ``python -m fuselab.grading.run.slurm shard OUT`` (an array task; its index from
    ``SLURM_ARRAY_TASK_ID``, or given) and ``... merge OUT``."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m fuselab.grading.run.slurm")
    parser.add_argument("step", choices=["shard", "merge"])
    parser.add_argument("out")
    parser.add_argument("index", nargs="?", type=int)
    args = parser.parse_args(argv)
    if args.step == "merge":
        return merge(Path(args.out))
    index = args.index if args.index is not None else os.environ.get("SLURM_ARRAY_TASK_ID")
    if index is None:
        parser.error("shard: give the shard's index, or run as an array task (SLURM_ARRAY_TASK_ID)")
    return run_shard(Path(args.out), int(index))


if __name__ == "__main__":
    sys.exit(main())
