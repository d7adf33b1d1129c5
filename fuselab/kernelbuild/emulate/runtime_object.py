"""The emulation's runtime: compiled once, linked into every emulated library.

What runs a launch (the scheduler, fibers, the fault handler), the CUDA runtime calls and the controls fuselab's
Python side calls are ordinary code (``runtime/fuselab_emu_runtime.cpp``), not templates of the kernel. Compiled
into every kernel's file they cost about 0.75 s of each build; here they are compiled once per compiler, flags and
runtime source (the object's name is a digest of the three) into ``<builds>/<name>/<name>.o``, and each build copies
that object into its own folder and links it statically. Every library so keeps its own copy of every runtime symbol
and its own state, hidden from every other library (``-fvisibility=hidden``, ``-Wl,-Bsymbolic``), as when the runtime
was a header; and ``native_check`` reads the copy with the student's own object.

Which object a build may link: one from the folder it builds into (its own cache: whoever could write it could
write the build itself), or one of the instructor's shared builds that the grader recorded, whose bytes are checked
against the recorded digest as they are copied (``shared``). Never one from another folder: in grading, a
submission's sandbox writes its own cache only, so what it compiled is never linked into another submission's
library or the instructor's.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from functools import lru_cache
from pathlib import Path

from ... import config
from ...errors import BuildError, BuildTimeout
from .. import shared as shared_builds
from .flags import INCLUDE_DIR

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
SOURCE = RUNTIME_DIR / "fuselab_emu_runtime.cpp"
PREFIX = shared_builds.RUNTIME_PREFIX
LINKED = "fuselab_emu_runtime.o"  # the copy in each library's build folder, linked by a relative path
FORMAT = "1"  # bump when how the object is compiled changes meaning


def sources_text() -> str:
    """Every file the object is compiled from (the runtime and the headers it includes), in a fixed order."""
    files = sorted([*Path(INCLUDE_DIR).glob("*.h"), *RUNTIME_DIR.glob("*.h"), SOURCE],
                   key=lambda p: (p.parent.name, p.name))
    return "".join(f"\0{p.parent.name}/{p.name}\0{p.read_text()}" for p in files)


def compiler() -> str:
    """The compiler torch's ``load_inline`` uses for the kernel's own file: the runtime's must be the same."""
    return os.environ.get("CXX", "c++")


@lru_cache(maxsize=None)
def _identity(cxx: str) -> str:
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown: {exc}"
    return done.stdout


def compile_flags(cflags) -> list:
    return ["-fPIC", *cflags, "-fvisibility=hidden", f"-I{INCLUDE_DIR}"]


def name_for(cflags) -> str:
    """The runtime object's name for a build compiled with ``cflags``: a digest of compiler, flags and source."""
    cxx = compiler()
    key = "\0".join([FORMAT, cxx, _identity(cxx), *compile_flags(cflags), sources_text()])
    return PREFIX + hashlib.sha256(key.encode()).hexdigest()[:24]


def provide(name: str, cflags, build_dir: Path, timeout: float) -> str:
    """Copy the runtime object ``name`` into ``build_dir`` (as ``LINKED``); return where it came from ("shared",
    "cache" or "compiled"). Compiles it into this cache first when neither has it."""
    origin, data = _recorded_shared(name)
    if data is None:
        origin, data = _own(name, cflags, timeout)
    temporary = Path(build_dir) / f"{LINKED}.{os.getpid()}.tmp"
    temporary.write_bytes(data)
    os.replace(temporary, Path(build_dir) / LINKED)
    return origin


def _recorded_shared(name: str):
    """The shared build's bytes, if the grader recorded it and these very bytes hash to the recorded digest."""
    shared = config.shared_builds_dir()
    if shared is None or shared_builds.status(name) != "ok":
        return None, None
    recorded = (shared_builds.digests() or {}).get(name)
    data = shared_builds.read_regular(shared_builds.library_of(shared, name))
    if data is None or hashlib.sha256(data).hexdigest() != recorded:
        return None, None  # changed since it was checked: never linked
    return "shared", data


def _own(name: str, cflags, timeout: float):
    from .. import _exclusive  # the same lock discipline as every build
    folder = config.builds_dir() / name
    target = folder / f"{name}.o"
    done = folder / shared_builds.COMPLETE
    origin = "cache"
    if not (done.is_file() and target.is_file()):
        folder.mkdir(parents=True, exist_ok=True)
        with _exclusive(folder.with_suffix(".lock"), timeout):
            if not (done.is_file() and target.is_file()):
                _compile(cflags, target, timeout)
                done.write_text("")
                origin = "compiled"
    return origin, target.read_bytes()


def _compile(cflags, target: Path, timeout: float) -> None:
    temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp.o")
    command = [compiler(), *compile_flags(cflags), "-c", str(SOURCE), "-o", str(temporary)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BuildTimeout(f"compiling the CPU emulation's runtime took longer than {timeout:.0f} s") from None
    except OSError as exc:
        raise BuildError(f"could not run the C++ compiler for the CPU emulation's runtime: {exc}") from None
    if done.returncode != 0 or not temporary.is_file():
        temporary.unlink(missing_ok=True)
        log = done.stdout + done.stderr
        raise BuildError("the CPU emulation's runtime failed to compile with these flags: "
                         f"{' '.join(command)}\n\n{log[-4000:]}", log=log)
    os.replace(temporary, target)
