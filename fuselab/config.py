"""Where fuselab keeps its caches, and which environment variables steer it.

Every setting has one environment variable, so that a notebook, the grader and CI can steer fuselab
without code changes:

- ``FUSELAB_CACHE_DIR``: root of all caches (builds, measured ceilings). Default ``~/.cache/fuselab``.
- ``FUSELAB_BACKEND``: ``auto`` (default), ``cuda`` or ``emulate``.
- ``FUSELAB_BUILD_TIMEOUT``: seconds a build may take before it is stopped. Default 300.
- ``FUSELAB_SHARED_BUILDS``: a builds folder looked up first and never written (the grader shares the
  instructor's builds with every submission this way, while each submission builds into a cache of its own).
  A library there is loaded only with the bytes recorded in the manifest beside it (``fuselab.kernelbuild.shared``).
"""

import contextlib
import os
from pathlib import Path


def cache_root() -> Path:
    """Where the caches go, without creating anything (``fuselab doctor`` reports on it)."""
    root = os.environ.get("FUSELAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fuselab"
    )
    return Path(root).expanduser().resolve()


def cache_dir() -> Path:
    path = cache_root()
    path.mkdir(parents=True, exist_ok=True)
    return path


def builds_dir() -> Path:
    path = cache_dir() / "builds"
    path.mkdir(parents=True, exist_ok=True)
    return path


def shared_builds_dir():
    """A read-only builds folder searched before ``builds_dir()``, or None (what is loaded from it is checked
    against the grader's digests: ``fuselab.kernelbuild.shared.status``)."""
    path = os.environ.get("FUSELAB_SHARED_BUILDS")
    return Path(path) if path else None


def backend_choice() -> str:
    return os.environ.get("FUSELAB_BACKEND", "auto").strip().lower() or "auto"


def build_timeout() -> float:
    return float(os.environ.get("FUSELAB_BUILD_TIMEOUT", "300"))


def cpu_threads(env=None) -> int:
    """How many CPU threads a process may keep busy: ``OMP_NUM_THREADS`` of ``env`` (default: this process's
    environment; the grader sets it for each child), else every core it may use."""
    env = os.environ if env is None else env
    try:
        return max(1, int(env.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return max(1, len(os.sched_getaffinity(0)))


@contextlib.contextmanager
def environment(values: dict):
    """``os.environ`` with ``values`` set, and as it was afterwards (what starts meanwhile inherits them)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
