"""Lab 1: Conv + activation, fused into the convolution's single write.

A direct convolution computes each output in a register; applying the activation there, before the one write,
saves the separate activation kernel's full read and write of the output. Part A does it for a general conv
(compute-bound: the saving is a few percent), Part B for a depthwise 3x3 conv as in MobileNet (memory-bound: the
saving is a large share of the time, and it is the graded speedup).

Tensors are NCHW fp32 and contiguous. A missing bias is passed to the kernels as a null pointer (an empty
tensor's data pointer), as cuDNN and PyTorch's own kernels take it.
"""

from collections import namedtuple

import torch
import torch.nn.functional as F

from .. import randn_where_used
from ..lab0 import saved_results  # noqa: F401 - the same reader of the course GPU's saved measurements

# Activation codes, as the kernels see them (`int act`). LeakyReLU uses `slope`; the others ignore it.
ACTIVATIONS = {"none": 0, "relu": 1, "leaky_relu": 2}

# ---------------------------------------------------------------------------------------------- prototypes
_CONV_ARGS = ("const float* x /*[N, C, H, W]*/, const float* w /*[K, C, R, S]*/, const float* bias, "
              "float* y /*[N, K, P = (H + 2*pad - R)/stride + 1, Q = (W + 2*pad - S)/stride + 1]*/, "
              "int N, int C, int H, int W, int K, int R, int S, int P, int Q, "
              "int stride, int pad")
_DW_ARGS = ("const float* x /*[N, C, H, W]*/, const float* w /*[C, 1, 3, 3]*/, const float* bias, "
            "float* y /*[N, C, H, W]*/, int N, int C, int H, int W")
CONV = f"void conv2d({_CONV_ARGS}, cudaStream_t stream)"
ACTIVATION = "void activation(const float* x, float* y, int64_t n, int act, float slope, cudaStream_t stream)"
CONV_ACT = f"void conv2d_act({_CONV_ARGS}, int act, float slope, cudaStream_t stream)"
DEPTHWISE = f"void depthwise_conv({_DW_ARGS}, cudaStream_t stream)"
DEPTHWISE_ACT = f"void depthwise_conv_act({_DW_ARGS}, int act, float slope, cudaStream_t stream)"

# The notebook's CUDA source variables and the launchers each must define (docs/LAB_AUTHORING.md).
NOTEBOOK = "lab1/lab1.ipynb"
SOLUTION_SOURCES = {"CONV_SOURCE": [CONV, ACTIVATION], "CONV_ACT_SOURCE": [CONV_ACT],
                    "DEPTHWISE_SOURCE": [DEPTHWISE_ACT], "TUNED_SOURCE": [DEPTHWISE_ACT]}

# The lab's fixed unfused reference for Part B: a plain depthwise conv (bias included, as PyTorch's own
# depthwise kernel does), then a plain activation kernel. Graded speedups are measured against this pair, never
# against a student's own unfused code. The conv kernel is written exactly like a plain fused solution minus the
# activation, so that the speedup measures the saved pass and nothing else.
REFERENCE_LAUNCHERS = [DEPTHWISE, ACTIVATION]
REFERENCE_SOURCE = r"""
__device__ __forceinline__ float activate(float v, int act, float slope) {
    if (act == 1) return fmaxf(v, 0.0f);
    if (act == 2) return v > 0.0f ? v : v * slope;
    return v;
}

// One thread per output pixel of one (n, c) plane; blockIdx.z walks the N*C planes.
__global__ void depthwise_conv_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ bias, float* __restrict__ y,
                                      int C, int H, int W, int planes) {
    int ow = blockIdx.x * blockDim.x + threadIdx.x;
    int oh = blockIdx.y * blockDim.y + threadIdx.y;
    if (ow >= W || oh >= H) return;
    for (int p = blockIdx.z; p < planes; p += gridDim.z) {
        int c = p % C;
        const float* xp = x + (size_t)p * H * W;
        const float* wc = w + c * 9;
        float acc = bias ? bias[c] : 0.0f;
        for (int r = 0; r < 3; ++r) {
            int ih = oh + r - 1;
            if (ih < 0 || ih >= H) continue;
            for (int s = 0; s < 3; ++s) {
                int iw = ow + s - 1;
                if (iw < 0 || iw >= W) continue;
                acc += xp[(size_t)ih * W + iw] * wc[r * 3 + s];
            }
        }
        y[(size_t)p * H * W + (size_t)oh * W + ow] = acc;
    }
}

__global__ void activation_kernel(const float* x, float* y, int64_t n, int act, float slope) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = activate(x[i], act, slope);
}

void depthwise_conv(const float* x, const float* w, const float* bias, float* y, int N, int C, int H, int W,
                    cudaStream_t stream) {
    int planes = N * C;
    if (planes <= 0 || H <= 0 || W <= 0) return;
    dim3 block(32, 8);
    dim3 grid((W + 31) / 32, (H + 7) / 8, planes < 65535 ? planes : 65535);
    depthwise_conv_kernel<<<grid, block, 0, stream>>>(x, w, bias, y, C, H, W, planes);
}

void activation(const float* x, float* y, int64_t n, int act, float slope, cudaStream_t stream) {
    if (n > 0) activation_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n, act, slope);
}
"""

