"""Lab 2: Conv+BN folding.

In eval mode BatchNorm is a per-channel affine map, y = γ·(x − μ)/√(σ² + ε) + β, so it folds into the convolution
before it: W' = W·s and b' = (b − μ)·s + β per output channel, with s = γ/√(σ² + ε). No kernel is left for the BN.

Part A folds the parameters (Python, graded on the CPU), part B folds a whole network, part C fuses the folded
depthwise 3×3 conv with its ReLU in one kernel and measures it against the lab's fixed unfused reference: a conv
kernel, a BN kernel and a ReLU kernel, with two intermediates through DRAM.
"""

import copy
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from .lab0 import saved_results  # noqa: F401 - the same reader of the course GPU's saved measurements

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
    from .. import build
    return build(REFERENCE_UNFUSED_SOURCE, UNFUSED_LAUNCHERS, name="lab2_reference")


def build_starter():
    """The starter depthwise conv (launcher ``depthwise_conv``). The reference pipeline begins with the same
    source, so one build serves both (a CPU-emulation build costs seconds)."""
    return build_reference()


# ------------------------------------------------------------------------------------------------ kernel inputs
# (N, C, H, W). Small shapes run under the CPU emulation and in the visible tests: a single channel, a single
# row, widths that are not multiples of 4, batch 1. GPU shapes are for the hidden tests and for timing.
SMALL_SHAPES = [(1, 1, 1, 1), (1, 1, 3, 3), (2, 3, 5, 7), (1, 4, 16, 16), (3, 5, 9, 33), (2, 32, 12, 10)]
HIDDEN_SMALL_SHAPES = [(1, 7, 31, 17), (5, 3, 1, 40), (2, 130, 6, 6), (1, 2, 40, 1), (4, 9, 13, 22)]
GPU_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (1, 32, 112, 112), (3, 33, 57, 29), (5, 130, 31, 17), (8, 144, 56, 56)]
TIMED_SHAPE = (64, 96, 112, 112)      # 308 MB per activation tensor: far beyond the H200's 60 MB L2
LAUNCH_BOUND_SHAPE = (1, 32, 112, 112)
CONTEXT_SHAPES = [(32, 144, 56, 56), TIMED_SHAPE, LAUNCH_BOUND_SHAPE]
CONTEXT_RESULTS = "lab2_context.json"
NETWORK_RESULTS = "lab2_network.json"  # the folded network at batch 1, timed both ways (time_network_both_ways)


