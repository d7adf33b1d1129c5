"""A light C++ lexer: enough to find constructs in CUDA source without being fooled by comments and strings.

The translator never parses C++; it searches a *code view* of the source: the same text, of the same
length and with the same newlines, where comments and the insides of string and character literals are
blanked out. Offsets found in the view are valid in the original text.
"""

import re

IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def code_view(text: str) -> str:
    """Return ``text`` with comments and literal contents replaced by spaces (newlines kept)."""
    out = list(text)
    i, n = 0, len(text)

    def blank(start, end):
        for k in range(start, end):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "/" and text.startswith("//", i):
            end = i
            while end < n and text[end] != "\n":
                # a backslash-newline continues a line comment
                if text[end] == "\\" and end + 1 < n and text[end + 1] == "\n":
                    end += 2
                    continue
                end += 1
            blank(i, end)
            i = end
        elif c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            blank(i, end)
            i = end
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not _is_ident_char(text[i - 1])):
            match = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if not match:
                i += 1
                continue
            closing = ")" + match.group(1) + '"'
            end = text.find(closing, i + match.end())
            end = n if end < 0 else end + len(closing)
            blank(i + 2, end - 1)
            i = end
        elif c == '"' or c == "'":
            if c == "'" and i > 0 and _is_digit_separator(text, i):
                i += 1
                continue
            end = i + 1
            while end < n and text[end] != c and text[end] != "\n":
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
            blank(i + 1, end - 1)
            i = end
        else:
            i += 1
    return "".join(out)


def _is_ident_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def _is_digit_separator(text: str, i: int) -> bool:
    """A quote inside a number, as in 1'000'000, is a C++14 digit separator, not a character literal."""
    j = i - 1
    while j >= 0 and (text[j].isalnum() or text[j] in "_."):
        j -= 1
    token = text[j + 1 : i]
    return bool(token) and token[0].isdigit() and i + 1 < len(text) and text[i + 1].isalnum()


def line_of(text: str, pos: int) -> int:
    """1-based line number of offset ``pos``."""
    return text.count("\n", 0, pos) + 1


def preprocessor_spans(code: str):
    """(start, end) offsets of each preprocessor directive, continuation lines included."""
    spans = []
    for match in re.finditer(r"(?m)^[ \t]*#", code):
        start = match.start()
        end = start
        while True:
            newline = code.find("\n", end)
            if newline < 0:
                end = len(code)
                break
            if code[newline - 1 : newline] == "\\":
                end = newline + 1
                continue
            end = newline
            break
        spans.append((start, end))
    return spans


def in_spans(pos: int, spans) -> bool:
    return any(start <= pos < end for start, end in spans)


CLOSING = {"(": ")", "[": "]", "{": "}"}
OPENING = {v: k for k, v in CLOSING.items()}


def match_forward(code: str, pos: int) -> int:
    """Offset of the bracket closing the one at ``pos`` (``(``, ``[`` or ``{``), or -1."""
    stack = []
    for i in range(pos, len(code)):
        c = code[i]
        if c in CLOSING:
            stack.append(CLOSING[c])
        elif c in OPENING:
            if not stack or stack[-1] != c:
                return -1
            stack.pop()
            if not stack:
                return i
    return -1


def match_backward(code: str, pos: int) -> int:
    """Offset of the bracket opening the one that closes at ``pos``, or -1."""
    stack = []
    for i in range(pos, -1, -1):
        c = code[i]
        if c in OPENING:
            stack.append(OPENING[c])
        elif c in CLOSING:
            if not stack or stack[-1] != c:
                return -1
            stack.pop()
            if not stack:
                return i
    return -1


def split_top_level(code: str, start: int, end: int, angle_brackets: bool = False):
    """Split ``code[start:end]`` at commas outside brackets; returns (start, end) offset pairs."""
    parts, depth, angle, begin = [], 0, 0, start
    for i in range(start, end):
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif angle_brackets and depth == 0 and c == "<":
            angle += 1
        elif angle_brackets and depth == 0 and c == ">" and angle > 0:
            angle -= 1
        elif c == "," and depth == 0 and angle == 0:
            parts.append((begin, i))
            begin = i + 1
    parts.append((begin, end))
    return parts
