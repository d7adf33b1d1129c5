"""Demo cells: what the clean recheck leaves out of the instructor's notebook.

A cell tagged ``demo`` (JupyterLab's cell tags) only shows something to a student: a figure, a table, a timing on
the student's own GPU. Its verdict-free work would cost every submission's recheck twice (the checker and the
kernel worker both run such cells), so the recheck skips it. That is safe only if no cell the recheck keeps
depends on it, which ``demo_problems`` checks of the notebook's code, before anything runs: a name a demo cell
binds that a later kept cell reads, a demo that is graded, a solution or the setup cell, or a demo that changes
state it did not create (``global``, an assignment to an attribute or an item of a name bound elsewhere).
nbgrader's own run of a notebook runs every cell, demos included.
"""

from __future__ import annotations

import ast

from .. import notebook as ipynb


def _names(source: str) -> tuple:
    """``(bound, read)``: the names a cell's code binds (assignments, definitions, imports, loop and ``with``
    targets) and the names it reads that it does not bind itself."""
    from .cellrunner import _without_magics
    tree = ast.parse(_without_magics(source))
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, read - bound


def _changes_shared_state(source: str, bound: set) -> str:
    """What in a demo cell changes state it did not create, or ""."""
    from .cellrunner import _without_magics
    for node in ast.walk(ast.parse(_without_magics(source))):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            return f"declares {', '.join(node.names)} global"
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, (ast.Attribute, ast.Subscript)):
                root = target
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root = root.value
                if not (isinstance(root, ast.Name) and root.id in bound):
                    return f"assigns to {ast.unparse(target)}, which it did not create"
    return ""


def demo_problems(cells: list) -> list:
    """Why the recheck could not leave out the ``demo`` cells of ``cells`` (a notebook's code cells, in order):
    a list of sentences naming the cells, empty when it can."""
    problems, demo_bound = [], {}   # name → the demo cell that bound it last
    for index, cell in enumerate(cells):
        label = ipynb.grade_id(cell) or f"cell {index}"
        source = ipynb.source(cell)
        try:
            bound, read = _names(source)
        except (SyntaxError, ValueError):
            if ipynb.is_demo(cell):
                problems.append(f"demo cell {label} does not parse")
            continue
        if ipynb.is_demo(cell):
            if index == 0 or ipynb.is_graded(cell) or ipynb.is_solution(cell):
                problems.append(f"demo cell {label} is the setup cell, a graded cell or a solution cell: only a "
                                "cell that shows something may be a demo")
            change = _changes_shared_state(source, bound)
            if change:
                problems.append(f"demo cell {label} {change}: later cells could depend on that")
            demo_bound.update({name: label for name in bound})
            continue
        used = sorted(name for name in read if name in demo_bound)
        if used:
            problems.append(f"cell {label} reads {', '.join(used)}, bound by demo cell(s) "
                            f"{', '.join(sorted({demo_bound[n] for n in used}))}: untag the demo, or bind them here")
        for name in bound:
            demo_bound.pop(name, None)  # bound again by a kept cell: later cells read that one
    return problems
