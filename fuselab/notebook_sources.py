"""Read the CUDA sources out of a lab notebook without running it.

Labs keep each kernel source as a string assigned in a code cell (``FUSED_SOURCE = r'''...'''``). The GPU
self-check builds the instructor's kernels from ``solutions/`` this way, and the grader's clean recheck builds a
student's kernels from the submitted notebook the same way, outside the student's Python process.
"""

from __future__ import annotations

import ast

from . import notebook as ipynb


def cell_sources(notebook) -> list:
    return ipynb.code_sources(notebook)


def string_assignments(notebook, suffix="_SOURCE") -> dict:
    """``{NAME: text}`` for every top-level ``NAME = "<string literal>"`` whose NAME ends with ``suffix``.

    A cell that does not parse (a student's syntax error, an IPython magic) is skipped; the last assignment of a
    name wins, as it would when the notebook runs top to bottom.
    """
    found = {}
    for source in cell_sources(notebook):
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id.endswith(suffix) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):
                found[node.targets[0].id] = node.value.value
    return found
