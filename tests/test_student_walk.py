"""What a new student without a GPU reads in Labs 0-3 (CPU, seconds): messages that name the cause they see, and
numbers on one screen that do not seem to disagree with each other or with the text beside them."""

import re

import pytest

from fuselab.labs import lab1

from .test_notebook_text import run_saved_result_cells


# ------------------------------------------------------------------------------------- Lab 1: conv_output_size
def _wrong(formula):
    return {
        "no + 1": lambda size, kernel, stride, pad: (size + 2 * pad - kernel) // stride,
        "padding on one side": lambda size, kernel, stride, pad: (size + pad - kernel) // stride + 1,
        "no padding": lambda size, kernel, stride, pad: (size - kernel) // stride + 1,
        "+ 1 inside the division": lambda size, kernel, stride, pad: (size + 2 * pad - kernel + 1) // stride,
        "rounds up": lambda size, kernel, stride, pad: -(-(size + 2 * pad - kernel) // stride) + 1,
        "no stride": lambda size, kernel, stride, pad: size + 2 * pad - kernel + 1,
    }[formula]


@pytest.mark.parametrize("formula,named", [
    ("no + 1", "one output short"),
    ("padding on one side", "counted on one side only"),
    ("no padding", "unpadded row"),
    ("+ 1 inside the division", "inside the division"),
    ("rounds up", "rounds up"),
    ("no stride", "stride is left out"),
])
def test_the_visible_output_size_test_names_the_mistake_every_case_shows(formula, named):
    """The first visible case, (5, 3, 2, 1), gives 2 for a missing `+ 1`, for padding counted once and for no
    padding at all, and the message named the `+ 1` for all three: a student with the `+ 1` in place was sent to
    look for it. The check reads the student's answers to every visible case and names the one mistake that fits
    them all; a division that rounds up passed every visible case (the hidden tests caught it)."""
    with pytest.raises(AssertionError) as raised:
        lab1.check_output_size(_wrong(formula), lab1.VISIBLE_OUTPUT_SIZE_CASES)
    said = str(raised.value)
    assert named in said, said
    others = {"one output short", "counted on one side only", "unpadded row", "inside the division", "rounds up",
              "stride is left out"} - {named}
    assert not [other for other in others if other in said], said


def test_one_answer_alone_that_fits_several_mistakes_names_them_all():
    said = lab1.output_size_message(2, 5, 3, 2, 1)
    assert "more than one mistake" in said and "+ 1" in said and "one side only" in said, said


# ------------------------------------------------------------------------------ Lab 1: the depthwise rate list
def _printed_fractions(printed, yardstick):
    """The (fused, unfused) percentages of each shortfall line that measures against ``yardstick``."""
    return [(int(fused), int(unfused)) for fused, unfused in re.findall(
        rf"moves its bytes at (\d+)% of {re.escape(yardstick)} and the unfused kernels move theirs at (\d+)%", printed)]


def test_lab1s_rate_list_prints_times_so_its_only_fractions_are_the_ones_its_sentence_speaks_of():
    """The list printed the graded reference at 19 % "of the copy bandwidth" and the plain fused kernel at 28 %, one
    line above the shortfall line's 28 % against 37 %, under a sentence saying the plain kernel reaches the smaller
    fraction. The list was a rate over the minimum bytes, not each version's bandwidth on its own bytes; now it is
    each version's time as a multiple of the copy floor's time, from the saved file, and the one line with
    fractions of the copy bandwidth is the sentence's: the plain kernel's below the reference's."""
    from .test_notebook_claims import CLAIMS, load_data
    printed = run_saved_result_cells("lab1")
    saved = lab1.saved_results(lab1.DEPTHWISE_RESULTS)
    moved = lab1.depthwise_bytes(*lab1.DEPTHWISE_TIMED)
    floor_us = moved["fused"] / (saved["copy_GBps"] * 1e9) * 1e6
    assert f"({moved['fused'] / 1e6:.0f} MB in {floor_us:.0f} µs)" in printed, printed
    for name, t in saved["rows"][0]["times_us"].items():
        assert f"{name:>32}: {t:7.0f} µs = {t / floor_us:4.1f}x the copy floor's time" in printed, (name, printed)
    assert "GB/s =" not in printed, printed
    fractions = _printed_fractions(printed, "the copy bandwidth")
    assert len(fractions) == 1 and fractions[0][0] < fractions[0][1], (fractions, printed)
    assert len(re.findall(r"\d+% of the copy bandwidth", printed)) == 1, printed
    claim = "reaches a smaller fraction of the copy bandwidth than the reference's two simple kernels"
    assert next(check for lab, words, check in CLAIMS if lab == "lab1" and words == claim)(load_data())


def test_lab2s_context_text_names_the_only_fractions_the_cell_prints():
    """Lab 2's context text said the cell "prints each version's fraction of the copy bandwidth": it prints each
    version's time in µs and its time against the folded kernel's, and one line with two fractions, the plain fused
    kernel's and the reference's. The text now says so; the printout must keep to it."""
    from fuselab.labs import lab2

    from .test_notebook_claims import markdown, squash
    assert "prints each version's fraction" not in squash(markdown("lab2"))
    assert squash("the cell prints each version's time, then two fractions of the copy bandwidth, the plain fused "
                  "kernel's and the reference's (each on its own bytes)") in squash(markdown("lab2"))
    printed = run_saved_result_cells("lab2")
    for row in lab2.saved_results(lab2.CONTEXT_RESULTS)["rows"]:
        for name, us in row["median_us"].items():
            assert f"{name} {us:.1f} µs" in printed, (name, printed)
    fractions = _printed_fractions(printed, "the copy bandwidth")
    assert len(fractions) == 1 and fractions[0][0] < fractions[0][1], (fractions, printed)
    assert len(re.findall(r"\d+% of the copy bandwidth", printed)) == 1 and "GB/s" not in printed, printed
    assert "plain fused (folded) in the saved run (" in printed, printed


def test_lab1s_roofline_without_a_gpu_does_not_call_the_courses_conv_yours():
    printed = run_saved_result_cells("lab1")
    assert "your conv" not in printed and "the course's naive conv" in printed, printed


# ------------------------------------------------------------------------------------------- Lab 3: what it prints
def _cell(lab, grade_id):
    from .test_notebook_text import cells, grade_id as id_of, solution, text
    return next(text(c) for c in cells(solution(lab)) if id_of(c) == grade_id)


def test_lab3s_pitfalls_demo_says_each_failure_once():
    """Each pitfall printed "✗ missing_barrier: 1 of 1 case failed", then its title, then the report that begins
    with the same words: the check's own line and its report said it twice."""
    import contextlib
    import io

    import matplotlib
    matplotlib.use("Agg")
    import torch

    import fuselab
    from fuselab.labs import lab3
    namespace = {"fuselab": fuselab, "lab3": lab3, "torch": torch, "GRADING": False,
                 "make": lambda shape, seed, dtype=torch.float32: lab3.make_inputs(shape, seed, device="cpu", dtype=dtype)}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(_cell("lab3", "pitfalls"), namespace)  # noqa: S102 - the course's notebook
    lines = [line.strip().lstrip("✗✓ ").rstrip(".") for line in printed.getvalue().splitlines() if line.strip()]
    repeated = sorted({line for line in lines if lines.count(line) > 1})
    assert not repeated, printed.getvalue()
    assert printed.getvalue().count("FAILED") == 3, printed.getvalue()
    # each report's hint is shown, wherever it stands in the report: the wrong axis named as the axis it is read with
    said = printed.getvalue().split("--- ")
    wrong_axis = next(part for part in said if part.startswith("bias[row] instead of bias[col]"))
    assert "hint:" in wrong_axis and "is read with the row index" in wrong_axis, wrong_axis


def test_lab3s_small_k_table_prints_times_and_the_fractions_its_sentence_speaks_of():
    """The table printed the lab reference at 12 % "of the C-write floor" and the plain kernel at 18 % (fp32), under
    a sentence saying the plain kernel writes C at a smaller fraction of the floor's rate than the reference's two
    kernels: the table's share was the floor's time over each version's, not a rate on each version's own bytes.
    Now the table prints each version's time as a multiple of the floor's, from the saved file, and after it, for
    each dtype, the two fractions of the floor's rate the sentence speaks of: the plain kernel's the smaller."""
    from fuselab.labs import lab3

    from .test_notebook_claims import CLAIMS, lab3_shortfall, load_data
    printed = run_saved_result_cells("lab3")
    table = printed[printed.index("at the small-K shape"):]
    header = table.splitlines()[0]
    assert "time over the C-write floor's" in header and "writing C just once" not in header, header
    assert not re.search(r"\d+% of the C-write floor(?!'s rate)", table.split("graded:")[0]), table
    for row in lab3.saved_results(lab3.SWEEP_RESULTS)["small_k"]["rows"]:
        if not row["name"].startswith("sample "):
            assert f"{row['name']:42s} {row['median_us']:8.1f} µs  {1 / row['fraction_of_floor']:5.2f}x the floor's time" \
                in table, (row["name"], table)
    d = load_data()
    for dtype in ("float32", "float16"):
        line = next(line for line in table.splitlines() if line.startswith(f"{dtype}, plain fused:"))
        (fused, unfused), = _printed_fractions(line, "the C-write floor's rate")
        _, _, f_unfused, f_fused = lab3_shortfall(d, dtype)
        # lab3_shortfall's fractions share one yardstick up to a factor: their ratio is what the line's must match
        assert fused < unfused and abs(fused / unfused - f_fused / f_unfused) < 0.05, line
    claim = ("the plain kernel writes $C$ at a smaller fraction of the C-write floor's rate than the reference's two "
             "kernels do")
    assert next(check for lab, words, check in CLAIMS if lab == "lab3" and words == claim)(d)


# --------------------------------------------------------------------- what the text says about builds and speed
def _speed_test_markdown(lab):
    """The markdown right above the lab's graded speed test cell."""
    from .test_notebook_text import cells, solution, text
    found = cells(solution(lab))
    index = next(i for i, c in enumerate(found) if "fuselab.speed.speedup_test(" in text(c))
    return next(text(c) for c in reversed(found[:index]) if c["cell_type"] == "markdown")


@pytest.mark.parametrize("lab", ["lab0", "lab1", "lab2", "lab3"])
def test_each_speed_tests_text_says_what_a_student_without_a_gpu_sees(lab):
    """Labs 0-2 said the test prints its threshold "when it measures", while without a GPU it prints the threshold,
    the plain solution's speedup and the partial credit too; and none said that Validate counts the test's points
    as not measured rather than as passed."""
    said = " ".join(_speed_test_markdown(lab).split())
    assert "when it measures" not in said, said
    assert 'marked "not measured (no GPU)"' in said and "Validate counts its points as not measured here" in said, said


def test_lab0s_build_time_agrees_with_the_saved_build_benchmarks():
    """Lab 0 said a build takes "about a second on a GPU machine": the H200's saved benchmark has 2.1 s for a first
    build, 1.4-1.6 s after an edit, and the CPU emulation's 0.3-5.1 s on the 2-core machine (its first build in a
    fresh cache also compiles the emulation's runtime, once)."""
    import json

    from .conftest import REPO
    from .test_notebook_claims import markdown, squash
    assert squash("about one to two seconds on the course's GPU machine; under the CPU emulation on a 2-core "
                  "machine, under a second to about five seconds") in squash(markdown("lab0"))
    gpu = json.loads((REPO / "docs" / "results" / "selfcheck-h200-59d27bd.json").read_text())["build"]
    emulation = json.loads((REPO / "docs" / "results" / "build-emulation-labs-cpu2.json").read_text())["labs"]
    gpu_times = [gpu["first_build"], *gpu["rebuild_after_edit_all"]]
    emulated = [t for lab in emulation.values() for t in (lab["first_build"], *lab["rebuild_after_edit"])]
    assert all(0.8 <= t <= 2.3 for t in gpu_times), gpu_times
    assert min(emulated) < 1 and max(emulated) <= 5.5, sorted(emulated)


# ------------------------------------------------------------------------------- Lab 3: a B stride of M, not N
def test_a_b_stride_of_m_is_named_as_m_against_n_not_as_a_dropped_tail_of_n():
    """Every visible case whose N was a multiple of 8 had M == N, so a B row stride of M (right only where M == N)
    passed exactly the cases with N a multiple of 8, and the report blamed a loop that drops the tail of N. A case
    with N a whole number of tiles and M != N tells the two apart."""
    from .test_student_messages import _lab3_fused_with
    report = _lab3_fused_with("b[(int64_t)(k0 + ty) * N + col]", "b[(int64_t)(k0 + ty) * M + col]", "walk_b_stride_m")
    assert "every case with M == N passes" in report, report
    assert "tail of N" not in report, report


# ------------------------------------------------------------------------------------ Lab 3: Part D's goals
def test_part_ds_goals_are_the_ones_its_text_states_and_each_is_printed_from_the_saved_sweep():
    """Part D's text says the cell prints what the course's GPU self-check measured against its goals; without a GPU
    it printed the small-K shape only (two goals of four), not 4096³ against cuBLAS nor the skinny shapes against
    F.linear + ReLU, though the saved sweep has both."""
    from fuselab.labs import lab3

    from .test_notebook_claims import markdown, squash
    goals = lab3.TUNED_GOALS
    said = squash(markdown("lab3"))
    assert (f"at least {goals['cublas_square']:.0%} of cuBLAS fp32 (TF32 off) at 4096³; within "
            f"{goals['skinny_vs_linear']:.1f}× of `F.linear` + ReLU at the skinny shapes") in said
    assert f"at least {goals['floor']:.0%} of the C-write floor" in said
    lines = "\n".join(lab3.saved_tuned_goals())
    saved = lab3.saved_results(lab3.SWEEP_RESULTS)
    cublas = {(tuple(r["shape"]), r["name"]): r["median_us"] for r in saved["cublas"]}
    square = tuple(lab3.SQUARE)
    rate = min(cublas[(square, "F.linear + relu")], cublas[(square, "torch.addmm + relu")]) / cublas[(square, "tuned fused")]
    assert f"{rate:.0%} of cuBLAS's rate" in lines, lines
    for m in (1, 4, 8, 16):
        shape = (m, 4096, 4096)
        assert f"{cublas[(shape, 'tuned fused')] / cublas[(shape, 'F.linear + relu')]:.2f}x the time" in lines, lines
    for dtype, row in saved["small_k"]["summary"].items():
        assert f"{dtype} at {list(lab3.SMALL_K)}: {row['tuned_fraction_of_floor']:.0%} of the C-write floor" in lines
    assert "not yours" in lines
    # and the notebook prints them where it has no GPU
    from .test_notebook_text import cells, grade_id, solution, text
    tuned = next(text(c) for c in cells(solution("lab3")) if grade_id(c) == "tuned")
    assert "lab3.saved_tuned_goals()" in tuned


# ------------------------------------------------------------------- builds: the compiler's message, nothing else
def test_a_failed_first_build_without_a_gpu_shows_no_torch_warning(tmp_path):
    """The first build of a fresh process without a GPU makes torch log "No CUDA runtime is found, using
    CUDA_HOME=..."; where the compiler's messages name a file other than the build's (Lab 3's tuned path starts
    the student's text as ``tuned.cu``), the error showed the whole log, that line first: a student read it as a
    setup problem. Run in a fresh process, as a student's first cell does."""
    import os
    import subprocess
    import sys

    from .conftest import REPO
    script = ("import fuselab\nfrom fuselab.labs import lab3\n"
              "try:\n    fuselab.build(lab3.tuned_source('int x = not_declared_here;\\n'), lab3.FUSED_LAUNCHERS)\n"
              "except fuselab.BuildError as e:\n    print(e)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "FUSELAB_CACHE_DIR": str(tmp_path / "cache"),
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "CUDA_VISIBLE_DEVICES": ""}
    said = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300).stdout
    assert "not_declared_here" in said, said
    assert "CUDA" not in said and "cpp_extension" not in said, said


