"""The CPU emulation: the same .cu runs on the CPU and computes what it would on a GPU.

Kernels live in tests/emulation_kernels/*.cu, a few per file, each file built once per session through
``fuselab.build(..., backend="emulate")``. References are float64, inputs random (never zeros), sizes awkward.
"""

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fuselab
from fuselab.kernelbuild import emulate as emulation
from fuselab.errors import BuildError, LaunchError, UnsupportedConstruct

KERNELS = Path(__file__).parent / "emulation_kernels"
ORDERS = ["forward", "reverse", "random"]
GARBAGE_WORD = 0x7FBADBAD

BASICS = [
    "void math_launch(const float* x, const float* y, float* out, int n, cudaStream_t stream)",
    "void conv_launch(const float* x, const float* w, const float* bias, float* out, int N, int C, int H, int W,"
    " int K, cudaStream_t stream)",
    "void where_launch(int* out, int gx, int gy, int gz, int bx, int by, int bz, cudaStream_t stream)",
    "void copy4_launch(const float* in, float* out, int n, cudaStream_t stream)",
    "void atomics_launch(const float* x, float* fsum, double* dsum, int* isum, int* usum, int* imax, int* imin,"
    " int* cas_count, int* exch, int n, cudaStream_t stream)",
    "void half_rows_launch(const __half* x, const __half* w, __half* out, float* out_f, int rows, int cols,"
    " cudaStream_t stream)",
    "void half_ops_launch(const __half* a, const __half* b, __half* sum, __half* prod, __half* mixed, int n,"
    " cudaStream_t stream)",
    "void convert_launch(const float* in, __half* h, float* back, __nv_bfloat16* bf, int n, cudaStream_t stream)",
    "int errors_launch(float* out, int n, cudaStream_t stream)",
    "void occupancy_launch(int* out, int block_limit, int shared_bytes, cudaStream_t stream)",
]
BARRIERS = [
    "void gemm_launch(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream)",
    "void gemm_missing_barrier_launch(const float* A, const float* B, float* C, int M, int N, int K,"
    " cudaStream_t stream)",
    "void block_sum_launch(const float* x, float* partial, int n, int block, cudaStream_t stream)",
    "void block_sum_unguarded_launch(const float* x, float* partial, int n, int block, cudaStream_t stream)",
    "void tree_sum_launch(const float* x, float* partial, int n, int block, cudaStream_t stream)",
    "void tree_sum_missing_barrier_launch(const float* x, float* partial, int n, int block, cudaStream_t stream)",
    "void shared_garbage_launch(float* out, int* raw, float* dyn_out, int blocks, cudaStream_t stream)",
    "void warp_ops_launch(const float* x, float* down, float* up, float* xr, float* idx, float* down16,"
    " int* ballot, int* counts, int threads, cudaStream_t stream)",
    "void deadlock_launch(float* out, cudaStream_t stream)",
    "void assert_launch(const float* x, int n, cudaStream_t stream)",
]
LIMITS = [
    "void configured_launch(float* out, int n, int gx, int gy, int gz, int bx, int by, int bz, int shmem,"
    " cudaStream_t stream)",
    "int allow_dynamic_shared(int bytes, cudaStream_t stream)",
    "void big_static_launch(float* out, cudaStream_t stream)",
]


def build(filename, launchers, **options):
    source = (KERNELS / filename).read_text()
    return fuselab.build(source, launchers, name=Path(filename).stem, backend="emulate", **options)


@pytest.fixture(scope="module")
def basics():
    return build("basics.cu", BASICS)


@pytest.fixture(scope="module")
def barriers():
    return build("barriers.cu", BARRIERS)


@pytest.fixture(scope="module")
def limits():
    return build("limits.cu", LIMITS)


