"""What the lab notebooks say, checked without running them (CPU, about a second).

- Every number a notebook states about a measurement comes from a measurement it shows: markdown never states a
  measured quantity as a literal outside a claim that tests/test_notebook_claims.py checks against the saved data
  (a small allowlist below holds the settings and rules that look like one), and
  code cells never print one from a string literal. The cells that show the course GPU's saved results print
  the values of the saved files.
- The saved results a notebook reads ship inside the package, so a student with only ``labs/`` and fuselab has
  them.
- Every graded test cell ends in a number (a speed test's points) or in nothing, in the instructor's version and
  in the student's (where the hidden tests are gone): nbgrader reads a test cell's last displayed value as its
  score, and warns about (and may one day refuse) anything that is not a number.
"""

import ast
import contextlib
import io
import json
import re
import tomllib

import pytest

from fuselab import notebook as ipynb

from .conftest import REPO as ROOT
LABS = ("lab0", "lab1", "lab2", "lab3")

# A number followed by a unit of measure. A product of sizes (3×3, 112x112, 32 × 8) is a shape, not a measurement.
MEASURED = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s*(?:×(?!\s*\d)|x\b(?!\s*\d)|%|µs\b|us\b|ms\b|GB/s|TB/s|TFLOP)")

# Literal numbers that markdown may state because nothing measured them: (lab, phrase) -> why.
ALLOWED = {
    ("lab0", "under 1 %"): "fuselab.measure's default precision target (target_rse=0.01): a setting",
    ("lab0", "partial credit between 1.0× and the threshold"): "the grading rule: credit starts above no speedup",
    ("lab1", "partial credit between 1.0× and the threshold"): "the grading rule: credit starts above no speedup",
    ("lab2", "partial credit between 1.0× and it"): "the grading rule: credit starts above no speedup",
    ("lab3", "16× less traffic"): "16×16 tiles: each global element is loaded once per block of 16 threads, a count",
    ("lab3", "0 at 1.0×"): "the grading rule: credit starts above no speedup",
    ("lab3", "cut load instructions by 4×"): "a float4 carries 4 floats: a count",
    ("lab3", "at least 40% of cuBLAS"): "Part D's goal, a target (the cell prints what was measured)",
    ("lab3", "within 1.5×"): "Part D's goal, a target (the cell prints what was measured)",
    ("lab3", "at least 60% of the C-write floor"): "Part D's goal, a target (the cell prints what was measured)",
}

# The cells that show the course GPU's saved results without a GPU, and what they must print from the saved file.
SAVED_RESULT_CELLS = {
    "lab0": ["launch_overhead", "sweep", "counters_figure"],
    "lab1": ["conv_timing", "roofline", "depthwise_timing"],
    "lab2": ["context", "network_timing"],
    "lab3": ["sweep", "cublas", "speed_settings"],
}


def cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


text = ipynb.source
grade_id = ipynb.grade_id


def solution(lab):
    return ROOT / "solutions" / lab / f"{lab}.ipynb"


def release(lab):
    return ROOT / "labs" / lab / f"{lab}.ipynb"


def allowed_spans(lab, source):
    """Where ``source`` may state a literal number: an ALLOWED phrase, or a claim's words, which
    tests/test_notebook_claims.py checks against the saved measurements ("under 2 %")."""
    from .test_notebook_claims import CLAIMS
    phrases = [phrase for (where, phrase) in ALLOWED if where == lab] + [p for w, p, _ in CLAIMS if w == lab]
    spans = []
    for phrase in phrases:
        pattern = r"\s+".join(re.escape(word) for word in phrase.split())
        spans += [(m.start(), m.end()) for m in re.finditer(pattern, source)]
    return spans


def measured_literals(lab, source):
    spans = allowed_spans(lab, source)
    return [source[max(0, m.start() - 40):m.end() + 10].replace("\n", " ") for m in MEASURED.finditer(source)
            if not any(start <= m.start() and m.end() <= end for start, end in spans)]


