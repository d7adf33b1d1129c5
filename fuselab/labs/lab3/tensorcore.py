"""Lab 3's fp16 small-K kernel on the tensor cores: C = relu(A·B + bias) with one mma.sync per 16×8 output tile.

Not part of the graded path. The tuned kernel of the notebook's optional Part D takes it for fp16 at small K
(``tuned_path_source``, included ahead of the notebook's ``TUNED_SOURCE`` by ``lab3.tuned_source``); the GPU
self-check's lab3 stage (``fuselab/tools/gpu_selfcheck/lab_checks/lab3.py``) also checks its block layouts against the float64
reference at awkward shapes and times them side by side with the tuned kernel and the libraries.

Why the tensor cores: at 16384 × 4096 × 16 in fp16 the tuned kernel's CUDA-core small-K path takes its fp32
time (72.9 µs, docs/RESULTS.md): it spends 1.07 G fp32 FMAs on the CUDA cores and writes C with 8-byte stores, while cuBLASLt's
fused epilogue (``torch._addmm_activation``) takes 47.9 µs. Here the products go to the tensor cores (K = 16 is
exactly one m16n8k16 step, fp32 accumulation) and C, which is nearly all the traffic (134 MB against 0.6 MB of A
and B), goes out in 16-byte stores.

``TUNED_FP16_TC_SOURCE`` is the GPU source (inline PTX ``mma.sync``, compute capability 8.0 or newer). The CPU
emulation runs no PTX, so ``EMULATED_SOURCE`` is the same kernel text with ``mma_16816`` written out in CUDA C++
from the PTX ISA's fragment layouts: the tests run every index, guard and K step of the kernel on the CPU; only
the mma instruction itself is left to the GPU self-check.
"""

from .. import lab3

# ------------------------------------------------------------------------------------------ the mma itself
_ARCH_GUARD = r"""
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "this kernel needs mma.sync.m16n8k16 (compute capability 8.0 or newer)"
#endif
"""
_MMA_PTX_FUNCTION = r"""
// d = a·b + c on one 16×8 tile with k = 16: fp16 a (16×16, 4 registers) and b (16×8, 2), fp32 c and d (4 each).
// Not volatile: it has no side effects, so the compiler may schedule it like arithmetic.
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
"""
_MMA_PTX = _ARCH_GUARD + _MMA_PTX_FUNCTION

# The same operation for the CPU emulation, element by element, from the PTX ISA's fragment layouts for
# mma.m16n8k16 with .f16 inputs (lane = 4·g + t; in each 32-bit register the lower 16 bits hold the lower index):
#   a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
#   b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
#   c[0], c[1] = C[g][2t], C[g][2t+1]                 c[2], c[3] = C[g+8][2t], C[g+8][2t+1]
_MMA_EMULATED = r"""
__device__ __forceinline__ float mma_lo(uint32_t v) {
    return __half2float(__ushort_as_half((unsigned short)(v & 0xffffu)));
}
__device__ __forceinline__ float mma_hi(uint32_t v) {
    return __half2float(__ushort_as_half((unsigned short)(v >> 16)));
}

__device__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float acc[4] = {c[0], c[1], c[2], c[3]};
    for (int k = 0; k < 16; ++k) {
        int pair = (k % 8) / 2;  // which lane of a quad holds index k
        // A[g][k] and A[g+8][k]: lane 4g + pair, registers 2·(k/8) and 2·(k/8) + 1
        uint32_t top = __shfl_sync(0xffffffffu, a[2 * (k / 8)], 4 * g + pair);
        uint32_t bottom = __shfl_sync(0xffffffffu, a[2 * (k / 8) + 1], 4 * g + pair);
        // B[k][2t] and B[k][2t+1]: lanes 4·(2t) + pair and 4·(2t+1) + pair, register k/8
        uint32_t left = __shfl_sync(0xffffffffu, b[k / 8], 4 * (2 * t) + pair);
        uint32_t right = __shfl_sync(0xffffffffu, b[k / 8], 4 * (2 * t + 1) + pair);
        float a0 = k % 2 ? mma_hi(top) : mma_lo(top), a1 = k % 2 ? mma_hi(bottom) : mma_lo(bottom);
        float b0 = k % 2 ? mma_hi(left) : mma_lo(left), b1 = k % 2 ? mma_hi(right) : mma_lo(right);
        acc[0] += a0 * b0; acc[1] += a0 * b1; acc[2] += a1 * b0; acc[3] += a1 * b1;
    }
    for (int i = 0; i < 4; ++i) d[i] = acc[i];
}
"""