def make_inputs(shape, seed, device="cpu", dtype=torch.float32):
    """x, w, b, mean, var, gamma, beta, w_folded, b_folded for a depthwise 3×3 conv + BN on an (N, C, H, W) input.

    Random and never zero: some γ negative, variances from 0.05 (where eps matters) to 1.5. The folded parameters
    come from ``torch.nn.utils.fusion.fuse_conv_bn_weights`` in float64, rounded once to ``dtype``. The activation
    is drawn on ``device`` itself (77M normal numbers take seconds on a CPU), so its values depend on the device.
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


def eager_folded(x, w, b, mean, var, gamma, beta, w_folded, b_folded):
    """PyTorch eager on folded parameters: two kernels (conv with bias, ReLU)."""
    return torch.relu(F.conv2d(x, w_folded.unsqueeze(1), b_folded, padding=1, groups=x.shape[1]))


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




# ------------------------------------------------------------------------------------------------ part A
# Conv/BN pairs to fold. Visible cases teach; hidden ones add other spatial sizes, eps values, groups, fp16 and a
# dead channel (running variance 0) whose eps fp16 cannot even represent.
FOLD_CASES = [
    dict(name="3x3 conv with bias", cin=4, cout=6, kernel=3, bias=True),
    dict(name="conv without bias", cin=4, cout=6, kernel=3, bias=False),
    dict(name="BN with affine=False", cin=3, cout=5, kernel=1, bias=True, affine=False),
    dict(name="depthwise 3x3, eps=1e-3", cin=8, cout=8, kernel=3, groups=8, bias=False, eps=1e-3),
    dict(name="fp16 parameters", cin=6, cout=6, kernel=3, groups=6, bias=False, dtype=torch.float16),
    # the pitfall the text warns about: in fp16, 1e-8 rounds to 0, so var + eps = 0 and rsqrt gives inf
    dict(name="fp16, a dead channel (variance 0), eps=1e-8", cin=4, cout=4, kernel=3, groups=4, bias=False,
         eps=1e-8, dtype=torch.float16, dead_channel=True),
]
HIDDEN_FOLD_CASES = [
    dict(name="5x5, groups=2, eps=0.1", cin=4, cout=6, kernel=5, groups=2, bias=True, eps=0.1),
    dict(name="Conv1d without bias", dims=1, cin=3, cout=7, kernel=3, bias=False),
    dict(name="Conv3d, no bias, affine=False", dims=3, cin=2, cout=4, kernel=3, bias=False, affine=False),
    dict(name="a single channel", cin=1, cout=1, kernel=3, bias=False, eps=1e-2),
    dict(name="stride 2, dilation 2", cin=5, cout=3, kernel=3, stride=2, dilation=2, padding=2, eps=1.0),
    dict(name="fp16, dead channel, eps=1e-8", cin=8, cout=8, kernel=3, groups=8, bias=False, eps=1e-8,
         dtype=torch.float16, dead_channel=True),
    dict(name="fp16 with bias, affine=False", cin=4, cout=4, kernel=1, bias=True, affine=False,
         dtype=torch.float16, eps=1e-5),
    dict(name="1x1 pointwise, 32 channels", cin=16, cout=32, kernel=1, bias=False, eps=1e-5),
]

_CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_BNS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}


def randomize_bn(bn, gen):
    """Trained-looking BN state: running statistics and affine parameters away from their 0/1 initial values,
    so that forgetting the mean, the bias or eps shows. Variances are small enough (0.05 and up) for eps to matter."""
    c = bn.num_features
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=gen) * 0.5)
        bn.running_var.copy_(torch.rand(c, generator=gen) * 1.45 + 0.05)
        if bn.affine:
            bn.weight.copy_(torch.randn(c, generator=gen) * 0.5 + 1.0)
            bn.bias.copy_(torch.randn(c, generator=gen) * 0.3)
    return bn


def make_conv_bn(case, seed=0):
    """(conv, bn) for a case of FOLD_CASES, both in eval mode, with random weights and BN state."""
    gen = torch.Generator().manual_seed(seed)
    dims = case.get("dims", 2)
    torch.manual_seed(seed)
    conv = _CONVS[dims](case["cin"], case["cout"], case["kernel"], stride=case.get("stride", 1),
                        padding=case.get("padding", case["kernel"] // 2), dilation=case.get("dilation", 1),
                        groups=case.get("groups", 1), bias=case.get("bias", True))
    if conv.bias is not None:
        with torch.no_grad():
            conv.bias.copy_(torch.randn(case["cout"], generator=gen) * 0.3)
    bn = randomize_bn(_BNS[dims](case["cout"], eps=case.get("eps", 1e-5), affine=case.get("affine", True)), gen)
    if case.get("dead_channel"):
        bn.running_var[0] = 0.0  # a channel that was constant over the training data
    dtype = case.get("dtype", torch.float32)
    return conv.to(dtype).eval(), bn.to(dtype).eval()


def conv_bn_tensors(conv, bn):
    """The arguments of a weight fold, in torch's order: conv_w, conv_b, mean, var, eps, gamma, beta."""
    return conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias


def float64_fold(conv_w, conv_b, mean, var, eps, gamma, beta):
    """The fold computed in float64 and rounded once to the parameters' dtype: the reference for part A."""
    d = torch.float64
    scale = 1.0 / torch.sqrt(var.to(d) + eps)
    if gamma is not None:
        scale = scale * gamma.to(d)
    w = conv_w.to(d) * scale.reshape((-1,) + (1,) * (conv_w.dim() - 1))
    b = ((conv_b.to(d) if conv_b is not None else 0.0) - mean.to(d)) * scale
    if beta is not None:
        b = b + beta.to(d)
    return w.to(conv_w.dtype), b.to(conv_b.dtype if conv_b is not None else conv_w.dtype)


def _unchanged(before: dict, module, what):
    for key, value in module.state_dict().items():
        if not torch.equal(value, before[key]):
            raise AssertionError(f"{what}: the original {type(module).__name__}'s {key} was modified; "
                                 "a fold must leave the original modules alone (work on copies)")


