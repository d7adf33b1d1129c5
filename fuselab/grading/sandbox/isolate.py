"""Run untrusted work in a child process: limits, a timeout that kills the whole tree, a memory watchdog.

- **Limits** (``resource.setrlimit`` in the child): CPU seconds, file size, no core dumps. Not ``RLIMIT_AS``:
  CUDA reserves far more virtual address space than it uses, and an address-space limit breaks it. Memory is
  bounded instead by a memory cgroup of the child's own where the grader can make one (``cgroup``: the kernel
  counts every page the tree holds, shared memory included, and holds the limit), and otherwise by a watchdog that
  sums the tree's resident memory, its private tmpfs, the shared-memory objects it holds (``shmem_bytes``) and
  what the sockets of its own network namespace and its pipes hold (``own_network_socket_bytes``, ``pipe_bytes``).
- **Timeouts** kill the whole tree, descendants first: a Jupyter kernel runs in a session of its own, so killing
  a process group alone would leave an endless kernel spinning.
- **Every process a child starts ends with it**: each child runs under ``keeper`` (a child subreaper that the
  grader's death signals too), so a double-forked daemon stays in the tree that is killed; the kill repeats until
  nothing is left, and a last sweep of /proc finds anything carrying the child's marker. The child's output goes
  to files, never pipes: a process that keeps a copy of its stdout cannot make the grader wait.
- **Per child, not per user**: the watchdog also counts the tree's processes (``Limits.processes``: an
  ``RLIMIT_NPROC`` would count every process of the uid, which all sandboxes share as root, and which the TA's own
  work shares as a plain user; where the grader can have a ``pids`` cgroup, ``cgroup.PidsGroup``, the kernel also
  refuses any fork past it, so a fork bomb never outruns the half-second sample), its memory (above), and what its writable folders hold and the files it deleted
  but holds open (``Limits.disk_bytes``); past a limit the tree is killed and ``Outcome.limit`` says which.
- **Network and processes outside the sandbox**: a command that is not ``sandboxed`` runs in a PID namespace of
  its own (and, with ``no_network``, a network namespace) made by its keeper where the platform allows (root, or
  unprivileged user namespaces). A ``sandboxed`` command gets both from bubblewrap, and nothing is unshared before
  bubblewrap runs: a user namespace made first would leave bubblewrap unable to make its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import platform
import secrets
import tempfile
import resource
import shutil
import sys
import signal
import stat
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ... import course, proctree
from . import cgroup, enter_sandbox, socket_memory

@dataclass
class Limits:
    wall_s: float = 600.0         # the whole child; the caller may stop it earlier (per-cell timeouts)
    cpu_s: int | None = 3600       # RLIMIT_CPU: CPU seconds of the child (and of each of its descendants)
    memory_bytes: int | None = 16 * 2**30  # what the whole tree holds, shared memory included (cgroup or watchdog)
    file_bytes: int | None = 4 * 2**30     # RLIMIT_FSIZE: a runaway write stops here
    no_network: bool = False      # a network namespace of its own (outside the sandbox: best effort)
    processes: int | None = 256   # processes and threads of the tree at once (watchdog); a build runs tens
    disk_bytes: int | None = 8 * 2**30     # what a sandbox's writable folders hold (watchdog)


@dataclass
class Outcome:
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    out_of_memory: bool = False
    signal: int | None = None
    limit: str | None = None      # which watched limit stopped it, in words (memory, processes, disk)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.out_of_memory and not self.limit

    def describe(self) -> str:
        if self.timed_out:
            return f"stopped after {self.seconds:.0f} s (time limit)"
        if self.limit:
            return f"stopped: {self.limit}"
        if self.out_of_memory:
            return "stopped: used more memory than allowed"
        if self.signal:
            name = signal.Signals(self.signal).name if self.signal in signal.Signals._value2member_map_ else ""
            return f"crashed ({name or 'signal ' + str(self.signal)})"
        return f"exit status {self.returncode}"


PR_SET_PDEATHSIG = 1
KERNEL_STOPPED = ("used more memory than allowed (what its processes hold, /tmp, /var/tmp, /dev/shm and shared "
                  "memory included)")
PROCESSES_STOPPED = "started more than {} processes and threads at once (the limit)"
KEEPER = Path(__file__).with_name("keeper.py")
MARKER_ENV = "FUSELAB_CHILD_MARKER"
OUTPUT_TAIL_BYTES = 4 * 2**20  # what is read back of a child's stdout/stderr (the files may be far larger)


def _set_limits(limits: Limits, group=None, pids=None):
    def apply():
        os.setsid()
        for joined in (group, pids):  # before exec: nothing the command starts is ever outside the groups
            if joined is not None:
                with contextlib.suppress(OSError):
                    joined.join()
        # the keeper hears when the grader dies, even by SIGKILL, and ends everything below it
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a segfaulting kernel must not fill the disk
        if limits.cpu_s:
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
        if limits.file_bytes:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        # no namespace is made here: the keeper makes them for a command outside the sandbox, bubblewrap for one
        # inside (a user namespace made here would leave bubblewrap unable to make its own)
    return apply


def namespaces_available() -> bool:
    """Whether a command outside the sandbox gets a PID namespace of its own here (``keeper --pid``): as root, or
    where the kernel allows unprivileged user namespaces."""
    probe = subprocess.run([sys.executable, "-I", "-S", str(KEEPER), "--pid", "--", "/bin/sh", "-c", "echo $$"],
                           capture_output=True, text=True, timeout=60)
    return probe.stdout.strip() == "2"  # pid 1 is the namespace's init, the command comes next


children_of = proctree.descendants    # every descendant of a pid (from /proc), deepest last
process_trees = proctree.trees        # root → the set of it and its descendants, from one scan of /proc


def kill_tree(pid: int):
    """SIGKILL ``pid``'s descendants, round after round until none is left (a fork bomb forks while it is being
    killed; below a keeper, nothing escapes to init), then ``pid`` itself and its process group."""
    proctree.kill_below(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def marked(marker: str) -> list:
    """Processes whose environment carries ``MARKER_ENV=marker``: a child's, wherever they were reparented."""
    needle = f"{MARKER_ENV}={marker}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def sweep(marker: str) -> None:
    """Kill every process carrying the child's marker, with its descendants (the last resort of a child's end)."""
    for _ in range(20):
        victims = marked(marker)
        if not victims:
            return
        for victim in victims:
            kill_tree(victim)


_scan_lock = threading.Lock()
_scan = [float("-inf"), {}]  # (time.monotonic() of the last scan of /proc, pid → parent pid)


def recent_parents(max_age_s: float = 0.4) -> dict:
    """``proctree.parents()`` from a scan at most ``max_age_s`` old: each submission's limit watch and CPU meter
    read the process table twice a second, and with ten submissions at once one scan serves them all. Here, not in
    ``proctree``: the keeper loads that file at every child's start, and needs no lock."""
    with _scan_lock:
        if time.monotonic() - _scan[0] > max_age_s:
            _scan[:] = [time.monotonic(), proctree.parents()]
        return _scan[1]


