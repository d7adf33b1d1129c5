"""What a student's built library may call, checked before the grader's checker loads it.

In the clean recheck, a student's kernels are built and loaded by the checker itself (their host launchers run in
its process). Before it loads one, ``fuselab.build`` (with ``FUSELAB_NATIVE_POLICY=1``, which the grader sets
for the checker) checks:

- the library's imported dynamic symbols (ELF ``.dynsym`` undefined symbols, read with ``nm -D``) lie within
  what kernels need: the CUDA runtime's launch, registration, error, device, stream and memory functions; libm's
  and libc's math; ``memcpy``/``memset``; ``operator new``/``delete`` and the C++ runtime's support; and, for the
  CPU emulation, what its own runtime uses (OpenMP, its fibers' ``mmap``). No Python C API, no
  ``dlsym``/``dlopen``, no ``syscall``, no file, process or socket functions;
- the source holds no ``__attribute__((constructor))``/``destructor``, ``init_priority``, ``section``
  attributes (in any spelling GCC accepts), ``asm`` (host or device: PTX too), ``dlfcn.h``/``Python.h``,
  ``/proc`` or ``syscall``: code that asks to run at load time or reaches past the symbol table. A C++ static
  initialiser (``static int x = f();``) also runs at load time and is not refused.

A library that fails is never loaded: its module's launchers raise ``NativeCodeRefused`` saying why, so every
test that uses it scores 0 with that message, and the grader's report flags it.

This is a filter, not a boundary. Native code that runs in a process can write any memory of it, and can make
any system call without importing its name: machine code copied into memory it maps or protects executable
(``mmap``/``mprotect``, whose protection flags are values at run time, and which the emulation's own runtime
imports into every library). The kernel worker that loads the library is contained by the sandbox alone
(``isolate.sandboxed``: no rights, its own folder, no network, its own PID namespace) and computes no verdict;
the README's trust model and ``docs/grading.md`` say what that leaves.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import subprocess
from pathlib import Path

from .errors import BuildError

POLICY_ENV = "FUSELAB_NATIVE_POLICY"
REFUSED_MARK = "refused by the grader's check of native code"

_MATH = ("sqrt rsqrt cbrt exp exp2 expm1 log log2 log10 log1p pow sin cos tan asin acos atan atan2 sinh cosh tanh "
         "asinh acosh atanh erf erfc tgamma lgamma fabs floor ceil round lround llround trunc rint lrint llrint "
         "nearbyint fmod remainder remquo fma fmax fmin fdim hypot copysign frexp ldexp modf scalbn scalbln "
         "nextafter ilogb logb sincos nan isnan isinf finite signbit").split()
MATH = {name + suffix for name in _MATH for suffix in ("", "f", "l")}
LIBC = {"memcpy", "memmove", "memset", "memcmp", "strlen", "strcmp", "strncmp", "snprintf", "vsnprintf",
        "printf", "fprintf", "puts", "putchar", "fputs", "fputc", "fwrite", "fflush", "stdout", "stderr", "abort",
        "malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign", "__assert_fail",
        "__stack_chk_fail", "__printf_chk", "__fprintf_chk", "__snprintf_chk", "__vsnprintf_chk", "__memcpy_chk",
        "__memset_chk", "__memmove_chk", "__cxa_atexit", "__cxa_finalize", "__cxa_thread_atexit", "__gmon_start__",
        "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__tls_get_addr", "_Unwind_Resume",
        "__gxx_personality_v0", "atexit", "qsort", "div", "ldiv", "abs", "labs", "llabs"}
# ``_Unwind_``: libgcc's exception unwinding, which some toolchains' C++ links import by name
CXX_PREFIXES = ("_Unwind_", "__cxa_", "_Znw", "_Zna", "_Zdl", "_Zda", "_ZSt", "_ZTI", "_ZTV", "_ZTS", "_ZNSt", "_ZNKSt",
                "_ZNSo", "_ZNKSo", "_ZN9__gnu_cxx", "__gxx_", "__cxa")
# the C++ library's files, threads and processes: under the prefixes above, and never what a kernel needs
CXX_REFUSED = ("fstream", "filebuf", "filesystem", "6thread", "10this_thread", "stdio_filebuf")
# what the CPU emulation's own runtime (fuselab/kernelbuild/emulate/runtime, its object copied beside each library's
# main.o and linked in: read with it) calls, in every emulated library
EMULATION = {"getenv", "strtol", "strtoul", "strtoull", "sysconf", "mmap", "munmap", "mprotect",
             "pthread_mutex_lock", "pthread_mutex_unlock", "omp_get_max_threads", "omp_get_thread_num",
             "omp_get_num_threads",
             # a wild pointer in a kernel faults; the emulation turns that into a launch error, not a crash
             "sigaction", "sigaltstack", "__sigsetjmp", "siglongjmp",
             # the linker's bounds of the __device__ variables' section, which fuselab watches as kernel memory
             "__start_fuselab_emu_device_variables", "__stop_fuselab_emu_device_variables"}
EMULATION_PREFIXES = ("GOMP_", "fuselab_emu_")
CUDA_PREFIXES = ("__cuda", "cuda")
CUDA_REFUSED_PREFIXES = ("cudaIpc", "cudaHostRegister", "cudaHostGetDevicePointer", "cudaProfiler")

SOURCE_RULES = [
    # any spelling GCC accepts: constructor, __constructor__, init_priority, __init_priority__
    (re.compile(r"(?<![A-Za-z0-9_])_*(constructor|destructor|init_priority)_*(?![A-Za-z0-9_])"),
     "a function that runs when the library loads "
     "(constructor/destructor/init_priority attributes)"),
    (re.compile(r"__attribute__\s*\(\(\s*section\b|\.init_array|\.fini_array|\.ctors\b"),
     "code placed in a load-time section"),
    (re.compile(r"\b(__asm__|__asm|asm)\b"), "inline assembly (asm)"),
    (re.compile(r"#\s*include\s*[<\"](dlfcn\.h|Python\.h|unistd\.h|sys/|fcntl\.h|spawn\.h|link\.h|elf\.h)"),
     "a system header no kernel needs"),
    (re.compile(r"\b(dlsym|dlopen|dlvsym|syscall|Py[A-Z]\w*|_Py\w+)\b"), "a call into the loader, the operating "
     "system or Python"),
    (re.compile(r"/proc\b"), "the /proc file system"),
]


class NativeCodeRefused(BuildError):
    """A student's library the grader will not load (see the module doc)."""


