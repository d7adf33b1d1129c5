"""Anti-cheat checks that only a GPU can run (the GPU self-check runs this file; skipped elsewhere)."""

import pytest
import torch

import fuselab
from fuselab import grade
from fuselab.labs import lab0

from .conftest import requires_gpu

pytestmark = requires_gpu

KERNEL = """
__global__ void k(const float* a, const float* b, const float* e, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(a[i] + b[i], 0.0f) * e[i];
}
void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, cudaStream_t stream) {
    %s
    if (n > 0) k<<<(unsigned)((n + 255) / 256), 256, 0, %s>>>(a, b, e, out, n);
}
"""


@pytest.mark.parametrize("setup, stream, escapes", [
    ("", "stream", False),
    ("static cudaStream_t side = nullptr; if (!side) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);",
     "side", True),
])
def test_side_stream_launches_are_caught_by_graph_replay(setup, stream, escapes):
    module = fuselab.build(KERNEL % (setup, stream), [lab0.FUSED], name=f"stream_{stream}")
    inputs = lab0.make_inputs((1 << 20,), seed=3, device="cuda")
    out = torch.empty_like(inputs[0])
    op = lab0.fused(module)
    op(*inputs, out)  # first call outside the capture (a launcher may set itself up)
    torch.cuda.synchronize()
    verdict = grade._escapes_stream(op, inputs, out, lab0.reference)
    assert (verdict is not None) == escapes, verdict
