"""How busy the machine was while something ran: CPU (from /proc/stat) and GPU memory (nvidia-smi), sampled.

The grader's throughput depends on how many submissions share a GPU; whether more would help depends on
whether the CPU cores or the GPU's memory were already the limit. ``LoadSampler`` answers that for a time
window::

    with LoadSampler() as load:
        ...
    load.summary(since, until)   # {"cpu_busy": 0.41, "gpu_memory_peak_gib": 38.2, ...}
"""

from __future__ import annotations

import os
import threading
import time

from ..grading.isolate import nvidia_smi


def _cpu_jiffies():
    """(busy, total) jiffies of all cores since boot, or None where /proc/stat is absent."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _gpu_memory_used_mib():
    text = nvidia_smi("--query-gpu=memory.used", "--format=csv,noheader,nounits", timeout=10)
    try:
        return [float(x) for x in text.split()] if text else None
    except ValueError:
        return None


class LoadSampler:
    def __init__(self, every_s: float = 1.0):
        self.every_s = every_s
        self.samples = []  # (time.monotonic(), cpu (busy, total) or None, [MiB per GPU] or None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self):
        while True:
            self.samples.append((time.monotonic(), _cpu_jiffies(), _gpu_memory_used_mib()))
            if self._stop.wait(self.every_s):
                self.samples.append((time.monotonic(), _cpu_jiffies(), _gpu_memory_used_mib()))
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self, since: float | None = None, until: float | None = None) -> dict:
        """CPU busy fraction (all cores) and peak GPU memory between two ``time.monotonic()`` instants."""
        window = [s for s in self.samples if (since is None or s[0] >= since) and (until is None or s[0] <= until)]
        cpu = [s[1] for s in window if s[1] is not None]
        result = {"cores": os.cpu_count(), "samples": len(window), "cpu_busy": None, "gpu_memory_peak_gib": None}
        if len(cpu) >= 2 and cpu[-1][1] > cpu[0][1]:
            result["cpu_busy"] = round((cpu[-1][0] - cpu[0][0]) / (cpu[-1][1] - cpu[0][1]), 3)
        memory = [max(s[2]) for s in window if s[2]]
        if memory:
            result["gpu_memory_peak_gib"] = round(max(memory) / 1024, 1)
        return result
