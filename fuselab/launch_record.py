"""Which emulated modules a piece of code launched, and what the emulation noticed while they ran.

    with launch_record.recording() as launched:
        candidate(*inputs, *outputs)
    launched.modules         # the emulated fuselab modules whose launchers were called, in order
    launched.barrier_notes   # barriers that not every thread of a block reached, in words

``fuselab.check`` uses it to explain a failure from what happened at run time: it reruns a failing case with the
threads in another order (a result that changes is a race) and reports a barrier that some threads skipped. A
kernel on a GPU, or one run in another process (the grader's kernel worker), is not recorded.
"""

from __future__ import annotations

import contextlib

_ACTIVE: list = []  # the records of the recordings in progress, innermost last


class LaunchRecord:
    def __init__(self):
        self.modules: list = []
        self.barrier_notes: list = []

    def _saw(self, module, barrier_note):
        if not any(m is module for m in self.modules):
            self.modules.append(module)
        if barrier_note and barrier_note not in self.barrier_notes:
            self.barrier_notes.append(barrier_note)


@contextlib.contextmanager
def recording():
    record = LaunchRecord()
    _ACTIVE.append(record)
    try:
        yield record
    finally:
        _ACTIVE.remove(record)


def launched(module, barrier_note: str | None) -> None:
    """Called by an emulated module's launcher after each call."""
    for record in _ACTIVE:
        record._saw(module, barrier_note)
