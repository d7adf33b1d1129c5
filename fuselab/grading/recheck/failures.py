"""What a failed test's verdict says: a visible test's error in full, a hidden test's only what it may say.

A hidden test runs the student's code on inputs the student must not see, and everything that run produces is
derived from them: an exception's message (``raise ValueError(repr(args))``, a shape formatted into it, the
values a check compared), what the code printed, its warnings. So for a failure in a hidden part of a test cell
the checker keeps none of that text. The verdict is built from three things the run cannot shape:

- the exception's type: the checker's own exception (a builtin or fuselab type: a student's exception class
  crosses from the solution worker as its nearest builtin type);
- where the student's own code raised it: a solution cell of the plan and a line within that cell (the solution
  worker names them; the checker keeps them only if they fit its own plan), or the kernel's launcher, named by
  the lab's prototype;
- a fixed sentence saying that hidden tests' details are not shown.

A failure is hidden when any line of the test cell it passed through is at or after the cell's first hidden line
(a visible helper called from the hidden part counts as hidden; no line of the cell at all counts as hidden too).
Visible tests keep their full messages. A test cell with hidden tests keeps none of its printed output.
"""

from __future__ import annotations

import itertools

from ...errors import HostWroteKernelMemory
from ...kernel_memory import FLAG as HOST_WROTE_KERNEL_MEMORY
from ...notebook import HIDDEN_MARK

HIDDEN_NOTE = ("Hidden tests' inputs, messages and output are not shown: try your code on cases of your own "
               "(odd sizes, size 1, a single channel, the edges) to find the one that fails.")
HIDDEN_OUTPUT = "(written while a test cell with hidden tests ran: not shown)"
# a refusal's reasons are the kernel worker's reply, which native code loaded there earlier could write: a hidden
# test names the refusal, never its reasons (a test that is not hidden shows them)
REFUSED_IN_HIDDEN = ("a kernel library this test uses was {mark}: its reasons are in the message of any test that "
                     "uses it and is not hidden")


def cell_label(cell: dict) -> str:
    """The name a plan cell runs under (its code's file name is ``<label>``), here and in the solution worker."""
    return f"cell {cell.get('grade_id') or cell.get('index')}"


def has_hidden_tests(source: str) -> bool:
    return HIDDEN_MARK in source


def hidden_start(source: str):
    """The first line (1-based) of the cell's first hidden test block, or None."""
    for number, line in enumerate(source.splitlines(), start=1):
        if HIDDEN_MARK in line:
            return number
    return None


def in_hidden_part(exc: BaseException, cell: dict) -> bool:
    start = hidden_start(cell.get("source", ""))
    if start is None:
        return False
    filename = f"<{cell_label(cell)}>"
    lines, trace = [], exc.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename == filename:
            lines.append(trace.tb_lineno or 0)
        trace = trace.tb_next
    return not lines or max(lines) >= start


def _chain(exc: BaseException):
    """``exc``, then the error it was raised from or while handling, and so on (each once: a chain may loop)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        yield exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__


def was_refused(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from or while handling, is the checker's ``NativeCodeRefused`` (a
    type no worker's error crosses as: those are rebuilt from builtin types only, ``wire``)."""
    from ...native_check import NativeCodeRefused
    return any(isinstance(link, NativeCodeRefused) for link in _chain(exc))


def verdict_message(exc: BaseException, cell: dict, plan_cells: list, limit: int) -> str:
    """The text a failed cell's verdict keeps: ``Type: message`` for a visible failure, else ``hidden_message``."""
    if not in_hidden_part(exc, cell):
        return f"{type(exc).__name__}: {exc}"[:limit]
    if was_refused(exc):
        from ...native_check import REFUSED_MARK
        return f"{type(exc).__name__}: " + REFUSED_IN_HIDDEN.format(mark=REFUSED_MARK)
    return hidden_message(exc, plan_cells)


