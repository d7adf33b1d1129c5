"""Turn a raw build log (ninja + nvcc/g++ output) into the diagnostics a student needs to read.

What stays: the compiler's messages about the student's file, with its own line numbers (the build puts a
``#line 1 "kernel.cu"`` before the student's text), the quoted source line and the caret under it. What goes:
ANSI colour codes, ninja's progress and ``FAILED:`` lines, the long compiler command lines, and the absolute
build-directory paths.

g++ cannot quote a line of ``kernel.cu`` (no such file where it runs, so it also counts columns in bytes), so
``echo_source`` adds the student's line and a caret under the column; for the emulation it first maps the
column of the translated line (a rewritten launch is longer than what the student wrote) back to the student's.
"""

from __future__ import annotations

import re
import unicodedata

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


def echo_source(diagnostics: str, filename: str, source: str, source_map=None) -> str:
    """Under every ``file:LINE:COL:`` message that quotes no source, the student's line and a caret at COL.

    ``source_map``: the emulation's ``SourceMap``; its columns are those of the translated text, and they are
    mapped (line and column) back to the student's text first.
    """
    lines = source.replace("\r\n", "\n").split("\n")
    header = re.compile(rf"^{re.escape(filename)}:(\d+):(\d+):(\s*(?:fatal error|error|warning|note)\b.*)$")
    bare = re.compile(rf"^{re.escape(filename)}\((\d+)\):\s*(?:error|warning)\b")  # nvcc: no column
    given = diagnostics.split("\n")
    out = []
    for index, line in enumerate(given):
        quoted = index + 1 < len(given) and given[index + 1].startswith((" ", "|"))
        found = header.match(line)
        if found and not quoted:
            # g++ could not read the file to quote it, and then counts columns in bytes
            row, column = int(found.group(1)), int(found.group(2))
            if source_map is not None:
                translated = source_map.translated_line(row)
                row, column = source_map.original_position(row, _char_index(translated, column) + 1)
            elif 1 <= row <= len(lines):
                column = _char_index(lines[row - 1], column) + 1
            out.append(f"{filename}:{row}:{column}:{found.group(3)}")
            if 1 <= row <= len(lines):
                out += quote_line(lines[row - 1], row, column)
            continue
        out.append(line)
        found = bare.match(line)
        if found and not quoted and 1 <= int(found.group(1)) <= len(lines):
            out += quote_line(lines[int(found.group(1)) - 1], int(found.group(1)), None)
    return "\n".join(out)


def _width(char: str) -> int:
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _char_index(text: str, byte_column: int) -> int:
    """The index of the character at a 1-based column counted in UTF-8 bytes."""
    return len(text.encode()[:max(byte_column - 1, 0)].decode(errors="ignore"))


def quote_line(text: str, row: int, column) -> list:
    """GCC's own layout: `` 6 | the line`` and, when the column is known, a caret under it (tabs kept, so that
    the caret lines up wherever the text is shown)."""
    text = text.rstrip("\r")
    gutter = f"{row:>5}"
    quoted = [f"{gutter} | {text}"]
    if column is not None:
        before = text[:max(column - 1, 0)]
        pad = "".join("\t" if char == "\t" else " " * _width(char) for char in before)
        quoted.append(f"{' ' * len(gutter)} | {pad}^")
    return quoted
