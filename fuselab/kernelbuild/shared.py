"""The instructor's shared builds, verified by content.

The grader's reference run builds the instructor's kernels into ``<out>/shared-builds/builds`` before any
submission runs; every submission's processes see that folder read-only (``FUSELAB_SHARED_BUILDS``) and load
those libraries instead of building them again. A library there is loaded only if its bytes still hash to what
the grader recorded when the reference run made it, in ``<out>/shared-builds/manifest.json``: beside
``builds/``, written by the grader before any submission runs, shown read-only to each sandbox (``readonly``) and
writable by none. A library whose bytes changed, or that the manifest does not hold, is never loaded: the process
builds the same source into its own cache instead, and the grader notes it for the TA. The CPU emulation's runtime
object (``emulate/runtime_object``), compiled by the reference run beside the libraries, is recorded and checked the
same way before a submission's build links it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

from .. import config

MANIFEST = "manifest.json"  # {build name: sha256 of its library}, beside ``builds/`` in the shared-builds folder
# a build folder of the CPU emulation's runtime object (``emulate/runtime_object``): its artifact is ``<name>.o``,
# linked into libraries (checked like a library, by its recorded digest) rather than loaded
RUNTIME_PREFIX = "fuselab_emurt_"
MANIFEST_LIMIT = 16 * 2**20
COMPLETE = "fuselab-complete"

_verified: dict = {}  # (path, device, inode, size, mtime) → digest, per process


def manifest_of(builds) -> Path:
    """Where the grader records the digests of the shared builds folder ``builds``."""
    return Path(builds).parent / MANIFEST


def readonly(env: dict) -> list:
    """What a sandbox is shown read-only of the shared builds named in ``env``: the folder and its manifest."""
    builds = env.get("FUSELAB_SHARED_BUILDS")
    return [builds, str(manifest_of(builds))] if builds else []


def digests() -> dict | None:
    """The digests the grader recorded for the shared builds, or None (no manifest, or not a readable one)."""
    shared = config.shared_builds_dir()
    if shared is None:
        return None
    try:
        fd = os.open(manifest_of(shared), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        value = json.loads(os.read(fd, MANIFEST_LIMIT))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return value if isinstance(value, dict) else None


def library_of(builds: Path, name: str) -> Path:
    """The file of the build ``name`` whose bytes are recorded: its library, or the emulation runtime's object."""
    return Path(builds) / name / (f"{name}.o" if name.startswith(RUNTIME_PREFIX) else f"{name}.so")


def read_regular(path) -> bytes | None:
    """The bytes of the regular file at ``path`` (its last component not a link), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def file_digest(path) -> str | None:
    """sha256 of the regular file at ``path`` (its last component not a link), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        key = (str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if key in _verified:
            return _verified[key]
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        _verified[key] = digest.hexdigest()
        return _verified[key]
    finally:
        os.close(fd)


def status(name: str) -> str:
    """Whether the build ``name`` is to be loaded from the shared builds: ``"ok"`` (there, finished, and its
    library's bytes are the recorded ones), ``"changed"`` (a shared build, but missing, unrecorded or its bytes
    differ: never loaded, built in the process's own cache), or ``"absent"`` (no shared build of that name)."""
    shared = config.shared_builds_dir()
    if shared is None:
        return "absent"
    recorded = digests() or {}
    if name not in recorded:
        # there but never recorded (made after the grader's record, or no manifest): never loaded
        return "changed" if os.path.lexists(shared / name) else "absent"
    if not (shared / name / COMPLETE).is_file():
        return "changed"
    return "ok" if file_digest(library_of(shared, name)) == recorded[name] else "changed"


# ---------------------------------------------------------------------------------------- the grader's side

def record(shared_root: Path) -> tuple:
    """After the reference runs: the digests of every finished build in ``<shared_root>/builds``, and the names
    whose library changed since they were first recorded (a resumed run keeps the first digest, so a changed
    library stays refused). Writes ``<shared_root>/manifest.json``."""
    shared_root = Path(shared_root)
    manifest_path = shared_root / MANIFEST
    try:
        kept = json.loads(manifest_path.read_text())
        kept = kept if isinstance(kept, dict) else {}
    except (OSError, ValueError):
        kept = {}
    builds = shared_root / "builds"
    recorded, changed = dict(kept), []
    for folder in sorted(builds.iterdir()) if builds.is_dir() else []:
        name = folder.name
        if folder.is_symlink() or not (folder / COMPLETE).is_file():
            continue
        only_the_library(folder, name)
        digest = file_digest(library_of(builds, name))
        if digest is None:
            continue
        if name not in recorded:
            recorded[name] = digest
        elif recorded[name] != digest:
            changed.append(name)
    changed += [name for name in kept if file_digest(library_of(builds, name)) is None and name not in changed]
    shared_root.mkdir(parents=True, exist_ok=True)
    temporary = manifest_path.with_name(f"{MANIFEST}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(recorded, indent=1, sort_keys=True))
    os.replace(temporary, manifest_path)
    return recorded, sorted(changed)


def only_the_library(folder: Path, name: str) -> None:
    """Of the finished build ``name`` in ``folder``, keep what loading it needs (its library or object, and an
    empty ``COMPLETE``) and remove the rest: every sandbox is shown the shared builds, and a build folder holds
    its source (``main.cpp``, the ``.cu``: the instructor's solution kernels, built by the reference run, word
    for word), its build file and its compiler's log. A finished build is never written again, so nothing
    that builds is disturbed."""
    keep = {library_of(folder.parent, name).name, COMPLETE}
    for entry in os.scandir(folder):
        if entry.name in keep and entry.is_file(follow_symlinks=False):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    marker = folder / COMPLETE
    if marker.stat().st_size:  # the build's log, which may quote the source: the marker alone is kept
        marker.unlink()
        marker.touch()


def changed(shared_root: Path, recorded: dict) -> list:
    """The recorded builds whose library is missing or no longer has its recorded bytes."""
    builds = Path(shared_root) / "builds"
    return sorted(name for name, digest in recorded.items() if file_digest(library_of(builds, name)) != digest)


def note(names) -> str:
    return (f"the instructor's shared build(s) {', '.join(names)} changed after the reference run made them: "
            "not loaded (rebuilt in this submission's own cache); look for what wrote into the shared builds")