def hidden_message(exc: BaseException, plan_cells: list) -> str:
    name = type(exc).__name__
    origin, raised = _origin(exc)
    where = _where(origin, plan_cells)
    # said even where the rest of a hidden test's error is not: it names no input, and without it the grader could
    # not tell a test that lost the shared GPU's memory to the others (``clean.retry_overruns`` runs it again
    # alone) from one that failed on its own; a kernel worker's launch that met it arrives as a RuntimeError
    memory = f" {GPU_MEMORY_RAN_OUT_SAID}" if any(says_gpu_memory_ran_out(str(link))
                                                 for link in itertools.islice(_chain(exc), 8)) else ""
    if where and raised is not exc:
        return f"{name} in a hidden test: your code raised {type(raised).__name__} {where}.{memory} {HIDDEN_NOTE}"
    if where:
        return f"{name} in a hidden test, raised {where}.{memory} {HIDDEN_NOTE}"
    what = " (the test's check of your result failed)" if isinstance(exc, AssertionError) else ""
    return f"{name} in a hidden test{what}.{memory} {HIDDEN_NOTE}"


def bound_names(cell: dict) -> set:
    """The names a plan cell binds at its top level (a solution cell: the names the lab takes from it): a later
    test that finds one of them missing failed because this cell did."""
    if cell.get("solution"):
        return set(cell.get("exports") or [])
    import ast
    try:
        tree = ast.parse(cell.get("source", ""))
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [item.optional_vars for item in node.items if item.optional_vars] if isinstance(node, ast.With)
                       else [node.target])
            names |= {t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def because(error: str, exc: BaseException, unbound: dict) -> str:
    """``error``, followed by why the name it missed is missing, where an earlier cell that should have bound it
    failed (a build error reaches each test that needed that build, as the compiler's own message)."""
    name = getattr(exc, "name", None) if isinstance(exc, NameError) else None
    if name not in unbound:
        return error
    return f"{error}: {unbound[name]}"


def host_wrote(launcher: str) -> HostWroteKernelMemory:
    """The error of a launch whose host code wrote kernel memory outside a kernel, for a cell that caught it."""
    error = HostWroteKernelMemory(f"{launcher}: {HOST_WROTE_KERNEL_MEMORY} (the test caught the error; it fails "
                                  "all the same)")
    error.fuselab_origin = ("kernel", launcher)
    return error


def _origin(exc: BaseException):
    """``(origin, exception carrying it)``: the first exception of the chain that says where it came from."""
    for link in itertools.islice(_chain(exc), 8):
        origin = getattr(link, "fuselab_origin", None)
        if type(origin) is tuple and len(origin) == 2:
            return origin, link
    return None, None


def _where(origin, plan_cells: list) -> str:
    if origin is None:
        return ""
    kind, detail = origin
    if kind == "kernel" and type(detail) is str and detail.isidentifier() and len(detail) <= 100:
        return f"by your kernel (its launcher {detail})"
    if kind != "solution":
        return ""
    solutions = {cell_label(c): c for c in plan_cells if c.get("solution")}
    for label, line in detail if type(detail) is tuple else ():
        cell = solutions.get(label)
        # only a solution cell of the plan, and a line it has: the worker's word can name nothing else
        if cell is not None and type(line) is int and 1 <= line <= len(cell.get("source", "").splitlines()):
            return f"at line {line} of your cell {cell.get('grade_id') or cell.get('index')}"
    return "in your code"


# the errors torch and the CUDA libraries raise when an allocation on the GPU fails (``clean.retry_overruns`` runs
# such a test again alone: on a shared GPU, the others' tensors may have taken the memory)
GPU_MEMORY_ERRORS = ("outofmemoryerror", "out of memory", "alloc_failed", "erroralloc", "errormemoryallocation")
GPU_MEMORY_RAN_OUT_SAID = "The GPU ran out of memory."  # a hidden test's words for it (``hidden_message``)


def says_gpu_memory_ran_out(text: str) -> bool:
    lowered = text.lower()
    return any(error in lowered for error in GPU_MEMORY_ERRORS)
