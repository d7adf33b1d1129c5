"""CUDA's execution spaces, checked where the emulation's g++ cannot: nvcc refuses a call from device code to a
host function, a call from host code to a ``__device__`` function, and the thread index in host code; g++, to which
``__device__`` and ``__global__`` are nothing, compiles all three. Without this check a launcher that forgot a
``__device__`` passed every test under the emulation and failed to build on the grader's GPU.

What is checked is what the student's own file defines: a call to a function defined in it only in the other space,
by name (overloads of a name count together; a call through ``.``, ``->`` or ``::`` is not followed). Functions of
headers (``std::``, the math library) are not: the GPU build compiles every kernel with nvcc too
(tests/test_kernels_compile_for_cuda.py), and a function it does not know is not refused here.
"""

from __future__ import annotations

import re

from ... import diagnostics
from ...errors import BuildError
from .lexer import IDENTIFIER
from .scanning import BARRIER_NAMES, CONTROL_WORDS, Function

# blockDim and gridDim are left out: a launcher may name its own dim3 so (``dim3 blockDim(16, 16)``), which nvcc takes
THREAD_INDEX = ("threadIdx", "blockIdx")
# CUDA's own device functions, as host code might call them by mistake
DEVICE_BUILTINS = BARRIER_NAMES | {"__ldg", "__threadfence", "__threadfence_block", "__activemask"}
DEVICE_PREFIXES = ("atomic", "__shfl")
_CALL = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^<>;{}()]*>\s*)?\(")


def _spaces(structure: str, function: Function) -> set:
    header = set(IDENTIFIER.findall(structure[function.header_start:function.body_start]))
    if function.is_kernel:
        return {"global"}
    if "constexpr" in header:  # callable from device code too (--expt-relaxed-constexpr)
        return {"host", "device"}
    return ({"device"} if "__device__" in header else set()) | (
        {"host"} if "__host__" in header or "__device__" not in header else set())


def _own_body(structure: str, function: Function, functions) -> str:
    """The function's body with the bodies of functions defined inside it (a lambda's, a local class's) blanked."""
    body = list(structure[function.body_start + 1:function.body_end])
    for inner in functions:
        if function.body_start < inner.header_start and inner.body_end < function.body_end:
            for k in range(inner.header_start - function.body_start - 1, inner.body_end - function.body_start):
                if body[k] != "\n":
                    body[k] = " "
    return "".join(body)


def check(text: str, structure: str, functions, filename: str) -> None:
    """``BuildError`` (nvcc's words, the student's line and a caret) for the first call across execution spaces in
    ``text``; ``structure`` is its code view with preprocessor lines blanked, ``functions`` what it defines."""
    by_name: dict = {}
    for function in functions:
        if not function.name.startswith("__"):
            by_name.setdefault(function.name, set()).update(_spaces(structure, function))
    for function in functions:
        caller = _spaces(structure, function)
        if function.is_kernel and "void" not in IDENTIFIER.findall(structure[function.header_start:function.body_start]):
            _refuse(text, function.header_start + len(structure[function.header_start:function.body_start]) -
                    len(structure[function.header_start:function.body_start].lstrip()), filename,
                    f'a __global__ function must have a void return type ("{function.name}")',
                    "a kernel returns nothing: it writes its results through the pointers it is given")
        if "host" in caller and "device" in caller:
            continue  # __host__ __device__: nvcc checks each use where it is compiled for one side
        body = _own_body(structure, function, functions)
        base = function.body_start + 1
        for match in _CALL.finditer(body):
            name = match.group(1)
            before = body[:match.start()].rstrip()
            if name in CONTROL_WORDS or before.endswith((".", "->", "::")):
                continue
            if caller == {"host"} and (name in DEVICE_BUILTINS or name.startswith(DEVICE_PREFIXES)) and \
                    name not in by_name:
                _refuse(text, base + match.start(), filename,
                        f'calling a __device__ function("{name}") from a __host__ function("{function.name}") is '
                        f"not allowed", f"`{name}` is for the threads of a kernel: call it in the kernel")
            if name not in by_name:
                continue
            callee = by_name[name]
            if callee == {"global"}:
                _refuse(text, base + match.start(), filename, f'a __global__ function call must be configured '
                        f'("{name}")', f"launch a kernel with its grid and block: "
                        f"{name}<<<blocks, threads, 0, stream>>>(...)")
            kind = "global" if callee == {"global"} else "device" if callee <= {"device", "global"} else \
                "host" if callee == {"host"} else None
            if "host" in caller and kind == "device" and not body[match.end() - 1:].startswith("<<<"):
                _refuse(text, base + match.start(), filename,
                        f'calling a __device__ function("{name}") from a __host__ function("{function.name}") is '
                        f"not allowed", "a __device__ function runs on the GPU only: call it from a kernel, or mark "
                        "it __host__ __device__ to call it from both")
            if "host" not in caller and kind == "host":
                space = "__global__" if "global" in caller else "__device__"
                _refuse(text, base + match.start(), filename,
                        f'calling a __host__ function("{name}") from a {space} function("{function.name}") is not '
                        f"allowed", f"mark `{name}` __device__ (or __host__ __device__ to call it from the launcher "
                        f"too): a function without a mark is host code, which a GPU thread cannot call")
        if caller == {"host"}:
            used = re.search(r"(?<![\w.>:])(" + "|".join(THREAD_INDEX) + r")\s*\.\s*[xyz]\b", body)
            if used and not re.search(r"\b\w+[\s*&]+" + used.group(1) + r"\s*[;=({,\[]", body):
                _refuse(text, base + used.start(), filename,
                        f'"{used.group(1)}" is device code\'s: the host function "{function.name}" has no thread '
                        f"or block index", "read it in a kernel; a launcher sizes its grid from the problem's sizes")


def _refuse(text: str, offset: int, filename: str, message: str, hint: str) -> None:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    quoted = [f"{filename}:{line}:{column}: error: {message}",
              *diagnostics.quote_line(text.split("\n")[line - 1], line, column)]
    shown = "\n".join(quoted)
    raise BuildError(f"{filename} would not compile for a GPU (1 error: nvcc refuses it, so the CPU emulation does "
                     f"too):\n{shown}\n{hint}.", diagnostics=shown)
