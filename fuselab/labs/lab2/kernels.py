"""Lab 2's kernels: the launchers, the fixed unfused reference and the starter kernel, the inputs, float64
references and shapes of part C."""

from typing import NamedTuple

import torch
import torch.nn.functional as F

EPS = 1e-3  # the BN eps of the kernels' inputs (MobileNet's); large enough that forgetting it shows

# ------------------------------------------------------------------------------------------------ launchers
DEPTHWISE_CONV = ("void depthwise_conv(const float* x /*[N, C, H, W]*/, const float* w /*[C, 3, 3]*/, "
                  "const float* b /*[C]*/, float* out /*[N, C, H, W]*/, int N, int C, int H, int W, "
                  "cudaStream_t stream)")
BATCHNORM = ("void batchnorm(const float* x /*[N, C, H, W]*/, const float* mean /*[C]*/, const float* var /*[C]*/, "
             "const float* gamma /*[C]*/, const float* beta /*[C]*/, float* out /*[N, C, H, W]*/, "
             "int N, int C, int H, int W, float eps, cudaStream_t stream)")
RELU = "void relu(const float* x, float* out, int64_t n, cudaStream_t stream)"
FOLDED = ("void conv_bn_relu_folded(const float* x /*[N, C, H, W]*/, const float* w /*[C, 3, 3]*/, "
          "const float* b /*[C]*/, float* out /*[N, C, H, W]*/, int N, int C, int H, int W, cudaStream_t stream)")
IN_REGISTERS = ("void conv_bn_relu(const float* x /*[N, C, H, W]*/, const float* w /*[C, 3, 3]*/, "
                "const float* b /*[C]*/, const float* mean /*[C]*/, const float* var /*[C]*/, "
                "const float* gamma /*[C]*/, const float* beta /*[C]*/, float* out /*[N, C, H, W]*/, "
                "int N, int C, int H, int W, float eps, cudaStream_t stream)")
UNFUSED_LAUNCHERS = [DEPTHWISE_CONV, BATCHNORM, RELU]

# The notebook's CUDA source variables and the launchers each must define (docs/LAB_AUTHORING.md).
NOTEBOOK = "lab2/lab2.ipynb"
SOLUTION_SOURCES = {"FUSED_SOURCE": [FOLDED], "IN_REGISTERS_SOURCE": [IN_REGISTERS], "TUNED_SOURCE": [FOLDED]}

# The starter kernel part C begins from: a plain depthwise 3×3 conv (stride 1, padding 1) with a bias, one output
# per thread. Shipped with the lab so that no lab depends on a student's earlier code.
STARTER_SOURCE = r"""
__global__ void depthwise_conv_kernel(const float* x, const float* w, const float* b, float* out,
                                      int C, int H, int W, int64_t total) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;   // one output element per thread
    if (i >= total) return;
    int col = (int)(i % W);
    int row = (int)((i / W) % H);
    int64_t plane = i / ((int64_t)H * W);                         // n * C + c
    int c = (int)(plane % C);
    const float* xp = x + plane * H * W;
    const float* wc = w + c * 9;
    float acc = b[c];
    for (int dy = -1; dy <= 1; ++dy) {
        int r = row + dy;
        if (r < 0 || r >= H) continue;                             // zero padding: skip rows outside
        for (int dx = -1; dx <= 1; ++dx) {
            int q = col + dx;
            if (q < 0 || q >= W) continue;
            acc += xp[(int64_t)r * W + q] * wc[(dy + 1) * 3 + (dx + 1)];
        }
    }
    out[i] = acc;
}

void depthwise_conv(const float* x, const float* w, const float* b, float* out, int N, int C, int H, int W,
                    cudaStream_t stream) {
    int64_t total = (int64_t)N * C * H * W;
    if (total > 0)
        depthwise_conv_kernel<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(x, w, b, out, C, H, W, total);
}
"""