@pytest.mark.parametrize("notice", [
    "W1204 22:47:52.935000 7097 /venv/lib/python3.11/site-packages/torch/utils/cpp_extension.py:183] "
    "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'",
    "UserWarning: TORCH_CUDA_ARCH_LIST is not set, all archs for visible cards are included for compilation.",
    "/venv/lib/python3.11/site-packages/torch/utils/cpp_extension.py:2059: UserWarning: TORCH_CUDA_ARCH_LIST is not "
    "set",
])
def test_the_build_errors_text_leaves_out_what_torch_and_python_warned(notice):
    from fuselab import diagnostics
    log = f"{notice}\n/build/dir/other.cu:3:9: error: 'y' was not declared in this scope\n"
    for filename in ("kernel.cu", "other.cu"):  # the compiler names the build's file, or another one
        said = diagnostics.student_diagnostics(log, filename)
        assert "not declared" in said and notice.split(":")[0] not in said and "Warning" not in said, said


# ----------------------------------------------------------- the check's guesses: the tail only where it alone fits
def _gemm_case(m, n, k, passed):
    from collections import namedtuple

    from fuselab.check import CaseResult
    from fuselab.check.outputs import OutputComparison
    Shape = namedtuple("Shape", "M N K bias relu")
    out = OutputComparison(name="out", shape=(m, n), dtype="float32", passed=passed, numel=m * n,
                           n_bad=0 if passed else 1)
    return CaseResult(name="fused", shape=Shape(m, n, k, True, True), seed=0, comparisons=[out])


