"""Every lab is registered and declared, and its declaration is true (CPU, a few seconds).

- Every ``solutions/labN`` is in the registry (``fuselab/labs/registry.py``), and every registered lab has its
  package, its notebook in ``solutions/`` and ``labs/``, its self-check stage and its samples.
- A lab's ``LAB`` agrees with its notebook: the graded cells and their points, the written answers, the CUDA
  source variables and their launchers, and each graded speedup test's cell, which calls ``speedup_test`` with
  the test's id.
- ``fuselab/speed/policy.json`` holds exactly the declared speedup tests, with the declared settings.
- docs/LAB_AUTHORING.md's checklist names every file a lab has, and those files exist for every lab.
"""

import json
import re
from pathlib import Path

import pytest

from fuselab import course, speed
from fuselab.labs import lab_modules, registry
from fuselab.tools.gpu_selfcheck.stages import lab_check
from fuselab.notebook_sources import string_assignments
from fuselab.course.sample_class import EXAMPLES, all_samples

ROOT = Path(__file__).resolve().parents[1]
AUTHORING = ROOT / "docs" / "LAB_AUTHORING.md"
LABS = registry.lab_names()


def notebook_cells(lab):
    return json.loads((course.SOLUTIONS / registry.lab(lab).notebook).read_text(encoding="utf-8"))["cells"]


def nbgrader(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_every_lab_of_solutions_is_registered_and_every_registered_lab_exists():
    in_solutions = sorted(p.name for p in course.SOLUTIONS.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))
    assert in_solutions == LABS, ("solutions/ and fuselab/labs/registry.py's LAB_NAMES disagree: a new lab is "
                                  "registered there (docs/LAB_AUTHORING.md)")
    packages = sorted(p.name for p in (ROOT / "fuselab" / "labs").iterdir() if (p / "__init__.py").is_file())
    assert packages == LABS, "every package under fuselab/labs/ is a registered lab"
    assert course.lab_names() == LABS and list(lab_modules()) == LABS
    assert sorted({lab for _, lab in all_samples()}) == LABS, "every lab has sample submissions"


@pytest.mark.parametrize("lab", LABS)
def test_the_declaration_names_its_files(lab):
    declared = registry.lab(lab)
    module = declared.module()
    assert module.LAB is declared and declared.package == f"fuselab.labs.{lab}" and declared.title
    assert declared.notebook == module.NOTEBOOK == f"{lab}/{lab}.ipynb"
    assert (course.SOLUTIONS / declared.notebook).is_file() and (course.LABS / declared.notebook).is_file()
    assert [p.name for p in (course.SOLUTIONS / lab).glob("*.ipynb")] == [f"{lab}.ipynb"], "one notebook per lab"
    assert declared.launchers is module.SOLUTION_SOURCES and declared.reference_sources is module.REFERENCE_SOURCES
    assert callable(lab_check(declared.name).run)
    assert declared.samples_module().SAMPLES, f"{lab} has no sample submissions"


@pytest.mark.parametrize("lab", LABS)
def test_the_graded_cells_are_the_notebooks(lab):
    declared = registry.lab(lab)
    cells = [c for c in notebook_cells(lab) if nbgrader(c).get("grade")]
    code = {nbgrader(c)["grade_id"]: nbgrader(c)["points"] for c in cells if c["cell_type"] == "code"}
    written = {nbgrader(c)["grade_id"]: nbgrader(c)["points"] for c in cells if c["cell_type"] == "markdown"}
    assert declared.graded_cells == code, f"{lab}: LAB.graded_cells (grade_id: points) must match the notebook"
    assert declared.written_answers == written, f"{lab}: LAB.written_answers must match the notebook"
    for name, sample in declared.samples_module().SAMPLES.items():
        claimed = set(sample.changes) - {nbgrader(c).get("grade_id") for c in notebook_cells(lab)}
        assert not claimed, f"{lab} sample {name} changes cells the notebook lacks: {claimed}"
        assert set(sample.expect) | set(sample.expect_gpu) <= set(code), f"{lab} sample {name}: unknown cells"


@pytest.mark.parametrize("lab", LABS)
def test_the_launchers_are_the_notebooks_sources(lab):
    declared = registry.lab(lab)
    sources = string_assignments(course.SOLUTIONS / declared.notebook)
    assert set(declared.launchers) <= set(sources), f"{lab}: declared CUDA sources the notebook lacks"
    for name, launchers in declared.launchers.items():
        for launcher in launchers:
            function = launcher.split("(")[0].split()[-1]
            assert re.search(rf"\b{function}\s*\(", sources[name]), f"{lab}.{name} defines no {function}"
    for name, (reference, launchers) in declared.reference_sources.items():
        assert name.startswith(f"{lab}_") and isinstance(reference, str) and launchers


