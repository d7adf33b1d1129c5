"""The kernels a lab notebook's graded run builds, read from the instructor's notebook without running it.

A notebook builds its kernels one cell after another (``fuselab.build(FUSED_SOURCE, [lab0.FUSED], name="fused")``),
each build seconds of compiler time. The grader compiles them side by side before those cells run
(``kernelbuild.compile_ahead``), and each cell's build then finds its library done. What this module says is a
plan, never a verdict: a build it misses or gets wrong is compiled by its cell, as without it.

A build is planned where the instructor's cell calls ``build`` (``fuselab.build``) with a ``*_SOURCE`` name or a
lab's attribute (``lab0.REFERENCE_UNFUSED_SOURCE``) as its text, launchers written as a lab's attribute, a list of
them or an item of one (``lab1.SOLUTION_SOURCES["CONV_SOURCE"]``), and a literal ``name=``; not in a demo cell,
and not behind a test of ``GRADING`` (the optional tuned parts, which a graded run does not build).
"""

from __future__ import annotations

import ast

from .. import notebook as ipynb
from ..notebook_sources import string_assignments
from . import registry


def notebook_builds(instructor_notebook, values: dict | None = None, only_values: bool = False) -> list:
    """``[{"source", "launchers", "name"}]``: the builds of ``instructor_notebook``'s graded run, a ``*_SOURCE``
    text taken from ``values`` (a submission's, say; default: the instructor's own), each build once.
    ``only_values``: only the builds of those texts (a student's), not of the lab's own fixed kernels."""
    values = string_assignments(instructor_notebook) if values is None else values
    planned, seen = [], set()
    for cell in ipynb.load(instructor_notebook)["cells"]:
        if cell.get("cell_type") != "code" or ipynb.is_demo(cell):
            continue
        try:
            tree = ast.parse(ipynb.text(cell.get("source")))
        except SyntaxError:
            continue
        for call in _ungated_build_calls(tree):
            build = _planned(call, values, only_values)
            if build is not None and (build["source"], build["name"]) not in seen:
                seen.add((build["source"], build["name"]))
                planned.append(build)
    return planned


def _ungated_build_calls(tree) -> list:
    """The ``build(...)`` calls of a cell that do not sit under a test naming ``GRADING``."""
    calls = []

    def visit(node, gated):
        if isinstance(node, (ast.If, ast.IfExp)) and any(isinstance(n, ast.Name) and n.id == "GRADING"
                                                         for n in ast.walk(node.test)):
            gated = True
        if isinstance(node, ast.Call) and not gated and _called_name(node.func) == "build":
            calls.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child, gated)
    visit(tree, False)
    return calls


def _called_name(func) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _planned(call, values, only_values) -> dict | None:
    names = [k.value.value for k in call.keywords if k.arg == "name" and isinstance(k.value, ast.Constant)]
    if len(call.args) != 2 or len(names) != 1 or not isinstance(names[0], str) or \
            any(k.arg not in ("name",) for k in call.keywords):
        return None  # a backend, flags or a timeout of its own: built by its cell alone
    text, source = call.args
    if isinstance(text, ast.Name):
        source_text = values.get(text.id)
    else:
        source_text = None if only_values else _lab_value(text)
    launchers = _lab_value(source)
    if not isinstance(source_text, str) or not isinstance(launchers, list) or \
            not all(isinstance(p, str) for p in launchers):
        return None
    return {"source": source_text, "launchers": list(launchers), "name": names[0]}


def reference_builds(lab_name: str) -> list:
    """The lab's fixed kernels as builds (``Lab.reference_sources``), some built by its helpers rather than a
    notebook's own ``build`` call (``lab2.build_reference``)."""
    return [{"source": source, "launchers": list(launchers), "name": name}
            for name, (source, launchers) in registry.lab(lab_name).reference_sources.items()]


def _lab_value(node):
    """The value of ``labN.NAME``, ``labN.NAME["key"]`` or a list of those, from the lab's package; else None."""
    if isinstance(node, ast.List):
        items = [_lab_value(item) for item in node.elts]
        return None if any(item is None for item in items) else items
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        whole = _lab_value(node.value)
        return whole.get(node.slice.value) if isinstance(whole, dict) else None
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            node.value.id in registry.lab_names():
        return getattr(registry.lab(node.value.id).module(), node.attr, None)
    return None
