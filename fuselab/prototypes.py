"""Launcher prototypes: the C signatures a lab fixes and the student implements.

A lab declares each host launcher as a C prototype, for example::

    void add(const float* a /*[n]*/, const float* b /*[n]*/, float* out /*[n]*/, int n, cudaStream_t stream)

From that text fuselab knows everything the tensor glue needs: which arguments are tensors (pointers), their
dtype (the pointee type), whether the kernel may write them (no ``const``), the optional shape annotation in a
trailing comment (named or numeric dimensions, checked for rank and consistency across arguments), which
arguments are plain numbers, and where the stream goes.

An integer parameter named like a dimension (``int H`` beside ``x /*[N, C, H, W]*/``) must equal that size on
every call. A dimension that follows from others is declared with its rule, in C's integer arithmetic::

    float* y /*[N, K, P = (H + 2*pad - R)/stride + 1, Q = (W + 2*pad - S)/stride + 1]*/

(or as a bare expression, ``/*[N, C, H - 2, W - 2]*/``); its names are other dimensions or integer parameters. The same text, comments included, is valid C, so the
build can also declare it ``extern "C"`` in front of the student's code: a launcher written with another
signature then fails to compile at the student's own line.
"""

from __future__ import annotations

import ast
import ctypes
import re
from dataclasses import dataclass

import torch

# Pointee types a tensor argument may have, and the dtype the tensor must then have.
POINTER_DTYPES = {
    "float": torch.float32,
    "double": torch.float64,
    "__half": torch.float16,
    "half": torch.float16,
    "__nv_bfloat16": torch.bfloat16,
    "int": torch.int32,
    "int32_t": torch.int32,
    "unsigned": torch.int32,
    "unsigned int": torch.int32,
    "uint32_t": torch.int32,
    "int64_t": torch.int64,
    "long": torch.int64,
    "long long": torch.int64,
    "int16_t": torch.int16,
    "int8_t": torch.int8,
    "signed char": torch.int8,
    "uint8_t": torch.uint8,
    "unsigned char": torch.uint8,
    "bool": torch.bool,
    "void": None,  # any dtype
}

# Scalar parameter types, with the ctypes type that carries them and the Python types accepted.
SCALAR_TYPES = {
    "int": (ctypes.c_int32, int),
    "int32_t": (ctypes.c_int32, int),
    "unsigned": (ctypes.c_uint32, int),
    "unsigned int": (ctypes.c_uint32, int),
    "uint32_t": (ctypes.c_uint32, int),
    "int64_t": (ctypes.c_int64, int),
    "long": (ctypes.c_int64, int),
    "long long": (ctypes.c_int64, int),
    "size_t": (ctypes.c_size_t, int),
    "float": (ctypes.c_float, float),
    "double": (ctypes.c_double, float),
    "bool": (ctypes.c_bool, bool),
}

STREAM_TYPE = "cudaStream_t"

_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}
_IDENT = r"[A-Za-z_]\w*"


class PrototypeError(ValueError):
    """A launcher prototype that fuselab cannot turn into tensor glue."""


@dataclass(frozen=True)
class Param:
    name: str
    base_type: str  # without qualifiers and '*'
    pointer: bool
    const: bool
    dims: tuple = ()  # shape annotation, e.g. ("N", "C", 3, 3); empty when not annotated
    rules: tuple = ()  # (dimension, expression) for dimensions that follow from others, e.g. ("P", "(H - R) + 1")

    @property
    def is_stream(self) -> bool:
        return self.base_type == STREAM_TYPE and not self.pointer

    @property
    def is_tensor(self) -> bool:
        return self.pointer

    @property
    def dtype(self):
        return POINTER_DTYPES[self.base_type]

    @property
    def c_type(self) -> str:
        return ("const " if self.const else "") + self.base_type + ("*" if self.pointer else "")

    def describe(self) -> str:
        shape = f" with shape [{', '.join(map(str, self.dims))}]" if self.dims else ""
        if self.is_tensor:
            dtype = str(self.dtype).replace("torch.", "") if self.dtype is not None else "any dtype"
            role = "input" if self.const else "output"
            return f"{self.name}: {role} tensor of {dtype}{shape} (C type `{self.c_type}`)"
        return f"{self.name}: {self.base_type} number"


