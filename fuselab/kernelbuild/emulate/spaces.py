"""CUDA's execution spaces, checked where the emulation's g++ cannot: nvcc refuses a call from device code to a
host function, a call from host code to a ``__device__`` function, and the thread index in host code; g++, to which
``__device__`` and ``__global__`` are nothing, compiles all three. Without this check a launcher that forgot a
``__device__`` passed every test under the emulation and failed to build on the grader's GPU.

A refusal must never hit valid CUDA (a correct kernel would then fail to build without a GPU), so the check refuses
only what it is sure of, and lets the GPU build's nvcc judge the rest:

- only functions the student's file defines are followed, by name, with the spaces of every definition and
  declaration of that name (overloads count together; macros that spell a space, ``#define HD __host__ __device__``,
  are read through); a call through ``.``, ``->`` or ``::``, a name the caller also declares (a parameter, a local
  lambda or variable), and a name the standard library also has (``swap``, ``fill``: argument-dependent lookup may
  choose it) are not followed;
- a brace block inside a function is that function's code (a grid-stride loop macro's body), except a lambda marked
  ``__device__``, which is device code wherever it is written; ``sizeof``/``decltype`` operands and ``#if 0`` blocks
  are not code; a template is checked only where the file uses it (nvcc checks a template where it is instantiated).
"""

from __future__ import annotations

import re

from ... import diagnostics
from ...errors import BuildError
from .lexer import IDENTIFIER, line_of, match_forward
from .scanning import BARRIER_NAMES, CONTROL_WORDS, Function, _identifier_ending_at, _skip_space_back, blank_spans

# blockDim and gridDim are left out: a launcher may name its own dim3 so (``dim3 blockDim(16, 16)``), which nvcc takes
THREAD_INDEX = ("threadIdx", "blockIdx")
ATOMICS = {f"atomic{op}{scope}" for op in ("Add", "Sub", "Exch", "Min", "Max", "Inc", "Dec", "CAS", "And", "Or", "Xor")
           for scope in ("", "_block", "_system")}
# CUDA's own device functions, as host code might call them by mistake
DEVICE_BUILTINS = BARRIER_NAMES | ATOMICS | {"__ldg", "__threadfence", "__threadfence_block", "__activemask"}
# names the C++ library has too: a call may reach std's (argument-dependent lookup, ``using namespace std``)
STD_NAMES = set("""swap fill fill_n copy copy_n move min max minmax sort stable_sort transform find find_if count
    count_if accumulate reduce iota begin end size data abs exp exp2 log log2 log10 sqrt cbrt pow fabs floor ceil round
    trunc sin cos tan tanh sinh cosh erf fma fmin fmax clamp lerp exchange for_each generate replace reverse unique
    equal any_of all_of none_of distance advance next prev get""".split())
