"""Demo cells: what the clean recheck leaves out of the instructor's notebook.

A cell tagged ``demo`` (JupyterLab's cell tags) only shows something to a student: a figure, a table, a timing on
the student's own GPU. Its verdict-free work would cost every submission's recheck twice (the checker and the
kernel worker both run such cells), so the recheck skips it. That is safe only if no cell the recheck keeps
depends on it, which ``demo_problems`` checks of the notebook's code, before anything runs: a name a demo cell
binds that a later kept cell reads (in the cell's own scope and in its functions, read before bound counts as
read), a demo that is graded, a solution or the setup cell, a demo that changes state it did not create (an
assignment to or ``del`` of an attribute or item of a name it did not make, ``setattr``, ``global``, a submodule
import), and cells with IPython magics (what they read is unknown). It cannot see a method call that changes an
object in place (``model.eval()``) or an alias (``c = cfg; c["n"] = 2``): a demo must not do that, and the
reference run, which runs the plan every student's recheck runs, would show it.
nbgrader's own run of a notebook runs every cell, demos included.
"""

from __future__ import annotations

import ast

from ... import notebook as ipynb


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _scope_reads(node) -> set:
    """The names a nested scope (a function, class, lambda or comprehension) reads from the cell's scope: what it
    loads less what it binds itself (its arguments, assignments, loop targets), plus what it declares global."""
    loads, local, declared = set(), set(), set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            (loads if isinstance(inner.ctx, (ast.Load, ast.Del)) else local).add(inner.id)
        elif isinstance(inner, ast.arg):
            local.add(inner.arg)
        elif isinstance(inner, (ast.Global, ast.Nonlocal)):
            declared.update(inner.names)
        elif isinstance(inner, (ast.Import, ast.ImportFrom)):
            local.update((alias.asname or alias.name).split(".")[0] for alias in inner.names)
        elif isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and inner is not node:
            local.add(inner.name)
    return (loads - local) | (loads & declared)


def _statement_names(statement) -> tuple:
    """``(reads, binds)`` of one top-level statement in the cell's scope. What a nested scope reads counts as read
    here (a function may be called at once); a name both read and bound counts as read (``x = x.cuda()``,
    ``n += 1``, ``del x``: the statement needs the name to be there)."""
    reads, binds = set(), set()

    def visit(node):
        if isinstance(node, ast.Name):
            (binds if isinstance(node.ctx, ast.Store) else reads).add(node.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            reads.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            binds.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        if isinstance(node, _SCOPES):
            reads.update(_scope_reads(node))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                binds.add(node.name)
            # decorators, defaults, bases and a comprehension's first iterable run in the cell's scope
            outer = [*getattr(node, "decorator_list", []), *getattr(node, "bases", []),
                     *[k.value for k in getattr(node, "keywords", [])]]
            arguments = getattr(node, "args", None)
            if isinstance(arguments, ast.arguments):
                outer += [*arguments.defaults, *[d for d in arguments.kw_defaults if d is not None]]
            if getattr(node, "generators", None):
                outer.append(node.generators[0].iter)
            for part in outer:
                visit(part)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(statement)
    return reads, binds


def _parse(source: str):
    """The cell's syntax tree; a cell with IPython magics or shell lines is refused (ValueError): what they read
    cannot be checked."""
    from .cellrunner import _without_magics
    code = _without_magics(source)
    if code != source:
        raise ValueError("it holds IPython magics or shell lines, which the check cannot read")
    return ast.parse(code)


_BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)


