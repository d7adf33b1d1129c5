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

import ctypes
import functools
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
    # what torch and Python say while building ("No CUDA runtime is found, using CUDA_HOME=..." on a machine
    # without a GPU): captured with the compiler's output, but it is no part of the student's error and reads as
    # a setup problem. torch's log lines ("W1204 22:47:52.935000 7097 .../cpp_extension.py:183] ...") and
    # Python's warnings ("UserWarning: ...", or with the file and line in front)
    re.compile(r"^[DIWEFC]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] "),
    re.compile(r"^(\S+:\d+: )?[A-Z]\w*Warning: "),
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


_WITH = re.compile(r"\[with ([^\]]*)\]")


def merge_repeated(diagnostics: str, log: str, filename: str) -> tuple[str, int]:
    """Each distinct message once: a template compiled for several types (``float`` and ``__half``) reports the same
    error at the same line once per instantiation, which reads as twice the mistakes. A repeated message keeps its
    first copy, followed by a line naming the instantiations it came from (``T = float``, ``T = __half``). Returns
    the merged text and how many repeats were merged into an earlier copy."""
    blocks = _blocks(diagnostics.split("\n"), filename)
    instantiations = iter(_gcc_instantiations(log, filename))
    merged, seen, repeats = [], {}, 0
    dropped = False  # the last error or warning was a repeat: the notes under it go with it
    for block in blocks:
        key = "\n".join(line for line in block if "instantiation" not in line and "required from" not in line)
        kind = _kind(block[0], filename)
        if kind == "note":
            # a note belongs to the message above it (a candidate, a declaration): kept or dropped with it, and
            # it takes no instantiation's label (g++ names none for it; _gcc_instantiations skips notes too)
            if not dropped:
                merged.append([list(block), []])
            continue
        is_message = kind is not None
        dropped = False
        where = _WITH.search("\n".join(block[1:]))  # nvcc names the instantiation under the message
        label = where.group(1) if where else (next(instantiations, None) if is_message else None)
        if is_message and key in seen:
            seen[key][1].append(label)
            repeats += 1
            dropped = True
            continue
        entry = [list(block), [label]]
        merged.append(entry)
        if is_message:
            seen[key] = entry
    out = []
    for block, labels in merged:
        out += block
        if len(labels) > 1:
            named = [_tidy(label) for label in labels if label]
            if not named:
                out.append(f"      (the compiler reported this {len(labels)} times; one fix removes them all)")
                continue
            which = f": {', '.join(named)}" if len(named) == len(labels) and len(set(named)) == len(named) else ""
            out.append(f"      (reported once for each of {len(labels)} instantiations of the template{which}; "
                       f"one fix removes them all)")
    return "\n".join(out), repeats


def _kind(line: str, filename: str):
    """"error", "warning" or "fatal error" for a message about ``filename``, "note" for a note, else None."""
    if not re.match(rf"{re.escape(filename)}[:(]", line):
        return None
    found = _MESSAGE.search(line)  # the first such word: the kind, before the message's own words
    return found.group(1).lower() if found else None


def _blocks(lines: list, filename: str) -> list:
    """The diagnostics in blocks: a line naming the file, with the indented lines under it."""
    blocks = []
    for line in lines:
        if blocks and (not line.startswith(filename)) and (line.startswith((" ", "|")) or not line.strip()):
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return blocks


def _gcc_instantiations(log: str, filename: str) -> list:
    """For each of g++'s messages about ``filename``, in order: the template arguments of the instantiation it
    came from (g++ names it on an ``In instantiation of`` line before the message), or None."""
    labels, current = [], None
    for line in strip_ansi(log).splitlines():
        line = _shorten_paths(line.rstrip(), filename)
        if not line.startswith(filename):
            continue
        if "In instantiation of" in line:
            found = _WITH.search(line)
            current = found.group(1) if found else None
        elif re.match(rf"{re.escape(filename)}: (In function|At global scope|In member function)", line):
            current = None
        elif re.match(rf"{re.escape(filename)}:\d+:\d+:\s*(fatal error|error|warning|note)\b", line):
            if not re.match(rf"{re.escape(filename)}:\d+:\d+:\s*note\b", line):
                labels.append(current)
    return labels


