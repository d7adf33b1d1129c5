"""The clean recheck: the instructor's notebook, hidden tests included, checking the student's solution cells.

Test cells run in a student's own notebook in the student's own Python, so nothing computed there can be trusted.
The clean recheck runs three processes, all started here and connected by pipes they inherit (and, for the
checker and the kernel worker, the launches' transfer memory, ``transfer``):

- the *checker* (``cellrunner``): the instructor's notebook from ``solutions/`` (setup cells, builds, test
  cells, hidden tests, references) and every verdict. It never runs the student's Python;
- the *solution worker* (``solution_worker``): the setup cell and the student's solution cells, as written.
  Names those cells define reach the checker as plain values (the ``*_SOURCE`` texts) or as proxies whose
  calls send inputs by value and rebuild results from exact types only (``wire``, ``remote``);
- the *kernel worker* (``kernel_worker``): the only process that loads a student's kernels; it runs no student
  Python, only the notebook's cells that are not tests, and the launches and speed tests the checker asks for
  (``kernels``). The instructor's reference run keeps its kernels in the checker (``kernels_in_worker``).

Cells the student added are dropped, but for one that stands in for a solution cell whose nbgrader id their
notebook lost (``_unmarked_solution``). ``sanitize`` only *flags* solution cells that look like tampering, for a
teaching assistant: it decides nothing about what runs.

The checker runs with limits. A graded cell that crashes it (or one of its workers), hangs past the per-test timeout or poisons the
CUDA context scores 0, and the run resumes from the next cell in fresh processes (the setup cells
rerun; builds come from the cache), so a fault costs only the test that touched it. A crash, hang or poisoned
context in a cell that is *not* graded (a demo) stops the run: every later test scores 0 and says why, never
full marks.

Time limits do not depend on how busy the machine is. A cell's limit counts its *own* time (``TreeMeter``): the
CPU time of the checker and its workers (their whole process trees, compilers included) since the cell started,
per CPU thread a child may use, plus the time none of their threads was running or waiting for a CPU (a test
that sleeps or hangs), never more than its wall-clock time (CPU time no process shows, of a child the kernel
reaped, is counted from how long a thread of theirs was runnable while a CPU was idle: ``TreeMeter``); waiting
for a CPU on a busy machine does not count (unless a thread lowered its own priority, ``_running``), nor does
time stopped or waiting for the GPU. A cell past its own time (an endless loop, a hang) scores 0 "timed out". A
wall-clock backstop (``wall_backstop`` times the limit) still bounds every cell; a cell it stopped may only have
been starved, so its verdict is marked ``retry`` and ``retry_overruns`` runs it again (the grader runs it with no
other submission of its own running), with a backstop ``RETRY_BACKSTOP`` times as long, before it can score 0.

After the run, a graded speed test scores only if the correctness tests it requires (``speed_requires`` in
``fuselab/speed/policy.json``) passed in this same clean run.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ... import config, course, proctree
from ... import notebook as ipynb
from ...kernel_memory import FLAG as HOST_WROTE_KERNEL_MEMORY
from ...kernelbuild import shared as shared_builds
from ...runmode import INSTRUCTORS_RUN_ENV
from ..sandbox import isolate
from . import transfer
from ..gpus.lease import LeaseServer
from ..sandbox.untrusted import Folder
from .channel import (ANSWERS_FD_ENV, MEMORY, REFUSED, SHARED_GPU_ENV, Ask, CellEnd, CellStart, Done, GiveBack,
                      Poisoned, Receiver, grant_line)
from .demos import demo_problems
from .failures import says_gpu_memory_ran_out
from .sanitize import sanitize_cell


@dataclass
class CellVerdict:
    grade_id: str
    points: float
    max_points: float
    status: str            # passed | failed | partial | crashed | timed out | not run | not measured (no GPU)
    message: str = ""
    output: str = ""
    seconds: float = 0.0
    speed: list = field(default_factory=list)  # records of fuselab.speed.speedup_test
    requires_failed: list = field(default_factory=list)  # correctness tests a speed test needed and that failed
    # a wall-clock overrun that load may have caused: {"first_try": why} while a retry is due; after the retry
    # also "retry": what it gave (``retry_overruns``)
    retry: dict = field(default_factory=dict)


@dataclass
class CleanResult:
    cells: dict                         # grade_id → CellVerdict
    flags: list = field(default_factory=list)
    restarts: int = 0
    seconds: float = 0.0
    gpu_wait_s: float = 0.0             # waiting for the shared GPU (lease) before timings
    gpu_held_s: float = 0.0             # timing with the GPU to itself (every other submission on it stopped)
    gpu_holds: list = field(default_factory=list)  # each time it had the GPU: [start, end] in epoch seconds
    # where the time went, every cell (setup, builds and demos too) and each process's start before its first
    # cell: label → seconds, summed over restarts, for the grader's throughput report
    timeline: dict = field(default_factory=dict)
    # where the CPU went: the same labels → {process: CPU seconds}, sampled (``TreeMeter``'s reads, every half
    # second, each charged to the cell running when it was taken), for the throughput report
    cpu_timeline: dict = field(default_factory=dict)

    def to_json(self):
        return {"cells": {k: asdict(v) for k, v in self.cells.items()}, "flags": self.flags,
                "restarts": self.restarts, "seconds": self.seconds, "gpu_wait_s": self.gpu_wait_s,
                "gpu_held_s": self.gpu_held_s, "gpu_holds": self.gpu_holds, "timeline": self.timeline,
                "cpu_timeline": self.cpu_timeline}

    @property
    def retries_due(self) -> list:
        """The tests stopped by a wall-clock limit (``CellVerdict.retry``) that no retry has run yet."""
        return [k for k, v in self.cells.items() if v.retry and "retry" not in v.retry]

    @classmethod
    def from_json(cls, data):
        return cls(cells={k: CellVerdict(**v) for k, v in data["cells"].items()}, flags=data["flags"],
                   restarts=data["restarts"], seconds=data["seconds"], gpu_wait_s=data.get("gpu_wait_s", 0.0),
                   gpu_held_s=data.get("gpu_held_s", 0.0), gpu_holds=data.get("gpu_holds", []),
                   timeline=data.get("timeline", {}), cpu_timeline=data.get("cpu_timeline", {}))




def _one_cell(found: list) -> dict:
    """A student's cells that share a grade id (a solution cell copied in JupyterLab keeps its id) as one cell: their
    sources in notebook order, as the notebook runs them one after the other (nbgrader's own autograde keeps the
    last one as the graded cell). A copy that does not parse is left out: in the notebook it runs nothing."""
    if len(found) == 1:
        return found[0]
    from .cellrunner import _without_magics
    sources = []
    for cell in found:
        text = ipynb.source(cell)
        try:
            ast.parse(_without_magics(text))
        except (SyntaxError, ValueError):
            continue
        sources.append(text)
    return {**found[-1], "source": "\n\n".join(sources) if sources else ipynb.source(found[-1])}


# CPython 3.11's ast.parse is not safe in several threads at once ("AST constructor recursion depth mismatch"):
# the grader plans submissions in parallel threads, and a plan parses every cell
_PLANNING = threading.Lock()


def clean_plan(instructor_nb: dict, student_nb: dict, skip_demos: bool = True):
    """``(cells, flags)``: the clean notebook's code cells as the runner's plan, and what sanitizing flagged.

    ``skip_demos``: the instructor's ``demo`` cells are left out (``demos``); an instructor's notebook whose demos
    a kept cell depends on is refused (ValueError) before anything runs."""
    with _PLANNING:
        return _clean_plan(instructor_nb, student_nb, skip_demos)


def _clean_plan(instructor_nb: dict, student_nb: dict, skip_demos: bool):
    code_cells = [cell for cell in instructor_nb["cells"] if cell["cell_type"] == "code"]
    last_test = max((k for k, cell in enumerate(code_cells) if ipynb.is_graded(cell)), default=-1)
    problems = demo_problems(code_cells[: last_test + 1])  # the cells after the last test never run here
    if problems:
        raise ValueError("the instructor's notebook tags as demo what the recheck cannot leave out: "
                         + "; ".join(problems))
    copies, unmarked = {}, []
    for cell in student_nb.get("cells", []):
        grade_id = ipynb.nbgrader(cell).get("grade_id")
        if grade_id and cell.get("cell_type") == "code":
            copies.setdefault(grade_id, []).append(cell)
        elif cell.get("cell_type") == "code":
            unmarked.append(cell)
    cells, flags = [], []
    student = {}
    for grade_id, found in copies.items():
        student[grade_id] = _one_cell(found)
        if len(found) > 1:
            flags.append(f"{grade_id}: the submission holds {len(found)} cells with this id (a copied cell); they "
                         "run one after the other, as in the notebook")
    for cell in code_cells:
        if skip_demos and ipynb.is_demo(cell):
            continue
        meta = ipynb.nbgrader(cell)
        grade_id = meta.get("grade_id")
        source = ipynb.source(cell)
        solution = bool(meta.get("solution"))
        exports = _defined_names(source) if solution else []
        if solution:
            mine = student.get(grade_id)
            if mine is None:
                mine = _unmarked_solution(unmarked, exports)
                names = ", ".join(exports)
                if mine is not None:
                    instead = f"graded with the student's cell that defines {names}, as nbgrader's own run would"
                else:
                    instead = ((f"no cell defines {names} either, so the tests that use them fail: " if exports
                                else "") +
                               "the student can copy the cell from the released notebook and move their code into it")
                flags.append(f"{grade_id}: no cell of the submission has this solution cell's nbgrader id (deleted, "
                             f"or re-created as a new cell); {instead}")
            if mine is None:
                source = ""
            else:
                source = ipynb.source(mine)  # as written: it runs in the solution worker, never in the checker
                clean = sanitize_cell(source)
                flags += [f"{grade_id}: {flag}" for flag in clean.flags]
                if clean.error:
                    flags.append(f"{grade_id}: {clean.error}")
        # the first cell (imports, DEVICE...) runs in the solution worker too: solution cells use its names; every
        # cell that is not a test or a solution (setup, builds, helpers) runs in the kernel worker too, where a
        # speed test runs with its names
        graded = bool(meta.get("grade"))
        if not graded and not solution and ipynb.has_hidden_tests(source):
            # such a cell would run in the kernel worker, next to a student's native code
            raise ValueError(f"cell {grade_id or len(cells)} of the instructor's notebook holds hidden tests but is "
                             "not a graded test cell: make it a test cell (nbgrader's 'Autograder tests')")
        cells.append({"index": len(cells), "grade_id": grade_id, "source": source, "solution": solution,
                      "exports": exports,
                      "shared": not cells and not solution,
                      "instructor": not solution and not graded,
                      "graded": bool(meta.get("grade")), "points": float(meta.get("points") or 0)})
    last_graded = max((c["index"] for c in cells if c["graded"]), default=-1)
    return cells[: last_graded + 1], flags  # cells after the last test cannot change a grade


def _unmarked_solution(unmarked: list, exports: list):
    """The student's own code cell, without nbgrader's metadata, that defines every name of a solution cell whose
    id their notebook lost (a cell deleted and typed again, or pasted into a new one: Jupyter keeps the metadata
    with the cell, not with its text), the last such (the definition in force after a run from the top); None
    where there is none. It is their code, run in the solution worker like any solution cell; nbgrader's own
    autograde runs every cell of the notebook and would have found these names."""
    from .cellrunner import _without_magics
    if not exports:
        return None
    found = []
    for cell in unmarked:
        try:  # a cell with no text, or text that is no string: no names
            names = set(_defined_names(_without_magics(ipynb.source(cell))))
        except (KeyError, AttributeError, TypeError, ValueError, RecursionError):
            continue
        if set(exports) <= names:
            found.append(cell)
    return found[-1] if found else None


def _defined_names(source: str) -> list:
    """The names the instructor's solution cell defines at top level: the only names of a student's solution cell
    the checker takes. A student's other names (helpers, or a class named like a module the tests use) stay in
    the solution worker, where the student's own functions use them."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names += [t.id for t in ast.walk(target) if isinstance(t, ast.Name)]
    return sorted(set(names))


