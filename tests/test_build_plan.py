"""Kernels compiled ahead: the builds a lab's graded run makes, read from the instructor's notebook
(``fuselab/labs/build_plan.py``), and compiled side by side before the cells build them one after another
(``kernelbuild.compile_ahead``): the student's in the kernel worker, the instructor's beside the reference run
(``grading/run/build_ahead.py``). A plan is never a verdict: what it misses, each cell still builds.
"""

import json

import pytest

import fuselab
from fuselab import course, kernelbuild
from fuselab.labs import build_plan, lab0, registry
from fuselab.notebook_sources import string_assignments

from .conftest import requires_nvcc

LABS = registry.lab_names()


def _notebook(lab):
    return json.loads((course.SOLUTIONS / registry.lab(lab).notebook).read_text())


@pytest.mark.parametrize("lab", LABS)
def test_every_source_the_graded_run_builds_is_planned_with_its_launchers(lab):
    """Each ``*_SOURCE`` the lab declares is compiled ahead with the launchers the lab declares for it, except the
    optional tuned part (a graded run does not build it); the text is the submission's own."""
    declared = registry.lab(lab)
    values = {name: f"// {name} of a submission\n" for name in declared.launchers}
    planned = build_plan.notebook_builds(_notebook(lab), values, only_values=True)
    by_text = {build["source"]: build for build in planned}
    assert len(by_text) == len(planned) and set(by_text) <= set(values.values())
    variables = {name for name, text in values.items() if text in by_text}
    assert variables == set(declared.launchers) - {"TUNED_SOURCE"}, lab
    for name in variables:
        assert by_text[values[name]]["launchers"] == list(declared.launchers[name]), (lab, name)


@pytest.mark.parametrize("lab", LABS)
def test_the_instructors_plan_adds_the_labs_own_kernels(lab):
    """Beside the reference run the instructor's texts are compiled, and the lab's fixed kernels (some built by
    its helpers, not by a cell's own call)."""
    planned = build_plan.notebook_builds(_notebook(lab)) + build_plan.reference_builds(lab)
    instructor = string_assignments(_notebook(lab))
    texts = {build["source"] for build in planned}
    assert {instructor[name] for name in registry.lab(lab).launchers if name != "TUNED_SOURCE"} <= texts
    assert {source for source, _ in registry.lab(lab).reference_sources.values()} <= texts


def test_only_builds_a_graded_run_makes_are_planned():
    """A demo cell, a build behind a test of GRADING (either form), a build with settings of its own and a text
    that is not a name or a lab's attribute are left to their cells."""
    def cell(source, tags=()):
        return {"cell_type": "code", "source": source, "metadata": {"tags": list(tags)}}
    notebook = {"cells": [
        cell('A_SOURCE = "a"\nB_SOURCE = "b"'),
        cell('m = fuselab.build(A_SOURCE, [lab0.FUSED], name="a")'),
        cell('d = fuselab.build(A_SOURCE, [lab0.FUSED], name="demo")', tags=["demo"]),
        cell('t = None if GRADING else fuselab.build(B_SOURCE, [lab0.FUSED], name="gated")'),
        cell('if not GRADING:\n    u = fuselab.build(B_SOURCE, [lab0.FUSED], name="gated2")'),
        cell('v = fuselab.build(B_SOURCE, [lab0.FUSED], name="flags", extra_cflags=["-O0"])'),
        cell('w = fuselab.build(A_SOURCE + "", [lab0.FUSED], name="computed")'),
        cell('x = build(lab0.REFERENCE_UNFUSED_SOURCE, lab0.UNFUSED_LAUNCHERS, name="lab0_reference")'),
        cell('y = fuselab.build(B_SOURCE, launchers_of_my_own, name="unknown")'),
        cell("this is not Python"),
    ]}
    planned = build_plan.notebook_builds(notebook)
    assert [(b["name"], b["source"]) for b in planned] == [
        ("a", "a"), ("lab0_reference", lab0.REFERENCE_UNFUSED_SOURCE)]
    assert planned[0]["launchers"] == [lab0.FUSED] and planned[1]["launchers"] == list(lab0.UNFUSED_LAUNCHERS)
    assert [b["name"] for b in build_plan.notebook_builds(notebook, only_values=True)] == ["a"]


def test_a_build_that_cannot_compile_ahead_is_left_to_its_cell():
    """Nothing raises: a stub, an emulated build (its build redirects the process's output), a bad prototype."""
    assert kernelbuild.compile_ahead("raise NotImplementedError()", [lab0.FUSED], name="stub") is False
    assert kernelbuild.compile_ahead("// x", [lab0.FUSED], name="emulated", backend="emulate") is False
    assert kernelbuild.compile_ahead("// x", ["not a prototype"], name="bad", backend="cuda") is False


@requires_nvcc
def test_a_kernel_compiled_ahead_is_the_one_its_cell_finds(tmp_path, monkeypatch):
    """The cell's build of the same text, launchers and name finds the library compiled ahead (no compiler run),
    and two builds of one kernel at once compile it once: the second waits under the build's lock."""
    import threading
    monkeypatch.setenv("FUSELAB_CACHE_DIR", str(tmp_path / "cache"))
    source = string_assignments(_notebook("lab0"))["FUSED_SOURCE"]
    assert kernelbuild.compile_ahead(source, [lab0.FUSED], name="fused", backend="cuda")
    module = fuselab.build(source, [lab0.FUSED], name="fused", backend="cuda")
    assert module.cached and module.backend == "cuda"

    other = source.replace("fmaxf", "fmaxf ")
    results = []
    thread = threading.Thread(target=lambda: results.append(
        kernelbuild.compile_ahead(other, [lab0.FUSED], name="fused", backend="cuda")))
    thread.start()
    module = fuselab.build(other, [lab0.FUSED], name="fused", backend="cuda")
    thread.join()
    assert results == [True] and module.backend == "cuda"
    assert len(list((tmp_path / "cache").rglob("fuselab-complete"))) == 2  # one library each, none built twice