# Other unfused pipelines and an fp16 variant, measured by the GPU self-check only, so that the graded pipeline
# is chosen from numbers (a bias pass of its own, as a framework without fusion runs it; or half the bytes).
CANDIDATE_LAUNCHERS = [
    "void bias_add(const float* x /*[N, C, L]*/, const float* bias /*[C]*/, float* y /*[N, C, L]*/, "
    "int64_t N, int64_t C, int64_t L, cudaStream_t stream)",
    "void bias_act(const float* x /*[N, C, L]*/, const float* bias /*[C]*/, float* y /*[N, C, L]*/, "
    "int64_t N, int64_t C, int64_t L, int act, float slope, cudaStream_t stream)",
    "void depthwise_conv_f16(const __half* x /*[N, C, H, W]*/, const __half* w /*[C, 1, 3, 3]*/, "
    "const __half* bias, __half* y /*[N, C, H, W]*/, int N, int C, int H, int W, cudaStream_t stream)",
    "void activation_f16(const __half* x, __half* y, int64_t n, int act, float slope, cudaStream_t stream)",
    "void depthwise_conv_act_f16(const __half* x /*[N, C, H, W]*/, const __half* w /*[C, 1, 3, 3]*/, "
    "const __half* bias, __half* y /*[N, C, H, W]*/, int N, int C, int H, int W, int act, float slope, "
    "cudaStream_t stream)",
]
CANDIDATE_SOURCE = r"""
#include <cuda_fp16.h>

__device__ __forceinline__ float activate(float v, int act, float slope) {
    if (act == 1) return fmaxf(v, 0.0f);
    if (act == 2) return v > 0.0f ? v : v * slope;
    return v;
}

// y = x + bias[c] (with an activation in bias_act), over [N, C, L] with L = H * W
__global__ void bias_act_kernel(const float* x, const float* bias, float* y, int64_t C, int64_t L, int64_t n,
                                int act, float slope) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = activate(x[i] + bias[(i / L) % C], act, slope);
}

void bias_add(const float* x, const float* bias, float* y, int64_t N, int64_t C, int64_t L, cudaStream_t stream) {
    int64_t n = N * C * L;
    if (n > 0) bias_act_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, bias, y, C, L, n, 0, 0.0f);
}

void bias_act(const float* x, const float* bias, float* y, int64_t N, int64_t C, int64_t L, int act, float slope,
              cudaStream_t stream) {
    int64_t n = N * C * L;
    if (n > 0) bias_act_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, bias, y, C, L, n, act, slope);
}

// fp16 storage, fp32 arithmetic: the plain depthwise kernel, with and without the fused activation
__global__ void depthwise_f16_kernel(const __half* __restrict__ x, const __half* __restrict__ w,
                                     const __half* __restrict__ bias, __half* __restrict__ y,
                                     int C, int H, int W, int planes, int fuse, int act, float slope) {
    int ow = blockIdx.x * blockDim.x + threadIdx.x;
    int oh = blockIdx.y * blockDim.y + threadIdx.y;
    if (ow >= W || oh >= H) return;
    for (int p = blockIdx.z; p < planes; p += gridDim.z) {
        int c = p % C;
        const __half* xp = x + (size_t)p * H * W;
        float acc = bias ? __half2float(bias[c]) : 0.0f;
        for (int r = 0; r < 3; ++r) {
            int ih = oh + r - 1;
            if (ih < 0 || ih >= H) continue;
            for (int s = 0; s < 3; ++s) {
                int iw = ow + s - 1;
                if (iw < 0 || iw >= W) continue;
                acc += __half2float(xp[(size_t)ih * W + iw]) * __half2float(w[c * 9 + r * 3 + s]);
            }
        }
        y[(size_t)p * H * W + (size_t)oh * W + ow] = __float2half(fuse ? activate(acc, act, slope) : acc);
    }
}

__global__ void activation_f16_kernel(const __half* x, __half* y, int64_t n, int act, float slope) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(activate(__half2float(x[i]), act, slope));
}

static void launch_depthwise_f16(const __half* x, const __half* w, const __half* bias, __half* y, int N, int C,
                                 int H, int W, int fuse, int act, float slope, cudaStream_t stream) {
    int planes = N * C;
    if (planes <= 0 || H <= 0 || W <= 0) return;
    dim3 block(32, 8);
    dim3 grid((W + 31) / 32, (H + 7) / 8, planes < 65535 ? planes : 65535);
    depthwise_f16_kernel<<<grid, block, 0, stream>>>(x, w, bias, y, C, H, W, planes, fuse, act, slope);
}

void depthwise_conv_f16(const __half* x, const __half* w, const __half* bias, __half* y, int N, int C, int H,
                        int W, cudaStream_t stream) {
    launch_depthwise_f16(x, w, bias, y, N, C, H, W, 0, 0, 0.0f, stream);
}

void activation_f16(const __half* x, __half* y, int64_t n, int act, float slope, cudaStream_t stream) {
    if (n > 0) activation_f16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n, act, slope);
}

void depthwise_conv_act_f16(const __half* x, const __half* w, const __half* bias, __half* y, int N, int C,
                            int H, int W, int act, float slope, cudaStream_t stream) {
    launch_depthwise_f16(x, w, bias, y, N, C, H, W, 1, act, slope, stream);
}
"""