def _score(cell, end: CellEnd) -> CellVerdict:
    """nbgrader's rule on one finished cell: error or stderr → 0; a displayed number → those points; else full."""
    maximum = cell["points"]
    speed = end.speed
    common = dict(grade_id=cell["grade_id"], max_points=maximum, output=end.stdout[-1500:], seconds=end.seconds,
                  speed=speed)
    if end.error:
        return CellVerdict(points=0.0, status="failed", message=end.error, **common)
    if end.stderr.strip():
        return CellVerdict(points=0.0, status="failed",
                           message="wrote to stderr (nbgrader gives such a cell 0): " + end.stderr.strip()[:500],
                           **common)
    value = end.value
    if value is not None:
        if not 0 <= value <= maximum:
            return CellVerdict(points=0.0, status="failed",
                               message=f"the cell ended in {value}, outside 0..{maximum}", **common)
        status = "passed" if value == maximum else ("partial" if value > 0 else "failed")
        if any(r.get("status") == "not measured (no GPU)" for r in speed):
            status = "not measured (no GPU)"
        return CellVerdict(points=float(value), status=status, **common)
    return CellVerdict(points=maximum, status="passed", **common)


class PauseLog:
    """How much of a run was paused (waiting for the GPU, stopped for others' timings), sampled over time, so a
    test's own time counts only the pauses after it started.

    A grant of the GPU can block the polling loop for minutes, and the loop may see a test's start only after
    that wait: taking the pause total *when the start is seen* would count the wait as the test's own time (a
    correct speed test timed out that way on the H200 with 10 submissions sharing it). So the pause total is
    sampled before each poll, and a start is matched with the last sample taken before it happened.
    """

    def __init__(self):
        self._samples: list = []   # (epoch seconds, pause total then), in time order

    def sample(self, paused: float) -> None:
        self._samples.append((time.time(), paused))

    def at(self, when: float) -> float:
        """The pause total at epoch ``when`` (the last sample at or before it; 0 before the first)."""
        before = [paused for sampled, paused in self._samples if sampled <= when]
        if len(self._samples) > 1000:  # only starts still to come are asked about: older samples can go
            self._samples = self._samples[len(before) - 1:] if before else self._samples
        return before[-1] if before else 0.0


