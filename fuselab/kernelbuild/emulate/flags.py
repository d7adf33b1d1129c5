"""Compiler and linker flags for emulated builds, and the optional AddressSanitizer build."""

import subprocess
from functools import lru_cache
from pathlib import Path
from typing import List

INCLUDE_DIR = Path(__file__).resolve().parent / "include"

CXXFLAGS = [
    "-O2",
    "-std=c++17",
    "-fopenmp",
    # CUDA code reinterprets memory freely (float4 loads, half bits); g++ must not assume it doesn't.
    "-fno-strict-aliasing",
    # Inline functions of one student library must never bind to another library's copy.
    "-fvisibility-inlines-hidden",
    "-Wno-unknown-pragmas",
    "-DFUSELAB_EMULATION=1",
]

LDFLAGS = [
    "-fopenmp",
    # Each library keeps its own copy of every symbol, even when another loaded library has the same names.
    "-Wl,-Bsymbolic",
]


class SanitizerFlags(tuple):
    """Extra flags for a sanitizer build: unpack as ``cflags, ldflags = sanitizer_flags("address")``.

    ``preload`` is the runtime Python must be started with (``LD_PRELOAD``), ``env`` all the environment
    that process needs.
    """

    def __new__(cls, cflags: List[str], ldflags: List[str], kind: str):
        flags = super().__new__(cls, (cflags, ldflags))
        flags.kind = kind
        return flags

    @property
    def cflags(self) -> List[str]:
        return self[0]

    @property
    def ldflags(self) -> List[str]:
        return self[1]

    @property
    def preload(self) -> str:
        return _runtime_library("libasan.so") if self.kind == "address" else ""

    @property
    def env(self) -> dict:
        if self.kind != "address":
            return {}
        env = {"ASAN_OPTIONS": "detect_leaks=0:allocator_may_return_null=1"}
        if self.preload:
            env["LD_PRELOAD"] = self.preload
        return env


@lru_cache(maxsize=None)
def _runtime_library(name: str) -> str:
    try:
        path = subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return path if path and Path(path).is_absolute() and Path(path).exists() else ""


def sanitizer_flags(kind: str = "address") -> SanitizerFlags:
    """Flags for an AddressSanitizer ("address") or UndefinedBehaviorSanitizer ("undefined") build.

    ASan's runtime must be loaded before anything else, so the Python process that loads an ASan build
    must be started with ``LD_PRELOAD=$(gcc -print-file-name=libasan.so)`` (``preload`` holds that path)
    and, to keep Python's own allocations from being reported, ``ASAN_OPTIONS=detect_leaks=0``.
    """
    if kind == "address":
        return SanitizerFlags(
            cflags=["-fsanitize=address", "-fno-omit-frame-pointer", "-g"],
            ldflags=["-fsanitize=address"],
            kind="address",
        )
    if kind == "undefined":
        return SanitizerFlags(
            cflags=["-fsanitize=undefined", "-fno-sanitize-recover=undefined", "-g"],
            ldflags=["-fsanitize=undefined"],
            kind="undefined",
        )
    raise ValueError(f"unknown sanitizer {kind!r}: use 'address' or 'undefined'")
