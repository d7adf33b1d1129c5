"""The course's labs, declared: one ``LAB = Lab(...)`` per lab package, and the one list of them.

Every lab is a package ``fuselab/labs/labN/`` whose ``__init__.py`` holds what its notebook imports (launcher
prototypes, the fixed unfused reference kernels, input makers, float64 references, shapes) and ends in a
declaration ``LAB = Lab(...)``: its notebook, the launchers each CUDA source of the notebook must define, its
reference kernels, its graded cells and its graded speedup tests (``GradedTest``). Beside it, ``samples.py``
(``SAMPLES``, its sample submissions, each a ``Sample``). Its stage of the GPU self-check is a tool, one floor up:
``fuselab/tools/gpu_selfcheck/lab_checks/labN.py``.

``LAB_NAMES`` is the registry: what the course releases (``course.lab_names``), what the GPU self-check runs
(its lab stages), what the sample class holds (``course.sample_class.all_samples``) and what the kernel tests
build (``labs.lab_modules``) all come from it. ``tests/test_registry.py`` fails when a ``solutions/labN`` is not listed
here, when a declaration disagrees with its notebook, or when ``fuselab/speed/policy.json`` disagrees with a
``GradedTest``. docs/LAB_AUTHORING.md lists what a new lab needs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from dataclasses import dataclass, field

# Every lab of the course, in order: the package fuselab/labs/<name>/ and the notebook solutions/<name>/<name>.ipynb.
LAB_NAMES = ("lab0", "lab1", "lab2", "lab3")


@dataclass(frozen=True)
class GradedTest:
    """One graded speedup test, as ``fuselab.speed.speedup_test(id, ...)`` runs it in the cell ``grade_id``.

    id: its key in ``fuselab/speed/policy.json`` ("lab0.add_relu_mul"), where ``fuselab calibrate`` writes each GPU's
        plain speedup and threshold.
    grade_id: the nbgrader grade_id of its test cell. Without a GPU it scores 0 ("not measured").
    mode, shape, dtype: the fixed timing settings (the policy file's copy must agree).
    speed_requires: the graded test cells the timed kernel must pass in the same clean recheck for the speed test
        to score at all.
    tuned_op: the lab package's function that builds the course's tuned solution from the instructor notebook's
        ``TUNED_SOURCE`` and returns it as the speed test's op; the reference run times it for the feedback pages'
        picture ("" where the lab has none).
    """

    id: str
    grade_id: str
    mode: str
    shape: tuple
    dtype: str
    speed_requires: tuple = ()
    tuned_op: str = ""

    def settings(self) -> dict:
        """The policy file's per-test settings of this test (its GPU entries aside)."""
        return {"mode": self.mode, "shape": list(self.shape), "dtype": self.dtype,
                "speed_requires": list(self.speed_requires)}

    def timed(self) -> dict:
        """``{mode, shape, dtype}``: what a self-check stage reports under ``result["graded"][id]``."""
        return {"mode": self.mode, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class Lab:
    """One lab, declared in its package as ``LAB``.

    name: "labN": the package ``fuselab/labs/labN/``, ``solutions/labN/``, ``labs/labN/``.
    title: one line.
    notebook: the notebook's path under ``solutions/`` (and ``labs/``), "labN/labN.ipynb".
    package: the lab's module ("fuselab.labs.labN").
    launchers: the notebook's CUDA source variables (``*_SOURCE``) and the launcher prototypes each must define.
    reference_sources: the lab's fixed kernels, ``{build name: (CUDA source, launchers)}``.
    graded_cells: grade_id → points of every autograded (code) cell, the speed tests' included.
    written_answers: grade_id → points of the written answers (markdown cells, graded by hand).
    graded_tests: its graded speedup tests.
    samples: the module of the package holding ``SAMPLES``.
    """

    name: str
    title: str
    notebook: str
    package: str
    launchers: dict = field(default_factory=dict)
    reference_sources: dict = field(default_factory=dict)
    graded_cells: dict = field(default_factory=dict)
    written_answers: dict = field(default_factory=dict)
    graded_tests: tuple = ()
    samples: str = "samples"

    def module(self):
        return importlib.import_module(self.package)

    def samples_module(self):
        return importlib.import_module(f"{self.package}.{self.samples}")

    def speed_grade_ids(self) -> set:
        """The grade_ids of the graded speedup test cells (0 points without a GPU)."""
        return {test.grade_id for test in self.graded_tests}

    def solution_notebook(self) -> Path:
        """The instructor's notebook, ``solutions/<notebook>`` of the checkout holding this package."""
        return Path(__file__).resolve().parents[2] / "solutions" / self.notebook

    def graded_test(self, test_id: str) -> GradedTest:
        found = [test for test in self.graded_tests if test.id == test_id]
        if not found:
            raise KeyError(f"{self.name} has no graded speedup test {test_id!r}")
        return found[0]


@dataclass(frozen=True)
class Sample:
    """One sample submission of one lab.

    changes: grade_id → new cell source, or a function of the filled-in source.
    expect: grade_id → "full", "zero", "partial" or "any" (speed cells are "zero" without a GPU whatever this says
        about the GPU; see ``expect_gpu``). Graded cells not listed are expected "full".
    expect_gpu: overrides of ``expect`` on a GPU (for speed cells).
    why: one line a teaching assistant reads in the sample class's report.
    """

    changes: dict = field(default_factory=dict)
    expect: dict = field(default_factory=dict)
    expect_gpu: dict = field(default_factory=dict)
    why: str = ""


def lab_names() -> list:
    return sorted(LAB_NAMES)


def lab(name: str) -> Lab:
    """The declaration ``LAB`` of the registered lab ``name``."""
    if name not in LAB_NAMES:
        raise KeyError(f"no lab {name!r} in the registry (fuselab/labs/registry.py: {', '.join(LAB_NAMES)})")
    declared = importlib.import_module(f"{__package__}.{name}").LAB
    if declared.name != name:
        raise ValueError(f"fuselab.labs.{name} declares LAB.name={declared.name!r}")
    return declared


def all_labs() -> dict:
    """``{"lab0": Lab, ...}`` over every registered lab, in order."""
    return {name: lab(name) for name in lab_names()}


def graded_tests() -> dict:
    """``{test id: GradedTest}`` over every lab: the keys ``fuselab/speed/policy.json`` holds."""
    return {test.id: test for declared in all_labs().values() for test in declared.graded_tests}


def speed_grade_ids(name: str) -> set:
    """The grade_ids of lab ``name``'s graded speedup test cells."""
    return lab(name).speed_grade_ids()