WALL_BACKSTOP = 5.0   # a cell's (and a submission's) wall-clock limit, in multiples of its limit of own time
RETRY_BACKSTOP = 2.0  # a retry's wall-clock limit, in multiples of the first try's (its default at least)
RETRIED = "retried alone"  # the timeline's entry for the retries' time


def wall_backstop(threads: int) -> float:
    """A test's (and a run's) wall-clock backstop in multiples of its limit of own time, for children that may keep
    ``threads`` CPU threads busy: at least twice ``threads``. Own time counts CPU time per thread, so a loop on one
    thread reaches its limit after ``threads`` times it by the clock: well before the backstop, whose stop would
    be retried alone with every other submission held."""
    return max(WALL_BACKSTOP, 2.0 * threads)

_TICKS = os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float:
    """CPU seconds of ``pid``: its threads', and its children's that it has waited for (0 where it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / _TICKS   # utime, stime, cutime, cstime
    except (OSError, ValueError, IndexError):
        return 0.0


SCHED_BATCH, SCHED_IDLE = 3, 5  # scheduling policies that yield to every other process's threads


def _running(pid: int) -> bool:
    """Whether a thread of ``pid`` is running or waiting for a CPU (state R) at the priority it started with. A
    thread that lowered its own (a positive nice, SCHED_BATCH or SCHED_IDLE, or its session's autogroup niced)
    waits for a CPU by its own choice: it counts as not running, so that waiting is the tree's own time, and a
    test cannot hang beside a starved thread that keeps it looking busy on a loaded machine."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    niced_group = None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            if fields[0] != "R" or int(fields[16]) > 0 or int(fields[38]) in (SCHED_BATCH, SCHED_IDLE):
                continue  # (fields after the name: state, ..., nice at 16, policy at 38)
            if niced_group is None:
                niced_group = _autogroup_nice(pid) > 0
            if not niced_group:
                return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def _autogroup_nice(pid: int) -> int:
    """The nice of ``pid``'s autogroup (``/proc/PID/autogroup``: "/autogroup-N nice K"); 0 where there is none."""
    try:
        with open(f"/proc/{pid}/autogroup") as handle:
            return int(handle.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return 0


def _idle_ticks() -> int:
    """The machine's idle clock ticks so far, over every CPU (``/proc/stat``: idle and iowait); 0 where unreadable."""
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()
        return int(fields[4]) + int(fields[5])
    except (OSError, IndexError, ValueError):
        return 0


class TreeMeter:
    """What the process trees below ``roots`` (the checker's and its workers' keepers) did so far, read from /proc
    at most every ``every_s``: ``(cpu, blocked, ran)``, the CPU seconds they used, the seconds during which none of
    their threads was running or waiting for a CPU (sleeping, waiting for a pipe or the GPU, stopped), sampled,
    and the seconds during which one of their threads was, while the machine had a CPU to spare, sampled too.

    ``ran`` is the CPU time no process shows: a process whose parent ignores SIGCHLD is reaped by the kernel, and
    its CPU time reaches no parent's count. A thread that waits for a CPU while one is idle does not wait long,
    so a tree seen so at every read has run all the while (a loop handed on from one such child to the next),
    and on a machine with none to spare it may only have waited: that time is not counted.

    A process that ends is counted in the one that waits for it (its keeper at worst), so the CPU sum only grows;
    a reading never goes back (a process seen between its end and its parent's wait)."""

    def __init__(self, roots, every_s: float = 0.5):
        self.roots = [root for root in roots if root]
        self.every_s = every_s
        self._read_at, self._cpu, self._blocked, self._ran = None, 0.0, 0.0, 0.0
        self._idle = _idle_ticks()
        self.by_root = dict.fromkeys(self.roots, 0.0)  # each root's tree's CPU seconds at the last read
        self.reads = 0

    def read(self) -> tuple:
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= self.every_s:
            parent_of = isolate.recent_parents()  # the limit watch's scan, where one is fresh
            trees = {root: {root, *proctree.descendants(root, parent_of)} if root in parent_of else set()
                     for root in self.roots}
            pids = set().union(*trees.values())
            cpu_of = {pid: _process_cpu(pid) for pid in pids}  # each process read once, for its tree and the sum
            for root, tree in trees.items():
                self.by_root[root] = max(self.by_root[root], sum(cpu_of[pid] for pid in tree))
            self._cpu = max(self._cpu, sum(cpu_of.values()))
            idle = _idle_ticks()
            if self._read_at is not None and pids:
                if not any(map(_running, pids)):
                    self._blocked += now - self._read_at
                elif idle > self._idle:
                    self._ran += now - self._read_at
            self._idle = idle
            self._read_at = now
            self.reads += 1
        return self._cpu, self._blocked, self._ran


# the timeline's entries for the GPU's sharing (part of the speed tests' own time)
SLOT_WAIT, LEASE_WAIT, HELD = "waiting for a speed test slot", "waiting for the GPU alone", "the GPU held alone"
STOPPED = "stopped for others' timings"  # anywhere in the run: the other submissions' holds of the GPU


def runner_env(base_env: dict, workdir: Path, device: str | None) -> dict:
    """The checker's and its workers' environment: ``base_env`` cut to what they read (``isolate.WORKER_ENV``: none
    of the TA's variables, sandbox or not), with the grader's settings for them."""
    # search paths of absolute folders only (``isolate.absolute_search_paths``): an empty entry
    # (``PYTHONPATH=/wheels:`` from ``export PYTHONPATH=/wheels:$PYTHONPATH``) or a relative one means the working
    # folder, a worker's own, which its submission can write (``-P`` does not drop those)
    env = isolate.absolute_search_paths(isolate.worker_env(base_env))
    env.update({"FUSELAB_GRADING": "1", "FUSELAB_NATIVE_POLICY": "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1",
                "FUSELAB_GRADE_LOG": str(workdir / "speed.jsonl"), "PYTHONDONTWRITEBYTECODE": "1"})
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(course.REPO), *kept]))
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    return env


