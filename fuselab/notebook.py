"""One model of a lab notebook's cells: their source, their nbgrader metadata, the hidden tests.

A notebook here is nbformat's JSON as a dict (``json.loads`` of the ``.ipynb``); a cell is one of its
``cells``. This module imports nothing from the course or the grader, so anything may use it.

nbgrader's own preprocessors do the notebook mechanics where a whole notebook is processed (``ClearSolutions``
and ``ClearHiddenTests`` through ``nbgrader generate_assignment``, ``fuselab release``). What is here reads
single cells: the feedback page and the message scrub need the *lines* of the hidden tests, which
``ClearHiddenTests`` only removes, and read notebooks of any shape without raising.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HIDDEN_MARK = "BEGIN HIDDEN TESTS"
HIDDEN_TESTS = re.compile(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", re.S)


def load(notebook) -> dict:
    """A notebook dict, from itself or from the path of its ``.ipynb``."""
    return notebook if isinstance(notebook, dict) else json.loads(Path(notebook).read_text())


def source(cell) -> str:
    """A cell's source as one string (nbformat stores it as a string or a list of lines)."""
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def text(value) -> str:
    """A notebook field as text, from a notebook of any shape: a string, or a list of strings joined (whatever
    is not a string left out); anything else is empty."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str))
    return ""


def code_sources(notebook) -> list:
    """The source of every code cell, in order."""
    return [source(c) for c in load(notebook)["cells"] if c["cell_type"] == "code"]


def nbgrader(cell) -> dict:
    """A cell's nbgrader metadata; ``{}`` where it has none (or it, or the cell, is not an object)."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    found = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return found if isinstance(found, dict) else {}


def grade_id(cell):
    """The cell's nbgrader ``grade_id``, or None."""
    return nbgrader(cell).get("grade_id")


def is_solution(cell) -> bool:
    return bool(nbgrader(cell).get("solution"))


def is_graded(cell) -> bool:
    return bool(nbgrader(cell).get("grade"))


def is_hand_graded(cell) -> bool:
    """Whether a person scores the cell in formgrader, by nbgrader's own rule: a task, or a graded cell that is not
    an autograder test (a graded solution cell, or graded markdown)."""
    test = is_graded(cell) and not is_solution(cell) and cell.get("cell_type") == "code"
    return bool(nbgrader(cell).get("task")) or (is_graded(cell) and not test)


DEMO_TAG = "demo"  # a cell that only shows something (a figure, a table, a timing): the clean recheck leaves it out


def is_demo(cell) -> bool:
    """Whether the cell carries the ``demo`` tag (JupyterLab's cell tags, ``metadata.tags``)."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    tags = metadata.get("tags") if isinstance(metadata, dict) else None
    return isinstance(tags, list) and DEMO_TAG in tags


def points(cell):
    """The points a graded cell is worth (None where it has none)."""
    return nbgrader(cell).get("points")


def has_hidden_tests(text_: str) -> bool:
    return HIDDEN_MARK in text_


def hidden_test_blocks(text_: str) -> list:
    """What each ``### BEGIN HIDDEN TESTS`` … ``### END HIDDEN TESTS`` block of a source holds."""
    return HIDDEN_TESTS.findall(text_)


def without_hidden_tests(text_: str) -> str:
    """The source with its hidden test blocks (their markers too) removed."""
    return HIDDEN_TESTS.sub("", text_)
