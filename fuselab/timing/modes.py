"""The three things "how long does it take" can mean on a GPU, as an explicit choice.

Each mode answers its own question, and for a program made of many small launches the answers differ:

- ``device`` (what :func:`fuselab.compare` and the graded speed tests use): how much *GPU time* one call takes,
  started from a cold L2, with the whole call queued before the GPU starts it. Host work (Python, the framework,
  the driver) is hidden, so a speedup in this mode is the GPU work that fusion removed.
- ``latency``: how long a program waits for *one* call started on an idle GPU, launch costs included.
- ``graph``: the GPU time of the call replayed as one CUDA graph, with almost no launch cost per kernel.

None of them is the *throughput of a stream of calls*: a loop that calls a network back to back, timed with
events around the whole block, no flush in between. There the host issues each call while the GPU runs the
previous one; where the host's work per call exceeds the GPU's (eager PyTorch at batch 1), the time per call is
the host's, and every module call and launch that fusion removed counts in full. So one change can measure
differently: folding the BatchNorms of Lab 2's eager network at batch 1 on the H200 gains more as a back-to-back
stream (fewer module calls for the host to issue) than in device mode (less GPU work per pass); the measured pair
is in fuselab/labs/results/lab2_network.json (docs/RESULTS.md, the lab2 stage at e72d315). Report
the mode that matches the question, and say which one it is.
"""

from enum import Enum

from ..errors import FuselabError


class Mode(str, Enum):
    """Which time a measurement reports.

    - ``DEVICE``: GPU time between two events around one call, with the launch queue kept full beforehand
      (by the L2 flush and a short spin kernel), so host launch latency is hidden and only the GPU's own work counts.
    - ``LATENCY``: the time of one call started on an idle GPU, between events recorded just before and after it,
      so host launch overhead (Python, the driver, the launch itself) is included, as a user calling it once sees it.
    - ``GRAPH``: the callable captured once in a ``torch.cuda.CUDAGraph`` and each replay timed with events,
      so its kernels run with the launch cost of a single graph launch.
    """

    DEVICE = "device"
    LATENCY = "latency"
    GRAPH = "graph"

    def __str__(self):
        return self.value

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Mode.DEVICE: "device time",
    Mode.LATENCY: "latency (launch included)",
    Mode.GRAPH: "CUDA-graph replay",
}


class TimingModeError(FuselabError, ValueError):
    """An unknown timing mode was asked for."""


def parse_mode(mode) -> Mode:
    """Turn ``"device"`` / ``"latency"`` / ``"graph"`` (or a :class:`Mode`) into a :class:`Mode`."""
    if isinstance(mode, Mode):
        return mode
    if isinstance(mode, str):
        key = mode.strip().lower()
        for candidate in Mode:
            if candidate.value == key:
                return candidate
    choices = ", ".join(repr(m.value) for m in Mode)
    raise TimingModeError(f"unknown timing mode {mode!r}: choose one of {choices}")