def run_clean(instructor_nb: dict, student_nb: dict, workdir, *, cell_timeout=300.0, total_timeout=1800.0,
              limits: isolate.Limits | None = None, env=None, device=None, sandbox=False, hide=(),
              lease=None, kernels_in_worker=True, on_cell=None, skip_demos=True, wall_timeout=None,
              total_wall_timeout=None, only=None, check_requirements=True) -> CleanResult:
    """Run the clean recheck of one submission in ``workdir``; return every graded cell's verdict.

    ``cell_timeout``, ``total_timeout``: a cell's and the whole run's limits of *own* time (the module's doc);
    ``wall_timeout``, ``total_wall_timeout``: their wall-clock backstops (default ``wall_backstop`` times them).
    A cell or a run stopped by a backstop is marked for a retry (``CellVerdict.retry``, ``retry_overruns``).

    ``only``: run only these graded tests (and the cells before them that are not tests: their setup).
    ``check_requirements``: zero speed tests whose required correctness tests failed (off for a retry, which
    checks after merging).

    ``kernels_in_worker``: a student's kernels are built, loaded and launched in the kernel worker (into its
    own build cache). Off only for the instructor's reference run, whose kernels fill the shared builds.

    ``lease``: the ``lease.DeviceLease`` of a GPU shared with other submissions; graded timings then ask it for
    the GPU to themselves (time spent waiting for it is not held against a test's time limit).

    ``on_cell``: called with the grade_id (None for an ungraded cell) of each cell the checker starts, in order, as
    the polling sees it start (a cell shorter than a poll: when the poll after it sees it).
    ``skip_demos``: leave out the instructor's ``demo`` cells (the reference run leaves them out too: it runs the
    plan every submission's recheck runs, so a kept cell that needed a demo fails there first, for the
    instructor). A demo builds no kernel that nbgrader's runs would then compile for every submission.
    """
    workdir = Path(workdir).absolute()
    # the checker's folder, whose parent is the grader's: held by descriptor, everything in it reached through
    # ``untrusted`` (the checker, and a library it loaded, can write it)
    workdir.parent.mkdir(parents=True, exist_ok=True)  # the caller's folder: no sandbox writes it
    with Folder(workdir.parent) as parent:
        parent.make_folder(workdir.name)
    box = Folder(workdir)
    try:
        return _run_clean(box, instructor_nb, student_nb, workdir, cell_timeout=cell_timeout,
                          total_timeout=total_timeout, limits=limits, env=env, device=device, sandbox=sandbox,
                          hide=hide, lease=lease, kernels_in_worker=kernels_in_worker, on_cell=on_cell,
                          skip_demos=skip_demos, wall_timeout=wall_timeout, total_wall_timeout=total_wall_timeout,
                          only=only,
                          check_requirements=check_requirements)
    finally:
        box.close()


def _builds_ahead(instructor_nb: dict, student_nb: dict) -> list:
    """The submission's kernel builds, planned from its literal ``*_SOURCE`` texts (read, never run), for its
    kernel worker to compile ahead; [] where its notebook cannot be read that way (its cells build as they run)."""
    from ...labs.build_plan import notebook_builds
    from ...notebook_sources import string_assignments
    try:
        with _PLANNING:  # it parses every cell, as a plan does
            return notebook_builds(instructor_nb, string_assignments(student_nb), only_values=True)
    except Exception:  # noqa: BLE001 - a plan, never a verdict: a notebook of any shape builds as it runs
        return []