# ---------------------------------------------------------------------------------------------- shapes
# A conv case: batch N, C input channels of H x W, K filters of R x R, stride, padding, bias or not, activation.
ConvCase = namedtuple("ConvCase", "N C H W K R stride pad bias act", defaults=(1, 1, True, "relu"))
# A depthwise case: 3x3, stride 1, padding 1 (the output has the input's shape).
DepthwiseCase = namedtuple("DepthwiseCase", "N C H W bias act", defaults=(True, "relu"))


def random_conv_cases(count, seed, max_n=2, max_c=6, max_hw=15):
    """Random conv cases: odd sizes, batch 1 often, 3x3 and 1x1, padding 0/1, stride 1/2, bias or not, each act."""
    gen = torch.Generator().manual_seed(seed)

    def pick(low, high):
        return int(torch.randint(low, high + 1, (1,), generator=gen))
    cases = []
    for i in range(count):
        r = (3, 1)[pick(0, 1)]
        pad = pick(0, 1) if r == 3 else 0
        h, w = pick(r, max_hw), pick(r, max_hw)
        cases.append(ConvCase(N=1 if i % 3 == 0 else pick(1, max_n), C=pick(1, max_c), H=h, W=w, K=pick(1, max_c),
                              R=r, stride=pick(1, 2), pad=pad, bias=bool(pick(0, 1)),
                              act=list(ACTIVATIONS)[i % len(ACTIVATIONS)]))
    return cases


def random_depthwise_cases(count, seed, max_n=2, max_c=5, max_hw=19):
    gen = torch.Generator().manual_seed(seed)

    def pick(low, high):
        return int(torch.randint(low, high + 1, (1,), generator=gen))
    return [DepthwiseCase(N=1 if i % 3 == 0 else pick(1, max_n), C=pick(1, max_c), H=pick(1, max_hw),
                          W=pick(1, max_hw), bias=bool(pick(0, 1)), act=list(ACTIVATIONS)[i % len(ACTIVATIONS)])
            for i in range(count)]


