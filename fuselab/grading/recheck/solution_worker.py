"""The clean recheck's solution worker: the only process of the recheck that runs a student's Python.

    python -m fuselab.grading.recheck.solution_worker IN_FD OUT_FD

The grader starts it next to the checker (``cellrunner``), connected by two pipes it inherits. It runs the
notebook's setup cell and the student's solution cells as written, then answers the checker's calls of the
functions those cells defined. What it sends back is plain data (``wire``); objects that are not (a student's
own module class) stay here as handles the checker calls by number. It never sees a test cell, a hidden test or
a reference: the checker has them, and only sends inputs. The student's kernels are not launched here either:
the kernel worker (``kernel_worker``), which runs no student Python, builds and launches them for the checker.

Requests (pickles from the checker): ``("run", label, source, want_names)``, ``("call", handle, args, kwargs)``,
``("method", handle, name, args)``. Replies (``wire.dump_tree``): ``["ran", [[name, value]...], error]``,
``["ok", value]`` (a call: ``["ok", value, arguments' state]``) or ``["raise", type, message]`` (a call:
``["raise", type, message, where it was raised, arguments' state]``).
"""

from __future__ import annotations

import ast
import io
import os
import pickle
import signal
import sys
import time
import types

from . import lazy_plots, wire

MODULE_METHODS = ("train",)
CELL_SECONDS = float(os.environ.get("FUSELAB_SOLUTION_CELL_S", "60"))
DEFINITION_SECONDS = 2.0
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Assign,
               ast.AnnAssign)


def _out_of_time(*_):
    raise TimeoutError(f"the cell's top-level code ran longer than {CELL_SECONDS:g} s (experiments belong in "
                       "cells of your own; the grader keeps only what solution cells define)")


class Worker:
    def __init__(self):
        self.namespace = {"__name__": "__main__", "display": lambda *objects, **_: print(*map(repr, objects))}
        self.handles: dict = {}
        self.ids: dict = {}

    def keep(self, obj) -> int:
        key = id(obj)
        if key not in self.ids:
            self.ids[key] = len(self.handles) + 1
            self.handles[self.ids[key]] = obj
        return self.ids[key]

    def handle_record(self, obj):
        kind = "module" if _is_module(obj) else "callable"
        name = getattr(obj, "__name__", None)
        return f"{kind}:{name if isinstance(name, str) and kind == 'callable' else type(obj).__name__}"

    def encode(self, value):
        def keep(obj):
            return self.keep(obj)
        record = wire.encode(value, keep)
        return _name_kinds(record, self)

    def run(self, label, source, want_names):
        from .cellrunner import _without_magics
        before = {k: id(v) for k, v in self.namespace.items()}
        error = None
        try:
            tree = ast.parse(_without_magics(source), filename=f"<{label}>")
        except SyntaxError as exc:
            return ["ran", [], f"SyntaxError: {exc.msg} (line {exc.lineno})"]
        # statement by statement: a failing experiment at the top of a cell does not take the definitions below
        # it with it (the grade depends on what the cell defines, not on its demo lines); a cell's top-level code
        # gets CELL_SECONDS in all (a statement still running then is stopped with a TimeoutError), after which
        # only definitions run, DEFINITION_SECONDS each
        deadline = time.monotonic() + CELL_SECONDS
        for statement in tree.body:
            module = ast.Module(body=[statement], type_ignores=[])
            left = deadline - time.monotonic()
            if left <= 0:
                if not isinstance(statement, DEFINITIONS):
                    continue  # out of time: experiments are skipped, definitions still get a moment each
                left = DEFINITION_SECONDS
            try:
                signal.setitimer(signal.ITIMER_REAL, left)
                exec(compile(module, f"<{label}>", "exec"), self.namespace)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - reported (sys.exit too), and the next statement runs
                if error is None:
                    error = f"{type(exc).__name__}: {exc}"[:2000]
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        names = []
        if want_names:
            wanted = want_names if isinstance(want_names, (list, tuple)) else None
            for key, value in list(self.namespace.items()):
                if wanted is not None and key not in wanted:
                    continue
                if key.startswith("__") or isinstance(value, types.ModuleType):
                    continue
                if before.get(key) == id(value) and wanted is None:
                    continue  # a name the lab asks for is sent even when an earlier cell of the student defined it
                try:
                    names.append([key, self.encode(value)])
                except wire.Unsendable:
                    continue  # only the student's own functions use it; they run here
        return ["ran", names, error]

    def call(self, handle, args, kwargs):
        """The function's result, and what its tensor and module arguments hold now: the checker writes that back
        into its own arguments, so a function that changes its input in place is seen to, as in one process.
        A result that *is* one of the arguments comes back as that argument (``result is conv`` holds)."""
        fn = self.handles[handle]
        arguments = list(args) + list(kwargs.values())
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - crosses as a builtin type, with where it was raised
            # what the arguments hold now goes back on this path too: a function that changes its input and then
            # raises has changed the caller's objects, as in one process (a test expecting the error sees that)
            return wire.exception_record(exc) + [_raised_in(exc), _argument_states(arguments)]
        try:
            positions = {id(a): i for i, a in enumerate(arguments) if _is_tensor_or_module(a)}
            record = _name_kinds(wire.encode(result, self.keep, arguments=positions), self)
            return ["ok", record, [wire.argument_state(a) for a in arguments]]
        except wire.Unsendable as exc:
            return ["raise", "TypeError", f"the function returned something that is not plain data: {exc}"]
        except BaseException as exc:  # noqa: BLE001 - crosses as a builtin type and its message
            return wire.exception_record(exc)

    def method(self, handle, name, args):
        module = self.handles[handle]
        try:
            if name == "train":
                module.train(bool(args[0]))
                return ["ok", ["v", None]]
        except BaseException as exc:  # noqa: BLE001
            return wire.exception_record(exc)
        return ["raise", "AttributeError", f"no method {name}"]


