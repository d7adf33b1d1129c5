"""The clean recheck's child process: run a clean notebook's cells in order and report each one as it goes.

    python -m fuselab.grading.recheck.cellrunner PLAN.json CHANNEL_FD

PLAN: ``{"cells": [{"index", "grade_id", "source", "graded"}], "start": k, "ahead": builds}``. Cells before
``start`` that are graded are skipped (an earlier process already scored them); the others rerun, as the setup of
the cells from ``start`` on. ``ahead``: the student's builds, which the kernel worker compiles side by side before
the cells build them one after another (``labs.build_plan``). CHANNEL_FD: the write end of the pipe the grader
opened for this process (``channel``). Each cell sends a ``CellStart`` record before it runs and a ``CellEnd``
after, so the parent knows which cell was running
when this process crashed or hung. After a cell that failed, a poisoned CUDA context (a sticky fault) ends the
process with a ``Poisoned`` record: the parent restarts from the next cell in a fresh process.

Solution cells never run here: the solution worker (``solution_worker``) runs them, and the names they define
arrive as plain values or as proxies (``remote``); the setup cell runs in both. Nor do a student's kernels:
``fuselab.build`` hands them to the kernel worker (``kernels``), which runs the cells that are not tests too.
The workers' pipes are inherited file descriptors, named in ``FUSELAB_SOLUTION_FDS`` and ``FUSELAB_KERNEL_FDS``
("to,from").

A cell's result follows nbgrader's rules: an exception or anything on stderr (fd 2, so C code counts too) fails
it; its last expression's value is reported when it is a number. Tracebacks are not reported (they would show
hidden tests' source in feedback), only the exception's type and message; and of a failure in a hidden test, only
its type and where in the student's code it was raised (``failures``): nothing the student's code produced on
hidden inputs, printed output included, is kept.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import json
import numbers
import os
import sys
import tempfile
import time
import warnings

from ...notebook import HIDDEN_MARK
from . import channel, cuda_waits, failures, lazy_plots

MAX_TEXT = 4000


@contextlib.contextmanager
def _captured_fds():
    """Send fds 1 and 2 to temporary files for the duration; yields a dict filled with their text after."""
    libc = ctypes.CDLL(None)
    texts = {}
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    files = {fd: tempfile.TemporaryFile(mode="w+b") for fd in (1, 2)}
    for fd, handle in files.items():
        os.dup2(handle.fileno(), fd)
    try:
        yield texts
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        libc.fflush(None)
        for fd in (1, 2):
            os.dup2(saved[fd], fd)
            os.close(saved[fd])
            files[fd].seek(0)
            texts["stdout" if fd == 1 else "stderr"] = files[fd].read().decode(errors="replace")
            files[fd].close()


def _without_magics(source: str) -> str:
    # instructor cells may hold IPython magics (`%matplotlib inline`); there is no IPython here
    return "\n".join("pass  # " + line if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


def _execute(source: str, namespace: dict, filename: str):
    """Run ``source`` like a notebook cell; return the value of its last expression (or None)."""
    tree = ast.parse(_without_magics(source), filename=filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        return eval(compile(last, filename, "eval"), namespace)
    return None


def _cuda_poisoned() -> bool:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
        torch.empty(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return False
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return True


def _unusable(host, worker=None) -> str:
    """Why the next cells cannot run in these processes, or "": a poisoned CUDA context (here or in the kernel
    worker, where the student's kernels run), or a worker that died (a kernel's segfault; a solution cell's code
    that ended its process)."""
    if _cuda_poisoned():
        return "the CUDA context was poisoned (a fault such as an illegal memory access)"
    if host is not None and host.poisoned:
        return "the kernel left the kernel process's CUDA context unusable (a fault such as an illegal memory access)"
    if host is not None and host.process.gone:
        return "the process that runs your kernels ended (a crash in your kernel, say)"
    if worker is not None and worker.gone:
        return "the process that runs your solution cells ended (it crashed, or your code ended it)"
    return ""


def _let_go_of_test_memory(host, failed: bool) -> None:
    """After a test: the GPU memory it used here (its inputs and float64 references, kept by PyTorch's caching
    allocator once freed) and in the kernel worker (its launches' copies) goes back to the driver. Submissions
    sharing a GPU share its memory, and a test's blocks are not the next test's sizes: kept, they were most of
    what a grading held at its peak (``docs/RESULTS.md``)."""
    if host is not None:
        host.release()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        from .kernels import _free_gpu_memory
        with contextlib.suppress(Exception):
            _free_gpu_memory(collect=failed)  # a failure's traceback holds its frames' tensors in a cycle


def _display(*objects, **_):
    for obj in objects:
        print(repr(obj))


def _new_grade_records(log_path, seen):
    if not log_path or not os.path.exists(log_path):
        return [], seen
    with open(log_path) as handle:
        lines = handle.read().splitlines()
    return [json.loads(line) for line in lines[seen:] if line.strip()], len(lines)


def _solution_process():
    fds = os.environ.pop("FUSELAB_SOLUTION_FDS", "")
    if not fds:
        return None
    from .remote import SolutionProcess
    to_worker, from_worker = (int(fd) for fd in fds.split(","))
    return SolutionProcess(to_worker, from_worker)


def _kernel_host():
    """The kernel worker's host, through which ``fuselab.build`` builds and launches a student's kernels, or None
    (the instructor's reference run: its kernels load here)."""
    fds = os.environ.pop("FUSELAB_KERNEL_FDS", "")
    if not fds:
        return None
    from ...kernelbuild import use_kernel_host
    from .kernels import KernelHost, KernelProcess
    to_worker, from_worker = (int(fd) for fd in fds.split(","))
    from .transfer import ENV
    host = KernelHost(KernelProcess(to_worker, from_worker), int(os.environ[ENV]))
    use_kernel_host(host)
    return host


def _run_cell(cell, namespace, worker, host=None):
    """Run one cell of the plan here, or (a solution cell) in the solution worker; return its last value."""
    label = failures.cell_label(cell)
    if cell.get("solution"):
        if worker is None:
            raise RuntimeError("no solution process to run the solution cell in")
        names, error = worker.run_cell(label, cell["source"], want_names=cell.get("exports", []))
        # only the names the lab's own solution cell defines: a student's `class fuselab` or `def make` never
        # replaces a name the tests use
        namespace.update({k: v for k, v in names.items() if k in cell.get("exports", [])})
        if host is not None:  # the kernel worker's cells use these values too (plain data only)
            host.run_cell(label, "", namespace, cell.get("exports", []))
        if error:
            raise RuntimeError(f"your solution cell raised {error} (its other statements still ran)")
        return None
    value = _execute(cell["source"], namespace, f"<{label}>")
    if cell.get("shared") and worker is not None:
        worker.run_cell(label, cell["source"], want_names=False)
    if cell.get("instructor") and host is not None:
        host.run_cell(label, cell["source"], namespace)
    return value


def main(plan_path, channel_fd: int) -> int:
    lazy_plots.defer()  # the setup cell's plotting imports load only if a cell draws
    plan = json.loads(open(plan_path).read())
    worker = _solution_process()
    host = _kernel_host()
    if host is not None:  # asked with its first request: the worker answers once it has imported torch
        host.ahead = plan.get("ahead") or []
    cuda_waits.sleep_in_waits()  # before CUDA starts: its waits for the shared GPU sleep (``cuda_waits``)
    to_grader = channel.Sender(channel_fd)
    answers = os.environ.pop(channel.ANSWERS_FD_ENV, "")
    asker = channel.Asker(to_grader, int(answers)) if answers else None
    if asker is not None and os.environ.pop(channel.SHARED_GPU_ENV, ""):
        from ...speed import lease  # the grader shares this GPU: graded timings and speed tests ask it for it
        lease.talk_to_grader(asker)
    warnings.filterwarnings("ignore", message=".*non-interactive.*")  # plt.show() under Agg
    namespace = {"__name__": "__main__", "display": _display}
    grade_log = os.environ.get("FUSELAB_GRADE_LOG")
    seen = _new_grade_records(grade_log, 0)[1]
    unbound = {}  # name -> why it is missing: what an earlier cell that should have bound it failed with
    for cell in plan["cells"]:
        index = cell["index"]
        if index < plan.get("start", 0) and cell["graded"]:
            continue
        to_grader.send(channel.CellStart(index, cell["grade_id"]))
        if host is not None:  # a speed test runs this cell's source in the worker: never one with hidden tests
            host.current_source = "" if HIDDEN_MARK in cell["source"] else cell["source"]
        started = time.perf_counter()
        value, error, refused = None, None, None
        host_writes = len(host.host_writes) if host is not None else 0
        with _captured_fds() as output:
            try:
                value = _run_cell(cell, namespace, worker, host)
            except BaseException as exc:  # noqa: BLE001 - a cell's failure is its verdict
                # a hidden test's failure says its type and where the student's code raised it, nothing more
                error = failures.verdict_message(exc, cell, plan["cells"], MAX_TEXT)
                error = failures.because(error, exc, unbound)[:MAX_TEXT]
                refused = channel.REFUSED if failures.was_refused(exc) else None
        if error and not cell["graded"]:
            for name in failures.bound_names(cell):
                unbound.setdefault(name, f"{failures.cell_label(cell)}, which defines it, failed with {error}")
        flag = None
        if host is not None and len(host.host_writes) > host_writes:
            # host code wrote kernel memory outside a kernel: the cell fails even if it caught the error
            flag = failures.HOST_WROTE_KERNEL_MEMORY
            if error is None:
                error = failures.verdict_message(failures.host_wrote(host.host_writes[host_writes]), cell,
                                                 plan["cells"], MAX_TEXT)
        if asker is not None and cell["graded"]:
            with asker(channel.MEMORY):  # what the submission holds as its test ends, checked before its verdict
                pass
        if cell["graded"]:  # within the test's time: a kernel of its own still running holds it up, not the next
            _let_go_of_test_memory(host, failed=error is not None)
        records, seen = _new_grade_records(grade_log, seen)
        number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None
        stdout, stderr = output["stdout"][-MAX_TEXT:], output["stderr"][-MAX_TEXT:]
        shown = None if value is None or number is not None else repr(value)[:200]
        if failures.has_hidden_tests(cell["source"]):  # what a hidden test printed or warned is never kept
            stdout, shown = "", None
            stderr = failures.HIDDEN_OUTPUT if stderr.strip() else ""
        to_grader.send(channel.CellEnd(index, cell["grade_id"], error=error, value=number, shown=shown,
                                       stdout=stdout, stderr=stderr, seconds=time.perf_counter() - started,
                                       speed=records, flag=flag, refused=refused))
        why = _unusable(host, worker)
        if why:  # the next cells get a fresh checker and fresh workers (a cell may have swallowed the error)
            to_grader.send(channel.Poisoned(index, cell["grade_id"], why))
            return 3
    to_grader.send(channel.Done())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