def _snapshot(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def check_fold_weights(fold, cases=FOLD_CASES, seed=0):
    """Check ``fold(conv_w, conv_b, mean, var, eps, gamma, beta) -> (w, b)`` on every case: against a float64
    fold rounded to the parameters' dtype, against torch.nn.utils.fusion.fuse_conv_bn_weights where that is
    exact enough (fp32), with the right dtypes and shapes, leaving its inputs alone."""
    from ..check import assert_close
    for case in cases:
        conv, bn = make_conv_bn(case, seed)
        args = conv_bn_tensors(conv, bn)
        before = [a.clone() if torch.is_tensor(a) else a for a in args]
        what = f"case {case['name']!r}"
        with torch.no_grad():
            got = fold(*args)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise AssertionError(f"{what}: return (folded_weight, folded_bias), got {type(got).__name__}")
        w, b = got
        if b is None:
            raise AssertionError(f"{what}: the folded bias is None. After folding every conv has a bias, "
                                 "b' = (b − μ)·γ/√(σ² + ε) + β, even when the conv had none (take b = 0)")
        w_ref, b_ref = float64_fold(*args)
        for name, value, ref in (("weight", w, w_ref), ("bias", b, b_ref)):
            if not torch.is_tensor(value) or value.shape != ref.shape or value.dtype != ref.dtype:
                raise AssertionError(f"{what}: folded {name} should be a {ref.dtype} tensor of shape "
                                     f"{tuple(ref.shape)}, got {getattr(value, 'dtype', type(value).__name__)} "
                                     f"of shape {tuple(getattr(value, 'shape', ()))}")
            if not torch.isfinite(value).all() and torch.isfinite(ref).all():
                hint = (" The parameters are fp16: fold them in float32 and cast back once at the end. In fp16, "
                        f"eps = {args[4]:g} rounds to {float(torch.tensor(args[4], dtype=torch.float16)):g}, so "
                        "var + eps is 0 for a channel that never varied, and rsqrt(0) = inf."
                        if value.dtype in (torch.float16, torch.bfloat16) else "")
                raise AssertionError(f"{what}: the folded {name} has inf or NaN entries where the exact fold is "
                                     f"finite.{hint}")
        assert_close(w.detach(), float64_fold_exact(args)[0], name=f"folded weight ({case['name']})")
        assert_close(b.detach(), float64_fold_exact(args)[1], name=f"folded bias ({case['name']})")
        if case.get("dtype", torch.float32) == torch.float32:
            w_torch, b_torch = torch.nn.utils.fusion.fuse_conv_bn_weights(*args)
            assert_close(w.detach(), w_torch.detach(), name=f"folded weight vs torch ({case['name']})")
            assert_close(b.detach(), b_torch.detach(), name=f"folded bias vs torch ({case['name']})")
        for arg, old, name in zip(args, before, ("conv_w", "conv_b", "mean", "var", "eps", "gamma", "beta")):
            if torch.is_tensor(arg) and not torch.equal(arg, old):
                raise AssertionError(f"{what}: the fold modified its input {name} in place")


def float64_fold_exact(args):
    """The float64 fold, not rounded: what a fold's result is compared with."""
    conv_w, conv_b, mean, var, eps, gamma, beta = args
    d = torch.float64
    w, b = float64_fold(conv_w.to(d), None if conv_b is None else conv_b.to(d), mean.to(d), var.to(d), eps,
                        None if gamma is None else gamma.to(d), None if beta is None else beta.to(d))
    return w.detach(), b.detach()


def _input_for(conv, seed, batch=2):
    gen = torch.Generator().manual_seed(seed + 100)
    spatial = {1: (13,), 2: (9, 11), 3: (5, 6, 7)}[conv.weight.dim() - 2]
    return torch.randn((batch, conv.in_channels) + spatial, generator=gen).to(conv.weight.dtype)


def check_fold_module(fold_conv_bn, cases=FOLD_CASES, seed=0):
    """Check ``fold_conv_bn(conv, bn) -> conv'``: same kind of conv and geometry, a bias, outputs equal to
    bn(conv(x)) in eval mode (computed in float64), and the original modules untouched."""
    from ..check import assert_close
    for case in cases:
        conv, bn = make_conv_bn(case, seed)
        what = f"case {case['name']!r}"
        saved = (_snapshot(conv), _snapshot(bn))
        with torch.no_grad():
            folded = fold_conv_bn(conv, bn)
        if type(folded) is not type(conv):
            raise AssertionError(f"{what}: expected a new {type(conv).__name__}, got {type(folded).__name__}")
        if folded is conv:
            raise AssertionError(f"{what}: return a new conv module, not the original one changed in place")
        for attr in ("stride", "padding", "dilation", "groups", "in_channels", "out_channels", "padding_mode"):
            if getattr(folded, attr) != getattr(conv, attr):
                raise AssertionError(f"{what}: the folded conv's {attr} is {getattr(folded, attr)}, "
                                     f"the original's {getattr(conv, attr)}")
        if folded.bias is None:
            raise AssertionError(f"{what}: the folded conv has no bias. After folding every conv needs one, "
                                 "b' = (b − μ)·γ/√(σ² + ε) + β, even when the original conv had none")
        if folded.weight.dtype != conv.weight.dtype:
            raise AssertionError(f"{what}: folded weights are {folded.weight.dtype}, expected {conv.weight.dtype}")
        _unchanged(saved[0], conv, what)
        _unchanged(saved[1], bn, what)
        x = _input_for(conv, seed)
        conv64, bn64 = copy.deepcopy(conv).double().eval(), copy.deepcopy(bn).double().eval()
        with torch.no_grad():
            expected = bn64(conv64(x.double()))
            got = folded.eval()(x)
        low_precision = conv.weight.dtype != torch.float32
        atol = 1e-2 * float(expected.abs().max()) if low_precision else None  # fp16 weights and inputs
        assert_close(got, expected, atol=atol, name=f"folded conv output ({case['name']})")


def check_refusals(fold_conv_bn=None, fold_network=None):
    """Folding must refuse a BN in training mode and a BN without running statistics, with a ValueError that
    says why (``fold_conv_bn``); so must the network pass on a model in training mode (``fold_network``)."""
    if fold_conv_bn is not None:
        _check_pair_refusals(fold_conv_bn)
    if fold_network is not None:
        model = mobilenet(**TINY_MOBILENET).train()
        try:
            fold_network(model)
        except ValueError:
            return
        raise AssertionError("fold_network folded a model in training mode instead of raising ValueError")


def _check_pair_refusals(fold_conv_bn):
    conv, bn = make_conv_bn(FOLD_CASES[0])
    situations = [("a BatchNorm in training mode", conv, bn.train(), "eval")]
    conv2, _ = make_conv_bn(FOLD_CASES[0])
    no_stats = nn.BatchNorm2d(conv2.out_channels, track_running_stats=False).eval()
    situations.append(("a BatchNorm without running statistics (track_running_stats=False)", conv2, no_stats, None))
    for what, c, b, word in situations:
        try:
            fold_conv_bn(c, b)
        except NotImplementedError:
            raise
        except ValueError as exc:
            if word and word not in str(exc).lower():
                raise AssertionError(f"folding {what} raised ValueError({str(exc)!r}); say in the message that "
                                     "folding is valid only in eval mode") from None
            continue
        except Exception as exc:  # noqa: BLE001 - any other exception is the wrong kind of refusal
            raise AssertionError(f"folding {what} raised {type(exc).__name__}: {exc}; expected a ValueError "
                                 "that says why it cannot be folded") from exc
        raise AssertionError(f"folding {what} returned a conv instead of raising ValueError: BN folding is valid "
                             "only in eval mode, with running statistics")


# ------------------------------------------------------------------------------------------------ part B
def conv_bn_relu(cin, cout, kernel=3, stride=1, groups=1, bias=False, eps=1e-3, affine=True):
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=bias),
                         nn.BatchNorm2d(cout, eps=eps, affine=affine), nn.ReLU())


