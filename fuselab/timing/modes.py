"""The three things "how long does it take" can mean on a GPU, as an explicit choice."""

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
