"""A memory cgroup per graded child: the kernel's own count of what its process tree holds, and a hard limit.

A process tree holds memory no process's resident size shows: files in a tmpfs, a ``memfd_create``'d file written
and never mapped, SysV shared memory, a file deleted but held open, pages of a shared mapping it dropped with
``madvise``. The kernel charges each of these pages to the memory cgroup of the process that made it, so a cgroup
made for the tree (before its command starts: the child joins it between fork and exec) counts them all, and its
hard limit holds between two looks of the watchdog.

- **cgroup v1** (a ``memory`` hierarchy the grader may write, as root): a group under the grader's own, with
  ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap is accounted: nothing is swapped out of
  the count);
- **cgroup v2**: a group under the grader's own where that one delegates ``memory`` to its children (a group with
  processes of its own cannot: the grader does not move itself), with ``memory.max`` and ``memory.swap.max`` 0;
- **neither** (a plain user without a delegated group, a container that hides them): ``make`` gives None and
  ``isolate.Child``'s watchdog counts instead (resident memory, the private tmpfs, and each shared-memory object
  its processes hold by descriptor or mapping, ``isolate.shmem_bytes``).

``used`` is what the watchdog reads: the tree's anonymous and shared memory (page cache of files it read is not
memory it holds: the kernel reclaims it first at the limit); ``oom_kills`` how often the kernel stopped one of its
processes at the limit.
"""

from __future__ import annotations

import atexit
import contextlib
import secrets
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_groups() -> list:
    """``(version, folder)`` of the grader's own memory cgroup: v1's ``memory`` hierarchy, v2's unified one."""
    found = []
    for number, controllers, relative in _own_lines():
        if "memory" in controllers:
            found.append(("v1", ROOT / "memory" / relative))
        elif number == "0" and not controllers:
            found.append(("v2", ROOT / relative))
    return found


