"""The timing's side of the grader's GPU lease (``fuselab.grading.gpus.lease`` is the grader's side).

While the grader shares one GPU among several submissions, a graded timing asks for the GPU to itself, and a speed
test as a whole (its input sets and checks at GPU size) first asks for one of a few slots: the GPU stays shared,
its memory is rationed. The clean recheck's checker asks the grader over its channel (``talk_to_grader``: the
grader's pipe, which no sandbox can name); standard library only here: the speed test imports this module in a
student's own run too, where nothing is installed and it does nothing.

The clean recheck's kernel worker times a student's kernel but never talks to the grader: it asks its checker,
which holds the lease for it (``ask_through``) from the timing to the end of its own outside-clock batches, so
that the input sets and checks before the timing do not stop the other submissions.
"""

from __future__ import annotations

import contextlib
import sys

GPU, SLOT = "gpu", "slot"  # what a checker asks the grader for

_asker = None   # set by ask_through: this process's timings ask another process for the GPU
_grader = None  # set by talk_to_grader: ``_grader(GPU or SLOT)`` holds it from the grader for a ``with`` block


def ask_through(holder) -> None:
    """Route this process's ``exclusive_gpu`` through ``holder``, a context manager factory that holds the GPU
    for it (the kernel worker's pipe to its checker); None: asked of the grader again, if at all."""
    global _asker
    _asker = holder


def asks_a_checker() -> bool:
    """Whether this process's timings ask another process for the GPU (``ask_through``: the kernel worker)."""
    return _asker is not None


def talk_to_grader(asker) -> None:
    """Ask the grader for the GPU and for speed test slots through ``asker(GPU or SLOT)``, a context manager
    factory (the checker's channel, ``fuselab.grading.recheck.channel.Asker``); None: ask nobody."""
    global _grader
    _grader = asker


def _from_grader(what: str):
    return _grader(what) if _grader is not None else contextlib.nullcontext()


@contextlib.contextmanager
def exclusive_gpu():
    """The child's side: hold the GPU to this process for the ``with`` block, when the grader shares it.

    Outside the grader (nothing installed by ``talk_to_grader``: a student's own run) it does nothing.
    """
    if _asker is not None:
        with _asker():
            yield
        return
    torch = sys.modules.get("torch")
    synchronize = torch.cuda.synchronize if torch is not None and torch.cuda.is_initialized() else (lambda: None)
    synchronize()  # work queued before the block is not the timing's
    with _from_grader(GPU):
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
    with _from_grader(SLOT):
        yield
