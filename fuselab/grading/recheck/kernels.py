"""The student's kernels in the clean recheck, the checker's side: built, loaded and launched in the kernel worker.

The checker (``cellrunner``) holds the hidden tests, the float64 references and every verdict. A student's
kernel library is native code: loaded into the checker it could rewrite any of them (a constructor, a pointer
walked to the interpreter), and loaded next to the student's Python (the solution worker) it could be wrapped
by it. So ``fuselab.build`` in the checker hands a student's source to the kernel worker (``kernel_worker``),
which runs no student Python, and returns a ``WorkerModule``. Its launchers send their tensors' whole storages
(guard bands included: a write past the end lands in them, as it would here) through a file both map
(``transfer``) and their views through the pipe; the worker launches the kernel on its own copies and writes
every storage back; the checker copies those bytes into its own tensors and checks them in its own memory.
What crosses back is bytes where, and as many as, the checker sent.

The instructor's kernels (the labs' fixed references, built before any student ran into the read-only shared
builds) stay in the checker: they are trusted, and the speed test times the reference here.

Speed. The timing needs the student's kernel and the GPU in one process: a speed test cell runs in the kernel
worker, so its measurement is that process's word. The checker takes it only within what it verifies itself
(``SpeedCheck``): the kernel passed the correctness tests (the policy's ``speed_requires``); the points come from
the checker's policy; and the worker's speedup may not exceed the one the checker's own clock measures from
outside (a batch of the student's calls in the worker, one round trip, against the same batch of the reference
here), plus ``WALL_TOLERANCE``. Without that bound there are no points.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import time

import torch

from ...errors import HostWroteKernelMemory
from . import wire
from .remote import RemoteFunction, RemoteModule, SolutionProcess
from .transfer import Transfer, as_bytes

# fuselab's own errors a kernel request may raise in the worker; they cross by name and keep their type here,
# so a cell's `except fuselab.NotWrittenError` and the feedback's wording work as in a student's own run
KERNEL_ERRORS = ("BuildError", "UnsupportedConstruct", "BuildTimeout", "NotWrittenError", "LaunchError",
                 "HostWroteKernelMemory")

# how far the worker's speedup may exceed the one the checker's clock measured from outside before it is capped
# (and flagged): the two differ in method (events and an L2 flush there, back-to-back calls here). On the H200,
# 19 honest speed tests of four labs, 10 submissions sharing the GPU, gave worker/outside ratios of 0.997-1.016
# (docs/RESULTS.md, 2026-12-01): 5 % is three times the widest, and all a faking worker could add.
WALL_TOLERANCE = 0.05
WALL_BATCH_S = 0.25  # the reference's batch lasts about this long, so one round trip (~0.1 ms) is noise
MAX_WALL_CALLS = 5000


# ------------------------------------------------------------------------------- checker side

class KernelProcess(SolutionProcess):
    GONE = "the process that runs your kernels ended (a crash in your kernel or launcher, say)"


class KernelHost:
    """The checker's handle on the kernel worker: ``fuselab.build`` calls ``build`` for a student's source."""

    ahead = ()  # the student's builds, sent to be compiled ahead with the first request (``cellrunner``)

    def __init__(self, process, transfer_fd: int):
        self.process = process
        self.transfer = Transfer(transfer_fd)  # the launches' buffers (``transfer``)
        self.poisoned = False        # a launch left the worker's CUDA context unusable
        self.current_source = ""     # the cell the checker is running (a speed test runs it in the worker)
        self.launches = 0
        self.released = 0  # ``launches`` when the worker last let go of its copies (``release``)
        self.holding = False         # the grader's lease, taken for the worker's timing (``request``)
        # launchers whose host code wrote kernel memory outside a kernel (emulation): the cell that launched
        # them fails, and is flagged, even if it caught the error
        self.host_writes: list = []

    def request(self, message, hold=None):
        """Send ``message``; its reply. On the way the worker may ask for the GPU to itself (its timing's
        ``exclusive_gpu``): with ``hold`` (a ``contextlib.ExitStack``) its first ask takes the grader's lease into
        it, held until the caller closes it, through the rest of the worker's speed test (its refreshed inputs'
        check) and the checker's own batches: one settling of the GPU, not two. Any other ask is refused, and the
        worker times without it."""
        if self.ahead:
            ahead, self.ahead = self.ahead, []
            self.process.request(("compile_ahead", ahead))  # returns at once: the compilers run in the background
        reply = self.process.request(message)
        while _is(reply, "lease"):
            if hold is None or self.holding:
                reply = self.process.request(("refused",))
                continue
            from ...speed.lease import exclusive_gpu
            hold.enter_context(exclusive_gpu())
            hold.callback(setattr, self, "holding", False)
            self.holding = True
            reply = self.process.request(("granted",))
        if type(reply) is list and len(reply) == 4 and reply[0] == "raise" and reply[1] == "fuselab":
            raise _kernel_error(reply[2], reply[3])
        return reply

    def build(self, kwargs: dict, protos, backend: str, source: str, name: str):
        reply = self.request(("build", kwargs))
        if type(reply) is list and len(reply) == 2 and reply[0] == "refused" and type(reply[1]) is str:
            from ...native_check import NativeCodeRefused, RefusedModule
            return RefusedModule(NativeCodeRefused(reply[1]), protos, backend, source, name)
        if not (type(reply) is list and len(reply) == 3 and reply[0] == "built" and type(reply[1]) is int
                and type(reply[2]) is dict):
            self.process.result(reply)  # an exception from the worker, raised here; or a malformed reply
            raise wire.WireError("the kernel process sent a malformed reply to a build")
        info = reply[2]
        seconds = info.get("build_seconds")
        return WorkerModule(self, reply[1], protos, backend, source, name,
                            build_seconds=float(seconds) if type(seconds) is float and math.isfinite(seconds) else 0.0,
                            cached=info.get("cached") is True)

    def launch(self, module: "WorkerModule", launcher: str, args, kwargs):
        self.launches += 1
        storages, packed_args, packed_kwargs = _pack(args, kwargs)
        regions = self.transfer.regions([s.numel() for s in storages],
                                        pin=any(s.device.type == "cuda" for s in storages))
        for storage, (offset, size) in zip(storages, regions):
            self.transfer.region(offset, size).copy_(storage)
        places = [(offset, size, storage.device.type) for storage, (offset, size) in zip(storages, regions)]
        try:
            reply = self.request(("launch", module.handle, launcher, places, packed_args, packed_kwargs))
        except HostWroteKernelMemory:
            self.host_writes.append(launcher)
            raise
        if type(reply) is list and reply and reply[0] == "poisoned":
            self.poisoned = True
            raise RuntimeError(f"{launcher}: the kernel left the GPU context unusable ({str(reply[1])[:300]}); "
                               "the grader goes on in a fresh process")
        self.process.result(reply)  # raises what the launch raised
        for storage, (offset, size) in zip(storages, regions):  # only where, and as much as, the checker sent
            storage.copy_(self.transfer.region(offset, size))

    def release(self) -> None:
        """At a test's end: the worker lets go of the GPU memory its launches kept, if it launched since it last
        did (``KernelWorker.release``). Never at the cost of the next cell: a gone or poisoned worker is the next
        cell's to meet."""
        if self.launches == self.released or self.process.gone or self.poisoned:
            return
        self.released = self.launches
        with contextlib.suppress(Exception):
            self.process.result(self.request(("release",)))

    def run_cell(self, label: str, source: str, namespace: dict, exports=()):
        """Run an instructor's cell that is not a test in the kernel worker too, after the solution values it may
        use: plain data only (a student's function stays in the solution worker; it never runs here)."""
        values = {}
        for name in exports:
            value = namespace.get(name)
            if name in namespace and not isinstance(value, (RemoteFunction, RemoteModule)):
                try:
                    pickle.dumps(value)
                except Exception:  # noqa: BLE001 - not plain data: the cells here do without it
                    continue
                values[name] = value
        try:
            self.process.result(self.request(("cell", label, source, values)))
        except Exception:  # noqa: BLE001 - the checker ran the cell itself; a dead worker is seen after the cell
            pass

    def warm_speed_test(self) -> float:
        """Seconds the worker took to ready its kernel list for the speed test to come (its error, if any, is the
        speed test's to meet and say)."""
        started = time.perf_counter()
        with contextlib.suppress(Exception):
            self.process.result(self.request(("speed_warm",)))
        return time.perf_counter() - started

    def measure_speedup(self, test_id, max_points, checker_side: dict, input_sets: int) -> dict:
        """A speed test: run in the kernel worker, bounded by what the checker's own clock saw (``SpeedCheck``)."""
        # The GPU is the speed test's alone from the worker's timing to the end of the checker's batches: the input
        # sets, references and checks before them share it with the other submissions.
        check = SpeedCheck(self, checker_side, input_sets)
        record, clock = None, time.perf_counter()
        try:
            check.prepare()
            prepared = time.perf_counter()
            with contextlib.ExitStack() as hold:
                reply = self.request(("speed", self.current_source, test_id), hold=hold)
                worker_done = time.perf_counter()
                record = check.verdict(test_id, max_points, _record(self.process.result(reply)))
            record.setdefault("phases", {}).update({"checker's input sets": prepared - clock,
                                                    "outside clock": time.perf_counter() - worker_done})
            return record
        finally:
            # the speed test's slot goes back with its memory: both processes' GPU-sized sets are let go, and the
            # caching allocator's blocks returned, for the next speed test on this GPU. Never at the cost of the
            # verdict or of the error being raised: a poisoned or gone worker keeps its memory until it ends.
            clock = time.perf_counter()
            check.sets = check.outs = None
            if not (self.process.gone or self.poisoned):
                with contextlib.suppress(Exception):
                    self.process.result(self.request(("speed_end",)))
            with contextlib.suppress(Exception):
                _free_gpu_memory()
            if record is not None:  # the same dict the caller gets
                record["phases"]["memory returned"] = time.perf_counter() - clock