# ------------------------------------------------------------------------------------------ the kernel
_KERNEL = r"""
// fp16 C = act(A·B + bias) on the tensor cores, for small K (the graded 16384 × 4096 × 16): C is the traffic.
//
// Work split. A warp owns a strip of 32·G columns and walks down its block's rows 16 at a time. Per 16 rows it
// does 4·G m16n8k16 mma (one per 16×8 tile; K <= 16 is one k step), then bias (already in the accumulator),
// ReLU, rounding to fp16 and 2·G 16-byte stores per thread. The 8 warps of a block stand WARPS_N side by side
// along N (and 8 / WARPS_N deep along M), so a block covers ROWS × (WARPS_N·32·G) of C.
//
// Register-level store path, no shared memory and no shuffles. An mma leaves thread (g, t) (lane 4g + t) the
// tile columns 2t and 2t+1 of rows g and g+8: 4-byte pieces, 16 bytes apart. Which global column each tile
// column computes is ours to choose, since every thread loads its own column of B into its B fragment: tile j
// (of the 4 tiles of a 32-column group) column n computes global column 8·(n/2) + 2j + n%2. Then thread t holds,
// over the 4 tiles, the 8 consecutive columns 8t .. 8t+7 of rows g and g+8: one 16-byte store each, and the 4
// threads of a quad write 64 contiguous bytes (two whole 32-byte sectors) of a row per store instruction.
//
// K order. The mma sums over its 16 k slots in any order, so A and B only have to agree on which k each slot
// holds: slots 2t, 2t+1, 2t+8, 2t+9 (thread t's) hold k = 4t .. 4t+3. A thread's A values of a row are then 4
// consecutive halves: one 8-byte load per row (where K % 4 == 0 and A is 8-byte aligned).
//
// Bias. The mma computes A·B + C: C is the bias of the thread's columns, so the bias add costs nothing.
// ReLU on the fp32 sum, then one rounding to fp16 (the fp32-accumulation result, rounded once).
//
// Edges. Rows past M load row M-1 (any valid row) and are not stored; columns past N and k past K load zeros;
// stores of a partial 8-column piece, or where N % 8 != 0 or C is not 16-byte aligned, go element by element.
// K > 16 loops over k steps of 16 (zero-padded), reloading the B fragments per step: right for any K, fast only
// for K <= 16, the case it is for.
//
// Occupancy. No shared memory. G = 1 holds B fragments (8 registers), bias (8), accumulators (16) and A (4) and
// fits 64 registers (ptxas for sm_90: 62-64, no spills), so 4 blocks of 256 threads share an SM: 32 warps, each
// with its 16-byte stores in flight while it loads the next rows' A (8 bytes a row, from L1/L2: A is 0.5 MB).
// At 16384 × 4096 × 16 the tensor cores need a few us for the 2.1 GFLOP and the CUDA cores some 20 instructions
// per 16 bytes stored, so the bound is writing C's 134 MB: ~31 us at the 4.3 TB/s an fp32 fill_ of C reaches
// on the H200 (the fp16 fill_ that the self-check calls the C-write floor took 43.5 us: docs/RESULTS.md).

__device__ __forceinline__ uint32_t tc_pack(unsigned short lo, unsigned short hi) {
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

// two floats rounded to fp16, as the 32 bits of a half2 (lower half first in memory)
__device__ __forceinline__ uint32_t tc_half2_bits(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// This lane's A fragment for the 16 rows starting at row0 (rows row0 + g and row0 + g + 8) and k step k0.
__device__ __forceinline__ void tc_load_a(uint32_t frag[4], const unsigned short* __restrict__ a, int64_t row0,
                                          int g, int t, int M, int K, int k0, bool vec) {
    int64_t top = min(row0 + g, (int64_t)M - 1), bottom = min(row0 + g + 8, (int64_t)M - 1);
    int k = k0 + 4 * t;  // this lane's k = 4t .. 4t+3 of the step
    if (vec) {  // K % 4 == 0: the 4 values are all inside K or all past it
        uint2 x = make_uint2(0u, 0u), y = make_uint2(0u, 0u);
        if (k < K) {
            x = *reinterpret_cast<const uint2*>(a + top * K + k);
            y = *reinterpret_cast<const uint2*>(a + bottom * K + k);
        }
        frag[0] = x.x; frag[2] = x.y; frag[1] = y.x; frag[3] = y.y;
    } else {
        unsigned short x[4], y[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            x[i] = k + i < K ? a[top * K + k + i] : (unsigned short)0;
            y[i] = k + i < K ? a[bottom * K + k + i] : (unsigned short)0;
        }
        frag[0] = tc_pack(x[0], x[1]); frag[2] = tc_pack(x[2], x[3]);
        frag[1] = tc_pack(y[0], y[1]); frag[3] = tc_pack(y[2], y[3]);
    }
}

// This lane's B fragment for one tile: B[k0 + 4t .. 4t+3][col], zero past K and past N.
__device__ __forceinline__ void tc_load_b(uint32_t frag[2], const unsigned short* __restrict__ b, int col, int t,
                                          int N, int K, int k0) {
    unsigned short v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int k = k0 + 4 * t + i;
        v[i] = (col < N && k < K) ? b[(int64_t)k * N + col] : (unsigned short)0;
    }
    frag[0] = tc_pack(v[0], v[1]);
    frag[1] = tc_pack(v[2], v[3]);
}

// 8 consecutive outputs of one row, columns col .. col+7: ReLU, fp16, one 16-byte store where it can.
template <bool STREAM>
__device__ __forceinline__ void tc_store8(__half* __restrict__ c, int64_t row, int col, int M, int N,
                                          const float v[8], int relu, bool vec) {
    if (row >= M) return;
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = relu ? fmaxf(v[i], 0.0f) : v[i];
    __half* out = c + row * N + col;
    if (vec && col + 8 <= N) {
        uint4 w = make_uint4(tc_half2_bits(x[0], x[1]), tc_half2_bits(x[2], x[3]), tc_half2_bits(x[4], x[5]),
                             tc_half2_bits(x[6], x[7]));
        if (STREAM) __stcs(reinterpret_cast<uint4*>(out), w);  // evict-first: C is written once, never reread
        else *reinterpret_cast<uint4*>(out) = w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (col + i < N) out[i] = __float2half_rn(x[i]);
    }
}

// at most 64 registers for G = 1 (4 blocks of 256 threads an SM), 128 for G = 2 (2 blocks)
template <int WARPS_N, int G, int ROWS, bool ONE_STEP, bool STREAM>
__global__ void __launch_bounds__(256, G == 1 ? 4 : 2)
gemm_bias_act_f16_tc(const __half* __restrict__ a_, const __half* __restrict__ b_, const __half* __restrict__ bias,
                     __half* __restrict__ c, int M, int N, int K, int relu, bool vec_a, bool vec_c) {
    constexpr int WARPS_M = 8 / WARPS_N;
    static_assert(WARPS_N * WARPS_M == 8 && ROWS % (16 * WARPS_M) == 0, "8 warps; whole 16-row steps per warp");
    // fp16 bits as 16-bit integers: the operands go to the mma as they are, zeros are 0x0000
    const unsigned short* __restrict__ a = reinterpret_cast<const unsigned short*>(a_);
    const unsigned short* __restrict__ b = reinterpret_cast<const unsigned short*>(b_);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int g = lane / 4, t = lane % 4;
    int wn = warp % WARPS_N, wm = warp / WARPS_N;
    int col0 = (blockIdx.y * WARPS_N + wn) * (32 * G);  // the warp's first column
    int64_t block_row = (int64_t)blockIdx.x * ROWS;
    int rows = (int)min((int64_t)ROWS, (int64_t)M - block_row);

    // bias of this thread's columns col0 + 32q + 8t + i (i = 0..7), the accumulators' starting value
    float bias_v[G][8];
#pragma unroll
    for (int q = 0; q < G; ++q)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int col = col0 + 32 * q + 8 * t + i;
            bias_v[q][i] = (bias != nullptr && col < N) ? __half2float(bias[col]) : 0.0f;
        }
    // the global column that tile j's column n = g computes (see the store path above): the column whose B this
    // lane loads
    auto b_col = [&](int q, int j) { return col0 + 32 * q + 8 * (g / 2) + 2 * j + (g % 2); };

    // K <= 16: one k step, its B fragments loaded once for all the rows
    uint32_t bfrag[G][4][2];
    if (ONE_STEP) {
#pragma unroll
        for (int q = 0; q < G; ++q)
#pragma unroll
            for (int j = 0; j < 4; ++j) tc_load_b(bfrag[q][j], b, b_col(q, j), t, N, K, 0);
    }

#pragma unroll 2
    for (int r = wm * 16; r < rows; r += 16 * WARPS_M) {  // the same trip count for all lanes: the mma needs all 32
        int64_t row0 = block_row + r;
        float acc[G][4][4];
#pragma unroll
        for (int q = 0; q < G; ++q)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc[q][j][0] = acc[q][j][2] = bias_v[q][2 * j];
                acc[q][j][1] = acc[q][j][3] = bias_v[q][2 * j + 1];
            }
        uint32_t afrag[4];
        if (ONE_STEP) {
            tc_load_a(afrag, a, row0, g, t, M, K, 0, vec_a);
#pragma unroll
            for (int q = 0; q < G; ++q)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_16816(acc[q][j], afrag, bfrag[q][j], acc[q][j]);
        } else {
            for (int k0 = 0; k0 < K; k0 += 16) {
                tc_load_a(afrag, a, row0, g, t, M, K, k0, vec_a);
#pragma unroll
                for (int q = 0; q < G; ++q)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        uint32_t bf[2];
                        tc_load_b(bf, b, b_col(q, j), t, N, K, k0);
                        mma_16816(acc[q][j], afrag, bf, acc[q][j]);
                    }
            }
        }
        // tile j's accumulators 0, 1 (row g) and 2, 3 (row g+8) are columns 8t + 2j, 8t + 2j + 1 of the group
#pragma unroll
        for (int q = 0; q < G; ++q) {
            float top[8], bottom[8];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                top[2 * j] = acc[q][j][0]; top[2 * j + 1] = acc[q][j][1];
                bottom[2 * j] = acc[q][j][2]; bottom[2 * j + 1] = acc[q][j][3];
            }
            int col = col0 + 32 * q + 8 * t;
            tc_store8<STREAM>(c, row0 + g, col, M, N, top, relu, vec_c);
            tc_store8<STREAM>(c, row0 + g + 8, col, M, N, bottom, relu, vec_c);
        }
    }
}

template <int WARPS_N, int G, int ROWS, bool STREAM>
static void launch_f16_tc(const __half* a, const __half* b, const __half* bias, __half* c, int M, int N, int K,
                          int relu, cudaStream_t stream) {
    if (M <= 0 || N <= 0) return;
    bool vec_a = K % 4 == 0 && (uintptr_t)a % 8 == 0;   // 8-byte loads of 4 k values of a row
    bool vec_c = N % 8 == 0 && (uintptr_t)c % 16 == 0;  // 16-byte stores of 8 columns
    constexpr int BN = WARPS_N * 32 * G;
    // rows along x (up to 2^31 - 1 blocks), column blocks along y (up to 65535: N up to 65535·BN)
    dim3 grid((unsigned)((M + ROWS - 1) / ROWS), (unsigned)((N + BN - 1) / BN));
    if (K <= 16)
        gemm_bias_act_f16_tc<WARPS_N, G, ROWS, true, STREAM><<<grid, 256, 0, stream>>>(a, b, bias, c, M, N, K, relu,
                                                                                       vec_a, vec_c);
    else
        gemm_bias_act_f16_tc<WARPS_N, G, ROWS, false, STREAM><<<grid, 256, 0, stream>>>(a, b, bias, c, M, N, K, relu,
                                                                                        vec_a, vec_c);
}
"""

