"""Lab 3: MatMul + bias-Add (+ ReLU), the fully connected layer C = act(A·B + bias).

Unfused, a GEMM writes C and a second kernel reads C, adds the bias (broadcast over rows: ``bias[col]``) and
applies the activation, writing C again. Fused, the GEMM's epilogue does it in registers before the one store.
The saved work is one pass over C (M×N) and one launch: next to a big GEMM (compute-bound) that is nothing,
next to a skinny inference GEMM (M = 1…16 rows, time set by reading B once) it is the launch that counts, and with
K small (a LoRA up-projection, a low-rank layer, a first layer with a few input features) writing C is most of
the GEMM's own traffic, so the unfused pass over C costs as much again: that is where the epilogue pays.

Shapes are ``(M, N, K)`` or ``(M, N, K, has_bias, relu)``: A is M×K, B is K×N, bias is N (or empty: no bias),
C is M×N, all row-major. A launcher gets ``bias == nullptr`` when there is no bias.
"""

import math
from typing import NamedTuple

import torch

from ..lab0 import saved_results  # noqa: F401 - the one reader of the course GPU's saved measurements

_MNK = "int M, int N, int K"


def _fused_prototype(suffix, t):
    return (f"void gemm_bias_act_{suffix}(const {t}* a /*[M, K]*/, const {t}* b /*[K, N]*/, const {t}* bias, "
            f"{t}* c /*[M, N]*/, {_MNK}, int relu, cudaStream_t stream)")


FUSED_F32 = _fused_prototype("f32", "float")
FUSED_F16 = _fused_prototype("f16", "__half")
GEMM_F32 = ("void gemm_f32(const float* a /*[M, K]*/, const float* b /*[K, N]*/, float* c /*[M, N]*/, "
            f"{_MNK}, cudaStream_t stream)")
GEMM_F16 = ("void gemm_f16(const __half* a /*[M, K]*/, const __half* b /*[K, N]*/, __half* c /*[M, N]*/, "
            f"{_MNK}, cudaStream_t stream)")
BIAS_ACT_F32 = ("void bias_act_f32(const float* x /*[M, N]*/, const float* bias, float* out /*[M, N]*/, "
                "int M, int N, int relu, cudaStream_t stream)")
BIAS_ACT_F16 = ("void bias_act_f16(const __half* x /*[M, N]*/, const __half* bias, __half* out /*[M, N]*/, "
                "int M, int N, int relu, cudaStream_t stream)")
FUSED_LAUNCHERS = [FUSED_F32, FUSED_F16]
UNFUSED_LAUNCHERS = [GEMM_F32, GEMM_F16, BIAS_ACT_F32, BIAS_ACT_F16]
SUFFIX = {torch.float32: "f32", torch.float16: "f16"}

NOTEBOOK = "lab3/lab3.ipynb"
SOLUTION_SOURCES = {"BIAS_ACT_SOURCE": [BIAS_ACT_F32], "FUSED_SOURCE": [FUSED_F32],
                    "TEMPLATE_SOURCE": FUSED_LAUNCHERS, "TUNED_SOURCE": FUSED_LAUNCHERS}