@pytest.mark.parametrize("lab", LABS)
def test_each_graded_speedup_test_is_its_cell(lab):
    declared = registry.lab(lab)
    module = declared.module()
    assert declared.graded_tests, f"{lab} grades no speedup"
    cells = {nbgrader(c).get("grade_id"): source(c) for c in notebook_cells(lab)}
    speed_cells = {grade_id for grade_id, text in cells.items() if "speedup_test(" in text and grade_id}
    assert speed_cells == declared.speed_grade_ids(), f"{lab}: the cells calling speedup_test are its GradedTests"
    for test in declared.graded_tests:
        assert test.id.startswith(f"{lab}.") and test.grade_id in declared.graded_cells
        called = re.search(r"speedup_test\(\s*([^,]+),", cells[test.grade_id]).group(1).strip()
        named = module.GRADED_TEST if called == f"{lab}.GRADED_TEST" else json.loads(called.replace("'", '"'))
        assert named == test.id, f"{lab}/{test.grade_id} times {called}, the declaration says {test.id}"
        assert set(test.speed_requires) <= set(declared.graded_cells) - declared.speed_grade_ids()
        assert test.mode in ("device", "latency") and test.dtype in ("float32", "float16") and test.shape


def test_the_policy_holds_exactly_the_declared_speedup_tests():
    policy = speed.load_policy(speed.policy.POLICY_PATH)["tests"]
    declared = registry.graded_tests()
    assert sorted(policy) == sorted(declared), "fuselab/speed/policy.json's tests are the labs' GradedTests"
    for test_id, test in declared.items():
        settings = {key: policy[test_id].get(key) for key in test.settings()}
        assert settings == test.settings(), f"policy.json's {test_id} disagrees with its GradedTest"
        assert policy[test_id]["gpus"].get(speed.REFERENCE_GPU, {}).get("threshold"), \
            f"{test_id}: run `fuselab calibrate` on the {speed.REFERENCE_GPU}"


def test_every_sample_submission_is_written():
    for name, lab in all_samples():
        notebook = EXAMPLES / name / registry.lab(lab).notebook
        assert notebook.is_file(), f"{notebook.relative_to(ROOT)} is missing: run `fuselab samples`"


def checklist():
    """The paths of docs/LAB_AUTHORING.md's checklist table, in the file's own spelling (``labN``)."""
    text = AUTHORING.read_text(encoding="utf-8")
    table = text[text.index("## Checklist"):]
    table = table[: table.index("\n## ", 3)]
    return re.findall(r"^\| `([^`]+)` \|", table, re.MULTILINE)


def test_the_authoring_checklist_names_every_file_of_a_lab():
    listed = checklist()
    assert {"fuselab/labs/registry.py", "fuselab/speed/policy.json"} <= set(listed)
    # what every lab's package holds, in the checklist's spelling: a module only some labs have is their own affair
    common = set.intersection(*({str(p.relative_to(ROOT)).replace(lab, "labN")
                                 for p in (ROOT / "fuselab" / "labs" / lab).glob("*.py")} for lab in LABS))
    unlisted = common - set(listed)
    assert common and not unlisted, f"docs/LAB_AUTHORING.md's checklist does not name {sorted(unlisted)}"
    for path in listed:
        for lab in LABS:
            where = ROOT / path.replace("labN", lab).replace("<sample>", "correct")
            assert where.exists(), f"docs/LAB_AUTHORING.md's checklist names {path}: {where.relative_to(ROOT)}"
    text = AUTHORING.read_text(encoding="utf-8")
    for step in ("LAB = Lab(", "GradedTest(", "LAB_NAMES", "fuselab release", "fuselab samples", "fuselab calibrate",
                 "tests/test_registry.py"):
        assert step in text, f"docs/LAB_AUTHORING.md does not say {step!r}"


@pytest.mark.parametrize("lab", LABS)
def test_the_tuned_solution_each_speed_test_declares_is_the_notebooks(lab):
    """A graded test's ``tuned_op`` (what the reference run times for the feedback pages' picture) is a function of
    its lab's package, and the instructor's notebook holds the ``TUNED_SOURCE`` it builds, with the launchers the
    speed test's op calls."""
    declared = registry.lab(lab)
    assert declared.solution_notebook() == course.SOLUTIONS / declared.notebook
    sources = string_assignments(declared.solution_notebook())
    for test in declared.graded_tests:
        assert test.tuned_op, f"{lab}: {test.id} declares no tuned solution (every lab has one)"
        assert callable(getattr(declared.module(), test.tuned_op))
        assert "TUNED_SOURCE" in sources and "TUNED_SOURCE" in declared.launchers