# Small cases run under the CPU emulation and in the visible tests: a single channel, batch 1, sizes that are not
# multiples of a 32 x 8 block, a 1 x 1 image, both strides, both paddings, with and without bias, each activation.
SMALL_CONV_CASES = [
    ConvCase(1, 1, 5, 7, 1, 3, 1, 1, True, "relu"),
    ConvCase(2, 3, 9, 11, 5, 3, 1, 0, False, "leaky_relu"),
    ConvCase(1, 4, 10, 13, 3, 3, 2, 1, True, "none"),
    ConvCase(2, 5, 8, 6, 4, 1, 1, 0, True, "relu"),
    ConvCase(1, 3, 17, 19, 2, 1, 2, 0, False, "leaky_relu"),
    ConvCase(1, 2, 19, 34, 3, 3, 2, 0, True, "relu"),
    # P·Q = 667 output pixels: three blocks of 256 along x, so a kernel that ignores blockIdx.x (or a grid of one
    # block along x) fails here, in the visible test, and not only in the hidden tests' larger images
    ConvCase(1, 2, 23, 29, 3, 3, 1, 1, True, "leaky_relu"),
]
SMALL_DEPTHWISE_CASES = [
    DepthwiseCase(1, 1, 1, 1, True, "relu"),
    DepthwiseCase(1, 3, 5, 7, True, "relu"),
    DepthwiseCase(2, 5, 19, 17, False, "leaky_relu"),
    DepthwiseCase(1, 4, 9, 8, True, "none"),
    DepthwiseCase(2, 2, 3, 37, True, "leaky_relu"),
    DepthwiseCase(1, 3, 18, 2, False, "relu"),
    # the activation apart from the size: a small LeakyReLU case and a wide ReLU one. With LeakyReLU only on the
    # two wide images, a check could not tell a slope bug from a column index that stops at one block
    DepthwiseCase(1, 2, 4, 5, True, "leaky_relu"),
    DepthwiseCase(1, 2, 5, 33, False, "relu"),
]
# Square images beside the others: H and W swapped somewhere (an index, a bound, the grid's x and y) is right
# exactly where H == W, and a check can say so only where some cases are square and others are not. Two sizes,
# one larger than a block of 8 rows, so that a square case is no accident.
SMALL_CONV_CASES += [ConvCase(1, 2, 9, 9, 3, 3, 1, 1, True, "relu"), ConvCase(2, 3, 12, 12, 2, 3, 2, 0, False, "none")]
SMALL_DEPTHWISE_CASES += [DepthwiseCase(1, 2, 6, 6, True, "relu"), DepthwiseCase(2, 2, 11, 11, False, "none")]
# Empty batches (N = 0): nothing to compute, and a launcher must launch nothing, since CUDA refuses a grid of 0
# blocks. Last in each list: on a GPU a check stops at a case that raised, and the others come first.
SMALL_CONV_CASES.append(ConvCase(0, 3, 6, 7, 4, 3, 1, 1, True, "relu"))
SMALL_DEPTHWISE_CASES.append(DepthwiseCase(0, 3, 5, 7, True, "relu"))
# Hidden tests on the CPU: more random small cases (fixed seeds).
HIDDEN_SMALL_CONV_CASES = random_conv_cases(8, seed=101) + [ConvCase(0, 2, 9, 4, 3, 1, 2, 0, False, "none")]
# More planes (N·C) than a grid's z dimension holds, each of one pixel: a kernel putting the planes on blockIdx.z
# without the loop over gridDim.z leaves the planes past the grid unwritten. Small enough for the emulation (one
# thread of each block has work). Its own visible test, ``check_many_planes``, says that cause when it is the one.
GRID_Z_LIMIT = 65535
MANY_PLANES_CASE = DepthwiseCase(1, GRID_Z_LIMIT + 65, 1, 1, True, "relu")
HIDDEN_SMALL_DEPTHWISE_CASES = random_depthwise_cases(8, seed=102) + [DepthwiseCase(0, 5, 9, 40, False, "leaky_relu")]

# GPU cases: hidden tests and timing. Odd sizes beyond one block, channel counts that are not multiples of
# anything, and real network layers.
GPU_CONV_CASES = random_conv_cases(10, seed=201, max_n=4, max_c=67, max_hw=61) + [
    ConvCase(1, 64, 56, 56, 64, 3, 1, 1, True, "relu"),
    ConvCase(2, 32, 57, 45, 48, 1, 2, 0, False, "leaky_relu"),
    ConvCase(0, 64, 56, 56, 64, 3, 1, 1, True, "relu"),
]
GPU_DEPTHWISE_CASES = random_depthwise_cases(10, seed=202, max_n=4, max_c=97, max_hw=131) + [
    DepthwiseCase(1, 32, 112, 112, True, "relu"),
    DepthwiseCase(3, 17, 67, 45, False, "leaky_relu"),
    DepthwiseCase(8, 96, 56, 56, True, "none"),
    DepthwiseCase(1, 65600, 2, 3, True, "relu"),  # more planes than a grid's z (65535): the loop over gridDim.z
    DepthwiseCase(0, 32, 112, 112, True, "relu"),
]

# Timing. Part A: a naive 3x3 conv with 64 channels (compute-bound). Part B: the graded shape, an output of
# 64*96*112*112*4 B = 308 MB, five times the H200's 60 MB L2; and a launch-bound shape (batch 1, 1.6 MB).
CONV_TIMED = ConvCase(16, 64, 56, 56, 64, 3, 1, 1, True, "relu")
DEPTHWISE_TIMED = (64, 96, 112, 112)
DEPTHWISE_SMALL_TIMED = (1, 32, 112, 112)
DEPTHWISE_L2_TIMED = (32, 144, 56, 56)  # L2-sized: an output of 58 MB, about the L2 (docs/design.md §4.2)
GRADED_TEST = "lab1.depthwise_relu"

CONV_RESULTS = "lab1_conv.json"
DEPTHWISE_RESULTS = "lab1_depthwise.json"


# ---------------------------------------------------------------------------------------------- inputs
def conv_output_size(size, kernel, stride, pad):
    """Output length of a convolution along one axis."""
    return (size + 2 * pad - kernel) // stride + 1