def tree_tasks(tree) -> int:
    """Processes and threads of ``tree`` (each process's ``Threads:``): a thread takes a PID of the host's as a
    process does, and /proc lists only processes, so counting processes alone let 600 threads through."""
    total = 0
    for pid in tree:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
        except (OSError, ValueError, StopIteration, IndexError):
            total += 1
    return total


def private_tmpfs_bytes(tree, folders) -> int:
    """What the sandbox's private tmpfs folders hold: memory no process's resident size shows. Read through a
    process of the tree inside the sandbox (``/proc/PID/root``: its own mounts), each file system once; the host's
    own folders of the same names (seen through the processes outside the sandbox) are not counted."""
    own = set()
    for folder in folders:
        with contextlib.suppress(OSError):
            own.add(os.stat(folder).st_dev)
    seen, total = set(), 0
    for pid in tree:
        for folder in folders:
            path = f"/proc/{pid}/root{folder}"
            try:
                device = os.stat(path).st_dev
                if device in own or device in seen:
                    continue
                info = os.statvfs(path)
            except OSError:
                continue
            seen.add(device)
            total += (info.f_blocks - info.f_bfree) * info.f_frsize
    return total


TMPFS_MAGIC, HUGETLBFS_MAGIC = 0x01021994, 0x958458F6


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_long * 15)]


_statfs = ctypes.CDLL(None, use_errno=True).statfs


def _is_shmem_fs(path: str) -> bool:
    """Whether ``path`` (a magic link of /proc followed) lies on a tmpfs or hugetlbfs: memory, not disk."""
    info = _StatFs()
    return _statfs(os.fsencode(path), ctypes.byref(info)) == 0 and info.f_type in (TMPFS_MAGIC, HUGETLBFS_MAGIC)


def _shmem_mount_devices(pid) -> set:
    """The devices of the tmpfs and hugetlbfs mounts in ``pid``'s mount namespace, from the kernel's
    ``/proc/PID/mountinfo`` (nothing the process named is followed)."""
    try:
        with open(f"/proc/{pid}/mountinfo") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        fields = line.split()  # a mount point's spaces are escaped (\040): fields never hold one
        with contextlib.suppress(ValueError, IndexError):
            if fields[fields.index("-", 6) + 1] in ("tmpfs", "hugetlbfs"):
                major, minor = fields[2].split(":")
                found.add(os.makedev(int(major), int(minor)))
    return found


def _internal_shmem_device() -> int | None:
    """The device of the kernel's internal tmpfs: memfd_create's files, SysV shared memory and shared anonymous
    mappings all live there (their mappings show only as a deleted name)."""
    try:
        fd = os.memfd_create("fuselab-probe", os.MFD_CLOEXEC)
    except (OSError, AttributeError):
        return None
    try:
        return os.fstat(fd).st_dev
    finally:
        os.close(fd)


SHMEM_DEVICE = _internal_shmem_device()


def _held_descriptors(tree):
    """``(path, stat)`` of every descriptor ``tree``'s processes hold open (``/proc/PID/fd/N``, followed by
    ``stat`` to what it names: nothing is opened); processes and descriptors gone meanwhile are passed over."""
    for pid in tree:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in descriptors:
            path = f"/proc/{pid}/fd/{name}"
            try:
                yield path, os.stat(path)
            except OSError:
                continue


