"""``fuselab grade``: intake → per submission (the clean recheck) → gradebook, feedback, report.

Every submission's outcome is written to ``<out>/work/<student>/<lab>/result.json`` as soon as it is graded, so
a run that stops resumes where it stopped (``force=True`` regrades this run's submissions). ``out`` is the term's
course folder (``term``): every run adds to it, and its outputs show the whole course, so a run over some students
or labs changes exactly their rows. A submission whose notebook changed since
its result was written is graded again, and so is one graded with less containment than this run's (a result
graded without the sandbox is not kept by a sandboxed run).

Grading is sandboxed by default (``isolate.sandboxed``): a run whose sandbox does not work is refused before
anything is written (``GradingRefused``), and a sandbox that stops working during the run stops it before the
submission's result is saved. One run at a time per ``--out`` (a lock file naming the other run's pid); an
``--out`` inside the course's folders or the submissions is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ... import course, locks
from ... import notebook as ipynb
from ...kernelbuild import shared as shared_builds
from ...labs import registry
from ..outputs import feedback, report, terminal
from ..records import handgrading, intake, nbgrader_run, reference_cache, roster, term, unsandboxed
from ..sandbox import isolate
from ..recheck import clean as recheck
from . import build_ahead, run_progress
from ..gpus import schedule
from ..gpus.lease import grading_lease
from ..records.results import CellResult, SubmissionResult
from ..records.whole import write_whole
from ..outputs.terminal import shown
from ..sandbox.untrusted import Folder, remove_tree

RUNS = course.GRADER / "runs"


@dataclass
class Settings:
    out: Path
    labs: list | None = None
    students: list | None = None
    force: bool = False
    gpus: object = "auto"
    jobs_per_gpu: int | None = None     # submissions sharing a GPU (timings still get it alone); None: by CPU count
    cpu_workers: int | None = None     # submissions at once without a GPU; None: one per core (memory permitting)
    cell_timeout: float = 300.0        # a test's own time (recheck: CPU time per thread, or wall if less)
    submission_timeout: float = 1200.0
    cell_wall_timeout: float | None = None        # the wall-clock backstops (default: recheck.WALL_BACKSTOP times
    submission_wall_timeout: float | None = None  # the limits); a test stopped by one is retried alone
    memory_bytes: int = 16 * 2**30
    sandbox: bool = True               # False only on an explicit --no-sandbox
    progress: bool = True
    feedback: bool = True
    shared_builds: Path | None = None   # default: <out>/shared-builds (the instructor's builds, made first)
    cpu_threads: int | None = None      # CPU threads per child (set from the number of workers by ``grade``)
    roster: Path | None = None          # the LMS's class list (CSV), kept in the course folder for later runs
    due: dict = field(default_factory=dict)  # lab → due date (ISO 8601), kept in the course's gradebook
    shared_digests: dict | None = None  # the shared builds' sha256, recorded after the reference runs
    remeasure_references: bool = False  # run the reference runs again even where the course folder keeps them


@dataclass
class ClassResult:
    out: Path
    results: list                 # SubmissionResults (see grade_submission)
    problems: list                # intake problems
    reference: dict = field(default_factory=dict)   # lab → the instructor's own solution through the clean recheck
    report: Path | None = None
    grades_csv: Path | None = None
    feedback: dict = field(default_factory=dict)          # lab → student → the feedback page
    feedback_problems: list = field(default_factory=list)  # (student, lab, what its page could not show)
    phase_seconds: dict = field(default_factory=dict)  # reference runs, submissions, feedback and report
    phase_spans: dict = field(default_factory=dict)    # the same phases as (start, end) in time.monotonic()
    phase_cpu: dict = field(default_factory=dict)      # the same phases' CPU seconds: the grader and its children
    graded_now: int = 0           # submissions graded in this run (the others were graded before: resumed)
    workers: list = field(default_factory=list)  # the worker slots (``schedule.workers_for``): a device each
    standings: list = field(default_factory=list)  # the whole course's (student, lab)s (``term.standings``)
    hand_grades_set_aside: list = field(default_factory=list)  # by new uploads (``nbgrader_run.SetAside``)


class GradingRefused(RuntimeError):
    """The run cannot start (or go on) safely: nothing was graded or saved for what it refused."""


class UnknownNames(GradingRefused):
    """A ``--students`` or ``--labs`` name the submissions or the course do not have (listed in the message)."""


LOCK_NAME = ".fuselab-grading.lock"


def lock_out(out: Path):
    """Hold ``<out>/.fuselab-grading.lock`` for this run (released when the process ends, however it ends); the
    caller ``release()``s it. Another run holding it, or anything but a lock file there, refuses the run."""
    path = out / LOCK_NAME
    try:
        lock = locks.file_lock(path, write_pid=True)
        lock.acquire(blocking=False)
    except locks.Timeout:
        raise GradingRefused(f"another grading run (pid {locks.holder(path)}) is using {out}: wait for it to "
                             "finish, or give this one another --out") from None
    except OSError as exc:  # a link, a FIFO, ... planted where the lock goes (``locks``)
        raise GradingRefused(f"cannot lock {out}: {exc}") from None
    return lock


def check_out(out: Path, source: Path) -> None:
    """Refuse an ``--out`` inside the course's folders or the submissions (grading would write into what it
    reads, and recurse)."""
    out = Path(out).resolve()
    source = Path(source).resolve()
    course_folders = {"solutions/": course.SOLUTIONS, "labs/": course.LABS,
                      "the submissions": source if source.is_dir() else None}
    for name, folder in course_folders.items():
        if folder is not None and (out == folder.resolve() or folder.resolve() in out.parents):
            raise GradingRefused(f"--out {out} is inside {name} ({folder}): choose a folder outside the course's "
                                 "folders and the submissions (the default is grader/runs/term)")


def check_sandbox(settings: Settings) -> None:
    """Refuse to grade where the sandbox does not work: checked as it is used, a command of the same builder
    (``isolate.sandboxed``) run by ``isolate.Child`` with this run's limits and environment."""
    if not settings.sandbox:
        return
    problem = isolate.sandbox_problem(_limits(settings), env=isolate.worker_env(os.environ))
    if problem:
        who = "root" if os.geteuid() == 0 else "a user other than root, which needs a kernel that allows " \
            "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or AppArmor's " \
            "kernel.apparmor_restrict_unprivileged_userns=0)"
        raise GradingRefused(f"the sandbox does not work here, so nothing was graded: {problem}. Grading as "
                             f"{who}: fix that (a bubblewrap that can create user namespaces, and a Python "
                             "this user can run), or grade with --no-sandbox, where submissions run with your "
                             "rights (README: trust model)")


