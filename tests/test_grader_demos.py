"""Demo cells: the clean recheck leaves the instructor's ``demo``-tagged cells out, and refuses a notebook where a
cell it keeps depends on one."""

import json

import pytest

from fuselab import course
from fuselab import notebook as ipynb
from fuselab.grading.recheck import clean as recheck
from fuselab.grading.recheck.demos import demo_problems


def _cell(source, grade_id=None, *, demo=False, graded=False, solution=False, points=0):
    metadata = {"nbgrader": {"grade_id": grade_id, "grade": graded, "solution": solution, "points": points}}
    if demo:
        metadata["tags"] = ["demo"]
    return {"cell_type": "code", "metadata": metadata, "source": source, "outputs": [], "execution_count": None}


def _notebook(*cells):
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


SETUP = _cell("import torch\nx0 = 1", "setup")


@pytest.mark.parametrize("lab", course.lab_names())
def test_each_labs_demos_are_left_out_of_the_recheck_and_nothing_kept_needs_them(lab):
    path = next((course.SOLUTIONS / lab).glob("*.ipynb"))
    nb = json.loads(path.read_text())
    demos = {ipynb.grade_id(c) for c in nb["cells"] if c["cell_type"] == "code" and ipynb.is_demo(c)}
    assert demos, f"{lab} tags no demo cell"
    kept, _ = recheck.clean_plan(nb, nb)
    everything, _ = recheck.clean_plan(nb, nb, skip_demos=False)
    assert not demos & {c["grade_id"] for c in kept}
    ran = {c["grade_id"] for c in everything}
    assert demos & ran  # the reference run keeps them (those before the last test)
    assert [c["grade_id"] for c in kept if c["graded"]] == [c["grade_id"] for c in everything if c["graded"]]


def test_a_kept_cell_that_reads_a_demos_name_refuses_the_notebook():
    nb = _notebook(SETUP, _cell("big = torch.ones(3)\nprint(big)", "figure", demo=True),
                   _cell("assert big.sum() == 3", "test_big", graded=True, points=1))
    with pytest.raises(ValueError, match=r"cell test_big reads big, bound by demo cell\(s\) figure"):
        recheck.clean_plan(nb, nb)


def test_a_name_bound_again_by_a_kept_cell_is_that_cells():
    nb = _notebook(SETUP, _cell("big = torch.ones(3)", "figure", demo=True), _cell("big = torch.zeros(2)", "data"),
                   _cell("assert big.sum() == 0", "test_big", graded=True, points=1))
    cells, _ = recheck.clean_plan(nb, nb)
    assert [c["grade_id"] for c in cells] == ["setup", "data", "test_big"]


def test_a_demo_may_not_change_what_it_did_not_create_nor_be_a_test_solution_or_setup():
    problems = demo_problems([
        _cell("import torch", "setup", demo=True),
        _cell("torch.backends.cuda.matmul.allow_tf32 = True", "sneaky", demo=True),
        _cell("global x0\nx0 = 2", "global_demo", demo=True),
        _cell("fig = object()\nfig.title = 'mine'", "own_object", demo=True),   # its own object: fine
        _cell("assert True", "test_x", demo=True, graded=True, points=1),
        _cell("def f(): pass", "solution_x", demo=True, solution=True),
    ])
    text = " | ".join(problems)
    assert "demo cell setup is the setup cell" in text
    assert "demo cell sneaky changes torch.backends.cuda.matmul.allow_tf32, which it did not create" in text
    assert "demo cell global_demo declares x0 global" in text
    assert "own_object" not in text
    assert "demo cell test_x is the setup cell, a graded cell or a solution cell" in text
    assert "demo cell solution_x is the setup cell, a graded cell or a solution cell" in text


def test_a_demo_after_the_last_test_is_never_checked_nor_run():
    nb = _notebook(SETUP, _cell("assert x0 == 1", "test_x", graded=True, points=1),
                   _cell("late = 1", "late_demo", demo=True), _cell("print(late)", "after"))
    cells, _ = recheck.clean_plan(nb, nb)
    assert [c["grade_id"] for c in cells] == ["setup", "test_x"]


@pytest.mark.parametrize("kept, why", [
    ("x = x + 1\nassert x == 3", "reads x"),                  # read before it is bound again
    ("x += 1", "reads x"),
    ("del x", "reads x"),
    ("def f():\n    return x\nassert f() == 2", "reads x"),  # read inside a function of the kept cell
    ("assert [v + x for v in (1, 2)] == [3, 4]", "reads x"),  # ... or a comprehension
    ("if True:\n    y = 1\nprint(x)", "reads x"),
    ("for i in range(1):\n    x = 5\nprint(x)", "reads x"),   # a loop may not run: not surely bound again
])
def test_the_check_sees_reads_in_order_and_in_every_scope(kept, why):
    problems = demo_problems([SETUP, _cell("x = 2", "figure", demo=True), _cell(kept, "test_x", graded=True)])
    assert any(why in p for p in problems), problems


@pytest.mark.parametrize("kept", [
    "x = 7\nassert x == 7",
    "def f(x):\n    return x\nassert f(1) == 1",        # the function's own x
    "assert [x for x in (1, 2)] == [1, 2]",            # the comprehension's own x
    "if True:\n    x = 1\nelse:\n    x = 2\nprint(x)",  # bound again on every branch
    "with open(__file__) as x:\n    pass\nprint(x)",
])
def test_a_kept_cell_that_binds_the_name_itself_first_is_fine(kept):
    assert demo_problems([SETUP, _cell("x = 2", "figure", demo=True), _cell(kept, "test_x", graded=True)]) == []


@pytest.mark.parametrize("demo, why", [
    ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True", "changes torch.backends.cuda.matmul.allow_tf32"),
    ("setattr(lab, 'N', 3)", "calls setattr on lab"),
    ("del lab.N", "changes lab.N"),
    ("import torch.utils.benchmark", "imports a submodule"),
    ("%time y = 1", "magics"),
])
def test_a_demo_that_reaches_shared_state_is_refused(demo, why):
    problems = demo_problems([SETUP, _cell(demo, "figure", demo=True), _cell("assert True", "test_x", graded=True)])
    assert any(why in p for p in problems), problems
