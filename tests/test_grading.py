"""Graded speedup tests without a GPU, and nbgrader's view of a whole lab on the CPU.

No GPU, no speed points: the speed cell must end in 0 marked "not measured (no GPU)", never in full marks.
"""

import json

import pytest
import torch

import fuselab
from fuselab import course, speed
from fuselab.grading.records.nbgrader_run import autograde
from fuselab.labs import lab0


@pytest.fixture(scope="module")
def emulated_modules():
    fused_mod = fuselab.build("""
__global__ void k(const float* a, const float* b, const float* e, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(a[i] + b[i], 0.0f) * e[i];
}
void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, cudaStream_t s) {
    if (n > 0) k<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(a, b, e, out, n);
}""", [lab0.FUSED], backend="emulate", name="fused")
    reference_mod = fuselab.build(lab0.REFERENCE_UNFUSED_SOURCE, lab0.UNFUSED_LAUNCHERS, backend="emulate")
    return fused_mod, reference_mod


def test_speedup_without_gpu_is_zero_and_marked_not_measured(emulated_modules, capsys, tmp_path, monkeypatch):
    fused_mod, reference_mod = emulated_modules
    log = tmp_path / "grades.jsonl"
    monkeypatch.setenv("FUSELAB_GRADE_LOG", str(log))
    points = speed.speedup_test("lab0.add_relu_mul", candidate=lab0.fused(fused_mod),
                                reference_op=lab0.unfused(reference_mod), reference=lab0.reference,
                                make_inputs=lambda s, seed: lab0.make_inputs(s, seed), module=fused_mod, max_points=4)
    assert points == 0.0 and isinstance(points, float)
    assert "not measured (no GPU)" in capsys.readouterr().out
    record = json.loads(log.read_text())
    assert record["status"] == "not measured (no GPU)" and record["speedup"] is None


def test_policy_threshold_follows_the_rule_and_falls_back_to_the_h200():
    test, entry, note = speed.policy_entry("lab0.add_relu_mul", "Some Other GPU")
    assert "H200" in note and "fuselab calibrate" in note
    assert entry["threshold"] == pytest.approx(1 + 0.6 * (entry["plain_speedup"] - 1), abs=0.01)
    assert test["mode"] == "device" and test["shape"] == [64 * 2**20]
    with pytest.raises(KeyError):
        speed.policy_entry("no.such.test", "NVIDIA H200")


def test_the_instructors_run_builds_and_checks_the_courses_tuned_solution(tmp_path, monkeypatch):
    """The grader's run of the instructor's notebook times the course's tuned solution too (for the feedback
    picture): ``tuned.course_tuned`` builds it from the instructor's notebook through the lab's ``tuned_op`` and checks
    it on the timed inputs before any timing. A tuned source that fails to build or is wrong is said in the
    record's words and returns no op: the plain solution's record stands. Only that run does it."""
    from fuselab.runmode import GRADING_ENV, INSTRUCTORS_RUN_ENV, instructors_run
    from fuselab.speed import tuned
    inputs = lab0.make_inputs((4099,), seed=5, device="cuda" if torch.cuda.is_available() else "cpu")
    out = torch.empty_like(inputs[0])
    op, why = tuned.course_tuned("lab0.add_relu_mul", inputs, out, lab0.reference)
    assert op is not None and why == ""
    torch.testing.assert_close(out.double(), lab0.reference(*[x.double() for x in inputs]))
    assert tuned.build("lab0.add_relu_mul")  # as the grader's build beside the reference run does

    broken = tmp_path / "lab0.ipynb"
    notebook = json.loads((course.SOLUTIONS / "lab0" / "lab0.ipynb").read_text())
    for cell in notebook["cells"]:
        text = "".join(cell["source"])
        if text.startswith("TUNED_SOURCE"):  # the tuned kernel writes the wrong value
            cell["source"] = text.replace("fmaxf(x.x + y.x, 0.0f) * z.x", "fmaxf(x.x - y.x, 0.0f) * z.x")
            assert cell["source"] != text
    broken.write_text(json.dumps(notebook))
    monkeypatch.setattr(type(lab0.LAB), "solution_notebook", lambda self: broken)
    op, why = tuned.course_tuned("lab0.add_relu_mul", inputs, out, lab0.reference)
    assert op is None and why.startswith("not measured (CheckFailed: out") and "\n" not in why
    monkeypatch.setattr(type(lab0.LAB), "solution_notebook", lambda self: tmp_path / "none.ipynb")
    assert tuned.course_tuned("lab0.add_relu_mul", inputs, out, lab0.reference) == (
        None, "the lab has no tuned solution here")


    monkeypatch.delenv(INSTRUCTORS_RUN_ENV, raising=False)
    monkeypatch.setenv(GRADING_ENV, "1")
    assert not instructors_run()  # a student's graded run
    monkeypatch.setenv(INSTRUCTORS_RUN_ENV, "1")
    assert instructors_run()
    monkeypatch.delenv(GRADING_ENV)
    assert not instructors_run()  # a student's own run, whatever its environment says