def shmem_bytes(tree, counted_devices=(), counted_elsewhere=()) -> int:
    """What the shared-memory objects ``tree``'s processes hold take, each object once (the watchdog's count where
    there is no memory cgroup, ``cgroup``): memory no resident size shows (a memfd written and never mapped, a
    shared mapping whose pages it dropped, a tmpfs file deleted but held open). Found by descriptor
    (``/proc/PID/fd``: sized by its blocks) and by mapping (``/proc/PID/maps``: sized by its blocks where
    ``map_files`` may be read, as root; by the mapped span where not). ``counted_devices``: file systems counted
    otherwise (the private tmpfs, ``private_tmpfs_bytes``); ``counted_elsewhere``: objects (``(st_dev, st_ino)``)
    another process of the same submission holds and counts."""
    counted = set(counted_devices)
    elsewhere = set(counted_elsewhere)
    objects: dict = {}
    shmem_devices = {SHMEM_DEVICE} if SHMEM_DEVICE is not None else set()
    other_devices: set = set()
    for path, info in _held_descriptors(tree):
        if not stat.S_ISREG(info.st_mode) or info.st_dev in counted:
            continue
        if info.st_dev not in shmem_devices:
            if info.st_dev in other_devices or not _is_shmem_fs(path):
                other_devices.add(info.st_dev)
                continue
            shmem_devices.add(info.st_dev)
        if (info.st_dev, info.st_ino) not in elsewhere:
            objects[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    mounted: dict = {}
    # an object sized by its blocks once a scan: a CUDA process maps each of the driver's device files hundreds of
    # times, and a stat of each mapping's magic link was most of what a watch of such a process cost
    sized: set = set()
    for pid in tree:
        try:
            with open(f"/proc/{pid}/maps") as handle:
                mappings = handle.read().splitlines()
        except OSError:
            continue
        for line in mappings:
            fields = line.split(None, 5)
            if len(fields) < 6 or fields[4] == "0":
                continue
            major, minor = fields[3].split(":")
            device = os.makedev(int(major, 16), int(minor, 16))
            key = (device, int(fields[4]))
            if device in counted or device in other_devices or key in elsewhere or key in sized:
                continue
            span = fields[0]
            if device not in shmem_devices:  # a named file's mapping: on a tmpfs of the host's?
                # the device is looked up in the process's mount table, or the mapping's magic link followed (as
                # root): never the name the mapping shows, a path inside the sandbox that it may have made a link
                where = f"/proc/{pid}/map_files/{span}"
                if pid not in mounted:
                    mounted[pid] = _shmem_mount_devices(pid)
                if device not in mounted[pid] and not _is_shmem_fs(where):
                    other_devices.add(device)
                    continue
                shmem_devices.add(device)
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                info = os.stat(f"/proc/{pid}/map_files/{span}")
            except OSError:  # map_files needs root: what the mapping can reach, the largest of its mappings
                objects[key] = max(objects.get(key, 0), end - start)
                continue
            sized.add(key)  # the object's own blocks, whichever mapping shows it
            objects[key] = info.st_blocks * 512 if stat.S_ISREG(info.st_mode) else 0  # a device's file holds none
    return sum(objects.values())


F_GETPIPE_SZ, FIONREAD = 1032, 0x541B


def pipe_bytes(tree) -> int:
    """What the pipes ``tree``'s processes hold by descriptor keep unread, each pipe once: kernel memory no resident
    size shows (a pipe of a megabyte, or thousands of small ones). A pipe holding anything counts as its whole
    capacity: a byte written at a time takes a page each. Read by opening the pipe again (for reading, without
    waiting: nothing is read from it), and only the pipe: the process may swap its descriptor for anything
    between two looks, so the file it names is first taken without opening it (``O_PATH``: no device, FIFO or
    terminal is opened that way), checked by ``fstat`` on that descriptor, and only then opened through the
    grader's own descriptor of it (``/proc/self/fd``), which nothing in the sandbox can swap."""
    seen, total = set(), 0
    for path, info in _held_descriptors(tree):
        key = (info.st_dev, info.st_ino)
        if not stat.S_ISFIFO(info.st_mode) or key in seen:
            continue
        seen.add(key)
        unread = _pipe_unread(path, key)
        if unread:
            total += unread
    return total


def _pipe_unread(path: str, key: tuple) -> int:
    """What the pipe that ``path`` (``/proc/PID/fd/N``) names holds unread, at least its capacity when anything;
    0 where ``path`` no longer names the pipe ``key``."""
    try:
        held = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        info = os.fstat(held)
        if not stat.S_ISFIFO(info.st_mode) or (info.st_dev, info.st_ino) != key:
            return 0
        fd = os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return 0
    finally:
        os.close(held)
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != key:
            return 0
        unread = struct.unpack("i", fcntl.ioctl(fd, FIONREAD, b"\0" * 4))[0]
        return max(unread, fcntl.fcntl(fd, F_GETPIPE_SZ)) if unread > 0 else 0
    except OSError:
        return 0
    finally:
        os.close(fd)


def own_network_socket_bytes(tree, diag: dict | None = None) -> int:
    """What the sockets of the network namespaces ``tree``'s processes have of their own (a sandbox's, a keeper's
    ``--net``) hold in their buffers: kernel memory no resident size shows, and of which a cgroup v1 charges no
    TCP (``socket_memory``). The grader's own namespace is never asked (other programs' sockets live there).
    ``diag``: the caller's ``sock_diag`` sockets by namespace, opened on first sight of a namespace and kept for
    the next ask (the caller closes them, ``close_diag``); without it each ask opens and closes its own."""
    try:
        mine = os.stat("/proc/self/ns/net")
    except OSError:
        return 0
    kept = diag if diag is not None else {}
    asked, total = {(mine.st_dev, mine.st_ino)}, 0
    try:
        for pid in tree:
            try:
                info = os.stat(f"/proc/{pid}/ns/net")
            except OSError:
                continue
            namespace = (info.st_dev, info.st_ino)  # a kept socket holds its namespace: this never names another
            if namespace in asked:
                continue
            asked.add(namespace)
            if namespace not in kept:
                kept[namespace] = socket_memory.diag_socket(pid)
            if kept[namespace] is None:
                del kept[namespace]  # not to be had now (the process ended): asked again next time
                continue
            try:
                total += socket_memory.socket_bytes(kept[namespace])
            except OSError:  # a dump cut short leaves the socket's queue unknown: a fresh one next time
                kept.pop(namespace).close()
    finally:
        if diag is None:
            close_diag(kept)
    return total


def close_diag(diag: dict) -> None:
    """Close the ``sock_diag`` sockets ``own_network_socket_bytes`` kept: each held its namespace alive."""
    while diag:
        diag.popitem()[1].close()


def held_deleted_bytes(tree, counted_devices=()) -> int:
    """What files deleted but held open by ``tree``'s processes take on disk: no folder walk finds them."""
    seen, total = set(), 0
    for _, info in _held_descriptors(tree):
        key = (info.st_dev, info.st_ino)
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 0 and key not in seen \
                and info.st_dev not in counted_devices and info.st_dev != SHMEM_DEVICE:
            seen.add(key)
            total += info.st_blocks * 512
    return total


def tree_rss(tree) -> tuple:
    """``(anonymous, file)`` resident memory of ``tree`` (``RssAnon``, ``RssFile``), from one read of each process's
    status: the shared memory its processes map is counted once per object instead (``shmem_bytes``,
    ``private_tmpfs_bytes``)."""
    held = {"RssAnon:": 0, "RssFile:": 0}
    for pid in tree:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line[:8] in held:
                with contextlib.suppress(ValueError, IndexError):
                    held[line[:8]] += int(line.split()[1]) * 1024
    return held["RssAnon:"], held["RssFile:"]


def private_devices(tree, folders) -> set:
    """The devices of the sandbox's private tmpfs folders, seen through a process of the tree."""
    own = set()
    for folder in folders:
        with contextlib.suppress(OSError):
            own.add(os.stat(folder).st_dev)
    found = set()
    for pid in tree:
        for folder in folders:
            with contextlib.suppress(OSError):
                device = os.stat(f"/proc/{pid}/root{folder}").st_dev
                if device not in own:
                    found.add(device)
    return found


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def folders_bytes(folders, budget: int, max_entries: int = 200_000, max_depth: int = 256) -> int:
    """Bytes the files under ``folders`` take on disk; past ``max_entries`` files and folders or ``max_depth``
    folders deep, once past ``budget``, or with a folder it may not read, more than ``budget`` (a tree of millions
    of empty files is no cheaper to keep).

    The folders are live (a sandbox writes them while this walks): each folder is opened by descriptor relative
    to its parent's (``O_NOFOLLOW | O_DIRECTORY``), never by a path, so a folder swapped for a link mid-walk is
    refused, not followed; nothing on another filesystem (``st_dev``) is entered. At most ``max_depth`` descriptors
    are held at once."""
    total, entries = 0, 0
    over = budget + 1
    held: list = []  # [descriptor, names of its folders left to enter], from the top down

    def listed(fd: int, device: int) -> list | None:
        """The folders in ``fd`` to enter, after counting all it holds; None once over."""
        nonlocal total, entries
        folders = []
        with os.scandir(fd) as listing:
            for entry in listing:
                entries += 1
                if entries > max_entries:
                    return None
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode) and info.st_dev == device:
                        folders.append(entry.name)
                if total > budget:
                    return None
        return folders

    try:
        for folder in folders:
            try:
                top = os.open(folder, _FOLDER)
            except PermissionError:
                return over  # a folder it made unreadable to hide what it holds (the grader is not root)
            except OSError:
                continue
            device = os.fstat(top).st_dev
            held.append([top, None])
            while held:
                fd, left = held[-1]
                if left is None:
                    try:
                        left = held[-1][1] = listed(fd, device)
                    except PermissionError:
                        return over
                    except OSError:
                        left = held[-1][1] = []
                    if left is None:
                        return max(total, over)
                if not left:
                    os.close(held.pop()[0])
                    continue
                name = left.pop()
                try:  # a link or anything else swapped in for the folder since it was listed is refused here
                    child = os.open(name, _FOLDER, dir_fd=fd)
                except PermissionError:
                    return over
                except OSError:
                    continue
                if os.fstat(child).st_dev != device or len(held) >= max_depth:
                    os.close(child)
                    if len(held) >= max_depth:
                        return over
                    continue
                held.append([child, None])
        return total
    finally:
        for fd, _ in held:
            os.close(fd)


def _tail(handle) -> str:
    handle.flush()
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - OUTPUT_TAIL_BYTES))
    return handle.read().decode("utf-8", errors="replace")


