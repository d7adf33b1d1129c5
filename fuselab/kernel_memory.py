"""Under the CPU emulation while the course grades: kernel memory changes only inside kernels and runtime copies.

On a GPU a launcher's host code cannot touch device memory: its pointers are device addresses, so a launcher that
computes the output in a host loop segfaults, and host code writes a ``__device__`` variable only through
``cudaMemcpyToSymbol``. Under the emulation device memory is host memory. The runtime keeps it in pages host code
cannot touch (``PROT_NONE``), opened only while a kernel or a runtime copy runs (``DeviceGuard`` in
``kernelbuild/emulate/runtime/fuselab_emu_state.h``), which makes the honest mistake fault as on a GPU. But host code
can undo a page protection (``mprotect``), or write around it (``/proc/self/mem``, ``process_vm_writev``, a
second mapping...), and a list of such ways would never be complete.

So the verdict does not depend on how memory was written. ``Watch`` keeps a copy of all kernel memory of a call
(its tensors, the buffers ``cudaMalloc`` gave, the library's ``__device__``/``__constant__`` variables). As each
kernel or runtime copy starts (the runtime calls ``starting``), and once more when the launcher returns, it
checks that the memory still holds what the last kernel or copy left (or what the call started with); as each
one ends (``ended``) it takes a new copy. A difference is host code writing kernel memory outside a kernel,
whatever it used: the launcher's call raises ``HostWroteKernelMemory``, and the grader fails the test and flags
it. A buffer ``cudaMalloc`` gave since the last copy must still hold the zeros the emulation gave it.

The copies are the bytes themselves rather than a hash of them: comparing is faster than hashing, and exact.

What it does not see: host code that runs *while* a kernel runs (a thread of the launcher racing a kernel, or
the runtime's own device-access scope entered by name), which under the emulation is code running where a kernel
runs, no more than a one-thread kernel could do; and reads, which change nothing.
"""

from __future__ import annotations

import ctypes

import torch

FLAG = "host code wrote kernel memory outside a kernel"

_Callback = ctypes.CFUNCTYPE(None)


class Watch:
    """One launcher call's kernel memory, watched from the runtime's ``starting``/``ended`` calls."""

    def __init__(self, lib, buffers):
        """``buffers``: ``[(what, address, size)]``, the call's tensors as the launcher sees them (the pages are
        still open: the guard is not on yet)."""
        self.lib, self.buffers = lib, list(buffers)
        self.lib.fuselab_emu_device_variable_bytes.restype = ctypes.c_ulonglong
        self.lib.fuselab_emu_device_variable_bytes.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        start = ctypes.c_void_p()
        size = int(self.lib.fuselab_emu_device_variable_bytes(ctypes.byref(start)))
        self.variables = [("a __device__ or __constant__ variable", start.value, size)] if size and start.value \
            else []
        self.changed = None      # the first change found, in words
        self.problem = None      # the watch itself failed (never the student's doing)
        self.inside = False      # between a kernel's or copy's start and its end
        self.windows = 0         # kernels and copies seen
        self.copies = {}
        self._take()
        # the runtime calls these; they must live as long as the guard does
        self.starting = _Callback(self._starting)
        self.ended = _Callback(self._ended)

    def regions(self) -> list:
        return self.buffers + self.variables + self._allocations()

    def _allocations(self) -> list:
        cap = 64
        while True:
            bases, sizes = (ctypes.c_void_p * cap)(), (ctypes.c_ulonglong * cap)()
            count = self.lib.fuselab_emu_allocations(bases, sizes, ctypes.c_int(cap))
            if count <= cap:
                return [("memory from cudaMalloc", bases[i], int(sizes[i])) for i in range(count) if bases[i]]
            cap = count

    @staticmethod
    def _view(address: int, size: int) -> torch.Tensor:
        """The memory as the widest integers that tile it: comparing 8 bytes at a time is several times faster."""
        width = next(w for w in (8, 4, 2, 1) if size % w == 0 and address % w == 0)
        dtype = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[width]
        return torch.frombuffer((ctypes.c_uint8 * size).from_address(address), dtype=dtype)

    def _take(self):
        copies = {}
        for _, address, size in self.regions():
            if size:
                view, kept = self._view(address, size), self.copies.get((address, size))
                copies[(address, size)] = kept.copy_(view) if kept is not None else view.clone()
        self.copies = copies

    def _check(self, when: str):
        if self.changed is not None:
            return
        for what, address, size in self.regions():
            if not size:
                continue
            now = self._view(address, size)
            before = self.copies.get((address, size))
            if before is not None and torch.equal(now, before):
                continue
            # a buffer cudaMalloc gave since the last copy: the zeros the emulation's fresh pages hold
            if before is None and not bool(now.any()):
                continue
            differs = now.ne(before) if before is not None else now.ne(0)
            if bool(differs.any()):
                at = int(differs.nonzero()[0, 0]) * now.element_size()
                self.changed = (f"{FLAG}: {what} changed (from byte {at} on) {when}. Only kernels and the "
                                "runtime's copies (cudaMemcpy, cudaMemset, cudaMemcpyToSymbol) may change it: on a "
                                "GPU a launcher's host code cannot touch device memory, so compute the result in a "
                                "kernel")
                return

    def _starting(self):
        try:
            self._check("before a kernel or runtime copy started")
            self.inside = True
        except BaseException as exc:  # noqa: BLE001 - never through the runtime's C frames
            self.problem = self.problem or f"{type(exc).__name__}: {exc}"

    def _ended(self):
        try:
            if not self.inside:  # an end without a start the runtime announced: whatever changed counts
                self._check("before a kernel or runtime copy ended")
            self.inside = False
            self.windows += 1
            self._take()
        except BaseException as exc:  # noqa: BLE001
            self.problem = self.problem or f"{type(exc).__name__}: {exc}"

    def finish(self):
        """After the launcher returned (the guard is off, every page open): the change found, in words, or None."""
        self._check("after the launcher's last kernel or runtime copy" if self.windows else
                    "in the launcher's host code, which launched no kernel and made no runtime copy")
        return self.changed