def _write_result(path: Path, result: SubmissionResult) -> None:
    """Written whole or not at all, replacing (never following) whatever is at ``path``."""
    write_whole(path, json.dumps(result.to_json(), indent=1))


def _kept(previous: dict, saved: Path, sub, settings: Settings) -> bool:
    """Whether resume keeps a saved result: same notebook, graded with at least this run's containment (a claim
    of the sandbox believed only where no ``--no-sandbox`` run could have forged it: ``unsandboxed``)."""
    if previous.get("notebook_sha") != _sha(sub.notebook):
        return False
    if not settings.sandbox:
        return True
    return previous.get("sandbox") is True and unsandboxed.believed(saved, settings.out)


def default_out() -> Path:
    """The term's course folder when no ``--out`` is given: one, so every run adds to the same gradebook."""
    return RUNS / "term"


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _limits(settings: Settings) -> isolate.Limits:
    """Every graded child's limits (and the sandbox check's): no network (bubblewrap's own namespace in the
    sandbox, the keeper's outside it), its memory counting its private tmpfs, its processes and disk watched."""
    return isolate.Limits(wall_s=settings.submission_timeout, cpu_s=int(settings.submission_timeout * 4) + 60,
                          memory_bytes=settings.memory_bytes, no_network=True)


def _base_env(settings: Settings, workdir: Path, device) -> dict:
    """A graded child's environment: only what a worker needs, by name (``isolate.WORKER_ENV``), never the TA's
    other variables, sandbox or not."""
    env = isolate.worker_env(os.environ)
    env.update(FUSELAB_GRADING="1", FUSELAB_CACHE_DIR=str(workdir / "cache"),
               FUSELAB_SHARED_BUILDS=str(settings.shared_builds / "builds"), MPLBACKEND="Agg")
    env.pop("FUSELAB_GRADE_LOG", None)
    env.pop("FUSELAB_GRADER_ANSWERS_FD", None)  # only the checker gets one: the pipe its grader opened for it
    env.pop("FUSELAB_GPU_SHARED", None)
    _share_cpus(env, settings.cpu_threads)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(device)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's device numbers = nvidia-smi's and NVML's
    return env


def _hidden_folders(settings: Settings, source: Path) -> list:
    """What a sandboxed submission must not see: the whole run folder and the class's submissions (a folder, or the
    zip itself: the folder a zip lies in may be the course's own checkout, which the sandbox must show)."""
    return [settings.out, Path(source).resolve()]


def check_source(source: Path, settings: Settings) -> None:
    """Refuse a submissions folder that holds the course's own files (the checkout, the Python environment): a
    sandbox hides the submissions, and could then not show what it runs."""
    if not settings.sandbox or not Path(source).is_dir():
        return
    folder = Path(source).resolve()
    inside = [r for r in isolate.runtime_folders() if r == folder or folder in r.parents]
    if inside:
        raise GradingRefused(f"the submissions folder {shown(folder)} holds the course's own files ({shown(inside[0])}):"
                             " put the class's submissions (or the LMS zip) in a folder of their own, outside it")


@dataclass
class SubmissionRun:
    """One submission being graded: each step of ``SUBMISSION_STEPS`` reads what the steps before it found and
    adds its own part."""

    sub: intake.Submission
    device: object
    settings: Settings
    source: Path
    lease: object = None
    workdir: Path | None = None
    started: float = 0.0
    graded_sha: str = ""
    limits: isolate.Limits | None = None
    hide: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    instructor: dict | None = None
    reference_s: float | None = None  # the lab's reference run, in seconds (``retry_overruns``)
    clean: recheck.CleanResult | None = None
    result: SubmissionResult | None = None


def prepare(run: SubmissionRun) -> None:
    """A fresh folder, the notebook's hash before any of its code runs (feedback shows the notebook only if it is
    unchanged), the limits and hidden folders, the grader's notes so far, the instructor's notebook."""
    run.workdir = run.settings.out / "work" / run.sub.student / run.sub.lab
    run.graded_sha = _sha(run.sub.notebook)
    run.workdir.parent.mkdir(parents=True, exist_ok=True)
    remove_tree(run.workdir)  # an earlier run's: what a submission left there may be of any depth or kind
    run.workdir.mkdir()
    run.started = time.monotonic()
    run.limits = _limits(run.settings)
    run.hide = _hidden_folders(run.settings, run.source) if run.settings.sandbox else []
    run.notes = list(run.sub.warnings)
    gpu_note = _idle(run.device, run.lease)
    if gpu_note:
        run.notes.append(gpu_note)
    digests = run.settings.shared_digests
    changed = shared_builds.changed(run.settings.shared_builds, digests) if digests else []
    if changed:  # its processes refuse them too (``fuselab.kernelbuild.shared``): this tells the TA
        run.notes.append(shared_builds.note(changed))
    lab = run.sub.lab
    run.instructor = json.loads((course.SOLUTIONS / lab / nbgrader_run.notebook_name(lab)).read_text())


def _time_limits(settings: Settings) -> dict:
    return dict(cell_timeout=settings.cell_timeout, total_timeout=settings.submission_timeout,
                wall_timeout=settings.cell_wall_timeout, total_wall_timeout=settings.submission_wall_timeout)


def clean_recheck(run: SubmissionRun, on_cell=None) -> None:
    """The verdicts: the instructor's notebook in the checker, the student's code in its workers (``recheck``)."""
    settings = run.settings
    run.clean = recheck.run_clean(run.instructor, json.loads(Path(run.sub.notebook).read_text()),
                                  run.workdir / "clean", **_time_limits(settings), limits=run.limits,
                                  env=_base_env(settings, run.workdir / "clean", run.device), device=run.device,
                                  sandbox=settings.sandbox, hide=run.hide, lease=run.lease, on_cell=on_cell)


