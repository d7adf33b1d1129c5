"""Workers per GPU: N GPUs grade N × k submissions at once, and timings never share a GPU.

Each worker owns one device and passes it to its jobs (which set ``CUDA_VISIBLE_DEVICES`` to it for every child
process), taking the next submission from a shared queue when it is done with one. Several workers may share a
GPU (``workers_for``); their graded timings then take it one at a time through its ``lease.DeviceLease``. Without a GPU the "devices"
are CPU workers (``None``): the emulation has nothing to time, so they may run side by side.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading


def visible_gpus() -> list:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries ("0", "1", ... or UUIDs)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        result = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True)
        found = [line.strip() for line in result.stdout.splitlines() if line.strip().isdigit()]
        if found:
            return found
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no torch, no GPU
        return []


def devices_for(gpus, cpu_workers: int = 1) -> list:
    """The worker devices for ``--gpus``: ``"auto"`` (every visible GPU), a count, or a list like ``"0,2"``."""
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
    return chosen if chosen else [None] * max(1, cpu_workers)


def workers_for(devices: list, jobs_per_gpu: int | None = None) -> list:
    """Worker slots: each GPU ``jobs_per_gpu`` times (default: about one per three CPU cores per GPU, at most 6).

    Submissions sharing a GPU build, run nbgrader and check correctness side by side; their graded timings take
    the GPU one at a time (``lease``). CPU workers (``None``) stay as given.
    """
    gpus = [d for d in devices if d is not None]
    if not gpus:
        return list(devices)
    if jobs_per_gpu is None:
        jobs_per_gpu = max(1, min(6, (os.cpu_count() or 1) // (3 * len(gpus))))
    if jobs_per_gpu < 1:
        raise ValueError(f"jobs per GPU must be at least 1, not {jobs_per_gpu}")
    return [d for _ in range(jobs_per_gpu) for d in gpus]


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
