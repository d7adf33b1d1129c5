"""Find functions in CUDA source, and decide which kernels may wait at a barrier.

A kernel that never reaches __syncthreads or a warp operation can run as a plain loop over its threads,
much faster than on fibers. We decide this per kernel from the source: a kernel needs fibers when a
barrier is reachable from its body through the functions and macros it names. Anything we cannot
follow (a barrier outside every function we found) makes every kernel use fibers: slower, never wrong.
"""

import re
from dataclasses import dataclass

from .lexer import IDENTIFIER, match_backward, match_forward

CONTROL_WORDS = {
    "if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype", "__attribute__",
    "static_assert", "defined", "alignas", "noexcept", "throw", "new", "delete", "typeid", "__launch_bounds__",
    "__align__", "else", "do",
}
TRAILING_WORDS = {"const", "noexcept", "override", "final", "mutable", "volatile"}

# Calls that make a thread wait for others: these need fibers.
BARRIER_NAMES = {
    "__syncthreads", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or", "__syncwarp",
    "__shfl_sync", "__shfl_down_sync", "__shfl_up_sync", "__shfl_xor_sync", "__ballot_sync", "__any_sync",
    "__all_sync", "__reduce_add_sync", "__reduce_min_sync", "__reduce_max_sync", "__reduce_and_sync",
    "__reduce_or_sync", "__reduce_xor_sync",
}


@dataclass
class Function:
    name: str
    header_start: int  # where the declaration begins (after the previous ; { or })
    body_start: int  # offset of the opening brace
    body_end: int  # offset of the closing brace
    is_kernel: bool
    is_device: bool  # device code: __global__ or __device__


def blank_spans(code: str, spans) -> str:
    """Blank the given (start, end) spans, keeping newlines."""
    chars = list(code)
    for start, end in spans:
        for i in range(start, end):
            if chars[i] != "\n":
                chars[i] = " "
    return "".join(chars)


def _skip_space_back(code: str, j: int) -> int:
    while j >= 0 and code[j].isspace():
        j -= 1
    return j


def _identifier_ending_at(code: str, j: int):
    end = j + 1
    while j >= 0 and (code[j].isalnum() or code[j] == "_"):
        j -= 1
    word = code[j + 1 : end]
    if word and (word[0].isalpha() or word[0] == "_"):
        return word, j + 1
    return None, end


def find_functions(structure: str):
    """Every function definition in ``structure`` (a code view with preprocessor lines blanked)."""
    functions = []
    for brace in re.finditer(r"\{", structure):
        pos = brace.start()
        j = _skip_space_back(structure, pos - 1)
        while j >= 0 and structure[j] != ")":
            word, word_start = _identifier_ending_at(structure, j)
            if word not in TRAILING_WORDS:
                break
            j = _skip_space_back(structure, word_start - 1)
        if j < 0 or structure[j] != ")":
            continue
        open_paren = match_backward(structure, j)
        if open_paren < 0:
            continue
        name, name_start = _identifier_ending_at(structure, _skip_space_back(structure, open_paren - 1))
        if not name or name in CONTROL_WORDS:
            continue
        body_end = match_forward(structure, pos)
        if body_end < 0:
            continue
        header_start = max(structure.rfind(c, 0, name_start) for c in ";{}") + 1
        header_words = set(IDENTIFIER.findall(structure[header_start:name_start]))
        functions.append(
            Function(
                name=name,
                header_start=header_start,
                body_start=pos,
                body_end=body_end,
                is_kernel="__global__" in header_words,
                is_device="__global__" in header_words or "__device__" in header_words,
            )
        )
    return functions


def enclosing_functions(functions, pos: int):
    """The functions whose body contains ``pos``, outermost first."""
    inside = [f for f in functions if f.body_start < pos < f.body_end]
    return sorted(inside, key=lambda f: f.body_start)


def macro_definitions(code: str, pp_spans):
    """name -> identifiers in the body, for each #define."""
    macros = {}
    for start, end in pp_spans:
        match = re.match(r"\s*#\s*define\s+([A-Za-z_]\w*)", code[start:end])
        if match:
            body = code[start + match.end() : end]
            macros.setdefault(match.group(1), set()).update(IDENTIFIER.findall(body))
    return macros


class BarrierAnalysis:
    """Answers: may this kernel wait at a barrier?"""

    def __init__(self, structure: str, code: str, functions, pp_spans):
        self.graph = {}
        for f in functions:
            self.graph.setdefault(f.name, set()).update(IDENTIFIER.findall(structure[f.body_start : f.body_end]))
        for name, words in macro_definitions(code, pp_spans).items():
            self.graph.setdefault(name, set()).update(words)
        # A barrier we cannot attribute (in a lambda at namespace scope, a functor we did not see...).
        self.unattributed = False
        for match in re.finditer(r"\b(" + "|".join(sorted(BARRIER_NAMES)) + r")\b", structure):
            if not enclosing_functions(functions, match.start()):
                self.unattributed = True
        self.kernels = {f.name for f in functions if f.is_kernel}
        self._memo = {}

    def needs_fibers(self, kernel: str) -> bool:
        if self.unattributed or kernel not in self.graph:
            return True
        if kernel not in self._memo:
            seen, todo = set(), [kernel]
            found = False
            while todo and not found:
                name = todo.pop()
                if name in seen:
                    continue
                seen.add(name)
                words = self.graph.get(name, ())
                if BARRIER_NAMES.intersection(words):
                    found = True
                todo.extend(w for w in words if w in self.graph and w not in seen)
            self._memo[kernel] = found
        return self._memo[kernel]