class _Alone:
    """The submissions' graded runs share the machine (``sharing``); a retry of tests that ran past a wall-clock
    limit runs with none of them (``alone``): it waits for those running to end, and for ``DRAIN_HOLD_S`` none
    starts meanwhile; after that they start again (one running long, a second submission of the same student's
    say, holds only this retry up, which then has the machine once the class's runs end)."""

    DRAIN_HOLD_S = 60.0

    def __init__(self):
        self._changed = threading.Condition()
        self._running = 0
        self._waiting: dict = {}  # retries waiting for the machine → since when (monotonic)
        self._holder = None       # the retry that has it, while it does

    def _drain_left(self) -> float:
        """Seconds until no waiting retry holds new runs back any longer (0: none does)."""
        now = time.monotonic()
        return max([0.0, *(since + self.DRAIN_HOLD_S - now for since in self._waiting.values())])

    @contextlib.contextmanager
    def sharing(self):
        with self._changed:
            while self._holder is not None or self._drain_left() > 0:
                # a drain's hold ends by the clock, not by a notify: woken then at the latest
                self._changed.wait(timeout=self._drain_left() or None)
            self._running += 1
        try:
            yield
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def alone(self, hold_s: float | None = None):
        """The machine without the others; after ``hold_s`` (where given) they may start again while this one
        goes on, as one of them (another retry waits for it to end)."""
        me = object()
        with self._changed:
            self._waiting[me] = time.monotonic()
            self._changed.wait_for(lambda: self._holder is None and not self._running)
            del self._waiting[me]
            self._holder = me
        timer = threading.Timer(hold_s, self._let_go, (me, True)) if hold_s is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()
            if not self._let_go(me, False):
                with self._changed:  # let go early: it ran on as one of those sharing the machine
                    self._running -= 1
                    self._changed.notify_all()

    def _let_go(self, holder, sharing_on: bool) -> bool:
        """End ``holder``'s hold, if it still has it (``sharing_on``: it goes on as one running); whether it had."""
        with self._changed:
            if self._holder is not holder:
                return False
            self._holder = None
            self._running += sharing_on
            self._changed.notify_all()
            return True


ALONE = _Alone()  # one per grader process: "alone" means no other submission of this grader is running


# Only a failure's own words say the GPU ran out of memory, and a submission writes them: a retry they alone
# asked for holds the others at most ``MEMORY_RETRY_HOLD`` times the lab's reference run (the instructor's whole
# notebook, timed by the grader), ``MEMORY_RETRY_MIN_S`` at least, and then goes on beside them. One for a
# wall-clock overrun, which the grader's own clocks saw, holds them to its end.
MEMORY_RETRY_HOLD = 1.0
MEMORY_RETRY_MIN_S = 30.0


def memory_retry_hold_s(reference_s) -> float:
    """How long a retry that only a failure's words asked for has the machine alone, from the reference run's
    seconds (None or nonsense: the least)."""
    if isinstance(reference_s, (int, float)) and not isinstance(reference_s, bool) and 0 < reference_s < 1e6:
        return max(MEMORY_RETRY_MIN_S, MEMORY_RETRY_HOLD * float(reference_s))
    return MEMORY_RETRY_MIN_S


def retry_overruns(run: SubmissionRun) -> None:
    """Tests a wall-clock limit stopped (a busy machine may have starved them, ``recheck``) run again, alone, with
    a longer backstop, before they can score 0; their verdicts say so (``CellVerdict.retry``). Tests whose failure
    said the GPU ran out of memory too, alone for at most ``memory_retry_hold_s``."""
    due = run.clean.retries_due
    if not due:
        return
    settings = run.settings
    asked_by_words = all(run.clean.cells[g].retry.get("first_try") == recheck.GPU_MEMORY_RAN_OUT for g in due)
    with ALONE.alone(memory_retry_hold_s(run.reference_s) if asked_by_words else None):
        recheck.retry_overruns(run.clean, run.instructor, json.loads(Path(run.sub.notebook).read_text()),
                               run.workdir / "retry", **_time_limits(settings), limits=run.limits,
                               env=_base_env(settings, run.workdir / "retry", run.device), device=run.device,
                               sandbox=settings.sandbox, hide=run.hide, lease=run.lease)


def graded_runs(run: SubmissionRun) -> None:
    """The clean recheck, whose verdicts are the grade, sharing the machine with the other submissions."""
    with ALONE.sharing():
        clean_recheck(run)


def combine_runs(run: SubmissionRun) -> None:
    run.result = combine(run.sub, run.clean, run.notes, hand_graded=hand_graded(run.instructor))


def hand_graded(instructor: dict) -> list:
    """The grade ids a person scores in formgrader, by nbgrader's own rule: tasks, and graded cells that are not
    autograder tests (a graded solution cell, or a graded markdown cell)."""
    return [ipynb.grade_id(cell) for cell in instructor.get("cells", [])
            if ipynb.grade_id(cell) and ipynb.is_hand_graded(cell)]


def scrub_messages(run: SubmissionRun) -> None:
    """A failed test's message is text the student's code can shape: what it quotes of the hidden tests or of this
    environment (which the runs had) is cut before anything keeps it (the feedback page checks again)."""
    scrub = feedback.MessageScrub(feedback.hidden_test_lines(run.instructor), environ=os.environ)
    for cell in run.result.cells.values():
        cell.message = scrub(cell.message or "")


def stamp(run: SubmissionRun) -> None:
    result, sub = run.result, run.sub
    result.device, result.seconds, result.notebook_sha = run.device, time.monotonic() - run.started, run.graded_sha
    result.notebook, result.origin, result.sandbox = str(sub.notebook), sub.origin, run.settings.sandbox


def sandbox_held(run: SubmissionRun) -> None:
    """What ran may have failed for the sandbox, not the student: if it stopped working, nothing is saved."""
    if run.settings.sandbox:
        problem = isolate.sandbox_problem(run.limits, env=isolate.worker_env(os.environ))
        if problem:
            raise GradingRefused(f"the sandbox stopped working while {run.sub.student}/{run.sub.lab} was graded: "
                                 f"{problem}")


def save(run: SubmissionRun) -> None:
    _write_result(run.workdir / "result.json", run.result)


# what the sandboxes of a submission wrote (its checker's and workers' folders, their build caches): removed once
# it is graded, never following a link. Kept: result.json
LEFTOVERS = ("clean", "retry")


def tidy(run: SubmissionRun) -> None:
    if run.workdir is None:
        return
    with Folder(run.workdir) as box:
        for name in LEFTOVERS:
            try:
                box.remove(name)
            except OSError as exc:  # what is left costs disk, not a grade
                run.notes.append(f"could not remove {name} from the submission's folder after grading: {exc}")


SUBMISSION_STEPS = (prepare, graded_runs, retry_overruns, combine_runs, scrub_messages, stamp, sandbox_held, save)


def grade_submission(sub: intake.Submission, device, settings: Settings, source: Path,
                     lease=None, reference_s: float | None = None) -> SubmissionResult:
    """Grade one submission through ``SUBMISSION_STEPS``: its result, also saved as its ``result.json``.

    ``lease``: the GPU's ``lease.DeviceLease`` when other submissions share the GPU. ``reference_s``: the lab's
    reference run's seconds (bounds a retry for memory, ``retry_overruns``).
    """
    run = SubmissionRun(sub, device, settings, Path(source), lease, reference_s=reference_s)
    try:
        for step in SUBMISSION_STEPS:
            step(run)
    finally:
        tidy(run)  # also after a grader error: nothing a sandbox left is kept
    return run.result


