"""The ``emulate`` backend's build: the student's text translated for g++ and linked against the emulation's
runtime (``include/``), for correctness on a machine without a GPU."""

from __future__ import annotations

from pathlib import Path

from ..job import Job, compose
from . import HEADER
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
    header_key = "".join(p.read_text() for p in sorted(Path(INCLUDE_DIR).glob("*.h")))
    return Job("emulate", text, None, cflags, [], ldflags, [str(INCLUDE_DIR)], filename,
               extra_key=header_key, student_source=source, source_map=source_map)
