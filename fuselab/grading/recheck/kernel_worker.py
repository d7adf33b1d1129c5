"""The clean recheck's kernel worker: the only process of the recheck that loads a student's kernel library.

    python -m fuselab.grading.recheck.kernel_worker IN_FD OUT_FD

The grader starts it next to the checker (``cellrunner``) and the solution worker, connected to the checker by
two pipes it inherits. It never runs a line of the student's Python: it runs the notebook's own cells that are
not tests (setup, builds, helpers), with the values the student's solution cells defined given to it by the
checker as plain data (the ``*_SOURCE`` texts), builds the student's kernels, launches them on the tensors the
checker sends (``kernels``), and runs a speed test cell when the checker asks. It never sees a hidden test: a
test cell that holds one is never sent (``cellrunner``), and the checker keeps every verdict.

What a student's native code can still do here is the worker's word and nothing more: the checker compares the
buffers a launch sends back in its own memory, and bounds a speed measured here by its own clock.

Requests (pickles from the checker): ``("cell", label, source, values)``, ``("compile_ahead", builds)``,
``("build", kwargs)``,
``("launch", handle, launcher, places, args, kwargs)`` (the storages wait in ``transfer``'s memory), ``("thread_order", handle, order, seed)``,
``("speed_warm",)``, ``("speed", source, test_id)``, ``("speed_batch", calls)``, ``("speed_end",)``,
``("release",)``. Replies (``wire.dump_tree``): ``["ok", value]``,
``["built", handle, info]``, ``["refused", message]``, ``["poisoned", message]``, ``["raise", type, message]``
or ``["raise", "fuselab", type, message]``. In the middle of a request, a timing here asks for the GPU with
``["lease"]`` and waits for the checker's answer (``_lease_from_checker``).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import pickle
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

from ... import config
from . import cuda_waits, lazy_plots, wire
from .cellrunner import _cuda_poisoned, _execute
from .failures import says_gpu_memory_ran_out
from .kernels import (KERNEL_ERRORS, NOT_OWN_KERNELS, NOT_ON_ITS_STREAM, OUT_OF_GPU_MEMORY, SPEED_STATUSES,
                      _free_gpu_memory, _synchronize)
from .transfer import ENV as TRANSFER_ENV, Transfer

MAX_BUFFERS = 16
MAX_AHEAD = 8  # builds compiled ahead at once: more than any lab's notebook makes


class KernelWorker:
    def __init__(self, transfer_fd: int):
        self.namespace = {"__name__": "__main__", "display": lambda *objects, **_: None}
        self.modules: dict = {}
        self.buffers: dict = {}  # (argument slot, bytes, device) → the launch copies' memory, reused
        self.transfer = Transfer(transfer_fd)  # the launches' buffers, the grader's memory (``transfer``)
        self.ahead: list = []  # the compilers started ahead (``compile_ahead``), as futures

    def cell(self, label, source, values):
        """An instructor's cell that is not a test, after the solution values it may use; its error or None."""
        self.namespace.update(values)
        try:
            _execute(source, self.namespace, f"<{label}>")
        except BaseException as exc:  # noqa: BLE001 - the checker ran the same cell and has its own verdict
            return ["ok", ["v", f"{type(exc).__name__}: {exc}"[:500]]]
        return ["ok", ["v", None]]

    def compile_ahead(self, builds) -> list:
        """The submission's kernels compiled side by side, in the background (planned by the grader from the
        submission's own texts, ``labs.build_plan``): the cells' builds, one after another, find them done or
        wait for them under each build's lock. Nothing is loaded here, and a failure is the cell's build's to say.
        The jobs are made here, on this thread (they parse the launchers; ``ast.parse`` is not safe in two
        threads at once); only the compilers, processes of their own, run in the background."""
        from ...kernelbuild import compile_ahead, job_ahead
        jobs = [job for job in (job_ahead(b["source"], b["launchers"], name=b["name"])
                                for b in builds[:MAX_AHEAD] if _planned_build(b)) if job is not None]
        if jobs:
            pool = ThreadPoolExecutor(max_workers=min(len(jobs), config.cpu_threads()))  # its CPU share at once
            self.ahead = [pool.submit(compile_ahead, job) for job in jobs]
            pool.shutdown(wait=False)
        return ["ok", ["v", None]]

    def ahead_done(self) -> None:
        """Before a speed test: no compiler of this submission's runs beside its timing."""
        for compiling in self.ahead:
            compiling.result()
        self.ahead = []

    def build(self, kwargs) -> list:
        from ... import native_check
        from ...kernelbuild import build
        try:
            module = build(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - crosses as its type and message
            return _error_record(exc)
        if isinstance(module, native_check.RefusedModule):
            return ["refused", str(module.error)]
        handle = len(self.modules) + 1
        self.modules[handle] = module
        return ["built", handle, {"cached": bool(module.cached), "build_seconds": float(module.build_seconds)}]

    def launch(self, handle, launcher, places, args, kwargs) -> list:
        module = self.modules.get(handle)
        if module is None or launcher not in getattr(module, "launchers", {}):
            return ["raise", "AttributeError", f"no launcher {launcher!r}"]
        self.transfer.attach(max((offset + size for offset, size, _ in places), default=0),
                             pin=any(device == "cuda" for _, _, device in places))
        # copies of the checker's storages, in this process's own memory (a write past one stays in it)
        storages = [self.buffer(slot, size, device).copy_(self.transfer.region(offset, size))
                    for slot, (offset, size, device) in enumerate(places)]
        buffers = [s.untyped_storage() for s in storages]

        def one(value):
            if type(value) is tuple and len(value) == 6 and value[0] == "tensor":
                _, index, dtype, offset, size, stride = value
                view = torch.empty(0, dtype=getattr(torch, dtype), device=storages[index].device)
                return view.set_(buffers[index], offset, size, stride)  # offset in elements of `dtype`
            if type(value) in (list, tuple):
                return type(value)(one(v) for v in value)
            return value
        try:
            module.launchers[launcher](*[one(a) for a in args], **{k: one(v) for k, v in kwargs.items()})
            if module.backend == "cuda":
                torch.cuda.synchronize()
        except BaseException as exc:  # noqa: BLE001
            if module.backend == "cuda" and _cuda_poisoned():
                return ["poisoned", f"{type(exc).__name__}: {exc}"[:500]]
            return _error_record(exc)
        for storage, (offset, size, _) in zip(storages, places):
            self.transfer.region(offset, size).copy_(storage)
        return ["ok", ["v", None]]

    def buffer(self, slot: int, size: int, device: str) -> torch.Tensor:
        """The same memory for the same argument of the same size, call after call: as in a student's own loop,
        a kernel that keeps results keyed by its inputs' addresses meets new contents at an address it saw."""
        key = (slot, size, device)
        if key not in self.buffers:
            while len(self.buffers) >= MAX_BUFFERS:
                self.buffers.pop(next(iter(self.buffers)))
            self.buffers[key] = torch.empty(size, dtype=torch.uint8, device=device)
        return self.buffers[key]

    def release(self) -> list:
        """A test is over: its launches' copies are let go and the caching allocator's blocks returned, so the
        other submissions sharing the GPU can have them (a test's copies are not the next test's sizes)."""
        self.buffers.clear()
        _free_gpu_memory(collect=False)  # the copies are this dict's alone: no cycle holds them
        return ["ok", ["v", None]]

    def thread_order(self, handle, order, seed) -> list:
        try:
            self.modules[handle].set_thread_order(order, seed)
        except BaseException as exc:  # noqa: BLE001
            return _error_record(exc)
        return ["ok", ["v", None]]

    def speed(self, source, test_id) -> list:
        """Run the speed test cell the checker is running; send the numbers of its record the checker reads."""
        from ... import speed
        self.ahead_done()
        speed.graded.LAST_RECORD = speed.graded.LAST_TIMED = None
        try:
            _execute(source, self.namespace, "<speed test>")
            error = None
        except BaseException as exc:  # noqa: BLE001 - the checker reads the record, or its absence
            error = f"{type(exc).__name__}: {exc}"
        record = speed.graded.LAST_RECORD
        if record is None or record.get("test") != test_id:
            # the shared GPU's memory ran out (the grader runs such a test again alone), or another error
            status = OUT_OF_GPU_MEMORY if error and says_gpu_memory_ran_out(error) else "error"
            return ["ok", wire.encode({"status": status, "error": (error or "no record")[:300]})]
        status = record.get("status")
        reply = {"status": status if status in SPEED_STATUSES else _why_not(status)}
        for key in ("speedup", "reference_s", "student_s"):
            value = record.get(key)
            if type(value) in (int, float) and math.isfinite(value):
                reply[key] = float(value)
        if type(record.get("ci")) is list:
            reply["ci"] = [float(v) for v in record["ci"][:2] if type(v) in (int, float) and math.isfinite(v)]
        phases = record.get("phases")
        if type(phases) is dict:
            reply["phases"] = {k: float(v) for k, v in phases.items()
                               if k in speed.graded.PHASES and type(v) in (int, float) and math.isfinite(v)}
        return ["ok", wire.encode(reply)]

    def speed_batch(self, calls) -> list:
        from ... import speed
        if speed.graded.LAST_TIMED is None:
            return ["raise", "RuntimeError", "no timed call to repeat"]
        for _ in range(max(1, int(calls))):
            speed.graded.LAST_TIMED()
        _synchronize()
        return ["ok", ["v", None]]

    def speed_warm(self) -> list:
        """A speed test comes next: what lists its kernels is readied here, before the test takes its slot."""
        from ...speed.graded import warm_kernel_list
        self.ahead_done()
        try:
            warm_kernel_list()
        except Exception as exc:  # noqa: BLE001 - the speed test itself says what is wrong
            return _error_record(exc)
        return ["ok", ["v", None]]

    def speed_end(self) -> list:
        """The speed test is over: its input sets and outputs (kept for the checker's batch) are let go."""
        from ... import speed
        speed.graded.LAST_TIMED = speed.graded.LAST_RECORD = None
        _free_gpu_memory()
        return ["ok", ["v", None]]


def _planned_build(build) -> bool:
    return (type(build) is dict and type(build.get("source")) is str and type(build.get("name")) is str
            and type(build.get("launchers")) is list and all(type(p) is str for p in build["launchers"]))


def _why_not(status) -> str:
    """A speed test's failure, said in the course's own words (never a text the kernel could have shaped)."""
    status = status if isinstance(status, str) else ""
    if status.startswith("launched"):
        return NOT_OWN_KERNELS
    if "stream" in status or "captured" in status:
        return NOT_ON_ITS_STREAM
    return "error"


def _error_record(exc: BaseException) -> list:
    from ... import errors
    if isinstance(exc, errors.FuselabError) and type(exc).__name__ in KERNEL_ERRORS:
        return ["raise", "fuselab", type(exc).__name__, str(exc)[-20000:]]
    return wire.exception_record(exc)


REQUESTS = {"cell": KernelWorker.cell, "compile_ahead": KernelWorker.compile_ahead, "build": KernelWorker.build, "launch": KernelWorker.launch,
            "thread_order": KernelWorker.thread_order, "speed": KernelWorker.speed,
            "speed_batch": KernelWorker.speed_batch, "speed_end": KernelWorker.speed_end,
            "speed_warm": KernelWorker.speed_warm, "release": KernelWorker.release}


@contextlib.contextmanager
def _lease_from_checker(in_fd: int, out_fd: int):
    """A timing's ``exclusive_gpu`` here: asked in the middle of a request, the checker answers ``("granted",)``
    or ``("refused",)``. A grant is the checker's to give back: it holds the grader's lease from here to the end
    of its own batches, after this request (``kernels.KernelHost.request``)."""
    _synchronize()  # work queued before the block is not the timing's
    wire.send(out_fd, wire.dump_tree(["lease"]))
    pickle.load(io.BytesIO(wire.receive(in_fd)))  # either answer: the timing runs, held or not
    try:
        yield
    finally:
        _synchronize()


def main(in_fd: int, out_fd: int) -> int:
    lazy_plots.defer()  # the setup cell's plotting imports load only if a cell draws
    cuda_waits.sleep_in_waits()  # before CUDA starts: its waits for the shared GPU sleep (``cuda_waits``)
    from ...speed import lease
    lease.ask_through(lambda: _lease_from_checker(in_fd, out_fd))
    worker = KernelWorker(int(os.environ[TRANSFER_ENV]))
    while True:
        try:
            blob = wire.receive(in_fd)
        except EOFError:
            return 0
        try:
            request = pickle.load(io.BytesIO(blob))  # the checker's own pickles: the trusted direction
            serve = REQUESTS.get(request[0])
            reply = serve(worker, *request[1:]) if serve else ["raise", "RuntimeError", "unknown request"]
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory while loading the checker's tensors
            reply = wire.exception_record(exc)
        try:
            blob = wire.dump_tree(reply)
        except Exception as exc:  # noqa: BLE001
            blob = wire.dump_tree(["raise", "TypeError", f"the reply could not be sent: {exc}"[:500]])
        sys.stdout.flush()
        wire.send(out_fd, blob)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