def _share_cpus(env: dict, threads: int | None) -> None:
    """Each child's share of the CPU cores: torch (OpenMP) and the emulation's OpenMP would otherwise each start a
    thread per core in every process running at once, and spin against each other.

    And no spinning between parallel regions (``OMP_WAIT_POLICY=PASSIVE``): a submission's three processes take
    turns (the checker waits on a worker's pipe and back), so the threads of the one that just handed over spun
    on the cores the other one needed. On the 2-core machine, a copy and a sum of 100,000 floats with two threads
    took 1.56 ms of CPU spinning against other work, 0.16 ms passive; no result depends on it."""
    if threads and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    if "OMP_WAIT_POLICY" not in os.environ:  # a teaching assistant's own setting wins
        env["OMP_WAIT_POLICY"] = "PASSIVE"


def _threads_per_child(concurrent: int) -> int:
    return max(1, schedule.available_cores() // max(1, concurrent))


def _idle(device, lease=None) -> str:
    """Kill leftovers of earlier submissions on this GPU; note a GPU that other programs keep busy."""
    if device is None:
        return ""
    idle, note = isolate.wait_for_idle_gpu(device, timeout_s=15, own_pids=(os.getpid(),),
                                           sharing=lease.pids if lease else None)
    return "" if idle else note


def combine(sub, clean: recheck.CleanResult, notes: list, hand_graded=()) -> SubmissionResult:
    """The final result: the clean recheck's points. ``hand_graded``: the grade ids a person scores
    (``manual_cells``)."""
    cells = {}
    for grade_id, verdict in clean.cells.items():
        entry = CellResult.from_verdict(verdict)
        if verdict.retry:  # ran past a wall-clock limit: what the first try was, and what the retry alone gave
            entry.retry = dict(verdict.retry)
        cells[grade_id] = entry
    return SubmissionResult(
        student=sub.student, lab=sub.lab, cells=cells, total=sum(c.points for c in cells.values()),
        max_total=sum(c.max_points for c in cells.values()), manual_cells=sorted(set(hand_graded) - set(cells)),
        flags=clean.flags, notes=notes, restarts=clean.restarts, clean_seconds=clean.seconds,
        gpu_wait_seconds=clean.gpu_wait_s, gpu_held_seconds=clean.gpu_held_s, gpu_holds=clean.gpu_holds,
        clean_timeline=clean.timeline, clean_cpu=clean.cpu_timeline)


def reference_run(lab: str, settings: Settings, device=None, lease=None) -> dict:
    """The instructor's own solution through the clean recheck, by the trusted grader, before any student.

    It fills the shared build cache (the lab's reference kernels, the starter and solution kernels) and proves
    the grading machine works: every correctness test must pass. A run kept in the course folder is reused while
    nothing it depends on changed (``reference_cache``), unless ``settings.remeasure_references``; ``--force``
    regrades submissions, not the references.
    """
    path = course.SOLUTIONS / lab / nbgrader_run.notebook_name(lab)
    nb = json.loads(path.read_text())
    workdir = settings.out / "reference" / lab
    key = reference_cache.key(lab, device)  # what runs now: kept under this key, whatever changes meanwhile
    if not settings.remeasure_references:
        entry = workdir / reference_cache.ENTRY
        kept = reference_cache.load(workdir, key, settings.shared_builds, settings.sandbox,
                                    believed=unsandboxed.believed(entry, settings.out))
        if kept is not None:
            return kept
    shutil.rmtree(workdir, ignore_errors=True)
    env = dict(os.environ, FUSELAB_CACHE_DIR=str(settings.shared_builds), MPLBACKEND="Agg",
               CUDA_DEVICE_ORDER="PCI_BUS_ID")
    _share_cpus(env, settings.cpu_threads)
    env.pop("FUSELAB_SHARED_BUILDS", None)
    # its kernels (and the course's tuned solution, which its speed test times) compiled side by side beside it
    ahead = build_ahead.start(lab, env, workdir, device) if device is not None else None
    try:
        clean = recheck.run_clean(nb, nb, workdir, cell_timeout=max(settings.cell_timeout, 300),
                                  total_timeout=max(settings.submission_timeout, 900), env=env, device=device,
                                  lease=lease, kernels_in_worker=False)  # the instructor's: fill the shared builds
    finally:
        build_ahead.stop(ahead)
    cells = {k: {"points": v.points, "max_points": v.max_points, "status": v.status, "message": v.message,
                 "speed": v.speed} for k, v in clean.cells.items()}
    broken = [k for k, v in cells.items() if v["status"] in ("failed", "crashed", "timed out", "not run")
              and k not in registry.speed_grade_ids(lab)]
    result = {"cells": cells, "broken": broken, "seconds": clean.seconds, "notebook_sha": _sha(path),
              "device": device, "gpu_holds": clean.gpu_holds}
    (workdir / reference_cache.ENTRY).write_text(json.dumps(result, indent=1))
    return {**result, "key": key}  # ``keep_references`` keeps it for reuse once its builds are recorded


def keep_references(reference: dict, settings: Settings) -> None:
    """The reference runs made now, kept for later runs with the shared builds just recorded (``reference_cache``)."""
    for lab, result in reference.items():
        if not result.get("reused") and result.get("key"):
            body = {k: v for k, v in result.items() if k != "key"}
            reference_cache.store(settings.out / "reference" / lab, body, result["key"], settings.shared_digests,
                                  settings.sandbox)


def grade(source, settings: Settings) -> ClassResult:
    """Grade every submission under ``source`` (a folder or a zip); see the module doc. Raises ``GradingRefused``
    (before anything is graded) for a sandbox that does not work, an ``--out`` in use or in the wrong place."""
    if not Path(source).exists():  # said before anything is written (a course folder, its lock)
        raise GradingRefused(f"no such folder or zip: {source} (give the class's submissions: the LMS's download, "
                             "or a folder of <student>/<lab>/<notebook>.ipynb)")
    check_out(settings.out, Path(source))
    check_source(Path(source), settings)
    check_names(Path(source), settings)  # a misspelled name is said first: before a sandbox that may not work
    check_due(settings.out, settings.due, settings.students)  # and a --due that is not a date and time
    check_identities(Path(source), settings)  # a Moodle lab that would make its students new ones
    check_sandbox(settings)
    settings.out = Path(settings.out).resolve()
    settings.out.mkdir(parents=True, exist_ok=True)
    lock = lock_out(settings.out)
    try:
        if not settings.sandbox:  # before its first submission runs, and again once they all ended
            _mark_unsandboxed(settings)
        return _grade(source, settings)
    finally:
        if not settings.sandbox:
            _mark_unsandboxed(settings)
        lock.release()


def _shared_root(settings: Settings) -> Path:
    """The shared-builds folder as named (a link at its last component not followed)."""
    return Path(os.path.abspath(settings.shared_builds or settings.out / "shared-builds"))


def prepare_shared_builds(settings: Settings) -> bool:
    """Before the reference runs: ``settings.shared_builds`` resolved, and, in a sandboxed run, emptied where a
    ``--no-sandbox`` run could have written it since a sandboxed run last did this (``unsandboxed.fresh_builds``):
    the reference runs load and record those builds with the grader's rights. Returns whether it was emptied."""
    rebuilt = bool(settings.sandbox) and unsandboxed.fresh_builds(_shared_root(settings), settings.out)
    settings.shared_builds = _shared_root(settings).resolve()
    return rebuilt


def _mark_unsandboxed(settings: Settings) -> None:
    """Mark the course folder and the shared builds (``unsandboxed``): a submission of this run could write both."""
    unsandboxed.mark(settings.out)
    shared = _shared_root(settings)
    if not shared.is_relative_to(settings.out):
        shared.mkdir(parents=True, exist_ok=True)
        unsandboxed.mark(shared)


def _precompile() -> None:
    """The course's own modules compiled once, by the grader: its children run with PYTHONDONTWRITEBYTECODE
    (nothing they run writes into the course), so each of them would otherwise compile every module it imports.
    A course folder the grader may not write into is left as it is."""
    import compileall
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        compileall.compile_dir(str(course.REPO / "fuselab"), quiet=2)


def cpu_seconds() -> float:
    """CPU seconds of this process and of every child it waited for (a phase's children end within it)."""
    import resource
    return sum(getattr(resource.getrusage(who), part) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for part in ("ru_utime", "ru_stime"))


def _grade(source, settings: Settings) -> ClassResult:
    clock = time.monotonic()
    phases, spans, cpu = {}, {}, {}
    cpu_at = [cpu_seconds()]

    def phase_done(name, since):
        now = time.monotonic()
        phases[name], spans[name] = now - since, (since, now)
        cpu[name], cpu_at[0] = cpu_seconds() - cpu_at[0], cpu_seconds()
        return now

    _precompile()

    rebuilt = prepare_shared_builds(settings)
    labs = [lab for lab in course.lab_names() if not settings.labs or lab in settings.labs]  # names: check_names
    due = _due_dates(settings.due)
    try:  # a roster that cannot be read stops the run before anything is graded
        people = roster.read(settings.roster) if settings.roster else None
        moodle_ids = _moodle_ids(settings, people)
    except (OSError, roster.RosterError) as exc:
        raise GradingRefused(f"--roster: {exc}") from None
    notebook_names = {lab: nbgrader_run.notebook_name(lab) for lab in course.lab_names()}  # to recognise all
    seen: set = set()
    course_root = settings.out / "course"
    # The reference runs need only the intake (which labs) and run beside the course set-up: nbgrader's release of
    # the labs, the gradebook's due dates and students, the labs' pages for feedback. The reference-runs phase is
    # what is left of them once the course is set up.
    with ThreadPoolExecutor(max_workers=max(1, len(labs))) as pool:
        with run_progress.phase("course set-up", 2, "step", settings.progress) as bar:
            # an upload older than the one graded is not graded over it, unless a --force regrade names its student
            forced = settings.students if settings.force and settings.students else ()
            labs_found: set = set()
            submissions, problems = intake.collect(Path(source), settings.out / "submissions", notebook_names,
                                                   students=settings.students, only_labs=labs, seen=seen,
                                                   moodle_ids=moodle_ids,
                                                   graded=term.graded_uploads(settings.out, keep_out=forced),
                                                   labs_found=labs_found, canvas_ids=term.canvas_ids(settings.out))
            problems += _labs_not_found(settings.labs, labs_found, source)
            mixed = None if settings.labs else intake.mixed_download(submissions)
            if mixed:  # before anything is graded or recorded
                raise GradingRefused(mixed)
            unrelated = term.unrelated_roster(people, {x.student for x in [*submissions, *problems] if x.student},
                                              {x.lms_id for x in [*submissions, *problems] if x.lms_id}, settings.out)
            if unrelated:
                raise GradingRefused(f"--roster {settings.roster}: {unrelated}")
            bar.update()
            _check_students(settings.students, seen, source)
            if settings.students:  # a run over some students changes nobody else's rows
                problems = [p for p in problems if p.student in settings.students]
            devices = schedule.devices_for(settings.gpus, settings.cpu_workers)
            leases = {d: grading_lease(d, settings.cell_timeout) for d in devices if d is not None}
            # the labs' reference runs side by side (their timings take turns), before any student of theirs
            labs_graded = sorted({s.lab for s in submissions})
            settings.cpu_threads = _threads_per_child(len(labs_graded))
            running = {lab: pool.submit(reference_run, lab, settings, devices[0], leases.get(devices[0]))
                       for lab in labs_graded}
            try:
                bar.set_postfix_str("nbgrader")
                nbgrader_run.prepare_course(course_root, labs)  # nbgrader's release of each lab: seconds each
                nbgrader_run.set_due_dates(course_root / "gradebook.db", due)
                nbgrader_run.add_students(course_root / "gradebook.db", sorted({s.student for s in submissions}))
                lab_pages = feedback.lab_sources(labs) if settings.feedback else {}
                bar.update()
            except BaseException:
                for future in running.values():
                    future.cancel()
                raise
        clock = phase_done("intake and course", clock)
        with run_progress.phase("reference runs", len(labs_graded), "lab", settings.progress) as ref_bar:
            for future in as_completed(running.values()):
                future.result()  # a reference run that failed stops the run here
                ref_bar.update()
        reference = {lab: future.result() for lab, future in running.items()}
    if rebuilt:
        problems.append(intake.Problem(str(settings.shared_builds), unsandboxed.REBUILT, of_the_run=True))
    # the instructor's builds as made now, before any submission runs: each is loaded later only with these bytes
    settings.shared_digests, changed = shared_builds.record(settings.shared_builds)
    if changed:
        problems.append(intake.Problem(str(settings.shared_builds), shared_builds.note(changed), of_the_run=True))
    else:
        keep_references(reference, settings)
    clock = phase_done("reference runs", clock)

    todo, results = [], {}
    forced_since = _forced_run(settings, source, labs, devices[0])
    for sub in submissions:
        saved = settings.out / "work" / sub.student / sub.lab / "result.json"
        if saved.exists():
            try:
                previous = json.loads(saved.read_text())
                fresh = forced_since is None or saved.stat().st_mtime >= forced_since
            except (OSError, ValueError):
                previous, fresh = {}, False
            if fresh and isinstance(previous, dict) and _kept(previous, saved, sub, settings):
                results[(sub.student, sub.lab)] = SubmissionResult.from_json(previous)
                continue
        todo.append(sub)

    workers = schedule.workers_for(devices, settings.jobs_per_gpu)
    settings.cpu_threads = _threads_per_child(len(workers))
    bar = None
    if settings.progress and todo:
        from tqdm import tqdm
        bar = tqdm(total=len(todo), desc="grading", unit="submission")

    def done(sub, result):
        if bar is not None:
            bar.set_postfix_str(shown(f"{sub.student}/{sub.lab}"))
            bar.update(1)

    stop = threading.Event()

    def work(sub, device):
        try:
            return grade_submission(sub, device, settings, source, leases.get(device),
                                    reference.get(sub.lab, {}).get("seconds"))
        except GradingRefused:
            stop.set()  # no other submission is graded by a broken sandbox either
            raise

    outcomes = schedule.run_jobs(todo, workers, work, on_done=done, stop=stop)
    if bar is not None:
        bar.close()
    refused = next((o for o in outcomes if isinstance(o, GradingRefused)), None)
    if refused is not None:
        raise refused
    clock = phase_done("submissions", clock)
    for sub, outcome in zip(todo, outcomes):
        if isinstance(outcome, Exception):
            problems.append(intake.Problem(sub.origin, f"the grader failed on this submission: {outcome!r}",
                                           student=sub.student, lab=sub.lab, grader_failed=True))
            continue
        results[(sub.student, sub.lab)] = outcome

    run_labs = settings.labs or {s.lab for s in submissions} | {p.lab for p in problems if p.lab}
    term.record_course(settings.out, submissions, set(results), problems, run_labs, people)
    class_result = ClassResult(out=settings.out, results=[results[k] for k in sorted(results)], problems=problems,
                               reference=reference, phase_seconds=phases, phase_spans=spans, phase_cpu=cpu,
                               graded_now=len(todo), workers=workers)
    written = write_outputs(class_result, settings, clock, lab_pages=lab_pages)
    (settings.out / FORCED_RUN).unlink(missing_ok=True)  # done: the same --force command again regrades anew
    return written


FORCED_RUN = Path("course") / "forced-run.json"  # a --force run not finished yet: what it was asked, since when


# What a --force run's verdicts depend on besides the notebooks: its grading options (``_forced_run``)
GRADING_OPTIONS = ("gpus", "jobs_per_gpu", "cpu_workers", "cell_timeout", "submission_timeout", "cell_wall_timeout",
                   "submission_wall_timeout", "memory_bytes", "sandbox", "shared_builds", "remeasure_references")


def _forced_run(settings: Settings, source, labs, device) -> float | None:
    """For a ``--force`` run, the time before which a saved result is graded again (None: a run without it keeps
    every saved result of the same notebook). The same --force command run again after one was stopped finishes
    it: what that run graded since it began is kept, as a resume keeps what a stopped run graded. The same: the
    same submissions, labs, students and grading options, on the same course (each lab's instructor folder and the
    package, the machine and torch: ``reference_cache.key``); anything else regrades everything it names."""
    if not settings.force:
        return None
    asked = {"source": str(Path(source).resolve()), "labs": sorted(labs), "students": sorted(settings.students or []),
             "options": {name: repr(getattr(settings, name)) for name in GRADING_OPTIONS},
             "course": {lab: reference_cache.key(lab, device) for lab in sorted(labs)}}
    marker = settings.out / FORCED_RUN
    try:
        then = json.loads(marker.read_text())
        if then.get("asked") == asked and isinstance(then.get("since"), (int, float)):
            return float(then["since"])
    except (OSError, ValueError, AttributeError):
        pass
    since = time.time()
    marker.parent.mkdir(parents=True, exist_ok=True)
    write_whole(marker, json.dumps({"asked": asked, "since": since}))
    return since


def _labs_not_found(asked, found: set, source) -> list:
    """A note for each lab ``--labs`` asked for that no notebook in the submissions is of: another lab's download,
    say, which would otherwise grade nothing and say nothing."""
    held = f"it holds notebooks of {', '.join(sorted(found))}" if found else "it holds no lab's notebook"
    return [intake.Problem(str(source), f"no notebook of {lab} in these submissions ({held}): nothing of {lab} was "
                                        "graded; is it the download of another lab?", lab=lab, of_the_run=True)
            for lab in sorted(set(asked or []) - found)]


def check_names(source: Path, settings: Settings) -> None:
    """Refuse (``UnknownNames``) a ``--labs`` name the course does not have, or a ``--students`` id the
    submissions do not have, before anything else is checked or written. The ids are the intake's own: it reads
    the submissions into a scratch folder, staging only the students asked for, which is thrown away."""
    known = course.lab_names()
    unknown = sorted(set(settings.labs or []) - set(known))
    if unknown:
        raise UnknownNames(f"no such lab(s): {', '.join(unknown)} (labs: {', '.join(known)})")
    if not settings.students:
        return
    import tempfile
    seen: set = set()
    try:
        moodle_ids = _moodle_ids(settings, roster.read(settings.roster) if settings.roster else None)
    except (OSError, roster.RosterError):
        moodle_ids = {}  # said by the run, before anything is graded
    with tempfile.TemporaryDirectory(prefix="fuselab-names-") as scratch:
        intake.collect(Path(source), Path(scratch) / "submissions",
                       {lab: nbgrader_run.notebook_name(lab) for lab in known}, students=settings.students,
                       only_labs=settings.labs, seen=seen, moodle_ids=moodle_ids,
                       canvas_ids=term.canvas_ids(settings.out))
    _check_students(settings.students, seen, source)


def _moodle_ids(settings: Settings, people: list | None) -> dict:
    """``{participant number: student id}`` for intake: a Moodle grading worksheet's (``--roster``; its people
    get their ids by email, in place), else the kept one of the run's one lab (``--labs``). None for a course
    folder whose Moodle students are all under participant numbers (graded without worksheets, or by a fuselab
    before ids by email): it goes on as it began, one lab per folder (``check_identities``)."""
    entries = [e for e in term.load_entries(settings.out).values() if e.lms == "moodle"]
    if any(map(term.by_participant_number, entries)) and all(map(term.by_participant_number, entries)):
        return {}
    if people is not None:
        return roster.by_email(people)
    if settings.labs and len(set(settings.labs)) == 1:
        return roster.lab_numbers(roster.load(settings.out), next(iter(settings.labs)))
    return {}


def check_identities(source: Path, settings: Settings) -> None:
    """Refuse (before anything is written) a Moodle download that would give students already in the course folder
    a second id: Moodle's participant numbers are one assignment's, so without the lab's grading worksheet (its
    email addresses) a student of another lab there cannot be told from a new one."""
    try:
        people = roster.read(settings.roster) if settings.roster else None
        moodle_ids = _moodle_ids(settings, people)
    except (OSError, roster.RosterError):
        return  # said by the run, before anything is graded
    entries = [e for e in term.load_entries(settings.out).values()
               if not e.student.startswith(term.NOBODY) and e.lab != term.UNKNOWN_LAB]
    if not entries and not moodle_ids:
        return  # a first lab: nobody to tell apart
    if not intake.may_hold_moodle(Path(source)):
        return  # no Moodle name in it (a Canvas download, a class folder): nobody to number
    import tempfile
    with tempfile.TemporaryDirectory(prefix="fuselab-ids-") as scratch:
        submissions, _ = intake.collect(Path(source), Path(scratch) / "submissions",
                                        {lab: nbgrader_run.notebook_name(lab) for lab in course.lab_names()},
                                        students=settings.students, only_labs=settings.labs, moodle_ids=moodle_ids)
    numbered = [s for s in submissions if s.lms == "moodle" and s.lms_id not in moodle_ids]
    labs = sorted({s.lab for s in numbered})
    named = roster.worksheet_numbers(people) if people else \
        set(moodle_ids) | roster.worksheet_numbers(roster.load(settings.out), next(iter(settings.labs or []), None))
    absent = sorted({s.lms_id for s in numbered} - named, key=int)
    if moodle_ids and absent:
        sheet = "the grading worksheet given (--roster)" if people else \
            f"the grading worksheet of {', '.join(labs)} kept in {settings.out}"
        raise GradingRefused(f"participant number(s) {', '.join(absent[:5])} of the download are not on {sheet}: "
                             f"give {', '.join(labs)}'s own grading worksheet (Assignment > Download grading "
                             "worksheet, after the last submission) with --roster")
    known = {e.student for e in entries}
    numbered = [s for s in numbered if s.student not in known]  # the lab again: the same numbers, the same ids
    if not numbered:
        return
    labs = sorted({s.lab for s in numbered})
    others = sorted({e.lab for e in entries} - set(labs))
    by_email = [e for e in entries if e.lms == "moodle" and not term.by_participant_number(e)]
    if not others and not by_email:
        return  # the lab again, in its own folder: the same numbers
    examples = ", ".join(sorted({s.student for s in numbered})[:3])
    if any(map(term.by_participant_number, entries)) and not by_email:
        raise GradingRefused(f"{settings.out} holds Moodle students under {', '.join(sorted({e.lab for e in entries}))}"
                             f"'s participant numbers, and Moodle numbers them anew in {', '.join(labs)}: its "
                             f"students ({examples}, ...) would be counted a second time. Grade {', '.join(labs)} "
                             "into its own --out, or start a new course folder and grade each lab there with its "
                             "grading worksheet (--roster)")
    raise GradingRefused(f"{settings.out} already holds the course's students, and Moodle's download names them by "
                         f"participant numbers of {', '.join(labs)} alone ({examples}, ...): they would be new "
                         f"students there. Give {', '.join(labs)}'s grading worksheet (Assignment > Download grading "
                         "worksheet, with the Email address column) with --roster, or grade it into its own --out")


def _check_students(students, seen: set, source) -> None:
    missing = sorted(set(students or []) - seen)
    if missing:
        raise UnknownNames(f"no such student(s) in {source}: {', '.join(missing)}. The students in it: "
                           f"{', '.join(sorted(seen)) or '(none)'}")


# ``--due``'s one form: an ISO 8601 date and time, minutes at least, an optional offset. nbgrader's parse_utc (what
# it used before) takes nearly anything (``14`` is the 14th of this month, ``03/09/2026`` is March or September) and
# a due date read wrong changes every late penalty silently.
_DUE_FORM = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?(Z|[+-]\d{2}:\d{2})?")
_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}")


