"""Lab 3's fp16 tensor-core kernel (fuselab/labs/lab3/tensorcore.py) without a GPU.

The CPU emulation runs no PTX, so the kernel runs here with ``mma_16816`` written out in CUDA C++; everything else
(the column and k orders, the A and B fragments, bias, ReLU, rounding, the 16-byte and element stores, the row,
column and k edges, K > 16) is the GPU kernel's own text. What is left to the GPU is the mma instruction itself:
the emulated mma is pinned to the PTX ISA's fragment table below, on the GPU the real one is (requires_gpu), and
the GPU self-check's lab3 stage checks the real kernel before it times it.
"""

import pytest
import torch

import fuselab
from fuselab.labs import lab3
from fuselab.labs.lab3 import tensorcore as lab3_tensorcore

from .conftest import requires_gpu, requires_nvcc


def _make(shape, seed):
    return lab3.make_inputs(shape, seed, dtype=torch.float16)


@pytest.fixture(scope="module")
def emulated():
    return lab3_tensorcore.build("emulate")


@pytest.mark.parametrize("order", ["forward", "reverse", "random"])
def test_default_kernel_is_right_at_awkward_shapes_under_emulation(emulated, order):
    emulated.set_thread_order(order, seed=5)
    fuselab.check(lab3.fused(emulated), lab3.reference, _make, lab3_tensorcore.EMULATED_SHAPES, seeds=(2,),
                  name="fp16 tensor cores (emulated mma)")


@pytest.mark.parametrize("variant", lab3_tensorcore.VARIANTS, ids=lab3_tensorcore.variant_name)
def test_every_timed_layout_is_right_under_emulation(emulated, variant):
    emulated.set_thread_order("random", seed=11)
    fuselab.check(lab3_tensorcore.variant_op(emulated, variant), lab3.reference, _make,
                  lab3_tensorcore.EMULATED_SHAPES, seeds=(3,), name=lab3_tensorcore.variant_label(variant))


def test_output_off_a_16_byte_boundary_is_right(emulated):
    # C one element past a 16-byte boundary: N % 8 == 0, so only the pointer sends the launcher to element stores
    a, b, bias, relu = _make((40, 264, 16, True, True), seed=4)
    buffer = torch.full((40 * 264 + 2,), float("nan"), dtype=torch.float16)
    out = buffer[1:-1].view(40, 264)
    lab3.fused(emulated)(a, b, bias, relu, out)
    fuselab.assert_close(out, lab3.reference(a.double(), b.double(), bias.double(), relu))
    assert torch.isnan(buffer[0]) and torch.isnan(buffer[-1])


# One m16n8k16 tile with fragments filled straight from the PTX ISA's table for .f16 A/B and .f32 C/D ("Matrix
# Fragments for mma.m16n8k16 with floating point type"): groupID g = lane >> 2, threadID_in_group t = lane % 4;
# A element i (of 8) at row g + 8·(i % 4 >= 2), column 2t + (i & 1) + 8·(i >= 4); B element i (of 4) at row
# 2t + (i & 1) + 8·(i >= 2), column g; C element i at row g + 8·(i >= 2), column 2t + (i & 1); element 2r sits in
# the lower 16 bits of register r.
_TILE_KERNEL = r"""
__global__ void mma_tile_kernel(const __half* a, const __half* b, const float* c, float* d) {
    int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    const unsigned short* a16 = reinterpret_cast<const unsigned short*>(a);
    const unsigned short* b16 = reinterpret_cast<const unsigned short*>(b);
    uint32_t af[4] = {0u, 0u, 0u, 0u}, bf[2] = {0u, 0u};
    float cf[4], df[4];
    for (int i = 0; i < 8; ++i) {
        int row = g + 8 * (i % 4 >= 2), col = 2 * t + (i & 1) + 8 * (i >= 4);
        af[i / 2] |= (uint32_t)a16[row * 16 + col] << (16 * (i & 1));
    }
    for (int i = 0; i < 4; ++i) {
        int row = 2 * t + (i & 1) + 8 * (i >= 2), col = g;
        bf[i / 2] |= (uint32_t)b16[row * 8 + col] << (16 * (i & 1));
    }
    for (int i = 0; i < 4; ++i) cf[i] = c[(g + 8 * (i >= 2)) * 8 + 2 * t + (i & 1)];
    mma_16816(df, af, bf, cf);
    for (int i = 0; i < 4; ++i) d[(g + 8 * (i >= 2)) * 8 + 2 * t + (i & 1)] = df[i];
}

void mma_tile(const __half* a, const __half* b, const float* c, float* d, cudaStream_t stream) {
    mma_tile_kernel<<<1, 32, 0, stream>>>(a, b, c, d);
}
"""
_TILE_LAUNCHER = "void mma_tile(const __half* a, const __half* b, const float* c, float* d, cudaStream_t stream)"