@dataclass(frozen=True)
class Prototype:
    name: str
    return_type: str
    params: tuple
    text: str  # the prototype as written, comments included

    @property
    def call_params(self):
        """The parameters a Python caller passes: all but the stream, which fuselab fills in."""
        return tuple(p for p in self.params if not p.is_stream)

    @property
    def declaration(self) -> str:
        return self.text.strip().rstrip(";") + ";"

    def signature(self) -> str:
        return f"{self.name}({', '.join(p.name for p in self.call_params)})"


def parse(text: str) -> Prototype:
    """Parse one C prototype such as ``void add(const float* a, float* out, int n, cudaStream_t s)``."""
    match = re.fullmatch(rf"\s*(?:extern\s+\"C\"\s+)?(\w[\w\s]*?)\s+({_IDENT})\s*\((.*)\)\s*;?\s*", text, re.S)
    if not match:
        raise PrototypeError(f"not a C function prototype: {text!r}")
    return_type, name, body = match.groups()
    if return_type.split()[-1] not in ("void", "int", "cudaError_t"):
        raise PrototypeError(f"launcher {name} must return void, int or cudaError_t, not {return_type}")
    params = tuple(_parse_param(chunk, name) for chunk in _split_params(body))
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise PrototypeError(f"launcher {name} has two parameters with the same name")
    if sum(p.is_stream for p in params) > 1:
        raise PrototypeError(f"launcher {name} takes more than one cudaStream_t")
    _check_rules(name, params)
    return Prototype(name=name, return_type=return_type.strip(), params=params, text=text)


def parse_all(texts) -> tuple:
    if isinstance(texts, (str, Prototype)):
        texts = [texts]
    protos = tuple(t if isinstance(t, Prototype) else parse(t) for t in texts)
    names = [p.name for p in protos]
    if len(set(names)) != len(names):
        raise PrototypeError(f"two launchers share a name: {names}")
    if not protos:
        raise PrototypeError("a build needs at least one launcher prototype")
    return protos


def _split_params(body: str):
    """Split a parameter list at top-level commas, keeping each parameter's trailing comment."""
    chunks, depth, current, i = [], 0, "", 0
    while i < len(body):
        if body.startswith("/*", i):
            end = body.find("*/", i)
            end = len(body) if end < 0 else end + 2
            current += body[i:end]
            i = end
            continue
        ch = body[i]
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        if ch == "," and depth == 0:
            chunks.append(current)
            current = ""
        else:
            current += ch
        i += 1
    if current.strip() and current.strip() != "void":
        chunks.append(current)
    return chunks


def _parse_param(chunk: str, launcher: str) -> Param:
    dims, rules = (), ()
    comment = re.search(r"/\*\s*\[(.*?)\]\s*\*/", chunk, re.S)
    if comment:
        dims, rules = _parse_dims(comment.group(1), launcher)
    code = re.sub(r"/\*.*?\*/", " ", chunk, flags=re.S).strip()
    match = re.fullmatch(rf"(.*?)({_IDENT})", code, re.S)
    if not match or not match.group(1).strip():
        raise PrototypeError(f"launcher {launcher}: parameter {code!r} needs a type and a name")
    type_text, name = match.group(1), match.group(2)
    pointer = type_text.count("*")
    if pointer > 1 or "&" in type_text or "[" in type_text:
        raise PrototypeError(f"launcher {launcher}: parameter {name} must be a plain pointer or a number")
    words = type_text.replace("*", " ").split()
    const = "const" in words
    base = " ".join(w for w in words if w not in _QUALIFIERS)
    if pointer:
        if base not in POINTER_DTYPES:
            raise PrototypeError(f"launcher {launcher}: tensors of C type {base}* are not supported "
                                 f"(use one of {', '.join(sorted(POINTER_DTYPES))})")
    elif base != STREAM_TYPE and base not in SCALAR_TYPES:
        raise PrototypeError(f"launcher {launcher}: parameter {name} has unsupported type {base}")
    if dims and not pointer:
        raise PrototypeError(f"launcher {launcher}: only pointer parameters take a shape annotation")
    return Param(name=name, base_type=base, pointer=bool(pointer), const=const, dims=dims, rules=rules)