@pytest.mark.parametrize("passing,other", [
    # every case with N a multiple of 8 has M == N: a B stride of M passes exactly those
    ([(16, 16, 5), (24, 24, 9), (8, 8, 3)], "M == N"),
    # every case with K a multiple of a tile has N one too, and the failing ones have neither
    ([(3, 16, 16), (5, 32, 32), (9, 48, 16)], "N a multiple of"),
])
def test_the_tail_is_not_blamed_where_the_passing_cases_share_something_else(passing, other):
    """The "tail dropped" guess fired wherever every case with a size a multiple of 8 or 16 passed, also where
    those cases passed for another reason they all share and the failing ones lack (M == N: a stride of M where
    N belongs). Then both are said, and neither is offered as the cause."""
    from fuselab.check import CheckResult
    failing = [(5, 7, 3), (17, 31, 19), (9, 20, 21), (1, 17, 33), (40, 50, 70)]
    result = CheckResult("fused", [_gemm_case(*s, True) for s in passing] + [_gemm_case(*s, False) for s in failing])
    said = result.report()
    assert "tail of" not in said, said
    assert other in said and "do not tell which" in said, said


def test_the_tail_is_still_named_where_only_the_tail_fits():
    from fuselab.check import CheckResult
    passing = [(16, 16, 16), (7, 12, 32), (3, 5, 48)]
    failing = [(5, 7, 3), (17, 31, 19), (9, 20, 21), (1, 17, 33), (40, 40, 70)]
    result = CheckResult("fused", [_gemm_case(*s, True) for s in passing] + [_gemm_case(*s, False) for s in failing])
    said = result.report()
    assert "every case with K a multiple of" in said and "tail of K" in said and "do not tell" not in said, said