@pytest.mark.parametrize("backend", ["emulate", pytest.param("cuda", marks=requires_gpu)])
def test_mma_follows_the_ptx_fragment_table(backend):
    mma = {"emulate": lab3_tensorcore._MMA_EMULATED, "cuda": lab3_tensorcore._MMA_PTX}[backend]
    mod = fuselab.build(mma + _TILE_KERNEL, [_TILE_LAUNCHER], name=f"mma_tile_{backend}", backend=backend)
    device = "cuda" if backend == "cuda" else "cpu"
    gen = torch.Generator().manual_seed(0)
    # distinct small integers: every product and sum exact in fp16 and fp32, and any misplaced element shows
    a = torch.randint(-8, 9, (16, 16), generator=gen).half()
    b = torch.randint(-8, 9, (16, 8), generator=gen).half()
    c = torch.randint(-64, 65, (16, 8), generator=gen).float()
    d = torch.full((16, 8), float("nan"))
    a, b, c, d = (x.to(device) for x in (a, b, c, d))
    mod.mma_tile(a, b, c, d)
    expected = a.double() @ b.double() + c.double()
    assert torch.equal(d.double().cpu(), expected.cpu())


@requires_nvcc
def test_gpu_source_compiles_for_the_default_architecture():
    # no GPU needed: nvcc compiles for TORCH_CUDA_ARCH_LIST's first entry, else the H200's sm_90 (toolchain)
    mod = fuselab.build(lab3_tensorcore.TUNED_FP16_TC_SOURCE, lab3_tensorcore.LAUNCHERS, name="tuned_fp16_tc",
                        backend="cuda")
    assert mod.backend == "cuda"
    assert set(mod.launchers) == {"gemm_bias_act_f16"} | {f"{lab3_tensorcore.variant_name(v)}_f16"
                                                          for v in lab3_tensorcore.VARIANTS}


def test_saved_small_k_results_leave_the_tensor_core_kernel_out():
    # the notebook prints every saved small-K row to students without a GPU; the kernel is not in the lab yet
    from fuselab.tools.gpu_selfcheck.lab_checks.lab3 import _without_tensor_cores
    label = lab3_tensorcore.variant_label(lab3_tensorcore.DEFAULT)
    small_k = {"rows": [{"name": "tuned fused"}], "tensor_core_rows": [{"name": label}], "table": "tuned fused",
               "tensor_core_table": label, "summary": {"float16": {"goals": {}, "tensor_cores": {"kernel": label}}}}
    assert label not in str(_without_tensor_cores(small_k))
    assert _without_tensor_cores(small_k)["rows"] == small_k["rows"]


def test_a_compiler_error_in_part_d_names_the_students_own_line():
    # The tensor-core path goes ahead of the student's TUNED_SOURCE: the compiler counted its hundreds of lines in
    # front of the student's, and named a line hundreds past the student's.
    from fuselab.notebook_sources import string_assignments

    from .conftest import REPO
    tuned = string_assignments(REPO / "solutions" / lab3.NOTEBOOK)["TUNED_SOURCE"].split("\n")
    tuned.append("static void broken_helper() { undeclared_name_here = 1; }")
    row = len(tuned)
    with pytest.raises(fuselab.BuildError) as caught:
        fuselab.build(lab3.tuned_source("\n".join(tuned), "emulate"), lab3.FUSED_LAUNCHERS, name="tuned",
                      backend="emulate")
    said = str(caught.value)
    assert f"tuned.cu:{row}:" in said and "undeclared_name_here" in said, said
    assert lab3.TENSOR_CORE_FILE not in said, said


def test_the_tuned_kernel_takes_the_tensor_core_path_for_fp16_at_small_k_only():
    # Built as the notebook's Part D builds it (lab3.tuned_source), under the emulation: right in fp16 and fp32.
    # Then the same build with the tensor-core kernel's bias dropped: fp16 at small K must now fail (that is the
    # path it takes) while fp16 past K = 16 and every fp32 shape still pass (they do not take it).
    from fuselab.notebook_sources import string_assignments

    from .conftest import REPO
    tuned = string_assignments(REPO / "solutions" / lab3.NOTEBOOK)["TUNED_SOURCE"]
    small_k = [s for s in lab3.SMALL_K_SHAPES if s[0] > 16 and s[2] <= 16] + [(70, 270, 16, True, True)]
    other = [(40, 70, 17, True, True), (8, 64, 40, True, True)]
    source = lab3.tuned_source(tuned, "emulate", name="tuned_with_tc")
    mod = fuselab.build(source, lab3.FUSED_LAUNCHERS, name="tuned_with_tc", backend="emulate")
    for dtype in (torch.float16, torch.float32):
        fuselab.check(lab3.fused(mod), lab3.reference, lambda s, seed: lab3.make_inputs(s, seed, dtype=dtype),
                      small_k + other, seeds=(4,), name=f"tuned {dtype}")
    # one rounding on every path, the tensor cores' included (their accumulator starts at the bias): the cases
    # where the bias cancels A·B, the notebook's and the hidden tests'
    fuselab.check(lab3.fused(mod), lab3.reference, lambda s, seed: lab3.make_inputs(s, seed, dtype=torch.float16),
                  lab3.CANCELLING_SHAPES + lab3.HIDDEN_CANCELLING_SHAPES, seeds=(4,), name="tuned fp16, cancelling")
    seeding = "acc[q][j][0] = acc[q][j][2] = bias_v[q][2 * j];"
    assert source.count(seeding) == 1
    broken = fuselab.build(source.replace(seeding, "acc[q][j][0] = acc[q][j][2] = 0.0f;"), lab3.FUSED_LAUNCHERS,
                           name="tuned_with_tc_broken", backend="emulate")

    def passes(dtype, shapes):
        return fuselab.check(lab3.fused(broken), lab3.reference,
                             lambda s, seed: lab3.make_inputs(s, seed, dtype=dtype), shapes, seeds=(4,),
                             name="broken", raise_on_fail=False, verbose=False).passed
    assert not passes(torch.float16, [s for s in small_k if s[3]])  # with a bias: the tensor-core path
    assert passes(torch.float16, other) and passes(torch.float32, small_k + other)


