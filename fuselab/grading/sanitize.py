"""What of a student's solution cell the clean recheck keeps, read with ``ast`` and never run.

A solution cell may hold:

- string and number constants (``FUSED_SOURCE = r'''...'''``, ``EPS = 1e-5``): kept, re-emitted with ``repr``;
- ``def`` and ``class`` statements (a lab's Python part, e.g. Lab 2's BN fold): kept unless they reach for the
  machinery (see ``FORBIDDEN_NAMES``), then dropped and flagged;
- imports of plain computing modules (``math``, ``torch``, ``numpy``...): kept;
- anything else (prints, experiments, a monkeypatch): dropped. Dropped code that looks like tampering
  (assigning attributes of other objects, touching ``fuselab``, ``sys.modules``, ``builtins``...) is flagged.

So a solution cell that rebinds ``fuselab.check`` or a lab helper changes nothing in the clean grade, and the
teaching assistant sees the attempt in the report.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

ALLOWED_IMPORTS = {"math", "torch", "numpy", "functools", "itertools", "typing", "dataclasses", "collections",
                   "operator", "cmath", "fractions", "statistics"}
FORBIDDEN_NAMES = {"fuselab", "setattr", "delattr", "getattr", "globals", "locals", "vars", "sys", "builtins",
                   "__builtins__", "__import__", "importlib", "exec", "eval", "compile", "open", "os", "subprocess",
                   "ctypes", "gc", "inspect", "get_ipython", "input", "breakpoint", "memoryview"}
_DUNDER_OK = {"__init__", "__call__", "__repr__", "__str__", "__len__", "__getitem__", "__iter__", "__eq__",
              "__name__", "__post_init__"}


@dataclass
class Sanitized:
    source: str
    kept: list = field(default_factory=list)      # names defined
    dropped: list = field(default_factory=list)   # one line per dropped statement
    flags: list = field(default_factory=list)     # tampering attempts, for the report
    error: str | None = None                      # the cell does not parse


def _suspicious(node) -> str | None:
    """Why ``node`` looks like it reaches for the grading machinery, or None."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in FORBIDDEN_NAMES:
            return f"uses {sub.id!r}"
        if isinstance(sub, ast.Attribute) and sub.attr.startswith("__") and sub.attr not in _DUNDER_OK:
            return f"uses the special attribute {sub.attr!r}"
        if isinstance(sub, (ast.Global, ast.Nonlocal)):
            return "rebinds names outside itself (global/nonlocal)"
        if isinstance(sub, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in sub.names] if isinstance(sub, ast.Import) else [sub.module or ""]
            bad = [m for m in modules if m.split(".")[0] not in ALLOWED_IMPORTS]
            if bad:
                return f"imports {', '.join(bad)}"
        targets = []
        if isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
        if isinstance(sub, ast.Delete):
            targets = sub.targets
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                    return f"assigns the attribute {ast.unparse(t)!r} of another object"
    return None


def _is_constant(value) -> bool:
    try:
        ast.literal_eval(value)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def sanitize_cell(source: str) -> Sanitized:
    """The clean version of one solution cell (see the module doc)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return Sanitized(source="", error=f"does not parse: {exc.msg} (line {exc.lineno})")
    out = Sanitized(source="")
    lines = []
    for node in tree.body:
        text = ast.get_source_segment(source, node) or ast.unparse(node)
        first = text.strip().splitlines()[0][:100] if text.strip() else ""
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets) \
                and _is_constant(node.value):
            value = ast.literal_eval(node.value)
            names = [t.id for t in node.targets]
            lines.append(f"{' = '.join(names)} = {value!r}")
            out.kept += names
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            why = _suspicious(node)
            if why:
                out.flags.append(f"{node.name}: {why}; dropped from the clean recheck")
                out.dropped.append(first)
                continue
            lines.append(ast.unparse(node))
            out.kept.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and _suspicious(node) is None:
            lines.append(ast.unparse(node))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring or a bare string
        else:
            why = _suspicious(node)
            if why:
                out.flags.append(f"top-level code {first!r} {why}")
            out.dropped.append(first)
    out.source = "\n\n".join(lines) + ("\n" if lines else "")
    return out