# words after which a name followed by ``(`` is still a call (before any other word it is a declaration)
CALL_AFTER = {"return", "else", "do", "case", "throw", "co_return", "co_yield", "new", "delete"}
UNEVALUATED = re.compile(r"\b(sizeof|decltype|alignof|noexcept|typeid)\s*\(")
DEVICE_LAMBDA = re.compile(r"\[[^\[\]]*\]\s*(?:__host__\s+)?__device__\b")
_CALL = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^<>;{}()]*>\s*)?\(")


def _without_disabled(text: str, structure: str) -> str:
    """``structure`` with the code of ``#if 0`` blocks blanked (up to their ``#else``/``#elif`` or ``#endif``)."""
    disabled, depth, off_at, offset = [], 0, None, 0
    for line in text.split("\n"):
        directive = re.match(r"\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)", line)
        if directive:
            word = directive.group(1)
            if off_at is None and word == "if" and directive.group(2).strip() == "0":
                off_at, depth = offset, 0
            elif off_at is not None and word.startswith("if"):
                depth += 1
            elif off_at is not None and word in ("elif", "else", "endif") and depth == 0:
                disabled.append((off_at, offset))
                off_at = None
            elif off_at is not None and word == "endif":
                depth -= 1
        offset += len(line) + 1
    if off_at is not None:
        disabled.append((off_at, len(structure)))
    return blank_spans(structure, disabled)


def _words(text: str, macros: dict) -> set:
    """The identifiers of ``text``, macros read through (two levels: a macro naming another)."""
    words = set(IDENTIFIER.findall(text))
    for _ in range(2):
        words |= {w for name in words & macros.keys() for w in macros[name]}
    return words


def _spaces_of(words: set) -> set:
    if "__global__" in words:
        return {"global"}
    if "constexpr" in words:  # callable from device code too (--expt-relaxed-constexpr)
        return {"host", "device"}
    return ({"device"} if "__device__" in words else set()) | (
        {"host"} if "__host__" in words or "__device__" not in words else set())


def _declared_spaces(code: str, macros: dict) -> dict:
    """name -> spaces, from declarations that name a space (``__device__ float f(float);``, an in-class
    ``__host__ __device__ float len() const;``): a definition elsewhere without a mark takes them."""
    marks = {"__host__", "__device__", "__global__"} | {n for n, body in macros.items()
                                                        if body & {"__host__", "__device__", "__global__"}}
    found = {}
    for match in re.finditer(r"([A-Za-z_]\w*)\s*\([^;{}]*\)[^;{}()]*;", code):
        start = max(code.rfind(c, 0, match.start()) for c in ";{}") + 1
        words = _words(code[start:match.start()], macros)
        if words & marks:
            found.setdefault(match.group(1), set()).update(_spaces_of(words))
    return found


def _checked_body(code: str, function: Function) -> str:
    """The function's body as the check reads it: ``__device__`` lambdas and unevaluated operands blanked."""
    text, spans = code[function.body_start + 1:function.body_end], []
    for match in DEVICE_LAMBDA.finditer(text):
        brace = text.find("{", match.end())
        close = match_forward(text, brace) if brace >= 0 else -1
        if close > 0:
            spans.append((match.start(), close + 1))
    for match in UNEVALUATED.finditer(text):
        close = match_forward(text, match.end() - 1)
        if close > 0:
            spans.append((match.start(), close + 1))
    return blank_spans(text, spans)


def _own_names(code: str, function: Function, body: str) -> set:
    """What the function declares itself: its parameters and the names its body assigns or declares."""
    header = code[function.header_start:function.body_start]
    names = set(IDENTIFIER.findall(header[header.find("("):])) if "(" in header else set()
    names |= set(re.findall(r"\b([A-Za-z_]\w*)\s*=(?!=)", body))
    names |= set(re.findall(r"\b[A-Za-z_]\w*[\s*&]+([A-Za-z_]\w*)\s*[;,{\[]", body))
    return names


def check(text: str, structure: str, functions, macros: dict, filename: str) -> None:
    """``BuildError`` (nvcc's words, the student's line and a caret) for the first call across execution spaces in
    ``text``; ``structure`` is its code view with preprocessor lines blanked, ``functions`` what it defines,
    ``macros`` its ``#define``s (``scanning.macro_definitions``)."""
    code = _without_disabled(text, structure)
    # a function inside another's body is not one (C++ has none): a loop macro's block, a lambda, a local class
    outer = [f for f in functions
             if not any(g.body_start < f.header_start and f.body_end <= g.body_end for g in functions if g is not f)]
    by_name = {}
    for function in outer:
        by_name.setdefault(function.name, set()).update(
            _spaces_of(_words(code[function.header_start:function.body_start], macros)))
    for name, declared in _declared_spaces(code, macros).items():
        if name in by_name:
            by_name[name] |= declared
    using_std = re.search(r"\busing\s+namespace\s+std\b", code) is not None
    for function in outer:
        header = code[function.header_start:function.body_start]
        words = _words(header, macros)
        caller = _spaces_of(words)
        if "template" in words and not re.search(r"\b" + re.escape(function.name) + r"\b",
                                                  code[:function.header_start] + code[function.body_end + 1:]):
            continue  # a template the file never uses: nvcc compiles none of it
        if caller == {"global"} and "void" not in words:
            _refuse(text, function.header_start + len(header) - len(header.lstrip()), filename,
                    f'a __global__ function must have a void return type ("{function.name}")',
                    "a kernel returns nothing: it writes its results through the pointers it is given")
        if "host" in caller and "device" in caller:
            continue  # __host__ __device__: nvcc checks each use where it is compiled for one side
        body = _checked_body(code, function)
        own = _own_names(code, function, body)
        base = function.body_start + 1
        for match in _CALL.finditer(body):
            name = match.group(1)
            last = _skip_space_back(body, match.start() - 1)  # what stands before the name, read back from it
            word_before, _ = _identifier_ending_at(body, last)
            if (name in CONTROL_WORDS or name in own or body[max(last - 1, 0):last + 1].endswith((".", "->", "::", "~"))
                    or (word_before and word_before not in CALL_AFTER)):
                continue  # a member, a qualified name, a name of its own, or a declaration (``float total(0.f)``)
            if "host" in caller and (name in STD_NAMES or (using_std and name not in DEVICE_BUILTINS)):
                continue
            if caller == {"host"} and name in DEVICE_BUILTINS and name not in by_name:
                _refuse(text, base + match.start(), filename,
                        f'calling a __device__ function("{name}") from a __host__ function("{function.name}") is '
                        f"not allowed", f"`{name}` is for the threads of a kernel: call it in the kernel")
            callee = by_name.get(name)
            if callee is None:
                continue
            if callee == {"global"}:
                _refuse(text, base + match.start(), filename, f'a __global__ function call must be configured '
                        f'("{name}")', f"launch a kernel with its grid and block: "
                        f"{name}<<<blocks, threads, 0, stream>>>(...)")
            if "host" in caller and callee == {"device"}:
                _refuse(text, base + match.start(), filename,
                        f'calling a __device__ function("{name}") from a __host__ function("{function.name}") is '
                        "not allowed", "a __device__ function runs on the GPU only: call it from a kernel, or mark "
                        "it __host__ __device__ to call it from both")
            if "host" not in caller and callee == {"host"} and name not in STD_NAMES:
                space = "__global__" if "global" in caller else "__device__"
                _refuse(text, base + match.start(), filename,
                        f'calling a __host__ function("{name}") from a {space} function("{function.name}") is not '
                        f"allowed", f"mark `{name}` __device__ (or __host__ __device__ to call it from the launcher "
                        f"too): a function without a mark is host code, which a GPU thread cannot call")
        if caller == {"host"}:
            used = re.search(r"(?<![\w.>:])(" + "|".join(THREAD_INDEX) + r")\s*\.\s*[xyz]\b", body)
            if used and used.group(1) not in own:
                _refuse(text, base + used.start(), filename,
                        f'"{used.group(1)}" is device code\'s: the host function "{function.name}" has no thread '
                        f"or block index", "read it in a kernel; a launcher sizes its grid from the problem's sizes")


def _refuse(text: str, offset: int, filename: str, message: str, hint: str) -> None:
    line = line_of(text, offset)
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    quoted = [f"{filename}:{line}:{column}: error: {message}",
              *diagnostics.quote_line(text.split("\n")[line - 1], line, column)]
    shown = "\n".join(quoted)
    raise BuildError(f"{filename} would not compile for a GPU (1 error: nvcc refuses it, so the CPU emulation does "
                     f"too):\n{shown}\n{hint}.", diagnostics=shown)