class DepthwiseSeparable(nn.Sequential):
    """MobileNet's block: depthwise 3×3 conv → BN → ReLU, then pointwise 1×1 conv → BN → ReLU."""

    def __init__(self, cin, cout, stride=1, eps=1e-3):
        super().__init__(conv_bn_relu(cin, cin, 3, stride, groups=cin, eps=eps), conv_bn_relu(cin, cout, 1, eps=eps))


class MobileNetLike(nn.Module):
    """A small MobileNet-v1-style network: a strided 3×3 stem, depthwise-separable blocks, pooling, a classifier."""

    def __init__(self, widths=(8, 16, 32, 32, 64), strides=(1, 2, 1, 2), num_classes=10, eps=1e-3):
        super().__init__()
        self.stem = conv_bn_relu(3, widths[0], 3, 2, eps=eps)
        self.blocks = nn.Sequential(*[DepthwiseSeparable(a, b, s, eps) for a, b, s in zip(widths, widths[1:], strides)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(widths[-1], num_classes)
        self.foldable_pairs = 1 + 2 * len(self.blocks)

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


TINY_MOBILENET = dict(widths=(8, 16, 32, 32, 64), strides=(1, 2, 1, 2))          # CPU: tests, emulation
TIMED_MOBILENET = dict(widths=(32, 64, 128, 128, 256, 256, 512, 512), strides=(1, 2, 1, 2, 1, 2, 1),
                       num_classes=1000)                                          # GPU timing, 224×224 inputs
NETWORK_BATCHES = (1, 64)


def mobilenet(seed=0, **config):
    """A MobileNetLike in eval mode with trained-looking BN state (see ``randomize_bn``)."""
    torch.manual_seed(seed)
    model = MobileNetLike(**config)
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            randomize_bn(module, gen)
    return model.eval()


class BNAfterActivation(nn.Module):
    """conv → ReLU → BN: this BN follows a ReLU, not a conv, and must stay."""

    def __init__(self, c, eps):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.act = nn.ReLU()
        self.bn = nn.BatchNorm2d(c, eps=eps)

    def forward(self, x):
        return self.bn(self.act(self.conv(x)))


class SharedConvOutput(nn.Module):
    """relu(bn(conv(x))) + conv(x): the conv's output has another user, so folding the BN into the conv would
    change what the skip connection adds."""

    def __init__(self, c, eps):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 1, bias=True)
        self.bn = nn.BatchNorm2d(c, eps=eps)
        self.act = nn.ReLU()

    def forward(self, x):
        y = self.conv(x)
        return self.act(self.bn(y)) + y


class ResidualConvBN(nn.Module):
    """x + bn(conv(x)): a foldable pair inside a residual block (x has two users, the conv output one)."""

    def __init__(self, c, eps, bias=False, affine=True):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(c, eps=eps, affine=affine)

    def forward(self, x):
        return x + self.bn(self.conv(x))


def pair_across_containers(c, eps, bias=False):
    """A conv that ends one Sequential and the BN that starts the next: still a Conv→BN pair in the data flow."""
    return nn.Sequential(nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, 3, padding=1, groups=c, bias=bias)),
                         nn.Sequential(nn.BatchNorm2d(c, eps=eps), nn.ReLU()))