class WorkerModule:
    """A student's built library, loaded in the kernel worker: launchers by name, as ``fuselab.Module``."""

    def __init__(self, host, handle, protos, backend, source, name, log="", build_seconds=0.0, cached=False):
        self.kernel_host, self.handle = host, handle
        self.backend, self.source, self.name = backend, source, name
        self.device = torch.device("cuda" if backend == "cuda" else "cpu")
        self.log, self.build_seconds, self.cached = log, build_seconds, cached
        self.library_path = ""  # not loaded in this process
        self.launchers = {}
        for proto in protos:
            launcher = WorkerLauncher(self, proto)
            self.launchers[proto.name] = launcher
            setattr(self, proto.name, launcher)

    @property
    def emulated(self) -> bool:
        return self.backend == "emulate"

    def set_thread_order(self, order: str = "forward", seed: int = 0):
        self.kernel_host.process.result(self.kernel_host.request(("thread_order", self.handle, str(order),
                                                                  int(seed))))

    def __repr__(self):
        how = "loaded from cache" if self.cached else f"built in {self.build_seconds:.2f} s"
        names = ", ".join(l.prototype.signature() for l in self.launchers.values())
        return f"<fuselab module {self.name!r} [{self.backend}] {how}: {names}>"


class WorkerLauncher:
    def __init__(self, module: WorkerModule, proto):
        self._module, self.prototype = module, proto
        self.__name__ = proto.name
        self.__doc__ = f"{proto.signature()}: calls `{proto.declaration}`"

    @property
    def emulated(self) -> bool:
        return self._module.emulated

    def __repr__(self):
        return f"<launcher {self.prototype.signature()} ({self._module.backend})>"

    def __call__(self, *args, **kwargs):
        try:
            self._module.kernel_host.launch(self._module, self.prototype.name, args, kwargs)
        except Exception as exc:
            exc.fuselab_origin = ("kernel", self.prototype.name)  # where, for a hidden test's verdict (failures)
            raise