# The lab's fixed unfused reference: the plain 16×16 shared-memory GEMM (the same tiling as the plain fused
# solution, without an epilogue), then a separate bias + activation kernel. Graded speedups are measured against
# this, never against a student's own unfused code.
REFERENCE_UNFUSED_SOURCE = r"""
#define TILE 16

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half(v); }

template <typename T>
__global__ void gemm_tiled(const T* a, const T* b, T* c, int M, int N, int K) {
    __shared__ float a_tile[TILE][TILE];
    __shared__ float b_tile[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        a_tile[ty][tx] = (row < M && k0 + tx < K) ? to_float(a[(int64_t)row * K + k0 + tx]) : 0.0f;
        b_tile[ty][tx] = (k0 + ty < K && col < N) ? to_float(b[(int64_t)(k0 + ty) * N + col]) : 0.0f;
        __syncthreads();
        for (int kk = 0; kk < TILE; ++kk) acc += a_tile[ty][kk] * b_tile[kk][tx];
        __syncthreads();
    }
    if (row < M && col < N) store(&c[(int64_t)row * N + col], acc);
}

template <typename T>
__global__ void bias_act_kernel(const T* x, const T* bias, T* out, int M, int N, int relu) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)M * N) return;
    float v = to_float(x[i]);
    if (bias) v += to_float(bias[i % N]);  // bias broadcast over rows: element (row, col) gets bias[col]
    if (relu) v = fmaxf(v, 0.0f);
    store(&out[i], v);
}

template <typename T>
static void launch_gemm(const T* a, const T* b, T* c, int M, int N, int K, cudaStream_t stream) {
    if (M <= 0 || N <= 0) return;
    dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    gemm_tiled<T><<<grid, block, 0, stream>>>(a, b, c, M, N, K);
}

template <typename T>
static void launch_bias_act(const T* x, const T* bias, T* out, int M, int N, int relu, cudaStream_t stream) {
    int64_t n = (int64_t)M * N;
    if (n > 0) bias_act_kernel<T><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, bias, out, M, N, relu);
}

void gemm_f32(const float* a, const float* b, float* c, int M, int N, int K, cudaStream_t stream) {
    launch_gemm(a, b, c, M, N, K, stream);
}
void gemm_f16(const __half* a, const __half* b, __half* c, int M, int N, int K, cudaStream_t stream) {
    launch_gemm(a, b, c, M, N, K, stream);
}
void bias_act_f32(const float* x, const float* bias, float* out, int M, int N, int relu, cudaStream_t stream) {
    launch_bias_act(x, bias, out, M, N, relu, stream);
}
void bias_act_f16(const __half* x, const __half* bias, __half* out, int M, int N, int relu, cudaStream_t stream) {
    launch_bias_act(x, bias, out, M, N, relu, stream);
}
"""


def pitfall_source(which: str) -> str:
    """The reference with one of the pitfalls this lab teaches put in (for the notebook's demonstrations)."""
    edits = {
        # no barrier between loading a tile and reading it: threads read tile elements nobody has written yet
        "missing_barrier": ("        __syncthreads();\n        for (int kk", "        for (int kk"),
        # bias indexed by the row instead of the column
        "wrong_axis": ("bias[i % N]", "bias[i / N]"),
        # partial tiles store their whole 16×16 block: past the last column and the last row of C
        "missing_bounds": ("if (row < M && col < N) store(&c", "store(&c"),
    }
    old, new = edits[which]
    assert old in REFERENCE_UNFUSED_SOURCE, which
    return REFERENCE_UNFUSED_SOURCE.replace(old, new)


# ---------------------------------------------------------------------------------------------------- shapes
# (M, N, K, has_bias, relu). Small shapes run under the CPU emulation and in the visible tests: 1, primes, one
# past a tile, sizes below one tile. GPU shapes serve the hidden tests on a GPU; timing uses the shapes below.
class GemmCase(NamedTuple):
    """A case of the tests: named, so that a failure report can say which size separates the failing cases from
    the passing ones ("every case with N == K passes": a stride of B that uses K for N)."""
    M: int
    N: int
    K: int
    bias: bool = True
    relu: bool = True


def _cases(shapes):
    return [GemmCase(*shape) for shape in shapes]


# Beside them, cases that tell the sizes apart: N == K with M != N (a B stride that uses K where N belongs passes
# those), M == N with K != N, and a second K that is a whole number of tiles (a K loop over whole tiles only, the
# tail dropped, passes exactly those); and an N that is a whole number of tiles with M != N, so that a B stride of M
# (right only where M == N) is not read as a loop that drops the tail of N.
SMALL_SHAPES = _cases([(1, 1, 1, True, True), (1, 17, 33, True, False), (5, 7, 3, False, True),
                       (16, 16, 16, True, True), (17, 31, 19, True, True), (33, 1, 40, False, False),
                       (40, 50, 70, True, True), (9, 20, 20, True, False), (24, 24, 40, True, True),
                       (7, 12, 32, False, True), (3, 16, 5, True, True)])
# small K (1, 3, 8, 17: below, at and one past a tile) with many rows: the shapes of the graded speed test's regime
SMALL_K_SHAPES = _cases([(40, 130, 1, True, True), (67, 129, 3, True, False), (33, 260, 8, False, True),
                         (50, 70, 17, True, True)])