def printed_string_literals(source):
    """The literal text of a code cell's strings, without f-strings' format specs (``{x:.1%}``)."""
    tree = ast.parse(source)
    specs = {id(node.format_spec) for node in ast.walk(tree) if isinstance(node, ast.FormattedValue) and node.format_spec}
    spec_parts = {id(part) for node in ast.walk(tree) if id(node) in specs for part in ast.walk(node)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in spec_parts]


def is_cuda_source(source):
    """A cell of CUDA strings (``X_SOURCE = r'''...'''``): its numbers are code, not claims."""
    tree = ast.parse(source)
    return all(isinstance(s, ast.Assign) and all(isinstance(t, ast.Name) and t.id.endswith("_SOURCE")
                                                 for t in s.targets) for s in tree.body)


@pytest.mark.parametrize("lab", LABS)
def test_markdown_states_no_measured_number(lab):
    found = [f"cell {i}: …{snippet}…" for i, cell in enumerate(cells(solution(lab))) if cell["cell_type"] == "markdown"
             for snippet in measured_literals(lab, text(cell))]
    assert not found, (f"{lab}'s markdown states measured quantities as literal numbers; print them from the data the "
                       "notebook shows (or, for a setting or a rule, add it to ALLOWED with why):\n" + "\n".join(found))


def test_allowlist_is_used():
    for (lab, phrase), why in ALLOWED.items():
        assert why and any(phrase in text(c) for c in cells(solution(lab)) if c["cell_type"] == "markdown"), \
            f"ALLOWED entry {phrase!r} for {lab} matches no markdown any more: remove it"


@pytest.mark.parametrize("lab", LABS)
def test_code_cells_print_no_literal_measurement(lab):
    found = []
    for i, cell in enumerate(cells(solution(lab))):
        if cell["cell_type"] != "code" or is_cuda_source(text(cell)):
            continue
        for literal in printed_string_literals(text(cell)):
            found += [f"cell {i} ({grade_id(cell)}): …{snippet}…" for snippet in measured_literals(lab, literal)]
    assert not found, f"{lab}'s code prints measured numbers from string literals; format them from the data:\n" + \
        "\n".join(found)


@pytest.mark.parametrize("lab", LABS)
@pytest.mark.parametrize("version", ["solutions", "labs"])
def test_graded_test_cells_end_in_a_number_or_nothing(lab, version):
    path = solution(lab) if version == "solutions" else release(lab)
    bad = []
    for cell in cells(path):
        if cell["cell_type"] != "code" or not ipynb.is_graded(cell) or ipynb.is_solution(cell):
            continue
        source = text(cell).rstrip()
        tree = ast.parse(source)
        last = tree.body[-1] if tree.body else None
        if not isinstance(last, ast.Expr):
            continue  # an assignment, an assert, a loop: no value displayed
        if isinstance(last.value, ast.Name) and last.value.id == "points":
            continue  # a speed test's points: a number (None, displayed as nothing, while validating)
        # ast's column offsets count UTF-8 bytes (a cell may say "A·B")
        after = source.splitlines()[last.end_lineno - 1].encode()[last.end_col_offset:].decode()
        if after.lstrip().startswith(";"):
            continue  # display suppressed
        bad.append(f"{grade_id(cell)}: ends in `{ast.unparse(last)[:70]}`")
    assert not bad, (f"{path.relative_to(ROOT)}: graded test cells must end in a number or nothing (end the last "
                     "call with `;`), or nbgrader scores what it displays:\n" + "\n".join(bad))


def saved_result_names(lab):
    module = __import__(f"fuselab.labs.{lab}", fromlist=["_"])
    used = set(re.findall(rf"saved_results\({lab}\.(\w+)\)", "".join(text(c) for c in cells(solution(lab)))))
    assert used, f"{lab} reads no saved results"
    return {name: getattr(module, name) for name in used}


