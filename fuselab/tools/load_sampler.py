"""How busy the machine was while something ran: CPU (from /proc/stat), the host's memory in use (from
/proc/meminfo), and each GPU's memory and utilisation (NVML), sampled.

The grader's throughput depends on how many submissions share a GPU; whether more would help depends on
whether the CPU cores or the GPU's memory were already the limit. ``LoadSampler`` answers that for a time
window::

    with LoadSampler() as load:
        ...
    load.summary(since, until)   # {"cpu_busy": 0.41, "gpu_busy": 0.62, "gpu_memory_peak_gib": 38.2, ...}

Whether the GPU or the CPU is the limit is the question behind more jobs: ``gpu_busy`` is the mean of NVML's
utilisation (the share of its sample period in which a kernel ran), ``cpu_kernel_share`` the part of the busy CPU
spent in the kernel (system, interrupts), and ``cpu_by_kind(..., kernel=True)`` whose system time it was, by
kind of process (what no scan saw, interrupts included, as ``missed``).
"""

from __future__ import annotations

import os
import threading
import time

from .. import gpu_facts
from ..grading.gpus.schedule import host_memory_gib, visible_gpus


def _cpu_jiffies():
    """(busy, total, kernel) jiffies of all cores since boot (kernel: system, irq and softirq), or None where
    /proc/stat is absent."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    kernel = fields[2] + sum(fields[5:7])
    return sum(fields) - idle, sum(fields), kernel


def _host_memory_used_gib():
    """The host's memory in use (MemTotal − MemAvailable), GiB; None where /proc/meminfo is absent."""
    memory = host_memory_gib()
    return memory[0] - memory[1] if memory else None


def _gpu_memory_used_mib():
    """MiB used on each GPU, from NVML in this process (no program started per sample: nvidia-smi took a good
    share of a core a second on a GPU that ten submissions share, and the sampler would count itself); None where
    NVML is missing."""
    used = [gpu_facts.memory_used_mib(index) for index in gpu_facts.indices()]
    return used if used and None not in used else None


def _sampled_gpus() -> list:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES``: a shard on one card of eight samples that card);
    [] where NVML sees none."""
    return visible_gpus() if gpu_facts.indices() else []


def _gpu_busy_percent(gpus=None):
    """NVML's utilisation of each GPU in ``gpus`` (``_sampled_gpus()`` where None), percent of its last sample
    period with a kernel running; None where NVML is missing."""
    busy = [gpu_facts.busy_percent(device) for device in (_sampled_gpus() if gpus is None else gpus)]
    return busy if busy and None not in busy else None


# how a process's command line names its part in grading (the first that matches), for ``cpu_by_kind``
PROCESS_KINDS = (("cellrunner", "checker"), ("kernel_worker", "kernel worker"),
                 ("solution_worker", "solution worker"), ("ipykernel", "notebook kernel"), ("nbgrader", "nbgrader"),
                 ("keeper", "keeper"), ("bwrap", "sandbox"), ("gpu_selfcheck", "grader"))
# programs known by their own name (the command's first word)
PROGRAM_KINDS = {"nvidia-smi": "nvidia-smi", "ninja": "compiler", "nvcc": "compiler", "cicc": "compiler",
                 "ptxas": "compiler", "cc1plus": "compiler", "c++": "compiler", "g++": "compiler", "ld": "compiler",
                 "as": "compiler", "collect2": "compiler", "fatbinary": "compiler", "nvlink": "compiler",
                 "cudafe++": "compiler", "bwrap": "sandbox"}


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's unit of CPU time


def _stat_cpu(path: str) -> tuple:
    """(utime + stime, stime), in seconds, of a ``/proc/.../stat`` file (a process's or one of its threads'): its
    CPU time and the part of it spent in the kernel. OSError or IndexError where it is gone or cut short."""
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[12]) / _TICKS


def _process_cpu() -> dict:
    """pid → (kind, CPU seconds so far, of them in the kernel) of every process this machine shows (Linux /proc)."""
    found = {}
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            seconds, system = _stat_cpu(f"/proc/{pid}/stat")
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue  # ended meanwhile
        program = os.path.basename(command.split(" ", 1)[0])
        kind = PROGRAM_KINDS.get(program) or next((name for pattern, name in PROCESS_KINDS if pattern in command),
                                                  "other")
        found[int(pid)] = (kind, seconds, system)
    return found


# the grader's own threads (``threading``'s names, or the function a thread runs), for its share of ``cpu_by_kind``
THREAD_ROLES = (("load-sampler", "the load sampler itself"), ("grader-", "grader: submissions' threads"),
                ("(_watch)", "grader: limit watchers"), ("progress ", "grader: progress bars"),
                ("MainThread", "grader: main thread"))


def _own_threads() -> dict:
    """This process's CPU seconds so far split by what its threads do (``THREAD_ROLES``): ``{key: (kind, seconds,
    of them in the kernel)}``, keyed apart from pids. A thread that ended is counted in "grader: ended threads"
    (the process's total less its live threads'), so the split still sums to the process's CPU."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    found, live, live_system = {}, 0.0, 0.0
    try:
        tasks = os.listdir("/proc/self/task")
        total, total_system = _stat_cpu("/proc/self/stat")
    except (OSError, IndexError):
        return found
    for tid in tasks:
        try:
            seconds, system = _stat_cpu(f"/proc/self/task/{tid}/stat")
        except (OSError, IndexError):
            continue  # ended meanwhile: its time is in the remainder below
        name = names.get(int(tid), "")
        role = next((role for pattern, role in THREAD_ROLES if pattern in name), "grader: other threads")
        found[f"thread {tid}"] = (role, seconds, system)
        live, live_system = live + seconds, live_system + system
    found["ended threads"] = ("grader: ended threads", max(0.0, total - live), max(0.0, total_system - live_system))
    return found


