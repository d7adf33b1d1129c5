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