# The lab's fixed unfused reference: graded speedups are measured against this, never against a student's own
# unfused code. The starter conv, then a BN kernel with the running statistics, then a ReLU kernel.
REFERENCE_UNFUSED_SOURCE = STARTER_SOURCE + r"""
__global__ void batchnorm_kernel(const float* x, const float* mean, const float* var, const float* gamma,
                                 const float* beta, float* out, int C, int64_t hw, int64_t total, float eps) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    int c = (int)((i / hw) % C);
    out[i] = (x[i] - mean[c]) / sqrtf(var[c] + eps) * gamma[c] + beta[c];
}

__global__ void relu_kernel(const float* x, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(x[i], 0.0f);
}

void batchnorm(const float* x, const float* mean, const float* var, const float* gamma, const float* beta,
               float* out, int N, int C, int H, int W, float eps, cudaStream_t stream) {
    int64_t total = (int64_t)N * C * H * W;
    if (total > 0)
        batchnorm_kernel<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(
            x, mean, var, gamma, beta, out, C, (int64_t)H * W, total, eps);
}

void relu(const float* x, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) relu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, out, n);
}
"""

REFERENCE_SOURCES = {"lab2_reference": (REFERENCE_UNFUSED_SOURCE, UNFUSED_LAUNCHERS),
                     "lab2_starter": (STARTER_SOURCE, [DEPTHWISE_CONV])}


def build_reference():
    """The lab's fixed unfused reference module (depthwise_conv, batchnorm, relu)."""
    from ... import build
    return build(REFERENCE_UNFUSED_SOURCE, UNFUSED_LAUNCHERS, name="lab2_reference")


def build_starter():
    """The starter depthwise conv (launcher ``depthwise_conv``). The reference pipeline begins with the same
    source, so one build serves both (a CPU-emulation build costs seconds)."""
    return build_reference()


# ------------------------------------------------------------------------------------------------ kernel inputs
# (N, C, H, W). Small shapes run under the CPU emulation and in the visible tests: a single channel, a single
# row, widths that are not multiples of 4, batch 1. GPU shapes are for the hidden tests and for timing.
# Each list ends in an empty batch (N = 0): nothing to compute, so a launcher must launch nothing (CUDA refuses a
# grid of 0 blocks); last, because on a GPU a check stops at a case that raised and the others come first.
class VarianceSpread(NamedTuple):
    """An (N, C, H, W) case whose running variances spread over six decades, 1e-4 to 1e2, instead of 0.05 to 1.5.

    eps (1e-3) is then larger than the smallest variances and negligible next to the largest, so a BN applied with
    eps in the wrong place (1/(sqrtf(var) + eps) for rsqrtf(var + eps)) is far off in the small-variance channels
    and nearly right in the others, and the check's hint can read that from the data."""

    N: int
    C: int
    H: int
    W: int


# The case built for eps comes early: a report details the first failing cases, and its pattern is the telling one.
SMALL_SHAPES = [(1, 1, 1, 1), (1, 1, 3, 3), VarianceSpread(1, 16, 6, 7), (2, 3, 5, 7), (1, 4, 16, 16), (3, 5, 9, 33),
                (2, 32, 12, 10), (0, 3, 5, 7)]
HIDDEN_SMALL_SHAPES = [(1, 7, 31, 17), (5, 3, 1, 40), (2, 130, 6, 6), (1, 2, 40, 1), (4, 9, 13, 22), (0, 2, 4, 9)]
GPU_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (1, 32, 112, 112), (3, 33, 57, 29), (5, 130, 31, 17), (8, 144, 56, 56),
              (0, 32, 112, 112)]
TIMED_SHAPE = (64, 96, 112, 112)      # 308 MB per activation tensor: far beyond the H200's 60 MB L2
GRADED_TEST = "lab2.conv_bn_relu"
LAUNCH_BOUND_SHAPE = (1, 32, 112, 112)
CONTEXT_SHAPES = [(32, 144, 56, 56), TIMED_SHAPE, LAUNCH_BOUND_SHAPE]
CONTEXT_RESULTS = "lab2_context.json"
NETWORK_RESULTS = "lab2_network.json"  # the folded network at batch 1, timed both ways (time_network_both_ways)


