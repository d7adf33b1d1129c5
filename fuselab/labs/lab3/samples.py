"""Lab 3's sample submissions for the grader's sample class (see fuselab/course/sample_class.py).

grade ids: test_bias_act (1), test_fused (3), test_template (3), test_dram_bytes (1), test_speedup_small_k (4);
written answers are graded by hand and not listed. The speed test times the Part B template kernel at the small-K
shape of the policy (fuselab/speed/policy.json) against the lab's unfused reference.
"""

from ..registry import Sample


def _replace(old, new):
    def change(source):
        if old not in source:
            raise ValueError(f"sample pattern not found: {old!r}")
        return source.replace(old, new)
    return change


def _chain(*changes):
    def change(source):
        for step in changes:
            source = step(source)
        return source
    return change


# A different small-K kernel, equally right: one thread per column of C and 16 rows of sums in registers; per
# chunk of 16 along K the block stages A's 16 × 16 piece in shared memory and each thread reads its column's 16
# values of B straight into registers. No B tile, 1-D blocks, the bias and ReLU applied before the only store.
_COLUMN_THREADS = r'''TEMPLATE_SOURCE = r"""
#define COLS 256   // columns of C per block: one thread each
#define ROWS 16    // rows of C per block: each thread keeps 16 sums
#define KC 16      // K is walked in chunks of 16 (ROWS * KC == COLS: one element of A per thread per chunk)

__device__ __forceinline__ float as_float(float x) { return x; }
__device__ __forceinline__ float as_float(__half x) { return __half2float(x); }
__device__ __forceinline__ void put(float* p, float v) { *p = v; }
__device__ __forceinline__ void put(__half* p, float v) { *p = __float2half(v); }

template <typename T>
__global__ void rows_times_column(const T* a, const T* b, const T* bias, T* c, int M, int N, int K, int relu) {
    __shared__ float a_s[ROWS][KC];
    int col = blockIdx.x * COLS + threadIdx.x;
    long long row0 = (long long)blockIdx.y * ROWS;
    float sum[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) sum[r] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += KC) {
        int r = threadIdx.x / KC, kk = threadIdx.x % KC;
        a_s[r][kk] = (row0 + r < M && k0 + kk < K) ? as_float(a[(row0 + r) * K + k0 + kk]) : 0.0f;
        float bk[KC];
#pragma unroll
        for (int j = 0; j < KC; ++j)
            bk[j] = (col < N && k0 + j < K) ? as_float(b[(long long)(k0 + j) * N + col]) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ROWS; ++i)
#pragma unroll
            for (int j = 0; j < KC; ++j) sum[i] += a_s[i][j] * bk[j];
        __syncthreads();
    }
    if (col >= N) return;
    float add = bias ? as_float(bias[col]) : 0.0f;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        if (row0 + i >= M) break;
        float v = sum[i] + add;
        put(&c[(row0 + i) * N + col], relu ? fmaxf(v, 0.0f) : v);
    }
}

template <typename T>
static void run(const T* a, const T* b, const T* bias, T* c, int M, int N, int K, int relu, cudaStream_t stream) {
    if (M <= 0 || N <= 0) return;
    dim3 grid((N + COLS - 1) / COLS, (M + ROWS - 1) / ROWS);
    rows_times_column<T><<<grid, COLS, 0, stream>>>(a, b, bias, c, M, N, K, relu);
}

void gemm_bias_act_f32(const float* a, const float* b, const float* bias, float* c, int M, int N, int K, int relu,
                       cudaStream_t stream) {
    run(a, b, bias, c, M, N, K, relu, stream);
}

void gemm_bias_act_f16(const __half* a, const __half* b, const __half* bias, __half* c, int M, int N, int K,
                       int relu, cudaStream_t stream) {
    run(a, b, bias, c, M, N, K, relu, stream);
}
"""
'''

