"""The student's kernels in the clean recheck: built, loaded and launched in the solution worker, never here.

The checker (``cellrunner``) holds the hidden tests, the float64 references and every verdict. A student's
kernel library is native code: loaded into the checker it could rewrite any of them (a constructor, a pointer
walked to the interpreter), so ``fuselab.build`` in the checker hands a student's source to the worker
(``KernelHost.build``) and returns a ``WorkerModule``. Its launchers send their tensors' whole storages (guard
bands included: a write past the end lands in them, as it would here) and views, the worker launches the
kernel on its copies and sends every storage back; the checker copies those bytes into its own tensors and
checks them in its own memory. What crosses back is bytes of the size that was sent, nothing else.

The instructor's kernels (the labs' fixed references, built before any student ran into the read-only shared
builds) stay in the checker: they are trusted, and the speed test times the reference here.

Speed. The timing needs the student's kernel and the GPU in one process: a speed test runs whole in the
worker (``measure_speedup``), so its measurement is the worker's word. The checker takes that word only
within what it can verify itself (``SpeedCheck``): the kernel passed the correctness tests (the policy's
``speed_requires``), and the worker's speedup is no larger than the checker's own clock allows: the checker
times a batch of the student's calls in the worker from outside (wall clock, one round trip) and the same
batch of the reference here, and caps the graded speedup at that ratio plus ``WALL_TOLERANCE``.
"""

from __future__ import annotations

import math
import time

import torch

from . import wire

# fuselab's own errors a kernel request may raise in the worker; they cross by name and keep their type here,
# so a cell's `except fuselab.NotWrittenError` and the feedback's wording work as in a student's own run
KERNEL_ERRORS = ("BuildError", "UnsupportedConstruct", "BuildTimeout", "NotWrittenError", "LaunchError")

# how far the worker's speedup may exceed the one the checker's clock measured from outside before it is capped
# (and flagged): the two differ in method (events and an L2 flush there, back-to-back calls here)
WALL_TOLERANCE = 0.15
WALL_BATCH_S = 0.25  # the reference's batch lasts about this long, so one round trip (~0.1 ms) is noise
MAX_WALL_CALLS = 5000


# ------------------------------------------------------------------------------- checker side

class KernelHost:
    """The checker's handle on the worker's kernels: ``fuselab.build`` calls ``build`` for a student's source."""

    def __init__(self, process):
        self.process = process
        self.poisoned = False        # a launch left the worker's CUDA context unusable
        self.current_source = ""     # the cell the checker is running (a speed test runs it in the worker)
        self.launches = 0

    def request(self, message):
        reply = self.process.request(message)
        if type(reply) is list and len(reply) == 4 and reply[0] == "raise" and reply[1] == "fuselab":
            raise _kernel_error(reply[2], reply[3])
        return reply

    def build(self, kwargs: dict, protos, backend: str, source: str, name: str):
        reply = self.request(("build", kwargs))
        if type(reply) is list and len(reply) == 2 and reply[0] == "refused" and type(reply[1]) is str:
            from ..native_check import NativeCodeRefused, RefusedModule
            return RefusedModule(NativeCodeRefused(reply[1]), protos, backend, source, name)
        if not (type(reply) is list and len(reply) == 3 and reply[0] == "built" and type(reply[1]) is int
                and type(reply[2]) is dict):
            self.process.result(reply)  # an exception from the worker, raised here; or a malformed reply
            raise wire.WireError("the solution process sent a malformed reply to a build")
        info = reply[2]
        return WorkerModule(self, reply[1], protos, backend, source, name,
                            log=str(info.get("log", "")), build_seconds=float(info.get("build_seconds", 0.0)),
                            cached=bool(info.get("cached", False)))

    def launch(self, module: "WorkerModule", launcher: str, args, kwargs):
        self.launches += 1
        storages, packed_args, packed_kwargs = _pack(args, kwargs)
        reply = self.request(("launch", module.handle, launcher, [s for s, _ in storages], packed_args,
                              packed_kwargs))
        if type(reply) is list and reply and reply[0] == "poisoned":
            self.poisoned = True
            raise RuntimeError(f"{launcher}: the kernel left the GPU context unusable ({str(reply[1])[:300]}); "
                               "the grader goes on in a fresh process")
        returned = self.process.result(reply)
        _unpack(storages, returned, launcher)

    def measure_speedup(self, test_id, max_points, checker_side: dict, expected_kernels, input_sets, budget_s):
        """A speed test: measured in the worker, bounded by what the checker's own clock saw (``SpeedCheck``)."""
        from ..grading.lease import exclusive_gpu
        with exclusive_gpu():
            reply = self.request(("speed", self.current_source, test_id))
            worker_record = _record(self.process.result(reply))
            check = SpeedCheck(self, worker_record, checker_side, input_sets)
            return check.verdict(test_id, max_points)