# ------------------------------------------------------------------------------------------ launchers
# The default layout, as the lab's fp16 launcher: 8 warps side by side, 32 columns each (G = 1), 128 rows per block.
# At 16384 × 4096 that is 2048 blocks of 256 × 128, about 4 per SM at a time.
DEFAULT = (8, 1, 128, False)
# Block layouts the self-check times side by side: (warps along N, 32-column groups per warp, rows per block,
# evict-first stores)
VARIANTS = [DEFAULT, (8, 1, 256, False), (8, 1, 64, False), (8, 2, 128, False), (4, 1, 128, False),
            (8, 1, 128, True)]


def variant_name(variant):
    wn, groups, rows, stream = variant
    return f"tc_w{wn}_g{groups}_r{rows}" + ("_cs" if stream else "")


def variant_label(variant):
    """The name the self-check's tables give a layout: "fp16 TC 8x32 cols, 128 rows (default)"."""
    wn, groups, rows, stream = variant
    return (f"fp16 TC {wn}x{32 * groups} cols, {rows} rows" + (", st.cs" if stream else "") +
            (" (default)" if variant == DEFAULT else ""))


def _variant_prototype(variant):
    return (f"void {variant_name(variant)}_f16(const __half* a, const __half* b, const __half* bias, __half* c, "
            f"int M, int N, int K, int relu, cudaStream_t stream)")