# ------------------------------------------------------------ out-of-bounds writes: the check that fits the output
def _mm_inputs(shape, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    m, n, k = shape
    return torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)


def _written_past(extra_rows, extra_cols=0):
    """A GEMM whose threads check neither bound: the grid, rounded up to tiles, writes past the last row."""
    import torch

    def run(a, b, out):
        out.copy_(a @ b)
        rows, cols = out.shape
        spill = torch.as_strided(out, (out.numel() + extra_rows * cols + extra_cols,), (1,))
        spill[out.numel():] = 0.0
    return run


@pytest.mark.parametrize("extra_rows,extra_cols,bound", [
    (2, 0, "`if (row < 5 && col < 7)`"),
    (0, 1, "`col <= cols` where `col < cols`"),
])
def test_an_out_of_bounds_write_of_a_2d_output_is_hinted_with_both_bounds(extra_rows, extra_cols, bound):
    """A 2-D kernel (the GEMM's `row < M && col < N`) that wrote past its output was told of "a missing
    `if (i < n)`": a check on one flat index it does not have."""
    import fuselab
    result = fuselab.check(_written_past(extra_rows, extra_cols), lambda a, b: a @ b, _mm_inputs, [(5, 7, 3)],
                           seeds=(0,), verbose=False, raise_on_fail=False)
    said = result.report()
    assert not result.passed and bound in said and "i < n" not in said, said


