"""The floor of each graded speedup test: the fewest DRAM bytes its fused op must move at the timed shape.

A kernel can take no less time than those bytes at the GPU's copy bandwidth (measured in the same run): the
feedback page draws a student's kernel between the lab's unfused reference and that floor. For Lab 3's small-K
GEMM the bytes are nearly all of C's one write, the lab's "C-write floor".
"""

from __future__ import annotations

import math

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def min_bytes(test_id: str, shape, dtype: str) -> float | None:
    """The fused op's minimum DRAM bytes (reads plus writes) at ``shape``; None for a test not known here."""
    size = _ITEMSIZE.get(dtype)
    shape = [int(s) for s in shape]
    if size is None or not shape:
        return None
    if test_id == "lab0.add_relu_mul":
        from . import lab0
        return float(lab0.bytes_moved(math.prod(shape), size)["fused"])
    if test_id == "lab1.depthwise_relu":
        from . import lab1
        return float(lab1.depthwise_bytes(*shape, dtype_size=size)["fused"])
    if test_id == "lab2.conv_bn_relu":
        from .lab2.kernels import bytes_moved
        return float(bytes_moved(shape, size)["fused"])
    if test_id == "lab3.gemm_bias_relu":
        from . import lab3
        m, n, k = shape[:3]
        return float(lab3.traffic(m, n, k, size)["gemm"] + n * size)  # A, B and the bias read, C written once
    return None