# The visible test's cases, (size, kernel, stride, pad): the hand-countable row of the exercise, a 3×3 and a 1×1
# that keep a ResNet layer's size, and a stride that does not divide the distance (a division that rounds up, or
# Python's round(), passes the other three).
VISIBLE_OUTPUT_SIZE_CASES = [(5, 3, 2, 1), (56, 3, 1, 1), (56, 1, 1, 0), (8, 3, 2, 1)]


# The formulas students write instead of the count, each with what it misses. A wrong value in one case fits
# several of them ((5, 3, 2, 1): a missing `+ 1`, padding on one side only and no padding all give 2), so the check
# names the mistake whose values fit the student's answers in every case it asked, not the first that fits one.
OUTPUT_SIZE_MISTAKES = [
    (lambda size, kernel, stride, pad: (size + 2 * pad - kernel) // stride,
     "one output short. The window starts at p·stride - pad for p = 0, 1, …, last, and that is last + 1 "
     "positions: the `+ 1` counts the first one (p = 0)"),
    (lambda size, kernel, stride, pad: (size + pad - kernel) // stride + 1,
     "the padding is counted on one side only. Padding widens the row by `pad` on each side: the windows slide "
     "over size + 2·pad = {padded} inputs"),
    (lambda size, kernel, stride, pad: (size - kernel) // stride + 1,
     "the count of an unpadded row. Padding widens the row by `pad` on each side: the windows slide over "
     "size + 2·pad = {padded} inputs"),
    (lambda size, kernel, stride, pad: (size + 2 * pad - kernel + 1) // stride,
     "the `+ 1` is inside the division. (size + 2·pad - kernel) // stride counts the steps after the first "
     "window; the `+ 1`, added after the division, counts the first window itself"),
    (lambda size, kernel, stride, pad: -(-(size + 2 * pad - kernel) // stride) + 1,
     "the division rounds up. A last window that would stick out past the padded row is no output: `//` rounds "
     "down, as it should"),
    (lambda size, kernel, stride, pad: size + 2 * pad - kernel + 1,
     "the stride is left out. The window moves `stride` inputs from one output to the next: divide the distance "
     "it can travel, size + 2·pad - kernel, by the stride"),
]


def output_size_message(got, size, kernel, stride, pad, answers=None) -> str:
    """Why ``got`` is not the output size of ``(size, kernel, stride, pad)``: the mistake whose formula gives the
    student's value in every case of ``answers`` ({case: value returned}; this case alone by default)."""
    want = conv_output_size(size, kernel, stride, pad)
    said = f"conv_output_size{(size, kernel, stride, pad)} returned {got!r}, expected {want}"
    answers = {**(answers or {}), (size, kernel, stride, pad): got}
    fitting = [why for formula, why in OUTPUT_SIZE_MISTAKES
               if all(formula(*case) == value for case, value in answers.items())]
    fitting = [why.format(padded=size + 2 * pad) for why in fitting]
    if len(fitting) == 1:
        return f"{said}: {fitting[0]}."
    if fitting:  # the cases asked cannot tell them apart: say each
        return f"{said}. That value fits more than one mistake: " + "; or ".join(fitting) + "."
    return (f"{said}. Count the positions p = 0, 1, … whose window of {kernel} inputs, starting at p·stride - pad, "
            f"ends inside the padded row (at most size + pad - 1 = {size + pad - 1}); `//` rounds the division down.")


# (size, kernel, stride, pad) cases a student's conv_output_size must get right, as an int: 5/2 + 1 = 3.5 in
# Python, where C's integer division gives 3, and a float size cannot shape a tensor
OUTPUT_SIZE_CASES = [(5, 3, 2, 1), (56, 3, 1, 1), (56, 1, 1, 0), (6, 3, 2, 0), (1, 1, 1, 0), (8, 3, 2, 1)]


def check_output_size(conv_output_size_fn, cases=OUTPUT_SIZE_CASES):
    """A student's ``conv_output_size`` returns the lab's value, as an ``int``, on every case."""
    for size, kernel, stride, pad in cases:
        got = conv_output_size_fn(size, kernel, stride, pad)
        want = conv_output_size(size, kernel, stride, pad)
        call = f"conv_output_size({size}, {kernel}, {stride}, {pad})"
        if type(got) is not int:  # a bool, a float, or an int subclass that could redefine its comparisons
            raise AssertionError(f"{call} returned {got!r}, a {type(got).__name__}: an output size is a whole "
                                 f"number, an int (use // for integer division; / gives a float in Python)")
        if got != want:
            raise AssertionError(output_size_message(got, size, kernel, stride, pad,
                                                     _answers(conv_output_size_fn, cases)))
    print(f"✓ conv_output_size: {len(cases)} cases passed")


def _answers(conv_output_size_fn, cases) -> dict:
    """The student's whole-number answer to each case that gives one: what tells their formula apart."""
    answers = {}
    for case in cases:
        try:
            got = conv_output_size_fn(*case)
        except Exception:  # the first wrong case is reported; a later one that raises only has no say in why
            continue
        if type(got) is int:
            answers[tuple(case)] = got
    return answers


def check_many_planes(op, make_inputs, seed=41) -> None:
    """The visible test of the planes past a grid's z limit: ``op(x, w, bias, act, slope, out)`` on
    ``MANY_PLANES_CASE`` (``make_inputs(case, seed)`` gives its inputs). A kernel that takes its plane from
    ``blockIdx.z`` alone, without the loop over ``gridDim.z``, gets the first 65535 planes right and leaves the
    rest unwritten: that failure is said by its cause; any other goes to ``fuselab.check``'s report."""
    from ...check import check
    from ...check.cases import _changed_inputs
    case = MANY_PLANES_CASE
    x, w, bias, act, slope = make_inputs(case, seed)
    # the answer first, from copies: what a kernel writes into its inputs comes back with them
    expected = depthwise_reference(x.double().cpu().clone(), w.double().cpu().clone(),
                                   None if bias is None else bias.double().cpu().clone(), act, slope)
    inputs = (x, w, bias)
    originals = {i: t.clone() for i, t in enumerate(inputs) if t is not None}
    out = torch.full_like(x, float("nan"))
    op(x, w, bias, act, slope, out)
    changed = _changed_inputs(originals, inputs, ["x", "w", "bias"])  # as fuselab.check refuses in every other case
    if changed:
        raise AssertionError(f"depthwise_conv_act, N = {case.N}, C = {case.C}: {changed[0]}")
    wrong = ~torch.isclose(out.double().cpu(), expected, rtol=1e-4, atol=1e-5)
    planes = wrong.reshape(case.N * case.C, -1).any(dim=1).nonzero().flatten().tolist()
    if planes and min(planes) >= GRID_Z_LIMIT:
        raise AssertionError(
            f"depthwise_conv_act, N = {case.N}, C = {case.C} ({case.N * case.C} planes of {case.H}×{case.W}): the "
            f"first {GRID_Z_LIMIT} planes are right and {len(planes)} plane(s) past them are wrong (from plane "
            f"{planes[0]} on). A grid's z dimension holds at most {GRID_Z_LIMIT} blocks, so a kernel that takes its "
            "plane from blockIdx.z alone never computes the planes past the grid: loop "
            "`for (p = blockIdx.z; p < planes; p += gridDim.z)`, with the grid's z at most 65535.")
    if planes:  # wrong elsewhere too: the general report says where and how
        check(op, depthwise_reference, make_inputs, [case], seeds=(seed,), name="depthwise_conv_act (many planes)")
    print(f"✓ depthwise_conv_act: {case.N * case.C} planes, more than a grid's z dimension holds ({GRID_Z_LIMIT})")


def _slope(gen):
    # a slope that is never 0 or 1, so a kernel that ignores `act` or `slope` is caught
    return 0.05 + 0.3 * float(torch.rand((), generator=gen))


def make_conv_inputs(case, seed, device="cpu", dtype=torch.float32):
    """(x, w, bias or None, stride, pad, act, slope): random normal values, weights scaled so outputs are ~N(0, 1)."""
    case = ConvCase(*case)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(case.N, case.C, case.H, case.W, generator=gen)
    w = torch.randn(case.K, case.C, case.R, case.R, generator=gen) / (case.C * case.R * case.R) ** 0.5
    bias = torch.randn(case.K, generator=gen) * 0.5 if case.bias else None
    put = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return put(x), put(w), put(bias), case.stride, case.pad, case.act, _slope(gen)


def make_depthwise_inputs(case, seed, device="cpu", dtype=torch.float32):
    """(x, w, bias or None, act, slope) for a depthwise 3x3 conv; ``case`` is a DepthwiseCase or (N, C, H, W)."""
    case = DepthwiseCase(*case)
    gen = torch.Generator().manual_seed(seed)
    x = randn_where_used((case.N, case.C, case.H, case.W), gen, seed, device)
    w = torch.randn(case.C, 1, 3, 3, generator=gen) / 3.0
    bias = torch.randn(case.C, generator=gen) * 0.5 if case.bias else None
    put = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return put(x), put(w), put(bias), case.act, _slope(gen)


# ---------------------------------------------------------------------------------------------- references
def activate(y, act, slope):
    if act == "none":
        return y
    if act == "relu":
        return torch.relu(y)
    if act == "leaky_relu":
        return F.leaky_relu(y, slope)
    raise ValueError(f"unknown activation {act!r}: use one of {list(ACTIVATIONS)}")


def conv_reference(x, w, bias, stride, pad, act, slope):
    return activate(F.conv2d(x, w, bias, stride=stride, padding=pad), act, slope)


def conv_only_reference(x, w, bias, stride, pad, act, slope):
    return F.conv2d(x, w, bias, stride=stride, padding=pad)


def depthwise_reference(x, w, bias, act, slope):
    return activate(F.conv2d(x, w, bias, padding=1, groups=x.shape[1]), act, slope)


# ---------------------------------------------------------------------------------------------- ops
def _bias_arg(bias, like):
    # no bias: an empty tensor, whose data pointer is null
    return bias if bias is not None else like.new_empty(0)


def _conv_sizes(x, w, stride, pad):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    return N, C, H, W, K, R, S, conv_output_size(H, R, stride, pad), conv_output_size(W, S, stride, pad)


def conv(module):
    """The conv alone (no activation): op(x, w, bias, stride, pad, act, slope, out) on a module with conv2d."""
    def run(x, w, bias, stride, pad, act, slope, out):
        module.conv2d(x, w, _bias_arg(bias, x), out, *_conv_sizes(x, w, stride, pad), stride, pad)
    return run


def conv_unfused(module):
    """conv2d writes T, then activation reads T and writes the output: T goes through device memory."""
    def run(x, w, bias, stride, pad, act, slope, out):
        t = torch.empty_like(out)
        module.conv2d(x, w, _bias_arg(bias, x), t, *_conv_sizes(x, w, stride, pad), stride, pad)
        module.activation(t, out, out.numel(), ACTIVATIONS[act], slope)
    return run


def conv_fused(module):
    def run(x, w, bias, stride, pad, act, slope, out):
        module.conv2d_act(x, w, _bias_arg(bias, x), out, *_conv_sizes(x, w, stride, pad), stride, pad,
                          ACTIVATIONS[act], slope)
    return run


def activation_op(module):
    """op(x, act, slope, out) on a module with activation."""
    def run(x, act, slope, out):
        module.activation(x, out, x.numel(), ACTIVATIONS[act], slope)
    return run


def depthwise_unfused(module):
    """The lab's reference pipeline: depthwise_conv (bias included) writes T, activation reads T."""
    def run(x, w, bias, act, slope, out):
        t = torch.empty_like(out)
        module.depthwise_conv(x, w, _bias_arg(bias, x), t, *x.shape)
        module.activation(t, out, out.numel(), ACTIVATIONS[act], slope)
    return run


def depthwise_fused(module):
    def run(x, w, bias, act, slope, out):
        module.depthwise_conv_act(x, w, _bias_arg(bias, x), out, *x.shape, ACTIVATIONS[act], slope)
    return run


def tuned_op(source):
    """The course's tuned depthwise kernel (the instructor notebook's ``TUNED_SOURCE``) as the speed test's op."""
    from ... import build
    return depthwise_fused(build(source, [DEPTHWISE_ACT], name="tuned"))


def depthwise_eager(x, w, bias, act, slope):
    """What PyTorch runs without a compiler: its depthwise conv kernel (bias included), then the activation."""
    return activate(F.conv2d(x, w, bias, padding=1, groups=x.shape[1]), act, slope)


# ---------------------------------------------------------------------------------------------- cost models
def depthwise_bytes(N, C, H, W, dtype_size=4):
    """Minimum DRAM traffic: unfused, conv reads X and writes T, the activation reads T and writes Y; fused, X -> Y.

    Weights and bias (C * 10 values) are negligible.
    """
    tensor = N * C * H * W * dtype_size
    return {"unfused": 4 * tensor, "fused": 2 * tensor}


def _output_hw(case):
    return (conv_output_size(case.H, case.R, case.stride, case.pad),
            conv_output_size(case.W, case.R, case.stride, case.pad))


def conv_flops(case):
    case = ConvCase(*case)
    P, Q = _output_hw(case)
    return 2 * case.N * case.K * P * Q * case.C * case.R * case.R


def conv_bytes(case, dtype_size=4):
    """Minimum DRAM traffic of the conv alone (input, weights, bias, output) and of one activation pass."""
    case = ConvCase(*case)
    P, Q = _output_hw(case)
    out = case.N * case.K * P * Q * dtype_size
    conv = case.N * case.C * case.H * case.W * dtype_size + case.K * case.C * case.R * case.R * dtype_size + out
    return {"conv": conv, "activation": 2 * out}


# The course's H200, as its GPU self-check measured it (docs/results/selfcheck-h200-59d27bd.json; the same
# ceilings are in results/lab1_conv.json): the roofline drawn for students without a GPU. The L2 size is the
# device's property, as torch reports it.
H200_CEILINGS = {"device": "NVIDIA H200", "copy_bytes_per_s": 4.258e12, "fp32_flops_per_s": 51.3e12,
                 "l2_bytes": 62914560}


# ---------------------------------------------------------------------------------------------- timing
def time_conv_epilogue(conv_mod, conv_act_mod, case=CONV_TIMED, budget_s=3.0, progress=None, device="cuda"):
    """Part A on the GPU: the unfused pair against the fused kernel, the conv and the activation alone, and
    cuDNN's conv + ReLU (eager, TF32 as torch's default). Returns (Comparison, summary dict)."""
    from ... import timing
    case = ConvCase(*case)
    x, w, bias, stride, pad, act, slope = make_conv_inputs(case, seed=5, device=device)
    P, Q = conv_output_size(case.H, case.R, stride, pad), conv_output_size(case.W, case.R, stride, pad)
    out = torch.empty(case.N, case.K, P, Q, device=device)
    t = torch.empty_like(out)
    unfused, fused, conv_only, act_only = (conv_unfused(conv_mod), conv_fused(conv_act_mod), conv(conv_mod),
                                           activation_op(conv_mod))
    result = timing.compare({
        "unfused pair": lambda: unfused(x, w, bias, stride, pad, act, slope, out),
        "fused": lambda: fused(x, w, bias, stride, pad, act, slope, out),
        "conv alone": lambda: conv_only(x, w, bias, stride, pad, act, slope, t),
        "activation alone": lambda: act_only(t, act, slope, out),
        "cuDNN conv + relu (eager)": lambda: torch.relu(F.conv2d(x, w, bias, stride=stride, padding=pad)),
    }, baseline="unfused pair", mode="device", budget_s=budget_s, progress=progress)
    summary = {"case": case._asdict(), "flops": conv_flops(case), "bytes": conv_bytes(case),
               "times_us": {n: result[n].median * 1e6 for n in result.names},
               "speedups": {n: result.speedup(n).value for n in result.names}}
    return result, summary


def time_depthwise(ops, shape=DEPTHWISE_TIMED, baseline=None, budget_s=3.0, dtype=torch.float32, progress=None,
                   device="cuda"):
    """Time depthwise ops ``op(x, w, bias, act, slope, out)`` (name -> op) interleaved at ``shape`` (with bias and
    ReLU unless the shape says otherwise). Returns (Comparison, summary dict with effective bandwidths)."""
    from ... import timing
    x, w, bias, act, slope = make_depthwise_inputs(shape, seed=6, device=device, dtype=dtype)
    out = torch.empty_like(x)
    result = timing.compare({name: (lambda op=op: op(x, w, bias, act, slope, out)) for name, op in ops.items()},
                            baseline=baseline, mode="device", budget_s=budget_s, progress=progress)
    fused_bytes = depthwise_bytes(*x.shape, dtype_size=x.element_size())["fused"]
    summary = {"shape": list(DepthwiseCase(*shape)), "dtype": str(dtype).replace("torch.", ""),
               "baseline": result.baseline,
               "times_us": {n: result[n].median * 1e6 for n in result.names},
               "speedups": {n: result.speedup(n).value for n in result.names},
               "ci": {n: [result.speedup(n).low, result.speedup(n).high] for n in result.names},
               "effective_GBps": {n: fused_bytes / result[n].median / 1e9 for n in result.names}}
    return result, summary


# The lab's fixed kernels, compiled by CI for the GPU too (tests/test_kernels_compile_for_cuda.py).
REFERENCE_SOURCES = {"lab1_reference": (REFERENCE_SOURCE, REFERENCE_LAUNCHERS),
                     "lab1_candidates": (CANDIDATE_SOURCE, CANDIDATE_LAUNCHERS)}


# ------------------------------------------------------------------------------------------------ declaration
from ..registry import GradedTest, Lab  # noqa: E402 - the declaration closes the module

LAB = Lab(
    name="lab1", title="Conv + ReLU: fusing the epilogue", notebook=NOTEBOOK, package=__name__,
    launchers=SOLUTION_SOURCES, reference_sources=REFERENCE_SOURCES,
    graded_cells={"test_output_size": 1, "test_conv_unfused": 3, "test_conv_fused": 3, "test_depthwise_bytes": 1,
                  "test_depthwise": 3, "test_speedup_depthwise": 4},
    written_answers={"answer_roofline": 1, "answer_in_place": 1},
    graded_tests=(GradedTest(GRADED_TEST, "test_speedup_depthwise", mode="device", shape=DEPTHWISE_TIMED,
                             dtype="float32", speed_requires=("test_depthwise",), tuned_op="tuned_op"),),
)