def test_an_out_of_bounds_write_of_a_flat_output_is_still_hinted_with_one_bound():
    import torch

    import fuselab

    def run(x, out):
        out.copy_(x * 2)
        torch.as_strided(out, (out.numel() + 3,), (1,))[out.numel():] = 0.0
    result = fuselab.check(run, lambda x: x * 2, lambda shape, seed: (torch.randn(*shape),), [(100,)], seeds=(0,),
                           verbose=False, raise_on_fail=False)
    assert "missing `if (i < n)` bounds check" in result.report(), result.report()


# --------------------------------------------------------------------------------- numbers that read as numbers
@pytest.mark.parametrize("lab", ["lab0", "lab1", "lab3"])
def test_the_speed_tests_text_names_its_size_not_a_bare_count(lab):
    """Lab 0's speed text said "against the lab's unfused reference at 67108864": a bare number, not read as the
    element count it is."""
    from fuselab.labs import lab_modules
    from fuselab.speed.graded import would_grade
    said = would_grade(lab_modules()[lab].GRADED_TEST, 4)
    where = re.search(r"unfused reference at (.+?), (float|half|bf)", said).group(1)
    assert re.fullmatch(r"\d{1,3}(,\d{3})* elements|shape \d+(×\d+)+", where), said


@pytest.mark.parametrize("lab", ["lab0", "lab1", "lab2", "lab3"])
def test_no_printed_range_has_two_equal_ends(lab):
    """Lab 3 printed "graph time: S = 1.01–1.01x": a range whose ends print the same is one value."""
    printed = run_saved_result_cells(lab)
    same = re.findall(r"(?<![\d.])(\d+(?:\.\d+)?)–\1(?![\d.])", printed)
    assert not same, [line for line in printed.splitlines() if any(f"{v}–{v}" in line for v in same)]