def _run_clean(box, instructor_nb, student_nb, workdir, *, cell_timeout, total_timeout, limits, env, device,
               sandbox, hide, lease, kernels_in_worker, on_cell, skip_demos, wall_timeout, total_wall_timeout, only,
               check_requirements) -> CleanResult:
    cells, flags = clean_plan(instructor_nb, student_nb, skip_demos=skip_demos)
    if only is not None:
        cells = _only(cells, only)
    plan_path = workdir / "clean-plan.json"
    graded = [c for c in cells if c["graded"]]
    verdicts: dict = {}
    refused_in: set = set()  # tests the checker saw fail on a refused kernel library (``CellEnd.refused``)
    env = runner_env(env if env is not None else os.environ, workdir, device)
    threads = config.cpu_threads(env)  # CPU time is divided by it: a test on several threads is charged its wall time
    wall_timeout = wall_timeout or wall_backstop(threads) * cell_timeout
    total_wall_timeout = total_wall_timeout or wall_backstop(threads) * total_timeout
    # a build is one step of a cell: on a busy machine it must not be stopped before the cell's own limits would
    try:
        build_timeout = float(env.get("FUSELAB_BUILD_TIMEOUT") or 300)
    except ValueError:
        build_timeout = 300.0
    env["FUSELAB_BUILD_TIMEOUT"] = str(max(build_timeout, wall_timeout + 60))
    if not kernels_in_worker:
        env[INSTRUCTORS_RUN_ENV] = "1"
    else:  # a student's run is never the instructor's, whatever the grader's own environment says
        env.pop(INSTRUCTORS_RUN_ENV, None)
    limits = limits or isolate.Limits()
    started = time.monotonic()
    start, restarts, gpu_wait, gpu_held, paused_before = 0, 0, 0.0, 0.0, 0.0
    cpu_before, blocked_before, ran_before = 0.0, 0.0, 0.0  # what the processes of the run's earlier starts used
    gpu_holds: list = []
    timeline: dict = {}
    cpu_timeline: dict = {}
    by_index = {c["index"]: c for c in cells}
    ahead = _builds_ahead(instructor_nb, student_nb) if kernels_in_worker else []
    while True:
        # a planted link is removed
        box.write_text(plan_path.name, json.dumps({"cells": cells, "start": start, "ahead": ahead}))
        # the checker's records come through a pipe opened here before it starts: no sandbox can name it
        channel, channel_w = Receiver.open()
        command = python_module("fuselab.grading.recheck.cellrunner", str(plan_path), str(channel_w))
        if sandbox:
            command = isolate.sandboxed(command, own=[workdir], hide=list(hide),
                                        readonly=shared_builds.readonly(env))
        grants = _Grants()  # the grader's answers to this checker's asks (its memory checks, the GPU's grants)
        grant_fds = (grants.read_fd,)
        spawned = time.time()
        # --memory-gb is the submission's: its three processes share it (each may still use it all alone)
        budget = isolate.MemoryBudget(limits.memory_bytes) if limits.memory_bytes else None
        worker, fds = _start_worker("solution", box, env, limits, sandbox, hide, lease, budget)
        kernel_worker, kernel_fds = None, ()
        try:
            if not env.get(INSTRUCTORS_RUN_ENV):
                kernel_worker, kernel_fds = _start_worker("kernel", box, env, limits, sandbox, hide, lease, budget)
            child_env = dict(env, FUSELAB_SOLUTION_FDS=f"{fds[1]},{fds[2]}")
            if kernel_fds:
                child_env["FUSELAB_KERNEL_FDS"] = f"{kernel_fds[1]},{kernel_fds[2]}"
                child_env[transfer.ENV] = str(kernel_fds[4])
            child_env[ANSWERS_FD_ENV] = str(grants.read_fd)
            if lease is not None:
                child_env[SHARED_GPU_ENV] = "1"
            child = isolate.Child(command, limits=limits, cwd=str(workdir), registry=lease, env=child_env,
                                  pass_fds=(fds[1], fds[2], *kernel_fds[1:3], *kernel_fds[4:], channel_w, *grant_fds),
                                  budget=budget)
            # the kernel worker runs the checker's launches and timings: it runs when the checker holds the GPU
            child.companions = (kernel_worker,) if kernel_worker is not None else ()
        finally:
            for fd in (*fds, *kernel_fds, channel_w, *grant_fds):
                os.close(fd)  # each end now lives only in the process that uses it: a death reads as EOF
        server = LeaseServer(lease, child, grants)
        # the cell running: (index, paused seconds when it started, CPU and blocked seconds when seen to start)
        stop_reason, cell_started, ran_over = None, None, False
        records: list = []  # this process's records, of the plan's cells
        pauses = PauseLog()
        meter = TreeMeter([child.process.pid, worker.process.pid, kernel_worker and kernel_worker.process.pid])
        roles = {child.process.pid: "checker", worker.process.pid: "solution worker",
                 **({kernel_worker.process.pid: "kernel worker"} if kernel_worker is not None else {})}
        charged = CpuCharges(meter, roles)

        def check_memory(number, budget=budget, grants=grants):
            """At a test's end, before its verdict: what the submission's processes hold then, all of them read at
            once (a watch's look every half second could miss a worker holding it for less). Over: all stopped."""
            if budget is None or budget.check_now() is None:
                grants(MEMORY, number)

        try:
            while child.alive():
                channel.wait(0.05)  # woken by the checker's record: its asks are answered at once
                pauses.sample(server.paused_s())
                records += _receive(channel, by_index, on_cell, server, check_memory)  # the GPU's: served below
                server.poll()  # may wait long for the GPU: the wait is a pause, wherever the test's start falls
                running = records[-1] if records and isinstance(records[-1], CellStart) else None
                paused = server.paused_s()
                cpu, blocked, ran = meter.read()
                charged.to(_label(by_index, running.index) if running else
                           ("process start" if not records else "between cells"), cpu_timeline)
                if running and (cell_started is None or cell_started[0] != running.index):
                    cell_started = (running.index, min(paused, pauses.at(running.time)), cpu, blocked, ran)
                if stop_reason is not None:
                    continue  # stopped: waiting for it to end
                if server.stop_reason:
                    stop_reason = server.stop_reason
                elif running:
                    # waiting for the GPU or stopped for others' timings is a pause: neither its clock nor its own
                    in_pause = paused - cell_started[1]
                    own = max(cpu - cell_started[2], ran - cell_started[4]) / threads + \
                        max(0.0, blocked - cell_started[3] - in_pause)
                    stop_reason, ran_over = _over_time(time.time() - running.time - in_pause, own,
                                                       cell_timeout, wall_timeout, "the test's")
                if stop_reason is None:
                    own = max(cpu_before + cpu, ran_before + ran) / threads + \
                        max(0.0, blocked_before + blocked - paused_before - paused)
                    stop_reason, ran_over = _over_time(time.monotonic() - started - paused_before - paused, own,
                                                       total_timeout, total_wall_timeout, "the submission's")
                if stop_reason is not None:
                    child.stop()
        except BaseException:
            child.stop()  # never left running (or registered) behind a grader error
            child.wait(timeout=10)
            channel.close()
            raise
        finally:
            server.close()  # the GPU and its slot go back to the others whatever happened here
            grants.close()
            for helper in (worker, kernel_worker):
                if helper is not None:
                    helper.stop(timed_out=False)
                    helper.wait(timeout=10)
        paused_before += server.paused_s()
        cpu, blocked, ran = meter.read()
        charged.to("process end", cpu_timeline)
        cpu_before, blocked_before, ran_before = cpu_before + cpu, blocked_before + blocked, ran_before + ran
        stopped = child.paused()  # read before the wait: an ended child is no longer the lease's to count
        flags += server.notes
        gpu_wait += server.waited_s
        gpu_held += server.held_s
        gpu_holds += server.holds
        outcome = child.wait(timeout=30)
        records += _receive(channel, by_index, on_cell, server)  # what it sent after the last poll
        channel.close()
        _add_timeline(timeline, records, by_index, spawned)
        # inside the speed test's time: how much of it was a wait for a slot, how much for the GPU to itself
        for label, seconds in ((SLOT_WAIT, server.slot_waited_s), (LEASE_WAIT, server.waited_s - server.slot_waited_s),
                               (HELD, server.held_s), (STOPPED, stopped)):
            if seconds > 0:
                timeline[label] = timeline.get(label, 0.0) + seconds
        _take_verdicts(records, by_index, verdicts, flags, refused_in)
        last = records[-1] if records else None
        if isinstance(last, Done):
            break
        # the process ended early: which cell did it die in, and why?
        due = {"first_try": stop_reason} if ran_over else None  # a wall-clock overrun: retried before it counts
        if last is None:
            why = stop_reason or f"the checking process {outcome.describe()} before running any cell: " \
                                 f"{outcome.stderr.strip()[-500:]}"
            _fail_rest(verdicts, graded, why, status="not run", retry=due)
            break
        culprit = by_index[last.index]
        if isinstance(last, Poisoned):
            why = last.why or "the CUDA context was poisoned (a fault such as an illegal memory access)"
        else:
            why = stop_reason or f"the process {outcome.describe()}"
        if culprit["graded"]:
            if isinstance(last, Poisoned) and culprit["grade_id"] in verdicts:
                # its kernel crashed the process it ran in (the worker's, or this one's CUDA context): a crash, said
                # as one, and no points even if the cell caught the error the crash raised here
                failed = verdicts[culprit["grade_id"]]
                failed.status, failed.message = "crashed", f"{why}: {failed.message}".rstrip(": ")[:4000]
                failed.points = 0.0
            if isinstance(last, CellStart):
                verdicts[culprit["grade_id"]] = CellVerdict(
                    culprit["grade_id"], 0.0, culprit["points"],
                    "timed out" if "timed out" in why else "crashed", why,
                    seconds=time.time() - last.time, retry=dict(due or {}))
            if "submission's time limit" in why:
                _fail_rest(verdicts, graded, why, status="not run", retry=due)
                break
            start = culprit["index"] + 1
            restarts += 1
            if not any(c["index"] >= start for c in graded):
                break
            continue
        label = culprit["grade_id"] or f"cell {culprit['index']}"
        _fail_rest(verdicts, graded, f"the notebook stopped in {label} (not a graded cell) before this test: {why}",
                   status="not run", retry=due)
        break
    _fail_rest(verdicts, graded, "", status="not run")
    for verdict in verdicts.values():
        if verdict.points < verdict.max_points and not verdict.retry and ran_out_of_gpu_memory(verdict):
            verdict.retry = {"first_try": GPU_MEMORY_RAN_OUT}
    if check_requirements:
        speed_needs_correctness(verdicts)
    from ...native_check import REFUSED_MARK
    refused = sorted(refused_in & set(verdicts))
    if refused:
        flags.append(f"a kernel library was {REFUSED_MARK} (see the message of {', '.join(refused)})")
    flags += [f"{grade_id}: {record['flag']}" for grade_id, verdict in verdicts.items()
              for record in verdict.speed if isinstance(record, dict) and record.get("flag")]
    return CleanResult(cells={c["grade_id"]: verdicts[c["grade_id"]] for c in graded}, flags=flags,
                       restarts=restarts, seconds=time.monotonic() - started, gpu_wait_s=gpu_wait,
                       gpu_held_s=gpu_held, gpu_holds=gpu_holds, timeline={k: round(v, 3) for k, v in timeline.items()},
                       cpu_timeline={label: {role: round(v, 2) for role, v in used.items()}
                                     for label, used in cpu_timeline.items()})