class MemoryBudget:
    """One submission's memory, shared by the processes that grade it (the checker and its two workers):
    ``--memory-gb`` is the submission's. Each child still has the whole limit for itself (its memory cgroup, or
    the watchdog), and each child's watch reports here what its tree holds; once the sum is past the limit, every
    child of the budget is stopped, saying so. Without it a submission held its limit in each of its three
    processes (the solution worker's Python and the kernel worker's static initialiser, a limit apiece)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.over: str | None = None
        self._used: dict = {}
        self._children: list = []
        self._lock = threading.Lock()

    def join(self, child) -> None:
        with self._lock:
            self._children.append(child)

    def leave(self, child) -> None:
        """A child that ended holds nothing any more."""
        with self._lock:
            self._used.pop(id(child), None)
            if child in self._children:
                self._children.remove(child)

    def report(self, child, used: int) -> str | None:
        """``child``'s tree holds ``used`` bytes now; why the budget stopped them all, or None."""
        return self._judge({child: used})

    def check_now(self) -> str | None:
        """Every child read now, together (``Child.held``), and judged on that sum: a test's end asks it before
        its verdict (``fuselab.grading.recheck.clean``), so what a submission holds across a test's end is judged
        the same on every run, whatever the watches' half-second looks happened to see. Why it stopped them, or
        None."""
        with self._lock:
            children = list(self._children)
        return self._judge({child: child.held() for child in children if child.alive()})

    def _judge(self, fresh: dict) -> str | None:
        with self._lock:
            for child, used in fresh.items():
                if child in self._children:  # not one that ended while it was read
                    self._used[id(child)] = used
            total = sum(self._used.values())
            if self.over is not None or total <= self.limit:
                return self.over
            self.over = (f"used more memory than allowed: {total / 2**20:.0f} MiB in the processes grading it "
                         f"together (the tests' and the workers'), past its {self.limit / 2**20:.0f} MiB")
            children = list(self._children)
        for each in children:
            each.out_of_memory = True
            each.limit = each.limit or self.over
            kill_tree(each.process.pid)
        return self.over


