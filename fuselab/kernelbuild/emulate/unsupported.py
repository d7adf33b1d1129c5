"""The CUDA constructs the CPU emulation cannot run, found before anything is compiled.

Each one must stop the build with its name and line: an emulation that skipped a texture fetch or an
asynchronous copy would compute something, and something wrong is worse than an error.
"""

import re

from ...errors import UnsupportedConstruct
from .lexer import in_spans, line_of

# (pattern searched in the code view, construct, hint)
RULES = [
    (r"\btexture\s*<", "texture references (texture<...>)", "read the data through a pointer instead"),
    (r"\b(tex1Dfetch|tex1D|tex2D|tex3D|tex1DLayered|tex2DLayered|texCubemap|tex2Dgather|tex1DLod|tex2DLod"
     r"|tex3DLod|tex1DGrad|tex2DGrad|tex3DGrad)\s*(<[^;()]*>)?\s*\(",
     "texture fetches ({0})", "read the data through a pointer instead"),
    (r"\b(cudaTextureObject_t|cudaCreateTextureObject|cudaResourceDesc|cudaTextureDesc)\b",
     "texture objects ({0})", "read the data through a pointer instead"),
    (r"\b(cudaSurfaceObject_t|surf1Dread|surf1Dwrite|surf2Dread|surf2Dwrite|surf3Dread|surf3Dwrite|surface\s*<)",
     "surfaces ({0})", "write through a pointer instead"),
    (r"\b(cooperative_groups|this_thread_block|this_grid|tiled_partition|thread_block_tile|grid_group)\b",
     "cooperative groups ({0})", "use __syncthreads() and the __shfl_*_sync intrinsics"),
    (r"\b(asm|__asm__|__asm)\b\s*(volatile\b|__volatile__\b)?\s*\(", "inline PTX assembly ({0}(...))",
     "write it in CUDA C++"),
    (r"\b(wmma|mma_sync|load_matrix_sync|store_matrix_sync|fill_fragment)\b",
     "tensor-core matrix operations ({0})", "use a shared-memory tiled loop"),
    (r"\b(__pipeline_memcpy_async|__pipeline_commit|__pipeline_wait_prior|memcpy_async|cp\.async"
     r"|cuda::pipeline|cuda::barrier)\b",
     "asynchronous copies ({0})", "copy to shared memory with plain loads, then __syncthreads()"),
    (r"\b__nanosleep\b", "__nanosleep", "blocks run one after another on the CPU, so a spin-wait never ends"),
    (r"\b(__match_any_sync|__match_all_sync)\b", "{0}", "use __ballot_sync or __shfl_sync"),
    (r"\b(cudaLaunchKernel|cudaLaunchKernelEx|cudaLaunchCooperativeKernel)\b", "launching through {0}",
     "use the kernel<<<grid, block, shmem, stream>>>(...) syntax"),
    (r"\b(cudaGraph\w*|cudaStreamBeginCapture|cudaStreamEndCapture)\b", "CUDA graphs ({0})",
     "launch the kernels directly"),
    (r"\b(cudaEventCreate|cudaEventRecord|cudaEventElapsedTime|cudaEventSynchronize)\b",
     "CUDA events ({0})", "time kernels with fuselab.timing on a GPU; the emulation only checks results"),
    (r"\b(__cluster_dims__|cluster_group|this_cluster)\b", "thread block clusters ({0})", ""),
]

# Headers whose whole purpose is a construct above.
HEADERS = {
    "cooperative_groups.h": "cooperative groups",
    "cooperative_groups": "cooperative groups",
    "mma.h": "tensor-core matrix operations (wmma)",
    "cuda_pipeline.h": "asynchronous copies (cuda_pipeline.h)",
    "cuda_pipeline_primitives.h": "asynchronous copies (cuda_pipeline_primitives.h)",
    "cuda_awbarrier.h": "asynchronous barriers (cuda_awbarrier.h)",
    "cuda/pipeline": "asynchronous copies (cuda/pipeline)",
    "cuda/barrier": "asynchronous barriers (cuda/barrier)",
    "texture_fetch_functions.h": "textures",
    "cuda_fp8.h": "fp8 types (cuda_fp8.h)",
    "curand_kernel.h": "cuRAND's device API (curand_kernel.h)",
}
HEADER_PREFIXES = {"cub/": "CUB", "thrust/": "Thrust", "cute/": "CuTe", "cutlass/": "CUTLASS"}


def find_unsupported(text: str, code: str, pp_spans, filename: str):
    """Raise UnsupportedConstruct for the first unsupported construct in the source, if any."""
    findings = []
    for pattern, construct, hint in RULES:
        for match in re.finditer(pattern, code):
            # `#pragma` and `#include` lines are checked apart; other directives (macros) are code.
            if in_spans(match.start(), pp_spans) and re.match(r"\s*#\s*(include|pragma)", _line(code, match.start())):
                continue
            findings.append((match.start(), construct.format(match.group(0).split("(")[0].strip()), hint))
            break
    for start, end in pp_spans:
        include = re.match(r'\s*#\s*include\s*[<"]([^>"]+)[>"]', text[start:end])
        if not include:
            continue
        header = include.group(1).strip()
        construct = HEADERS.get(header)
        if construct is None:
            for prefix, library in HEADER_PREFIXES.items():
                if header.startswith(prefix):
                    construct = f"{library} (#include <{header}>)"
        if construct:
            findings.append((start, construct, "the CPU emulation implements CUDA C++ and its runtime only"))
    if findings:
        pos, construct, hint = min(findings, key=lambda f: f[0])
        raise UnsupportedConstruct(construct, line_of(text, pos), filename, hint)


def _line(code: str, pos: int) -> str:
    start = code.rfind("\n", 0, pos) + 1
    end = code.find("\n", pos)
    return code[start : len(code) if end < 0 else end]
