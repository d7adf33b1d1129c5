"""The instructor's reference runs, kept in the course folder and reused while nothing they depend on changed.

A lab's reference run (``pipeline.reference_run``) is the same for every run of the term on one machine: it
depends on the lab's instructor folder (``solutions/<lab>``), the course's package (``fuselab/``: the labs' code,
checks, timing, the grader), the torch it runs under and the machine that ran it (the GPU model, or ``cpu``).
``key`` names exactly that, by content; an entry is reused only under the same key, so an edit of any of them,
another torch or another GPU model runs the references again. ``fuselab/tools`` (the self-check, the
benchmarks) is left out: no notebook and no grading process imports it.

An entry is ``<out>/reference/<lab>/reference.json``: the run's result, its key, the sha256 of every shared
build the grader recorded after it (``fuselab.kernelbuild.shared``), whether the run was sandboxed, and the sha256 of
all of that. It is reused only when

- it is a regular file of one name, read without following a link and capped in size (as ``untrusted`` reads);
- its own digest and its key match, and it passed every correctness test (a broken reference runs again);
- every shared build it lists still has the recorded bytes in the shared builds' manifest and on disk, so the
  libraries the submissions will load are the ones the reference run proved;
- it was written by a sandboxed run, or this run is not sandboxed (as ``pipeline._kept`` keeps results): only
  a run without the sandbox lets a submission write into the course folder, and the entry's claim is believed
  only where no such run could have forged it (``believed``: ``unsandboxed``).

``fuselab grade --remeasure-references`` runs them again whatever the cache holds; ``--force`` does not.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

from ... import course
from ...kernelbuild import shared as shared_builds
from ..sandbox import untrusted
from .whole import write_whole

ENTRY = "reference.json"
ENTRY_LIMIT = 16 * 2**20
_SKIPPED = {"__pycache__", ".ipynb_checkpoints"}


def _tree_digest(digest, root: Path, label: str, skip=()) -> None:
    """Every file under ``root`` (path and bytes, in sorted order) into ``digest``; caches, bytecode and the
    folders ``skip`` (relative to ``root``) left out."""
    for folder, dirs, files in os.walk(root):
        here = Path(folder).relative_to(root)
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED and (here / d).as_posix() not in skip)
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = Path(folder) / name
            digest.update(f"{label}/{path.relative_to(root).as_posix()}\0".encode())
            try:
                digest.update(path.read_bytes())
            except OSError:
                digest.update(b"\0unreadable")
            digest.update(b"\0")


def depends_digest(lab: str) -> str:
    """sha256 of what a lab's reference run runs: its instructor folder and the course's package (all of it but
    ``fuselab/tools``, the self-check and benchmarks, which no notebook and no grading process imports)."""
    digest = hashlib.sha256()
    _tree_digest(digest, course.SOLUTIONS / lab, f"solutions/{lab}")
    _tree_digest(digest, course.REPO / "fuselab", "fuselab", skip=("tools",))
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def machine(device) -> str:
    """``cpu``, or the model of the GPU ``device`` (an index or UUID); ``gpu`` where unreadable. Asked once per
    device and process."""
    if device is None:
        return "cpu"
    from ... import gpu_facts
    return gpu_facts.model(device) or "gpu"


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def key(lab: str, device) -> dict:
    return {"lab": lab, "machine": machine(device), "torch": _torch_version(), "depends": depends_digest(lab)}


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _read(path: Path) -> bytes | None:
    """The entry's bytes: a regular file with one name, not followed through a link, capped; else None."""
    try:
        with untrusted.Folder(path.parent) as folder:
            return folder.read_bytes(path.name, ENTRY_LIMIT)
    except OSError:  # untrusted.Refused is one
        return None


def load(workdir: Path, wanted: dict, shared_root: Path, sandbox: bool, believed: bool = True) -> dict | None:
    """The reference result kept in ``workdir`` if it may be reused (see the module doc), else None."""
    raw = _read(Path(workdir) / ENTRY)
    if raw is None:
        return None
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("cache"), dict):
        return None
    cache = entry["cache"]
    body = {k: v for k, v in entry.items() if k != "cache"}
    if cache.get("digest") != hashlib.sha256(_canonical({**body, "cache": {**cache, "digest": ""}})).hexdigest():
        return None
    sandboxed = cache.get("sandbox") is True and believed
    if cache.get("key") != wanted or entry.get("broken") or not (sandboxed or not sandbox):
        return None
    builds = cache.get("builds")
    if not isinstance(builds, dict) or not builds:
        return None
    recorded = _manifest(shared_root)
    if any(recorded.get(name) != digest for name, digest in builds.items()):
        return None
    if shared_builds.changed(shared_root, builds):
        return None
    return {**body, "reused": True}


def _manifest(shared_root: Path) -> dict:
    raw = _read(Path(shared_root) / shared_builds.MANIFEST)
    try:
        value = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def store(workdir: Path, result: dict, wanted: dict, builds: dict, sandbox: bool) -> None:
    """Keep ``result`` (a reference run just made) with its key and the shared builds recorded after it."""
    body = {k: v for k, v in result.items() if k not in ("cache", "reused")}
    cache = {"key": wanted, "builds": dict(builds), "sandbox": bool(sandbox), "digest": ""}
    cache["digest"] = hashlib.sha256(_canonical({**body, "cache": cache})).hexdigest()
    path = Path(workdir) / ENTRY
    write_whole(path, json.dumps({**body, "cache": cache}, indent=1))
