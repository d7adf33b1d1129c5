"""What the timing code needs to know about the GPU: is there one, what is it called, is a callable emulated,
and how to keep it busy so that host launch latency stays out of device-time numbers."""

import functools
import platform

import torch

from .. import config
from ..errors import FuselabError


class NoGPUError(FuselabError, RuntimeError):
    """A measurement that only means something on a GPU was asked for on a machine without one."""


def cuda_ready() -> bool:
    """True when torch sees a usable CUDA device."""
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:  # a broken driver reports itself here; treat it as "no GPU"
        return False


def resolve_device(device=None) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def host_name() -> str:
    return f"CPU ({platform.processor() or platform.machine() or 'unknown'})"


def device_name(device=None) -> str:
    """The GPU's name, or the host's where there is no GPU."""
    if not cuda_ready():
        return host_name()
    return torch.cuda.get_device_name(resolve_device(device))


def is_emulated(fn) -> bool:
    """True when ``fn`` runs under fuselab's CPU emulation, whose times say nothing about a GPU.

    A built module and its launchers say so with ``emulated = True``. A wrapper such as
    ``lambda: mod.fused(x, y)`` is looked through one level: the objects it closes over or names as globals.
    ``FUSELAB_BACKEND=emulate`` marks everything. Pass ``emulated=`` to measure/compare to decide explicitly.
    """
    if config.backend_choice() == "emulate":
        return True
    return any(_marked_emulated(obj) for obj in _reachable(fn))


def _marked_emulated(obj) -> bool:
    try:
        return getattr(obj, "emulated", False) is True
    except Exception:  # a property that raises is not a mark
        return False


def _reachable(fn):
    yield fn
    yield getattr(fn, "__self__", None)
    yield getattr(fn, "func", None)  # functools.partial
    code = getattr(fn, "__code__", None)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    if code is not None:
        namespace = getattr(fn, "__globals__", {})
        for name in code.co_names:
            if name in namespace:
                yield namespace[name]


@functools.lru_cache(maxsize=None)
def _spin_cycles_per_second(device_index: int) -> float:
    """``torch.cuda._sleep`` counts clock cycles, not seconds. Use the highest rate the SMs reach: an idle GPU
    runs at a fraction of it, and a rate measured there would make every spin far too short once clocks rise."""
    rated_khz = getattr(torch.cuda.get_device_properties(device_index), "clock_rate", 0) or 0
    if rated_khz > 0:
        return rated_khz * 1e3
    with torch.cuda.device(device_index):
        best = 0.0
        for _ in range(5):  # the first spins raise the clocks
            cycles = 4_000_000
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
            if seconds > 0:
                best = max(best, cycles / seconds)
    return best or 2e9


def keep_busy(seconds: float, device=None, cap: float = 0.05) -> None:
    """Queue about ``seconds`` of GPU spinning on the current stream, so that the host can enqueue the calls
    that follow before the GPU reaches them: the timed calls then run back to back, as in a busy program."""
    seconds = min(max(seconds, 0.0), cap)
    if seconds <= 0.0 or not hasattr(torch.cuda, "_sleep"):
        return
    index = resolve_device(device).index
    cycles = int(seconds * _spin_cycles_per_second(index))
    if cycles > 0:
        torch.cuda._sleep(cycles)