@pytest.mark.parametrize("lab", LABS)
def test_saved_results_ship_with_the_package(lab):
    from fuselab.labs import lab0
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["fuselab"]
    assert "labs/results/*.json" in package_data, "fuselab/labs/results/*.json must be package data"
    for constant, filename in saved_result_names(lab).items():
        path = lab0.RESULTS_DIR / filename
        assert path.is_file() and path.parent == ROOT / "fuselab" / "labs" / "results", f"{lab}.{constant}: {path}"
        saved = json.loads(path.read_text())
        assert saved["gpu"] and saved["date"], f"{filename} must say which GPU measured it, and when"
    for cell in cells(solution(lab)) + cells(release(lab)):
        assert "docs/" not in text(cell) and "course notes" not in text(cell), \
            f"{lab} points at material a student without the repository does not have: {text(cell)[:80]!r}"


def run_saved_result_cells(lab):
    """Run the cells that show saved results, as on a machine without a GPU, and return what they print."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    import torch.nn.functional as F

    import fuselab
    from fuselab import plots
    from fuselab.labs import shortfall
    module = __import__(f"fuselab.labs.{lab}", fromlist=["_"])
    namespace = {"plt": plt, "torch": torch, "F": F, "fuselab": fuselab, "plots": plots, lab: module,
                 "shortfall": shortfall,
                 "ON_GPU": False, "GRADING": False, "DEVICE": "cpu"}
    by_id = {grade_id(c): text(c) for c in cells(solution(lab))}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for cell in SAVED_RESULT_CELLS[lab]:
            exec(compile(by_id[cell], f"{lab}:{cell}", "exec"), namespace)  # noqa: S102 - the course's notebook
    plt.close("all")
    return out.getvalue()


def expected_prints(lab):
    """Values of the saved files, formatted as the cells format them: each must appear in what the cells print."""
    from fuselab.labs import lab0, lab1, lab2
    if lab == "lab0":
        launch = lab0.saved_results(lab0.LAUNCH_RESULTS)["launch"]
        rows = lab0.saved_results(lab0.SWEEP_RESULTS)["rows"]
        return ([f"{launch['host_issue_us']:.1f} µs", f"{launch['queued_device_us']:.2f} µs",
                 f"{launch['one_from_idle_us']:.1f} µs", f"{launch['graph_per_kernel_us']:.2f} µs"]
                + [f"speedup {r['speedup']:.2f}x" for r in rows]
                + [f"ratio {r['dram_ratio']:.2f}x; L2 read hits unfused {r['unfused']['l2_read_hit_pct']:.1f}%, "
                   f"fused {r['fused']['l2_read_hit_pct']:.1f}%"
                   for r in lab0.saved_results(lab0.COUNTER_RESULTS)["rows"]]
                + ["per kernel, L2 read hits / L1 hits: " + ", ".join(
                    f"{k['kernel']} {k['l2_read_hit_pct']:.1f}% / {k['l1_hit_pct']:.1f}%"
                    for k in r["unfused"]["kernels"] + r["fused"]["kernels"])
                   for r in lab0.saved_results(lab0.COUNTER_RESULTS)["rows"]])
    if lab == "lab1":
        conv = lab1.saved_results(lab1.CONV_RESULTS)
        times = conv["times_us"]
        return [f"{conv['speedups']['fused']:.3f}x",
                f"{times['unfused pair'] / times['cuDNN conv + relu (eager)']:.1f}x faster",
                f"{times['activation alone'] / times['unfused pair']:.1%}"]
    if lab == "lab3":
        from fuselab.labs import lab3
        saved = lab3.saved_results(lab3.SWEEP_RESULTS)
        skinny = [r["speedup"] for r in saved["rows"] if r["M"] <= 64]
        in_mode = {mode: [r["speedup"] for r in saved["rows"] if r["mode"] == mode and r["M"] <= 64]
                   for mode in ("device", "graph", "latency")}
        def span(values):  # a range whose ends print the same is printed as one value
            low, high = f"{min(values):.2f}", f"{max(values):.2f}"
            return low if low == high else f"{low}–{high}"
        modes = [f"{mode:>7} time: S = {span(s)}x" for mode, s in in_mode.items()]
        return ([f"S = {span(skinny)}x"] + modes
                + [f"K={r['K']}: {r['speedup']:.2f}x" for r in saved["k_rows"]]
                + [f"{r['median_us']:10.1f} µs" for r in saved["cublas"]]
                + [f"{r['speedup_vs_reference']:5.2f}x the lab reference" for r in saved["small_k"]["rows"]
                   if not r["name"].startswith("sample ")])  # the grader's samples: not shown to students
    network = lab2.saved_results(lab2.NETWORK_RESULTS)
    rows = lab2.saved_results(lab2.CONTEXT_RESULTS)["rows"]
    # the times as well as the speedups: the text says the host takes longer to issue a pass than the GPU to run it
    ms = network["median_ms"]
    return ([f"{network['speedup']['device']:.2f}x", f"{network['speedup']['stream']:.2f}x",
             f"({ms['device']['unfolded']:.3f} ms unfolded, {ms['device']['folded']:.3f} ms folded)",
             f"({ms['stream']['unfolded']:.3f} ms unfolded, {ms['stream']['folded']:.3f} ms folded per pass)"]
            + [f"{r['median_us']['BN in registers'] / r['median_us']['plain fused (folded)'] - 1:+.1%}" for r in rows])


def expected_shortfalls(lab):
    """Beside each plain fused kernel's saved speedup, the fractions of the copy bandwidth (Lab 3: of the C-write
    floor's rate) that reconcile it with the byte ratio, from the saved files."""
    from fuselab.labs import lab0, lab1, lab2, lab3
    from fuselab.labs.shortfall import line
    if lab == "lab0":
        saved = lab0.saved_results(lab0.SWEEP_RESULTS)
        r, moved = saved["rows"][-1], lab0.bytes_moved(saved["rows"][-1]["n"])
        return [line(f"at n = {r['n']:,}, fused", r["unfused_s"], r["fused_s"], moved["unfused"], moved["fused"],
                     saved["copy_GBps"] * 1e9)]
    if lab == "lab1":
        saved = lab1.saved_results(lab1.DEPTHWISE_RESULTS)
        t, moved = saved["rows"][0]["times_us"], lab1.depthwise_bytes(*lab1.DEPTHWISE_TIMED)
        return [line("plain fused", t[saved["rows"][0]["baseline"]] * 1e-6, t["plain fused"] * 1e-6,
                     moved["unfused"], moved["fused"], saved["copy_GBps"] * 1e9)]
    if lab == "lab2":
        saved = lab2.saved_results(lab2.CONTEXT_RESULTS)
        row = next(r for r in saved["rows"] if tuple(r["shape"]) == tuple(lab2.TIMED_SHAPE))
        t, moved = row["median_us"], lab2.bytes_moved(lab2.TIMED_SHAPE)
        return [line(f"N=64 C=96 112x112, plain fused (folded) in the saved run ({saved['date']}, another run than "
                     "the calibration's)", t["lab reference (3 kernels)"] * 1e-6,
                     t["plain fused (folded)"] * 1e-6, moved["unfused"], moved["fused"], saved["copy_GBps"] * 1e9)]
    from fuselab import speed
    test, _, _ = speed.policy_entry(lab3.GRADED_TEST, "NVIDIA H200")
    rows = {r["name"]: r for r in lab3.saved_results(lab3.SWEEP_RESULTS)["small_k"]["rows"]
            if r["dtype"] == test["dtype"] and r["shape"] == test["shape"]}
    m, n, k = test["shape"]
    size = 2 if test["dtype"] == "float16" else 4
    moved = lab3.traffic(m, n, k, size)
    sweep = lab3.saved_results(lab3.SWEEP_RESULTS)["date"]
    return [line(f"the plain solution in the small-K sweep ({sweep}, another run than the calibration's)",
                 rows["lab reference"]["median_us"] * 1e-6, rows["plain fused"]["median_us"] * 1e-6,
                 moved["gemm"] + moved["epilogue"], moved["gemm"] + n * size,
                 m * n * size / (rows["C-write floor (fill_)"]["median_us"] * 1e-6), "the C-write floor's rate")]