class WorkerModule:
    """A student's built library, loaded in the solution worker: launchers by name, as ``fuselab.Module``."""

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
        self._module.kernel_host.launch(self._module, self.prototype.name, args, kwargs)


def _pack(args, kwargs):
    """Tensors become ``("tensor", storage index, dtype, offset, size, stride)``; their distinct storages are sent
    whole, as bytes, once each (two views of one buffer stay one buffer in the worker)."""
    storages: list = []   # [(bytes tensor sent, the checker's own bytes view)]
    by_pointer: dict = {}

    def one(value):
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            key = (value.device.type, value.device.index, storage.data_ptr(), storage.nbytes())
            if key not in by_pointer:
                mine = torch.empty(0, dtype=torch.uint8, device=value.device).set_(storage)
                by_pointer[key] = len(storages)
                storages.append((mine, mine))
            return ("tensor", by_pointer[key], str(value.dtype).replace("torch.", ""), value.storage_offset(),
                    tuple(value.shape), tuple(value.stride()))
        if isinstance(value, (list, tuple)):
            return type(value)(one(v) for v in value) if type(value) in (list, tuple) else value
        return value

    packed_args = tuple(one(a) for a in args)
    packed_kwargs = {k: one(v) for k, v in kwargs.items()}
    return storages, packed_args, packed_kwargs


def _unpack(storages, returned, launcher):
    """Copy the storages the worker sent back into the checker's tensors, after checking they are the same size."""
    if type(returned) is not list or len(returned) != len(storages):
        raise wire.WireError(f"{launcher}: the solution process sent back the wrong number of buffers")
    for (_, mine), theirs in zip(storages, returned):
        if type(theirs) is not torch.Tensor or theirs.dtype != torch.uint8 or theirs.dim() != 1 \
                or theirs.numel() != mine.numel() or theirs.device.type != mine.device.type:
            raise wire.WireError(f"{launcher}: the solution process sent back a buffer of another size or kind")
        mine.copy_(theirs)


def _kernel_error(name, message):
    from .. import errors
    cls = getattr(errors, name, None) if name in KERNEL_ERRORS else None
    return (cls or RuntimeError)(str(message))


# ------------------------------------------------------------------------------- the speed test's bound

def _synchronize():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _record(value) -> dict:
    """The worker's speed record, with only the fields and types the checker reads."""
    if type(value) is not dict:
        raise wire.WireError("the solution process sent a speed record that is not a dict")
    numbers = ("points", "speedup", "threshold", "max_points", "student_s", "reference_s")
    record = {}
    for key, item in value.items():
        if key in numbers and (type(item) in (int, float)) and math.isfinite(item):
            record[key] = float(item)
        elif key in ("status", "mode", "gpu", "gpu_uuid", "policy_note", "test") and type(item) is str:
            record[key] = item[:500]
        elif key in ("ci", "shape") and type(item) is list and all(type(v) in (int, float) for v in item):
            record[key] = [float(v) if key == "ci" else int(v) for v in item][:8]
    return record


class SpeedCheck:
    """What the checker verifies of a speed the worker measured: its own clock, from outside, over a batch."""

    def __init__(self, host: KernelHost, worker_record: dict, checker_side: dict, input_sets: int):
        self.host, self.worker, self.side, self.input_sets = host, worker_record, checker_side, input_sets

    def verdict(self, test_id, max_points) -> dict:
        from .. import timing
        record = dict(self.worker, test=test_id, max_points=max_points, worker_points=self.worker.get("points"))
        record["points"] = 0.0
        if record.get("status") != "measured" or "speedup" not in record:
            record.setdefault("status", "not measured in the solution process")
            return record
        threshold = float(self.side["threshold"])
        speedup = record["speedup"]
        wall = self.wall_speedup(record)
        if wall is None:
            record["wall_note"] = "the checker could not time the reference itself: the speedup is the worker's"
        else:
            record["wall_speedup"] = wall
            bound = wall * (1 + WALL_TOLERANCE)
            if speedup > bound:
                record["flag"] = (f"the speedup measured next to the kernel ({speedup:.2f}x) is more than the "
                                  f"grader's own clock allows ({wall:.2f}x over a batch of calls, "
                                  f"+{WALL_TOLERANCE:.0%}): graded at {bound:.2f}x")
                speedup = bound
        record["worker_speedup"], record["speedup"] = record["speedup"], speedup  # the report shows the graded one
        record["graded_speedup"] = speedup
        record["threshold"] = threshold
        record["points"] = timing.speedup_points(speedup, threshold, max_points)
        return record

    def wall_speedup(self, record):
        """The reference's batch time here over the student's batch time in the worker, both by this clock."""
        reference_op, make_inputs = self.side.get("reference_op"), self.side.get("make_inputs")
        if reference_op is None or make_inputs is None or "reference_s" not in record:
            return None
        shape = tuple(self.side["shape"])  # the policy's, never a shape the worker names
        sets = [make_inputs(shape, seed=1000 + k) for k in range(self.input_sets)]
        expected = self.side["reference"](*[x.double() if torch.is_tensor(x) else x for x in sets[0]]).shape
        outs = [torch.empty(expected, device=sets[0][0].device, dtype=sets[0][0].dtype) for _ in sets]

        def reference_batch(count):
            started = time.perf_counter()
            for k in range(count):
                reference_op(*sets[k % len(sets)], outs[k % len(sets)])
            _synchronize()
            return time.perf_counter() - started
        before = self.host.launches
        reference_batch(len(sets))  # warm, and: is the reference this process's own?
        if self.host.launches != before:
            return None  # the reference was not built in the shared builds: it runs in the worker too
        # as many calls on each side, sized by this clock (never by a number the worker sent)
        per_call = reference_batch(len(sets)) / len(sets)
        calls = min(MAX_WALL_CALLS, max(len(sets), int(WALL_BATCH_S / max(per_call, 1e-7))))
        reference_wall = reference_batch(calls) / calls
        started = time.perf_counter()
        self.host.process.result(self.host.request(("speed_batch", calls)))
        student_wall = (time.perf_counter() - started) / calls
        record.update(reference_wall_s=reference_wall, student_wall_s=student_wall)
        return reference_wall / student_wall if student_wall > 0 else None