OWN_PROCESS = "the sampling process itself"  # the GPU self-check's: its earlier stages left a CUDA context in it
NOT_SCANNED = "not seen by the scan"           # a process that started between the /proc scan and NVML's answer
OTHER_NAMESPACE = "another PID namespace"      # NVML's PIDs are the driver's: a container may not see them


def _gpu_memory_by_kind(scanned: dict, gpus: list) -> dict:
    """kind → [MiB of GPU memory each process of that kind holds on ``gpus`` (None: NVML does not know)], a
    process named by its kind in ``scanned`` (``_process_cpu``'s pid → (kind, ...))."""
    held: dict = {}
    for pid, mib in (gpu_facts.compute_memory_mib(gpus) if gpus else {}).items():
        kind = scanned[pid][0] if pid in scanned else NOT_SCANNED if os.path.exists(f"/proc/{pid}") else \
            OTHER_NAMESPACE
        held.setdefault(kind, []).append(mib)
    return held


def _known(each: list) -> list:
    """The MiB NVML did say, of one kind's processes' (None: not known, never counted as 0)."""
    return [mib for mib in each if mib is not None]


class LoadSampler:
    def __init__(self, every_s: float = 1.0, processes: bool = False):
        self.every_s = every_s
        self.processes = processes  # also each kind of process's CPU (``cpu_by_kind``): a scan of /proc a sample
        # (time.monotonic(), cpu (busy, total, kernel) or None, [MiB per GPU] or None, host GiB in use or None,
        #  [busy percent per GPU] or None)
        self.samples = []
        # (time.monotonic(), {kind: CPU seconds since the last sample}, {kind: of them in the kernel})
        self.process_cpu = []
        # with ``processes``: (time.monotonic(), {kind: [MiB of GPU memory each process of that kind holds]})
        self.process_gpu_memory = []
        self._seen = {}        # pid (or one of this process's threads) → (CPU seconds, in the kernel) at its last sample
        self._counted_dead = (0.0, 0.0)  # this process's ended threads' seconds counted while they ran
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self):
        if self.processes:  # what ran before: not counted
            self._seen = {pid: (seconds, system)
                          for pid, (_, seconds, system) in {**_process_cpu(), **self._threads()}.items()}
        while True:
            self._sample()
            if self._stop.wait(self.every_s):
                self._sample()
                return

    def _sample(self):
        gpus = _sampled_gpus()  # asked once a sample, for both views of the GPUs
        self.samples.append((time.monotonic(), _cpu_jiffies(), _gpu_memory_used_mib(), _host_memory_used_gib(),
                             _gpu_busy_percent(gpus)))
        self._sample_processes(gpus)

    def _threads(self) -> dict:
        """``_own_threads``, with what a thread that ended was already counted for before it ended taken out of the
        ended threads' part (else it would be counted twice)."""
        now = _own_threads()
        ended = [times for key, times in self._seen.items()
                 if isinstance(key, str) and key.startswith("thread ") and key not in now]
        self._counted_dead = (self._counted_dead[0] + sum(t[0] for t in ended),
                              self._counted_dead[1] + sum(t[1] for t in ended))
        if "ended threads" in now:
            kind, seconds, system = now["ended threads"]
            now["ended threads"] = (kind, max(0.0, seconds - self._counted_dead[0]),
                                    max(0.0, system - self._counted_dead[1]))
        return now

    def _sample_processes(self, gpus: list):
        """With ``processes``: each kind's CPU seconds since the last sample (a process first seen now counts from
        its start; what a process did between its last sample and its end is missed: ``cpu_by_kind`` says how
        much)."""
        if not self.processes:
            return
        now, used, in_kernel = _process_cpu(), {}, {}
        if os.getpid() in now:  # the grader runs in this process: its threads' parts, not one "grader" line
            del now[os.getpid()]
            now.update(self._threads())
        for pid, (kind, seconds, system) in now.items():
            before, before_system = self._seen.get(pid, (0.0, 0.0))
            used[kind] = used.get(kind, 0.0) + max(0.0, seconds - before)
            in_kernel[kind] = in_kernel.get(kind, 0.0) + max(0.0, system - before_system)
        self._seen = {pid: (seconds, system) for pid, (_, seconds, system) in now.items()}
        self.process_cpu.append((time.monotonic(), used, in_kernel))
        try:  # a sample's view of the GPUs' memory is lost, never the sampling
            held = _gpu_memory_by_kind({**now, os.getpid(): (OWN_PROCESS, 0.0, 0.0)}, gpus)
        except Exception:  # noqa: BLE001 - NVML through a binding that may raise anything
            held = {}
        if held:
            self.process_gpu_memory.append((time.monotonic(), held))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self, since: float | None = None, until: float | None = None) -> dict:
        """CPU busy fraction (all cores) and the kernel's share of it, the GPUs' mean utilisation, peak GPU memory,
        and the host's memory in use when sampling began and at its peak, between two ``time.monotonic()``
        instants."""
        window = [s for s in self.samples if (since is None or s[0] >= since) and (until is None or s[0] <= until)]
        cpu = [s[1] for s in window if s[1] is not None]
        result = {"cores": os.cpu_count(), "samples": len(window), "cpu_busy": None, "gpu_memory_peak_gib": None}
        host = [s[3] for s in window if s[3] is not None]
        before = next((s[3] for s in self.samples if s[3] is not None), None)
        if host and before is not None:  # what the run added is the peak less what was in use before it
            result["host_memory_before_gib"] = round(before, 2)
            result["host_memory_peak_gib"] = round(max(host), 2)
        if len(cpu) >= 2 and cpu[-1][1] > cpu[0][1]:
            result["cpu_busy"] = round((cpu[-1][0] - cpu[0][0]) / (cpu[-1][1] - cpu[0][1]), 3)
            if cpu[-1][0] > cpu[0][0]:
                result["cpu_kernel_share"] = round((cpu[-1][2] - cpu[0][2]) / (cpu[-1][0] - cpu[0][0]), 3)
        busy = [sum(s[4]) / len(s[4]) for s in window if s[4]]
        if busy:
            result["gpu_busy"] = round(sum(busy) / len(busy) / 100, 3)
        memory = [max(s[2]) for s in window if s[2]]
        if memory:
            result["gpu_memory_peak_gib"] = round(max(memory) / 1024, 1)
        return result

    def gpu_memory_by_kind(self, since: float | None = None, until: float | None = None) -> dict:
        """Who held the GPUs' memory between two ``time.monotonic()`` instants, by kind of process: at the sample
        where they held the most together, each kind's GiB and number of processes (``at_peak``); and the most one
        process of each kind held at any sample (``one_process_peak_gib``). {} without NVML's per-process view."""
        window = [held for when, held in self.process_gpu_memory
                  if (since is None or when >= since) and (until is None or when <= until)]
        if not window:
            return {}
        peak = max(window, key=lambda held: sum(sum(_known(each)) for each in held.values()))
        one: dict = {}
        for held in window:
            for kind, each in held.items():
                one[kind] = max([one.get(kind, 0.0), *_known(each)])
        at_peak = {}
        for kind, each in sorted(peak.items(), key=lambda kv: -sum(_known(kv[1]))):
            at_peak[kind] = {"gib": round(sum(_known(each)) / 1024, 2), "processes": len(each)}
            if len(_known(each)) < len(each):  # NVML did not say what these held: not counted as 0
                at_peak[kind]["unknown"] = len(each) - len(_known(each))
        return {"at_peak": at_peak,
                "one_process_peak_gib": {kind: round(mib / 1024, 2) for kind, mib in
                                         sorted(one.items(), key=lambda kv: -kv[1])}}

    def cpu_by_kind(self, since: float | None = None, until: float | None = None, kernel: bool = False) -> dict:
        """CPU seconds each kind of process (``PROCESS_KINDS``) used between two ``time.monotonic()`` instants, and
        ``missed``: the machine's busy CPU seconds no sample saw (processes shorter than a sample, ends). With
        ``kernel``: only the part spent in the kernel (system time; ``missed`` then holds the interrupts too)."""
        part = 2 if kernel else 1
        window = [entry[part] for entry in self.process_cpu
                  if (since is None or entry[0] >= since) and (until is None or entry[0] <= until)]
        kinds: dict = {}
        for used in window[1:]:  # the first sample's seconds were spent before the window
            for kind, seconds in used.items():
                kinds[kind] = kinds.get(kind, 0.0) + seconds
        cpu = [s[1] for s in self.samples if s[1] is not None and (since is None or s[0] >= since)
               and (until is None or s[0] <= until)]
        if len(cpu) >= 2:
            busy = (cpu[-1][2 if kernel else 0] - cpu[0][2 if kernel else 0]) / _TICKS
            kinds["missed"] = max(0.0, busy - sum(kinds.values()))
        return {kind: round(seconds, 1) for kind, seconds in sorted(kinds.items(), key=lambda kv: -kv[1])}