def _own_lines() -> list:
    """The grader's own groups, a ``(hierarchy number, [controllers], path below the root)`` per line of
    ``/proc/self/cgroup``."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        found.append((number, [c for c in controllers.split(",") if c], path.lstrip("/")))
    return found


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _fields(path: Path) -> dict:
    fields = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if value.strip().isdigit():
                fields[name] = int(value)
    return fields


class _Group:
    """One child's cgroup folder: joined by the child (``join``, between fork and exec), asked whether it holds a
    process (``holds``), removed once its processes are gone (``remove``)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._procs = str(folder / "cgroup.procs")  # a plain str: ``join`` runs in the child, before exec

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` is in the group (the child joined it before exec)."""
        try:
            return str(pid) in (self.folder / "cgroup.procs").read_text().split()
        except OSError:
            return False

    def join(self) -> None:
        """Move the calling process into the group (its children follow): called in the child before exec."""
        with open(self._procs, "w") as handle:
            handle.write("0")

    def remove(self) -> None:
        """Remove the group (its processes are gone; one still exiting is waited for a moment)."""
        for _ in range(50):
            try:
                self.folder.rmdir()
                _made.discard(self.folder)
                return
            except FileNotFoundError:
                _made.discard(self.folder)
                return
            except OSError:
                time.sleep(0.1)


class MemoryGroup(_Group):
    """One child's memory cgroup: made by ``make``, joined by the child, read by the watchdog (``used``,
    ``oom_kills``), removed once its processes are gone."""

    def __init__(self, version: str, folder: Path):
        super().__init__(folder)
        self.version = version

    @classmethod
    def make(cls, limit_bytes: int) -> MemoryGroup | None:
        """A fresh group limited to ``limit_bytes``, or None where the grader can have none."""
        for version, parent in _own_groups():
            if version == "v2" and not _delegates(parent, "memory"):
                continue
            folder = parent / f"fuselab-{secrets.token_hex(6)}"
            try:
                folder.mkdir()
            except OSError:
                continue
            group = cls(version, folder)
            _made.add(folder)
            try:
                group._limit(limit_bytes)
                return group
            except OSError:
                group.remove()
        return None

    def _limit(self, limit: int) -> None:
        if self.version == "v1":
            _write(self.folder / "memory.limit_in_bytes", str(limit))
            with contextlib.suppress(OSError):  # only where swap is accounted
                _write(self.folder / "memory.memsw.limit_in_bytes", str(limit))
            with contextlib.suppress(OSError):
                _write(self.folder / "memory.swappiness", "0")
        else:
            _write(self.folder / "memory.max", str(limit))
            with contextlib.suppress(OSError):
                _write(self.folder / "memory.swap.max", "0")
            with contextlib.suppress(OSError):  # the kernel's stop ends the whole tree, not one process of it
                _write(self.folder / "memory.oom.group", "1")

    def used(self) -> int:
        """Bytes of anonymous and shared memory (tmpfs, memfd, SysV, shared mappings) the tree holds, swap included."""
        if self.version == "v1":
            stat = _fields(self.folder / "memory.stat")
            return stat.get("total_rss", 0) + stat.get("total_shmem", 0) + stat.get("total_swap", 0)
        stat = _fields(self.folder / "memory.stat")
        swap = 0
        with contextlib.suppress(OSError, ValueError):
            swap = int((self.folder / "memory.swap.current").read_text())
        return stat.get("anon", 0) + stat.get("shmem", 0) + swap

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed at the limit."""
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        return _fields(self.folder / name).get("oom_kill", 0)


class PidsGroup(_Group):
    """One child's ``pids`` cgroup: the kernel refuses a fork or a thread past ``pids.max``, so a fork bomb is
    stopped between two looks of the watchdog (which samples the tree's tasks every half second, and still does
    where there is no such group: a plain user without a delegated group, a container that hides it). v1's
    ``pids`` hierarchy, or v2's unified one where the grader's group delegates ``pids``. ``hit`` says whether a
    fork was refused at the limit (``pids.events``: the watchdog then stops the tree and says why)."""

    @classmethod
    def make(cls, limit: int) -> PidsGroup | None:
        """A fresh group of at most ``limit`` processes and threads, or None where the grader can have none."""
        for parent in _own_pids_groups():
            folder = parent / f"fuselab-{secrets.token_hex(6)}"
            try:
                folder.mkdir()
            except OSError:
                continue
            _made.add(folder)
            group = cls(folder)
            try:
                _write(folder / "pids.max", str(limit))
                return group
            except OSError:
                group.remove()
        return None

    def hit(self) -> bool:
        """Whether the kernel refused a fork or a thread of the tree at the limit."""
        return _fields(self.folder / "pids.events").get("max", 0) > 0


def _own_pids_groups() -> list:
    """Where the grader may make a ``pids`` group: its own group of v1's ``pids`` hierarchy, or of v2's where
    that one delegates ``pids`` to its children."""
    found = []
    for number, controllers, relative in _own_lines():
        if "pids" in controllers:
            found.append(ROOT / "pids" / relative)
        elif number == "0" and not controllers and _delegates(ROOT / relative, "pids"):
            found.append(ROOT / relative)
    return found


_made: set = set()  # the groups this process made and has not removed yet


@atexit.register
def _remove_left() -> None:
    """At the grader's exit, the groups of children nobody waited for (a group still holding a process stays)."""
    for folder in list(_made):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _delegates(folder: Path, controller: str) -> bool:
    """Whether a v2 group's children get ``controller`` (asked for if it has none yet: a group that holds
    processes itself cannot give it, and is left as it is)."""
    control = folder / "cgroup.subtree_control"
    try:
        if controller in control.read_text().split():
            return True
        _write(control, f"+{controller}")
        return controller in control.read_text().split()
    except OSError:
        return False


_available: list = []


def available() -> bool:
    """Whether the grader can have a memory cgroup per child here (tried once: made and removed)."""
    if not _available:
        group = MemoryGroup.make(2**30)
        if group is not None:
            group.remove()
        _available.append(group is not None)
    return _available[0]