def check_due(out: Path, due: dict, students) -> dict:
    """``_due_dates``, and refuse (``GradingRefused``) a student's own due date for a lab that has none, or a run
    over some students (``students``) that would move a lab's due date, and so everyone else's late marks and
    penalties: a run over some students changes nobody else's rows."""
    parsed = _due_dates(due)
    db = Path(out) / "course" / "gradebook.db"
    kept = {k: v for k, v in nbgrader_run.due_dates(db).items() if not nbgrader_run.is_own_due(k)}
    for key in parsed:
        lab = key.partition(":")[0]
        if nbgrader_run.is_own_due(key) and lab not in parsed and lab not in kept:
            raise GradingRefused(f"--due {key}: {lab} has no due date in {out} to extend: give --due "
                                 f"{lab}=WHEN as well")
        if not nbgrader_run.is_own_due(key) and students and kept.get(key) != parsed[key]:
            then = f"it is {kept[key].isoformat(timespec='minutes')}" if key in kept else "it has none"
            raise GradingRefused(f"--due {key}={due[key]} with --students would move {key}'s due date for the whole "
                                 f"class ({then}), and everyone's late marks with it. To give these students "
                                 f"their own: --due {key}:{sorted(students)[0]}={due[key]}; to move everyone's, "
                                 "run without --students")
    return parsed


