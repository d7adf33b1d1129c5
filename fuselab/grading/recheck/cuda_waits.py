"""The clean recheck's checker and kernel worker wait for the GPU asleep, not spinning.

CUDA's default for a process with one context (``CU_CTX_SCHED_AUTO``) is to spin a CPU core while the host waits
for the GPU: every ``synchronize``, every copy of a result back. With ten submissions sharing one GPU, each wait
lasts as long as the other submissions' work ahead of it, and the spinning is CPU a class pays for
(``--stages throughput`` reports it by process and step). ``CU_CTX_SCHED_BLOCKING_SYNC`` makes the waiting thread
sleep until the GPU is done.

The timings keep their meaning: a graded speed test times on the GPU's own clock (``mode="device"``: events around
each call, the L2 flush queued before it, one synchronize per batch), so when the host wakes does not enter them;
both sides of a comparison run in the same process (the kernel worker, or the reference run's checker), so both
wait alike; and the checker's wall-clock bound times batches of ``kernels.WALL_BATCH_S`` (0.25 s), of at most
``MAX_WALL_CALLS`` calls: at every graded shape a correct call takes 44 µs or more (Lab 3's fp16 output written
once, docs/RESULTS.md), so a batch lasts at least 0.2 s, which a wake-up of some microseconds does not move. A
student's own notebook keeps CUDA's default.

Set through the driver (``libcuda``) on each device's primary context, which PyTorch's runtime uses, before
anything in the process has started CUDA.
"""

from __future__ import annotations

import ctypes

CU_CTX_SCHED_BLOCKING_SYNC = 0x04


def driver():
    """The CUDA driver's library (``libcuda``), or None on a machine without it. Its own calls, not the runtime's:
    a runtime call that fails leaves its error for the next ``cudaGetLastError``, which PyTorch reads after its
    next kernel launch and raises as that launch's."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def sleep_in_waits() -> str:
    """Make this process's CUDA waits sleep; returns "" or why they still spin (no driver, no GPU, a context
    already made). Never raises: a checker that spins is slower, not wrong."""
    cuda = driver()
    if cuda is None:
        return "no CUDA driver"
    set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or getattr(cuda, "cuDevicePrimaryCtxSetFlags",
                                                                                  None)
    if set_flags is None or cuda.cuInit(0) != 0:
        return "no CUDA device"
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return "no CUDA device"
    failed = []
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0 or \
                set_flags(device, ctypes.c_uint(CU_CTX_SCHED_BLOCKING_SYNC)) != 0:
            failed.append(str(ordinal))
    return f"device(s) {', '.join(failed)} kept spinning" if failed else ""
