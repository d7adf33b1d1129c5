"""Flushing the GPU's L2 cache between timed calls, so every call starts with a cold cache as in a real pipeline
where other work ran in between."""

import torch

from .gpu import resolve_device

_MIN_FLUSH_BYTES = 32 * 1024 * 1024
_buffers = {}  # one buffer per device, reused by every measurement


def flush_bytes(device=None) -> int:
    """Twice the device's L2 size: writing that many bytes evicts whatever a kernel left in the cache."""
    props = torch.cuda.get_device_properties(resolve_device(device))
    return max(2 * int(props.L2_cache_size), _MIN_FLUSH_BYTES)


class L2Flush:
    """Callable that overwrites the L2 with a preallocated buffer (``zero_()`` of int32, one kernel).

    Call it outside the timed region; on the stream it also keeps the GPU busy while the host enqueues the
    timed call that follows.
    """

    def __init__(self, device=None):
        self.device = resolve_device(device)
        key = self.device.index
        if key not in _buffers:
            _buffers[key] = torch.empty(flush_bytes(self.device) // 4, dtype=torch.int32, device=self.device)
        self.buffer = _buffers[key]

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def __call__(self) -> None:
        self.buffer.zero_()

    def __repr__(self):
        return f"L2Flush({self.nbytes / 2**20:.0f} MiB on {self.device})"