class SandboxFailed(RuntimeError):
    """A sandboxed child ended without its command ever starting inside the sandbox: whatever it would have
    graded is not graded (never a zero the student did not earn). ``detail``: what bubblewrap said."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(f"not graded: the sandbox did not start for this submission ({detail}); nothing was "
                         "saved for it, so the next run grades it again")


class Child:
    """A started child process with its limits; ``wait`` or ``stop`` it.

    ``process`` is the child's keeper (``keeper.py``), the parent of everything the command starts. A
    ``SandboxCommand`` (from ``sandboxed``) tells the child when its command started inside the sandbox; one that
    ends by itself without that raises ``SandboxFailed`` from ``wait``.
    """

    def __init__(self, command, *, limits: Limits, env=None, cwd=None, stdout=None, stderr=None, registry=None,
                 pass_fds=(), budget: MemoryBudget | None = None, counted_elsewhere=()):
        self.limits = limits
        self.budget = budget  # the submission's memory, shared with its other processes (``MemoryBudget``)
        # shared memory this tree holds that another child of the budget counts (the transfer memory a kernel
        # worker and its checker both hold, counted in the checker's): once in the budget's sum (``shmem_bytes``)
        self.counted_elsewhere = frozenset(counted_elsewhere)
        self.registry = registry  # a ``lease.DeviceLease``: the processes sharing a GPU, stopped while one times
        self.companions = ()  # children that run for this one (its kernel worker): never stopped for its timing
        self.started = time.monotonic()
        self.out_of_memory = False
        self.timed_out = False
        self.stopped = False
        self.limit = None
        self.marker = secrets.token_hex(8)
        self.sandbox = command if isinstance(command, SandboxCommand) else None
        env = absolute_search_paths(dict(os.environ if env is None else env, **{MARKER_ENV: self.marker}))
        # files, not pipes: a daemon holding a copy of a pipe would keep the grader waiting for its end
        self._stdout = None if stdout else tempfile.TemporaryFile()
        self._stderr = None if stderr else tempfile.TemporaryFile()
        self._started_r = None
        if self.sandbox is not None:
            self._started_r, started_w = os.pipe()
            os.set_blocking(self._started_r, False)
            command, pass_fds = self.sandbox.with_started_fd(started_w), (*pass_fds, started_w)
            options = []
        else:  # the keeper makes the namespaces the sandbox would have
            started_w = None
            options = ["--pid"] + (["--net"] if limits.no_network else [])
        # the kernel's count of the tree's memory, shared memory included, and its hard limit, where the grader
        # can have a memory cgroup; where not, the watchdog counts (``_over_limit``)
        self.group = cgroup.MemoryGroup.make(limits.memory_bytes) if limits.memory_bytes else None
        # and the kernel's limit on its processes and threads, where it can have a pids cgroup (``cgroup``)
        self.pids = cgroup.PidsGroup.make(limits.processes) if limits.processes else None
        try:
            self.process = subprocess.Popen([sys.executable, "-I", "-S", str(KEEPER), *options, "--", *command],
                                            cwd=cwd, env=env, preexec_fn=_set_limits(limits, self.group, self.pids),
                                            stdin=subprocess.DEVNULL, stdout=stdout or self._stdout,
                                            stderr=stderr or self._stderr, pass_fds=tuple(pass_fds))
        except BaseException:
            for made in (self.group, self.pids):
                if made is not None:
                    made.remove()
            raise
        finally:
            if started_w is not None:
                os.close(started_w)
        if self.group is not None and not self.group.holds(self.process.pid):
            self.group.remove()  # it could not join (the watchdog counts instead)
            self.group = None
        if self.pids is not None and not self.pids.holds(self.process.pid):
            self.pids.remove()  # it could not join (the watchdog counts instead)
            self.pids = None
        self._done = threading.Event()
        self._diag: dict = {}  # the watchdog's sock_diag sockets, by network namespace (``_socket_bytes``)
        if registry is not None:
            registry.register(self)
        if budget is not None:
            budget.join(self)
        if limits.memory_bytes or limits.processes or (limits.disk_bytes and self.sandbox is not None):
            threading.Thread(target=self._watch, daemon=True).start()

    def _socket_bytes(self, tree) -> int:
        """``own_network_socket_bytes``, asked at most once a second through sockets kept for the child's life;
        ``tree``: a function giving the tree's pids (read only when the sockets are asked)."""
        now = time.monotonic()
        if now - getattr(self, "_sockets_at", -10.0) >= 1.0:
            self._sockets, self._sockets_at = own_network_socket_bytes(tree(), self._diag), now
        return self._sockets

    def _over_limit(self, check_disk: bool) -> str | None:
        """Which watched limit the tree is past now, in words; None while within them. The tree's processes are
        read from /proc only where a check needs them: with both cgroups, the kernel counts the tasks and the
        memory, and only the sockets' check (once a second) and the disk's need the pids (a scan of /proc and a
        file per process, twice a second for each of a submission's three children, was most of the watch)."""
        limits = self.limits
        pids: list = []

        def tree() -> list:
            if not pids:
                pids.extend([self.process.pid] + children_of(self.process.pid, recent_parents()))
            return pids

        if limits.processes and (self.pids.hit() if self.pids is not None
                                 else tree_tasks(tree()) > limits.processes):
            return PROCESSES_STOPPED.format(limits.processes)
        if limits.memory_bytes and self.group is not None:
            # a cgroup v1 charges no TCP buffers (and its ``used`` reads no socket's): the sockets are asked too
            used = self.group.used() + self._socket_bytes(tree)
            if self.group.oom_kills() or used > limits.memory_bytes:
                self.out_of_memory = True
                return KERNEL_STOPPED
            if self.budget is not None and self.budget.report(self, used):
                return self.budget.over
        elif limits.memory_bytes:
            total, files, private, shared, sockets = self._counted(tree(), self._socket_bytes(tree))
            if total > limits.memory_bytes:
                self.out_of_memory = True
                held = f" (of it {private / 2**20:.0f} MiB in /tmp, /var/tmp, /dev/shm)" if private else ""
                held += f" (of it {shared / 2**20:.0f} MiB of shared memory)" if shared else ""
                held += f" (of it {sockets / 2**20:.0f} MiB in its sockets' and pipes' buffers)" if sockets else ""
                return f"used more memory than allowed{held}"
            # the budget, like a memory cgroup's count, leaves out file pages (the libraries all three map, once each)
            if self.budget is not None and self.budget.report(self, total - files):
                return self.budget.over
        if check_disk and limits.disk_bytes and self.sandbox is not None:
            devices = private_devices(tree(), self.sandbox.private)
            used = folders_bytes(self.sandbox.own, limits.disk_bytes) + held_deleted_bytes(tree(), devices)
            if used > limits.disk_bytes:
                return (f"wrote more than {limits.disk_bytes / 2**20:.0f} MiB to its folders "
                        "(the disk budget; or more files than allowed, or a folder hidden from the grader)")
        return None

    def _counted(self, members: list, socket_bytes: int) -> tuple:
        """The watchdog's count of ``members`` (the tree's pids): ``(total, of it file pages, private tmpfs,
        shared memory, sockets' and pipes' buffers)``."""
        private, devices = 0, set()
        if self.sandbox is not None:
            private = private_tmpfs_bytes(members, self.sandbox.private)
            devices = private_devices(members, self.sandbox.private)
        shared = shmem_bytes(members, devices, self.counted_elsewhere)
        sockets = socket_bytes + pipe_bytes(members)
        anon, files = tree_rss(members)
        return anon + files + private + shared + sockets, files, private, shared, sockets

    def held(self) -> int:
        """What the tree holds now as the submission's budget counts it (``MemoryBudget``): its memory cgroup's
        count, or the watchdog's less the file pages; its sockets as its watch last read them (their
        ``sock_diag`` sockets are the watch thread's own)."""
        sockets = getattr(self, "_sockets", 0)
        if self.group is not None:
            return self.group.used() + sockets
        total, files, *_ = self._counted([self.process.pid] + children_of(self.process.pid, recent_parents()),
                                         sockets)
        return total - files

    def _watch(self):
        rounds = 0
        try:
            while not self._done.wait(0.5):
                if self.process.poll() is not None:
                    return
                rounds += 1
                why = self._over_limit(check_disk=rounds % 4 == 1)  # a walk of its folders every 2 s
                if why:
                    self.limit = why
                    kill_tree(self.process.pid)
                    return
        finally:
            close_diag(self._diag)  # only this thread uses them

    def alive(self) -> bool:
        return self.process.poll() is None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def stop(self, timed_out=True):
        self.timed_out = self.timed_out or timed_out
        self.stopped = self.stopped or self.process.poll() is None  # one that ended by itself was not stopped
        kill_tree(self.process.pid)

    def paused(self) -> float:
        """Seconds it spent stopped so another submission could time a kernel alone: not its own time."""
        return self.registry.stopped_seconds(self) if self.registry is not None else 0.0

    def _time_left(self, deadline) -> float:
        if deadline is not None:
            return deadline - time.monotonic()
        return self.limits.wall_s - (self.elapsed() - self.paused())

    def _sandbox_started(self) -> bool:
        try:
            return bool(os.read(self._started_r, 1))
        except (BlockingIOError, OSError):
            return False
        finally:
            os.close(self._started_r)
            self._started_r = None

    def wait(self, timeout=None) -> Outcome:
        """Wait for the end: at most ``timeout`` more seconds, or (None) until its wall limit, pauses not counted."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                self.process.wait(timeout=max(0.0, min(self._time_left(deadline), 1.0)))
                break
            except subprocess.TimeoutExpired:
                if self._time_left(deadline) <= 0:
                    self.stop()
                    self.process.wait()
                    break
        self._done.set()
        kill_tree(self.process.pid)  # leftovers a finished child may have started (a kernel, a compiler)
        if self.budget is not None:
            self.budget.leave(self)
        sweep(self.marker)
        if self.group is not None:
            if self.group.oom_kills():  # the kernel stopped a process of it at the limit
                self.out_of_memory = True
                self.limit = self.limit or KERNEL_STOPPED
            self.group.remove()
        if self.pids is not None:
            if self.pids.hit():  # the kernel refused a fork at the limit, whether or not the watchdog looked since
                self.limit = self.limit or PROCESSES_STOPPED.format(self.limits.processes)
            self.pids.remove()
        if self.registry is not None:
            self.registry.unregister(self)
        stdout = _tail(self._stdout) if self._stdout else ""
        stderr = _tail(self._stderr) if self._stderr else ""
        for handle in (self._stdout, self._stderr):
            if handle:
                handle.close()
        code = self.process.returncode
        if self._started_r is not None and not self._sandbox_started() and not (self.stopped or self.limit):
            raise SandboxFailed((stderr or stdout).strip()[-300:] or f"exit status {code}")
        return Outcome(returncode=code, stdout=stdout, stderr=stderr, seconds=self.elapsed(),
                       timed_out=self.timed_out, out_of_memory=self.out_of_memory,
                       signal=-code if code is not None and code < 0 else None, limit=self.limit)


def run(command, *, limits: Limits | None = None, env=None, cwd=None, registry=None) -> Outcome:
    """Run ``command`` to the end or to its limits; never raises for what the child did."""
    return Child(command, limits=limits or Limits(), env=env, cwd=cwd, registry=registry).wait()


# --- bubblewrap -------------------------------------------------------------------------------------------------

def bubblewrap() -> str | None:
    return shutil.which("bwrap")


_options: dict = {}


def _bubblewrap_has(option: str) -> bool:
    """Whether this bubblewrap knows ``option`` (``--size`` came with 0.8; older ones refuse the whole line)."""
    bwrap = bubblewrap()
    if bwrap not in _options:
        try:
            _options[bwrap] = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError, TypeError):
            _options[bwrap] = ""
    return option in _options[bwrap].split()


def _tmpfs(folder: str, size: int) -> list:
    """A tmpfs at ``folder``, at most ``size`` bytes where bubblewrap can say so (older ones: unbounded, but what
    it holds still counts as the child's memory, ``private_tmpfs_bytes``)."""
    return (["--size", str(size)] if _bubblewrap_has("--size") else []) + ["--tmpfs", folder]


SANDBOX_UID = int(os.environ.get("FUSELAB_SANDBOX_UID", 65534))  # who student code runs as when grading as root
SANDBOX_GID = int(os.environ.get("FUSELAB_SANDBOX_GID", 65534))
# The environment inside, by name: what Python, the compilers, CUDA, torch, Jupyter and the grader's workers read;
# never a family by prefix (a TA's FUSELAB_TOKEN or CUDA_API_KEY would pass), never the TA's other variables.
WORKER_ENV = frozenset("""
    PATH HOME LANG LANGUAGE LC_ALL LC_CTYPE LC_NUMERIC LC_TIME LC_COLLATE LC_MONETARY LC_MESSAGES TZ TERM
    LD_LIBRARY_PATH VIRTUAL_ENV PYTHONPATH PYTHONUNBUFFERED PYTHONDONTWRITEBYTECODE PYTHONHASHSEED
    MPLBACKEND MPLCONFIGDIR IPYTHONDIR JUPYTER_PATH JUPYTER_CONFIG_DIR JUPYTER_DATA_DIR JUPYTER_RUNTIME_DIR
    JUPYTER_PLATFORM_DIRS OMP_NUM_THREADS MKL_NUM_THREADS OMP_WAIT_POLICY
    CUDA_HOME CUDA_PATH CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER CUDA_MODULE_LOADING CUDA_LAUNCH_BLOCKING
    CUDA_CACHE_PATH CUDA_CACHE_DISABLE NVIDIA_VISIBLE_DEVICES NVIDIA_DRIVER_CAPABILITIES
    TORCH_EXTENSIONS_DIR TORCH_CUDA_ARCH_LIST TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR MAX_JOBS
    FUSELAB_GRADING FUSELAB_NATIVE_POLICY FUSELAB_CACHE_DIR FUSELAB_SHARED_BUILDS FUSELAB_GRADE_LOG
    FUSELAB_GRADER_ANSWERS_FD FUSELAB_GPU_SHARED FUSELAB_SOLUTION_FDS FUSELAB_KERNEL_FDS FUSELAB_KERNEL_TRANSFER
    FUSELAB_KERNELS_IN_CHECKER FUSELAB_SOLUTION_CELL_S
    FUSELAB_BACKEND FUSELAB_BUILD_TIMEOUT FUSELAB_POLICY FUSELAB_EMU_SEED FUSELAB_EMU_ORDER FUSELAB_EMU_GUARD
    FUSELAB_EMU_ASSERT FUSELAB_EMU_STACK_KB FUSELAB_CHILD_MARKER
""".split())
# Never the grader's compiler settings (CC, CXX, CUDAHOSTCXX, NVCC_*_FLAGS, CPATH, LIBRARY_PATH...): they name
# programs and folders of the grader's machine, which the sandbox need not show (on the H200 machine CXX names a
# compiler outside it, and every build in the sandbox failed); the build finds its compiler as a student's does.
TOOLCHAIN_ENV = frozenset("CC CXX CUDAHOSTCXX NVCC_PREPEND_FLAGS NVCC_APPEND_FLAGS CPATH LIBRARY_PATH C_INCLUDE_PATH "
                          "CPLUS_INCLUDE_PATH".split())
assert not WORKER_ENV & TOOLCHAIN_ENV
ALLOWED_ENV = "|".join(sorted(WORKER_ENV))  # enter_sandbox's argument: matched whole against each name


def worker_env(env: dict) -> dict:
    """``env`` cut down to ``WORKER_ENV`` (what ``enter_sandbox`` keeps inside the sandbox)."""
    return {name: value for name, value in env.items() if name in WORKER_ENV}


# Search paths by name and their separators. An empty or relative entry is the working folder, and a child's is its
# own, which what ran there before wrote (a worker started again after a crash): with ``LD_LIBRARY_PATH=/cuda/lib:``
# (an export onto an unset variable) the keeper, as root and outside the sandbox, loaded the libm a submission left.
SEARCH_PATHS = {"PATH": ":", "LD_LIBRARY_PATH": ":", "PYTHONPATH": ":", "LD_PRELOAD": ": "}


def absolute_search_paths(env: dict) -> dict:
    """``env`` with every search path's empty or relative entries dropped (a variable left empty is dropped); an
    ``LD_PRELOAD`` library named without a folder is looked up in the system's folders and kept."""
    cleaned = dict(env)
    for name, separators in SEARCH_PATHS.items():
        if name not in cleaned:
            continue
        entries = re.split(f"[{re.escape(separators)}]", cleaned[name])
        kept = [e for e in entries if os.path.isabs(e) or (name == "LD_PRELOAD" and e and "/" not in e)]
        if kept:
            cleaned[name] = separators[0].join(kept)
        else:
            del cleaned[name]
    return cleaned


# System folders that hold other programs' sockets, scratch files or the TA's things: each replaced by an empty one
# (the host's Unix sockets live in /run, /tmp and /var/run; homes hold keys and tokens).
# What of the machine a sandbox sees: the system's programs, libraries and settings, read-only. Everything else
# (homes, /work, /srv, /var, /opt, other checkouts of the course, earlier runs' folders wherever they were written)
# is absent unless the sandbox is given it: the Python environment and the course (``runtime_folders``), and the
# folders of the call. An allow-list, so that no place the grader's authors did not think of is left readable.
SYSTEM_SHOWN = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
# private and empty inside: a runtime folder is never one of these as a whole
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")
# each of them at most this big (bubblewrap's ``--size``), and what they hold counts as the child's memory
TMPFS_BYTES = 1 * 2**30


class SandboxCommand(list):
    """The command line ``sandboxed`` built, with what ``Child`` needs of it: the writable folders (``own``: the
    disk budget), the private tmpfs folders (``private``: counted as memory), and where the fd that says "started"
    goes (``with_started_fd``)."""

    STARTED = "--fuselab-started-fd--"

    def __init__(self, args, own, private):
        super().__init__(args)
        self.own, self.private = [str(f) for f in own], list(private)

    def with_started_fd(self, fd: int) -> list:
        return [str(fd) if arg == self.STARTED else arg for arg in self]


# run first inside the sandbox: writes one byte to the fd the grader handed over, so the grader knows the command
# got started inside, then becomes the command (a sandbox that failed to start never writes it)
_STARTED = ("import os,sys\nfd=sys.argv[1]\nif fd.isdigit(): os.write(int(fd),b'1'); os.close(int(fd))\n"
            "os.execvp(sys.argv[2],sys.argv[2:])")
# the course's folders a submission must never read, in any checkout of the course the runtime shows (an
# editable install puts its checkout on sys.path): the solutions (and their history), the sample class, runs
HIDDEN_IN_REPO = ("solutions", ".git", "grader/examples", "grader/runs")
# Of a checkout of the course, a sandbox sees only what its processes read: the package (the checker and the
# workers import it). An allow-list: solutions/, grader/, the sample class, earlier runs, .cache's builds, tests/,
# docs/ and whatever is added later stay out.
SHOWN_OF_CHECKOUT = ("fuselab",)
# in the package: the sample class's submissions (correct kernels among them), which no graded process imports;
# each is an empty file inside
HIDDEN_IN_PACKAGE = ("labs/*/samples.py",)


def _is_checkout(folder: Path) -> bool:
    """Whether ``folder`` is a checkout of the course (the running one, or another with the same layout)."""
    return folder == course.REPO or ((folder / "fuselab" / "__init__.py").is_file()
                                     and (folder / "grader" / "nbgrader_config.py").is_file())


def runtime_folders() -> list:
    """The folders a sandboxed Python, its compilers and the course need beyond ``SYSTEM_SHOWN``: the interpreter's
    prefixes, ``sys.path`` (a PYTHONPATH wheelhouse, as on the GPU machine; an editable checkout), the course, the
    CUDA toolkit. The outermost of nested ones; never ``/``, a home or a private folder as a whole; of a checkout of
    the course, only ``SHOWN_OF_CHECKOUT``."""
    from ...toolchain import find_cuda_home
    shown = [Path(p) for p in SYSTEM_SHOWN]
    never = {Path("/"), Path.home(), Path("/home"), Path("/root"), *map(Path, PRIVATE)}
    candidates = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent, course.REPO,
                  *[Path(p) for p in sys.path if p and os.path.isabs(p) and p not in _start_folders()]]
    # and where links among them lead (an environment linked into the checkout): the sandbox shows no link's target
    candidates += [Path(os.path.realpath(p)) for p in candidates]
    cuda = find_cuda_home()
    if cuda:
        candidates.append(Path(cuda))
    folders = []
    for folder in candidates:
        folder = Path(os.path.abspath(folder))
        if folder in never or not folder.is_dir() or any(folder == s or s in folder.parents for s in shown):
            continue
        if _is_checkout(folder):  # a checkout on sys.path (PYTHONPATH, an editable install): its allow-list only
            folders += [folder / name for name in SHOWN_OF_CHECKOUT if (folder / name).exists()]
            continue
        folders.append(folder)
    folders = list(dict.fromkeys(folders))
    return [f for f in folders if not any(o in f.parents for o in folders)]


