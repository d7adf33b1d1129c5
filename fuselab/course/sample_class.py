"""The grader's sample class: its submissions written from the labs' sample declarations, and what each deserves.

Each lab declares its samples in ``fuselab/labs/labN/samples.py`` as ``SAMPLES = {name: Sample(...)}`` (``Sample``
in ``fuselab/labs/registry.py``): what to change in which solution cell (by nbgrader ``grade_id``) and what grade
each graded cell should then get. A submission starts from the *release* notebook (what a student downloads) with
every solution cell filled in with the instructor's code (its BEGIN/END SOLUTION marker lines dropped, as a
student would write it), then the sample's changes applied. ``fuselab samples`` writes them under
``grader/examples/<sample>/<lab>/``; ``fuselab/grading/run/samplecheck.py`` grades that class and compares each
verdict with ``expected``.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from ..labs.registry import Sample
from ..notebook import grade_id, is_graded, is_solution, source
from . import LABS, REPO, SOLUTIONS

EXAMPLES = REPO / "grader" / "examples"
_MARKER = re.compile(r"^.*(BEGIN|END) SOLUTION.*\n?", re.M)


def filled_release(lab: str) -> dict:
    """The release notebook of ``lab`` with every solution cell filled in from the instructor's notebook."""
    release = json.loads(next((LABS / lab).glob("*.ipynb")).read_text())
    solution = json.loads(next((SOLUTIONS / lab).glob("*.ipynb")).read_text())
    answers = {grade_id(c): _MARKER.sub("", source(c)) for c in solution["cells"] if is_solution(c)}
    filled = copy.deepcopy(release)
    for cell in filled["cells"]:
        if is_solution(cell) and grade_id(cell) in answers:
            cell["source"] = answers[grade_id(cell)]
    return filled


def make_submission(lab: str, sample: Sample) -> dict:
    nb = filled_release(lab)
    cells = {grade_id(c): c for c in nb["cells"] if grade_id(c)}
    for cell_id, change in sample.changes.items():
        if cell_id not in cells:
            raise KeyError(f"{lab} has no cell {cell_id!r} to change")
        old = source(cells[cell_id])
        new = change(old) if callable(change) else change
        if new == old:
            raise ValueError(f"sample change to {lab}/{cell_id} changed nothing: its pattern no longer matches")
        cells[cell_id]["source"] = new
    return nb


def graded_cells(lab: str) -> list:
    nb = json.loads(next((SOLUTIONS / lab).glob("*.ipynb")).read_text())
    # written answers (markdown) are graded by hand: samples make no claim about them
    return [grade_id(c) for c in nb["cells"] if c["cell_type"] == "code" and is_graded(c)]


def expected(lab: str, sample: Sample, on_gpu: bool) -> dict:
    """grade_id → "full" | "zero" | "partial" | "any" for every graded code cell of ``lab``."""
    from ..labs.registry import speed_grade_ids
    speed_cells = speed_grade_ids(lab)
    result = {}
    for cell_id in graded_cells(lab):
        verdict = sample.expect.get(cell_id, "full")
        if on_gpu:
            verdict = sample.expect_gpu.get(cell_id, verdict)
        elif cell_id in speed_cells:
            verdict = "zero"  # no GPU, no speed points
        result[cell_id] = verdict
    return result


def all_samples() -> dict:
    """``{(sample, lab): Sample}`` over every registered lab's samples module."""
    from ..labs.registry import all_labs
    return {(name, lab): sample for lab, declared in all_labs().items()
            for name, sample in declared.samples_module().SAMPLES.items()}


def write_examples(root: Path = EXAMPLES) -> list:
    """Write every sample submission as ``root/<sample>/<lab>/<notebook>``; return the paths."""
    written = []
    for (name, lab), sample in sorted(all_samples().items()):
        target = root / name / lab / next((LABS / lab).glob("*.ipynb")).name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(make_submission(lab, sample), indent=1, ensure_ascii=False) + "\n")
        written.append(target)
    return written