_COURSE_CODE = contextvars.ContextVar("fuselab_course_code", default=False)


def enabled() -> bool:
    return os.environ.get(POLICY_ENV) == "1" and not _COURSE_CODE.get()


@contextlib.contextmanager
def course_code():
    """Builds in this thread, for its duration, are the course's own code (the instructor's tuned solution, built
    by the grader's run of the instructor's notebook: ``fuselab.speed.tuned``), not a student's: not checked.
    A student's library is loaded where no student Python runs (the kernel worker), so no student reaches this."""
    token = _COURSE_CODE.set(True)
    try:
        yield
    finally:
        _COURSE_CODE.reset(token)


def _without_comments(source: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)


def source_problems(source: str) -> list:
    code = _without_comments(source)
    problems = []
    for pattern, what in SOURCE_RULES:
        match = pattern.search(code)
        if match:
            line = code.count("\n", 0, match.start()) + 1
            problems.append(f"line {line}: {what} (`{match.group(0)}`)")
    return problems


def _nm(*args) -> list:
    out = subprocess.run(["nm", *map(str, args)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise NativeCodeRefused(f"the grader could not read the library's symbols: {out.stderr.strip()[:300]}")
    return [line.split() for line in out.stdout.splitlines() if line.split()]


def imported_symbols(library) -> list:
    """What the student's compiled code calls outside itself.

    Read from the object files the build left beside the library (what the source's own code references), not
    from the linked library alone: how a toolchain links the C++ and CUDA runtimes (a static ``libstdc++`` or
    ``cudart`` brings their own imports: unwinding, threads, the loader) differs between machines and even
    between environments of one machine, and says nothing about the student's code. Without object files, the
    library's dynamic imports.
    """
    objects = sorted(Path(library).parent.glob("*.o"))
    if not objects:
        return sorted({row[-1].split("@")[0] for row in _nm("-D", "--undefined-only", library)})
    undefined, defined = set(), set()
    for row in _nm("-A", *objects):  # "file.o: [address] TYPE name"
        kind, name = row[-2], row[-1]
        (undefined if kind in ("U", "w") else defined).add(name.split("@")[0])
    return sorted(undefined - defined)


# what the static linker itself defines for any shared object (object files name them; libraries do not import them)
LINKER = {"_GLOBAL_OFFSET_TABLE_", "__dso_handle", "_DYNAMIC", "__TMC_END__", "__ehdr_start"}


def symbol_allowed(name: str, backend: str) -> bool:
    if name in MATH or name in LIBC or name in LINKER:
        return True
    if name.startswith(CXX_PREFIXES):
        return not any(part in name for part in CXX_REFUSED)
    if backend == "cuda":
        return name.startswith(CUDA_PREFIXES) and not name.startswith(CUDA_REFUSED_PREFIXES)
    return name in EMULATION or name.startswith(EMULATION_PREFIXES)


def check_library(library, source: str, backend: str, filename: str) -> None:
    """Raise ``NativeCodeRefused`` (message for a student) when ``library`` or its ``source`` breaks the rules."""
    problems = source_problems(source)
    refused = [name for name in imported_symbols(library) if not symbol_allowed(name, backend)]
    if refused:
        problems.append("its library calls " + ", ".join(f"`{name}`" for name in refused[:8])
                        + (" ..." if len(refused) > 8 else ""))
    if problems:
        raise NativeCodeRefused(
            f"{filename} was {REFUSED_MARK}: " + "; ".join(problems) + ". A kernel source for this course may "
            "only compute: CUDA kernels and launchers, math, memory copies. The tests that use it score 0.")


class RefusedModule:
    """What ``fuselab.build`` returns in the checker for a refused library: never loaded; every launcher raises
    the refusal, so each test that uses it fails with the reason."""

    def __init__(self, error: NativeCodeRefused, protos, backend: str, source: str, name: str):
        import torch
        self.error, self.backend, self.source, self.name = error, backend, source, name
        self.device = torch.device("cuda" if backend == "cuda" else "cpu")
        self.library_path, self.log, self.build_seconds, self.cached = "", "", 0.0, False
        self.launchers = {}
        for proto in protos:
            def refused(*_args, _error=error, **_kwargs):
                raise NativeCodeRefused(str(_error))
            refused.__name__ = proto.name
            self.launchers[proto.name] = refused
            setattr(self, proto.name, refused)

    @property
    def emulated(self) -> bool:
        return self.backend == "emulate"

    def __repr__(self):
        return f"<fuselab module {self.name!r}, not loaded: {self.error}>"