def retry_overruns(first: CleanResult, instructor_nb: dict, student_nb: dict, workdir, *, cell_timeout=300.0,
                   total_timeout=1800.0, wall_timeout=None, total_wall_timeout=None, **run_args) -> CleanResult:
    """Run again, in ``workdir``, the tests of ``first`` that a wall-clock backstop stopped (``retries_due``), with
    backstops ``RETRY_BACKSTOP`` times as long and the same limits of own time; ``first`` takes their verdicts,
    each saying what its first try was (``CellVerdict.retry``). The caller makes sure no other submission of its
    own runs meanwhile. A speed test zeroed because a retried test failed is run again too (speed counts only for
    a kernel that passed in the same run: the requirements are checked again on the merged verdicts)."""
    due = first.retries_due
    if not due:
        return first
    speed_after = [k for k, v in first.cells.items() if set(v.requires_failed) & set(due) and k not in due]
    env = run_args.get("env")
    backstop = wall_backstop(config.cpu_threads(runner_env(env if env is not None else os.environ, Path(workdir),
                                                           run_args.get("device"))))
    wall_timeout = RETRY_BACKSTOP * max(wall_timeout or 0.0, backstop * cell_timeout)
    total_wall_timeout = RETRY_BACKSTOP * max(total_wall_timeout or 0.0, backstop * total_timeout)
    again = run_clean(instructor_nb, student_nb, workdir, cell_timeout=cell_timeout, total_timeout=total_timeout,
                      wall_timeout=wall_timeout, total_wall_timeout=total_wall_timeout, only=[*due, *speed_after],
                      check_requirements=False, **run_args)
    for grade_id in [*due, *speed_after]:
        before, after = first.cells[grade_id], again.cells[grade_id]
        if grade_id in due:
            why = after.retry.get("first_try", "")
            why = "the GPU ran out of memory again" if why == GPU_MEMORY_RAN_OUT else why
            after.retry = {"first_try": before.retry["first_try"],
                           "retry": f"{after.status}, {after.points:g} of {after.max_points:g} points in "
                                    f"{after.seconds:.0f} s" + (f" ({why})" if why else "")}
        first.cells[grade_id] = after
    speed_needs_correctness(first.cells, among=[*due, *speed_after])
    first.flags += [flag for flag in again.flags if flag not in first.flags]
    first.restarts += again.restarts
    first.seconds += again.seconds
    first.gpu_wait_s += again.gpu_wait_s
    first.gpu_held_s += again.gpu_held_s
    first.gpu_holds += again.gpu_holds
    first.timeline[RETRIED] = round(first.timeline.get(RETRIED, 0.0) + again.seconds, 3)
    retried = first.cpu_timeline.setdefault(RETRIED, {})
    for used in again.cpu_timeline.values():
        for role, seconds in used.items():
            retried[role] = round(retried.get(role, 0.0) + seconds, 2)
    return first


