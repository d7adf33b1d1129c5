"""A sample submission, declared: what to change in which solution cell and what grade each graded cell should
then get. Each lab lists its samples in ``labN/samples.py``; ``fuselab/samples.py`` makes the notebooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

Change = Union[str, Callable[[str], str]]


@dataclass(frozen=True)
class Sample:
    """One sample submission of one lab.

    changes: grade_id → new cell source, or a function of the filled-in source.
    expect: grade_id → "full", "zero", "partial" or "any" (speed cells are "zero" without a GPU whatever this says
        about the GPU; see ``expect_gpu``). Graded cells not listed are expected "full".
    expect_gpu: overrides of ``expect`` on a GPU (for speed cells).
    why: one line a teaching assistant reads in the sample class's report.
    """

    changes: dict = field(default_factory=dict)
    expect: dict = field(default_factory=dict)
    expect_gpu: dict = field(default_factory=dict)
    why: str = ""