# The template's GEMM stores A·B + bias, and a second kernel of the student's own applies the ReLU in place, both
# launched from the fused launcher: right answers (the ReLU of a rounded value is the rounded ReLU, so fp16 is
# still rounded once: a second kernel that added the bias to a C already rounded to fp16 would round twice and
# fail the test where the bias cancels A·B), with the unfused pipeline's second pass over C and second launch.
_EPILOGUE_KERNEL = '''template <typename T>
__global__ void relu_in_place(T* c, int M, int N, int relu) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)M * N) return;
    float v = to_float(c[i]);
    store(&c[i], relu ? fmaxf(v, 0.0f) : v);
}

template <typename T>
static void launch('''
_SECOND_LAUNCH = ('''    gemm_bias_act_kernel<T><<<grid, block, 0, stream>>>(a, b, bias, c, M, N, K, relu);
''', '''    gemm_bias_act_kernel<T><<<grid, block, 0, stream>>>(a, b, bias, c, M, N, K, relu);
    int64_t n = (int64_t)M * N;
    relu_in_place<T><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(c, M, N, relu);
''')

SAMPLES = {
    "correct": Sample(why="the instructor's plain solution"),
    "missing_barrier": Sample(
        changes={"fused_source": _replace("        __syncthreads();  // the tiles are complete before anyone reads them\n",
                                          ""),
                 "template_source": _replace("        __syncthreads();\n        for (int kk", "        for (int kk")},
        expect={"test_fused": "zero", "test_template": "zero", "test_speedup_small_k": "zero"},
        # On a GPU the race may go unseen on some shapes; the emulation sees it every time.
        expect_gpu={"test_fused": "any", "test_template": "any", "test_speedup_small_k": "any"},
        why="no __syncthreads() between loading a tile and reading it: threads read tile elements not yet loaded "
            "(NaN under the emulation; racy on a GPU)"),
    "wrong_broadcast_axis": Sample(
        changes={"bias_act_source": _replace("bias[i % N]", "bias[i / N]"),
                 "fused_source": _replace("bias ? bias[col] : 0.0f", "bias ? bias[row] : 0.0f"),
                 "template_source": _replace("bias ? to_float(bias[col])", "bias ? to_float(bias[row])")},
        expect={"test_bias_act": "zero", "test_fused": "zero", "test_template": "zero",
                "test_speedup_small_k": "zero"},
        why="the bias indexed by the row instead of the column: wrong wherever a bias is added (the speed test "
            "checks the result at its shape first)"),
    "small_k_columns": Sample(
        changes={"template_source": _COLUMN_THREADS},
        why="a different template kernel, equally right: one thread per column with 16 rows of sums in registers, "
            "A staged in shared memory, B read into registers; at the small-K shape it is faster than the plain "
            "solution: full speed points"),
    "unfused_in_disguise": Sample(
        changes={"template_source": _chain(
            _replace("float v = acc + (bias ? to_float(bias[col]) : 0.0f);  // bias added in fp32, before the "
                     "single rounding\n        store(&c[(int64_t)row * N + col], relu ? fmaxf(v, 0.0f) : v);",
                     "float v = acc + (bias ? to_float(bias[col]) : 0.0f);\n"
                     "        store(&c[(int64_t)row * N + col], v);  // the ReLU: a second kernel below"),
            _replace("template <typename T>\nstatic void launch(", _EPILOGUE_KERNEL),
            _replace(*_SECOND_LAUNCH))},
        expect={"test_speedup_small_k": "zero"},
        why="right answers, but the 'fused' launcher launches the GEMM (bias included) and then a ReLU kernel over "
            "C: the unfused pipeline's second pass in disguise; the speed test counts two kernels: 0 "
            "speed points"),
    "cheat_cublas": Sample(
        changes={"dram_bytes": lambda s: s + (
            "\n\n# make the 'fused' op call cuBLAS (torch.addmm) instead of a kernel of my own\n"
            "import torch as _torch\n"
            "from fuselab.labs import lab3 as _lab3\n"
            "_lab3.fused = lambda module: (lambda a, b, bias, relu, out: out.copy_(\n"
            "    _torch.relu(_torch.addmm(bias, a, b)) if relu else _torch.addmm(bias, a, b)))\n")},
        expect_gpu={"test_speedup_small_k": "full"},
        why="the fused op is rebound to cuBLAS (torch.addmm) in a Python cell: a run of the whole notebook is "
            "fooled, the clean recheck drops the rebinding and times the student's own template kernel: full speed "
            "points, earned by that kernel"),
}

# samples whose template kernel is not the solution's: the GPU self-check's lab3 stage runs the speed test on them
SPEED_SAMPLES = ["small_k_columns", "unfused_in_disguise"]
