"""A NameError after a failed cell, explained where the student sees it.

In a notebook, a build cell that fails (``fused_mod = fuselab.build(...)`` raising ``BuildError``) leaves its names
undefined, and every later cell that uses them stops with a bare ``NameError: name 'fused' is not defined``, far
below the error that caused it. Inside IPython (JupyterLab, nbclient, nbgrader), ``install()`` remembers which
cells failed and what each one assigns, and a NameError for one of those names gets one sentence naming the
failed cell, its first line and its error. Outside IPython it does nothing. Nothing is written to stderr.

``student_traceback`` is how an error about the student's source (``BuildError``, ``NotWrittenError``) shows in
IPython: the frames of the student's own code (the cell line that called ``fuselab.build``) and the message with
its caret, without the frames of fuselab, torch and IPython that found it.
"""

from __future__ import annotations

import ast
import sys

_FAILED = []        # [(execution_count, first line, error type name, names the cell assigns)], oldest first
_INSTALLED = set()  # id() of the shells a hook is installed in


def _shell():
    if "IPython" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
    except Exception:  # noqa: BLE001 - a broken IPython must not break fuselab
        return None
    return get_ipython()


def assigned_names(source: str) -> set:
    """The names a cell's top-level code binds (assignments, for/with targets, defs, classes, imports)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()

    def targets(node):
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)

    def visit(statements):
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in getattr(node, "targets", None) or [node.target]:
                    targets(target)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                targets(node.target)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
            elif isinstance(node, ast.Expr):
                for sub in ast.walk(node.value):  # a walrus in an expression statement
                    if isinstance(sub, ast.NamedExpr):
                        targets(sub.target)
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(node, field, None) or [])
            for handler in getattr(node, "handlers", None) or []:
                visit(handler.body)

    visit(tree.body)
    return names


def explain_missing(name) -> str:
    """One sentence on why ``name`` is undefined when a failed cell assigns it (the latest such cell); else ""."""
    for count, first_line, error, names in reversed(_FAILED):
        if name in names:
            where = f"In [{count}]" if count else "a cell above"
            return (f"`{name}` is assigned by the cell {where} (`{first_line}`), which failed with {error}: fix "
                    f"that error first (scroll up to it), run that cell again, then this one.")
    return ""


def _remember(result) -> None:
    try:
        info = getattr(result, "info", None)
        source = getattr(info, "raw_cell", None) or ""
        shell = _shell()
        if shell is not None:
            try:
                source = shell.transform_cell(source)  # magics become Python
            except Exception:  # noqa: BLE001
                pass
        names = assigned_names(source)
        if not names:
            return
        # a cell that ran again replaces what an earlier run of it said
        _FAILED[:] = [f for f in _FAILED if f[3] != names]
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        if error is not None and not isinstance(error, NameError):
            first = next((line.strip() for line in source.splitlines()
                          if line.strip() and not line.strip().startswith("#")), "")
            first = first if len(first) <= 70 else first[:67] + "..."
            _FAILED.append((getattr(result, "execution_count", None), first, type(error).__name__, names))
    except Exception:  # noqa: BLE001 - a hint must never become an error of its own
        pass


def _name_error(shell, etype, value, tb, tb_offset=None):
    try:
        hint = explain_missing(getattr(value, "name", None))
        if hint and value.args and hint not in str(value.args[0]):
            value.args = (f"{value.args[0]}. {hint}",) + tuple(value.args[1:])
    except Exception:  # noqa: BLE001
        pass
    # IPython leaves the display to a custom handler: show it as any other error (an error output, not stderr)
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)
    return None


def install() -> None:
    """In an IPython kernel: remember failed cells, and explain a NameError for a name one of them assigns."""
    shell = _shell()
    if shell is None or id(shell) in _INSTALLED or not hasattr(shell, "set_custom_exc"):
        return
    if getattr(shell, "custom_exceptions", ()):
        return  # someone else's handler: leave it alone
    try:
        shell.events.register("post_run_cell", _remember)
        shell.set_custom_exc((NameError,), _name_error)
        _INSTALLED.add(id(shell))
    except Exception:  # noqa: BLE001
        pass


def _library_folders() -> tuple:
    """Where code that is not the student's lives: fuselab itself, the standard library, installed packages."""
    import sysconfig
    from pathlib import Path
    folders = {str(Path(__file__).resolve().parent)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            folders.add(str(Path(path).resolve()))
    return tuple(folder.rstrip("/") + "/" for folder in folders)


def _students(filename: str, folders: tuple) -> bool:
    from pathlib import Path
    if filename.startswith("<") and filename.endswith(">"):
        return not filename.startswith("<frozen")  # "<string>", an exec'd cell: theirs
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return True
    return not path.startswith(folders)


def _students_frames(tb, folders):
    """The traceback ``tb`` with only the student's own frames, or None where it has none."""
    import types
    kept = []
    while tb is not None:
        if _students(tb.tb_frame.f_code.co_filename, folders):
            kept.append(tb)
        tb = tb.tb_next
    trimmed = None
    for tb in reversed(kept):
        trimmed = types.TracebackType(trimmed, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    return trimmed


def student_traceback(error: BaseException) -> list:
    """IPython's rendering of ``error`` (its ``_render_traceback_``) with only the student's own frames: the
    traceback lines IPython would show, minus fuselab's, torch's and IPython's frames. An exception it was raised
    from (a ``CheckFailed`` from the candidate's first error) is shown the same way where the student's code raised
    it, and left out where it came from fuselab or torch alone (the message says what it was). Never raises: on
    any trouble, IPython's full rendering."""
    shell = _shell()
    if shell is None:
        import traceback
        return traceback.format_exception(type(error), error, error.__traceback__)
    saved = []  # (exception, traceback, cause, context, suppress): put back after rendering
    try:
        folders = _library_folders()
        top = _students_frames(error.__traceback__, folders)
        if top is None:  # nothing of the student's: called from a library, so show it whole
            return shell.InteractiveTB.structured_traceback(type(error), error, error.__traceback__, tb_offset=0)
        current, frames, seen = error, top, set()
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            saved.append((current, current.__traceback__, current.__cause__, current.__context__,
                          current.__suppress_context__))
            current.__traceback__ = frames
            chained = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
            chained_frames = _students_frames(chained.__traceback__, folders) if chained is not None else None
            if chained_frames is None:  # fuselab's or torch's own error: the message already says what it was
                current.__cause__, current.__context__, current.__suppress_context__ = None, None, True
                break
            current, frames = chained, chained_frames
        return shell.InteractiveTB.structured_traceback(type(error), error, error.__traceback__, tb_offset=0)
    except Exception:  # noqa: BLE001 - a shorter traceback must never cost the student the error itself
        _restore(saved)
        saved = []
        return shell.InteractiveTB.structured_traceback(type(error), error, error.__traceback__)
    finally:
        _restore(saved)


def _restore(saved) -> None:
    """Put back the tracebacks and chains ``student_traceback`` trimmed for rendering."""
    for exc, tb, cause, context, suppress in saved:
        exc.__traceback__, exc.__cause__, exc.__context__, exc.__suppress_context__ = tb, cause, context, suppress
