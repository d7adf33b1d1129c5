"""``fuselab.build``: a student's CUDA text → a module of callable launchers.

The student writes plain CUDA: kernels plus host launchers that take raw pointers, sizes and a ``cudaStream_t``,
with no torch headers. fuselab compiles only that text, as a plain shared library: about a second with nvcc,
against 50 s for a module that includes ``<torch/extension.h>`` (docs/design.md §4.1). The tensor glue is Python
generated from the launcher prototypes (``fuselab.module``), so it is never recompiled.

Two backends: ``cuda`` (one nvcc call, ``cuda.compile_library``) and ``emulate`` (the same text translated for
g++ and run on the CPU, for correctness only, built through ``torch.utils.cpp_extension.load_inline`` with
``is_python_module=False, no_implicit_headers=True``).

Caching: the module name and build folder are a hash of everything that reaches the compiler, so two different
sources never share a build and an identical one is loaded without running the compiler at all. A per-build
``flock`` serialises concurrent builders of the same source; the kernel drops it when its holder dies, so a
build killed by SIGKILL never blocks the next one, and any lock file torch left behind is known to be stale
once that lock is held.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
import weakref
from pathlib import Path

from .. import config, diagnostics, locks, native_check, proctree, prototypes, toolchain
from ..errors import BuildError, BuildTimeout, NotWrittenError
from ..module import Module
from ..quiet import captured_output
from . import shared as shared_builds
from .cuda import compile_library, job as cuda_job
from .job import Job

# nbgrader replaces a solution region with a Python stub, even inside a CUDA string.
_STUB = re.compile(r"^\s*(raise NotImplementedError\b.*|#\s*YOUR CODE HERE\s*)$", re.M)
# PyTorch's C++ headers: the GPU build compiles the .cu with nvcc alone (no torch include path), so they are
# refused on every backend, where the emulation's compiler would have found them and failed later at the link
_TORCH_HEADER = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]((?:torch|ATen|c10|pybind11)/[^>"]*|torch/extension\.h)[>"]',
                           re.M)


def build(source: str, launchers, *, name: str = "kernel", backend: str | None = None,
          extra_cflags=(), timeout: float | None = None, sanitize: str | None = None,
          verbose: bool = False) -> Module:
    """Compile ``source`` and return a module whose attributes are its launchers.

    ``launchers`` are the C prototypes the lab fixes, e.g.
    ``"void add(const float* a, const float* b, float* out, int n, cudaStream_t stream)"``; call them as
    ``mod.add(a, b, out, n)``: fuselab passes the current stream. ``backend`` is ``"auto"`` (CUDA when a GPU
    is visible, else the CPU emulation), ``"cuda"`` or ``"emulate"``; ``FUSELAB_BACKEND`` sets the default.
    ``timeout`` (seconds; ``FUSELAB_BUILD_TIMEOUT``, default 300) stops a compiler that runs too long.
    ``sanitize="address"`` builds an emulated kernel with AddressSanitizer (see the README's "No GPU?").

    Raises ``NotWrittenError`` for a kernel that still holds nbgrader's stub, ``BuildError`` with the
    compiler's messages (lines of the student's own text) when it does not compile. Either is raised from here,
    without the frames of fuselab and torch that found it (they say nothing about the student's source); in IPython
    the error shows only the student's own frames (``fuselab.errors``).
    """
    try:
        module = _build(source, launchers, name=name, backend=backend, extra_cflags=extra_cflags, timeout=timeout,
                        sanitize=sanitize, verbose=verbose)
    except (BuildError, NotWrittenError) as error:
        _made_stale(name, error)
        raise error.with_traceback(None)  # noqa: B904 - the same error, its message says everything
    with contextlib.suppress(TypeError):  # a module the grader's checker holds for another process: not kept
        _BUILT[name] = weakref.ref(module)
    return module


# name → the module its last build that succeeded returned (weakly): a student who edits a kernel, runs its build
# cell, meets an error and runs the test cell anyway would otherwise test the kernel as it was before the edit
_BUILT: dict = {}


def _made_stale(name: str, error: Exception) -> None:
    """The module ``name``'s last build gave, marked stale: its launchers raise ``StaleModule``."""
    earlier = _BUILT.pop(name, lambda: None)()
    if isinstance(earlier, Module):  # a module of this process (the checker's stand-ins run nothing here)
        earlier.stale = (f"the module {name!r} is the kernel as it was before its last build, which failed "
                         f"({type(error).__name__}): calling it would test the old code. Fix the error the build "
                         "cell shows and run that cell again, then this one")


def job_ahead(source: str, launchers, *, name: str = "kernel", backend: str | None = None, extra_cflags=()):
    """The CUDA job ``build`` with the same arguments compiles and loads, for ``compile_ahead``; None where it would
    not compile it (the emulation, whose build redirects the process's output, which a build in a thread of its own
    must not) or refuses it (the build says why). It parses the launchers: call it from one thread at a time, as
    CPython's ``ast.parse`` is not safe in two threads at once."""
    try:
        if resolve_backend(backend) != "cuda":
            return None  # asked before the job: an emulated job translates the text, for nothing here
        return _job(source, launchers, name, "cuda", extra_cflags, None)[3]
    except Exception:  # noqa: BLE001 - the build that loads it raises the same error, to the right reader
        return None


def compile_ahead(job, timeout: float | None = None) -> bool:
    """Compile ``job`` (``job_ahead``'s) without loading it: the grader compiles a notebook's kernels side by side
    before its cells build them one after another, and those builds then find them done (or wait for them under the
    build's lock). Safe in a thread of its own: the compiler is a process. False, and nothing raised, where it did
    not compile: the build itself says why."""
    try:
        _compile(job, timeout if timeout is not None else config.build_timeout(), False)
        return True
    except Exception:  # noqa: BLE001 - the build that loads it raises the same error, to the right reader
        return False


def _job(source, launchers, name, backend, extra_cflags, sanitize):
    """``(prototypes, file name, backend, Job)`` of one build: what reaches the compiler, and refusals first."""
    protos = prototypes.parse_all(launchers)
    toolchain.prepare_cuda_environment()  # before anything imports torch's cpp_extension, whatever the backend
    filename = f"{name}.cu"
    _refuse_stub(source, filename)
    _refuse_torch_headers(source, filename)
    backend = resolve_backend(backend)
    if sanitize and backend != "emulate":
        raise ValueError("sanitize= is only available with the CPU emulation (backend='emulate')")
    if backend == "cuda":
        _refuse_stream_zero(source, filename)  # the emulation sees every launch's stream when it runs
    if backend == "emulate":
        from .emulate.job import job as emulate_job  # the translator loads only where it is used
        return protos, filename, backend, emulate_job(source, protos, filename, extra_cflags, sanitize)
    return protos, filename, backend, cuda_job(source, protos, filename, extra_cflags)


def _build(source, launchers, *, name, backend, extra_cflags, timeout, sanitize, verbose) -> Module:
    protos, filename, backend, job = _job(source, launchers, name, backend, extra_cflags, sanitize)
    if _kernel_host is not None and shared_builds.status(job.name) == "absent":
        # the grader's checker: a student's library is built and loaded in the solution worker, never here (an
        # instructor's kernel whose shared build changed is built here, into the checker's own cache)
        return _kernel_host.build(dict(source=source, launchers=launchers, name=name, backend=backend,
                                       extra_cflags=tuple(extra_cflags), timeout=timeout, sanitize=sanitize),
                                  protos, backend, source, name)
    library, log, seconds, cached = _compile(job, timeout if timeout is not None else config.build_timeout(),
                                              verbose)
    # the grader's checker: look at what a student's library calls before loading it (the instructor's kernels,
    # built by the grader before any student ran, come from the read-only shared builds and are not checked)
    if native_check.enabled() and not _from_shared_builds(library):
        try:
            native_check.check_library(library, source, backend, filename)
        except native_check.NativeCodeRefused as exc:
            return native_check.RefusedModule(exc, protos, backend, source, name)
    try:
        return Module(library, protos, backend, source, log=log, build_seconds=seconds, cached=cached, name=name)
    except (OSError, AttributeError) as exc:
        raise _missing_launcher_error(exc, protos, filename) from None


_kernel_host = None  # set in the grader's checker (``grading.recheck.kernels.KernelHost``): where student kernels run


def use_kernel_host(host) -> None:
    """Build and load every library that is not in the shared builds through ``host`` (the grader's checker)."""
    global _kernel_host
    _kernel_host = host


def _in_shared_builds(job) -> bool:
    """A finished shared build whose library still has the bytes the grader recorded (``shared``)."""
    return shared_builds.status(job.name) == "ok"


def _from_shared_builds(library: Path) -> bool:
    shared = config.shared_builds_dir()
    return shared is not None and Path(library).resolve().is_relative_to(shared.resolve())


def build_extension(name: str, cpp_sources, cuda_sources=None, functions=None, *, extra_cflags=(),
                    extra_cuda_cflags=(), extra_ldflags=(), timeout: float | None = None, verbose: bool = False):
    """The escape hatch: a torch C++/CUDA extension exactly as ``load_inline`` builds one, returned as a module.

    For anyone who wants to write torch C++ directly (``torch::Tensor`` arguments, ``<torch/extension.h>``).
    fuselab adds what it adds to every build: a name and folder hashed from the sources, safe concurrent and
    killed builds, a time limit, nothing on stderr and readable errors. Expect tens of seconds per build: torch's
    headers dominate (docs/design.md §4.1); ``fuselab.build`` avoids them.
    """
    import importlib.util
    cpp = "\n".join([cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources))
    cuda = None
    if cuda_sources:
        toolchain.prepare_cuda_environment()
        cuda = "\n".join([cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources))
    if isinstance(functions, str):
        functions = [functions]
    job = Job("cuda" if cuda else "cpu", cpp, cuda, ["-O2", *extra_cflags], ["-O3", *extra_cuda_cflags],
               list(extra_ldflags), [], f"{name}.cpp", functions=functions or [])
    library, log, seconds, cached = _compile(job, timeout if timeout is not None else config.build_timeout(),
                                              verbose)
    spec = importlib.util.spec_from_file_location(job.name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resolve_backend(backend: str | None) -> str:
    choice = (backend or config.backend_choice()).lower()
    if choice in ("emulate", "emulation", "cpu"):
        return "emulate"
    if choice in ("cuda", "gpu"):
        return "cuda"
    if choice != "auto":
        raise ValueError(f"backend must be 'auto', 'cuda' or 'emulate', got {backend!r}")
    import torch
    return "cuda" if torch.cuda.is_available() else "emulate"


# ------------------------------------------------------------------------------------------- compile

def _compile(job: Job, timeout: float, verbose: bool):
    """Return ``(library path, log, seconds, cached)``, compiling only when no finished build exists."""
    shared = config.shared_builds_dir()
    if _in_shared_builds(job):
        return shared_builds.library_of(shared, job.name), "", 0.0, True
    build_dir = config.builds_dir() / job.name
    library = build_dir / f"{job.name}.so"
    done_marker = build_dir / "fuselab-complete"
    if done_marker.exists() and library.exists():
        return library, "", 0.0, True
    build_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with _exclusive(build_dir.with_suffix(".lock"), timeout):
        if done_marker.exists() and library.exists():  # another process finished it while we waited
            return library, "", time.perf_counter() - started, True
        # We hold the only lock that matters: whatever lock file torch left here is from a killed build.
        for stale in ("lock",):
            with contextlib.suppress(FileNotFoundError):
                (build_dir / stale).unlink()
        if job.prepare is not None:
            job.prepare(build_dir, timeout)
        plain_cuda = job.backend == "cuda" and job.functions is None  # not build_extension's torch module
        log = (compile_library if plain_cuda else _run_load_inline)(job, build_dir, timeout, verbose)
        if not library.exists():
            raise BuildError(f"{job.filename}: the build finished but produced no library", log=log)
        done_marker.write_text(log)
    return library, log, time.perf_counter() - started, False


@contextlib.contextmanager
def _exclusive(lock_path: Path, timeout: float):
    """The build's lock (``locks``: dropped when its holder dies, never taken through a link or a FIFO)."""
    try:
        lock = locks.file_lock(lock_path, timeout=timeout)
        lock.acquire()
    except locks.Timeout:
        raise BuildTimeout(f"another process kept building the same source for over {timeout:.0f} s "
                           f"(lock {lock_path})") from None
    except OSError as exc:  # a link, a FIFO, ... where the lock goes
        raise BuildError(f"cannot lock the build: {exc}") from None
    try:
        yield
    finally:
        lock.release()


_NOT_LOADED = threading.local()


def _build_without_loading(cpp_extension):
    """Make ``load_inline`` of a plain library (not a Python module) build it without loading it.

    torch loads what it builds (``torch.ops.load_library``), which runs the library's load-time code in the
    building process. fuselab loads a plain library itself, later, with ctypes, and only once the grader's
    checker has looked at what it calls (``native_check``). Per thread: other builds are left as torch does them.
    """
    original = cpp_extension._import_module_from_library
    if getattr(original, "fuselab_no_load", False):
        return

    def import_or_not(module_name, path, is_python_module):
        if not is_python_module and getattr(_NOT_LOADED, "active", False):
            return os.path.join(path, f"{module_name}{cpp_extension.LIB_EXT}")
        return original(module_name, path, is_python_module)

    import_or_not.fuselab_no_load = True
    cpp_extension._import_module_from_library = import_or_not


def _run_load_inline(job, build_dir: Path, timeout: float, verbose: bool) -> str:
    outcome = {}

    def work():
        try:
            from torch.utils import cpp_extension
            _build_without_loading(cpp_extension)
            _NOT_LOADED.active = job.functions is None
            # torch remembers, per process, the sources it last built under a name and skips the build when
            # they repeat, even if that build failed or was stopped. Our names are content hashes and we only
            # get here when no finished library exists, so that memory can only be wrong: forget it.
            cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(job.name, None)
            load_inline = cpp_extension.load_inline
            outcome["path"] = load_inline(
                name=job.name, cpp_sources=[job.cpp_source],
                cuda_sources=[job.cuda_source] if job.cuda_source is not None else None,
                functions=job.functions, extra_cflags=job.cflags, extra_cuda_cflags=job.cuda_cflags,
                extra_ldflags=job.ldflags, extra_include_paths=job.include_paths,
                build_directory=str(build_dir), verbose=verbose, with_cuda=job.backend == "cuda",
                is_python_module=job.functions is not None, no_implicit_headers=job.functions is None)
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            outcome["error"] = exc

    env_arch = {"TORCH_CUDA_ARCH_LIST": toolchain.cuda_arch()} if job.backend == "cuda" else {}
    with captured_output() as captured, config.environment(env_arch):
        worker = threading.Thread(target=work, name=f"fuselab-build-{job.name}", daemon=True)
        worker.start()
        worker.join(timeout)
        timed_out = worker.is_alive()
        if timed_out:
            _kill_compilers(build_dir)
            worker.join(30)
    log = captured.text
    if timed_out:
        raise BuildTimeout(f"{job.filename}: the build took longer than {timeout:.0f} s and was stopped "
                           f"(set timeout= or FUSELAB_BUILD_TIMEOUT to allow longer)", log=log)
    error = outcome.get("error")
    if error is not None:
        full_log = log + "\n" + str(error)
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise error
        raise diagnostics.build_error(job.filename, full_log, job.student_source, job.source_map) from None
    return log


def _kill_compilers(build_dir: Path):
    """Kill this process's descendants that run in ``build_dir`` (ninja), and theirs (nvcc, cc1plus)."""
    parent_of = proctree.parents()
    roots = []
    for pid in proctree.descendants(os.getpid(), parent_of):
        with contextlib.suppress(OSError):
            if Path(os.readlink(f"/proc/{pid}/cwd")).resolve() == build_dir.resolve():
                roots.append(pid)
    for root in roots:
        proctree.kill([root, *proctree.descendants(root, parent_of)])


# ------------------------------------------------------------------------------------------- errors

def _refuse_stub(source: str, filename: str):
    match = _STUB.search(source)
    if match:
        line = source.count("\n", 0, match.start()) + 1
        raise NotWrittenError(
            f"this kernel is not written yet: {filename} line {line} still holds the placeholder "
            f"`{match.group(0).strip()}`. Replace it with your CUDA code, then run the cell again.")


def _refuse_torch_headers(source: str, filename: str):
    match = _TORCH_HEADER.search(source)
    if match:
        line = source.count("\n", 0, match.start()) + 1
        raise BuildError(
            f"{filename}:{line}: `#include <{match.group(1)}>`: a kernel's file here is plain CUDA C++, compiled "
            f"without PyTorch's headers (torch, ATen, c10), so nothing of them can be used in it. Check a launch "
            f"with `cudaGetLastError()` (in place of C10_CUDA_KERNEL_LAUNCH_CHECK or TORCH_CHECK); the tensors "
            f"arrive as plain pointers, sizes and the stream, as the launcher's signature says.")


def _refuse_stream_zero(source: str, filename: str):
    from .emulate.streams import off_stream_launches
    launches = off_stream_launches(source)
    if not launches:
        return
    lines = source.replace("\r\n", "\n").split("\n")
    quoted = []
    for launch in launches:
        what = "names no stream" if launch.named == "no stream" else f"names stream {launch.named}"
        quoted.append(f"{filename}:{launch.line}:{launch.column}: error: this launch {what}, but its function "
                      f"was given `{launch.stream}`")
        quoted += diagnostics.quote_line(lines[launch.line - 1], launch.line, launch.column)
    stream = launches[0].stream
    text = "\n".join(quoted)
    raise BuildError(
        f"{filename}: launch on the stream the launcher is given: kernel<<<grid, block, shared_bytes, {stream}>>>"
        f"(...).\n\n{text}\n\nA launch on stream 0 escapes a CUDA-graph capture of the caller's stream (a "
        f"replayed graph leaves the output unwritten) and is not ordered with the caller's other work on "
        f"`{stream}`: the next kernel may read the output before it is written, and the timing's events do not "
        f"see it.", diagnostics=text)


def _missing_launcher_error(exc, protos, filename):
    text = str(exc)
    undefined = re.search(r"undefined symbol: (\S+)", text)
    if undefined and not any(p.name == undefined.group(1) for p in protos):
        # the loader names the first symbol the library uses and nothing defines (a function declared, never
        # written; or one of a library the build does not link): not a missing launcher
        symbol = diagnostics.demangled(undefined.group(1))
        builtin = symbol.removeprefix("__device_builtin_variable_")
        if builtin != symbol:  # threadIdx and the like, read in host code: nvcc compiles it, nothing defines it
            return BuildError(f"{filename} compiled, but host code (a launcher, or a function it calls) reads "
                              f"`{builtin}`, which only device code has: read it in a kernel.\n(loader said: {text})",
                              diagnostics=text)
        return BuildError(f"{filename} compiled, but its library uses `{symbol}`, which nothing defines: a function "
                          f"declared and never written, or one from a library the kernels are not linked with "
                          f"(only the CUDA runtime and the C/C++ standard libraries are).\n(loader said: {text})",
                          diagnostics=text)
    missing = [p for p in protos if p.name in text] or list(protos)
    wanted = "\n".join(f"    {p.declaration.rstrip(';')} {{ ... }}" for p in missing)
    return BuildError(f"{filename} compiled, but does not define the launcher(s) this lab needs. "
                      f"Write them with exactly these signatures:\n{wanted}\n(loader said: {text})",
                      diagnostics=text)


def clear_cache():
    """Delete every cached build (``fuselab clean``)."""
    shutil.rmtree(config.builds_dir(), ignore_errors=True)