def make_inputs(shape, seed, device="cpu", dtype=torch.float32):
    """x, w, b, mean, var, gamma, beta, w_folded, b_folded for a depthwise 3×3 conv + BN on an (N, C, H, W) input.

    Random and never zero: some γ negative, variances from 0.05 (where eps matters) to 1.5 (1e-4 to 1e2 for a
    ``VarianceSpread`` case). The folded parameters come from ``torch.nn.utils.fusion.fuse_conv_bn_weights`` in
    float64, rounded once to ``dtype``. The activation is drawn on ``device`` itself (77M normal numbers take
    seconds on a CPU), so its values depend on the device.
    """
    n, c, h, w = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def normal(*size, scale=1.0, shift=0.0):
        return torch.randn(*size, generator=gen, dtype=torch.float64) * scale + shift

    x = torch.randn(shape, generator=torch.Generator(device=device).manual_seed(seed), device=device, dtype=dtype)
    weight = normal(c, 3, 3, scale=0.4)
    bias = normal(c, scale=0.3)
    mean = normal(c, scale=0.5)
    var = torch.rand(c, generator=gen, dtype=torch.float64) * 1.45 + 0.05
    if isinstance(shape, VarianceSpread):
        var = 10.0 ** (torch.rand(c, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 6 - 4)
    gamma = normal(c, scale=0.5, shift=1.0)
    beta = normal(c, scale=0.3)
    w_folded, b_folded = torch.nn.utils.fusion.fuse_conv_bn_weights(weight, bias, mean, var, EPS, gamma, beta)
    parameters = (weight, bias, mean, var, gamma, beta, w_folded.detach(), b_folded.detach())
    return (x,) + tuple(t.to(device=device, dtype=dtype) for t in parameters)


def conv_bn(x, w, b, mean, var, gamma, beta, eps=EPS):
    """BN(depthwise conv(x)) in PyTorch, in the inputs' dtype (float64 for a reference)."""
    y = F.conv2d(x, w.unsqueeze(1), b, padding=1, groups=x.shape[1])
    return F.batch_norm(y, mean, var, gamma, beta, training=False, eps=eps)


def reference(x, w, b, mean, var, gamma, beta, w_folded=None, b_folded=None):
    """ReLU(BN(depthwise conv(x))) from the unfolded parameters; the folded ones are ignored."""
    return torch.relu(conv_bn(x, w, b, mean, var, gamma, beta))


def eager(x, w, b, mean, var, gamma, beta, *folded):
    """PyTorch eager: three kernels (cuDNN conv, BN, ReLU), as a framework runs an unfolded model."""
    return torch.relu(conv_bn(x, w, b, mean, var, gamma, beta))


def unfused(module):
    """The three-kernel pipeline (depthwise_conv, batchnorm, relu); allocates its intermediates like eager."""
    def run(x, w, b, mean, var, gamma, beta, w_folded, b_folded, out):
        n, c, h, width = x.shape
        t1 = torch.empty_like(x)
        t2 = torch.empty_like(x)
        module.depthwise_conv(x, w, b, t1, n, c, h, width)
        module.batchnorm(t1, mean, var, gamma, beta, t2, n, c, h, width, EPS)
        module.relu(t2, out, x.numel())
    return run


def fused(module):
    """One kernel on the folded parameters: ReLU(conv(x, W') + b')."""
    def run(x, w, b, mean, var, gamma, beta, w_folded, b_folded, out):
        module.conv_bn_relu_folded(x, w_folded, b_folded, out, *x.shape)
    return run


def tuned_op(source):
    """The course's tuned kernel (the instructor notebook's ``TUNED_SOURCE``) as the speed test's op."""
    from ... import build
    return fused(build(source, [FOLDED], name="tuned"))


def in_registers(module):
    """One kernel that applies BN to each conv output in registers, from the unfolded parameters."""
    def run(x, w, b, mean, var, gamma, beta, w_folded, b_folded, out):
        module.conv_bn_relu(x, w, b, mean, var, gamma, beta, out, *x.shape, EPS)
    return run


def bytes_moved(shape, dtype_size=4):
    """Minimum DRAM traffic of the activations (parameters are a few KB): unfused, the conv reads x and writes
    T1, BN reads T1 and writes T2, ReLU reads T2 and writes out; fused reads x and writes out."""
    n = 1
    for d in shape:
        n *= d
    return {"unfused": 6 * n * dtype_size, "fused": 2 * n * dtype_size}