# name -> (builder(c, eps, rng), foldable pairs it holds)
_BLOCKS = {
    "conv_bn_relu": (lambda c, eps, rng: conv_bn_relu(c, c, rng.choice([1, 3]), bias=rng.random() < 0.5, eps=eps,
                                                      affine=rng.random() < 0.8), 1),
    "depthwise_separable": (lambda c, eps, rng: DepthwiseSeparable(c, c, rng.choice([1, 2]), eps), 2),
    "bn_after_activation": (lambda c, eps, rng: BNAfterActivation(c, eps), 0),
    "shared_conv_output": (lambda c, eps, rng: SharedConvOutput(c, eps), 0),
    "residual_conv_bn": (lambda c, eps, rng: ResidualConvBN(c, eps, rng.random() < 0.5, rng.random() < 0.7), 1),
    "pair_across_containers": (lambda c, eps, rng: pair_across_containers(c, eps, rng.random() < 0.5), 1),
}


class Network(nn.Module):
    def __init__(self, stem, body, channels, num_classes=5):
        super().__init__()
        self.stem = stem
        self.body = body
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).mean(dim=(2, 3)))


def _finish(model, seed):
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            randomize_bn(module, gen)
        elif isinstance(module, nn.Conv2d) and module.bias is not None:
            with torch.no_grad():
                module.bias.copy_(torch.randn(module.out_channels, generator=gen) * 0.3)
    return model.eval()