def _block(statements, bound: set) -> tuple:
    """``(read, may_bind, binds)`` of a list of statements run in order, ``bound`` being what is bound before them:
    the names read before this block bound them, every name it may bind, and those it binds whichever way it runs.
    Inside ``if``/``for``/``while``/``with``/``try``, each body is read in order too; only a ``with`` body, and
    names every branch of an ``if`` binds, surely bind."""
    read, may_bind, binds = set(), set(), set()
    for statement in statements:
        now = bound | binds
        if isinstance(statement, _BLOCKS):
            header = [getattr(statement, "test", None), getattr(statement, "iter", None),
                      *[item.context_expr for item in getattr(statement, "items", [])]]
            for part in header:
                if part is not None:
                    reads, _ = _statement_names(part)
                    read |= reads - now
            targets = [getattr(statement, "target", None),
                       *[item.optional_vars for item in getattr(statement, "items", [])]]
            target_binds = set().union(*(_statement_names(t)[1] for t in targets if t is not None))
            bodies = [statement.body, statement.orelse if hasattr(statement, "orelse") else [],
                      *[handler.body for handler in getattr(statement, "handlers", [])],
                      getattr(statement, "finalbody", [])]
            outcomes = [_block(body, now | target_binds) for body in bodies]
            for body_read, body_may, _ in outcomes:
                read |= body_read
                may_bind |= body_may
            may_bind |= target_binds
            if isinstance(statement, (ast.With, ast.AsyncWith)):
                binds |= target_binds | outcomes[0][2]
            elif isinstance(statement, ast.If) and statement.orelse:
                binds |= outcomes[0][2] & outcomes[1][2]
            continue
        reads, names = _statement_names(statement)
        read |= reads - now
        may_bind |= names
        binds |= names
    return read, may_bind, binds


def _names(tree) -> tuple:
    """``(bound, read, surely_bound)``: every name a cell (its syntax tree) may bind in its own scope, the names it
    reads before it binds them itself (in order, statement by statement), and the names it binds whichever way it
    runs."""
    read, may_bind, binds = _block(tree.body, set())
    return may_bind, read, binds


def _changes_shared_state(tree, bound: set, read_first: set) -> str:
    """What in a demo cell (its syntax tree, the names it may bind and those it reads before binding them)
    changes state it did not create, or "": an assignment to (or ``del`` of) an attribute or an item of a name it
    did not bind by assignment itself, ``setattr``/``delattr`` of one, ``global``, or an import of a submodule
    (which makes it an attribute of its package for every later cell)."""
    imported = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    own = bound - read_first - imported  # made here, not a module or a name it found

    def root(node):
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            return f"declares {', '.join(node.names)} global"
        if isinstance(node, ast.Import) and any("." in alias.name for alias in node.names) or \
                isinstance(node, ast.ImportFrom) and (node.level or "." in (node.module or "")):
            return f"imports a submodule ({ast.unparse(node)})"
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)) else []
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, (ast.Attribute, ast.Subscript)) and root(part) not in own:
                    return f"changes {ast.unparse(part)}, which it did not create"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("setattr", "delattr") and node.args and root(node.args[0]) not in own:
            return f"calls {node.func.id} on {ast.unparse(node.args[0])}, which it did not create"
    return ""


def demo_problems(cells: list) -> list:
    """Why the recheck could not leave out the ``demo`` cells of ``cells`` (a notebook's code cells, in order):
    a list of sentences naming the cells, empty when it can."""
    problems, demo_bound = [], {}   # name → the demo cell that bound it last
    for index, cell in enumerate(cells):
        label = ipynb.grade_id(cell) or f"cell {index}"
        source = ipynb.source(cell)
        try:
            tree = _parse(source)
            bound, read, surely = _names(tree)
        except (SyntaxError, ValueError) as exc:
            if demo_bound or ipynb.is_demo(cell):  # a demo before it: what it reads must be known
                why = exc if isinstance(exc, ValueError) and not isinstance(exc, SyntaxError) else "does not parse"
                problems.append(f"{'demo cell' if ipynb.is_demo(cell) else 'cell'} {label}: {why}")
            continue
        if ipynb.is_demo(cell):
            if index == 0 or ipynb.is_graded(cell) or ipynb.is_solution(cell):
                problems.append(f"demo cell {label} is the setup cell, a graded cell or a solution cell: only a "
                                "cell that shows something may be a demo")
            change = _changes_shared_state(tree, bound, read)
            if change:
                problems.append(f"demo cell {label} {change}: later cells could depend on that")
            demo_bound.update({name: label for name in bound})
            continue
        used = sorted(name for name in read if name in demo_bound)
        if used:
            problems.append(f"cell {label} reads {', '.join(used)}, bound by demo cell(s) "
                            f"{', '.join(sorted({demo_bound[n] for n in used}))}: untag the demo, or bind them here")
        for name in surely:
            demo_bound.pop(name, None)  # bound again by a kept cell, whichever way it runs: later cells read that one
    return problems
