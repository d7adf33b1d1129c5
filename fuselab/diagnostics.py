"""Turn a raw build log (ninja + nvcc/g++ output) into the diagnostics a student needs to read.

What stays: the compiler's messages about the student's file, with its own line numbers (the build puts a
``#line 1 "kernel.cu"`` before the student's text), the quoted source line and the caret under it. What goes:
ANSI colour codes, ninja's progress and ``FAILED:`` lines, the long compiler command lines, and the absolute
build-directory paths.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NOISE = (
    re.compile(r"^\[\d+/\d+\] "),  # ninja progress, followed by the whole command line
    re.compile(r"^FAILED: "),
    re.compile(r"^ninja: "),
    re.compile(r"^Error building extension"),
    re.compile(r"^(/\S+/)?(c\+\+|g\+\+|gcc|nvcc|clang\+\+)\s+-"),  # a compiler command line
    re.compile(r"^\d+ errors? detected in the compilation of"),
    re.compile(r"^compilation terminated\.$"),
)
_MESSAGE = re.compile(r"(error|warning|note|fatal error)\b", re.I)


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def student_diagnostics(log: str, filename: str = "kernel.cu") -> str:
    """The part of ``log`` that talks about ``filename``, cleaned for a student."""
    lines = [line.rstrip() for line in strip_ansi(log).splitlines()]
    lines = [_shorten_paths(line, filename) for line in lines if not any(p.search(line) for p in _NOISE)]
    kept, keep_context = [], False
    for line in lines:
        mentions_file = line.startswith(filename) or f" {filename}" in line[:80]
        if mentions_file and _MESSAGE.search(line):
            kept.append(line)
            keep_context = True
        elif mentions_file and "In function" in line:
            kept.append(line)
            keep_context = False
        elif keep_context and line.strip() and (line.startswith(" ") or line.lstrip().startswith("|")):
            kept.append(line)  # the quoted source line and the caret under it
        else:
            keep_context = False
    if kept:
        return "\n".join(kept)
    # Nothing about the student's file (a link error, a crashed compiler): show what is left, briefly.
    rest = [line for line in lines if line.strip()]
    return "\n".join(rest[-30:])


def count_errors(diagnostics: str) -> int:
    return len(re.findall(r"\berror\b", diagnostics, re.I))


def _shorten_paths(line: str, filename: str) -> str:
    # "/root/.cache/fuselab/builds/x/cuda.cu" style paths and "/path/to/kernel.cu" both become "kernel.cu".
    return re.sub(r"(?:/[^\s:()\"']+/)" + re.escape(filename), filename, line)
