"""Lab 0's helpers that the notebook's visible tests use."""

import pytest

import fuselab
from fuselab.labs import lab0

GUARDED = r'''
__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
'''
ADD = "void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream)"


def test_n_zero_passes_a_guarded_launcher_and_names_the_missing_guard():
    guarded = fuselab.build(GUARDED, [ADD], name="guarded", backend="emulate")
    lab0.check_n_zero(guarded.add, 2, name="add")
    unguarded = fuselab.build(GUARDED.replace("if (n > 0) ", ""), [ADD], name="unguarded", backend="emulate")
    with pytest.raises(AssertionError, match=r"add with n = 0 failed.*if \(n > 0\)"):
        lab0.check_n_zero(unguarded.add, 2, name="add")