# ------------------------------------------------------------------------------- worker side

def _error_record(exc: BaseException) -> list:
    from .. import errors
    if isinstance(exc, errors.FuselabError) and type(exc).__name__ in KERNEL_ERRORS:
        message = str(exc)
        log = getattr(exc, "log", "") or ""
        if log and log not in message:
            message = f"{message}\n{log}"
        return ["raise", "fuselab", type(exc).__name__, message[-20000:]]
    return wire.exception_record(exc)


def serve_build(worker, kwargs) -> list:
    from .. import native_check
    from ..build import build
    try:
        module = build(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - crosses as its type and message
        return _error_record(exc)
    if isinstance(module, native_check.RefusedModule):
        return ["refused", str(module.error)]
    return ["built", worker.keep(module), {"log": str(module.log)[-20000:], "cached": bool(module.cached),
                                          "build_seconds": float(module.build_seconds)}]


def serve_launch(worker, handle, launcher, storages, args, kwargs) -> list:
    module = worker.handles.get(handle)
    if module is None or launcher not in getattr(module, "launchers", {}):
        return ["raise", "AttributeError", f"no launcher {launcher!r}"]
    buffers = [s.untyped_storage() for s in storages]

    def one(value):
        if type(value) is tuple and len(value) == 6 and value[0] == "tensor":
            _, index, dtype, offset, size, stride = value
            view = torch.empty(0, dtype=getattr(torch, dtype), device=storages[index].device)
            return view.set_(buffers[index], offset, size, stride)
        if type(value) in (list, tuple):
            return type(value)(one(v) for v in value)
        return value
    try:
        module.launchers[launcher](*[one(a) for a in args], **{k: one(v) for k, v in kwargs.items()})
        if module.backend == "cuda":
            torch.cuda.synchronize()
    except BaseException as exc:  # noqa: BLE001
        from .cellrunner import _cuda_poisoned
        if module.backend == "cuda" and _cuda_poisoned():
            return ["poisoned", f"{type(exc).__name__}: {exc}"[:500]]
        return _error_record(exc)
    return ["ok", wire.encode(list(storages))]


def serve_thread_order(worker, handle, order, seed) -> list:
    try:
        worker.handles[handle].set_thread_order(order, seed)
    except BaseException as exc:  # noqa: BLE001
        return _error_record(exc)
    return ["ok", ["v", None]]


def serve_speed(worker, source: str, test_id: str) -> list:
    """Run the speed test cell the checker is running, here where the kernel is; send its record."""
    from .. import grade
    grade.LAST_RECORD = grade.LAST_TIMED = None
    error = worker.run_speed_cell(source)
    record = grade.LAST_RECORD
    if record is None or record.get("test") != test_id:
        return ["ok", wire.encode({"status": f"the speed test did not run in the solution process"
                                             f"{': ' + error if error else ''}"[:500]})]
    return ["ok", wire.encode({k: v for k, v in record.items() if type(v) in (int, float, str, list)})]


def serve_speed_batch(calls: int) -> list:
    from .. import grade
    if grade.LAST_TIMED is None:
        return ["raise", "RuntimeError", "no timed call to repeat"]
    for _ in range(max(1, int(calls))):
        grade.LAST_TIMED()
    _synchronize()
    return ["ok", ["v", None]]