def tricky_network(seed=0):
    """One block of each kind (stem included): ``(model, foldable pairs, input shape)``."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    c, eps = 6, 1e-3
    blocks = [_BLOCKS[name][0](c, eps, rng) for name in _BLOCKS]
    count = 1 + sum(pairs for _, pairs in _BLOCKS.values())
    model = Network(conv_bn_relu(3, c, 3, 2, eps=eps), nn.Sequential(*blocks), c)
    return _finish(model, seed), count, (2, 3, 16, 18)


def random_network(seed):
    """A random network of the blocks above: ``(model in eval mode, foldable pairs, input shape)``."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    c = rng.choice([3, 4, 8])
    eps = rng.choice([1e-5, 1e-3, 0.1])
    names = [rng.choice(sorted(_BLOCKS)) for _ in range(rng.randint(3, 6))]
    stem_bias = rng.random() < 0.5
    blocks = [_BLOCKS[name][0](c, eps, rng) for name in names]
    count = 1 + sum(_BLOCKS[name][1] for name in names)
    model = Network(conv_bn_relu(3, c, 3, 2, bias=stem_bias, eps=eps), nn.Sequential(*blocks), c)
    shape = (rng.choice([1, 2, 3]), 3, rng.randint(12, 24), rng.randint(12, 24))
    return _finish(model, seed), count, shape


def _bn_calls(model, x):
    from ..grading.remote import RemoteModule
    if isinstance(model, RemoteModule):  # a module of the student's own class, run by the grader's solution worker
        return model.count_batchnorm_calls(x)
    calls = []
    hooks = [m.register_forward_hook(lambda *args: calls.append(1)) for m in model.modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return len(calls)


def check_fold_network(fold_network, networks, seed=0):
    """Check ``fold_network(model) -> (folded_model, count)`` on ``[(model, expected count, input shape)]``: the
    count, outputs equal to the original's in eval mode (float64 reference), the folded pairs' BNs really gone
    from the forward pass, the others still there, and the original model untouched."""
    from ..check import assert_close
    for index, (model, expected_count, shape) in enumerate(networks):
        what = f"network {index} ({type(model).__name__}, {expected_count} foldable Conv→BN pairs)"
        saved = _snapshot(model)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed + index))
        bn_before = _bn_calls(model, x)
        result = fold_network(model)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise AssertionError(f"{what}: return (folded_model, number_of_folded_pairs)")
        folded, count = result
        if not isinstance(folded, nn.Module) or folded is model:
            raise AssertionError(f"{what}: return a new folded model, leaving the original as it was")
        _unchanged(saved, model, what)
        if count != expected_count:
            raise AssertionError(f"{what}: folded {count} pair(s), expected {expected_count}. A BN is folded only "
                                 "when its input is a conv's output that nothing else uses")
        bn_after = _bn_calls(folded.eval(), x)
        if bn_after != bn_before - expected_count:
            raise AssertionError(f"{what}: the folded model still runs {bn_after} BatchNorm(s), expected "
                                 f"{bn_before - expected_count} of the original {bn_before}")
        with torch.no_grad():
            expected = copy.deepcopy(model).double().eval()(x.double())
            got = folded(x)
        assert_close(got, expected, atol=1e-4 * float(expected.abs().max()), rtol=1e-4,
                     name=f"folded model output ({what})")
        _unchanged(saved, model, what)


HIDDEN_NETWORK_SEEDS = range(1, 9)


def visible_networks():
    """The tiny MobileNet (9 pairs) and one block of each kind: ``[(model, foldable pairs, input shape)]``."""
    return [(mobilenet(**TINY_MOBILENET), 9, (2, 3, 32, 32)), tricky_network(0)]


def hidden_networks():
    return [random_network(seed) for seed in HIDDEN_NETWORK_SEEDS] + [
        (mobilenet(seed=5, **TINY_MOBILENET), 9, (1, 3, 17, 23))]


