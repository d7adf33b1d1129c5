"""Per-lab definitions shared by the notebooks, the tests, the GPU self-check and the grader.

Each lab ``labN`` has a module ``fuselab/labs/labN.py`` (launcher prototypes, the lab's fixed unfused reference
kernels, input makers, float64 references, the small and GPU shape sets, ``NOTEBOOK`` and ``SOLUTION_SOURCES``)
and a module ``labN_selfcheck.py`` whose ``run(out)`` is the lab's stage of the GPU self-check.
docs/LAB_AUTHORING.md describes the conventions.
"""

import importlib
import pkgutil


def lab_modules() -> dict:
    """``{"lab0": module, ...}`` for every lab module in this package."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("lab")
                   and m.name[3:].isdigit())
    return {name: importlib.import_module(f"{__name__}.{name}") for name in names}


def selfcheck_modules() -> dict:
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.endswith("_selfcheck"))
    return {name[: -len("_selfcheck")]: importlib.import_module(f"{__name__}.{name}") for name in names}


def randn_where_used(shape, gen, seed, device):
    """Random normal float32 numbers for a large tensor, drawn on ``device`` itself.

    On a CPU they come from ``gen`` (the lab's CPU generator, as before); on a GPU from a generator on that GPU
    seeded with ``seed``: the GPU-sized inputs of the graded tests are 64M-77M numbers, which take seconds to
    draw on a CPU and the grader draws several sets of them per submission.
    """
    import torch
    if torch.device(device).type == "cpu":
        return torch.randn(shape, generator=gen, dtype=torch.float32)
    return torch.randn(shape, generator=torch.Generator(device=device).manual_seed(seed), device=device,
                       dtype=torch.float32)
