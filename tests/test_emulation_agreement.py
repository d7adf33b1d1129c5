"""On a GPU: the emulated and the real build of each test kernel give the same results on the same inputs.

Run by the GPU self-check (stage ``emulation``: ``pytest tests/test_emulation_agreement.py``); skipped without CUDA. Each case builds its kernel file twice, once per backend,
feeds both the same random inputs and compares the outputs with float32-level tolerances (the two compilers
may contract a*b+c into an FMA differently) or bit for bit where the arithmetic is exact.
"""

import pytest
import torch

import fuselab

from .test_emulation import BARRIERS, BASICS, KERNELS, random_tensor


def _modules(filename, launchers):
    source = (KERNELS / filename).read_text()
    return {backend: fuselab.build(source, launchers, name=filename[:-3], backend=backend)
            for backend in ("emulate", "cuda")}


def _run_both(mods, launcher, inputs, outputs, scalars):
    results = {}
    for backend, mod in mods.items():
        device = "cuda" if backend == "cuda" else "cpu"
        ins = [t.to(device) for t in inputs]
        outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in outputs]
        getattr(mod, launcher)(*ins, *outs, *scalars)
        if device == "cuda":
            torch.cuda.synchronize()
        results[backend] = [o.cpu() for o in outs]
    return results


def _agree(results, exact=False, rtol=1e-5, atol=1e-5):
    worst = 0.0
    for emu, real in zip(results["emulate"], results["cuda"]):
        if exact:
            same = torch.equal(emu, real)
            worst = max(worst, 0.0 if same else float("inf"))
        else:
            diff = (emu.double() - real.double()).abs()
            scale = atol + rtol * real.double().abs()
            worst = max(worst, float((diff / scale).max()))
    return worst <= 1.0, worst


pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def basics():
    return _modules("basics.cu", BASICS)


@pytest.fixture(scope="module")
def barriers():
    return _modules("barriers.cu", BARRIERS)


def _assert_agree(results, **tolerance):
    ok, worst = _agree(results, **tolerance)
    assert ok, f"emulated and real outputs differ: worst error {worst:.3g} x the tolerance"


def test_elementwise_math(basics):
    n = 4097
    x, y = random_tensor(n, seed=1), random_tensor(n, seed=2)
    _assert_agree(_run_both(basics, "math_launch", [x, y], [((n,), torch.float32)], [n]), rtol=1e-5, atol=1e-4)


def test_conv3x3(basics):
    N, C, H, W, K = 2, 3, 17, 19, 4
    _assert_agree(_run_both(basics, "conv_launch", [random_tensor(N, C, H, W, seed=3), random_tensor(K, C, 3, 3, seed=4),
                                                    random_tensor(K, seed=5)],
                            [((N, K, H, W), torch.float32)], [N, C, H, W, K]))


def test_float4_copy(basics):
    _assert_agree(_run_both(basics, "copy4_launch", [random_tensor(1027, seed=6)], [((1027,), torch.float32)], [1027]),
                  exact=True)


def test_fp16_rows(basics):
    rows, cols = 37, 19
    _assert_agree(_run_both(basics, "half_rows_launch",
                            [random_tensor(rows, cols, seed=8, dtype=torch.float16),
                             random_tensor(cols, seed=9, dtype=torch.float16)],
                            [((rows,), torch.float16), ((rows,), torch.float32)], [rows, cols]),
                  rtol=1e-3, atol=1e-3)


def test_tiled_gemm_with_barriers(barriers):
    M, N, K = 37, 29, 45
    _assert_agree(_run_both(barriers, "gemm_launch", [random_tensor(M, K, seed=20), random_tensor(K, N, seed=21)],
                            [((M, N), torch.float32)], [M, N, K]))


@pytest.mark.parametrize("launcher, seed", [("block_sum_launch", 22), ("tree_sum_launch", 23)])  # shuffles; a tree
def test_block_sums(barriers, launcher, seed):
    n, block = 1000, 256
    blocks = (n + block - 1) // block
    _assert_agree(_run_both(barriers, launcher, [random_tensor(n, seed=seed)], [((blocks,), torch.float32)], [n, block]))
