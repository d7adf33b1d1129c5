"""Run the reference on float64 copies of the inputs, with nothing that could lower its precision."""

import warnings
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

_LOW_PRECISION = (torch.float16, torch.bfloat16, torch.float32)


def reference_device(device: torch.device) -> torch.device:
    """Where float64 works: the inputs' own device, except on Apple's MPS, which has no float64."""
    return torch.device("cpu") if device.type == "mps" else device


def float64_copies(inputs: tuple, device: torch.device) -> tuple:
    """Floating tensors become float64 (complex: complex128) copies; other tensors are copied; the rest passes."""
    copies = []
    for item in inputs:
        if isinstance(item, torch.Tensor):
            item = item.detach()
            if item.is_floating_point():
                item = item.to(device=device, dtype=torch.float64, copy=True)
            elif item.is_complex():
                item = item.to(device=device, dtype=torch.complex128, copy=True)
            else:
                item = item.to(device=device, copy=True)
        copies.append(item)
    return tuple(copies)


class _LowPrecisionForbidden(TorchFunctionMode):
    """Raises as soon as an op inside the reference produces a float16/bfloat16/float32 tensor.

    This is how "no fp32 matmul sneaks in" is guaranteed: float64 math never uses TF32, so proving that every
    intermediate is float64 is enough. The TF32 switches themselves are left alone on purpose: reading or setting
    them mixes torch's legacy and new precision APIs, and torch then raises in the student's own later code.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for item in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(item, torch.Tensor) and item.dtype in _LOW_PRECISION:
                raise TypeError(
                    f"the reference computed in {item.dtype} (in {getattr(func, '__name__', func)}): it must compute "
                    "in float64 (it gets float64 inputs; look for a .float(), .half() or an explicit dtype= inside it)"
                )
        return result


@contextmanager
def full_precision():
    """float64 by default (so `torch.zeros(n)` inside a reference is float64), and no lower-precision op allowed.

    Warnings are silenced because nbgrader scores a test cell that writes to stderr 0.
    """
    old_default = torch.get_default_dtype()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_default_dtype(torch.float64)
        try:
            with torch.no_grad(), _LowPrecisionForbidden():
                yield
        finally:
            torch.set_default_dtype(old_default)


def run_reference(reference, inputs: tuple, device: torch.device) -> tuple:
    """The reference's outputs, as a tuple of tensors computed in float64 (integer outputs stay integer)."""
    copies = float64_copies(inputs, reference_device(device))
    with full_precision():
        result = reference(*copies)
    outputs = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    for position, output in enumerate(outputs):
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"the reference must return tensors; output {position} is a {type(output).__name__}")
        if output.dtype in _LOW_PRECISION:
            raise TypeError(
                f"the reference returned output {position} as {output.dtype}: it must compute in float64 "
                "(it gets float64 inputs; look for a .float(), .half() or an explicit dtype= inside it)"
            )
    return outputs
