"""On a GPU: the emulated and the real build of each test kernel give the same results on the same inputs.

Run by the GPU self-check (stage ``emulation``). Each case builds its kernel file twice, once per backend,
feeds both the same random inputs and compares the outputs with float32-level tolerances (the two compilers
may contract a*b+c into an FMA differently) or bit for bit where the arithmetic is exact.
"""

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


def run_on_gpu():
    basics, barriers = _modules("basics.cu", BASICS), _modules("barriers.cu", BARRIERS)
    cases = {}
    n = 4097
    x, y = random_tensor(n, seed=1), random_tensor(n, seed=2)
    cases["elementwise math"] = _agree(_run_both(basics, "math_launch", [x, y], [((n,), torch.float32)], [n]),
                                       rtol=1e-5, atol=1e-4)
    N, C, H, W, K = 2, 3, 17, 19, 4
    cases["conv 3x3"] = _agree(_run_both(basics, "conv_launch", [random_tensor(N, C, H, W, seed=3),
                                                                   random_tensor(K, C, 3, 3, seed=4),
                                                                   random_tensor(K, seed=5)],
                                         [((N, K, H, W), torch.float32)], [N, C, H, W, K]))
    cases["float4 copy"] = _agree(_run_both(basics, "copy4_launch", [random_tensor(1027, seed=6)],
                                            [((1027,), torch.float32)], [1027]), exact=True)
    rows, cols = 37, 19
    cases["fp16 rows"] = _agree(_run_both(basics, "half_rows_launch",
                                          [random_tensor(rows, cols, seed=8, dtype=torch.float16),
                                           random_tensor(cols, seed=9, dtype=torch.float16)],
                                          [((rows,), torch.float16), ((rows,), torch.float32)], [rows, cols]),
                                rtol=1e-3, atol=1e-3)
    M, Nn, Kk = 37, 29, 45
    cases["tiled gemm (barriers)"] = _agree(_run_both(barriers, "gemm_launch",
                                                      [random_tensor(M, Kk, seed=20), random_tensor(Kk, Nn, seed=21)],
                                                      [((M, Nn), torch.float32)], [M, Nn, Kk]))
    n, block = 1000, 256
    blocks = (n + block - 1) // block
    cases["warp-shuffle block sum"] = _agree(_run_both(barriers, "block_sum_launch", [random_tensor(n, seed=22)],
                                                       [((blocks,), torch.float32)], [n, block]))
    cases["shared-memory tree sum"] = _agree(_run_both(barriers, "tree_sum_launch", [random_tensor(n, seed=23)],
                                                       [((blocks,), torch.float32)], [n, block]))
    agree = all(ok for ok, _ in cases.values())
    return {"status": "ok" if agree else "DISAGREE",
            "cases": {name: {"agree": ok, "worst_error_over_tolerance": worst} for name, (ok, worst) in cases.items()},
            "headline": f"{sum(ok for ok, _ in cases.values())}/{len(cases)} kernels agree (emulated vs real)"}
