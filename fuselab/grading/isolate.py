"""Run untrusted work in a child process: limits, a timeout that kills the whole tree, a memory watchdog.

- **Limits** (``resource.setrlimit`` in the child): CPU seconds, file size, no core dumps. Not ``RLIMIT_AS``:
  CUDA reserves far more virtual address space than it uses, and an address-space limit breaks it. Memory is
  bounded instead by a watchdog that sums the resident memory of the whole process tree and kills it past the
  limit.
- **Timeouts** kill the whole tree, descendants first: a Jupyter kernel runs in a session of its own, so killing
  a process group alone would leave an endless kernel spinning.
- **Network**: the clean recheck's runner gets a network namespace of its own where the platform allows
  (root, or unprivileged user namespaces); ``sandbox=True`` uses bubblewrap, which also hides every folder but
  the submission's own.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import sys
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000


@dataclass
class Limits:
    wall_s: float = 600.0         # the whole child; the caller may stop it earlier (per-cell timeouts)
    cpu_s: int | None = 3600       # RLIMIT_CPU: CPU seconds of the child (and of each of its descendants)
    memory_bytes: int | None = 16 * 2**30  # resident memory of the whole tree (watchdog)
    file_bytes: int | None = 4 * 2**30     # RLIMIT_FSIZE: a runaway write stops here
    no_network: bool = False      # a network namespace of its own (best effort, see ``network_isolation``)


@dataclass
class Outcome:
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    out_of_memory: bool = False
    signal: int | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.out_of_memory

    def describe(self) -> str:
        if self.timed_out:
            return f"stopped after {self.seconds:.0f} s (time limit)"
        if self.out_of_memory:
            return "stopped: used more memory than allowed"
        if self.signal:
            name = signal.Signals(self.signal).name if self.signal in signal.Signals._value2member_map_ else ""
            return f"crashed ({name or 'signal ' + str(self.signal)})"
        return f"exit status {self.returncode}"


def _set_limits(limits: Limits):
    def apply():
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a segfaulting kernel must not fill the disk
        if limits.cpu_s:
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
        if limits.file_bytes:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        if limits.no_network:
            _unshare_network()
    return apply


def _unshare_network():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) == 0:
        return
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:  # unprivileged: a user namespace first
        return
    # not permitted here: the child keeps the network (documented in docs/grading.md)


def network_isolation_available() -> bool:
    """Whether a child can get a network namespace of its own on this machine."""
    probe = subprocess.run(["python3", "-c", "import ctypes,sys; l=ctypes.CDLL(None); "
                            "sys.exit(0 if l.unshare(0x40000000)==0 or l.unshare(0x50000000)==0 else 1)"],
                           capture_output=True)
    return probe.returncode == 0


def _parents() -> dict:
    """pid → parent pid of every process (one scan of /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return parents


def _descendants(pid: int, parents: dict) -> list:
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == current]
        found += kids
        frontier += kids
    return found


def children_of(pid: int) -> list:
    """Every descendant of ``pid`` (from /proc), deepest last."""
    return _descendants(pid, _parents())


def process_trees(roots) -> dict:
    """root → the set of it and its descendants, for several roots from one scan of /proc."""
    parents = _parents()
    return {root: {root, *_descendants(root, parents)} for root in roots}


def kill_tree(pid: int):
    """SIGKILL ``pid`` and all its descendants (collected first, so none is reparented away)."""
    victims = children_of(pid) + [pid]
    for victim in victims:
        try:
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for p in [pid] + children_of(pid):
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


