"""The nbgrader wiring: labs/ is generated from solutions/, and a blank lab fails clearly, never confusingly."""

import re

import pytest

from fuselab import course
from fuselab import notebook as ipynb

from .notebook_runner import errors, run_cells, streams


def test_labs_are_up_to_date_with_solutions():
    assert course.stale_labs() == [], "run `fuselab release` and commit labs/"


@pytest.mark.parametrize("lab", course.lab_names())
def test_release_hides_solutions_and_hidden_tests(lab):
    text = "\n".join(p.read_text() for p in (course.LABS / lab).glob("*.ipynb"))
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
    assert "raise NotImplementedError()" in text


def _code_cells(path):
    return ipynb.code_sources(path)


@pytest.mark.parametrize("lab", course.lab_names())
def test_blank_lab_builds_to_not_written_yet(lab, tmp_path):
    """Run the blank lab up to its first build: it must say the kernel is not written yet, on no stderr."""
    cells = _code_cells(next((course.LABS / lab).glob("*.ipynb")))
    first_build = next(i for i, src in enumerate(cells) if "fuselab.build(" in src and "_SOURCE" in src
                       and re.search(r"\b[A-Z_]+_SOURCE\b", src) and "lab0.TINY" not in src)
    nb = run_cells(cells[: first_build + 1], cwd=str(tmp_path))
    found = errors(nb)
    assert list(found.values())[-1].startswith("NotWrittenError: this kernel is not written yet"), found
    assert streams(nb, "stderr") == {}