def random_tensor(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    t[t == 0] = 0.5  # never zeros
    return t.to(dtype)


def stat(module, which):
    fn = module._lib.fuselab_emu_stat
    fn.restype, fn.argtypes = ctypes.c_ulonglong, [ctypes.c_int]
    return fn(which)


def assert_close(actual, expected, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------------------ barrier-free

@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_math_functions_elementwise(basics, n):
    x, y = random_tensor(n, seed=1), random_tensor(n, seed=2)
    out = torch.empty(n)
    basics.math_launch(x, y, out, n)
    a, b, i = x.double(), y.double(), torch.arange(n, dtype=torch.float64)
    ref = (a + b) + 1 + a / 2 + a * b + 1 + torch.tanh(a) + torch.log(a.abs() + 1) + b.abs() ** 1.5
    ref += torch.clamp(i, max=3) + torch.clamp(i % 5, min=2)
    ref += a.clamp(0, 1) + torch.floor(b) + torch.ceil(a) + torch.round(b)
    # roundf rounds halves away from zero, torch.round to even: inputs from randn never sit on .5
    assert_close(out, ref, rtol=1e-5, atol=1e-4)


def test_a_launch_types_and_allocates_nothing_in_ctypes(basics, monkeypatch):
    """What every launch calls in the library (the barrier note, the stream watch, the last error) is typed and its
    buffers made once, as the library loads: a launch neither looks a function up by name nor allocates a buffer."""
    class NoLookups:
        def __getattr__(self, name):
            raise AssertionError(f"a launch looked up {name} in the library")

    made = []
    real = ctypes.create_string_buffer
    monkeypatch.setenv("FUSELAB_EMU_GUARD", "0")
    monkeypatch.setattr(ctypes, "create_string_buffer", lambda *a: made.append(a) or real(*a))
    monkeypatch.setattr(basics, "_lib", NoLookups())
    n = 300
    x, y = random_tensor(n, seed=1), random_tensor(n, seed=2)
    outs = [torch.empty(n) for _ in range(3)]
    for out in outs:
        basics.math_launch(x, y, out, n)
    assert made == [], made
    assert all(torch.equal(out, outs[0]) for out in outs) and bool(torch.isfinite(outs[0]).all())


@pytest.mark.parametrize("shape", [(2, 3, 17, 19, 4), (1, 1, 1, 1, 1), (1, 2, 16, 33, 3)])
def test_conv3x3_padding(basics, shape):
    N, C, H, W, K = shape
    x, w, b = random_tensor(N, C, H, W, seed=3), random_tensor(K, C, 3, 3, seed=4), random_tensor(K, seed=5)
    out = torch.empty(N, K, H, W)
    basics.conv_launch(x, w, b, out, N, C, H, W, K)
    ref = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1)
    assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grid,block", [((3, 2, 2), (4, 3, 2)), ((1, 1, 1), (1, 1, 1)), ((2, 1, 3), (8, 8, 4))])
def test_three_dimensional_grid_and_block(basics, grid, block):
    blocks, threads = grid[0] * grid[1] * grid[2], block[0] * block[1] * block[2]
    out = torch.full((blocks * threads * 6,), -1, dtype=torch.int32)
    basics.where_launch(out, *grid, *block)
    got = out.view(blocks, threads, 6)
    for bz in range(grid[2]):
        for by in range(grid[1]):
            for bx in range(grid[0]):
                b = bx + grid[0] * (by + grid[1] * bz)
                tz, ty, tx = torch.meshgrid(torch.arange(block[2]), torch.arange(block[1]), torch.arange(block[0]),
                                            indexing="ij")
                expected = torch.stack([torch.full_like(tx, bx), torch.full_like(tx, by), torch.full_like(tx, bz),
                                        tx, ty, tz + 100], dim=-1).reshape(threads, 6)
                assert torch.equal(got[b], expected.to(torch.int32)), (bx, by, bz)


@pytest.mark.parametrize("n", [1, 7, 1000, 1027])
def test_float4_vectorized_copy(basics, n):
    x = random_tensor(n, seed=6)
    out = torch.empty(n)
    basics.copy4_launch(x, out, n)
    bump = torch.tensor([1.0, 2.0, 3.0, 4.0]).repeat((n + 3) // 4)[:n]
    tail = n - n % 4
    bump[tail:] = torch.tensor([1.0, 2.0] * 2)[: n - tail]
    if (n - tail) % 2:
        bump[n - 1] = 1.0
    assert torch.equal(out, x + bump)  # one float add per element: exact


def test_atomics_across_blocks(basics):
    n = 1000
    x = random_tensor(n, seed=7)
    fsum, dsum = torch.empty(1), torch.empty(1, dtype=torch.float64)
    isum, usum, imax, imin, cas, exch = (torch.empty(1, dtype=torch.int32) for _ in range(6))
    basics.atomics_launch(x, fsum, dsum, isum, usum, imax, imin, cas, exch, n)
    q = torch.floor(x * 100).to(torch.int32)
    assert_close(fsum, x.double().sum().reshape(1), rtol=1e-4, atol=1e-3)
    assert_close(dsum, x.double().sum().reshape(1), rtol=1e-12, atol=1e-9)
    assert isum.item() == q.sum().item()
    assert usum.item() == n
    assert imax.item() == q.max().item() and imin.item() == q.min().item()
    assert 1 <= cas.item() <= n and exch.item() == 7


def test_fp16_storage_with_float_accumulation(basics):
    rows, cols = 37, 19
    x, w = random_tensor(rows, cols, seed=8, dtype=torch.float16), random_tensor(cols, seed=9, dtype=torch.float16)
    out, out_f = torch.empty(rows, dtype=torch.float16), torch.empty(rows)
    basics.half_rows_launch(x, w, out, out_f, rows, cols)
    ref = x.double() @ w.double()
    assert_close(out_f, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(out, out_f.half())  # __float2half rounds exactly as torch does


def test_half_arithmetic_and_operators(basics):
    n = 1000
    a, b = random_tensor(n, seed=10, dtype=torch.float16), random_tensor(n, seed=11, dtype=torch.float16)
    s, p, m = (torch.empty(n, dtype=torch.float16) for _ in range(3))
    basics.half_ops_launch(a, b, s, p, m, n)
    assert torch.equal(s, a + b) and torch.equal(p, a * b)  # one rounding, like the GPU's half instructions
    af, bf = a.float(), b.float()
    mixed = (((af * bf).half().float() + af).half().float() - bf).half()
    assert torch.equal(m, torch.where(a > b, mixed, -mixed))


def test_half_and_bfloat16_conversions_are_bit_exact(basics):
    special = [0.0, -0.0, 65504.0, 65519.99, 65520.0, 1e6, -1e6, 5.96e-8, 2.98e-8, 2.9802326e-08, 2.9802327e-08,
               6.1e-5, 6.103515625e-05, 1.0009765625, 1.00048828125, 1.00146484375, float("inf"), float("-inf"),
               float("nan"), 3.4e38, 1e-40]
    halves = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    values = torch.cat([torch.tensor(special), halves, random_tensor(20000, seed=12) * 1000,
                        random_tensor(20000, seed=13) * 1e-5, torch.rand(20000, dtype=torch.float32) * 70000])
    n = values.numel()
    h, back, bf = torch.empty(n, dtype=torch.float16), torch.empty(n), torch.empty(n, dtype=torch.bfloat16)
    basics.convert_launch(values, h, back, bf, n)
    nan = torch.isnan(values)
    assert torch.equal(h[~nan].view(torch.int16), values[~nan].half().view(torch.int16))
    assert torch.isnan(h[nan].float()).all() and torch.isnan(back[nan]).all()
    assert torch.equal(back[~nan], values[~nan].half().float())
    assert torch.equal(bf[~nan].view(torch.int16), values[~nan].bfloat16().view(torch.int16))


def test_error_query_calls(basics):
    out = random_tensor(10, seed=14)
    basics.errors_launch(out, 10)  # a nonzero return would raise LaunchError


@pytest.mark.parametrize("limit,shared", [(0, 0), (256, 0), (96, 0), (0, 40_000)])
def test_the_occupancy_calculator_answers_as_a_gpu_of_the_emulations_limits(basics, limit, shared):
    """A launcher may size its grid with cudaOccupancyMaxPotentialBlockSize (honest CUDA): the answers stay within
    the emulated device's limits (2048 threads and 32 blocks a multiprocessor, 132 of them) and agree."""
    out = torch.zeros(3, dtype=torch.int32)
    basics.occupancy_launch(out, limit, shared)
    min_grid, block, resident = out.tolist()
    assert 32 <= block <= (limit or 1024) and block % 32 == 0
    assert 1 <= resident <= min(32, 2048 // block) and min_grid == 132 * resident
    if shared:
        assert resident * (shared + 1024) <= 228 * 1024


def test_barrier_free_kernels_run_as_plain_loops(basics):
    loops, fiber_blocks = stat(basics, 1), stat(basics, 2)
    basics.math_launch(random_tensor(600), random_tensor(600), torch.empty(600), 600)
    assert stat(basics, 1) == loops + 3 and stat(basics, 2) == fiber_blocks


# -------------------------------------------------------------------------------------------- barriers

GEMM_SHAPES = [(37, 29, 45), (1, 1, 1), (16, 16, 16), (33, 17, 50)]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shape", GEMM_SHAPES)
def test_tiled_gemm_with_barriers(barriers, order, shape):
    M, N, K = shape
    A, B = random_tensor(M, K, seed=20), random_tensor(K, N, seed=21)
    C = torch.empty(M, N)
    barriers.set_thread_order(order, seed=5)
    barriers.gemm_launch(A, B, C, M, N, K)
    assert_close(C, A.double() @ B.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ORDERS)
def test_tiled_gemm_missing_barrier_gives_wrong_results(barriers, order):
    M, N, K = 37, 29, 45
    A, B = random_tensor(M, K, seed=20), random_tensor(K, N, seed=21)
    C = torch.empty(M, N)
    barriers.set_thread_order(order, seed=5)
    barriers.gemm_missing_barrier_launch(A, B, C, M, N, K)
    ref = A.double() @ B.double()
    assert not torch.allclose(C.double(), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("n,block", [(1, 32), (1000, 256), (1000, 48), (3000, 1000), (64, 1024)])
def test_warp_shuffle_block_sum(barriers, order, n, block):
    x = random_tensor(n, seed=22)
    blocks = (n + block - 1) // block
    partial = torch.empty(blocks)
    barriers.set_thread_order(order, seed=6)
    barriers.block_sum_launch(x, partial, n, block)
    ref = torch.nn.functional.pad(x.double(), (0, blocks * block - n)).view(blocks, block).sum(1)
    assert_close(partial, ref, rtol=1e-5, atol=1e-5)


def test_full_mask_shuffle_on_a_partial_warp_reads_garbage(barriers):
    # Lanes past the end of a partial warp do not exist: CUDA leaves the value read from them undefined.
    x = random_tensor(48, seed=22)
    partial = torch.empty(1)
    barriers.block_sum_unguarded_launch(x, partial, 48, 48)
    assert torch.isnan(partial).all()


@pytest.mark.parametrize("order", ORDERS)
def test_dynamic_shared_tree_sum_and_its_missing_barrier(barriers, order):
    # Run in reverse, each thread finds the partial sums of the higher threads complete: the missing
    # barrier happens to be harmless in that one order. That is why orders are a choice, and random exists.
    n, block = 1000, 128
    x = random_tensor(n, seed=23)
    blocks = (n + block - 1) // block
    ref = torch.nn.functional.pad(x.double(), (0, blocks * block - n)).view(blocks, block).sum(1)
    partial = torch.empty(blocks)
    barriers.set_thread_order(order, seed=7)
    barriers.tree_sum_launch(x, partial, n, block)
    assert_close(partial, ref, rtol=1e-5, atol=1e-5)
    barriers.tree_sum_missing_barrier_launch(x, partial, n, block)
    if order != "reverse":
        assert not torch.allclose(partial.double(), ref, rtol=1e-3, atol=1e-3)


def test_barrier_kernels_run_on_fibers(barriers):
    fiber_blocks = stat(barriers, 2)
    barriers.block_sum_launch(random_tensor(100), torch.empty(2), 100, 64)
    assert stat(barriers, 2) == fiber_blocks + 2


def test_shared_memory_starts_as_garbage_in_every_block(barriers):
    blocks = 6
    out, raw, dyn = torch.empty(blocks * 64), torch.empty(blocks * 64, dtype=torch.int32), torch.empty(blocks * 64)
    barriers.set_thread_order("forward")
    barriers.shared_garbage_launch(out, raw, dyn, blocks)
    for result in (out, dyn):
        assert torch.equal(result[:64], torch.ones(64))
        assert torch.isnan(result[64:]).all()  # never block 0's ones
        assert (result[64:].view(torch.int32) == GARBAGE_WORD).all()
    assert (raw[:64] == 1).all() and (raw[64:] == GARBAGE_WORD).all()


def test_warp_operations_on_a_partial_warp(barriers):
    threads = 48  # one full warp, one of 16 lanes
    x = random_tensor(threads, seed=24)
    outs = [torch.empty(threads) for _ in range(5)]
    ballot, counts = torch.empty(threads, dtype=torch.int32), torch.empty(threads * 4, dtype=torch.int32)
    barriers.set_thread_order("reverse")
    barriers.warp_ops_launch(x, *outs, ballot, counts, threads)
    down, up, xr, idx, down16 = outs
    for t in range(threads):
        warp, lane = divmod(t, 32)
        lanes = min(32, threads - 32 * warp)
        base = 32 * warp

        def value(src_lane):
            return x[base + src_lane].item() if src_lane < lanes else None

        def check(result, src_lane):
            expected = value(src_lane)
            if expected is None:
                assert result.view(torch.int32)[t].item() == GARBAGE_WORD
            else:
                assert result[t].item() == expected, (t, src_lane)

        check(down, lane + 3 if lane + 3 < 32 else lane)
        check(up, lane - 2 if lane >= 2 else lane)
        check(xr, lane ^ 5)
        check(idx, 7)
        check(down16, lane + 4 if (lane % 16) + 4 < 16 else lane)
        mask = sum(1 << l for l in range(lanes) if x[base + l] > 0)
        assert ballot[t].item() & 0xFFFFFFFF == mask
        warp_values = x[base : base + lanes]
        assert counts[4 * t].item() == 10 * int((warp_values > 2).any()) + 1
    positives = int((x > 0).sum())
    assert (counts[1::4] == positives).all()
    assert (counts[2::4] == int(positives == threads)).all() and (counts[3::4] == int(positives > 0)).all()


def test_threads_at_different_barriers_report_a_deadlock(barriers):
    with pytest.raises(LaunchError, match="deadlock"):
        barriers.deadlock_launch(torch.empty(32))


def test_failed_device_assert_is_a_launch_error(barriers, capfd):
    x = random_tensor(100, seed=25).abs()
    barriers.assert_launch(x, 100)
    x[57] = -1.0
    with pytest.raises(LaunchError, match="cudaErrorAssert"):
        barriers.assert_launch(x, 100)
    assert "Assertion" in capfd.readouterr().err


# ------------------------------------------------------------------------------------------ launch errors

def test_valid_launch_runs(limits):
    out = torch.zeros(1)
    limits.configured_launch(out, 1, 2, 3, 4, 8, 8, 16, 48 * 1024)
    assert out.item() == 42.0


@pytest.mark.parametrize("config,message", [
    ((1, 1, 1, 1025, 1, 1, 0), "invalid configuration argument"),
    ((1, 1, 1, 1024, 2, 1, 0), "invalid configuration argument"),
    ((1, 1, 1, 1, 1, 65, 0), "invalid configuration argument"),
    ((1, 1, 1, 0, 1, 1, 0), "invalid configuration argument"),
    ((1, 65536, 1, 32, 1, 1, 0), "invalid configuration argument"),
    ((1, 1, 65536, 32, 1, 1, 0), "invalid configuration argument"),
    ((0, 1, 1, 32, 1, 1, 0), "invalid configuration argument"),
    ((1, 1, 1, 32, 1, 1, 48 * 1024 + 1), "invalid argument"),
    ((1, 1, 1, 32, 1, 1, -1), "invalid argument"),
])
def test_launch_beyond_cuda_limits_fails_and_does_not_run(limits, config, message):
    out = torch.zeros(1)
    with pytest.raises(LaunchError, match=message):
        limits.configured_launch(out, 1, *config)
    assert out.item() == 0.0
    limits.configured_launch(out, 1, 1, 1, 1, 32, 1, 1, 0)  # the error is not sticky
    assert out.item() == 42.0


def test_dynamic_shared_memory_above_48k_needs_the_attribute(limits):
    out = torch.zeros(1)
    with pytest.raises(LaunchError, match="invalid argument"):
        limits.configured_launch(out, 1, 1, 1, 1, 32, 1, 1, 100_000)
    limits.allow_dynamic_shared(100_000)
    limits.configured_launch(out, 1, 1, 1, 1, 32, 1, 1, 100_000)
    assert out.item() == 42.0
    with pytest.raises(LaunchError, match="invalid argument"):
        limits.allow_dynamic_shared(300_000)  # above the 227 KB of an H100/H200
    with pytest.raises(LaunchError, match="invalid argument"):
        limits.configured_launch(out, 1, 1, 1, 1, 32, 1, 1, 233_000)


def test_static_shared_memory_above_48k_fails(limits):
    out = torch.zeros(1)
    with pytest.raises(LaunchError, match="too many resources"):
        limits.big_static_launch(out)
    assert out.item() == 0.0


# --------------------------------------------------------------------------------------------- translator

def test_translation_keeps_every_line():
    for path in KERNELS.glob("*.cu"):
        source = path.read_text()
        translated = emulation.translate(source, path.name)
        assert translated.count("\n") == source.count("\n")
        assert "<<<" not in translated and "__shared__" not in translated and "#pragma unroll" not in translated


def test_compiler_errors_point_at_the_students_line():
    source = textwrap.dedent("""\
        #include <cuda_runtime.h>
        __global__ void k(float* x, int n) {
          __shared__ float tile[32];
          int i = threadIdx.x;
          tile[i] = x[i];
          __syncthreads();
          x[i] = tile[31 - i] +;
        }
        void launch(float* x, int n, cudaStream_t s) { k<<<1, 32, 0, s>>>(x, n); }
        """)
    with pytest.raises(BuildError) as info:
        fuselab.build(source, ["void launch(float* x, int n, cudaStream_t s)"], backend="emulate")
    assert "kernel.cu:7" in str(info.value)


UNSUPPORTED = [
    ("texture<float, 1> tex;", "texture references"),
    ("float v = tex1Dfetch<float>(t, 0);", "texture fetches (tex1Dfetch"),
    ("cudaTextureObject_t t;", "texture objects"),
    ("surf2Dwrite(v, s, 0, 0);", "surfaces"),
    ("auto block = cooperative_groups::this_thread_block();", "cooperative groups"),
    ('asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));', "inline PTX"),
    ("wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a;", "tensor-core"),
    ("__pipeline_memcpy_async(dst, src, 16);", "asynchronous copies"),
    ("__nanosleep(100);", "__nanosleep"),
    ("unsigned m = __match_any_sync(0xffffffff, v);", "__match_any_sync"),
    ("k<<<1, 1>>>(x);", "dynamic parallelism"),
]


@pytest.mark.parametrize("statement,construct", UNSUPPORTED)
def test_unsupported_constructs_fail_naming_construct_and_line(statement, construct):
    source = f"#include <cuda_runtime.h>\n__global__ void k(float* x) {{\n  int lane = 0; float v = 0;\n  {statement}\n}}\n"
    with pytest.raises(UnsupportedConstruct) as info:
        emulation.translate(source, "lab.cu")
    assert info.value.line == 4 and construct in str(info.value) and "lab.cu:4" in str(info.value)


@pytest.mark.parametrize("source,construct,line", [
    ("#include <cooperative_groups.h>\n", "cooperative groups", 1),
    ("\n#include <mma.h>\n", "wmma", 2),
    ("__shared__ float g[32];\n", "file scope", 1),
    ("__global__ void k() {\n  __shared__ int c = 0;\n}\n", "initializer", 2),
    ("#define L(k) k<<<1, 1>>>()\n", "#define", 1),
])
def test_unsupported_forms(source, construct, line):
    with pytest.raises(UnsupportedConstruct) as info:
        emulation.translate(source)
    assert info.value.line == line and construct in str(info.value)


SPACES_KERNEL = "__global__ void k(float* x, int n) {\n  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) x[i] = %s;\n}\n"


@pytest.mark.parametrize("source,message,line", [
    # a helper without __device__, called from a kernel: the mistake nvcc refuses and g++ would compile
    ("float twice(float v) { return 2 * v; }\n" + SPACES_KERNEL % "twice(x[i])",
     'calling a __host__ function("twice") from a __global__ function("k") is not allowed', 4),
    ("template <typename T> T twice(T v) { return 2 * v; }\n" + SPACES_KERNEL % "twice<float>(x[i])",
     'calling a __host__ function("twice") from a __global__ function("k")', 4),
    ("__device__ float twice(float v) { return 2 * v; }\nfloat host_twice(float v) { return 2 * v; }\n"
     "__device__ float four(float v) { return host_twice(twice(v)); }\n" + SPACES_KERNEL % "four(x[i])",
     'calling a __host__ function("host_twice") from a __device__ function("four")', 3),
    ("__device__ float twice(float v) { return 2 * v; }\n" + SPACES_KERNEL % "x[i]" +
     "void launch(float* x, int n, cudaStream_t s) {\n  float f = twice(1.0f);\n  k<<<1, 32, 0, s>>>(x, n);\n}\n",
     'calling a __device__ function("twice") from a __host__ function("launch")', 7),
    (SPACES_KERNEL % "x[i]" + "void launch(float* x, int n, cudaStream_t s) {\n  int t = threadIdx.x;\n"
     "  k<<<1, 32 + t, 0, s>>>(x, n);\n}\n", '"threadIdx" is device code\'s', 6),
    (SPACES_KERNEL % "x[i]" + "void launch(float* x, int n, cudaStream_t s) {\n  k(x, n);\n}\n",
     'a __global__ function call must be configured ("k")', 6),
    (SPACES_KERNEL % "x[i]" + "void launch(float* x, int n, cudaStream_t s) {\n  k<<<1, 32, 0, s>>>(x, n);\n"
     "  __syncthreads();\n}\n", 'calling a __device__ function("__syncthreads") from a __host__ function', 7),
    ("__global__ int k(float* x) {\n  x[0] = 1;\n  return 0;\n}\n", "a __global__ function must have a void return", 1),
    # read through a macro that spells the space, and inside a loop macro's block (the kernel's own code)
    ("#define DEV __device__\nDEV float twice(float v) { return 2 * v; }\n" + SPACES_KERNEL % "x[i]" +
     "void launch(float* x, int n, cudaStream_t s) {\n  x[0] = twice(1.0f);\n}\n",
     'calling a __device__ function("twice") from a __host__ function("launch")', 8),
    ("#define LOOP(i, n) for (int i = threadIdx.x; i < (n); i += blockDim.x)\nfloat twice(float v) { return 2 * v; }\n"
     "__global__ void k(float* x, int n) {\n  LOOP(i, n) {\n    x[i] = twice(x[i]);\n  }\n}\n",
     'calling a __host__ function("twice") from a __global__ function("k")', 5),
])
def test_a_call_across_execution_spaces_is_refused_as_nvcc_refuses_it(source, message, line):
    """g++ ignores __device__ and __global__: without this check the emulation ran what the GPU build refuses,
    and a student's work passed on the CPU and scored 0 on the grader's GPU."""
    with pytest.raises(BuildError) as info:
        emulation.translate(source, "lab.cu")
    assert message in str(info.value) and f"lab.cu:{line}:" in str(info.value), str(info.value)


SPACES_OK = textwrap.dedent("""\
        constexpr int blocks_for(int n) { return (n + 255) / 256; }
        __host__ __device__ float both(float v) { return v + 1; }
        __device__ float on_gpu(float v) { return both(v) * 2; }
        float on_host(float v) { return both(v); }
        struct Scale { float f; __device__ float operator()(float v) const { return v * f; } };
        __global__ void k(float* x, int n, Scale s) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) x[i] = s(on_gpu(x[i])) + blocks_for(n);
        }
        void launch(float* x, int n, cudaStream_t stream) {
            dim3 blockDim(256), gridDim(blocks_for(n));
            if (n > 0) k<<<gridDim, blockDim, 0, stream>>>(x, n, Scale{on_host(1.0f)});
        }
        """)


def test_valid_cuda_that_only_reads_like_a_call_across_spaces_builds():
    """Macros that spell a space, loop macros, __device__ lambdas in host code, unevaluated operands, local names,
    the standard library's names, #if 0, declarations that give the space: nvcc takes every one
    (tests/test_kernels_compile_for_cuda.py), so the emulation must too."""
    build("spaces_valid.cu", ["void spaces_valid_launch(float* a, int n, cudaStream_t stream)"])


def test_calls_within_each_space_and_to_both_build():
    """What nvcc takes (tests/test_kernels_compile_for_cuda.py builds the same text) the emulation takes too."""
    mod = fuselab.build(SPACES_OK, ["void launch(float* x, int n, cudaStream_t stream)"], name="spaces_ok",
                        backend="emulate")
    x = torch.ones(300)
    mod.launch(x, 300)
    assert torch.equal(x, torch.full((300,), 10.0))  # (1 + 1) * 2, scaled by on_host(1) = 2, + 2 blocks


def test_constructs_in_comments_and_strings_are_ignored():
    source = textwrap.dedent("""\
        // asm("trap;"); texture<float> t; k<<<1,1>>>();
        /* __nanosleep(5); wmma::fragment
           cooperative_groups */
        __global__ void k(float* x) { const char* s = "asm( tex1Dfetch( <<<"; x[0] = s[0]; }
        """)
    assert emulation.translate(source).count("\n") == source.count("\n")


def test_public_flags():
    assert (emulation.INCLUDE_DIR / "fuselab_emu.h").is_file()
    for stub in ("cuda_runtime.h", "cuda_fp16.h", "cuda.h", "cuda_bf16.h"):
        assert (emulation.INCLUDE_DIR / stub).is_file()
    assert "-fopenmp" in emulation.CXXFLAGS and "-fopenmp" in emulation.LDFLAGS
    cflags, ldflags = emulation.sanitizer_flags("address")
    assert "-fsanitize=address" in cflags and "-fsanitize=address" in ldflags


# ------------------------------------------------------------------------------------- other fiber paths

def test_ucontext_fallback_fibers():
    module = build("barriers.cu", BARRIERS, extra_cflags=["-DFUSELAB_EMU_UCONTEXT"])
    M, N, K = 33, 17, 50
    A, B = random_tensor(M, K, seed=30), random_tensor(K, N, seed=31)
    C = torch.empty(M, N)
    module.set_thread_order("random", seed=3)
    module.gemm_launch(A, B, C, M, N, K)
    assert_close(C, A.double() @ B.double())


ASAN_CHILD = textwrap.dedent("""\
    import sys, torch, fuselab
    source = '''
    __global__ void shift(const float* x, float* y, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) y[i] = x[i + OFFSET];
    }
    __global__ void reverse(float* x) {  // fibers and barriers under ASan
      __shared__ float s[64];
      s[threadIdx.x] = x[blockIdx.x * 64 + threadIdx.x];
      __syncthreads();
      x[blockIdx.x * 64 + threadIdx.x] = s[63 - threadIdx.x];
    }
    void shift_launch(const float* x, float* y, int n, cudaStream_t s) { shift<<<(n + 63) / 64, 64, 0, s>>>(x, y, n); }
    void reverse_launch(float* x, int blocks, cudaStream_t s) { reverse<<<blocks, 64, 0, s>>>(x); }
    '''.replace("OFFSET", sys.argv[1])
    m = fuselab.build(source, ["void shift_launch(const float* x, float* y, int n, cudaStream_t s)",
                               "void reverse_launch(float* x, int blocks, cudaStream_t s)"],
                      backend="emulate", sanitize="address", name="asan")
    x = torch.randn(640)
    y = x.clone()
    m.reverse_launch(y, 10)
    assert torch.equal(y, x.view(10, 64).flip(1).reshape(-1))
    y = torch.empty(100)
    m.shift_launch(x[:100].clone(), y, 100)
    print("finished")
    """)


def test_address_sanitizer_build_catches_an_out_of_bounds_read(tmp_path):
    flags = emulation.sanitizer_flags("address")
    if not flags.preload:
        pytest.skip("libasan is not installed")
    script = tmp_path / "child.py"
    script.write_text(ASAN_CHILD)
    env = {**os.environ, **flags.env}

    def run(offset):
        return subprocess.run([sys.executable, str(script), offset], capture_output=True, text=True, env=env,
                              timeout=180)

    good = run("0")
    if "finished" not in good.stdout:
        pytest.skip(f"this Python does not run under ASan: {good.stderr[-500:]}")
    bad = run("1")
    assert "finished" not in bad.stdout
    assert "heap-buffer-overflow" in bad.stderr and "asan.cu:4" in bad.stderr


AARCH64_MAIN = textwrap.dedent("""\
    #include <cstdio>
    extern "C" void gemm_launch(const float*, const float*, float*, int, int, int, cudaStream_t);
    extern "C" void fuselab_emu_set_thread_order(int order, unsigned long long seed);  // the runtime's export
    int main() {
      const int M = 37, N = 29, K = 45;
      static float A[M * K], B[K * N], C[M * N];
      for (int i = 0; i < M * K; ++i) A[i] = (float)((i * 7) % 13) - 6.0f;
      for (int i = 0; i < K * N; ++i) B[i] = (float)((i * 5) % 11) - 5.0f;
      for (int order = 0; order < 3; ++order) {
        fuselab_emu_set_thread_order(order, 1);
        gemm_launch(A, B, C, M, N, K, 0);
        for (int r = 0; r < M; ++r) for (int c = 0; c < N; ++c) {
          float ref = 0; for (int k = 0; k < K; ++k) ref += A[r * K + k] * B[k * N + c];
          if (ref != C[r * N + c]) { std::printf("mismatch %d %d\\n", r, c); return 1; }
        }
      }
      std::printf("ok\\n");
      return 0;
    }
    """)


def test_aarch64_context_switch_under_qemu(tmp_path):
    # the emulation's context switch on a student's ARM machine: cross-compiled, run under qemu (CI installs both,
    # and there the test fails rather than skips without them)
    compiler, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if not (compiler and qemu) and os.environ.get("FUSELAB_CI") != "1":
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64 (apt-get install g++-aarch64-linux-gnu qemu-user)")
    assert compiler and qemu, "CI must install g++-aarch64-linux-gnu and qemu-user (.ci/run)"
    translated = emulation.translate((KERNELS / "barriers.cu").read_text(), "kernel.cu")
    source = tmp_path / "main.cpp"
    source.write_text('#include "fuselab_emu.h"\nextern "C" void gemm_launch(const float*, const float*, float*, '
                      'int, int, int, cudaStream_t);\n#line 1 "kernel.cu"\n' + translated + "\n" + AARCH64_MAIN)
    binary = tmp_path / "main"
    from fuselab.kernelbuild.emulate import runtime_object
    subprocess.run([compiler, *emulation.CXXFLAGS, "-static", f"-I{emulation.INCLUDE_DIR}", str(source),
                    str(runtime_object.SOURCE), "-o", str(binary)], check=True, capture_output=True, timeout=300)
    result = subprocess.run([qemu, str(binary)], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "ok", result.stdout + result.stderr


STREAM_LAUNCHER = "void scale(const float* x /*[n]*/, float* out /*[n]*/, int n, cudaStream_t stream)"
STREAM_KERNEL = """
__global__ void scale_kernel(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * x[i];
}
void scale(const float* x, float* out, int n, cudaStream_t stream) {
    LAUNCH
}
"""


@pytest.mark.parametrize("launch,named", [
    ("scale_kernel<<<(n + 127) / 128, 128>>>(x, out, n);", "stream 0 (the legacy default stream"),
    ("scale_kernel<<<(n + 127) / 128, 128, 0, 0>>>(x, out, n);", "stream 0 (the legacy default stream"),
    ("scale_kernel<<<(n + 127) / 128, 128, 0, cudaStreamPerThread>>>(x, out, n);", "cudaStreamPerThread"),
    ("static cudaStream_t side = nullptr;\n    if (!side) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);\n"
     "    scale_kernel<<<(n + 127) / 128, 128, 0, side>>>(x, out, n);", "a stream the launcher made itself"),
    ("cudaMemsetAsync(out, 0, n * sizeof(float));\n"
     "    scale_kernel<<<(n + 127) / 128, 128, 0, stream>>>(x, out, n);", "cudaMemsetAsync on stream 0"),
])
def test_a_launcher_that_ignores_its_stream_fails_and_says_why(launch, named):
    mod = fuselab.build(STREAM_KERNEL.replace("LAUNCH", launch), [STREAM_LAUNCHER], backend="emulate",
                        name="off_stream")
    x, out = torch.randn(300), torch.empty(300)
    with pytest.raises(LaunchError) as info:
        mod.scale(x, out, 300)
    message = str(info.value)
    assert "scale put work on another stream than the one it was given" in message and named in message
    assert "kernel<<<grid, block, shared_bytes, stream>>>" in message
    assert "CUDA-graph capture" in message and "not ordered with the caller's other work" in message
    last = launch.split("\n")[-1]
    if "stream>>>" not in last:  # the launch itself is on the wrong stream: it is named, with its line
        assert f"kernel scale_kernel launched at off_stream.cu:{6 + launch.count(chr(10)) + 1} on" in message


def test_a_launcher_on_its_own_stream_runs_and_the_watch_ends_with_the_call():
    mod = fuselab.build(STREAM_KERNEL.replace("LAUNCH", "scale_kernel<<<(n + 127) / 128, 128, 0, stream>>>(x, out, n);"),
                        [STREAM_LAUNCHER], backend="emulate", name="on_stream")
    x, out = torch.randn(300), torch.empty(300)
    mod.scale(x, out, 300)
    assert torch.equal(out, 2 * x)


SIZED = [
    "void mix(const float* x /*[N, C, H, W]*/, const float* w /*[CO, C]*/, float* y /*[N, CO, H, W]*/, "
    "int N, int C, int H, int W, int CO, cudaStream_t stream)",
    "void pool(const float* x /*[N, L]*/, float* y /*[N, P = (L - K)/stride + 1]*/, int N, int L, int K, "
    "int stride, cudaStream_t stream)",
]
SIZED_SOURCE = """
__global__ void mix_kernel(const float* x, const float* w, float* y, int N, int C, int HW, int CO) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;   // one output element: (n, co, pixel)
    if (i >= N * CO * HW) return;
    int p = i % HW, co = (i / HW) % CO, n = i / (HW * CO);
    float acc = 0.0f;
    for (int c = 0; c < C; ++c) acc += w[co * C + c] * x[(n * C + c) * HW + p];
    y[i] = acc;
}
void mix(const float* x, const float* w, float* y, int N, int C, int H, int W, int CO, cudaStream_t stream) {
    int total = N * CO * H * W;
    if (total > 0) mix_kernel<<<(total + 127) / 128, 128, 0, stream>>>(x, w, y, N, C, H * W, CO);
}
__global__ void pool_kernel(const float* x, float* y, int N, int L, int K, int stride, int P) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * P) return;
    int n = i / P, p = i % P;
    float best = x[n * L + p * stride];
    for (int k = 1; k < K; ++k) best = fmaxf(best, x[n * L + p * stride + k]);
    y[i] = best;
}
void pool(const float* x, float* y, int N, int L, int K, int stride, cudaStream_t stream) {
    int P = (L - K) / stride + 1;
    if (N * P > 0) pool_kernel<<<(N * P + 127) / 128, 128, 0, stream>>>(x, y, N, L, K, stride, P);
}
"""


@pytest.fixture(scope="module")
def sized():
    return fuselab.build(SIZED_SOURCE, SIZED, backend="emulate", name="sized")


def test_size_arguments_are_checked_against_the_tensors(sized):
    x, w, y = torch.randn(2, 4, 6, 7), torch.randn(4, 4), torch.empty(2, 4, 6, 7)
    sized.mix(x, w, y, 2, 4, 6, 7, 4)
    assert torch.allclose(y, torch.einsum("oc,nchw->nohw", w, x), atol=1e-5)
    # a 5-high launch of a 6-high input would leave a row unwritten
    with pytest.raises(ValueError, match=r"argument 'H' of mix is 5, but argument 'x' has H=6 \(shape \(2, 4, 6, 7\)\)"):
        sized.mix(x, w, y, 2, 4, 5, 7, 4)
    # 9 output channels for 4 wrote past the weights and the output: under the emulation it killed Python
    with pytest.raises(ValueError, match=r"argument 'CO' of mix is 9, but argument 'w' has CO=4"):
        sized.mix(x, w, y, 2, 4, 6, 7, 9)


def test_an_output_shape_that_follows_from_the_inputs_is_checked(sized):
    x = torch.randn(3, 10)
    y = torch.empty(3, 4)  # (10 - 3) / 2 + 1 = 4
    sized.pool(x, y, 3, 10, 3, 2)
    assert torch.equal(y, x.unfold(1, 3, 2).amax(dim=2))
    with pytest.raises(ValueError) as info:
        sized.pool(x, torch.empty(3, 5), 3, 10, 3, 2)
    assert "argument 'y' of pool has shape (3, 5), but its size P = (L - K)/stride + 1 is 4 with K=3, L=10, " \
           "stride=2, not 5" in str(info.value)
    with pytest.raises(ValueError, match="division by zero"):
        sized.pool(x, y, 3, 10, 3, 0)


def test_a_compile_error_on_a_launch_line_quotes_the_line_with_a_caret_at_the_students_column():
    # the launch is rewritten into a much longer line: g++'s column (208 on a 110-character line) must be mapped
    # back, and g++, which cannot read kernel.cu, quotes nothing and counts bytes (the µ is two)
    launch = "    if (n > 0) scale_kernel<<<(n + 127) / 128, 128, 0, stream>>>(x, out, /* µs */ nn);"
    source = STREAM_KERNEL.replace("    LAUNCH", launch)
    with pytest.raises(BuildError) as info:
        fuselab.build(source, [STREAM_LAUNCHER], backend="emulate", name="launch_typo")
    lines = str(info.value).splitlines()
    header = next(i for i, line in enumerate(lines) if "error:" in line and "nn" in line)
    column = launch.index("nn") + 1
    assert lines[header].startswith(f"launch_typo.cu:7:{column}: error:")
    assert lines[header + 1] == f"    7 | {launch}"
    assert lines[header + 2] == "      | " + " " * (column - 1) + "^"
    assert "\x1b[" not in str(info.value)


def test_a_compile_error_in_a_launch_over_several_lines_names_the_line_it_is_on():
    launch = "    scale_kernel<<<(n + 127) / 128,\n\t\t128, 0, stream>>>(x, out,\n\t\tnn);"
    with pytest.raises(BuildError) as info:
        fuselab.build(STREAM_KERNEL.replace("    LAUNCH", launch), [STREAM_LAUNCHER], backend="emulate",
                      name="launch_lines")
    message = str(info.value)
    assert "launch_lines.cu:9:3: error:" in message and "    9 | \t\tnn);\n      | \t\t^" in message


def test_a_launch_of_zero_blocks_for_no_work_says_to_launch_nothing():
    launch = "scale_kernel<<<(n + 127) / 128, 128, 0, stream>>>(x, out, n);"  # no `if (n > 0)`
    mod = fuselab.build(STREAM_KERNEL.replace("LAUNCH", launch), [STREAM_LAUNCHER], backend="emulate",
                        name="no_guard")
    mod.scale(torch.randn(5), torch.empty(5), 5)
    with pytest.raises(LaunchError) as info:
        mod.scale(torch.randn(0), torch.empty(0), 0)
    message = str(info.value)
    assert "cudaErrorInvalidConfiguration" in message and "grid (0,1,1) has a zero dimension" in message
    assert "n = 0: there is nothing to compute" in message and "`if (n > 0) kernel<<<...>>>(...)`" in message


def test_a_module_whose_next_build_failed_refuses_to_run_the_old_kernel():
    """A student edits a kernel, runs its build cell, meets a compiler error and runs the test cell anyway: the
    test called the module the build before had made, and passed on the old code. A failed build of a name makes
    the module that name had stale: its launchers say so instead of running; a build that succeeds is used."""
    from fuselab.errors import StaleModule
    proto = "void twice(const float* x, float* out, int n, cudaStream_t stream)"
    source = textwrap.dedent("""\
        __global__ void twice_kernel(const float* x, float* out, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) out[i] = FACTOR * x[i];
        }
        void twice(const float* x, float* out, int n, cudaStream_t stream) {
            if (n > 0) twice_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, out, n);
        }
        """)
    x, out = torch.arange(5.0), torch.empty(5)
    old = fuselab.build(source.replace("FACTOR", "2.0f"), [proto], name="stale_check", backend="emulate")
    old.twice(x, out, 5)
    assert torch.equal(out, 2 * x)
    with pytest.raises(BuildError):
        fuselab.build(source.replace("FACTOR", "3.0f +"), [proto], name="stale_check", backend="emulate")
    with pytest.raises(StaleModule, match="before its last build, which failed .BuildError.*run that cell again"):
        old.twice(x, out, 5)
    new = fuselab.build(source.replace("FACTOR", "3.0f"), [proto], name="stale_check", backend="emulate")
    new.twice(x, out, 5)
    assert torch.equal(out, 3 * x)
    other = fuselab.build(source.replace("FACTOR", "4.0f"), [proto], name="stale_other", backend="emulate")
    with pytest.raises(BuildError):  # another name's failure leaves this one alone
        fuselab.build(source.replace("FACTOR", "5.0f +"), [proto], name="stale_check", backend="emulate")
    other.twice(x, out, 5)
    assert torch.equal(out, 4 * x)
