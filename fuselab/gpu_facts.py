"""Facts about the machine's NVIDIA GPUs, from NVML (``nvidia-ml-py``'s ``pynvml``), asked in this process.

The one place the package reads a GPU's model, memory, utilisation and the processes on it. NVML answers in
microseconds without a CUDA context (nvidia-smi, a program started per question, took a good part of a second
on a GPU that ten submissions share). A GPU is named as ``CUDA_VISIBLE_DEVICES`` names it: an index (NVML's
order is the PCI bus order, which the grader makes CUDA's too) or a ``GPU-`` UUID; a MIG slice is neither and
gets no answer, never the whole card's. Where there is no GPU, no driver or no ``pynvml`` (a CPU machine, CI),
every question gets None or an empty list.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def _nvml():
    """``pynvml``, initialised once for this process; None where it or the driver is missing."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - ImportError, or NVMLError of every kind: no GPU facts here
        return None
    return pynvml


def _handle(device):
    nvml = _nvml()
    if nvml is None:
        return None, None
    name = str(device).strip()
    try:
        if name.isdigit():
            return nvml, nvml.nvmlDeviceGetHandleByIndex(int(name))
        if name.startswith("GPU-"):
            return nvml, nvml.nvmlDeviceGetHandleByUUID(name)
    except nvml.NVMLError:
        pass
    return nvml, None


def _ask(device, question):
    """``question(pynvml, handle)`` for ``device``, or None where NVML cannot answer it."""
    nvml, handle = _handle(device)
    if handle is None:
        return None
    try:
        return question(nvml, handle)
    except nvml.NVMLError:
        return None


def indices() -> list:
    """Every GPU's index, as strings ("0", "1", ...); [] without NVML."""
    nvml = _nvml()
    try:
        return [str(i) for i in range(nvml.nvmlDeviceGetCount())] if nvml is not None else []
    except nvml.NVMLError:
        return []


def model(device) -> str | None:
    """The GPU's model ("NVIDIA H200"), or None."""
    name = _ask(device, lambda nvml, handle: nvml.nvmlDeviceGetName(handle))
    return name.decode() if isinstance(name, bytes) else name


def memory_gib(device) -> float | None:
    """The GPU's total memory in GiB, or None."""
    return _ask(device, lambda nvml, handle: nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30)


def memory_used_mib(device) -> float | None:
    """The GPU's memory in use, in MiB, or None."""
    return _ask(device, lambda nvml, handle: nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20)


def busy_percent(device) -> int | None:
    """The share of NVML's last sample period in which a kernel ran on the GPU, or None."""
    return _ask(device, lambda nvml, handle: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))


def compute_pids(device=None) -> list:
    """PIDs with a compute context on ``device`` (every GPU where None), as the driver sees them (a container's
    PIDs may be of another PID namespace); [] where NVML cannot tell."""
    return list(compute_memory_mib(None if device is None else [device]))


def compute_memory_mib(devices=None) -> dict:
    """PID → GPU memory it holds, in MiB, of each process with a compute context on ``devices`` (every GPU where
    None; a process on several, summed); None for a process whose use NVML does not know (a MIG slice without
    the rights, some virtual machines); {} where NVML cannot tell."""
    found: dict = {}
    for each in indices() if devices is None else devices:
        listed = _ask(each, lambda nvml, handle: [(p.pid, p.usedGpuMemory)
                                                  for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)])
        for pid, used in listed or []:
            if used is None or found.get(pid, 0.0) is None:
                found[pid] = None  # unknown on one card: unknown in all
            else:
                found[pid] = found.get(pid, 0.0) + used / 2**20
    return found