def _due_dates(due: dict) -> dict:
    """``{lab: datetime in UTC, without zone}`` (as nbgrader keeps it) from ``--due LAB=WHEN``: WHEN is
    2026-09-14T23:59, optionally with seconds and a zone (Z, -05:00); without one it is UTC. Anything else, a date
    without a time included, raises ``GradingRefused`` naming the value and the form to use. ``--due
    LAB:STUDENT=WHEN``, one student's own due date (an extension), is kept under ``"LAB:STUDENT"``."""
    parsed = {}
    for key, when in (due or {}).items():
        lab, _, student = key.partition(":")
        if lab not in course.lab_names():
            raise UnknownNames(f"--due {key}: no such lab (labs: {', '.join(course.lab_names())})")
        if nbgrader_run.is_own_due(key) and (not student or intake.student_id(student) != student):
            raise GradingRefused(f"--due {key}: write one student's own due date as LAB:STUDENT=WHEN, STUDENT "
                                 "their id in grades.csv, e.g. lab0:alice=2026-09-16T23:59")
        form = f"e.g. {key}=2026-09-14T23:59 (UTC) or {key}=2026-09-14T23:59-05:00"
        if _DATE_ONLY.fullmatch(when):  # midnight at its start, or at its end? the TA says which
            raise GradingRefused(f"--due {key}={when}: give a date and time, {form}")
        if not _DUE_FORM.fullmatch(when):
            raise GradingRefused(f"--due {key}={when}: not a date and time in the form YYYY-MM-DDTHH:MM, {form}")
        try:
            moment = datetime.fromisoformat(when.replace("Z", "+00:00"))  # Python 3.10's fromisoformat has no Z
        except ValueError as exc:  # the form, but no such day or time: 2026-02-30, 24:00
            raise GradingRefused(f"--due {key}={when}: not a date and time ({exc}), {form}") from None
        if moment.tzinfo is not None:
            moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
        parsed[key] = moment
    return parsed


