"""The grader's only way into a folder a submission can write.

A sandboxed submission can write its solution and kernel workers' folders, and a checker that loaded a changed
library could write the checker's folder (``<out>/work/<student>/<lab>/clean``, the builds caches, nbgrader's
scratch course). Anything there may be a link (to the instructor's shared builds, to any host file), a FIFO
that blocks whoever opens it, a hard link to a file of someone else's, or gigabytes. The grader, run as root or
not, touches such a folder only through a ``Folder`` of this module:

- it starts from a descriptor of a folder the grader made itself, outside every sandbox's reach, and walks each
  path component from there with ``O_NOFOLLOW | O_DIRECTORY`` (a link anywhere on the way is refused, whatever
  a later swap does: the walk holds descriptors, never re-resolves a path);
- a file is opened ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file with a single name (``fstat``): no
  link, FIFO, socket, device or hard link is ever read;
- what it reads is capped and returned as bytes (data to check, never code or a path to follow);
- it never writes into a file that is there: what it writes is a new file (``O_CREAT | O_EXCL``) after
  whatever had the name is removed (``unlinkat`` removes a link, never what it names);
- folders are removed descriptor by descriptor (``shutil.rmtree`` with ``dir_fd``: it never follows a link).

Logs and results of a worker never come back through its folder: they come by descriptors the grader opened
before the worker started (``recheck``), or by the worker's pipe.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DEFAULT_LIMIT = 64 * 2**20


class Refused(OSError):
    """A path a submission could write was not what the grader may touch (a link, a special file, too large)."""


def _parts(relative) -> list:
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or any(p in ("..", ".") for p in parts):
        raise ValueError(f"not a path inside the folder: {relative!r}")
    return list(parts)


class Folder:
    """A folder of the grader's own, held by descriptor; every path below it is walked without following links.

    ``path`` must be a folder no sandbox can write (the grader made it, or it is above every sandbox's own
    folder); what is under it may be anything."""

    def __init__(self, path):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- walking

    @contextlib.contextmanager
    def _parent(self, relative, create: bool = False):
        """``(descriptor of the folder holding the leaf, leaf name)``: every folder on the way opened without
        following a link (``create``: missing ones made; a link or a file in the way is removed first)."""
        parts = _parts(relative)
        fd = os.dup(self.fd)
        try:
            for name in parts[:-1]:
                child = self._step(fd, name, create)
                os.close(fd)
                fd = child
            yield fd, parts[-1]
        finally:
            os.close(fd)

    @staticmethod
    def _step(fd: int, name: str, create: bool) -> int:
        """The folder ``name`` in ``fd``, opened (never through a link)."""
        try:
            return os.open(name, DIRECTORY, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR) or not create:
                raise Refused(exc.errno, f"{name}: not a folder (a link or a file in its place)") from None
            _remove_at(fd, name)  # a link or file where the grader's folder goes: removed, never followed
        os.mkdir(name, 0o755, dir_fd=fd)
        return os.open(name, DIRECTORY, dir_fd=fd)

    # -- reading

    def read_bytes(self, relative, limit: int = DEFAULT_LIMIT) -> bytes | None:
        """The bytes of the regular file at ``relative`` (None if nothing is there); ``Refused`` for a link
        anywhere on the way, a special file, a file with a second name, or more than ``limit`` bytes."""
        try:
            with self._parent(relative) as (parent, name):
                try:
                    fd = os.open(name, READ, dir_fd=parent)
                except OSError as exc:
                    if exc.errno == errno.ENOENT:
                        return None
                    raise Refused(exc.errno, f"{relative}: not opened ({os.strerror(exc.errno)}; a link?)") \
                        from None
                try:
                    return read_open(fd, limit, str(relative))
                finally:
                    os.close(fd)
        except FileNotFoundError:
            return None
        except Refused:
            raise
        except OSError as exc:
            raise Refused(exc.errno, f"{relative}: {exc.strerror}") from None

    def read_text(self, relative, limit: int = DEFAULT_LIMIT) -> str | None:
        data = self.read_bytes(relative, limit)
        return None if data is None else data.decode("utf-8", errors="replace")

    def is_file(self, relative) -> bool:
        """Whether a regular file (not a link, not a special file) is at ``relative``."""
        try:
            with self._parent(relative) as (parent, name):
                return stat.S_ISREG(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        except OSError:
            return False

    def names(self, relative=None, prefix: str = "") -> list:
        """The sorted names in the folder ``relative`` (this one: None) starting with ``prefix``."""
        try:
            if relative is None:
                return sorted(n for n in os.listdir(self.fd) if n.startswith(prefix))
            with self._parent(PurePosixPath(relative) / "x") as (folder, _):
                return sorted(n for n in os.listdir(folder) if n.startswith(prefix))
        except OSError:
            return []

    # -- writing and removing

    def new_file(self, relative, mode: int = 0o644) -> int:
        """A descriptor (the caller closes it) of a new, empty regular file at ``relative``: folders on the way
        made, never through a link; whatever had the name is removed first, never written through."""
        with self._parent(relative, create=True) as (parent, name):
            with contextlib.suppress(FileNotFoundError):
                _remove_at(parent, name)
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                           dir_fd=parent)

    def write_bytes(self, relative, data: bytes, mode: int = 0o644) -> None:
        """A new regular file at ``relative`` holding ``data`` (``new_file``)."""
        with os.fdopen(self.new_file(relative, mode), "wb") as handle:
            handle.write(data)

    def write_text(self, relative, text: str, mode: int = 0o644) -> None:
        self.write_bytes(relative, text.encode("utf-8"), mode)

    def create(self, relative, mode: int = 0o644) -> bool:
        """A new empty file at ``relative``; False (nothing written) if any name is already there."""
        try:
            with self._parent(relative) as (parent, name):
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                                 dir_fd=parent))
            return True
        except OSError:
            return False

    def remove(self, relative) -> None:
        """Remove whatever is at ``relative``: a file or link (the name only), or a folder and everything in it,
        never following a link. Nothing there is fine."""
        with contextlib.suppress(FileNotFoundError):
            with self._parent(relative) as (parent, name):
                _remove_at(parent, name)

    def make_folder(self, relative) -> Path:
        """The real folder ``relative`` (made where missing; a link or file in its place, or on the way, is
        removed first): safe to hand to a sandbox as its own or to ``chown``."""
        with self._parent(PurePosixPath(relative) / "x", create=True):
            pass
        return self.path / relative


def read_open(fd: int, limit: int, what: str = "file") -> bytes:
    """At most ``limit`` bytes of the open ``fd``, which must be a regular file with one name."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise Refused(errno.EINVAL, f"{what}: not a regular file")
    if info.st_nlink != 1:
        raise Refused(errno.EMLINK, f"{what}: a file with another name elsewhere (a hard link)")
    if info.st_size > limit:
        raise Refused(errno.EFBIG, f"{what}: {info.st_size} bytes, more than the {limit} allowed")
    chunks, left = [], limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = b"".join(chunks)
    if len(data) > limit:
        raise Refused(errno.EFBIG, f"{what}: grew past the {limit} bytes allowed")
    return data


