"""The ``cuda`` backend: the student's text compiled by nvcc for this machine's GPU architecture.

One ``nvcc -shared`` call compiles and links the composed text into the build's library (no ninja, no torch
loader; measured against ``load_inline`` in docs/RESULTS.md "Build times": no slower). The library links only
the shared CUDA runtime (``--cudart shared``), the one torch has loaded, so a kernel sees torch's streams.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from pathlib import Path

from .. import diagnostics, proctree, toolchain
from ..errors import BuildError, BuildTimeout
from .job import Job, compose

HALF_TYPES = ("__half", "half", "__nv_bfloat16")
SOURCE_NAME = "kernel.cu"  # in the build folder; messages name the student's file (``#line``), not this
EXTENDED_LAMBDA = "--extended-lambda"
# a lambda marked for the device: ``[captures] __device__ (...)``, ``[captures] (params) mutable __host__ __device__``
DEVICE_LAMBDA = re.compile(r"\]\s*(?:\([^()]*(?:\([^()]*\)[^()]*)*\)\s*)?(?:(?:mutable|constexpr|noexcept)\s*)*"
                           r"(?:__host__\s*)?__device__|\]\s*__host__")


def job(source, protos, filename, extra_cflags):
    home = toolchain.prepare_cuda_environment()
    if home is None:
        raise BuildError("no CUDA compiler (nvcc) found: install the CUDA toolkit, set CUDA_HOME, or build "
                         "with backend='emulate' to run the kernel on the CPU")
    include = "#include <cuda_runtime.h>"
    if any(p.base_type in HALF_TYPES for proto in protos for p in proto.params):
        include += "\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>"
    text = compose(protos, include, filename, source)
    arch = toolchain.cuda_arch()
    # the language load_inline gave students (C++20, constexpr functions callable in device code), and
    # __device__ lambdas as PyTorch's own kernels write them (the emulation's g++ compiles them as they are).
    # nvcc's extended lambdas cost a third of a small build's CPU (1.45 → 1.05 core-s for Lab 0's kernel on the
    # 2-core machine), so they are asked for where the text writes one; a build that fails without them is
    # compiled again with them (``compile_library``), so no way of writing a lambda can lose a build.
    lambdas = [EXTENDED_LAMBDA] if DEVICE_LAMBDA.search(source) else []
    cuda_flags = ["-shared", "-Xcompiler", "-fPIC", "--cudart", "shared", "-std=c++20", "--expt-relaxed-constexpr",
                  *lambdas, "-O3", "-lineinfo", toolchain.gencode_flag(arch), *extra_cflags]
    return Job("cuda", "", text, [], cuda_flags, toolchain.cuda_link_flags(home), [], filename,
               extra_key=f"arch={arch}", student_source=source)


def compile_library(job: Job, build_dir: Path, timeout: float, verbose: bool) -> str:
    """``<build_dir>/<job.name>.so`` from one nvcc call; the compiler's output. ``BuildError`` with the
    student's lines when it does not compile; ``BuildTimeout`` (the compiler and its children killed) past
    ``timeout`` seconds."""
    (build_dir / SOURCE_NAME).write_text(job.cuda_source)
    nvcc = str(Path(toolchain.find_cuda_home()) / "bin" / "nvcc")
    # written under a name of its own, then renamed: a compiler left running by a killed build never writes
    # into the library a later build made
    partial = f"{job.name}.so.{os.getpid()}.{threading.get_ident()}.partial"
    command = [nvcc, *job.cuda_cflags, "-o", partial, SOURCE_NAME, *job.ldflags]
    deadline = time.monotonic() + timeout
    compiler, log = _compile(command, build_dir, job, timeout, deadline)
    if compiler.returncode != 0 and EXTENDED_LAMBDA not in command:
        # a device lambda written in a way ``DEVICE_LAMBDA`` missed (through a macro, say): compiled as asked
        command.insert(command.index("-O3"), EXTENDED_LAMBDA)
        compiler, log = _compile(command, build_dir, job, timeout, deadline)
    if verbose:
        print(" ".join(command), log, sep="\n")
    if compiler.returncode != 0:
        with contextlib.suppress(FileNotFoundError):
            (build_dir / partial).unlink()
        raise diagnostics.build_error(job.filename, log, job.student_source, job.source_map)
    os.replace(build_dir / partial, build_dir / f"{job.name}.so")
    return log


def _compile(command, build_dir: Path, job: Job, timeout: float, deadline: float):
    """One nvcc run: the finished process and its output. ``BuildTimeout`` (the compiler and its children
    killed) past ``deadline`` (the build's ``timeout`` seconds, counted from its first compiler)."""
    # in the caller's process group, so that a kill of the group (a killed build, a stopped grader) takes it too
    compiler = subprocess.Popen(command, cwd=build_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace")
    try:
        log, _ = compiler.communicate(timeout=max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        _kill(compiler)
        raise BuildTimeout(f"{job.filename}: the build took longer than {timeout:.0f} s and was stopped "
                           f"(set timeout= or FUSELAB_BUILD_TIMEOUT to allow longer)",
                           log=compiler.communicate()[0]) from None
    except BaseException:  # KeyboardInterrupt: the compiler does not outlive the cell
        _kill(compiler)
        raise
    return compiler, log


def _kill(compiler: subprocess.Popen) -> None:
    """nvcc and what it runs (cicc, ptxas, the host compiler and linker)."""
    proctree.kill([compiler.pid, *proctree.descendants(compiler.pid, proctree.parents())])
    compiler.wait()
