"""Lab 0: why fusion pays, on F = relu(A + B) * E.

Unfused, the chain is three kernels and two intermediates that go through device memory: add writes T1, relu
reads T1 and writes T2, mul reads T2 and E. Fused, one kernel reads A, B and E once and writes F once.
"""

from pathlib import Path

import torch

from .. import randn_where_used

N = "n"
ADD = "void add(const float* a /*[n]*/, const float* b /*[n]*/, float* out /*[n]*/, int64_t n, cudaStream_t stream)"
RELU = "void relu(const float* x /*[n]*/, float* out /*[n]*/, int64_t n, cudaStream_t stream)"
MUL = "void mul(const float* x /*[n]*/, const float* y /*[n]*/, float* out /*[n]*/, int64_t n, cudaStream_t stream)"
FUSED = ("void add_relu_mul(const float* a /*[n]*/, const float* b /*[n]*/, const float* e /*[n]*/, "
         "float* out /*[n]*/, int64_t n, cudaStream_t stream)")
UNFUSED_LAUNCHERS = [ADD, RELU, MUL]
LAUNCHERS = [ADD, RELU, MUL, FUSED]

# The notebook's CUDA source variables and the launchers each must define (docs/LAB_AUTHORING.md).
NOTEBOOK = "lab0/lab0.ipynb"
SOLUTION_SOURCES = {"UNFUSED_SOURCE": UNFUSED_LAUNCHERS, "FUSED_SOURCE": [FUSED], "TUNED_SOURCE": [FUSED]}

# The lab's fixed unfused reference: graded speedups are measured against this, never against the student's own
# unfused kernels (which could be slowed on purpose). Plain one-element-per-thread kernels, as a student writes.
REFERENCE_UNFUSED_SOURCE = r"""
__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
__global__ void relu_kernel(const float* x, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(x[i], 0.0f);
}
__global__ void mul_kernel(const float* x, const float* y, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * y[i];
}
static unsigned blocks_for(int64_t n) { return (unsigned)((n + 255) / 256); }
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) add_kernel<<<blocks_for(n), 256, 0, stream>>>(a, b, out, n);
}
void relu(const float* x, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) relu_kernel<<<blocks_for(n), 256, 0, stream>>>(x, out, n);
}
void mul(const float* x, const float* y, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) mul_kernel<<<blocks_for(n), 256, 0, stream>>>(x, y, out, n);
}
"""

# Small sizes run under the CPU emulation and in the visible tests; awkward on purpose: 1, primes, one past a
# block, not a multiple of 256. GPU sizes are for the hidden tests and timing.
SMALL_SHAPES = [(1,), (7,), (255,), (256,), (257,), (1000,), (4099,)]
GPU_SHAPES = [(1,), (31,), (257,), (65_537,), (1_000_003,), (16_777_216 + 3,)]
TIMED_SHAPE = (64 * 2**20,)  # 64M fp32: each tensor 256 MiB, far beyond the H200's 60 MiB L2
GRADED_TEST = "lab0.add_relu_mul"


def make_inputs(shape, seed, device="cpu", dtype=torch.float32):
    """A, B, E: random normal (never zeros), so about half of A + B is negative and relu has work to do."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    tensors = [randn_where_used(shape, gen, seed + 7919 * k, device) for k in range(3)]
    return tuple(t.to(device=device, dtype=dtype) for t in tensors)


def reference(a, b, e):
    return torch.relu(a + b) * e


def unfused(module):
    """The three-kernel pipeline on a module that has add, relu and mul: allocates T1 and T2 like eager does."""
    def run(a, b, e, out):
        t1 = torch.empty_like(a)
        t2 = torch.empty_like(a)
        module.add(a, b, t1, a.numel())
        module.relu(t1, t2, a.numel())
        module.mul(t2, e, out, a.numel())
    return run


def fused(module):
    def run(a, b, e, out):
        module.add_relu_mul(a, b, e, out, a.numel())
    return run


def tuned_op(source):
    """The course's tuned kernel (the instructor notebook's ``TUNED_SOURCE``) as the speed test's op."""
    from ... import build
    return fused(build(source, [FUSED], name="tuned"))


def bytes_moved(n, dtype_size=4):
    """Minimum DRAM traffic: unfused reads 2+1+2 and writes 1+1+1 tensors; fused reads 3 and writes 1."""
    return {"unfused": 8 * n * dtype_size, "fused": 4 * n * dtype_size}


