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

    A built module (or a launcher, or a bound method of one) marks itself with ``emulated = True``;
    ``FUSELAB_BACKEND=emulate`` marks everything.
    """
    if config.backend_choice() == "emulate":
        return True
    for obj in (fn, getattr(fn, "__self__", None), getattr(fn, "func", None)):
        if obj is not None and getattr(obj, "emulated", False) is True:
            return True
    return False


@functools.lru_cache(maxsize=None)
def _spin_cycles_per_second(device_index: int) -> float:
    """Calibrate ``torch.cuda._sleep`` once per device: its argument is in clock cycles, not seconds."""
    with torch.cuda.device(device_index):
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # first call loads the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    return cycles / seconds if seconds > 0 else 1.5e9


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
