"""The GPU kernels one call launches, read from a CUDA graph capture of that call (the CUDA driver API, through
ctypes).

The graded speed test must know that one call of the student's op launches exactly the lab's number of kernels,
all the student's own. The profiler can tell, but its first use in a process starts CUPTI: 4-12 s on an H200
that ten submissions share (docs/RESULTS.md). In a capture the call's kernels on its stream become the nodes of
a graph, whose functions the driver names. A call that cannot be captured (it synchronizes or allocates), or
whose graph holds more than kernels and copies, returns None here, and the caller asks the profiler instead. A
kernel launched on a stream of its own runs at capture time and is not in the graph: the speed test's stream
check replays the capture on new inputs, which that work misses.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from .. import diagnostics
from ..timing.capture import capture

_KERNEL, _MEMCPY, _MEMSET, _CHILD_GRAPH, _EMPTY = 0, 1, 2, 4, 5
_MEMORY_NODES = (10, 11)         # a graph's memory allocation and free


class Unlisted(Exception):
    """The graph holds what its kernel list cannot vouch for: an unnamed kernel, a host function, or an event
    or semaphore that ties it to work outside the capture (a kernel on a stream of its own ran then, unseen)."""


class _KernelNodeParams(ctypes.Structure):
    """``CUDA_KERNEL_NODE_PARAMS`` (its v2 layout, CUDA 12 and later)."""
    _fields_ = [("func", ctypes.c_void_p),
                ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


@functools.lru_cache(maxsize=1)
def _driver():
    """The driver's entry points this module uses, or None where they are missing (an older driver)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        calls = {"nodes": lib.cuGraphGetNodes, "type": lib.cuGraphNodeGetType,
                 "params": lib.cuGraphKernelNodeGetParams_v2, "child": lib.cuGraphChildGraphNodeGetGraph,
                 "func_name": lib.cuFuncGetName, "kernel_name": lib.cuKernelGetName}
    except (OSError, AttributeError):
        return None
    for call in calls.values():
        call.restype = ctypes.c_int
    return calls


def _kernel_name(driver, node) -> str:
    params = _KernelNodeParams()
    if driver["params"](node, ctypes.byref(params)) != 0:
        raise Unlisted("a kernel the driver could not describe")
    name = ctypes.c_char_p()
    if params.func and driver["func_name"](ctypes.byref(name), ctypes.c_void_p(params.func)) == 0 and name.value:
        return diagnostics.demangled(name.value.decode(errors="replace"))
    if params.kern and driver["kernel_name"](ctypes.byref(name), ctypes.c_void_p(params.kern)) == 0 and name.value:
        return diagnostics.demangled(name.value.decode(errors="replace"))
    raise Unlisted("a kernel with no name")


def graph_kernels(graph_handle: int, depth: int = 0) -> list:
    """The kernels of a CUDA graph (``cudaGraph_t`` as an int), child graphs included, by name. Copies, memsets
    and the graph's own allocations are not kernels; any other node (an event, a host function, a conditional)
    raises ``Unlisted``."""
    driver = _driver()
    if driver is None:
        raise RuntimeError("the CUDA driver has no graph inspection (cuFuncGetName needs CUDA 12.3 or later)")
    graph = ctypes.c_void_p(graph_handle)
    count = ctypes.c_size_t(0)
    if driver["nodes"](graph, None, ctypes.byref(count)) != 0:
        raise RuntimeError("the CUDA driver could not list the graph's nodes")
    nodes = (ctypes.c_void_p * count.value)()
    if count.value and driver["nodes"](graph, nodes, ctypes.byref(count)) != 0:
        raise RuntimeError("the CUDA driver could not list the graph's nodes")
    kernels = []
    for node in nodes[:count.value]:
        node = ctypes.c_void_p(node)
        kind = ctypes.c_int(-1)
        if driver["type"](node, ctypes.byref(kind)) != 0:
            raise RuntimeError("the CUDA driver could not tell a graph node's type")
        if kind.value == _KERNEL:
            kernels.append(_kernel_name(driver, node))
        elif kind.value == _CHILD_GRAPH and depth < 8:
            child = ctypes.c_void_p()
            if driver["child"](node, ctypes.byref(child)) != 0:
                raise RuntimeError("the CUDA driver could not open a child graph")
            kernels += graph_kernels(child.value or 0, depth + 1)
        elif kind.value not in (_MEMCPY, _MEMSET, _EMPTY, *_MEMORY_NODES):
            raise Unlisted(f"a graph node of type {kind.value}")
    return kernels


def captured_kernels(fn) -> list | None:
    """Names of the kernels one call of ``fn`` launches, from a capture of it, or None where the call cannot be
    captured, the graph holds more than kernels and copies (``Unlisted``), or this torch cannot hand over the graph:
    the caller then asks the profiler. A kernel the call launches on a stream of its own runs at capture time and
    is not in the list: the speed test's stream check replays the capture on new inputs, which such work misses."""
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:  # a torch before keep_graph
        return None
    if _driver() is None:
        return None
    if capture(graph, fn, quiet=True) is not None:
        return None  # not capturable: the profiler runs it instead (and the stream check says why)
    try:
        return graph_kernels(graph.raw_cuda_graph())
    except (RuntimeError, Unlisted):
        return None
    finally:
        graph.reset()