@requires_nvcc
def test_the_tuned_kernel_with_the_tensor_core_path_compiles_for_gpus_without_mma(tmp_path):
    # a student's GPU older than compute capability 8.0 builds it too (the written-out mma, never launched there)
    import subprocess
    from pathlib import Path

    from fuselab import toolchain
    from fuselab.notebook_sources import string_assignments

    from .conftest import REPO
    tuned = string_assignments(REPO / "solutions" / lab3.NOTEBOOK)["TUNED_SOURCE"]
    cu = tmp_path / "tuned.cu"
    headers = "#include <cuda_fp16.h>\n#include <cstdint>\n#include <type_traits>\n"
    cu.write_text(headers + lab3.tuned_source(tuned, "cuda"))
    for arch in ("sm_75", "sm_90"):
        nvcc = str(Path(toolchain.find_cuda_home()) / "bin" / "nvcc")
        built = subprocess.run([nvcc, "-std=c++17", f"-arch={arch}", "-c", str(cu),
                                "-o", str(tmp_path / f"{arch}.o")], capture_output=True, text=True)
        assert built.returncode == 0, built.stderr[-3000:]


def test_the_tensor_core_path_rounds_once_where_the_bias_cancels(emulated):
    """The kernel starts its fp32 accumulator at the bias and rounds once, at the store: right where the bias
    nearly cancels A·B. The same kernel rounding A·B to half before it adds the bias fails there, while it passes
    the random shapes (where two roundings are within fp16's tolerance)."""
    shapes = [s for s in lab3_tensorcore.EMULATED_SHAPES if isinstance(s, lab3.Cancelling)]
    assert shapes and all(s.M > 16 and s.K <= 16 for s in shapes)  # shapes the tensor-core path takes
    fuselab.check(lab3.fused(emulated), lab3.reference, _make, shapes, seeds=(6,), name="tensor cores, cancelling")
    source = lab3_tensorcore.EMULATED_SOURCE
    seeding = ("acc[q][j][0] = acc[q][j][2] = bias_v[q][2 * j];", "acc[q][j][1] = acc[q][j][3] = bias_v[q][2 * j + 1];")
    gather = ("top[2 * j] = acc[q][j][0]; top[2 * j + 1] = acc[q][j][1];",
              "bottom[2 * j] = acc[q][j][2]; bottom[2 * j + 1] = acc[q][j][3];")
    assert all(source.count(text) == 1 for text in seeding + gather)
    twice = source.replace(seeding[0], "acc[q][j][0] = acc[q][j][2] = 0.0f;").replace(
        seeding[1], "acc[q][j][1] = acc[q][j][3] = 0.0f;")
    for line, (first, second) in zip(gather, ((0, 1), (2, 3))):
        name = line.split("[")[0]
        twice = twice.replace(line, (
            f"{name}[2 * j] = __half2float(__float2half_rn(acc[q][j][{first}])) + bias_v[q][2 * j]; "
            f"{name}[2 * j + 1] = __half2float(__float2half_rn(acc[q][j][{second}])) + bias_v[q][2 * j + 1];"))
    broken = fuselab.build(twice, lab3_tensorcore.LAUNCHERS, name="tc_rounding_twice", backend="emulate")
    plain = [s for s in lab3_tensorcore.EMULATED_SHAPES if not isinstance(s, lab3.Cancelling)]
    assert fuselab.check(lab3.fused(broken), lab3.reference, _make, plain, seeds=(6,), verbose=False,
                         raise_on_fail=False).passed
    result = fuselab.check(lab3.fused(broken), lab3.reference, _make, shapes, seeds=(6,), verbose=False,
                           raise_on_fail=False)
    assert len(result.failures) == len(shapes) and "Round once" in result.report(), result.report()
