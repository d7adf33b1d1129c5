"""``fuselab demo``: build, check and time a fused elementwise kernel, end to end.

On a GPU: builds Lab 0's reference unfused kernels and a fused ``relu(a + b) * e``, checks the fused one against
a float64 reference, and times both (device time, L2 flushed, interleaved) with the achieved bandwidth against the
measured copy ceiling. Without a GPU: the same build and check under the CPU emulation, and a clear note that no
speed is measured.
"""

from __future__ import annotations

import time

import torch

from .. import build, check, compare, resolve_backend
from ..labs import lab0

FUSED_SOURCE = r"""
__global__ void add_relu_mul_kernel(const float* a, const float* b, const float* e, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(a[i] + b[i], 0.0f) * e[i];
}
void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) add_relu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, e, out, n);
}
"""


def main(backend=None, size=None) -> int:
    backend = resolve_backend(backend)
    on_gpu = backend == "cuda" and torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    where = torch.cuda.get_device_name() if on_gpu else "the CPU emulation (no GPU)"
    print(f"\nfuselab demo: F = relu(A + B) * E on {where}")

    started = time.perf_counter()
    fused_mod = build(FUSED_SOURCE, [lab0.FUSED], name="demo_fused", backend=backend)
    reference_mod = build(lab0.REFERENCE_UNFUSED_SOURCE, lab0.UNFUSED_LAUNCHERS, name="demo_unfused",
                          backend=backend)
    print(f"  built the fused kernel and the 3-kernel reference in {time.perf_counter() - started:.1f} s "
          f"({'from cache' if fused_mod.cached and reference_mod.cached else 'compiled'})")

    fused, unfused = lab0.fused(fused_mod), lab0.unfused(reference_mod)
    result = check(fused, lab0.reference, lambda s, seed: lab0.make_inputs(s, seed, device=device),
                   lab0.SMALL_SHAPES + [(65_537,)], name="add_relu_mul", verbose=False)
    print(f"  check: {result.summary()}")

    n = size or (lab0.TIMED_SHAPE[0] if on_gpu else 1 << 20)
    a, b, e = lab0.make_inputs((n,), seed=0, device=device)
    out = torch.empty_like(a)
    timed = compare({"unfused (3 kernels)": lambda: unfused(a, b, e, out), "fused": lambda: fused(a, b, e, out)},
                    mode="device", budget_s=3.0 if on_gpu else 1.0, progress=False)
    print(f"\n{timed}")
    if timed.verdict_allowed:
        from ..timing import ceilings
        copy = ceilings().copy_bytes_per_s
        for name, bytes_moved in (("unfused (3 kernels)", lab0.bytes_moved(n)["unfused"]),
                                  ("fused", lab0.bytes_moved(n)["fused"])):
            rate = bytes_moved / timed[name].median
            print(f"  {name:<20} {rate / 1e9:8,.0f} GB/s = {rate / copy:4.0%} of the measured copy bandwidth")
        print(f"  fused is {timed.speedup('fused').value:.2f}x faster at n = {n:,}")
    else:
        print(f"  speedup: {timed.verdict_reason}: emulated kernels run on the CPU; their times say nothing "
              "about a GPU")
    return 0