@pytest.mark.parametrize("lab", LABS)
def test_cells_print_the_saved_measurements(lab):
    printed = run_saved_result_cells(lab)
    missing = [value for value in expected_prints(lab) + expected_shortfalls(lab) if value not in printed]
    assert not missing, f"{lab}'s cells do not print these saved values: {missing}\nthey printed:\n{printed}"


def test_lab3_states_one_number_for_the_plain_speedup_it_grades():
    """The plain solution's speedup at the graded shape shows in three places: where the speed settings are printed,
    in the speed test's own text (``would_grade``: the calibration that set the threshold) and in the small-K table
    (the saved sweep, another day). They printed 1.62x, 1.60x and 1.62x as if one measurement. Beside the threshold
    it is the calibration's number everywhere (the README's too); the table's is the sweep's, and the settings cell
    names both runs by their dates, so a reader sees why they differ."""
    import torch  # noqa: F401 - the cells' namespace

    from fuselab import speed
    from fuselab.labs import lab3
    printed = run_saved_result_cells("lab3")
    test, entry, _ = speed.policy_entry(lab3.GRADED_TEST, "NVIDIA H200")
    sweep = lab3.saved_results(lab3.SWEEP_RESULTS)
    table = re.findall(rf"{test['dtype']}\s+plain fused\s.*?(\d+\.\d+)x the lab reference", printed)
    stated = re.findall(r"measured the plain solution at (\d+\.\d+)x", printed)
    graded = re.findall(r"plain fused solution at (\d+\.\d+)x", speed.graded.would_grade(lab3.GRADED_TEST, 4))
    calibrated = f"{entry['plain_speedup']:.2f}"
    assert stated == graded == [calibrated], (stated, graded, printed)
    sweep_row = next(r for r in sweep["small_k"]["rows"] if r["name"] == "plain fused" and r["dtype"] == test["dtype"]
                     and r["shape"] == test["shape"])
    assert table == [f"{sweep_row['speedup_vs_reference']:.2f}"], (table, printed)
    if table != stated:  # two runs: each named where it is printed
        assert f"calibration ({entry['measured']})" in printed and f"small-K sweep ({sweep['date']}" in printed
    # and the README's Lab 3 row says the calibration's, as the other labs' rows do
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| 3 "))
    assert re.findall(r"plain: (\d+\.\d+)×", row) == stated, row


