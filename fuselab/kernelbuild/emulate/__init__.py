"""CPU emulation of CUDA kernels, for correctness checks on machines without a GPU.

``translate(source)`` rewrites a student's ``.cu`` text into C++ with the same lines; compiled with g++
against ``INCLUDE_DIR/fuselab_emu.h`` (flags ``CXXFLAGS`` and ``LDFLAGS``) and linked with the runtime compiled once
(``runtime_object``), each CUDA thread runs as a fiber on the CPU, blocks in parallel on the cores. See docs/emulation.md for what it can and cannot tell.
"""

from .flags import CXXFLAGS, INCLUDE_DIR, LDFLAGS, SanitizerFlags, sanitizer_flags
from .translate import SourceMap, translate, translate_with_map

HEADER = "fuselab_emu.h"
THREAD_ORDERS = {"forward": 0, "reverse": 1, "random": 2}

__all__ = [
    "CXXFLAGS", "HEADER", "INCLUDE_DIR", "LDFLAGS", "SanitizerFlags", "THREAD_ORDERS", "sanitizer_flags",
    "SourceMap", "translate", "translate_with_map",
]