def _remove_at(parent: int, name: str) -> None:
    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        remove_tree_at(parent, name)
    else:
        os.unlink(name, dir_fd=parent)


def remove_tree_at(parent: int, name: str) -> None:
    """Remove the folder ``name`` in ``parent`` and everything in it without following any link (the fd-based
    ``rmtree``); folders a sandbox made unreadable (``chmod 000``) are opened up first. A tree deeper than
    Python's stack (a submission can nest thousands of folders) goes through coreutils' ``rm``, whose walk is
    by descriptors too and has no depth limit."""
    assert shutil.rmtree.avoids_symlink_attacks  # Linux: rmtree walks by descriptors
    try:
        try:
            shutil.rmtree(name, dir_fd=parent)
        except PermissionError:
            _open_up(parent, name)
            shutil.rmtree(name, dir_fd=parent)
    except RecursionError:
        _remove_deep_at(parent, name)


def _remove_deep_at(parent: int, name: str) -> None:
    """``rm -rf`` of ``name`` in ``parent``, reached through the grader's own descriptor (``/proc/self/fd``), so no
    path a submission could change is resolved above it; ``chmod -R`` first, for folders a sandbox locked (it
    ignores the links it meets below its argument, which is a folder: checked here without following it)."""
    import subprocess
    if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
        os.unlink(name, dir_fd=parent)
        return
    path = f"/proc/self/fd/{parent}/{name}"
    subprocess.run(["chmod", "-R", "u+rwx", "--", path], pass_fds=(parent,), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=600)
    removed = subprocess.run(["rm", "-rf", "--one-file-system", "--", path], pass_fds=(parent,),
                             capture_output=True, text=True, timeout=600)
    with contextlib.suppress(FileNotFoundError):
        os.stat(name, dir_fd=parent, follow_symlinks=False)
        raise OSError(errno.ENOTEMPTY, f"{name}: not removed ({removed.stderr.strip()[:200]})")


def _open_up(parent: int, name: str) -> None:
    """Give the owner rwx on the folder ``name`` and every folder under it, never through a link (a plain-user
    grader cannot otherwise remove what a sandbox locked). Run once the sandbox is gone: nothing swaps names."""
    if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
        return
    with contextlib.suppress(OSError):
        os.chmod(name, 0o700, dir_fd=parent)
    try:
        fd = os.open(name, DIRECTORY, dir_fd=parent)
    except OSError:
        return
    try:
        for entry in os.listdir(fd):
            with contextlib.suppress(OSError):
                _open_up(fd, entry)
    finally:
        os.close(fd)


def remove_tree(path) -> None:
    """Remove the folder ``path`` (whose parent the grader trusts) and all in it, never following a link; a link
    at ``path`` itself is removed, not followed. Nothing there is fine."""
    path = Path(path)
    with Folder(path.parent) as parent:
        parent.remove(path.name)