def _pack(args, kwargs):
    """Tensors become ``("tensor", storage index, dtype, offset, size, stride)``; their distinct storages are sent
    whole, as bytes, once each (two views of one buffer stay one buffer in the worker)."""
    storages: list = []   # the checker's own tensors, viewed as bytes: sent as they are, overwritten on return
    by_pointer: dict = {}

    def one(value):
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            key = (value.device.type, value.device.index, storage.data_ptr(), storage.nbytes())
            if key not in by_pointer:
                by_pointer[key] = len(storages)
                storages.append(as_bytes(value))
            return ("tensor", by_pointer[key], str(value.dtype).replace("torch.", ""), value.storage_offset(),
                    tuple(value.shape), tuple(value.stride()))
        if isinstance(value, (list, tuple)):
            return type(value)(one(v) for v in value) if type(value) in (list, tuple) else value
        return value

    packed_args = tuple(one(a) for a in args)
    packed_kwargs = {k: one(v) for k, v in kwargs.items()}
    return storages, packed_args, packed_kwargs


def _is(reply, word: str) -> bool:
    """Whether the worker's ``reply`` is the one-word message ``word`` (plain types only: nothing of its own runs)."""
    return type(reply) is list and len(reply) == 1 and type(reply[0]) is str and reply[0] == word