def _start_folders() -> set:
    """The folders Python put first on the grader's own path for how it was started (the working folder for
    ``python -m fuselab.cli`` or ``-c``, a script's folder), unless ``PYTHONPATH`` names them too: no graded child
    has them on its path (each starts with ``-m`` in its own folder), and they may be any folder of the TA's (a
    Downloads folder, a project with its tokens), which the sandbox would have shown whole."""
    named = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    started = {os.getcwd()}
    if sys.argv and sys.argv[0] not in ("", "-c", "-m"):
        started.add(os.path.dirname(os.path.abspath(sys.argv[0])))
    return {folder for folder in started if folder not in named}


def _packages_shown(runtime) -> list:
    """Every copy of the course's package inside the folders ``runtime`` shows: a checkout's, one beside it, one
    installed in the Python environment (its site-packages lies deep inside the environment's folder)."""
    found = [f for f in runtime if f.name == "fuselab"] + [f / "fuselab" for f in runtime]
    found += [Path(p) / "fuselab" for p in sys.path if p and os.path.isabs(p)]
    found = [Path(os.path.abspath(f)) for f in found if (f / "__init__.py").is_file()]
    return [f for f in dict.fromkeys(found) if any(r == f or r in f.parents for r in runtime)]


def refused_calls() -> list:
    """The system calls that fail inside the sandbox: SysV shared memory, message queues and semaphores (memory in
    the sandbox's own IPC namespace that no process shows: 150 sets of 32000 semaphores held 300 MiB; nothing the
    course runs uses them), ``memfd_secret`` (pages of a file system of their own, held by the descriptor once
    unmapped), ``memfd_create`` where neither a memory cgroup nor ``/proc/PID/map_files`` (root's) lets the
    grader size a memfd that is only mapped; and ``sched_setaffinity`` does nothing (it returns 0: OpenMP's
    binding aborts on an error): threads pinned to fewer CPUs than a child may use keep each other waiting while
    a test's own time counts its CPU time per thread it may use (a loop made to look starved, stopped by the
    wall-clock backstop instead of its own limit, is retried alone with every other submission held)."""
    return ["shmget", "msgget", "semget", "memfd_secret", "sched_setaffinity"] + (
        [] if os.geteuid() == 0 or cgroup.available() else ["memfd_create"])