HIDDEN_SMALL_SHAPES = _cases([(3, 130, 5, True, True), (70, 65, 129, True, False), (1, 100, 257, True, True),
                              (64, 64, 64, False, True), (2, 3, 1, True, True), (129, 9, 17, False, False)]) \
    + SMALL_K_SHAPES
GPU_SHAPES = [(1, 4096, 4096, True, True), (8, 4096, 4096, True, False), (16, 4000, 4100, False, True),
              (129, 1000, 257, True, True), (1000, 1, 1000, True, True), (1023, 1025, 513, True, True),
              (2048, 2048, 2048, False, False), (1, 1, 1, True, True),
              (4099, 1030, 1, True, True), (2050, 4096, 3, True, False), (16384, 4096, 8, False, True),
              (3001, 2049, 17, True, True), (16384, 4096, 16, True, True)]


# Empty outputs (M = 0, N = 0): nothing to compute, and a launcher must launch nothing, since CUDA refuses a grid
# of 0 blocks. Last in each list: on a GPU a check stops at a case that raised, and the others come first.
EMPTY_SHAPES = _cases([(0, 7, 5, True, True), (6, 0, 5, True, False)])
SMALL_SHAPES += EMPTY_SHAPES
HIDDEN_SMALL_SHAPES += _cases([(0, 1, 1, True, True), (3, 0, 17, False, True)])
GPU_SHAPES += [(0, 4096, 16, True, True), (16384, 0, 16, True, True)]


class Cancelling(NamedTuple):
    """An fp16 case (M, N, K, relu) in which the bias nearly cancels A·B: each column's bias is about minus that
    column's product, so C is of order 1 while A·B is of order ``CANCEL_SCALE`` (``make_inputs`` builds it; A's
    rows are nearly equal so that one bias per column can cancel every row).

    Random inputs cannot tell one rounding from two: A·B and the bias are then as large as C, and rounding A·B to
    half first costs at most half an fp16 step of C, within the tolerance. Here it costs half a step of a value
    ~256 times C, and the answer is lost. Pass it to ``fuselab.check`` like any shape; its ``hint`` is what a
    failure of it means."""

    M: int
    N: int
    K: int
    relu: bool = False

    hint = ("the bias nearly cancels A·B here (A·B is a few hundred, the result about 1), so a kernel that rounds "
            "A·B to half and then adds the bias (in half, or after converting back) rounds twice, and the first "
            "rounding, half an fp16 step of a few hundred, is larger than the tolerance of the small result. "
            "Round once: add the bias to the fp32 accumulator before converting to half (and apply the ReLU in "
            "float too), then store with one __float2half.")


CANCEL_SCALE = 256.0  # |A·B| / |C| in a Cancelling case, about
# fp16 only (in fp32 there is no intermediate rounding to catch, and the cancellation would test fp32's own
# accumulation error): a single row (the bias cancels it exactly), odd sizes, ReLU or not, and small K with
# M > 16, where the tuned kernel's tensor-core path runs (its accumulator starts at the bias)
CANCELLING_SHAPES = [Cancelling(1, 37, 19), Cancelling(17, 31, 19, True), Cancelling(40, 50, 70),
                     Cancelling(33, 40, 16, True)]
HIDDEN_CANCELLING_SHAPES = [Cancelling(3, 130, 5, True), Cancelling(70, 65, 129), Cancelling(67, 129, 3),
                            Cancelling(1, 100, 257, True)]
GPU_CANCELLING_SHAPES = HIDDEN_CANCELLING_SHAPES + [Cancelling(1, 4096, 1024), Cancelling(1000, 1030, 513, True),
                                                    Cancelling(16384, 4096, 16, True)]


def random_shapes(count, high, seed):
    """``count`` shapes with M, N, K drawn from 1..high (log-uniform, so small sizes and 1 come up), random bias
    and ReLU flags: the hidden tests' shapes beyond the fixed awkward ones."""
    gen = torch.Generator().manual_seed(seed)
    shapes = []
    for _ in range(count):
        m, n, k = (int(torch.exp(torch.rand(3, generator=gen) * math.log(high + 1)).floor().clamp(1, high)[i])
                   for i in range(3))
        flags = torch.rand(2, generator=gen) < 0.7
        shapes.append((m, n, k, bool(flags[0]), bool(flags[1])))
    return shapes