def _parse_dims(text: str, launcher: str):
    """``"N, C, P = (H - R)/stride + 1, 3"`` → dims ``("N", "C", "P", 3)`` and rules ``(("P", "(H - R)/stride + 1"),)``.

    A bare expression is a dimension named by its own text."""
    dims, rules = [], []
    for part in (d.strip() for d in text.split(",")):
        if not part:
            continue
        if part.isdigit():
            dims.append(int(part))
            continue
        named = re.fullmatch(rf"({_IDENT})\s*=\s*(.+)", part, re.S)
        if re.fullmatch(_IDENT, part):
            dims.append(part)
            continue
        key, expression = (named.group(1), named.group(2).strip()) if named else (part, part)
        try:
            expression_names(expression)
        except ValueError as exc:
            raise PrototypeError(f"launcher {launcher}: shape rule {part!r}: {exc}") from None
        dims.append(key)
        rules.append((key, expression))
    return tuple(dims), tuple(rules)


_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Mod: "%"}


def expression_names(expression: str) -> set:
    """The names a shape rule uses; ValueError if it is not integer arithmetic (+ - * / %, parentheses)."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and not (isinstance(node.value, int) and not isinstance(node.value, bool)):
            raise ValueError(f"only integer constants, not {node.value!r}")
        elif isinstance(node, ast.BinOp) and type(node.op) not in _OPERATORS:
            raise ValueError("only + - * / % and parentheses")
        elif isinstance(node, ast.UnaryOp) and not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise ValueError("only + - * / % and parentheses")
        elif not isinstance(node, (ast.Expression, ast.Name, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Load,
                                   ast.operator, ast.unaryop)):
            raise ValueError("only + - * / % and parentheses")
    return names


def evaluate(expression: str, values: dict) -> int:
    """A shape rule's value in C's integer arithmetic (``/`` and ``%`` truncate toward zero)."""
    def value(node):
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.UnaryOp):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        left, right = value(node.left), value(node.right)
        if isinstance(node.op, (ast.Div, ast.Mod)):
            if right == 0:
                raise ZeroDivisionError(f"division by zero in {expression}")
            quotient = abs(left) // abs(right) * (1 if (left < 0) == (right < 0) else -1)
            return quotient if isinstance(node.op, ast.Div) else left - quotient * right
        return {ast.Add: lambda: left + right, ast.Sub: lambda: left - right,
                ast.Mult: lambda: left * right}[type(node.op)]()
    return value(ast.parse(expression, mode="eval"))


def _check_rules(launcher: str, params) -> None:
    """Every name in a shape rule is a dimension of some tensor or an integer parameter."""
    known = {d for p in params for d in p.dims if isinstance(d, str)}
    known |= {p.name for p in params if not p.pointer and not p.is_stream and SCALAR_TYPES[p.base_type][1] is int}
    for param in params:
        for key, expression in param.rules:
            unknown = sorted(expression_names(expression) - known)
            if unknown:
                raise PrototypeError(f"launcher {launcher}: the shape rule {key} = {expression} of {param.name} "
                                     f"uses {', '.join(unknown)}, which is neither a dimension nor an integer "
                                     "parameter")
