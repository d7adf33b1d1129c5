"""The source rewrites the header cannot do: each returns edits (start, end, replacement) on the original text.

Every replacement keeps the number of newlines of the text it replaces, so that line N of the output is
line N of the student's source and compiler messages point at the student's own lines.
"""

import re

from ...errors import UnsupportedConstruct
from .lexer import IDENTIFIER, in_spans, line_of, match_backward, match_forward, split_top_level
from .scanning import enclosing_functions


def keep_lines(original: str, replacement: str) -> str:
    """Pad ``replacement`` with the newlines it dropped from ``original``."""
    missing = original.count("\n") - replacement.count("\n")
    if missing < 0:
        raise AssertionError("a rewrite added lines")  # a translator bug, never a student's
    return replacement + "\n" * missing


class Rewriter:
    def __init__(self, text, code, structure, pp_spans, functions, analysis, filename):
        self.text, self.code, self.structure = text, code, structure
        self.pp_spans, self.functions, self.analysis = pp_spans, functions, analysis
        self.filename = filename
        self.edits = []

    def fail(self, construct, pos, hint=""):
        raise UnsupportedConstruct(construct, line_of(self.text, pos), self.filename, hint)

    def edit(self, start, end, replacement, pieces=(), search_from=0):
        """Replace text[start:end]. ``pieces``: spans of the original copied verbatim into ``replacement`` (in
        order, from ``search_from`` on), so that a compiler's column inside it maps back to the student's text."""
        placed, cursor = [], search_from
        for piece_start, piece_end in pieces:
            found = replacement.find(self.text[piece_start:piece_end], cursor)
            if found >= 0 and piece_end > piece_start:
                placed.append((found, piece_start, piece_end - piece_start))
                cursor = found + piece_end - piece_start
        self.edits.append((start, end, keep_lines(self.text[start:end], replacement), tuple(placed)))

    # ---- #pragma unroll: nvcc's hint; g++ would warn about it ----
    def pragmas(self):
        for start, end in self.pp_spans:
            if re.match(r"\s*#\s*pragma\s+(unroll|nounroll)\b", self.code[start:end]):
                self.edit(start, end, "")

    # ---- tokens with a different spelling on the host ----
    def tokens(self):
        for match in re.finditer(r"\bassert\s*\(", self.code):
            self.edit(match.start(), match.start() + len("assert"), "FUSELAB_EMU_ASSERT")
        for match in re.finditer(r"\b__noinline__\b", self.code):
            self.edit(match.start(), match.end(), "__attribute__((noinline))")

    # ---- cudaFuncSetAttribute(kernel, ...): the emulation keys the attribute by kernel name ----
    def func_attributes(self):
        for match in re.finditer(r"\bcudaFuncSetAttribute\s*\(", self.code):
            open_paren = match.end() - 1
            close = match_forward(self.code, open_paren)
            if close < 0:
                continue
            first_start, first_end = split_top_level(self.code, open_paren + 1, close, angle_brackets=True)[0]
            name = self.kernel_name(self.code[first_start:first_end])
            self.edit(match.start(), match.end(), f'::fuselab_emu::func_set_attribute("{name}", ')

    def kernel_name(self, expression):
        words = [w for w in IDENTIFIER.findall(expression)
                 if w not in {"const", "void", "reinterpret_cast", "static_cast", "char", "float", "int"}]
        for w in words:
            if w in self.analysis.kernels:
                return w
        return words[0] if words else "?"

    # ---- kernel<<<grid, block, shmem, stream>>>(args) ----
    def launches(self):
        for match in re.finditer(r"<<<", self.code):
            pos = match.start()
            if in_spans(pos, self.pp_spans):
                self.fail("a kernel launch inside a #define macro", pos, "write the launch in a function")
            enclosing = enclosing_functions(self.functions, pos)
            if any(f.is_device for f in enclosing):
                self.fail("dynamic parallelism (a kernel launch inside device code)", pos,
                          "launch every kernel from the host launcher")
            kernel_start = self.kernel_expression_start(pos)
            if kernel_start is None:
                self.fail("this form of kernel launch", pos, "write kernel<<<grid, block>>>(args)")
            config_end = self.find_config_end(pos + 3)
            if config_end < 0:
                self.fail("this form of kernel launch (no matching >>>)", pos)
            args_open = config_end + 3
            while args_open < len(self.code) and self.code[args_open].isspace():
                args_open += 1
            if self.code[args_open : args_open + 1] != "(":
                self.fail("this form of kernel launch (no argument list after >>>)", pos)
            args_close = match_forward(self.code, args_open)
            if args_close < 0:
                self.fail("this form of kernel launch (unbalanced parentheses)", pos)

            kernel = self.text[kernel_start:pos].strip()
            spans = [_stripped(self.text, a, b) for a, b in split_top_level(self.code, pos + 3, config_end)]
            parts = [self.text[a:b] for a, b in spans]
            if len(parts) < 2 or len(parts) > 4 or not all(parts):
                self.fail(f"a launch configuration with {len(parts)} values", pos,
                          "CUDA takes <<<grid, block[, shared bytes[, stream]]>>>")
            grid, block = parts[0], parts[1]
            shmem = parts[2] if len(parts) > 2 else "0"
            stream = parts[3] if len(parts) > 3 else "0"
            args = self.text[args_open + 1 : args_close]
            base = self.kernel_name(self.code[kernel_start:pos])
            fibers = "true" if self.analysis.needs_fibers(base) else "false"
            call_args = (", " + args) if args.strip() else ""
            site = f'::fuselab_emu::launch(::fuselab_emu::LaunchSite{{"{base}", __FILE__, __LINE__, {fibers}}}, '
            replacement = (
                site + f"{grid}, {block}, {shmem}, {stream}, "
                f"[&](auto&... fuselab_args) {{ {kernel}(fuselab_args...); }}{call_args})"
            )
            kernel_span = _stripped(self.text, kernel_start, pos)
            self.edit(kernel_start, args_close + 1, replacement,
                      pieces=[*spans, kernel_span, (args_open + 1, args_close)], search_from=len(site))

    def kernel_expression_start(self, pos):
        code, j = self.code, pos - 1
        while j >= 0 and code[j].isspace():
            j -= 1
        if j >= 0 and code[j] == ">":  # explicit template arguments
            depth = 0
            while j >= 0:
                if code[j] == ">":
                    depth += 1
                elif code[j] == "<":
                    depth -= 1
                    if depth == 0:
                        break
                elif code[j] in ")]":
                    j = match_backward(code, j)
                    if j < 0:
                        return None
                j -= 1
            j -= 1
            while j >= 0 and code[j].isspace():
                j -= 1
        end = j
        while j >= 0 and (code[j].isalnum() or code[j] in "_:"):
            j -= 1
        start = j + 1
        if start > end or not (code[start].isalpha() or code[start] in "_:"):
            return None
        return start

    def find_config_end(self, start):
        depth = 0
        for i in range(start, len(self.code)):
            c = self.code[i]
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
                if depth < 0:
                    return -1
            elif depth == 0 and self.code.startswith(">>>", i):
                return i
            elif c == ";":
                return -1
        return -1

    # ---- __device__ / __constant__ variables: kernel memory, in a section of their own ----
    def device_variables(self):
        """Tag each namespace-scope ``__device__``/``__constant__`` variable with ``FUSELAB_EMU_DEVICE_VARIABLE``:
        the emulation watches them as kernel memory (host code may write them only through
        ``cudaMemcpyToSymbol``). Functions, ``__managed__`` memory (the host may write it) and const objects (a
        read-only object in a writable section would not compile) are left as they are; so is a qualifier inside
        a macro, which the translator cannot follow."""
        tagged = set()
        for match in re.finditer(r"\b(__device__|__constant__)\b", self.structure):
            pos = match.start()
            if enclosing_functions(self.functions, pos):
                continue
            start = max(self.structure.rfind(c, 0, pos) for c in ";{}") + 1
            end = _declarator_end(self.structure, match.end())
            if start in tagged or end is None:
                continue
            head = self.structure[start:end]
            words = IDENTIFIER.findall(head)
            if "__managed__" in words or "constexpr" in words or _const_object(head):
                continue
            tagged.add(start)
            self.edit(match.start(), match.end(), f"{match.group(0)} FUSELAB_EMU_DEVICE_VARIABLE")

    # ---- __shared__ declarations ----
    def shared_declarations(self):
        for match in re.finditer(r"\b__shared__\b", self.code):
            pos = match.start()
            if in_spans(pos, self.pp_spans):
                self.fail("__shared__ inside a #define macro", pos, "declare shared arrays directly in the kernel")
            if not enclosing_functions(self.functions, pos):
                self.fail("__shared__ variables at file scope", pos, "declare them inside the kernel")
            start = max(self.structure.rfind(c, 0, pos) for c in ";{}") + 1
            while self.structure[start].isspace():
                start += 1
            end = self.structure.find(";", pos)
            if end < 0:
                self.fail("this __shared__ declaration (no closing ;)", pos)
            declaration = self.code[start:end]
            words = IDENTIFIER.findall(declaration)
            if "extern" in words:
                replacement = self.dynamic_shared(declaration, pos)
            else:
                replacement = self.static_shared(declaration, pos)
            self.edit(start, end + 1, replacement)

    def dynamic_shared(self, declaration, pos):
        cleaned = re.sub(r"\b(extern|__shared__|static)\b", " ", declaration)
        cleaned = re.sub(r"\b(__align__|alignas)\s*\([^)]*\)", " ", cleaned)
        cleaned = re.sub(r"__attribute__\s*\(\([^)]*\)\)", " ", cleaned)
        found = re.fullmatch(r"\s*(?P<type>.*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*\[\s*\]\s*", cleaned, re.S)
        if not found or not found.group("type").strip():
            self.fail("this extern __shared__ declaration", pos, "write: extern __shared__ float name[];")
        type_, name = " ".join(found.group("type").split()), found.group("name")
        return f"{type_}* const {name} = reinterpret_cast<{type_}*>(::fuselab_emu::dynamic_shared_memory());"

    def static_shared(self, declaration, pos):
        # Shared memory becomes a static thread_local: one copy per OS thread, and an OS thread runs one
        # block at a time. shared_static() fills it with garbage when each block first reaches it.
        cleaned = re.sub(r"\b(__shared__|static)\b", lambda m: " " * len(m.group(0)), declaration)
        names = []
        for a, b in split_top_level(cleaned, 0, len(cleaned), angle_brackets=True):
            part = cleaned[a:b]
            if re.search(r"(?<![=!<>])=(?!=)", _outside_brackets(part)):
                self.fail("an initializer on a __shared__ variable", pos,
                          "CUDA rejects it too: assign it in one thread, then __syncthreads()")
            bracket = _top_level_index(part, "[")
            head = part[:bracket] if bracket >= 0 else part
            idents = IDENTIFIER.findall(re.sub(r"\b(__align__|alignas|__attribute__)\s*\(.*?\)+", " ", head))
            if not idents:
                self.fail("this __shared__ declaration", pos)
            names.append(idents[-1])
        registrations = " ".join(f"::fuselab_emu::shared_static((void*)&({n}), sizeof({n}));" for n in names)
        return f"static thread_local {cleaned.strip()}; {registrations}"