def test_a_tuned_solution_that_fails_its_timing_leaves_the_plain_record_alone():
    """The tuned solution's timing, after the plain solution's: a failure there is said in the record's tuned_*
    fields and raises nothing, so the speed test's own record stands."""
    from fuselab.speed import graded

    def faulting():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...")
    said = graded._time_tuned(lambda: None, faulting, "device", 0.05)
    assert said == {"tuned_status": "not measured (RuntimeError: CUDA error: an illegal memory access was "
                                    "encountered CUDA kernel errors might be ...)"}


def test_the_native_check_spares_only_the_course_code_built_in_its_own_thread(monkeypatch):
    """The course's tuned solution (inline PTX: ``asm``) is built by the instructor's run under
    ``native_check.course_code``; the check still holds for every other build, in any other thread."""
    import threading
    from fuselab import native_check
    monkeypatch.setenv(native_check.POLICY_ENV, "1")
    seen = {}
    with native_check.course_code():
        seen["inside"] = native_check.enabled()
        thread = threading.Thread(target=lambda: seen.update(other_thread=native_check.enabled()))
        thread.start()
        thread.join()
    assert seen == {"inside": False, "other_thread": True} and native_check.enabled()


def test_own_kernel_names_are_read_from_the_source():
    source = """
    // __global__ void commented_out(
    template <typename T> __global__ void __launch_bounds__(256) gemm_kernel(const T* a) {}
    __global__ void add_kernel(float* x) {}
    """
    assert speed.own_kernel_names(source) == {"gemm_kernel", "add_kernel"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU grading path")
def test_autograde_on_cpu_gives_correctness_points_and_no_speed_points(tmp_path):
    """nbgrader runs the solution and the blank lab: full correctness, 0 speed points, blank all zero."""
    from concurrent.futures import ThreadPoolExecutor

    from fuselab.grading.gpus import schedule

    def one_lab(lab):  # a scratch course per lab: nbgrader runs one notebook at a time, so the labs share the cores
        submissions = {"solution": {lab: next((course.SOLUTIONS / lab).glob("*.ipynb"))},
                       "blank": {lab: next((course.LABS / lab).glob("*.ipynb"))}}
        return autograde(submissions, tmp_path / lab)

    labs = course.lab_names()
    with ThreadPoolExecutor(max_workers=min(len(labs), schedule.available_cores())) as pool:
        per_lab = dict(zip(labs, pool.map(one_lab, labs)))
    scores = {student: {lab: per_lab[lab][student][lab] for lab in labs} for student in ("solution", "blank")}
    for lab in course.lab_names():
        solution, blank = scores["solution"][lab], scores["blank"][lab]
        # every lab's speed cell, Lab 3's small-K one included, gives 0 without a GPU
        speed_cells = {k: v for k, v in solution["cells"].items() if k.startswith("test_speedup")}
        assert all(score == 0.0 for score, _ in speed_cells.values())
        correctness = {k: v for k, v in solution["cells"].items() if k.startswith("test_") and k not in speed_cells}
        assert correctness and all(score == maximum for score, maximum in correctness.values()), correctness
        assert blank["autograded_score"] == 0.0 and blank["autograded_max"] == solution["autograded_max"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_validate_without_gpu_gives_no_score_and_says_the_course_measures_it(capsys, monkeypatch, tmp_path):
    def never(*args, **kwargs):
        raise AssertionError("nothing may be timed without a GPU")

    def run():
        return speed.speedup_test("lab0.add_relu_mul", candidate=never, reference_op=never, reference=never,
                                  make_inputs=never, module=None, max_points=4)

    monkeypatch.delenv("FUSELAB_GRADING", raising=False)
    monkeypatch.setenv("NBGRADER_VALIDATING", "1")
    assert fuselab.grading_mode()  # the heavy demos skip under Validate too
    assert run() is None  # a cell that shows no value passes Validate
    said = capsys.readouterr().out
    assert "measured when the course grades your notebook on its GPU" in said and "0 of 4" not in said
    # the grader's run (nbgrader sets the same variable when an instructor validates a graded copy) still scores 0
    monkeypatch.setenv("FUSELAB_GRADING", "1")
    monkeypatch.setenv("FUSELAB_GRADE_LOG", str(tmp_path / "log.jsonl"))
    assert run() == 0.0
    assert "not measured (no GPU)" in capsys.readouterr().out
    assert json.loads((tmp_path / "log.jsonl").read_text())["status"] == "not measured (no GPU)"
