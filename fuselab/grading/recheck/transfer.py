"""The buffers of a kernel launch, between the checker and the kernel worker: one memory-mapped file.

A launch's tensors cross whole (their storages, guard bands included). Pickling them through the pipe costs
seconds for the labs' GPU shapes (a 64 MB tensor is copied five times on each side); through a file both
processes map, each storage is copied once into it and once out of it on each side (for a GPU tensor: one
device-to-host and one host-to-device copy each way). The file lives in the kernel worker's own folder, which
the checker sees too; the grader itself never opens it (it only removes it, through ``untrusted``). The
checker chooses every offset and size; what the worker writes there is read back only at those places, and
only into the storages the checker sent.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

import torch

ENV = "FUSELAB_KERNEL_TRANSFER"  # the file's path, in the checker's and the kernel worker's environment
ALIGN = 256


class Transfer:
    """A file both processes map; grown (by the checker) to what a launch needs."""

    def __init__(self, path):
        self.path = Path(path)
        self.map = None
        self.view = None  # a uint8 tensor over the whole map

    def regions(self, sizes) -> list:
        """``[(offset, size)]`` for storages of these sizes, after growing the file to hold them all."""
        regions, offset = [], 0
        for size in sizes:
            regions.append((offset, int(size)))
            offset += (int(size) + ALIGN - 1) // ALIGN * ALIGN
        self._map(max(offset, ALIGN), grow=True)
        return regions

    def region(self, offset: int, size: int) -> torch.Tensor:
        return self.view[offset:offset + size]

    def attach(self, size: int) -> None:
        """The worker's side: map the file as the checker sized it (never grown here)."""
        self._map(size, grow=False)

    def _map(self, size: int, grow: bool) -> None:
        if self.map is not None and len(self.map) >= size:
            return
        self.view = None
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a region still viewed somewhere: that map stays until it is let go
                pass
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if grow else 0) | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # the worker's folder: a FIFO or a device is never mapped
                raise ValueError(f"the transfer file {self.path} is not a regular file")
            if grow and os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            length = os.fstat(fd).st_size
            if length < size:
                raise ValueError(f"the transfer file holds {length} bytes, {size} needed")
            self.map = mmap.mmap(fd, length)
        finally:
            os.close(fd)
        self.view = torch.frombuffer(self.map, dtype=torch.uint8)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage under ``tensor``, as a flat uint8 tensor on its device (a view, not a copy)."""
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