def _kernel_error(name, message):
    """fuselab's own error type, made with the worker's message alone (whatever its constructor's arguments)."""
    from ... import errors
    cls = getattr(errors, name, None) if name in KERNEL_ERRORS else None
    if cls is None:
        return RuntimeError(str(message))
    error = cls.__new__(cls)
    Exception.__init__(error, str(message))
    for attribute, default in (("diagnostics", ""), ("log", "")):
        setattr(error, attribute, default)
    return error


# ------------------------------------------------------------------------------- the speed test's bound

def _synchronize():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _free_gpu_memory(collect: bool = True):
    """Return what PyTorch's caching allocator keeps of tensors no longer used to the driver (other processes
    sharing the GPU can then have it). ``collect``: first free what only reference cycles still hold (a caught
    exception's frames, say); it costs some 30 ms of CPU with torch imported, so a test that passed skips it."""
    if collect:
        import gc
        gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# What a kernel worker's speed record may say, in the course's own words: the worker runs the student's native
# code, so a status outside this list (text the kernel could have shaped) is read as "error"
SPEED_STATUSES = ("measured", "not measured (no GPU)")
NOT_OWN_KERNELS = "launched other kernels than its own (a fused op must launch exactly its own kernel)"
NOT_ON_ITS_STREAM = "its work is not on the stream it is given (it escapes a CUDA graph's capture, and the timing)"
OUT_OF_GPU_MEMORY = "the speed test did not finish in the kernel process: the GPU ran out of memory"
WORKER_STATUSES = (*SPEED_STATUSES, NOT_OWN_KERNELS, NOT_ON_ITS_STREAM, OUT_OF_GPU_MEMORY, "error")


def _record(value) -> dict:
    """The worker's speed record: only the numbers the checker reads, and a status from the course's own list."""
    if type(value) is not dict:
        raise wire.WireError("the kernel process sent a speed record that is not a dict")
    status = value.get("status")
    record = {"status": status if type(status) is str and status in WORKER_STATUSES else "error"}
    for key in ("speedup", "student_s", "reference_s"):
        item = value.get(key)
        if type(item) is float and math.isfinite(item) and item > 0:
            record[key] = item
    ci = value.get("ci")
    if type(ci) is list and len(ci) == 2 and all(type(v) is float and math.isfinite(v) for v in ci):
        record["ci"] = ci
    from ...speed.graded import PHASES
    phases = value.get("phases")
    if type(phases) is dict:  # where the worker's time went, for the throughput report only: it grades nothing
        record["phases"] = {k: v for k, v in phases.items()
                            if type(k) is str and k in PHASES and type(v) is float and math.isfinite(v) and v >= 0}
    return record


