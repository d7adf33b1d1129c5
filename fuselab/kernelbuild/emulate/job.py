"""The ``emulate`` backend's build: the student's text translated for g++ and linked against the emulation's
runtime (``include/`` for the kernel's file, ``runtime/`` compiled once: ``runtime_object``), for correctness on a
machine without a GPU."""

from __future__ import annotations

from ..job import Job, compose
from . import HEADER
from . import runtime_object
from .flags import CXXFLAGS, INCLUDE_DIR, LDFLAGS, sanitizer_flags
from .translate import translate_with_map


def job(source, protos, filename, extra_cflags, sanitize):
    translated, source_map = translate_with_map(source, filename)
    text = compose(protos, f'#include "{HEADER}"', filename, translated)
    cflags = [*CXXFLAGS, "-fdiagnostics-color=never", *extra_cflags]
    ldflags = list(LDFLAGS)
    if sanitize:
        san_c, san_l = sanitizer_flags(sanitize)
        cflags += san_c
        ldflags += san_l
    # the runtime's object, copied into the build's folder before it compiles, linked by its name there; its name
    # (a digest of compiler, flags and every header) is part of the build's key
    runtime = runtime_object.name_for(cflags)
    ldflags.append(runtime_object.LINKED)
    built = Job("emulate", text, None, cflags, [], ldflags, [str(INCLUDE_DIR)], filename,
                extra_key=runtime, student_source=source, source_map=source_map)
    built.prepare = lambda build_dir, timeout: runtime_object.provide(runtime, cflags, build_dir, timeout)
    return built