SKINNY_NK = 4096                  # skinny inference shapes: M rows, N = K = 4096 (B is 64 MB in fp32)
SKINNY_MS = [1, 4, 8, 16, 64]
SQUARE = (4096, 4096, 4096)       # compute-bound: the epilogue is nothing next to 137 GFLOP
SWEEP_MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096]
# the K axis: M = N = 4096 from K = 8 (C is nearly all the bytes) to K = 4096 (SQUARE, compute-bound)
K_SWEEP_MN = (4096, 4096)
SWEEP_KS = [8, 16, 32, 64, 128, 256, 1024, 4096]
# the graded speed test's shape (a LoRA-like up-projection: 16384 tokens, rank 16, 4096 features), dtype and
# mode, chosen from the GPU self-check's K sweep; the graded settings themselves live in fuselab/speed/policy.json
SMALL_K = (16384, 4096, 16)
GRADED_TEST = "lab3.gemm_bias_relu"
SWEEP_RESULTS = "lab3_sweep.json"


def full_shape(shape):
    """``(M, N, K, has_bias, relu)`` from a 3- or 5-tuple (a bare ``(M, N, K)`` has a bias and a ReLU) or a
    ``Cancelling`` case (which has a bias)."""
    if isinstance(shape, Cancelling):
        return (shape.M, shape.N, shape.K, True, bool(shape.relu))
    shape = tuple(shape)
    return shape + (True, True) if len(shape) == 3 else shape


def make_inputs(shape, seed, device="cpu", dtype=torch.float32):
    """``(a, b, bias, relu)``: random normal inputs (never zeros), A scaled by 1/sqrt(K) so C is of order 1.

    C of order 1, like the bias, makes a bias on the wrong axis visible, and lets the ReLU cut about half of C.
    Without a bias, ``bias`` is an empty tensor: the launcher then receives ``nullptr``.
    """
    m, n, k, has_bias, relu = full_shape(shape)
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)  # drawn where used: 4096² normals are slow on a CPU
    if isinstance(shape, Cancelling):
        return _cancelling_inputs(m, n, k, gen, device, dtype) + (int(relu),)
    a = torch.randn(m, k, generator=gen, device=device) / math.sqrt(k)
    b = torch.randn(k, n, generator=gen, device=device)
    bias = torch.randn(n, generator=gen, device=device) if has_bias else torch.empty(0, device=device)
    return tuple(t.to(dtype=dtype) for t in (a, b, bias)) + (int(relu),)


def _cancelling_inputs(m, n, k, gen, device, dtype):
    """(a, b, bias) with A·B of order CANCEL_SCALE and a bias that cancels each column of it to within O(1).

    Every row of A is one common row plus a small difference (1/CANCEL_SCALE of it), so A·B is a column constant of
    order CANCEL_SCALE plus a per-row part of order 1; the bias is minus the column's mean product (of the inputs as
    rounded to ``dtype``) plus a normal number, rounded to ``dtype``. C = A·B + bias is then of order 1."""
    common = torch.randn(1, k, generator=gen, device=device)
    a = (common + torch.randn(m, k, generator=gen, device=device) / CANCEL_SCALE) * (CANCEL_SCALE / math.sqrt(k))
    b = torch.randn(k, n, generator=gen, device=device)
    a, b = a.to(dtype), b.to(dtype)
    product = a.double() @ b.double()
    column = product.mean(dim=0) if m else torch.zeros(n, dtype=torch.float64, device=device)
    bias = torch.randn(n, generator=gen, device=device).double() - column
    return a, b, bias.to(dtype)


def reference(a, b, bias, relu):
    out = a @ b
    if bias.numel():
        out = out + bias  # broadcast over rows: row i gets bias[0..N)
    return torch.relu(out) if relu else out


def _sizes(a, b, bias):
    m, k = a.shape
    n = b.shape[1]
    if bias.numel() not in (0, n):
        raise ValueError(f"bias must have N = {n} elements (one per output column) or none, got {bias.numel()}")
    return m, n, k


def span(values, spec: str = ".2f") -> str:
    """The range of ``values`` as printed, "1.01–1.62", or one value where both ends print the same ("1.01", not
    "1.01–1.01")."""
    low, high = f"{min(values):{spec}}", f"{max(values):{spec}}"
    return low if low == high else f"{low}–{high}"


TENSOR_CORE_FILE = "lab3_tensor_cores.cu"


