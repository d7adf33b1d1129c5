"""The timing's side of the grader's GPU lease (``fuselab.grading.gpus.lease`` is the grader's side).

While the grader shares one GPU among several submissions, a graded timing asks for the GPU to itself through files
in a folder the grader names (``FUSELAB_GPU_LEASE``): it writes ``lease-request-T-N``, waits for
``lease-granted-T-N``, and writes ``lease-released-T-N`` when done. Files, not signals or sockets, because the
timing may run sandboxed. Standard library only: the speed test imports it in a student's own run, where it does
nothing. A speed test as a whole (its input sets and checks at GPU size) first takes one of a few slots the same
way (``slot-request-T-N``, ``speed_test_slot``): the GPU stays shared, its memory is rationed.

The clean recheck's kernel worker times a student's kernel but never talks to the grader: it asks its checker,
which holds the lease for it (``ask_through``) from the timing to the end of its own outside-clock batches, so
that the input sets and checks before the timing do not stop the other submissions.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from pathlib import Path

REQUEST, GRANTED, RELEASED = "lease-request-", "lease-granted-", "lease-released-"
SLOT_REQUEST, SLOT_GRANTED, SLOT_RELEASED = "slot-request-", "slot-granted-", "slot-released-"

_requests = itertools.count(1)
_asker = None  # set by ask_through: this process's timings ask another process for the GPU


def ask_through(holder) -> None:
    """Route this process's ``exclusive_gpu`` through ``holder``, a context manager factory that holds the GPU
    for it (the kernel worker's pipe to its checker); None restores the files."""
    global _asker
    _asker = holder


def asks_a_checker() -> bool:
    """Whether this process's timings ask another process for the GPU (``ask_through``: the kernel worker)."""
    return _asker is not None


@contextlib.contextmanager
def exclusive_gpu():
    """The child's side: hold the GPU to this process for the ``with`` block, when the grader shares it.

    Outside the grader (``FUSELAB_GPU_LEASE`` unset: a student's own run) it does nothing.
    """
    if _asker is not None:
        with _asker():
            yield
        return
    torch = sys.modules.get("torch")
    synchronize = torch.cuda.synchronize if torch is not None and torch.cuda.is_initialized() else (lambda: None)
    synchronize()  # work queued before the block is not the timing's
    with _held(REQUEST, GRANTED, RELEASED):
        try:
            yield
        finally:
            synchronize()


@contextlib.contextmanager
def speed_test_slot():
    """The child's side: one of the few places for a speed test at GPU size on the shared GPU, for the ``with``
    block. The GPU stays shared (only ``exclusive_gpu`` stops the others); what is rationed is its memory: a speed
    test's input sets, outputs and float64 references at the timed shape, in the checker and its kernel worker at
    once, take several GiB, and every submission sharing the GPU in that phase at once ran it out of memory.
    Outside the grader it does nothing."""
    with _held(SLOT_REQUEST, SLOT_GRANTED, SLOT_RELEASED):
        yield


@contextlib.contextmanager
def _held(request, granted, released):
    folder = os.environ.get("FUSELAB_GPU_LEASE")
    if not folder:
        yield
        return
    number = f"{os.environ.get('FUSELAB_GPU_LEASE_TAG', '0')}-{next(_requests):04d}"
    (Path(folder) / (request + number)).write_text("")
    grant = Path(folder) / (granted + number)
    pause = 0.002
    while not grant.exists():  # a wait the grader counts as a pause: it ends at the grant, or with this process
        time.sleep(pause)
        pause = min(0.02, pause * 1.25)  # a grant comes at once or after a while: a long wait polls less often
    try:
        yield
    finally:
        (Path(folder) / (released + number)).write_text("")
