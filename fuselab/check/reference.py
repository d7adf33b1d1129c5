"""Run the reference on float64 copies of the inputs, with nothing that could lower its precision."""

import warnings
from contextlib import contextmanager

import torch

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


@contextmanager
def full_precision():
    """float64 by default (so `torch.zeros(n)` inside a reference is float64) and TF32 off, restored afterwards.

    float64 math never uses TF32, but a reference that slips into float32 (an explicit `.float()`) would, on a GPU
    whose cuBLAS/cuDNN default to TF32: an fp32 check once failed at 2.7e-4 because of exactly that.
    Warnings are silenced because nbgrader scores a test cell that writes to stderr 0.
    """
    old_default = torch.get_default_dtype()
    old_matmul = torch.get_float32_matmul_precision()
    old_cudnn = torch.backends.cudnn.allow_tf32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.set_default_dtype(torch.float64)
            if old_matmul != "highest":
                torch.set_float32_matmul_precision("highest")
            if old_cudnn:
                torch.backends.cudnn.allow_tf32 = False
            with torch.no_grad():
                yield
        finally:
            torch.set_default_dtype(old_default)
            if old_matmul != "highest":
                torch.set_float32_matmul_precision(old_matmul)
            if old_cudnn:
                torch.backends.cudnn.allow_tf32 = old_cudnn


def run_reference(reference, inputs: tuple, device: torch.device) -> tuple:
    """The reference's outputs, as a tuple of tensors computed in float64 (integer outputs stay integer)."""
    with full_precision():
        result = reference(*float64_copies(inputs, reference_device(device)))
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