def gpu_device_nodes() -> list:
    """The GPU's device files that exist here (``/dev/nvidia0``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm``,
    ``/dev/nvidia-caps``, ...): the only ones shown inside the sandbox besides the basic ones."""
    return sorted(str(p) for p in Path("/dev").glob("nvidia*"))


def sandboxed(command, *, own: list, hide: list, readonly=()) -> list:
    """``command`` inside bubblewrap.

    - it runs as a user without rights: run as root, the grader enters the sandbox as ``SANDBOX_UID`` (chowning
      ``own`` to it); every capability is gone (``CapEff`` 0), no user namespace can be made inside, so ``mount``,
      ``unshare`` and remounting read-write fail;
    - it sees only the system (``SYSTEM_SHOWN``) and the runtime (``runtime_folders``), read-only: no home, no
      other checkout's or run's files; of a checkout of the course only the package and nbgrader's settings
      (``SHOWN_OF_CHECKOUT``), the package's sample submissions empty (``HIDDEN_IN_PACKAGE``); the course's
      solutions and sample class where a shown folder holds them (``HIDDEN_IN_REPO``) and ``hide`` are empty
      read-only folders; ``readonly`` folders are shown again read-only;
      ``own`` folders (the submission's) are writable, the first one is ``HOME``; the working folder is the
      caller's where it is visible inside;
    - its own network (loopback only), IPC, UTS, cgroup and PID namespaces; a private ``/tmp``, ``/var/tmp`` and
      ``/dev/shm`` (``TMPFS_BYTES`` each, counted by ``Child`` as memory); a minimal ``/dev`` plus the GPU's device
      files; ``/`` and ``/dev`` themselves read-only (nothing can be created there); killed with its parent;
    - only the environment variables a worker reads, by name (``WORKER_ENV``);
    - the command starts behind a one-line Python that tells ``Child`` it started inside (``SandboxCommand``).

    Returns a ``SandboxCommand``: run it with ``Child`` (the sandbox check does too, ``sandbox_problem``).
    """
    bwrap = bubblewrap()
    if bwrap is None:
        raise RuntimeError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    args = [bwrap]
    for folder in SYSTEM_SHOWN:
        if os.path.isdir(folder):  # a link (/bin -> usr/bin) is shown as the folder it names
            args += ["--ro-bind", folder, folder]
    args += ["--dev", "/dev", "--proc", "/proc",
             "--unshare-user", "--disable-userns", "--unshare-ipc", "--unshare-pid", "--unshare-net",
             "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
             "--cap-drop", "ALL"]
    if platform.machine() in enter_sandbox.SYSCALLS:
        args += ["--fuselab-refuse", ",".join(refused_calls())]
    for folder in PRIVATE:
        args += _tmpfs(folder, TMPFS_BYTES)
    empty = []  # hidden folders: empty tmpfs, read-only once everything is mounted (nothing can be stored there)
    for node in gpu_device_nodes():
        args += ["--dev-bind", node, node]
    runtime = runtime_folders()
    for folder in runtime:
        args += ["--fuselab-ro-bind", str(folder), str(folder)]
    for folder in runtime:  # every checkout of the course the runtime shows, not only the running one
        for name in HIDDEN_IN_REPO:
            if (folder / name).is_dir():
                args += _tmpfs(str(folder / name), 4096)
                empty.append(str(folder / name))
    for package in _packages_shown(runtime):
        for pattern in HIDDEN_IN_PACKAGE:
            for hidden in sorted(package.glob(pattern)):
                args += ["--fuselab-empty", str(hidden)]
    # hidden wherever a folder the sandbox shows holds it: a run folder inside the repository, or under a system
    # folder (``--out /usr/local/share/course``: every sandbox read the class's notebooks and results there)
    shown = [*runtime, *(Path(f) for f in SYSTEM_SHOWN if os.path.isdir(f))]
    for folder in hide:
        if Path(folder).is_dir() and any(r in Path(folder).parents or r == Path(folder) for r in shown):
            args += _tmpfs(str(folder), 4096)
            empty.append(str(folder))
        elif Path(folder).is_file() and any(r in Path(folder).parents for r in shown):
            args += ["--fuselab-empty", str(folder)]  # a class's zip in the checkout: an empty file inside
    for folder in readonly:  # last: shown even inside a hidden folder (the shared builds in the run folder)
        if folder and Path(folder).exists():
            args += ["--fuselab-ro-bind", str(folder), str(folder)]
    as_root = os.geteuid() == 0
    for folder in own:
        Path(folder).mkdir(parents=True, exist_ok=True)
        if as_root:
            _give(Path(folder), SANDBOX_UID, SANDBOX_GID)
        args += ["--fuselab-bind", str(folder), str(folder)]
    # last, once every mount point is made: bubblewrap's own root and /dev are tmpfs that nothing bounds or counts,
    # so they are read-only (the folders mounted on them keep their own modes: the device files, the GPU's among
    # them, stay usable, /dev/shm and /tmp stay private, bounded and counted)
    for folder in [*empty, "/dev", "/"]:
        args += ["--remount-ro", folder]
    args += ["--setenv", "HOME", str(own[0]) if own else "/tmp"]
    # a user site under that HOME is what the sandbox itself wrote (a worker started again in the same folder
    # would run a .pth its predecessor left, before its first request): Python reads none inside
    args += ["--setenv", "PYTHONNOUSERSITE", "1"]
    enter = [sys.executable, "-I", "-S", str(Path(__file__).with_name("enter_sandbox.py")),
             str(SANDBOX_UID), str(SANDBOX_GID), ALLOWED_ENV, "--"]
    started = [sys.executable, "-I", "-S", "-c", _STARTED, SandboxCommand.STARTED]
    return SandboxCommand(enter + args + ["--", *started, *command], own=own, private=PRIVATE)


