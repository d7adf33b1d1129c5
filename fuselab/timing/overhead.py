"""``launch_overhead``: what one kernel launch costs, measured several ways on an empty kernel."""

import dataclasses
import time

import torch

from . import gpu, stats
from .measure import measure

EMPTY_KERNEL_SOURCE = (
    "__global__ void empty_kernel() {}\n"
    "void launch_empty(int n, cudaStream_t stream) {\n"
    "  for (int i = 0; i < n; ++i) empty_kernel<<<1, 1, 0, stream>>>();\n"
    "}\n"
)
EMPTY_KERNEL_LAUNCHERS = ["void launch_empty(int n, cudaStream_t stream)"]


@dataclasses.dataclass(frozen=True)
class LaunchOverhead:
    """Microseconds per launch of an empty kernel.

    host_us: host time to issue one launch (a burst from C++, no synchronization).
    device_us: GPU time per kernel when launches queue up back to back on a busy GPU.
    idle_events_us: events around single launches issued one after another without a full queue: the GPU
        waits for the host between them, as naive event timing of a small kernel sees.
    latency_us: one launch on an idle GPU (``mode="latency"``), the cost a lone call pays.
    graph_us: per kernel inside a replayed CUDA graph.
    """

    host_us: float
    device_us: float
    idle_events_us: float
    latency_us: float
    graph_us: float
    kernels_per_burst: int
    kernel: str
    device: str

    def __repr__(self):
        return (f"<LaunchOverhead on {self.device} ({self.kernel})>\n"
                f"  host issue        {self.host_us:8.2f} us per launch\n"
                f"  device, queued    {self.device_us:8.2f} us per kernel\n"
                f"  events, idle gaps {self.idle_events_us:8.2f} us per launch\n"
                f"  latency, one call {self.latency_us:8.2f} us\n"
                f"  in a CUDA graph   {self.graph_us:8.2f} us per kernel")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def empty_kernel_launcher(device=None):
    """(launch(n), description): an empty CUDA kernel built with ``fuselab.build``, or, where that fails,
    the smallest torch kernel (``zero_`` of one element), with the reason in the description."""
    try:
        from ..kernelbuild import build

        module = build(EMPTY_KERNEL_SOURCE, EMPTY_KERNEL_LAUNCHERS)
        launch = module.launch_empty
        launch(1)
        torch.cuda.synchronize(device)
        return launch, "empty kernel built with fuselab.build"
    except Exception as error:
        scratch = torch.empty(1, device=gpu.resolve_device(device))

        def launch(n):
            for _ in range(n):
                scratch.zero_()

        return launch, f"torch zero_() of one element; fuselab.build failed ({type(error).__name__}: {error})"


def _idle_event_times(launch, device, calls=200):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    torch.cuda.synchronize(device)
    for start, end in zip(starts, ends):
        start.record()
        launch(1)
        end.record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def _host_issue_us(launch, kernels, device, repeats=20):
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        launch(kernels)
        samples.append((time.perf_counter() - start) / kernels * 1e6)
    torch.cuda.synchronize(device)
    return stats.median(samples)


def launch_overhead(device=None, kernels=100, budget_s=1.0) -> LaunchOverhead:
    """Measure the cost of launching an empty kernel (needs a GPU; a few seconds)."""
    if not gpu.cuda_ready():
        raise gpu.NoGPUError("launch overhead is a GPU property, and this machine has no GPU")
    device = gpu.resolve_device(device)
    with torch.cuda.device(device):
        launch, kernel = empty_kernel_launcher(device)
        common = dict(flush=False, device=device, budget_s=budget_s, progress=False, emulated=False)
        burst = measure(lambda: launch(kernels), mode="device", label="burst", **common)
        graph = measure(lambda: launch(kernels), mode="graph", label="graph", **common)
        single = measure(lambda: launch(1), mode="latency", label="single", **common)
        return LaunchOverhead(
            host_us=_host_issue_us(launch, kernels, device),
            device_us=burst.median / kernels * 1e6,
            idle_events_us=stats.median(_idle_event_times(launch, device)),
            latency_us=single.median * 1e6,
            graph_us=graph.median / kernels * 1e6,
            kernels_per_burst=kernels,
            kernel=kernel,
            device=gpu.device_name(device),
        )
