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
    assert kernelbuild.job_ahead("raise NotImplementedError()", [lab0.FUSED], name="stub", backend="cuda") is None
    assert kernelbuild.job_ahead("// x", [lab0.FUSED], name="emulated", backend="emulate") is None
    assert kernelbuild.job_ahead("// x", ["not a prototype"], name="bad", backend="cuda") is None


@requires_nvcc
def test_a_kernel_compiled_ahead_is_the_one_its_cell_finds(tmp_path, monkeypatch):
    """The cell's build of the same text, launchers and name finds the library compiled ahead (no compiler run),
    and a build of one kernel while it compiles ahead in another thread waits for it under the build's lock."""
    import threading
    monkeypatch.setenv("FUSELAB_CACHE_DIR", str(tmp_path / "cache"))
    source = string_assignments(_notebook("lab0"))["FUSED_SOURCE"]
    assert kernelbuild.compile_ahead(kernelbuild.job_ahead(source, [lab0.FUSED], name="fused", backend="cuda"))
    module = fuselab.build(source, [lab0.FUSED], name="fused", backend="cuda")
    assert module.cached and module.backend == "cuda"

    other = source.replace("fmaxf", "fmaxf ")
    job = kernelbuild.job_ahead(other, [lab0.FUSED], name="fused", backend="cuda")
    results = []
    thread = threading.Thread(target=lambda: results.append(kernelbuild.compile_ahead(job)))
    thread.start()
    module = fuselab.build(other, [lab0.FUSED], name="fused", backend="cuda")
    thread.join()
    assert results == [True] and module.backend == "cuda"
    assert len(list((tmp_path / "cache").rglob("fuselab-complete"))) == 2  # one library each


def test_a_submissions_builds_are_planned_under_the_planning_lock():
    """CPython 3.11's ast.parse is not safe in two threads at once, and the grader plans submissions in parallel
    threads: the plan of a submission's builds waits while another submission's plan parses."""
    import threading
    from fuselab.grading.recheck import clean
    notebook = _notebook("lab3")
    finished = threading.Event()
    with clean._PLANNING:
        thread = threading.Thread(target=lambda: (clean._builds_ahead(notebook, notebook), finished.set()),
                                  daemon=True)
        thread.start()
        assert not finished.wait(1.0)
    thread.join(60)
    assert finished.is_set()


def test_the_kernel_worker_makes_its_jobs_on_its_own_thread_and_waits_for_them_before_a_speed_test(monkeypatch):
    """The kernel worker parses the launchers (``job_ahead``) on the thread that serves the checker; only the
    compilers run from its pool, at most as many at once as its CPU share; a speed test starts when they ended."""
    import threading
    import time
    from fuselab import kernelbuild as kb
    from fuselab.grading.recheck import kernel_worker
    seen, running, most = [], [0], [0]
    lock = threading.Lock()

    def compile_ahead(job):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        return True
    monkeypatch.setattr(kb, "job_ahead", lambda source, launchers, name: seen.append(
        threading.current_thread()) or ("job", name))
    monkeypatch.setattr(kb, "compile_ahead", compile_ahead)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    worker = kernel_worker.KernelWorker.__new__(kernel_worker.KernelWorker)
    worker.ahead = []
    builds = [{"source": f"// {k}", "launchers": [lab0.FUSED], "name": f"k{k}"} for k in range(4)]
    assert worker.compile_ahead(builds + ["not a build", {"source": 1}]) == ["ok", ["v", None]]
    assert seen == [threading.current_thread()] * 4 and len(worker.ahead) == 4
    worker.ahead_done()
    assert worker.ahead == [] and most[0] == 2


def test_the_reference_runs_build_ahead_gets_the_checkers_environment_and_a_session_of_its_own(tmp_path,
                                                                                                monkeypatch):
    """Beside a reference run, the build-ahead process compiles into the shared builds with the environment the
    run's checker gets (no compiler setting of the TA's the checker never sees: the build's key does not cover
    the environment), imports nothing from its working folder, and ends with its compilers."""
    import subprocess
    from fuselab.grading.run import build_ahead
    started = {}

    class Popen:
        pid = 0

        def __init__(self, command, **kwargs):
            started.update(kwargs, command=command)
    monkeypatch.setattr(subprocess, "Popen", Popen)
    env = {"PATH": "/usr/bin:/bin", "FUSELAB_CACHE_DIR": str(tmp_path / "shared"), "HOME": str(tmp_path),
           "NVCC_APPEND_FLAGS": "-Xlinker -soname=the_tas_own", "CPATH": str(tmp_path), "CUDAHOSTCXX": "clang++"}
    build_ahead.start("lab0", env, tmp_path / "reference" / "lab0", "0")
    assert started["command"][1:] == ["-P", "-m", "fuselab.grading.run.build_ahead", "lab0"]
    assert started["start_new_session"] and started["cwd"] == tmp_path / "reference"
    assert started["env"]["FUSELAB_CACHE_DIR"] == str(tmp_path / "shared")
    assert started["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert not {"NVCC_APPEND_FLAGS", "CPATH", "CUDAHOSTCXX"} & set(started["env"])
