"""One build, described: everything that reaches the compiler, whose digest names the build's folder and module.

Both backends (``cuda.py``, ``emulate/``) compose the same parts: a prologue declaring the student's launchers
``extern "C"``, the student's text under a ``#line`` so messages name the student's own lines, and an epilogue
that reads the last CUDA error.
"""

from __future__ import annotations

import hashlib

BUILD_FORMAT = "2"  # bump when the composed source or the flags change meaning

EPILOGUE = r"""
extern "C" int fuselab_last_error(char* msg, int cap) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess && msg && cap > 0)
        snprintf(msg, cap, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    return (int)e;
}
"""


class Job:
    """Everything that reaches the compiler for one build; its digest names the build."""

    def __init__(self, backend, cpp_source, cuda_source, cflags, cuda_cflags, ldflags, include_paths,
                 filename, extra_key="", functions=None, student_source=None, source_map=None):
        self.backend, self.filename = backend, filename
        # for error messages only (never part of the key): the student's text and, under the emulation, the
        # map from the translated text's columns back to it
        self.student_source, self.source_map = student_source, source_map
        self.functions = functions  # None: a plain library; else a torch extension module binding these
        self.cpp_source, self.cuda_source = cpp_source, cuda_source
        self.cflags, self.cuda_cflags, self.ldflags = list(cflags), list(cuda_cflags), list(ldflags)
        self.include_paths = list(include_paths)
        # called with (build folder, timeout) once the build's lock is held, before the compiler runs: puts in the
        # folder what the link needs beside the source (the emulation's runtime object)
        self.prepare = None
        import torch
        key = "\0".join([BUILD_FORMAT, backend, torch.__version__, cpp_source, cuda_source or "",
                         *self.cflags, "|", *self.cuda_cflags, "|", *self.ldflags, extra_key, repr(functions)])
        self.name = f"fuselab_{backend}_{hashlib.sha256(key.encode()).hexdigest()[:24]}"


def prologue(protos, backend_include):
    decls = "\n".join(f"    {p.declaration}" for p in protos)
    return f"{backend_include}\n#include <cstdint>\n#include <cstdio>\nextern \"C\" {{\n{decls}\n}}\n"


def compose(protos, include, filename, text):
    """The compiled text: prologue, the student's (or translated) text from its line 1, the epilogue."""
    return prologue(protos, include) + f'#line 1 "{filename}"\n' + text + "\n#line 1 \"fuselab_epilogue\"\n" + EPILOGUE