def tuned_source(source: str, backend: str | None = None, name: str = "tuned") -> str:
    """The notebook's ``TUNED_SOURCE`` (Part D) with the fp16 tensor-core path ahead of it, as ``backend`` (default:
    the one ``fuselab.build`` will use) compiles it (``fuselab/labs/lab3/tensorcore.py``): a launcher that tests
    ``FUSELAB_TENSOR_CORES`` may take it for fp16 at small K; one that does not builds as it is.

    ``name``: the ``name=`` the text is built under. ``#line`` directives give the path its own file name and start
    the student's text again at line 1 of ``<name>.cu``, so compiler messages count the student's own lines, not
    the hundreds of given lines in front of them."""
    from ...kernelbuild import resolve_backend
    from .tensorcore import tuned_path_source  # that module builds on this one: imported when asked for
    return (f'#line 1 "{TENSOR_CORE_FILE}"\n' + tuned_path_source(resolve_backend(backend))
            + f'\n#line 1 "{name}.cu"\n' + source)


def fused(module):
    """``op(a, b, bias, relu, out)`` through the module's ``gemm_bias_act_f32``/``_f16`` (by the inputs' dtype)."""
    def run(a, b, bias, relu, out):
        m, n, k = _sizes(a, b, bias)
        getattr(module, f"gemm_bias_act_{SUFFIX[a.dtype]}")(a, b, bias, out, m, n, k, int(relu))
    return run


def tuned_op(source):
    """The course's tuned kernel (the instructor notebook's ``TUNED_SOURCE``, its tensor-core path ahead of it, as
    the notebook's Part D builds it) as the speed test's op."""
    from ... import build
    return fused(build(tuned_source(source), FUSED_LAUNCHERS, name="tuned"))


def unfused(gemm_module, bias_act_module=None):
    """The two-kernel pipeline: GEMM into a temporary C, then bias + activation from it into ``out``."""
    bias_act_module = bias_act_module or gemm_module

    def run(a, b, bias, relu, out):
        m, n, k = _sizes(a, b, bias)
        suffix = SUFFIX[a.dtype]
        c = torch.empty_like(out)
        getattr(gemm_module, f"gemm_{suffix}")(a, b, c, m, n, k)
        getattr(bias_act_module, f"bias_act_{suffix}")(c, bias, out, m, n, int(relu))
    return run


def student_unfused(fused_module, bias_act_module):
    """A student's own unfused fp32 pipeline: their GEMM with no bias and no ReLU, then their bias_act kernel."""
    def run(a, b, bias, relu, out):
        m, n, k = _sizes(a, b, bias)
        c = torch.empty_like(out)
        fused_module.gemm_bias_act_f32(a, b, a.new_empty(0), c, m, n, k, 0)
        bias_act_module.bias_act_f32(c, bias, out, m, n, int(relu))
    return run


def k_sweep_shapes(ks=SWEEP_KS, mn=K_SWEEP_MN):
    """``(M, N, K)`` of the K sweep."""
    return [(mn[0], mn[1], k) for k in ks]


def traffic(m, n, k, bytes_per_element=4):
    """Minimum DRAM bytes: the GEMM reads A and B and writes C; the separate epilogue reads C and the bias and writes
    the output. Fused, the GEMM reads the bias itself: ``gemm + N`` elements."""
    gemm = (m * k + k * n + m * n) * bytes_per_element
    epilogue = (2 * m * n + n) * bytes_per_element
    return {"gemm": gemm, "epilogue": epilogue, "flops": 2 * m * n * k}


# Part D's goals (its markdown states them): the tuned kernel at the small-K shape against the C-write floor and the
# libraries, at 4096³ against cuBLAS, at the skinny shapes against F.linear + ReLU
TUNED_GOALS = {"floor": 0.60, "cublas_square": 0.40, "skinny_vs_linear": 1.5}