def _launchers_text():
    wn, groups, rows, stream = DEFAULT
    text = [f"\n{lab3.FUSED_F16} {{\n    launch_f16_tc<{wn}, {groups}, {rows}, {str(stream).lower()}>"
            f"(a, b, bias, c, M, N, K, relu, stream);\n}}\n"]
    for v in VARIANTS:
        wn, groups, rows, stream = v
        text.append(f"{_variant_prototype(v)} {{\n    launch_f16_tc<{wn}, {groups}, {rows}, {str(stream).lower()}>"
                    f"(a, b, bias, c, M, N, K, relu, stream);\n}}\n")
    return "\n".join(text)


LAUNCHERS = [lab3.FUSED_F16] + [_variant_prototype(v) for v in VARIANTS]
TUNED_FP16_TC_SOURCE = _MMA_PTX + _KERNEL + _launchers_text()
EMULATED_SOURCE = _MMA_EMULATED + _KERNEL + _launchers_text()

# The path as the tuned kernel (the notebook's Part D) includes it, ahead of its own source. For the CUDA build it
# compiles for any GPU: the mma written out (as above) where there is no mma.sync, below compute capability 8.0,
# where it is compiled but never launched. The CPU emulation gets the written-out mma only (it refuses inline PTX
# wherever it stands). Both define FUSELAB_TENSOR_CORES for the tuned launcher to test, and ``tc_supported()``,
# which the launcher asks before it takes this path.
_MMA_ANY = ("\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800\n" + _MMA_EMULATED + "#else\n" + _MMA_PTX_FUNCTION +
            "#endif\n")
