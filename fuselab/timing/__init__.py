"""GPU timing a performance engineer can trust.

- :func:`measure` one callable: CUDA events, warm-up, an L2 flush sized from the device, median and IQR,
  repetitions until the median's relative standard error reaches a target or a time budget runs out.
- :func:`compare` several callables interleaved, with speedups over a baseline and bootstrap intervals.
- Three explicit modes (:class:`Mode`): ``"device"``, ``"latency"``, ``"graph"``; which question each answers, and
  why none of them is the throughput of a stream of back-to-back calls: :mod:`fuselab.timing.modes`.
- Roofline context (:func:`ceilings`, :func:`achieved`) and :func:`launch_overhead`.
- Without a GPU everything runs on the host clock and says so; such results never earn speed points
  (:func:`speedup_points`).
"""

from .compare import compare
from .gpu import NoGPUError, cuda_ready
from .measure import measure
from .modes import Mode, TimingModeError
from .overhead import LaunchOverhead, launch_overhead
from .policy import full_points_threshold, speedup_points
from .results import Comparison, Measurement, Speedup
from .roofline import Achieved, Ceilings, achieved, ceilings
from .samplers import GraphCaptureError
from .selfcheck import selfcheck

__all__ = [
    "Achieved",
    "Ceilings",
    "Comparison",
    "GraphCaptureError",
    "LaunchOverhead",
    "Measurement",
    "Mode",
    "NoGPUError",
    "Speedup",
    "TimingModeError",
    "achieved",
    "ceilings",
    "compare",
    "cuda_ready",
    "full_points_threshold",
    "launch_overhead",
    "measure",
    "selfcheck",
    "speedup_points",
]