def test_lab0s_launch_cell_prints_the_costs_its_text_says_it_prints():
    """Lab 0 says where each cost of a launch is printed: on a GPU the many-launches cell prints the GPU time and
    part 1 the host time (the cell cannot read part 1's measurement: part 1 is a demo the grader leaves out, and a
    kept cell reading it would stop the lab from being graded); without a GPU the cell prints both, saved."""
    notebook = cells(solution("lab0"))
    words = ("because every launch costs GPU time even when queued back to back and host time to issue it (the cell "
             "prints the GPU time, part 1 the host time; without a GPU, the cell prints both")
    assert any(words in re.sub(r"\s+", " ", text(c)) for c in notebook if c["cell_type"] == "markdown")
    source = next(text(c) for c in notebook if grade_id(c) == "many_launches")
    part1 = next(text(c) for c in notebook if grade_id(c) == "launch_overhead")
    branch = next(node for node in ast.parse(source).body if isinstance(node, ast.If) and "ON_GPU" in ast.unparse(node.test))
    measured, saved = (" ".join(printed_string_literals(ast.unparse(ast.Module(body=b, type_ignores=[]))))
                       for b in (branch.body, branch.orelse))
    assert "GPU time" in measured and "GPU time" in saved and "host time" in saved
    assert "print(overhead)" in part1  # part 1's measured branch prints launch_overhead()'s host issue