def write_outputs(class_result: ClassResult, settings: Settings, clock: float | None = None,
                  lab_pages: dict | None = None) -> ClassResult:
    """The class's outputs from its graded results: the gradebook of ``<out>/course``, feedback, the nbgrader
    export, grades.csv and the report. ``grade``'s last step, and the Slurm merge's (``slurm.merge``), so a class
    graded in shards ends exactly as one graded on one host. ``class_result.results`` in (student, lab) order.
    ``lab_pages``: the labs' release cells for feedback, as ``grade`` read them before any student code ran
    (read now where not given: the Slurm merge runs no student code)."""
    clock = time.monotonic() if clock is None else clock
    if lab_pages is None and settings.feedback:
        lab_pages = feedback.lab_sources(sorted({r.lab for r in class_result.results}))

    cpu_at = [cpu_seconds()]

    def phase_done(name, since):
        now = time.monotonic()
        class_result.phase_seconds[name], class_result.phase_spans[name] = now - since, (since, now)
        class_result.phase_cpu[name], cpu_at[0] = cpu_seconds() - cpu_at[0], cpu_seconds()
        return now

    course_root = settings.out / "course"
    class_result.results = [SubmissionResult.of(r) for r in class_result.results]
    # the processes that draw the pages of the submissions graded now start beside the gradebook's recording, which
    # the pages read (a run that graded none starts them, if at all, for the pages it finds left to draw)
    with feedback.Drawers(class_result.graded_now if settings.feedback else 0) as drawers:
        ordered, clock = _gradebook_and_feedback(class_result, settings, lab_pages, drawers, phase_done, clock)
    clock = phase_done("feedback", clock)  # after the processes ended: their CPU is the phase's
    bar = run_progress.phase("export and report", 3, "step", getattr(settings, "progress", False))
    export_failed = nbgrader_run.export(course_root, settings.out / "nbgrader-grades.csv")
    if export_failed:
        class_result.problems.append(intake.Problem(str(settings.out / "nbgrader-grades.csv"), export_failed,
                                                    of_the_run=True))
    else:  # nbgrader writes the roster's names as they are: a name that is a formula is made text
        terminal.defuse_csv_file(settings.out / "nbgrader-grades.csv")
    bar.update()
    class_result.grades_csv = report.write_grades_csv(ordered, settings.out / "grades.csv",
                                                      standings=class_result.standings)
    bar.update()
    class_result.report = report.write_report(class_result, settings.out)
    bar.update()
    bar.close()
    phase_done("export and report", clock)
    return class_result


