"""Per-lab definitions shared by the notebooks, the tests, the GPU self-check and the grader.

Each lab ``labN`` is a package ``fuselab/labs/labN/``: its ``__init__.py`` holds what the notebook imports
(launcher prototypes, the lab's fixed unfused reference kernels, input makers, float64 references, the small and
GPU shape sets, ``NOTEBOOK`` and ``SOLUTION_SOURCES``) and declares the lab as ``LAB = Lab(...)``; ``samples.py``'s ``SAMPLES``
are its sample submissions. The lab's stage of the GPU self-check is a tool, not part of the lab:
``fuselab/tools/gpu_selfcheck/lab_checks/labN.py``.
``registry.py`` lists the labs: everything that goes over all labs asks it. docs/LAB_AUTHORING.md describes a lab.
"""

from .registry import all_labs


def lab_modules() -> dict:
    """``{"lab0": module, ...}`` for every registered lab."""
    return {name: declared.module() for name, declared in all_labs().items()}


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
