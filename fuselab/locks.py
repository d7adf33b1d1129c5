"""File locks (``filelock``), held while their process lives, never taken through a planted file.

``filelock.UnixFileLock`` takes ``flock(2)`` on a descriptor it opens with ``O_NOFOLLOW`` (a symbolic link at the
lock's path is refused with ``ELOOP``, never followed), and the kernel drops the lock when its holder dies, by
SIGKILL too. Three things are added here, because a lock can sit in a folder a submission wrote into:

- the lock file must be a regular file with one name: a FIFO, a device, a socket or a hard link to some other
  file is refused (``LockRefused``), checked on the open descriptor once the lock is held (filelock's
  ``on_acquired``), so no check-then-open race, and nothing is read or written through it;
- no soft-lock fallback (``fallback_to_soft=False``): a file system without ``flock`` raises rather than falling
  back to a marker file that a killed holder would leave behind;
- ``write_pid``: the holder's pid, written into the file once it is held, for ``holder`` to name.

NFS (a class graded by Slurm nodes sharing ``--out``): the Linux NFS client (since 2.6.12) implements ``flock``
as a POSIX byte-range lock over the whole file, which the server arbitrates between nodes (``man 2 flock``,
NOTES; an exclusive one needs the file open for writing, as filelock opens it), so these locks exclude across
nodes as ``lockf`` did.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from filelock import Timeout, UnixFileLock

__all__ = ["LockRefused", "Timeout", "file_lock", "holder"]


class LockRefused(OSError):
    """Something other than a lock file (a link, a FIFO, ...) sits where the lock goes: it is not used."""


def file_lock(path, *, timeout: float = -1, write_pid: bool = False) -> UnixFileLock:
    """An exclusive lock on ``path`` (created if missing; its folder must exist). ``with file_lock(p):`` waits
    for it (``timeout`` seconds, ``-1``: for ever, then ``Timeout``); ``acquire(blocking=False)`` tries once."""
    path = Path(path)
    _refuse(path, os.lstat(path).st_mode if os.path.lexists(path) else stat.S_IFREG)  # a clear error early
    return UnixFileLock(path, timeout=timeout, fallback_to_soft=False, preserve_lock_file=True,
                        on_acquired=lambda fd: _held(path, fd, write_pid))


def _held(path: Path, fd: int, write_pid: bool) -> None:
    info = os.fstat(fd)
    _refuse(path, info.st_mode)
    if not os.path.samestat(os.lstat(path), info):  # opened through a link (a filelock without O_NOFOLLOW)
        raise LockRefused(f"{path} changed while it was locked (a link put in its place?): not used")
    if info.st_nlink > 1:  # another name for the same file: writing the pid would write into that file
        raise LockRefused(f"{path} has another name (a hard link): not used as a lock file; remove it and run "
                          "again")
    if write_pid:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def _refuse(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a folder",
                stat.S_IFSOCK: "a socket"}.get(stat.S_IFMT(mode), "not a regular file")
        raise LockRefused(f"{path} is {kind}, not a lock file: something other than fuselab put it there; "
                          "remove it and run again")


def holder(path) -> str:
    """The pid a ``write_pid`` lock's holder wrote into ``path``, or "unknown" (read without following a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "unknown"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "unknown"
        text = os.read(fd, 32).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return text if text.isdigit() else "unknown"