ATTRIBUTE_WORDS = {"__align__", "alignas", "__attribute__", "__declspec", "__launch_bounds__", "decltype"}


def _declarator_end(code, pos):
    """Where a declaration that starts before ``pos`` shows itself a variable (its ``;``, ``=`` or ``{``), or None
    for a function (a ``(`` that is not an attribute's comes first)."""
    i = pos
    while i < len(code):
        c = code[i]
        if c in ";={":
            return i
        if c == "[":
            close = match_forward(code, i)
            if close < 0:
                return None
            i = close
        elif c == "(":
            word = re.search(r"([A-Za-z_]\w*)\s*$", code[max(0, i - 60):i])
            if not (word and word.group(1) in ATTRIBUTE_WORDS):
                return None
            close = match_forward(code, i)
            if close < 0:
                return None
            i = close
        i += 1
    return None


def _const_object(head):
    """Whether the declared object itself is const: ``const float x``, ``float* const p`` (not ``const float* p``)."""
    consts = [m.start() for m in re.finditer(r"\bconst\b", head)]
    return bool(consts) and consts[-1] > head.rfind("*")


def _stripped(text, start, end):
    """``(start, end)`` narrowed to text[start:end] without its surrounding whitespace."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _top_level_index(text, char):
    depth = 0
    for i, c in enumerate(text):
        if c == char and depth == 0:
            return i
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
    return -1


def _outside_brackets(text):
    out, depth = [], 0
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)