def _tidy(label: str) -> str:
    """``T=float`` (nvcc) and ``T = float`` (g++) alike: ``T = float``."""
    return re.sub(r"\s*=\s*", " = ", label.strip())


def _shorten_paths(line: str, filename: str) -> str:
    # "/root/.cache/fuselab/builds/x/cuda.cu" style paths and "/path/to/kernel.cu" both become "kernel.cu".
    return re.sub(r"(?:/[^\s:()\"']+/)" + re.escape(filename), filename, line)


def echo_source(diagnostics: str, filename: str, source: str, source_map=None) -> str:
    """Under every ``file:LINE:COL:`` message that quotes no source, the student's line and a caret at COL.

    ``source_map``: the emulation's ``SourceMap``; its columns are those of the translated text, and they are
    mapped (line and column) back to the student's text first.
    """
    lines = source.replace("\r\n", "\n").split("\n")
    # a text that restarts the student's file with ``#line 1 "<filename>"`` after given code (Lab 3's Part D):
    # the compiler's line r is line r + offset of the text compiled
    marker = f'#line 1 "{filename}"'
    offset = next((i + 1 for i in range(len(lines) - 1, -1, -1) if lines[i].strip() == marker), 0)
    header = re.compile(rf"^{re.escape(filename)}:(\d+):(\d+):(\s*(?:fatal error|error|warning|note)\b.*)$")
    bare = re.compile(rf"^{re.escape(filename)}\((\d+)\):\s*(?:error|warning)\b")  # nvcc: no column
    given = diagnostics.split("\n")
    out = []
    for index, line in enumerate(given):
        quoted = index + 1 < len(given) and given[index + 1].startswith((" ", "|"))
        found = header.match(line)
        if found and not quoted:
            # g++ could not read the file to quote it, and then counts columns in bytes
            row, column = int(found.group(1)) + offset, int(found.group(2))
            if source_map is not None:
                translated = source_map.translated_line(row)
                row, column = source_map.original_position(row, _char_index(translated, column) + 1)
            elif 1 <= row <= len(lines):
                column = _char_index(lines[row - 1], column) + 1
            out.append(f"{filename}:{row - offset}:{column}:{found.group(3)}")
            if 1 <= row <= len(lines):
                out += quote_line(lines[row - 1], row - offset, column)
            continue
        out.append(line)
        found = bare.match(line)
        if found and not quoted and 1 <= int(found.group(1)) + offset <= len(lines):
            out += quote_line(lines[int(found.group(1)) + offset - 1], int(found.group(1)), None)
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


def build_error(filename: str, log: str, source: str | None = None, source_map=None):
    """The ``BuildError`` a failed build's ``log`` gives: the student's own messages, each error counted once
    (with ``source``, the student's text, g++'s messages quote its lines)."""
    from .errors import BuildError
    diag = student_diagnostics(log, filename)
    if source is not None:
        diag = echo_source(diag, filename, source, source_map)
    diag, repeats = merge_repeated(diag, log, filename)
    errors = count_errors(diag)
    count = f" ({errors} error{'s' if errors != 1 else ''})" if errors else ""
    if errors and repeats:  # a template's error repeats for each type it is compiled for: counted once
        count = f" ({errors} distinct error{'s' if errors != 1 else ''})"
    return BuildError(f"{filename} failed to compile{count}:\n\n{diag}", diagnostics=diag, log=log)



@functools.lru_cache(maxsize=1)
def _demangler():
    try:
        demangle = getattr(ctypes.CDLL("libstdc++.so.6"), "__cxa_demangle")
        free = ctypes.CDLL(None).free
    except (OSError, AttributeError):
        return None
    demangle.restype = ctypes.c_void_p
    demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    free.argtypes = [ctypes.c_void_p]
    return demangle, free


def demangled(name: str) -> str:
    """A C++ symbol as its source wrote it (``fused(float const*, float*, int)``, as the profiler shows a kernel),
    through the C++ runtime's own demangler; a name that is not C++, or that it cannot read, unchanged."""
    tools = _demangler() if name.startswith("_Z") else None
    if tools is None:
        return name
    demangle, free = tools
    status = ctypes.c_int(1)
    text = demangle(name.encode(), None, None, ctypes.byref(status))
    if not text or status.value != 0:
        return name
    try:
        return ctypes.string_at(text).decode(errors="replace")
    finally:
        free(text)