# ``-m`` puts the working folder first on ``sys.path``, and a worker's is its own folder, which its submission can
# write: a ``fuselab/`` planted there (by native code of the kernel worker, say) would be what the next worker of
# that folder imports. ``-P`` (Python 3.11+) leaves it off; before 3.11 the bootstrap takes it off first.
_SAFE_PATH_BOOT = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; import runpy; "
                   "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def python_module(module: str, *args: str) -> list:
    """The command that runs ``python -m module args`` without importing anything from its working folder."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _SAFE_PATH_BOOT, module, *args]


def _start_worker(kind: str, box: Folder, env: dict, limits, sandbox: bool, hide, lease, budget=None):
    """Start the ``kind`` ("solution" or "kernel") worker; return it and the pipe ends ``(worker's in, checker's
    out, checker's in, worker's out)``, for the kernel worker followed by its transfer memory's descriptor (for
    the checker). It sees only its own folder (with ``sandbox``): never the plan, hidden
    tests or the checker's records, nor the other worker's folder; its builds go to its own cache there. What it prints goes
    to anonymous files of its keeper's (never read back, never a name in a folder it can write)."""
    workdir = box.path
    folder = box.make_folder(f"{kind}-process")  # a link the checker left in its place is removed, not followed
    to_worker_r, to_worker_w = os.pipe()
    from_worker_r, from_worker_w = os.pipe()
    command = python_module(f"fuselab.grading.recheck.{kind}_worker", str(to_worker_r), str(from_worker_w))
    if sandbox:
        command = isolate.sandboxed(command, own=[folder], hide=[*hide, workdir],
                                    readonly=shared_builds.readonly(env))
    worker_env = {k: v for k, v in env.items() if not k.startswith(("FUSELAB_GRADE_LOG", "FUSELAB_GPU_LEASE"))}
    worker_env["FUSELAB_CACHE_DIR"] = str(folder / "cache")
    pipes = (to_worker_r, to_worker_w, from_worker_r, from_worker_w)
    memory, counted = (), set()
    if kind == "kernel":  # the launches' buffers: memory for this worker and its checker alone (``transfer``)
        memory = (transfer.make(),)
        worker_env[transfer.ENV] = str(memory[0])
        # counted in the checker's tree, which holds it all its life: a worker that wrote it full and closed its
        # descriptor would otherwise leave it counted by neither
        info = os.fstat(memory[0])
        counted = {(info.st_dev, info.st_ino)}
    try:
        worker = isolate.Child(command, limits=limits, env=worker_env, cwd=str(folder), registry=lease,
                               pass_fds=(to_worker_r, from_worker_w, *memory), budget=budget,
                               counted_elsewhere=counted)
    except BaseException:
        for fd in (*pipes, *memory):
            os.close(fd)
        raise
    return worker, (*pipes, *memory)


def speed_needs_correctness(verdicts: dict, policy=None, among=None) -> None:
    """Zero every speed test whose timed kernel failed a correctness test it requires (``speed_requires`` in the
    policy), in this same clean run: a fast kernel that is wrong earns no speed points. ``among``: check only
    these tests (the others were checked already)."""
    from ... import speed
    policy = policy or speed.load_policy()
    for grade_id, verdict in verdicts.items():
        if among is not None and grade_id not in among:
            continue
        tests = {r.get("test") for r in verdict.speed if isinstance(r, dict)}
        required = [name for test in sorted(t for t in tests if isinstance(t, str))
                    for name in policy["tests"].get(test, {}).get("speed_requires", [])]
        failed = [name for name in dict.fromkeys(required)
                  if name not in verdicts or verdicts[name].points < verdicts[name].max_points]
        if not failed:
            continue
        why = ", ".join(f"{name} {'did not run' if name not in verdicts else verdicts[name].status}"
                        for name in failed)
        measured = f" (it measured {verdict.points:g} of {verdict.max_points:g} points)" if verdict.points else ""
        verdict.message = f"speed counts only for a kernel that passes its correctness tests: {why}{measured}"
        verdict.points = 0.0
        if verdict.status != "not measured (no GPU)":
            verdict.status = "failed"
        verdict.requires_failed = failed