class Child:
    """A started child process with its limits; ``wait`` or ``stop`` it."""

    def __init__(self, command, *, limits: Limits, env=None, cwd=None, stdout=None, stderr=None, registry=None,
                 pass_fds=()):
        self.limits = limits
        self.registry = registry  # a ``lease.DeviceLease``: the processes sharing a GPU, stopped while one times
        self.started = time.monotonic()
        self.out_of_memory = False
        self.timed_out = False
        self.process = subprocess.Popen(command, cwd=cwd, env=env, preexec_fn=_set_limits(limits),
                                        stdin=subprocess.DEVNULL, stdout=stdout or subprocess.PIPE,
                                        stderr=stderr or subprocess.PIPE, text=True, pass_fds=tuple(pass_fds))
        self._done = threading.Event()
        if registry is not None:
            registry.register(self)
        if limits.memory_bytes:
            threading.Thread(target=self._watch_memory, daemon=True).start()

    def _watch_memory(self):
        while not self._done.wait(0.5):
            if self.process.poll() is not None:
                return
            if tree_rss(self.process.pid) > self.limits.memory_bytes:
                self.out_of_memory = True
                kill_tree(self.process.pid)
                return

    def alive(self) -> bool:
        return self.process.poll() is None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def stop(self, timed_out=True):
        self.timed_out = self.timed_out or timed_out
        kill_tree(self.process.pid)

    def paused(self) -> float:
        """Seconds it spent stopped so another submission could time a kernel alone: not its own time."""
        return self.registry.stopped_seconds(self) if self.registry is not None else 0.0

    def _time_left(self, deadline) -> float:
        if deadline is not None:
            return deadline - time.monotonic()
        return self.limits.wall_s - (self.elapsed() - self.paused())

    def wait(self, timeout=None) -> Outcome:
        """Wait for the end: at most ``timeout`` more seconds, or (None) until its wall limit, pauses not counted."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                stdout, stderr = self.process.communicate(timeout=max(0.0, min(self._time_left(deadline), 1.0)))
                break
            except subprocess.TimeoutExpired:
                if self._time_left(deadline) <= 0:
                    self.stop()
                    stdout, stderr = self.process.communicate()
                    break
        self._done.set()
        kill_tree(self.process.pid)  # leftovers a finished child may have started (a kernel, a compiler)
        if self.registry is not None:
            self.registry.unregister(self)
        code = self.process.returncode
        return Outcome(returncode=code, stdout=stdout or "", stderr=stderr or "", seconds=self.elapsed(),
                       timed_out=self.timed_out, out_of_memory=self.out_of_memory,
                       signal=-code if code is not None and code < 0 else None)


def run(command, *, limits: Limits | None = None, env=None, cwd=None, registry=None) -> Outcome:
    """Run ``command`` to the end or to its limits; never raises for what the child did."""
    return Child(command, limits=limits or Limits(), env=env, cwd=cwd, registry=registry).wait()


# --- bubblewrap -------------------------------------------------------------------------------------------------

def bubblewrap() -> str | None:
    return shutil.which("bwrap")


def sandboxed(command, *, own: list, hide: list, readonly=(), writable_tmp=True) -> list:
    """``command`` inside bubblewrap: the system read-only, ``hide`` folders replaced by empty ones,
    ``readonly`` folders shown again read-only, ``own`` folders (the submission's) writable, no network, its own
    PID namespace, killed with its parent.

    GPU device files stay visible (``--dev-bind /dev /dev``): the kernel must reach the GPU.
    """
    bwrap = bubblewrap()
    if bwrap is None:
        raise RuntimeError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    args = [bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
            "--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session"]
    if writable_tmp:
        args += ["--tmpfs", "/tmp"]
    for folder in hide:
        args += ["--tmpfs", str(folder)]
    # The Python environment and the course itself must stay visible even when they live under a hidden folder
    # (a clone in /tmp, as CI makes): show them again, read-only, on top of the empty ones.
    runtime = [Path(sys.prefix), Path(sys.base_prefix), Path(__file__).resolve().parents[2]]
    covered = [Path("/tmp")] * writable_tmp + [Path(h) for h in hide]
    runtime = [p for p in runtime if any(p == c or c in p.parents for c in covered)]
    for folder in [*runtime, *readonly]:  # shown again, read-only, inside a hidden folder
        if folder and Path(folder).exists():
            args += ["--ro-bind", str(folder), str(folder)]
    for folder in own:
        Path(folder).mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(folder), str(folder)]
    return args + ["--", *command]


def sandbox_works() -> bool:
    """bubblewrap is installed and can start a process here (containers may forbid its namespaces)."""
    if bubblewrap() is None:
        return False
    probe = subprocess.run(sandboxed(["/bin/true"], own=[], hide=[]), capture_output=True)
    return probe.returncode == 0


# --- GPU --------------------------------------------------------------------------------------------------------

def nvidia_smi(*args, timeout: float = 20) -> str | None:
    """nvidia-smi's output for ``args``; None where it is missing, cannot start or hangs (it can take seconds)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_processes(device: str | None = None) -> list:
    """PIDs with a compute context on the GPU(s) (``nvidia-smi``); [] where there is no nvidia-smi."""
    text = nvidia_smi("--query-compute-apps=pid", "--format=csv,noheader", *([] if device is None else ["-i", str(device)]))
    return [int(line) for line in (text or "").split() if line.strip().isdigit()]


def wait_for_idle_gpu(device: str | None = None, timeout_s: float = 30.0, own_pids=(), sharing=()) -> tuple:
    """Wait until no other process uses the GPU; kill leftovers of earlier submissions we started.

    Returns ``(idle, note)``. ``own_pids``: processes this grader started (a leftover among their descendants is
    killed at once). ``sharing``: a callable giving the live processes of other submissions graded on this GPU at
    the same time (left alone: their timings and ours take turns through ``lease``).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        on_gpu = gpu_processes(device)
        # asked after the GPU was: a process seen there already belongs to a child registered by now
        shared = set(sharing()) if sharing else set()
        ours = set().union(*process_trees(own_pids).values())
        busy = [p for p in on_gpu if p != os.getpid() and p not in shared]
        if any(not os.path.exists(f"/proc/{p}") for p in busy):
            # nvidia-smi reports PIDs of another PID namespace (a container): nothing to match them against
            return True, ""
        for leftover in [p for p in busy if p in ours]:
            kill_tree(leftover)
        others = [p for p in busy if p not in ours]
        if not others:
            return True, ""
        if time.monotonic() > deadline:
            return False, f"GPU {device or ''} busy with process(es) {others}: timings may be disturbed"
        time.sleep(0.5)
