"""CUDA source -> C++ source for the CPU emulation, line for line."""

from .lexer import code_view, preprocessor_spans
from .rewrite import Rewriter
from .scanning import BarrierAnalysis, blank_spans, find_functions
from .unsupported import find_unsupported


def translate(source: str, filename: str = "kernel.cu") -> str:
    """Rewrite a student's CUDA text into C++ that compiles against ``fuselab_emu.h``.

    The output has exactly the lines of the input: compile it after ``#line 1 "<filename>"`` and the
    compiler's messages name the student's lines. Raises ``fuselab.errors.UnsupportedConstruct`` for a
    construct the emulation cannot run (textures, inline PTX, cooperative groups, ...).
    """
    text = source.replace("\r\n", "\n")
    code = code_view(text)
    pp_spans = preprocessor_spans(code)
    structure = blank_spans(code, pp_spans)
    find_unsupported(text, code, pp_spans, filename)

    functions = find_functions(structure)
    analysis = BarrierAnalysis(structure, code, functions, pp_spans)
    rewriter = Rewriter(text, code, structure, pp_spans, functions, analysis, filename)
    rewriter.pragmas()
    rewriter.launches()
    rewriter.shared_declarations()
    rewriter.func_attributes()
    rewriter.tokens()

    output, last_start = text, len(text) + 1
    for start, end, replacement in sorted(rewriter.edits, key=lambda e: e[0], reverse=True):
        if end > last_start:
            raise AssertionError("overlapping rewrites")  # a translator bug, never a student's
        output = output[:start] + replacement + output[end:]
        last_start = start
    if output.count("\n") != text.count("\n"):
        raise AssertionError("the translation changed the number of lines")
    return output
