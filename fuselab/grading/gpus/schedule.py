"""Workers per GPU: N GPUs grade N × k submissions at once, and timings never share a GPU.

Each worker owns one device and passes it to its jobs (which set ``CUDA_VISIBLE_DEVICES`` to it for every child
process), taking the next submission from a shared queue when it is done with one. Several workers may share a
GPU (``workers_for``); their graded timings then take it one at a time through its ``lease.DeviceLease``. Without a GPU the "devices"
are CPU workers (``None``): the emulation has nothing to time, so they may run side by side.
"""

from __future__ import annotations

import os
import queue
import threading

from ... import gpu_facts


def visible_gpus() -> list:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries ("0", "1", ... or UUIDs)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    found = gpu_facts.indices()
    if found:
        return found
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no torch, no GPU
        return []


def devices_for(gpus, cpu_workers: int | None = None) -> list:
    """The worker devices for ``--gpus``: ``"auto"`` (every visible GPU), a count, or a list like ``"0,2"``;
    without a GPU, ``cpu_workers`` CPU workers (default ``default_cpu_workers()``)."""
    available = visible_gpus()
    if gpus in (None, "auto"):
        chosen = available
    elif isinstance(gpus, int) or str(gpus).isdigit():
        count = int(gpus)
        if count > len(available):
            raise ValueError(f"asked for {count} GPU(s), {len(available)} visible ({', '.join(available) or 'none'})")
        chosen = available[:count]
    else:
        chosen = [d.strip() for d in str(gpus).split(",") if d.strip()]
    return chosen if chosen else [None] * max(1, cpu_workers or default_cpu_workers())


# Measured on the H200 machine (16 cores, 139 GiB; docs/RESULTS.md): 10 correct submissions sharing the GPU peaked
# at about 6 GiB of GPU memory each, with half the CPU idle.
GPU_MEMORY_PER_JOB_GIB = 6
MAX_JOBS_PER_GPU = 16
UNKNOWN_MEMORY_JOBS = 2  # a GPU whose memory cannot be read (or a MIG slice): few, rather than out of memory


def available_cores() -> int:
    """The CPU cores this process may use: its affinity, and a cgroup's CPU quota where one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


# Measured on the 2-core CPU machine (docs/RESULTS.md): two CPU workers grading the correct samples added 2.0 GiB
# to the host's memory in use, 1 GiB each; twice that leaves room for a student's larger tensors.
CPU_MEMORY_PER_JOB_GIB = 2


def host_memory_gib() -> tuple | None:
    """``(total, available)`` memory of the host (MemTotal, MemAvailable), GiB; None where /proc/meminfo is
    absent."""
    try:
        with open("/proc/meminfo") as meminfo:
            kib = {line.split(":")[0]: int(line.split()[1]) for line in meminfo if line.split()[1:2]}
        return kib["MemTotal"] / 2**20, kib["MemAvailable"] / 2**20
    except (OSError, ValueError, KeyError, IndexError):
        return None


def host_memory_available_gib() -> float | None:
    """The host's available memory (MemAvailable), GiB; None where /proc/meminfo is absent."""
    memory = host_memory_gib()
    return memory[1] if memory else None


def default_cpu_workers(cores: int | None = None, memory_gib: float | None = None) -> int:
    """Without a GPU, one submission per CPU core, as many as the host's available memory holds.

    A submission's processes take turns (the checker waits on a worker and back), so one at a time leaves cores
    idle: on the 2-core machine one worker kept the CPU 43 % busy (9.5 s per submission-lab), two kept it 95 %
    busy (6.2 s)."""
    cores = cores or available_cores()
    memory_gib = memory_gib if memory_gib is not None else host_memory_available_gib()
    by_memory = max(1, int(memory_gib // CPU_MEMORY_PER_JOB_GIB)) if memory_gib else 1
    return max(1, min(cores, by_memory))


def default_jobs_per_gpu(gpus: list, cores: int | None = None, memory_gib: float | None = None) -> int:
    """Two submissions per three CPU cores of each GPU's share, as many as its memory holds, at most 16."""
    cores = cores or available_cores()
    by_cpu = max(1, 2 * cores // (3 * max(1, len(gpus))))
    memory_gib = memory_gib if memory_gib is not None else smallest_gpu_memory_gib(gpus)
    by_memory = max(1, int(memory_gib // GPU_MEMORY_PER_JOB_GIB)) if memory_gib else UNKNOWN_MEMORY_JOBS
    return min(by_cpu, by_memory, MAX_JOBS_PER_GPU)


def smallest_gpu_memory_gib(gpus: list) -> float | None:
    """The smallest total memory among ``gpus`` (``CUDA_VISIBLE_DEVICES`` entries: indices or UUIDs), in GiB; None
    if any of them cannot be read (no NVML, a MIG slice)."""
    chosen = [gpu_facts.memory_gib(g) for g in gpus]
    return min(chosen) if chosen and None not in chosen else None


def workers_for(devices: list, jobs_per_gpu: int | None = None) -> list:
    """Worker slots: each GPU ``jobs_per_gpu`` times (default: ``default_jobs_per_gpu``).

    Submissions sharing a GPU build, run nbgrader and check correctness side by side; their graded timings take
    the GPU one at a time (``lease``). CPU workers (``None``) stay as given.
    """
    gpus = [d for d in devices if d is not None]
    if not gpus:
        return list(devices)
    if jobs_per_gpu is None:
        jobs_per_gpu = default_jobs_per_gpu(gpus)
    if jobs_per_gpu < 1:
        raise ValueError(f"jobs per GPU must be at least 1, not {jobs_per_gpu}")
    return [d for _ in range(jobs_per_gpu) for d in gpus]


def describe(workers: list) -> str:
    """``workers_for``'s slots in words: "10 sharing GPU 0", "5 sharing each of GPUs 0, 1", "2 CPU workers"."""
    gpus = list(dict.fromkeys(w for w in workers if w is not None))
    if not gpus:
        return f"{len(workers)} CPU worker{'s' * (len(workers) != 1)}, no GPU"
    per = len(workers) // len(gpus)
    return f"{per} sharing GPU {gpus[0]}" if len(gpus) == 1 else f"{per} sharing each of GPUs {', '.join(gpus)}"


def run_jobs(jobs, devices, work, on_done=None, stop: threading.Event | None = None) -> list:
    """Run ``work(job, device)`` for every job, one worker thread per entry of ``devices``; results in job order.

    A job that raises records the exception as its result (one student's disaster never stops the class).
    ``on_done(job, result)`` is called as each job finishes (the progress bar).
    """
    pending: queue.Queue = queue.Queue()
    for index, job in enumerate(jobs):
        pending.put((index, job))
    results = [None] * len(jobs)
    lock = threading.Lock()

    def worker(device):
        while not (stop and stop.is_set()):
            try:
                index, job = pending.get_nowait()
            except queue.Empty:
                return
            try:
                result = work(job, device)
            except Exception as exc:  # noqa: BLE001 - recorded, reported
                result = exc
            results[index] = result
            if on_done:
                with lock:
                    on_done(job, result)

    threads = [threading.Thread(target=worker, args=(device,), name=f"grader-{device}", daemon=True)
               for device in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