_SUPPORTED = r"""
// mma.sync.m16n8k16 runs on compute capability 8.0 and newer (the CPU emulation runs the written-out version)
static bool tc_supported() {
#ifdef FUSELAB_EMULATION
    return true;
#else
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
        return false;
    return major >= 8;
#endif
}
"""


def tuned_path_source(backend: str) -> str:
    """The path's text for ``backend`` (``cuda`` or ``emulate``), to go ahead of the tuned kernel's source."""
    mma = _MMA_EMULATED if backend == "emulate" else _MMA_ANY
    return "#define FUSELAB_TENSOR_CORES 1\n" + mma + _KERNEL + _SUPPORTED


# (M, N, K, has_bias, relu) or lab3.Cancelling, checked in fp16 against the float64 reference before any timing: K = 1, 3, 8, 17
# (scalar A loads, a zero-padded k step, two k steps), 4096 (256 k steps); M = 1 and M, N off every tile size
# (16 rows, 8 and 32 columns, the block's 256); N % 8 != 0 (element stores); no bias, no ReLU; the timed shape.
CHECK_SHAPES = [(1, 1, 1, True, True), (1, 4096, 16, True, True), (5, 7, 3, False, True), (16, 256, 16, True, True),
                (17, 33, 16, True, False), (40, 130, 1, True, True), (67, 129, 3, True, False),
                (33, 260, 8, False, True), (50, 70, 17, True, True), (300, 264, 32, True, True),
                (129, 1000, 4096, True, True), (1, 4096, 4096, True, False), (1023, 1025, 513, True, True),
                (4099, 1030, 1, True, True), (2050, 4096, 3, True, False), (3001, 2049, 17, True, True),
                (16384, 4096, 8, False, True), lab3.SMALL_K + (True, True), lab3.SMALL_K + (False, False),
                # a bias that nearly cancels A·B: the accumulator starts at the bias, so C is rounded once
                lab3.Cancelling(16384, 4096, 16, True), lab3.Cancelling(300, 264, 8)]