def test_lab3s_span_prints_one_value_where_both_ends_print_the_same():
    from fuselab.labs import lab3
    assert lab3.span([1.011, 1.009]) == "1.01" and lab3.span([1.0, 1.62]) == "1.00–1.62"
    assert lab3.span([40.2, 39.9], ".0f") == "40"


# ------------------------------------------------------------------------- Lab 2: the plain kernel's index cost
def test_lab2s_count_of_the_plain_kernels_divisions_is_the_starters():
    """Part C's "going further" said the plain fused kernel "pays for two 64-bit divisions to find its (row, column,
    channel)", a few cells below the starter it copies, which prints five: `i % W`, `i / W`, `% H`, `i / (H * W)`
    and `plane % C`, each on the 64-bit index. The number the text gives is the starter's count."""
    from fuselab.labs import lab2

    from .test_notebook_claims import markdown, squash
    kernel = lab2.STARTER_SOURCE.split("__global__", 1)[1]
    index = kernel[:kernel.index("const float* xp")]
    code = "\n".join(line.split("//")[0] for line in index.splitlines()[1:])  # the index arithmetic, no comments
    count = len(re.findall(r"[/%]", code))
    words = {4: "four", 5: "five", 6: "six"}[count]
    assert f"pays for {words} 64-bit divisions and remainders" in squash(markdown("lab2")), (count, code)
    assert "int64_t i =" in index and "two 64-bit divisions" not in squash(markdown("lab2"))


