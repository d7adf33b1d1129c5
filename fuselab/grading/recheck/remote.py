"""The checker's side of the solution worker: proxies for what a student's solution cells defined.

A test cell in the checker calls ``fold_conv_bn(conv, bn)`` as always; ``fold_conv_bn`` is a ``RemoteFunction``.
Its arguments go to the worker by value (a pickle of the checker's own objects: the caller's modules stay here),
the worker runs the student's function, and what its copies of the tensor and module arguments hold afterwards is
written back into the checker's own (``wire.write_back``), so "the original is unchanged" means what it means in
one process. The result comes back through ``wire.decode``: plain values, tensors and rebuilt ``torch.nn``/``fx``
modules, the checker's own argument where the function returned one, or a ``RemoteModule`` for a module the
checker cannot rebuild. An exception comes back as its builtin type, after the same write-back (a function that
changes its input and then raises has changed it), with where in the student's cells it was raised.
"""

from __future__ import annotations

import io
import pickle

from torch import nn

from . import wire


class SolutionProcessGone(RuntimeError):
    pass


class SolutionProcess:
    """The pipes to the worker; every request waits for its reply."""

    GONE = "the process that runs your solution cells ended (it crashed, or your code ended it)"

    def __init__(self, to_worker: int, from_worker: int):
        self.to_worker, self.from_worker = to_worker, from_worker
        self.gone = None

    def request(self, message):
        if self.gone:
            raise SolutionProcessGone(self.gone)
        buffer = io.BytesIO()
        _Pickler(buffer).dump(message)
        try:
            wire.send(self.to_worker, buffer.getvalue())
        except (BrokenPipeError, OSError) as exc:
            self._went(exc)
        return self.receive()

    def receive(self):
        """The worker's next message (a request's reply, or a message it sends in the middle of one)."""
        if self.gone:
            raise SolutionProcessGone(self.gone)
        try:
            blob = wire.receive(self.from_worker)
        except (EOFError, OSError) as exc:
            self._went(exc)
        return wire.load_tree(blob)

    def _went(self, exc):
        self.gone = f"{self.GONE}: {type(exc).__name__}"
        raise SolutionProcessGone(self.gone) from None

    def handle(self, number, kind):
        if number < 0:  # one of the call's own arguments, returned
            if self._arguments is None or -1 - number >= len(self._arguments):
                raise wire.WireError("the solution process referred to an argument the call did not have")
            return self._arguments[-1 - number]
        if kind.startswith("module:"):
            return RemoteModule(self, number, kind.split(":", 1)[1])
        return RemoteFunction(self, number, kind.split(":", 1)[-1])

    _arguments = None

    def result(self, reply, arguments=None):
        """The value of a reply. For a call, ``arguments`` are the checker's own: what the worker's copies hold
        after the call is written back into them first (a function that changes its input is seen to)."""
        tag = reply[0] if type(reply) is list and reply else None
        if tag == "ok" and arguments is not None and len(reply) == 3:
            self._write_back(arguments, reply[2])
            self._arguments = arguments
            try:
                return wire.decode(reply[1], self.handle)
            finally:
                self._arguments = None
        if tag == "ok" and len(reply) == 2:
            return wire.decode(reply[1], self.handle)
        if tag == "raise" and len(reply) == 3:
            raise wire.rebuild_exception(reply)
        if tag == "raise" and len(reply) == 5 and arguments is not None:
            # a call that raised: what it did to its arguments before raising is written back all the same
            if reply[4] is not None:
                self._write_back(arguments, reply[4])
            error = wire.rebuild_exception(reply[:3])
            error.fuselab_origin = ("solution", _frames(reply[3]))
            raise error
        raise wire.WireError("the solution process sent a malformed reply")

    @staticmethod
    def _write_back(arguments, states):
        if type(states) is not list or len(states) != len(arguments):
            raise wire.WireError("the solution process sent a malformed reply")
        for argument, state in zip(arguments, states):
            wire.write_back(argument, state)

    def run_cell(self, label: str, source: str, want_names=True):
        """Run one cell in the worker: ``(names it defined → values/proxies, its first error or None)``."""
        reply = self.request(("run", label, source, want_names))
        if not (type(reply) is list and len(reply) == 3 and reply[0] == "ran" and type(reply[1]) is list
                and (reply[2] is None or type(reply[2]) is str)):
            raise wire.WireError("the solution process sent a malformed reply")
        names = {}
        for item in reply[1]:
            if not (type(item) is list and len(item) == 2 and type(item[0]) is str and item[0].isidentifier()):
                raise wire.WireError("the solution process sent a malformed name")
            try:
                names[item[0]] = wire.decode(item[1], self.handle)
            except wire.WireError:
                continue  # not something a test uses; the student's functions use it in the worker
        return names, reply[2]


def _frames(frames) -> tuple:
    """Where the worker says an exception was raised: ``((cell label, line), ...)`` of plain values only (the
    checker still checks them against its plan before it names one: ``failures``)."""
    if type(frames) is not list:
        return ()
    return tuple((label, line) for label, line in (f for f in frames[:8] if type(f) is list and len(f) == 2)
                 if type(label) is str and len(label) <= 200 and type(line) is int)


class RemoteFunction:
    """A student's function (or class) that runs in the worker."""

    def __init__(self, process, number, name):
        self._process, self._number, self.__name__ = process, number, name

    def __repr__(self):
        return f"<{self.__name__}, run in the solution process>"

    def __call__(self, *args, **kwargs):
        return self._process.result(self._process.request(("call", self._number, args, kwargs)),
                                    list(args) + list(kwargs.values()))


class RemoteModule(nn.Module):
    """A module the checker cannot rebuild (a student's own ``nn.Module`` subclass that ``torch.fx`` cannot trace):
    it stays in the worker.

    Its forward runs there, on inputs sent by value; outputs come back as tensors and are checked here. Nothing
    else about it is asked of the worker: what the worker says about its own module (which operations it runs,
    say) is the student's word, so a check that needs to see inside a module refuses this one
    (``evaluated_remotely``).
    """

    evaluated_remotely = True

    def __init__(self, process, number, class_name):
        super().__init__()
        object.__setattr__(self, "_process", process)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "class_name", class_name)

    def __repr__(self):
        return f"<{self.class_name} (a module of your own class), run in the solution process>"

    def forward(self, *args, **kwargs):
        return self._process.result(self._process.request(("call", self._number, args, kwargs)),
                                    list(args) + list(kwargs.values()))

    def train(self, mode=True):
        self._process.result(self._process.request(("method", self._number, "train", (bool(mode),))))
        object.__setattr__(self, "training", bool(mode))
        return self


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, (RemoteFunction, RemoteModule)):
            return ("handle", obj._number)
        return None