class SpeedCheck:
    """What the checker verifies of a speed the worker measured: its own clock, from outside, over a batch."""

    def __init__(self, host: KernelHost, checker_side: dict, input_sets: int):
        self.host, self.side, self.input_sets = host, checker_side, input_sets
        self.sets = self.outs = None

    def prepare(self) -> None:
        """The checker's input sets and outputs at the policy's shape, and its reference warmed, before anything
        holds the GPU; without them (no reference of its own) ``wall_speedup`` has no bound to give."""
        reference_op, make_inputs = self.side.get("reference_op"), self.side.get("make_inputs")
        if reference_op is None or make_inputs is None:
            return
        shape = tuple(self.side["shape"])  # the policy's, never a shape the worker names
        sets = [make_inputs(shape, seed=1000 + k) for k in range(self.input_sets)]
        expected = self.side["reference"](*[x.double() if torch.is_tensor(x) else x for x in sets[0]]).shape
        self.sets, self.outs = sets, [torch.empty(expected, device=sets[0][0].device, dtype=sets[0][0].dtype)
                                      for _ in sets]
        before = self.host.launches
        self._reference_batch(len(sets))  # warm, and: is the reference this process's own?
        if self.host.launches != before:
            self.sets = None  # the reference was not built in the shared builds: it runs in the worker too

    def verdict(self, test_id, max_points, worker_record: dict) -> dict:
        from ... import timing
        record = dict(worker_record, test=test_id, max_points=max_points, points=0.0, mode=self.side["mode"],
                      shape=list(self.side["shape"]), threshold=float(self.side["threshold"]),
                      gpu=self.side.get("gpu"))
        if self.side.get("policy_note"):
            record["policy_note"] = self.side["policy_note"]
        if record["status"] == "error":
            record["status"] = "the speed test did not finish in the kernel process"
            return record
        if record["status"] != "measured" or "speedup" not in record:
            if record["status"] == "measured":
                record["status"] = "not measured (the timing gave no speedup)"
            return record
        wall = self.wall_speedup(record)
        if wall is None:  # fail closed: a speedup only the kernel's own process vouches for earns nothing
            record["status"] = "not verified: the grader could not time the lab's reference itself"
            record["flag"] = f"{test_id}: {record['status']}"
            return record
        speedup = record["speedup"]
        record["wall_speedup"] = wall
        bound = wall * (1 + WALL_TOLERANCE)
        if speedup > bound:
            record["flag"] = (f"the speedup measured next to the kernel ({speedup:.2f}x) is more than the "
                              f"grader's own clock allows ({wall:.2f}x over a batch of calls, "
                              f"+{WALL_TOLERANCE:.0%}): graded at {bound:.2f}x")
            speedup = bound
        record["worker_speedup"], record["speedup"] = record["speedup"], speedup  # the report shows the graded one
        record["graded_speedup"] = speedup
        record["points"] = timing.speedup_points(speedup, record["threshold"], max_points)
        return record

    def _reference_batch(self, count):
        started = time.perf_counter()
        for k in range(count):
            self.side["reference_op"](*self.sets[k % len(self.sets)], self.outs[k % len(self.outs)])
        _synchronize()
        return time.perf_counter() - started

    def wall_speedup(self, record):
        """The reference's batch time here over the student's batch time in the worker, both by this clock, with
        the GPU to themselves (held since the worker's timing, or taken now)."""
        if self.sets is None:
            return None
        from ...speed.lease import exclusive_gpu
        with contextlib.nullcontext() if self.host.holding else exclusive_gpu():
            # as many calls on each side, sized by this clock (never by a number the worker sent)
            per_call = self._reference_batch(len(self.sets)) / len(self.sets)
            calls = min(MAX_WALL_CALLS, max(len(self.sets), int(WALL_BATCH_S / max(per_call, 1e-7))))
            reference_wall = self._reference_batch(calls) / calls
            started = time.perf_counter()
            self.host.process.result(self.host.request(("speed_batch", calls)))
            student_wall = (time.perf_counter() - started) / calls
        record.update(reference_wall_s=reference_wall, student_wall_s=student_wall)
        return reference_wall / student_wall if student_wall > 0 else None