# ------------------------------------------------------------------------------------ Lab 0: whose sweep it is
def test_lab0s_sweep_text_says_whose_kernels_a_student_without_a_gpu_sees():
    """Section 5 said "The sweep below times your unfused and fused versions ... against the copy ceiling measured
    on this GPU"; without a GPU the cell draws the saved H200 run, of the lab's unfused reference against the course's
    plain fused kernel. The text says which is which, and the saved file is that run."""
    from fuselab.labs import lab0

    from .test_notebook_claims import markdown, squash
    said = squash(markdown("lab0"))
    assert "The sweep below times your unfused" not in said
    assert squash("On a GPU the sweep below times your unfused and fused versions") in said
    assert squash("without one it shows the course's H200 run instead, of the lab's unfused reference against the "
                  "plain fused solution") in said
    saved = lab0.saved_results(lab0.SWEEP_RESULTS)
    assert saved["gpu"] == "NVIDIA H200" and saved["note"].startswith("plain fused kernel vs the lab's unfused reference")
    printed = run_saved_result_cells("lab0")
    assert "your" not in printed.lower(), printed


def test_lab0s_timed_tensor_is_sized_in_the_unit_the_counters_print():
    """Section 7 gave the timed tensor as "256 MB per tensor" while the counters cell above it prints the same tensor
    as "256 MiB a tensor" (64M fp32 elements are 268 MB). The text's size is the counters' own, in MiB."""
    from fuselab.labs import lab0

    from .test_notebook_claims import markdown, squash
    tensor_bytes = 4 * lab0.TIMED_SHAPE[0]
    counted = lab0.saved_results(lab0.COUNTER_RESULTS)["rows"]
    assert tensor_bytes in [r["tensor_bytes"] for r in counted]
    printed = run_saved_result_cells("lab0")
    assert f"{tensor_bytes / 2**20:4.0f} MiB a tensor" in printed, printed
    said = squash(markdown("lab0"))
    assert f"({tensor_bytes // 2**20} MiB per tensor, far beyond" in said
    assert f"{tensor_bytes // 2**20} MB" not in said


# --------------------------------------------------------------------------- Lab 1: what the Part B cell shows
def test_lab1s_part_b_text_names_every_version_the_saved_cell_shows():
    """Without a GPU, Part B's cell shows "the lab's versions: the unfused pipeline split three ways ..., the plain
    fused solution and the tuned one", the text said; its list and its two panels show PyTorch eager and
    torch.compile too, and the batch-1 panel none of the split pipelines. Every version the saved rows hold is
    named, and the batch-1 panel's as it has them."""
    from .test_notebook_claims import markdown, squash
    said = squash(markdown("lab1"))
    named = {"conv+bias -> relu (graded)": "`conv+bias -> relu`, the graded reference", "conv -> bias+relu":
             "`conv -> bias+relu`", "conv -> bias -> relu": "`conv -> bias -> relu`",
             "plain fused": "the plain fused solution", "tuned fused": "the tuned one",
             "PyTorch eager": "with PyTorch eager", "torch.compile": "and `torch.compile` beside them"}
    saved = lab1.saved_results(lab1.DEPTHWISE_RESULTS)
    shown = [saved["rows"][0], saved["rows"][3]]  # what the cell draws without a GPU
    assert shown[1]["shape"][:2] == [1, 32]
    for row in shown:
        for name in row["speedups"]:
            assert squash(named[name]) in said, name
    batch1 = {"conv+bias -> relu (graded)": "the graded reference", "PyTorch eager": "eager",
              "plain fused": "the plain fused", "tuned fused": "the tuned one"}
    assert set(shown[1]["speedups"]) == set(batch1)
    assert "(at batch 1: the graded reference, eager, the plain fused and the tuned one)" in said
