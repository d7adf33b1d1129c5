"""The ``cuda`` backend: the student's text compiled by nvcc for this machine's GPU architecture."""

from __future__ import annotations

from .. import toolchain
from ..errors import BuildError
from .job import Job, compose

HALF_TYPES = ("__half", "half", "__nv_bfloat16")


def job(source, protos, filename, extra_cflags):
    home = toolchain.prepare_cuda_environment()
    if home is None:
        raise BuildError("no CUDA compiler (nvcc) found: install the CUDA toolkit, set CUDA_HOME, or build "
                         "with backend='emulate' to run the kernel on the CPU")
    include = "#include <cuda_runtime.h>"
    if any(p.base_type in HALF_TYPES for proto in protos for p in proto.params):
        include += "\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>"
    text = compose(protos, include, filename, source)
    arch = toolchain.cuda_arch()
    # torch adds -D__CUDA_NO_HALF_OPERATORS__ and friends for its own headers; plain CUDA wants __half's operators.
    half_ops = [f"-U__CUDA_NO_{what}__" for what in ("HALF_OPERATORS", "HALF_CONVERSIONS", "HALF2_OPERATORS",
                                                        "BFLOAT16_CONVERSIONS", "BFLOAT16_OPERATORS")]
    cuda_flags = ["-O3", "-lineinfo", toolchain.gencode_flag(arch), *half_ops, *extra_cflags]
    return Job("cuda", "", text, ["-O2"], cuda_flags, toolchain.cuda_link_flags(home), [], filename,
               extra_key=f"arch={arch}", student_source=source)
