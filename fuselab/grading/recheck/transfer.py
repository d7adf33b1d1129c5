"""The buffers of a kernel launch, between the checker and the kernel worker: one shared memory file.

A launch's tensors cross whole (their storages, guard bands included). Pickling them through the pipe costs
seconds for the labs' GPU shapes (a 64 MB tensor is copied five times on each side); through memory both
processes map, each storage is copied once into it and once out of it on each side (for a GPU tensor: one
device-to-host and one host-to-device copy each way).

The memory is an anonymous memory file (``memfd``) the grader makes for one checker and its kernel worker and
hands to both as an inherited descriptor, as it does their pipes: it has no name in any folder (nothing to plant
a link in its place), is never written back to a disk, and can only grow (sealed against shrinking, and against
any further seal). The grader closes its own descriptor once both started and never maps it.
Where the storages are on the GPU, each process pins the mapping for the GPU (the driver's
``cuMemHostRegister``), so a copy is one DMA transfer instead of the driver's copy through a staging buffer
(the CPU time and page faults of every launch; ``docs/RESULTS.md``, grading throughput).

The checker chooses every offset and size; what the worker writes there is read back only at those places, and
only into the storages the checker sent. What a worker can still do to it (punch a hole in it, ``fallocate``) reaches
only its own launches' results: the pages the checker pinned stay its, bounded by what the checker mapped.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import stat

import torch

from .cuda_waits import driver

ENV = "FUSELAB_KERNEL_TRANSFER"  # the memory's descriptor number, in the checker's and the kernel worker's environment
ALIGN = 256


def make() -> int:
    """The grader's: new transfer memory for one checker and its kernel worker, as a descriptor to pass them."""
    fd = os.memfd_create("fuselab-transfer", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    # never shrunk (a worker cannot cut a page the checker maps) and no seal added later (nor one against growing
    # or writing: the checker's next launch would fail on it)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    return fd


class Transfer:
    """Memory both processes map; grown (by the checker) to what a launch needs."""

    def __init__(self, fd: int):
        self.fd = int(fd)
        os.set_inheritable(self.fd, False)  # inherited once, from the grader: never by this process's own children
        self.map = None
        self.view = None  # a uint8 tensor over the whole map
        self.pinned = False
        self.pin_tried = False  # for this mapping

    def regions(self, sizes, pin: bool = False) -> list:
        """``[(offset, size)]`` for storages of these sizes, after growing the memory to hold them all. ``pin``:
        the storages are on the GPU."""
        regions, offset = [], 0
        for size in sizes:
            regions.append((offset, int(size)))
            offset += _rounded(int(size), ALIGN)
        self._map(offset, grow=True, pin=pin)
        return regions

    def region(self, offset: int, size: int) -> torch.Tensor:
        return self.view[offset:offset + size]

    def attach(self, size: int, pin: bool = False) -> None:
        """The worker's side: map the memory as the checker sized it (never grown here)."""
        self._map(size, grow=False, pin=pin)

    def _map(self, size: int, grow: bool, pin: bool) -> None:
        # whole pages, as a mapping and a pin take them; one at least, for a launch of empty storages too
        size = _rounded(max(size, 1), mmap.PAGESIZE)
        if self.map is None or len(self.map) < size:
            self.unmap()
            info = os.fstat(self.fd)
            if not stat.S_ISREG(info.st_mode):  # a descriptor that is not the grader's memory is never mapped
                raise ValueError(f"the transfer descriptor {self.fd} is not a memory file")
            try:
                if grow and info.st_size < size:
                    os.ftruncate(self.fd, size)
                length = os.fstat(self.fd).st_size
                if length < size:
                    raise ValueError(f"the transfer memory holds {length} bytes, {size} needed")
                self.map = mmap.mmap(self.fd, size)  # what this launch needs, not what the other side grew it to
            except OSError as exc:
                raise RuntimeError(f"the launch's buffers ({size} bytes) could not be shared with the process that "
                                   f"runs your kernels: {exc}") from exc
            self.view = torch.frombuffer(self.map, dtype=torch.uint8)
            self.pin_tried = False
        # once a mapping, and only once this process's CUDA is up (the driver pins for its current context): a
        # pin the driver refused is not asked for again at every launch
        if pin and not self.pin_tried and torch.cuda.is_initialized():
            self.pin_tried = True
            self.pinned = _register(self.view.data_ptr(), self.view.numel())

    def unmap(self) -> None:
        """Let the mapping go (unpinned first); the descriptor stays open, its owner's to close."""
        if self.pinned:
            _unregister(self.view.data_ptr())
            self.pinned = False
        self.view = None
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a region still viewed somewhere: that map stays until it is let go
                pass


def _rounded(size: int, to: int) -> int:
    return -(-size // to) * to


# The driver's calls, not the runtime's ``cudaHostRegister`` (``cuda_waits.driver`` says why): a failed
# registration here is only a slower copy.
def _register(pointer: int, size: int) -> bool:
    cuda = driver()
    return cuda is not None and cuda.cuMemHostRegister_v2(ctypes.c_void_p(pointer), ctypes.c_size_t(size),
                                                          ctypes.c_uint(0)) == 0


def _unregister(pointer: int) -> None:
    cuda = driver()
    if cuda is not None:
        cuda.cuMemHostUnregister(ctypes.c_void_p(pointer))


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage under ``tensor``, as a flat uint8 tensor on its device (a view, not a copy)."""
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