def _gradebook_and_feedback(class_result: ClassResult, settings: Settings, lab_pages, drawers, phase_done,
                            clock) -> tuple:
    """The course's results in the gradebook (with everyone's standing) and their feedback pages, drawn by
    ``drawers`` (``feedback.Drawers``): ``(the results as the outputs show them, the clock at the gradebook's
    end)``."""
    course_root = settings.out / "course"
    # the whole course's results (this run's and the earlier runs' in the same folder), and everyone's standing
    entries = term.load_entries(settings.out)
    ordered = term.course_results(settings.out, class_result.results, entries)
    people = roster.load(settings.out)
    class_result.standings = term.standings(ordered, entries, people,
                                            nbgrader_run.due_dates(course_root / "gradebook.db"))
    roster.to_gradebook(course_root / "gradebook.db", people)  # names and emails for formgrader, nbgrader's export
    if lab_pages is not None and settings.feedback:
        missing_pages = sorted({r.lab for r in ordered} - set(lab_pages))
        lab_pages = {**lab_pages, **(feedback.lab_sources(missing_pages) if missing_pages else {})}
    late = {(s.student, s.lab): s for s in class_result.standings}
    bar = run_progress.phase("gradebook", len(ordered), "submission", getattr(settings, "progress", False))
    # formgrader's copy is the notebook as submitted, its hidden tests cut (``nbgrader_run.record``): nbgrader's
    # feedback buttons render it
    nbgrader_run.record(course_root, [
        nbgrader_run.Recorded(result.student, result.lab, result.points, result.notebook,
                              getattr(late.get((result.student, result.lab)), "submitted", None))
        for result in ordered], progress=bar.update)
    bar.close()
    # this run's and every earlier run's, until a TA grades the cell again in formgrader
    class_result.hand_grades_set_aside = nbgrader_run.set_aside_waiting(course_root)
    # what teaching assistants entered in formgrader since: into grades.csv, the report and the feedback pages
    ordered = handgrading.apply(ordered, course_root / "gradebook.db")
    for result in ordered:  # what the LMS said (Canvas's LATE_, a worksheet's status), for the student's page
        result.lms_late = bool(getattr(late.get((result.student, result.lab)), "late", False))
    clock = phase_done("gradebook", clock)
    if settings.feedback:
        # built from each student's submitted notebook, the lab's release notebook (read before any student code
        # ran) and the verdicts
        with run_progress.phase("feedback", 1, "step", getattr(settings, "progress", False)) as bar:
            class_result.feedback, class_result.feedback_problems = feedback.write_all(
                ordered, settings.out / "feedback", lab_pages, course_root / "gradebook.db",
                show_flags=feedback.shown_flags(settings.out), drawers=drawers)
            bar.update()
    return ordered, clock