GIVE_DEPTH = 256  # as deep as ``folders_bytes`` counts: below it, only what the sandbox itself made


def _give(folder: Path, uid: int, gid: int) -> None:
    """``folder`` and everything in it to the sandbox's user: links themselves, never what they point to, and
    never a file with a second name elsewhere (a hard link to a file of the host's). Walked by descriptors, one
    per level, down to ``GIVE_DEPTH`` folders (what lies deeper a sandbox made, and is its user's already): a
    submission can nest folders deeper than any recursion or path goes."""
    os.lchown(folder, uid, gid)
    held = [[os.open(folder, _FOLDER), None]]  # [descriptor, names of its folders left to enter]
    try:
        while held:
            fd, left = held[-1]
            if left is None:
                left = held[-1][1] = []
                with os.scandir(fd) as listing:
                    for entry in listing:
                        with contextlib.suppress(OSError):
                            info = entry.stat(follow_symlinks=False)
                            is_dir = stat.S_ISDIR(info.st_mode)
                            if info.st_uid != uid and (is_dir or info.st_nlink == 1):
                                os.chown(entry.name, uid, gid, dir_fd=fd, follow_symlinks=False)
                            if is_dir:
                                left.append(entry.name)
            if not left or len(held) >= GIVE_DEPTH:
                os.close(held.pop()[0])
                continue
            with contextlib.suppress(OSError):  # a link swapped in since the listing is refused, not followed
                held.append([os.open(left.pop(), _FOLDER, dir_fd=fd), None])
    finally:
        for fd, _ in held:
            os.close(fd)


PROBE = ("import os\nopen('probe', 'w').write('written')\n"
         "print(os.getuid(), next(l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')))")


def sandbox_problem(limits: Limits | None = None, env=None) -> str | None:
    """Why the sandbox cannot run here, or None: a command built by ``sandboxed`` (the same builder as every graded
    child's) and run by ``Child`` with ``limits`` (the grading run's: ``pipeline._limits``) starts, runs this
    Python inside, writes its own folder, and has no capabilities and is not root."""
    if bubblewrap() is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    limits = Limits(**{**(limits or Limits()).__dict__, "wall_s": 60})
    with tempfile.TemporaryDirectory(prefix="fuselab-sandbox-check-") as own:
        try:
            command = sandboxed([sys.executable, "-I", "-S", "-c", PROBE], own=[own], hide=[])
            probe = Child(command, limits=limits, env=env, cwd=own).wait()
        except SandboxFailed as exc:
            return f"bubblewrap cannot start a sandbox here: {exc.detail}"
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            return f"bubblewrap could not start: {exc}"
        if not probe.ok:
            return f"bubblewrap cannot start a sandbox here ({(probe.stderr or probe.stdout).strip()[-300:]})"
        found = probe.stdout.split()
        if len(found) < 2 or found[0] == "0" or set(found[1]) != {"0"}:
            return f"inside bubblewrap the code would keep rights (uid, CapEff: {' '.join(found)})"
        try:
            written = stat.S_ISREG(os.lstat(Path(own) / "probe").st_mode)
        except OSError:
            written = False
        if not written:
            return "inside bubblewrap the submission's own folder is not writable"
    return None


def sandbox_works() -> bool:
    """bubblewrap is installed and can start a rightless process here (containers may forbid its namespaces)."""
    return sandbox_problem() is None


# --- GPU --------------------------------------------------------------------------------------------------------

def gpu_processes(device: str | None = None) -> list:
    """PIDs with a compute context on the GPU(s) (``gpu_facts``); [] where NVML cannot tell."""
    from ... import gpu_facts
    return gpu_facts.compute_pids(device)


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
            # the driver reports PIDs of another PID namespace (a container): nothing to match them against
            return True, ""
        for leftover in [p for p in busy if p in ours]:
            kill_tree(leftover)
        others = [p for p in busy if p not in ours]
        if not others:
            return True, ""
        if time.monotonic() > deadline:
            return False, f"GPU {device or ''} busy with process(es) {others}: timings may be disturbed"
        time.sleep(0.5)
