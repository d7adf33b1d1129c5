"""Launches that name no stream, or stream 0, inside a function that was given one: found in the source text.

The CPU emulation sees at run time which stream every launch uses (``fuselab_emu_begin_call``). A CUDA build
runs the student's launches as they are, and on a notebook's default stream a launch on stream 0 is not told
apart from one on ``stream``. It matters once the caller's stream is another (the timing, a CUDA graph's
capture), so the CUDA build refuses, from the text alone, the plain cases: ``kernel<<<grid, block>>>``,
``<<<grid, block, shmem>>>`` and ``<<<..., 0>>>`` (or ``nullptr``, ``cudaStreamLegacy``,
``cudaStreamPerThread``) in a function that has a ``cudaStream_t`` parameter. A stream chosen at run time
(a variable) is left to the emulation and to the grader's CUDA-graph check.
"""

import re
from dataclasses import dataclass

from .lexer import code_view, in_spans, line_of, preprocessor_spans, split_top_level
from .scanning import blank_spans, enclosing_functions, find_functions

_NO_STREAM = {"0", "0x0", "nullptr", "NULL", "cudaStreamLegacy", "cudaStreamPerThread", "(cudaStream_t)0"}
_STREAM_PARAM = re.compile(r"\bcudaStream_t\s+([A-Za-z_]\w*)")


@dataclass
class OffStreamLaunch:
    line: int
    column: int  # 1-based, of the `<<<`
    named: str  # "no stream" or the expression written
    stream: str  # the function's cudaStream_t parameter


def off_stream_launches(source: str) -> list:
    """Every launch in ``source`` on stream 0 inside a function that has a ``cudaStream_t`` parameter."""
    text = source.replace("\r\n", "\n")
    code = code_view(text)
    pp_spans = preprocessor_spans(code)
    structure = blank_spans(code, pp_spans)
    functions = find_functions(structure)
    found = []
    for match in re.finditer(r"<<<", code):
        pos = match.start()
        if in_spans(pos, pp_spans):
            continue
        enclosing = enclosing_functions(functions, pos)
        if not enclosing:
            continue
        header = structure[enclosing[-1].header_start:enclosing[-1].body_start]
        streams = _STREAM_PARAM.findall(header)
        end = _config_end(code, pos + 3)
        if not streams or end < 0:
            continue
        parts = [" ".join(code[a:b].split()) for a, b in split_top_level(code, pos + 3, end)]
        named = "no stream" if len(parts) < 4 else parts[3]
        if named == "no stream" or named.replace(" ", "") in _NO_STREAM:
            line = line_of(text, pos)
            column = pos - (text.rfind("\n", 0, pos) + 1) + 1
            found.append(OffStreamLaunch(line, column, named, streams[0]))
    return found


def _config_end(code: str, start: int) -> int:
    depth = 0
    for i in range(start, len(code)):
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return -1
        elif depth == 0 and code.startswith(">>>", i):
            return i
        elif c == ";":
            return -1
    return -1
