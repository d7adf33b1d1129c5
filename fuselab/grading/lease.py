"""The GPU to itself for each graded timing, while several submissions share that GPU for everything else.

Building, nbgrader's run and the correctness checks of a few submissions can share one GPU; a speedup
measurement cannot. So a graded timing asks for a *lease* on its GPU: the grader stops (``SIGSTOP``) every other
process tree it runs on that GPU, waits until the GPU has no kernel running (NVML's utilisation reads 0), lets
the timing run, and resumes the others (``SIGCONT``). One timing per GPU at a time; the stopped ones lose a few
seconds of wall time and nothing else.

The timing runs in the clean recheck's child, which asks through files in its own folder (it may be sandboxed,
so no signals or sockets): ``lease-request-N``, answered by ``lease-granted-N``, ended by ``lease-released-N``.
``fuselab.grade`` writes the child's side (``exclusive_gpu``); ``recheck.run_clean`` polls for the parent's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .isolate import children_of

REQUEST, GRANTED, RELEASED = "lease-request-", "lease-granted-", "lease-released-"


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def gpu_busy_percent(device) -> int | None:
    """NVML's utilisation of ``device`` (an index or a UUID, as ``CUDA_VISIBLE_DEVICES`` names it): the share of
    its last sample period in which a kernel ran. None where NVML is missing."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        handle = ctypes.c_void_p()
        if str(device).isdigit():
            status = nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(device)), ctypes.byref(handle))
        else:
            status = nvml.nvmlDeviceGetHandleByUUID(str(device).encode(), ctypes.byref(handle))
        rates = _Utilization()
        if status != 0 or nvml.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) != 0:
            return None
        return int(rates.gpu)
    except (OSError, AttributeError):
        return None


def wait_until_idle(device, timeout_s: float = 60.0, poll_s: float = 0.02) -> str:
    """Wait until no kernel runs on ``device``; returns "" or a note saying the GPU stayed busy."""
    deadline = time.monotonic() + timeout_s
    busy = gpu_busy_percent(device)
    if busy is None:
        time.sleep(0.2)  # no NVML: let kernels already queued by the stopped processes drain
        return ""
    while busy:
        if time.monotonic() > deadline:
            return (f"GPU {device} stayed busy ({busy}% utilisation) for {timeout_s:.0f} s with every other "
                    "submission stopped (another program's kernels?): this timing may be disturbed")
        time.sleep(poll_s)
        busy = gpu_busy_percent(device)
    return ""


def _signal_tree(pid: int, sig) -> None:
    # the parent first when stopping (it cannot start new children once stopped), last when continuing
    tree = [pid] + children_of(pid)
    for target in tree if sig == signal.SIGSTOP else reversed(tree):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, sig)


class DeviceLease:
    """The processes the grader runs on one GPU, and one exclusive timing at a time among them."""

    def __init__(self, device, idle_timeout_s: float = 60.0):
        self.device = device
        self.idle_timeout_s = idle_timeout_s
        self._timing = threading.Lock()
        self._lock = threading.Lock()
        self._children: set = set()
        self._holder = None
        self._stopped: list = []      # (child, pid) stopped for the current timing
        self._stopped_since = 0.0
        self._stopped_s: dict = {}    # child → seconds it spent stopped (not held against its time limits)

    def register(self, child) -> None:
        """A child process (``isolate.Child``) started on this GPU; stopped at once if a timing is running."""
        with self._lock:
            self._children.add(child)
            if self._holder is not None and child is not self._holder:
                _signal_tree(child.process.pid, signal.SIGSTOP)
                self._stopped.append((child, child.process.pid))

    def unregister(self, child) -> None:
        with self._lock:
            self._children.discard(child)
            self._stopped_s.pop(child, None)

    def stopped_seconds(self, child) -> float:
        with self._lock:
            return self._stopped_s.get(child, 0.0)

    def pids(self) -> set:
        """Every process of every registered child's tree."""
        with self._lock:
            roots = [c.process.pid for c in self._children]
        return {p for root in roots for p in [root] + children_of(root)}

    def acquire(self, holder) -> tuple:
        """Stop everyone else and wait for an idle GPU: ``(seconds waited, note)``."""
        started = time.monotonic()
        self._timing.acquire()
        with self._lock:
            self._holder = holder
            self._stopped_since = time.monotonic()
            for child in self._children:
                if child is not holder:
                    _signal_tree(child.process.pid, signal.SIGSTOP)
                    self._stopped.append((child, child.process.pid))
        note = wait_until_idle(self.device, self.idle_timeout_s)
        return time.monotonic() - started, note

    def release(self) -> None:
        with self._lock:
            paused = time.monotonic() - self._stopped_since
            for child, pid in reversed(self._stopped):
                _signal_tree(pid, signal.SIGCONT)
                if child in self._children:
                    self._stopped_s[child] = self._stopped_s.get(child, 0.0) + paused
            self._stopped, self._holder = [], None
        self._timing.release()


class LeaseServer:
    """The parent's side of one child's lease files (polled by ``recheck.run_clean``)."""

    def __init__(self, lease: DeviceLease | None, folder: Path, child):
        self.lease, self.folder, self.child = lease, Path(folder), child
        self.holding = None          # the request number being served
        self.waited_s = 0.0          # time this child spent waiting for the GPU
        self.held_s = 0.0            # time it had the GPU to itself (everyone else on it stopped)
        self.notes: list = []
        self._granted_at = 0.0

    def paused_s(self) -> float:
        """Seconds the child spent waiting for the GPU or stopped for others' timings: not its own time."""
        return self.waited_s + (self.lease.stopped_seconds(self.child) if self.lease is not None else 0.0)

    def poll(self) -> None:
        if self.lease is None:
            return
        if self.holding is None:
            requests = sorted(self.folder.glob(REQUEST + "*"))
            if requests:
                number = requests[0].name[len(REQUEST):]
                waited, note = self.lease.acquire(self.child)
                self.waited_s += waited
                if note:
                    self.notes.append(note)
                self.holding = number
                self._granted_at = time.monotonic()
                (self.folder / (GRANTED + number)).write_text("")
        elif (self.folder / (RELEASED + self.holding)).exists() or not self.child.alive():
            self.finish()

    def finish(self) -> None:
        if self.holding is not None:
            for prefix in (REQUEST, GRANTED, RELEASED):
                (self.folder / (prefix + self.holding)).unlink(missing_ok=True)
            self.holding = None
            self.held_s += time.monotonic() - self._granted_at
            self.lease.release()


_requests = 0


@contextlib.contextmanager
def exclusive_gpu():
    """The child's side: hold the GPU to this process for the ``with`` block, when the grader shares it.

    Outside the grader (``FUSELAB_GPU_LEASE`` unset: a student's own run) it does nothing.
    """
    global _requests
    folder = os.environ.get("FUSELAB_GPU_LEASE")
    if not folder:
        yield
        return
    torch = sys.modules.get("torch")
    synchronize = torch.cuda.synchronize if torch is not None and torch.cuda.is_initialized() else (lambda: None)
    synchronize()  # work queued before the block is not the timing's
    _requests += 1
    number = f"{os.getpid()}-{_requests:04d}"
    (Path(folder) / (REQUEST + number)).write_text("")
    granted = Path(folder) / (GRANTED + number)
    while not granted.exists():  # the grader's time limit for this test still applies
        time.sleep(0.002)
    try:
        yield
    finally:
        synchronize()
        (Path(folder) / (RELEASED + number)).write_text("")
