"""Timing sources: each one times single calls of a callable, one way per mode.

A sampler splits a timed call into ``enqueue`` (start it, without waiting) and ``collect`` (wait and read the
times), so that many GPU calls can be queued before the host synchronizes once, as ``triton.testing.do_bench``
does; a host synchronization between calls would leave the GPU idle and put launch latency in the numbers.
In device and graph mode each call is preceded by a short spin kernel, so the GPU is busy while the host
enqueues the call and never waits for it inside the timed region.
"""

import collections
import time

import torch

from ..errors import FuselabError
from . import gpu
from .l2 import L2Flush
from .capture import capture
from .modes import Mode, parse_mode


class GraphCaptureError(FuselabError, RuntimeError):
    """The callable could not be captured in a CUDA graph (it synchronizes, allocates on the host, ...)."""


class Sampler:
    """Base class: ``enqueue()`` starts one timed call and returns a token; ``collect(tokens)`` returns seconds."""

    clock = ""
    on_gpu = False
    flushed = False
    wants_busy_gpu = False  # True where host launch latency must be hidden behind GPU work queued first

    def __init__(self):
        self.notes = []
        self._host_costs = collections.deque(maxlen=16)

    def warmup(self) -> None:
        raise NotImplementedError

    def enqueue(self):
        raise NotImplementedError

    def collect(self, tokens) -> list:
        raise NotImplementedError

    @property
    def host_cost_s(self) -> float:
        """Host time one enqueue takes: the median of the recent ones, so a first call's compile is forgotten."""
        if not self._host_costs:
            return 0.0
        return sorted(self._host_costs)[len(self._host_costs) // 2]

    def _track_host_cost(self, seconds: float) -> None:
        self._host_costs.append(seconds)


class HostClockSampler(Sampler):
    """Times plain calls with a host clock: the fallback without a GPU or for emulated code.

    ``clock`` is any callable returning seconds; tests pass a fake one.
    """

    def __init__(self, fn, reason="no GPU", clock=time.perf_counter):
        super().__init__()
        self.fn = fn
        self._clock = clock
        self.clock = f"perf_counter ({reason})" if clock is time.perf_counter else f"host clock ({reason})"

    def warmup(self) -> None:
        self.fn()

    def enqueue(self):
        start = self._clock()
        self.fn()
        seconds = self._clock() - start
        self._track_host_cost(seconds)
        return seconds

    def collect(self, tokens) -> list:
        return [float(t) for t in tokens]


class _EventSampler(Sampler):
    """Shared machinery of the GPU modes: CUDA events on the current stream, optional L2 flush before each call."""

    on_gpu = True

    def __init__(self, fn, device=None, flush=True):
        super().__init__()
        self.fn = fn
        self.device = gpu.resolve_device(device)
        self.flush = L2Flush(self.device) if flush else None
        self.flushed = bool(flush)

    def _timed(self, body):
        host_start = time.perf_counter()
        if self.wants_busy_gpu:
            # A head start for the GPU, per call: a spin a little longer than the host needs to enqueue the
            # call. Spinning once per batch instead fails for host-bound callables: the launch queue holds
            # only ~1000 entries, and once it is full the GPU runs at the host's pace.
            gpu.keep_busy(1.25 * self.host_cost_s + 5e-6, self.device)
        if self.flush is not None:
            self.flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        body()
        end.record()
        self._track_host_cost(time.perf_counter() - host_start)
        return start, end

    def collect(self, tokens) -> list:
        if not tokens:
            return []
        torch.cuda.synchronize(self.device)
        return [start.elapsed_time(end) / 1e3 for start, end in tokens]

    def warmup(self) -> None:
        with torch.cuda.device(self.device):
            self.fn()
        torch.cuda.synchronize(self.device)


class DeviceTimeSampler(_EventSampler):
    """Device time: events around one call, the GPU kept busy beforehand so host launch latency is hidden."""

    clock = "CUDA events"
    wants_busy_gpu = True

    def enqueue(self):
        return self._timed(self.fn)


class LatencySampler(_EventSampler):
    """Latency: synchronize so the GPU is idle, then events around one call; the launch cost is included."""

    clock = "CUDA events from an idle GPU"

    def enqueue(self):
        if self.flush is not None:
            self.flush()
        torch.cuda.synchronize(self.device)  # idle GPU: the start event fires before the call is even launched
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host_start = time.perf_counter()
        start.record()
        self.fn()
        end.record()
        self._track_host_cost(time.perf_counter() - host_start)
        return start, end


class GraphReplaySampler(_EventSampler):
    """CUDA-graph replay: the callable captured once, each ``replay()`` timed with events on a busy GPU."""

    clock = "CUDA events around graph replay"
    wants_busy_gpu = True

    def __init__(self, fn, device=None, flush=True):
        super().__init__(fn, device, flush)
        self.graph = capture_graph(fn, self.device)

    def enqueue(self):
        return self._timed(self.graph.replay)

    def warmup(self) -> None:
        self.graph.replay()
        torch.cuda.synchronize(self.device)


def capture_graph(fn, device=None, warmup_calls=3):
    """Capture ``fn`` in a ``torch.cuda.CUDAGraph``.

    torch requires warm-up calls on a side stream before capture (lazy initialisation such as cuBLAS
    workspaces must not happen inside the graph); ``torch.cuda.graph`` then captures on its own side stream.
    """
    device = gpu.resolve_device(device)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.device(device):
            current = torch.cuda.current_stream(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(warmup_calls):
                    fn()
            current.wait_stream(side)
            torch.cuda.synchronize(device)
            failed = capture(graph, fn)  # a failed capture leaves random tensors working
            if failed is not None:
                raise failed
            torch.cuda.synchronize(device)
    except Exception as error:
        raise GraphCaptureError(
            "could not capture the callable in a CUDA graph; it must launch on the current stream and must not "
            f"synchronize or copy to the host ({type(error).__name__}: {error})"
        ) from error
    return graph


def make_sampler(fn, mode="device", flush=True, device=None, emulated=None, clock=time.perf_counter) -> Sampler:
    """The sampler for ``mode`` on this machine: GPU events where a GPU runs ``fn``, a host clock otherwise."""
    mode = parse_mode(mode)
    if not callable(fn):
        raise TypeError(f"expected a callable to time, got {type(fn).__name__}")
    if emulated is None:
        emulated = gpu.is_emulated(fn)
    if emulated or not gpu.cuda_ready():
        sampler = HostClockSampler(fn, reason="CPU emulation" if emulated else "no GPU", clock=clock)
        if mode is not Mode.DEVICE:
            sampler.notes.append(f"mode {mode.value!r} needs a GPU: plain calls were timed on the host clock")
        if flush:
            sampler.notes.append("no L2 flush without a GPU")
        return sampler
    if mode is Mode.DEVICE:
        return DeviceTimeSampler(fn, device, flush)
    if mode is Mode.LATENCY:
        return LatencySampler(fn, device, flush)
    return GraphReplaySampler(fn, device, flush)