# the same kinds of shape, small enough for the CPU emulation
EMULATED_SHAPES = [(1, 1, 1, True, True), (1, 300, 16, True, True), (5, 7, 3, False, True),
                   (16, 256, 16, True, True), (17, 33, 16, True, False), (40, 130, 1, True, True),
                   (67, 129, 3, True, False), (33, 264, 8, False, True), (50, 70, 17, True, True),
                   (37, 264, 32, True, True), (3, 40, 100, True, True), (140, 520, 16, True, True),
                   lab3.Cancelling(70, 264, 16, True), lab3.Cancelling(33, 40, 3)]


def variant_op(module, variant):
    """``op(a, b, bias, relu, out)`` through one layout's launcher (fp16 tensors only)."""
    launcher = getattr(module, f"{variant_name(variant)}_f16")

    def run(a, b, bias, relu, out):
        m, n, k = lab3._sizes(a, b, bias)
        launcher(a, b, bias, out, m, n, k, int(relu))
    return run


def build(backend=None):
    """The module with the default launcher (``gemm_bias_act_f16``) and every layout's; emulated on the CPU."""
    from ... import build as build_
    emulated = (backend or "").lower() in ("emulate", "emulation", "cpu")
    return build_(EMULATED_SOURCE if emulated else TUNED_FP16_TC_SOURCE, LAUNCHERS,
                  name="tuned_fp16_tc_emulated" if emulated else "tuned_fp16_tc", backend=backend)


def check_on_gpu():
    """Every layout checked at ``CHECK_SHAPES`` (fp16, float64 reference): ``{label: "ok" or the failure}``.

    The self-check runs this in a child process (``python -m fuselab.labs.lab3.tensorcore``), so that a kernel
    that faults (a CUDA error is sticky) leaves the stage's own CUDA context alive; layouts after a fault are
    left out of the answer, unchecked.
    """
    import torch

    from ... import check
    module = build("cuda")
    verdicts = {}
    for variant in VARIANTS:
        try:
            check(variant_op(module, variant), lab3.reference,
                  lambda shape, seed: lab3.make_inputs(shape, seed, "cuda", torch.float16), CHECK_SHAPES,
                  seeds=(1,), name=variant_label(variant), verbose=False)
            verdicts[variant_label(variant)] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported; a fault is sticky, so nothing after it can run
            verdicts[variant_label(variant)] = f"{type(exc).__name__}: {exc}"[:3000]
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                break
    return verdicts


VERDICTS_MARKER = "lab3_tensorcore verdicts: "

if __name__ == "__main__":
    import json
    print(VERDICTS_MARKER + json.dumps(check_on_gpu()), flush=True)
