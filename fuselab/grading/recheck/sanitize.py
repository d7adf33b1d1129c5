"""A first look at a student's solution cell, read with ``ast`` and never run: what a teaching assistant should see.

It decides nothing. The clean recheck runs every solution cell as written, in the solution worker, a process of
its own that the checker only exchanges plain data with (``recheck``, ``wire``): whatever a cell does there, it
cannot reach a test, a reference or a verdict. This module only *flags* cells that reach for the machinery, so
that the report shows the attempt:

- names that only tampering needs (``sys.modules``, ``builtins``, ``exec``/``eval``/``compile``, ``ctypes``,
  ``globals()``, ``setattr`` on something it did not create, ``importlib``, ``__import__``...);
- touching ``fuselab`` from a solution cell;
- dunder attributes that reach into the interpreter (``__globals__``, ``__subclasses__``, ``__builtins__``...);
- kernel source text (a string in the cell) that maps or protects memory itself (``mmap``, ``mprotect``,
  ``PROT_EXEC``...): native code can copy machine code into memory it makes executable and run any system call
  from there, which no check of its imports sees (``native_check``); the kernel worker runs it contained by the
  sandbox alone, and the TA may want to read it.

Honest idioms are never flagged: ``getattr(x, "a", default)``, assigning attributes of objects a function made
(``fused.weight = nn.Parameter(...)`` after ``copy.deepcopy``), ``import copy``, module-level constants that
are not literals (``BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d)``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

TAMPERING_NAMES = {"sys", "builtins", "__builtins__", "__import__", "importlib", "exec", "eval", "compile",
                   "globals", "ctypes", "gc", "inspect", "get_ipython", "setattr", "delattr", "subprocess",
                   "fuselab", "breakpoint", "vars", "locals"}
TAMPERING_ATTRIBUTES = {"__globals__", "__builtins__", "__subclasses__", "__code__", "__closure__", "__dict__",
                        "__class__", "__bases__", "__mro__", "__setattr__", "__getattribute__", "__import__",
                        "__init_subclass__", "__set_name__", "__class_getitem__", "__reduce__", "__reduce_ex__",
                        "f_globals", "f_back", "f_locals", "gi_frame", "tb_frame", "modules"}


# in a kernel's source: what makes memory executable, or maps it, by the library's own hand
EXECUTABLE_MEMORY = re.compile(r"\b(mmap|mmap64|mprotect|pkey_mprotect|mremap|memfd_create|PROT_EXEC|MAP_ANON"
                               r"|MAP_ANONYMOUS|MAP_FIXED)\b")


@dataclass
class Sanitized:
    source: str                                   # the cell as written (it runs as written)
    flags: list = field(default_factory=list)     # what looks like tampering, for the report
    error: str | None = None                      # the cell does not parse


def _flag(node) -> str | None:
    """Why ``node`` looks like it reaches for the grading machinery, or None."""
    if isinstance(node, ast.Name) and node.id in TAMPERING_NAMES:
        return f"uses {node.id!r}"
    if isinstance(node, ast.Attribute) and node.attr in TAMPERING_ATTRIBUTES:
        return f"uses the attribute {node.attr!r}"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in TAMPERING_ATTRIBUTES:
        return f"names the attribute {node.value!r}"
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        bad = [m for m in modules if m.split(".")[0] in TAMPERING_NAMES | {"os"}]
        if isinstance(node, ast.ImportFrom):
            bad += [a.name for a in node.names if a.name in ("methodcaller", "attrgetter")]
        if bad:
            return f"imports {', '.join(bad)}"
    if isinstance(node, ast.Attribute) and node.attr in ("methodcaller", "attrgetter"):
        return f"uses operator.{node.attr}"
    return None


def sanitize_cell(source: str) -> Sanitized:
    """Flags for one solution cell (see the module doc); the source itself is returned unchanged."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return Sanitized(source=source, error=f"does not parse: {exc.msg} (line {exc.lineno})")
    out = Sanitized(source=source)
    seen = set()
    modules = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
               if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    for statement in tree.body:
        for node in ast.walk(statement):
            why = _flag(node) or _patches_module(node, modules)
            if why and why not in seen:
                seen.add(why)
                where = getattr(statement, "name", None) or f"line {statement.lineno}"
                text = (ast.get_source_segment(source, node) or "").splitlines()[:1]
                shown = f" `{text[0][:80]}`" if text and not isinstance(node, ast.Name) else ""
                out.flags.append(f"{where}:{shown} {why} (flagged for a teaching assistant; it runs in the "
                                 "solution worker, where it cannot reach the tests)")
    for node in ast.walk(tree):
        found = EXECUTABLE_MEMORY.search(node.value) if isinstance(node, ast.Constant) and \
            isinstance(node.value, str) else None
        if found and f"native {found.group(0)}" not in seen:
            seen.add(f"native {found.group(0)}")
            out.flags.append(f"line {node.lineno}: its kernel source calls or names `{found.group(0)}`: native "
                             "code that maps or protects memory itself can run machine code no check of its "
                             "imports sees (flagged for a teaching assistant: the kernel worker that runs it "
                             "is contained by the sandbox alone)")
    return out


def _patches_module(node, modules) -> str | None:
    """An assignment to an attribute of an imported module (a monkeypatch), e.g. ``fl.check = ...``."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for target in targets:
            base = target
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            if isinstance(target, ast.Attribute) and isinstance(base, ast.Name) and base.id in modules:
                return f"rebinds an attribute of the module {base.id!r}"
    return None