# Part 1: launch overhead. k launches of a one-thread kernel against one launch of k threads doing the same work.
TINY_SOURCE = r"""
__global__ void bump_one(float* x) { x[0] += 1.0f; }
__global__ void bump_all(float* x, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k) x[i] += 1.0f;
}
void many_launches(float* x, int k, cudaStream_t stream) {
    for (int i = 0; i < k; ++i) bump_one<<<1, 1, 0, stream>>>(x + i);
}
void one_launch(float* x, int k, cudaStream_t stream) {
    bump_all<<<(k + 255) / 256, 256, 0, stream>>>(x, k);
}
"""
TINY_LAUNCHERS = ["void many_launches(float* x, int k, cudaStream_t stream)",
                  "void one_launch(float* x, int k, cudaStream_t stream)"]

SWEEP_SIZES = [2**k for k in range(14, 29, 2)]  # 16K … 256M elements
SWEEP_RESULTS = "lab0_sweep.json"
COUNTER_RESULTS = "lab0_counters.json"  # the hardware counters of the GPU self-check's counters stage


def sweep(unfused_op, fused_op, sizes=SWEEP_SIZES, budget_s=1.0, device="cuda", progress=None):
    """Fused over unfused across sizes: speedup (with its interval) and achieved bandwidth of each."""
    from ... import timing
    rows = []
    for n in sizes:
        a, b, e = make_inputs((n,), seed=n % 1000, device=device)
        out = torch.empty_like(a)
        result = timing.compare({"unfused": lambda: unfused_op(a, b, e, out), "fused": lambda: fused_op(a, b, e, out)},
                                baseline="unfused", mode="device", budget_s=budget_s, progress=progress)
        moved = bytes_moved(n)
        s = result.speedup("fused")
        rows.append({"n": n, "speedup": s.value, "low": s.low, "high": s.high,
                     "unfused_s": result["unfused"].median, "fused_s": result["fused"].median,
                     "unfused_GBps": moved["unfused"] / result["unfused"].median / 1e9,
                     "fused_GBps": moved["fused"] / result["fused"].median / 1e9})
        a = b = e = out = None  # not del: the lambdas above close over these names
    return rows


def check_n_zero(launcher, inputs, name, device="cpu"):
    """Call ``launcher(*inputs empty tensors, out, 0)``: an empty tensor (n = 0) must launch nothing and return
    quietly. A launcher that launches ``(n + 255) / 256 = 0`` blocks fails on a GPU (and under the emulation)."""
    tensors = [torch.empty(0, device=device) for _ in range(inputs + 1)]
    try:
        launcher(*tensors, 0)
    except Exception as error:
        said = str(error)
        advice = ("" if "if (n > 0)" in said else  # the launcher's LaunchError already says how to fix it
                  " An empty tensor must launch nothing: a grid of 0 blocks is an invalid launch configuration, so "
                  "guard the launch with `if (n > 0)`")
        raise AssertionError(f"{name} with n = 0 failed ({type(error).__name__}: {said}).{advice}") from None


LAUNCH_RESULTS = "lab0_launch.json"  # fuselab.launch_overhead() on the course's GPU
# Measurements of the course's GPU that the notebooks show without a GPU. They ship inside the package, so a
# student with only labs/ and fuselab installed has them too.
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def saved_results(name):
    """A measurement the course's GPU self-check saved in fuselab/labs/results/ (for students without a GPU);
    None if absent."""
    import json
    path = RESULTS_DIR / name
    return json.loads(path.read_text()) if path.exists() else None


# The lab's fixed reference kernels, compiled by CI for the GPU too (tests/test_kernels_compile_for_cuda.py).
REFERENCE_SOURCES = {"lab0_reference": (REFERENCE_UNFUSED_SOURCE, UNFUSED_LAUNCHERS), "lab0_tiny": (TINY_SOURCE, TINY_LAUNCHERS)}


# ------------------------------------------------------------------------------------------------ declaration
from ..registry import GradedTest, Lab  # noqa: E402 - the declaration closes the module

LAB = Lab(
    name="lab0", title="Why fusion pays", notebook=NOTEBOOK, package=__name__,
    launchers=SOLUTION_SOURCES, reference_sources=REFERENCE_SOURCES,
    graded_cells={"test_dram_bytes": 1, "test_unfused": 3, "test_fused": 2, "test_speedup": 4},
    written_answers={"answer_naive_timing": 1, "answer_sweep": 1},
    graded_tests=(GradedTest(GRADED_TEST, "test_speedup", mode="device", shape=TIMED_SHAPE, dtype="float32",
                             speed_requires=("test_fused",), tuned_op="tuned_op"),),
)
GRADED_SETTINGS = LAB.graded_test(GRADED_TEST).timed()  # {mode, shape, dtype}, as declared
