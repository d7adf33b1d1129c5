"""CUDA source -> C++ source for the CPU emulation, line for line."""

from .lexer import code_view, preprocessor_spans
from .rewrite import Rewriter
from .scanning import BarrierAnalysis, blank_spans, find_functions, macro_definitions
from .spaces import check as check_execution_spaces
from .unsupported import find_unsupported


def translate(source: str, filename: str = "kernel.cu") -> str:
    """Rewrite a student's CUDA text into C++ that compiles against ``fuselab_emu.h``.

    The output has exactly the lines of the input: compile it after ``#line 1 "<filename>"`` and the
    compiler's messages name the student's lines. Raises ``fuselab.errors.UnsupportedConstruct`` for a
    construct the emulation cannot run (textures, inline PTX, cooperative groups, ...).
    """
    return translate_with_map(source, filename)[0]


def translate_with_map(source: str, filename: str = "kernel.cu"):
    """``translate``, and the ``SourceMap`` that takes a position in its output back to the student's text."""
    text = source.replace("\r\n", "\n")
    code = code_view(text)
    pp_spans = preprocessor_spans(code)
    structure = blank_spans(code, pp_spans)
    find_unsupported(text, code, pp_spans, filename)

    functions = find_functions(structure)
    check_execution_spaces(text, structure, functions, macro_definitions(code, pp_spans), filename)
    analysis = BarrierAnalysis(structure, code, functions, pp_spans)
    rewriter = Rewriter(text, code, structure, pp_spans, functions, analysis, filename)
    rewriter.pragmas()
    rewriter.launches()
    rewriter.shared_declarations()
    rewriter.device_variables()
    rewriter.func_attributes()
    rewriter.tokens()

    output, last_start = text, len(text) + 1
    for start, end, replacement, _ in sorted(rewriter.edits, key=lambda e: e[0], reverse=True):
        if end > last_start:
            raise AssertionError("overlapping rewrites")  # a translator bug, never a student's
        output = output[:start] + replacement + output[end:]
        last_start = start
    if output.count("\n") != text.count("\n"):
        raise AssertionError("the translation changed the number of lines")
    return output, SourceMap(text, output, sorted(rewriter.edits, key=lambda e: e[0]))


class SourceMap:
    """Positions in the translated text → positions in the student's text.

    A compiler names line and column of the translated text: the line is the student's, but a rewritten launch
    is longer than what the student wrote (a column of 208 on a 110-character line), and a launch written over
    several lines is joined onto its first. Outside the rewrites the offset shifts by what the rewrites before
    it added; inside one, a position in a piece of the student's text copied into it maps to that piece, and
    anything else to the start of the rewritten construct.
    """

    def __init__(self, original: str, translated: str, edits):
        self.original, self.translated = original, translated
        self.edits = edits  # (start, end, replacement, pieces), sorted, on the original text

    def original_offset(self, offset: int) -> int:
        delta = 0  # translated offset - original offset, before the current edit
        for start, end, replacement, pieces in self.edits:
            begin = start + delta
            if offset < begin:
                break
            if offset < begin + len(replacement):
                inside = offset - begin
                for at, piece_start, length in pieces:
                    if at <= inside < at + length:
                        return piece_start + inside - at
                return start
            delta += len(replacement) - (end - start)
        return max(0, min(offset - delta, len(self.original)))

    def original_position(self, line: int, column: int):
        """``(line, column)`` in the student's text, both 1-based; ``column`` counts characters of the
        translated line."""
        starts = _line_starts(self.translated)
        if not 1 <= line <= len(starts):
            return line, column
        offset = self.original_offset(starts[line - 1] + max(column - 1, 0))
        original_line = self.original.count("\n", 0, offset) + 1
        return original_line, offset - _line_starts(self.original)[original_line - 1] + 1

    def translated_line(self, line: int) -> str:
        lines = self.translated.split("\n")
        return lines[line - 1] if 1 <= line <= len(lines) else ""


def _line_starts(text: str) -> list:
    starts = [0]
    for index, char in enumerate(text):
        if char == "\n":
            starts.append(index + 1)
    return starts