def _argument_states(arguments):
    try:
        return [wire.argument_state(a) for a in arguments]
    except Exception:  # noqa: BLE001 - an argument whose state cannot be sent: the exception still crosses
        return None


def _raised_in(exc: BaseException) -> list:
    """``[[cell label, line], ...]``: the student's cells the exception passed through, innermost first (the
    checker names the first one that is a solution cell of the plan, and the line, in a hidden test's verdict)."""
    frames, trace = [], exc.__traceback__
    while trace is not None:
        filename = trace.tb_frame.f_code.co_filename
        if filename.startswith("<cell ") and filename.endswith(">"):
            frames.append([filename[1:-1], int(trace.tb_lineno or 0)])
        trace = trace.tb_next
    return frames[::-1][:8]


def _is_tensor_or_module(obj) -> bool:
    import torch
    return isinstance(obj, (torch.Tensor, torch.nn.Module))


def _is_module(obj) -> bool:
    from torch import nn
    return isinstance(obj, nn.Module)


def _name_kinds(record, worker):
    """Handle records carry what kind of object they hold (module or callable), so the checker picks a proxy."""
    if isinstance(record, list) and record and record[0] == "H" and type(record[1]) is int and record[1] > 0:
        return ["H", record[1], worker.handle_record(worker.handles[record[1]])]
    if isinstance(record, list):
        return [_name_kinds(item, worker) if isinstance(item, list) else item for item in record]
    return record


class _Unpickler(pickle.Unpickler):
    def __init__(self, data, worker):
        super().__init__(io.BytesIO(data))
        self.worker = worker

    def persistent_load(self, pid):
        return self.worker.handles[pid[1]]


def main(in_fd: int, out_fd: int) -> int:
    lazy_plots.defer()  # the setup cell's plotting imports load only if a cell draws
    signal.signal(signal.SIGALRM, _out_of_time)
    worker = Worker()
    while True:
        try:
            blob = wire.receive(in_fd)
        except EOFError:
            return 0
        try:
            request = _Unpickler(blob, worker).load()
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory for the checker's tensors: said, not a death
            request = ("unreadable", exc)
        kind = request[0]
        if kind == "unreadable":
            reply = wire.exception_record(request[1])
        elif kind == "run":
            reply = worker.run(*request[1:])
        elif kind == "call":
            reply = worker.call(*request[1:])
        elif kind == "method" and request[2] in MODULE_METHODS:
            reply = worker.method(*request[1:])
        else:
            reply = ["raise", "RuntimeError", f"unknown request {kind!r}"]
        try:
            blob = wire.dump_tree(reply)
        except Exception as exc:  # noqa: BLE001 - a value torch.save refuses
            blob = wire.dump_tree(["raise", "TypeError", f"the result could not be sent: {exc}"[:500]])
        sys.stdout.flush()
        wire.send(out_fd, blob)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
