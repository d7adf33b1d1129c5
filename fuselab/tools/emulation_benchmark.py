"""Measure the CPU emulation: ``python -m fuselab.tools.emulation_benchmark`` prints JSON.

What it measures: the cost of one context switch (a kernel that only waits at barriers), a 16x16-tiled GEMM
(barriers every tile), and an elementwise kernel (no barriers: a plain loop), each with the hand-written
context switch and with the ucontext fallback. docs/emulation.md quotes its numbers.
"""

import argparse
import ctypes
import json
import os
import time

SOURCE = r"""
#define TILE 16
__global__ void gemm(const float* A, const float* B, float* C, int M, int N, int K) {
  __shared__ float As[TILE][TILE], Bs[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
    int ka = t * TILE + threadIdx.x, kb = t * TILE + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? A[row * K + ka] : 0.0f;
    Bs[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? B[kb * N + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = acc;
}
__global__ void barriers(float* out, int rounds) {
  float v = threadIdx.x;
  for (int r = 0; r < rounds; ++r) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
__global__ void axpy(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
void gemm_launch(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t s) {
  gemm<<<dim3((N + TILE - 1) / TILE, (M + TILE - 1) / TILE), dim3(TILE, TILE), 0, s>>>(A, B, C, M, N, K);
}
void barriers_launch(float* out, int blocks, int rounds, cudaStream_t s) { barriers<<<blocks, 256, 0, s>>>(out, rounds); }
void axpy_launch(const float* x, float* y, float a, int n, cudaStream_t s) {
  axpy<<<(n + 255) / 256, 256, 0, s>>>(x, y, a, n);
}
"""

LAUNCHERS = [
    "void gemm_launch(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t s)",
    "void barriers_launch(float* out, int blocks, int rounds, cudaStream_t s)",
    "void axpy_launch(const float* x, float* y, float a, int n, cudaStream_t s)",
]


def _best(fn, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _switches(module):
    stat = module._lib.fuselab_emu_stat
    stat.restype, stat.argtypes = ctypes.c_ulonglong, [ctypes.c_int]
    return stat(3)


def measure(fibers: str, gemm_sizes=(128, 256, 512)):
    import torch

    import fuselab

    flags = ["-DFUSELAB_EMU_UCONTEXT"] if fibers == "ucontext" else []
    module = fuselab.build(SOURCE, LAUNCHERS, backend="emulate", extra_cflags=flags, name="emu_benchmark")
    result = {"fibers": fibers, "os_threads": os.cpu_count()}

    out = torch.empty(64 * 256)
    before = _switches(module)
    seconds = _best(lambda: module.barriers_launch(out, 64, 200))
    switches = (_switches(module) - before) / 3
    result["switch_ns"] = round(seconds / switches * 1e9 * (os.cpu_count() or 1), 1)  # CPU time per switch

    for n in gemm_sizes:
        A, B, C = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        result[f"gemm_{n}_s"] = round(_best(lambda: module.gemm_launch(A, B, C, n, n, n), 1 if n > 256 else 3), 3)
        assert torch.allclose(C, A @ B, rtol=1e-3, atol=1e-3)

    n = 1 << 24
    x, y = torch.randn(n), torch.randn(n)
    seconds = _best(lambda: module.axpy_launch(x, y, 2.0, n))
    result["axpy_16M_s"] = round(seconds, 3)
    result["axpy_ns_per_thread"] = round(seconds / n * 1e9, 2)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fibers", choices=["asm", "ucontext", "both"], default="both")
    args = parser.parse_args(argv)
    kinds = ["asm", "ucontext"] if args.fibers == "both" else [args.fibers]
    print(json.dumps([measure(kind) for kind in kinds], indent=2))


if __name__ == "__main__":
    main()