class _Grants:
    """The grader's end of one checker's grant pipe (``channel.Asker`` reads it): a grant is written whole or
    not at all, never blocking the grader (a checker that reads none fills the pipe, and is stopped)."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)

    def __call__(self, what: str, number: int) -> bool:
        try:  # a write of less than PIPE_BUF bytes to a pipe is all or nothing
            return os.write(self.write_fd, grant_line(what, number)) > 0
        except OSError:  # full (BlockingIOError) or the checker is gone (BrokenPipeError)
            return False

    def close(self) -> None:
        os.close(self.write_fd)


def _receive(channel: Receiver, by_index: dict, on_cell, server: LeaseServer | None = None, memory=None) -> list:
    """The checker's new records that are of the plan's cells (its asks for the GPU go to ``server``, for a memory
    check to ``memory``); each cell start's grade_id goes to ``on_cell``."""
    new = []
    for record in channel.poll():
        if isinstance(record, Ask) and record.what == MEMORY:
            if memory is not None:
                memory(record.number)
        elif isinstance(record, Ask) and server is not None:
            server.ask(record.what, record.number)
        elif isinstance(record, GiveBack) and server is not None:
            server.given_back(record.what, record.number)
        elif isinstance(record, Done) or (isinstance(record, (CellStart, CellEnd, Poisoned))
                                          and record.index in by_index):
            new.append(record)
    if on_cell is not None:
        for start in (r for r in new if isinstance(r, CellStart)):
            on_cell(by_index[start.index]["grade_id"])
    return new


# Every submission sharing a GPU allocates from its one memory: a test that ran out of it may have lost to the
# others' tensors, not to its own code (on an H100 with 16 sharing it, 15 of 120 correct submissions lost points
# so, docs/RESULTS.md). Such a test is run again alone (``retry_overruns``) before it can score 0; running out
# there too is its own. What is looked for are the errors torch and the CUDA libraries raise when an allocation
# fails; text a submission prints can at most buy its own test a second, alone, run.
GPU_MEMORY_RAN_OUT = "the GPU ran out of memory while other submissions shared it"


def ran_out_of_gpu_memory(verdict: CellVerdict) -> bool:
    """Whether a test's failure says an allocation on the GPU failed: its message, its output, its speed records."""
    said = " ".join([verdict.message or "", verdict.output or "",
                     *(json.dumps(record, default=str) for record in verdict.speed or [])]).lower()
    return says_gpu_memory_ran_out(said)


def _take_verdicts(records: list, by_index: dict, verdicts: dict, flags: list, refused: set) -> None:
    """Score each graded cell the checker ended (``_score``) into ``verdicts``; add the checker's flags, and to
    ``refused`` the tests it saw fail on a refused kernel library."""
    for end in (r for r in records if isinstance(r, CellEnd)):
        cell = by_index[end.index]
        if cell["graded"]:
            verdicts[cell["grade_id"]] = _score(cell, end)
            if end.refused == REFUSED:
                refused.add(cell["grade_id"])
        flag = f"{cell['grade_id'] or 'cell ' + str(cell['index'])}: {HOST_WROTE_KERNEL_MEMORY}"
        if end.flag == HOST_WROTE_KERNEL_MEMORY and flag not in flags:
            flags.append(flag)  # the checker's own record (a setup cell rerun after a restart says it once)


class CpuCharges:
    """Each new ``TreeMeter`` read's CPU seconds, per process, charged to the step running when it was taken."""

    def __init__(self, meter: TreeMeter, roles: dict):
        self.meter, self.roles = meter, roles
        self._reads, self._seen = meter.reads, dict(meter.by_root)

    def to(self, label: str, timeline: dict) -> None:
        if self.meter.reads == self._reads:
            return
        self._reads = self.meter.reads
        for root, role in self.roles.items():
            used = self.meter.by_root.get(root, 0.0) - self._seen.get(root, 0.0)
            if used > 0:
                step = timeline.setdefault(label, {})
                step[role] = step.get(role, 0.0) + used
        self._seen = dict(self.meter.by_root)


def _label(by_index: dict, index: int) -> str:
    """A cell's label in the timelines: its grade_id, or ``cell N``."""
    cell = by_index[index]
    return cell["grade_id"] or f"cell {cell['index']}"


def _add_timeline(timeline: dict, records: list, by_index: dict, spawned: float) -> None:
    """Add one process's cells to ``timeline``; a cell's label is its grade_id or ``cell N``."""
    starts = [r for r in records if isinstance(r, CellStart)]
    if starts:
        timeline["process start"] = timeline.get("process start", 0.0) + max(0.0, starts[0].time - spawned)
    def add(index, seconds):
        label = _label(by_index, index)
        timeline[label] = timeline.get(label, 0.0) + seconds
    for end in (r for r in records if isinstance(r, CellEnd)):
        add(end.index, end.seconds)
    if records and isinstance(records[-1], CellStart):  # the cell the process died or was stopped in
        add(records[-1].index, max(0.0, time.time() - records[-1].time))


def _fail_rest(verdicts, graded, why, status, retry=None):
    for cell in graded:
        if cell["grade_id"] not in verdicts:
            verdicts[cell["grade_id"]] = CellVerdict(cell["grade_id"], 0.0, cell["points"], status, why,
                                                     retry=dict(retry or {}))


def _over_time(wall: float, own: float, limit: float, wall_limit: float, whose: str):
    """``(why, ran_over)`` for a cell (or a run) past its limit of own time or its wall-clock backstop, else
    ``(None, False)``. ``own``: the module doc's, never more than ``wall`` (a test on more threads than it has
    cores). ``ran_over``: only the backstop stopped it."""
    own = min(wall, own)
    if own > limit:
        return f"timed out after {limit:.0f} s of its own time ({whose} time limit)", False
    if wall > wall_limit:
        return (f"timed out: still running after {wall_limit:.0f} s of wall-clock time, {own:.0f} s of them its own "
                f"({whose} time limit is {limit:.0f} s of its own time)"), True
    return None, False


def _only(cells: list, grade_ids) -> list:
    """The plan for ``grade_ids`` alone: the cells that are not tests, and those tests, up to the last of them."""
    grade_ids = set(grade_ids)
    kept = [c for c in cells if not c["graded"] or c["grade_id"] in grade_ids]
    last = max((k for k, c in enumerate(kept) if c["graded"]), default=-1)
    return kept[: last + 1]