def saved_tuned_goals(saved=None) -> list:
    """What a student without a GPU reads of Part D: the course's own tuned kernel against each of Part D's goals, as
    the GPU self-check's saved sweep measured it (not the student's kernel: theirs is timed only on a GPU)."""
    saved = saved if saved is not None else saved_results(SWEEP_RESULTS)
    if not saved:
        return []
    lines = [f"the course's own tuned kernel (not yours: yours is timed only on a GPU), measured by its GPU self-check "
             f"({saved['gpu']}, {saved['date']}), against Part D's goals:"]
    for dtype, row in ((saved.get("small_k") or {}).get("summary") or {}).items():
        lines.append(f"  {dtype} at {list(SMALL_K)}: {row['tuned_fraction_of_floor']:.0%} of the C-write floor (goal: "
                     f"at least {TUNED_GOALS['floor']:.0%}), {row['tuned_vs_best_library']:.2f}x as fast as the "
                     "fastest of addmm + ReLU, _addmm_activation and torch.compile (goal: faster)")
    timed = {(tuple(r["shape"]), r["name"]): r["median_us"] for r in saved.get("cublas") or []}
    for shape in [SQUARE] + [(m, SKINNY_NK, SKINNY_NK) for m in (1, 4, 8, 16)]:
        tuned, linear = timed.get((shape, "tuned fused")), timed.get((shape, "F.linear + relu"))
        if tuned is None or linear is None:
            continue
        if shape == SQUARE:  # cuBLAS: the faster of its two entries
            cublas = min(linear, timed.get((shape, "torch.addmm + relu"), linear))
            lines.append(f"  fp32 at {list(shape)}: {cublas / tuned:.0%} of cuBLAS's rate (TF32 off; goal: at least "
                         f"{TUNED_GOALS['cublas_square']:.0%})")
        else:
            lines.append(f"  fp32 at {list(shape)}: {tuned / linear:.2f}x the time of F.linear + relu (goal: within "
                         f"{TUNED_GOALS['skinny_vs_linear']:.1f}x)")
    return lines


# ---------------------------------------------------------------------------------------------------- timing
def sweep(reference_op, fused_op, ms=SWEEP_MS, n=SKINNY_NK, k=SKINNY_NK, dtype=torch.float32, mode="device",
          budget_s=0.5, device="cuda", progress=None, shapes=None):
    """Fused over the unfused reference for M rows of an M×K by K×N layer: one row per M (or per ``(M, N, K)`` of
    ``shapes``, for the K axis)."""
    from ... import timing
    rows = []
    for m, n, k in shapes or [(m, n, k) for m in ms]:
        a, b, bias, relu = make_inputs((m, n, k), seed=m + k, device=device, dtype=dtype)
        out = torch.empty(m, n, device=device, dtype=dtype)
        result = timing.compare({"unfused": lambda: reference_op(a, b, bias, relu, out),
                                 "fused": lambda: fused_op(a, b, bias, relu, out)},
                                baseline="unfused", mode=mode, budget_s=budget_s, progress=progress)
        s = result.speedup("fused")
        t = traffic(m, n, k, a.element_size())
        rows.append({"M": m, "N": n, "K": k, "dtype": str(dtype).replace("torch.", ""), "mode": mode,
                     "speedup": s.value, "low": s.low, "high": s.high,
                     "unfused_us": result["unfused"].median * 1e6, "fused_us": result["fused"].median * 1e6,
                     "saved_share": (t["epilogue"] - n * a.element_size()) / (t["gemm"] + t["epilogue"]),
                     "flop_per_byte": t["flops"] / (t["gemm"] + n * a.element_size())})
        a = b = bias = out = None  # not del: the lambdas above close over these names
    return rows


REFERENCE_SOURCES = {"lab3_reference": (REFERENCE_UNFUSED_SOURCE, UNFUSED_LAUNCHERS)}


# ------------------------------------------------------------------------------------------------ declaration
from ..registry import GradedTest, Lab  # noqa: E402 - the declaration closes the module

LAB = Lab(
    name="lab3", title="MatMul + bias-Add: where fusing the epilogue pays", notebook=NOTEBOOK, package=__name__,
    launchers=SOLUTION_SOURCES, reference_sources=REFERENCE_SOURCES,
    graded_cells={"test_bias_act": 1, "test_fused": 3, "test_template": 3, "test_dram_bytes": 1,
                  "test_speedup_small_k": 4},
    written_answers={"answer_cublas": 1, "answer_where": 1},
    graded_tests=(GradedTest(GRADED_TEST, "test_speedup_small_k", mode="device", shape=SMALL_K, dtype="float16",
                             speed_requires=("test_template",), tuned_op="tuned_op"),),
)