# ------------------------------------------------------------------------------------------------ GPU timing
def measure_context(candidates, shapes=CONTEXT_SHAPES, budget_s=2.0, progress=None, device="cuda"):
    """Time the lab's ops (name -> ``op(*inputs, out)``, the first one the baseline) with PyTorch eager and
    ``torch.compile`` (of the unfolded three-op graph) at each shape, interleaved, device time, L2 flushed.

    Returns one row per shape: median µs, speedup over the baseline with its interval, and the effective
    bandwidth (the fused kernel's minimum traffic, x and out, over the time) of each candidate.
    """
    from .. import timing
    from ..quiet import captured_output
    compiled = torch.compile(eager, dynamic=False)
    baseline = next(iter(candidates))
    rows = []
    for shape in shapes:
        inputs = make_inputs(shape, seed=7, device=device)
        out = torch.empty_like(inputs[0])
        with captured_output():  # compile outside the timing, and keep its warnings off stderr
            compiled(*inputs)
        fns = {name: (lambda op=op: op(*inputs, out)) for name, op in candidates.items()}
        fns["PyTorch eager"] = lambda: eager(*inputs)
        fns["torch.compile"] = lambda: compiled(*inputs)
        result = timing.compare(fns, baseline=baseline, mode="device", budget_s=budget_s, progress=progress)
        moved = bytes_moved(shape)["fused"]
        rows.append({"shape": list(shape), "baseline": baseline,
                     "median_us": {n: result[n].median * 1e6 for n in result.names},
                     "speedup": {n: result.speedup(n).value for n in result.names},
                     "ci": {n: [result.speedup(n).low, result.speedup(n).high] for n in result.names},
                     "effective_GBps": {n: moved / result[n].median / 1e9 for n in result.names}})
        del inputs, out
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def plot_context(rows, ax=None, title=""):
    """Grouped bars: each candidate's speedup over the lab's unfused reference, per shape."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.8))
    names = list(rows[0]["speedup"])
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        values = [row["speedup"][name] for row in rows]
        bars = ax.bar([i + (k - (len(names) - 1) / 2) * width for i in range(len(rows))], values, width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(["N={} C={} {}x{}".format(*row["shape"]) for row in rows])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel(f"speedup over {rows[0]['baseline']}")
    ax.set_title(title or "depthwise 3x3 conv + BN + ReLU, fp32, device time")
    ax.legend(fontsize=8, ncol=2)
    return ax


def time_networks(models, batches=NETWORK_BATCHES, image=224, budget_s=2.0, progress=None, device="cuda"):
    """Device time of whole-network inference (name -> model on the GPU, the first one the baseline) per batch."""
    from .. import timing
    from ..quiet import captured_output
    rows = []
    for batch in batches:
        x = torch.randn(batch, 3, image, image, device=device)
        with torch.no_grad():
            with captured_output():  # torch.compile compiles on the first call; keep its warnings off stderr
                for model in models.values():
                    model(x)
            result = timing.compare({name: (lambda m=m: m(x)) for name, m in models.items()}, mode="device",
                                    budget_s=budget_s, progress=progress)
        rows.append({"batch": batch, "median_ms": {n: result[n].median * 1e3 for n in result.names},
                     "speedup": {n: result.speedup(n).value for n in result.names}})
    return rows


def time_network_stream(models, batch=1, image=224, calls=20, rounds=15, device="cuda"):
    """Throughput of a *stream* of forward passes (name -> model on the GPU, the first one the baseline): CUDA
    events around ``calls`` back-to-back calls, no L2 flush and no synchronization between them, ms per call,
    median over ``rounds`` rounds in rotating order.

    Unlike ``fuselab.compare`` (device mode: the GPU time of one call after an L2 flush, with the whole call queued
    before the GPU starts it), the host issues each call while the GPU runs the previous ones: where the host's
    launch work per call exceeds the GPU's work (eager PyTorch at batch 1), this time is the host's, and it counts
    every module call and launch that folding removed."""
    import statistics
    names = list(models)
    x = torch.randn(batch, 3, image, image, device=device)
    times = {name: [] for name in names}
    with torch.no_grad():
        for model in models.values():
            model(x)  # warm-up: cuDNN's algorithm choice, allocator
        torch.cuda.synchronize(device)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    models[name](x)
                end.record()
                torch.cuda.synchronize(device)
                times[name].append(start.elapsed_time(end) / calls)
    median = {name: statistics.median(t) for name, t in times.items()}
    return {"batch": batch, "median_ms": median, "speedup": {n: median[names[0]] / median[n] for n in names}}


def time_network_both_ways(unfolded, folded, batch=1, budget_s=2.0, device="cuda"):
    """Folded over unfolded at one batch size, timed two ways: ``device`` (``fuselab.compare``: GPU time of one
    forward pass after an L2 flush) and ``stream`` (back-to-back forward passes: what a program that runs one
    after another gets, launch costs included where they exceed the GPU's work)."""
    models = {"unfolded": unfolded, "folded": folded}
    device_row = time_networks(models, batches=(batch,), budget_s=budget_s, device=device)[0]
    stream_row = time_network_stream(models, batch=batch, device=device)
    return {"batch": batch,
            "median_ms": {"device": device_row["median_ms"], "stream": stream_row["median_ms"]},
            "speedup": {"device": device_row["speedup"]["folded"], "stream": stream_row["speedup"]["folded"]}}
