"""Lab 1's sample submissions for the grader's sample class (see fuselab/course/sample_class.py).

grade ids: test_output_size (1), test_conv_unfused (3), test_conv_fused (3), test_depthwise_bytes (1),
test_depthwise (3), test_speedup_depthwise (4); written answers are graded by hand and not listed.
"""

from ..registry import Sample

# A flat grid-stride kernel with 64-bit indices, a branch-free LeakyReLU and the bias added last: a different
# kernel from the instructor's 2-D one, equally right.
_FLAT_DEPTHWISE = r'''DEPTHWISE_SOURCE = r"""
__device__ __forceinline__ float activate(float v, int act, float slope) {
    switch (act) {
        case 1: return v > 0.0f ? v : 0.0f;
        case 2: return fmaxf(v, 0.0f) + slope * fminf(v, 0.0f);
        default: return v;
    }
}

__global__ void depthwise_flat(const float* x, const float* w, const float* bias, float* y,
                               int C, int H, int W, int64_t total, int act, float slope) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int ow = (int)(i % W);
        int oh = (int)((i / W) % H);
        int64_t plane = i / ((int64_t)H * W);
        int c = (int)(plane % C);
        float acc = 0.0f;
        for (int dh = -1; dh <= 1; ++dh)
            for (int dw = -1; dw <= 1; ++dw) {
                int ih = oh + dh, iw = ow + dw;
                bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
                if (inside) acc += x[(plane * H + ih) * W + iw] * w[c * 9 + (dh + 1) * 3 + (dw + 1)];
            }
        if (bias != nullptr) acc += bias[c];
        y[i] = activate(acc, act, slope);
    }
}

void depthwise_conv_act(const float* x, const float* w, const float* bias, float* y, int N, int C, int H, int W,
                        int act, float slope, cudaStream_t stream) {
    int64_t total = (int64_t)N * C * H * W;
    if (total <= 0) return;
    int64_t blocks = (total + 511) / 512;
    depthwise_flat<<<(unsigned)(blocks < 8192 ? blocks : 8192), 512, 0, stream>>>(x, w, bias, y, C, H, W, total,
                                                                                   act, slope);
}
"""
'''

_BORDER_CHECK = "                if (iw < 0 || iw >= W) continue;\n"

SAMPLES = {
    "correct": Sample(why="the instructor's plain solution"),
    "different_but_correct": Sample(
        changes={"depthwise_source": _FLAT_DEPTHWISE},
        expect_gpu={"test_speedup_depthwise": "any"},  # its 64-bit divisions cost time: speed is not its point
        why="a flat grid-stride depthwise kernel with 64-bit indices and a switch for the activation: different, "
            "equally right"),
    "edge_bug": Sample(
        changes={"depthwise_source": lambda s: s.replace(
            _BORDER_CHECK, "                iw = min(max(iw, 0), W - 1);  // clamp at the border\n", 1)},
        expect={"test_depthwise": "zero", "test_speedup_depthwise": "zero"},
        why="a wrong padding border: the depthwise kernel clamps columns at the left and right edges (replicate "
            "padding) instead of reading zeros; only the border outputs are wrong"),
    "cheat_torch": Sample(
        changes={"depthwise_source": lambda s: s.replace(
            "= activate(acc, act, slope);", "= 0.0f;  // the real work happens in PyTorch", 1),
                 "depthwise_bytes": lambda s: s + (
            "\n\n# make the fused depthwise op call PyTorch instead of a kernel\n"
            "from fuselab.labs import lab1 as _lab1\n"
            "_lab1.depthwise_fused = lambda module: (lambda x, w, bias, act, slope, out: "
            "out.copy_(_lab1.depthwise_eager(x, w, bias, act, slope)))\n")},
        expect={"test_depthwise": "zero", "test_speedup_depthwise": "zero"},
        why="a depthwise kernel that writes zeros, and the fused op rerouted to PyTorch from a solution cell: a "
            "run of the whole notebook is fooled (on a GPU the speed test counts PyTorch's kernels), the clean "
            "recheck is not"),
}

SAMPLES["lying_int"] = Sample(
    changes={"output_size": (
        "class AgreeableSize(int):\n"
        "    \"\"\"An int that compares equal to anything.\"\"\"\n"
        "    def __eq__(self, other):\n        return True\n\n"
        "    def __ne__(self, other):\n        return False\n\n"
        "    __hash__ = int.__hash__\n\n\n"
        "def conv_output_size(size, kernel, stride, pad):\n"
        "    return AgreeableSize(size)\n")},
    expect={"test_output_size": "zero"},
    why="returns an int subclass whose == is always true: values cross to the checker as the plain int they hold")
