"""A graded submission, typed: what ``pipeline.combine`` builds and ``<out>/work/<student>/<lab>/result.json`` holds.

``SubmissionResult.to_json()`` is the dict written to result.json (the same keys, in the same order, as the
untyped dicts of earlier runs); ``SubmissionResult.from_json()`` reads any saved result back, older ones
included (a key an older grader did not write takes its default; a key this one does not know is kept, and
written back after the known ones). Every reader (the report, the sample check, the CLI's table, the
self-checks) reads attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class CellResult:
    """One graded test cell: the clean recheck's verdict."""
    points: float = 0.0
    max_points: float = 0.0
    status: str = ""
    message: str = ""
    speed: list = field(default_factory=list)   # records of fuselab.speed.speedup_test
    seconds: float = 0.0
    output: str = ""
    requires_failed: list = field(default_factory=list)
    retry: dict = field(default_factory=dict)   # a wall-clock limit stopped it: its first try and the retry alone
    by_hand: dict = field(default_factory=dict)  # a TA re-scored it (``handgrading.apply``): theirs and the grader's
    extra: dict = field(default_factory=dict)   # keys of a result.json this grader does not know

    @classmethod
    def from_verdict(cls, verdict) -> "CellResult":
        """From the clean recheck's ``recheck.CellVerdict``."""
        return cls(points=verdict.points, max_points=verdict.max_points, status=verdict.status,
                   message=verdict.message, speed=verdict.speed, seconds=verdict.seconds, output=verdict.output,
                   requires_failed=verdict.requires_failed)

    def measured_speedup(self):
        """The first speed record with a measured speedup, or None."""
        return next((r for r in self.speed or [] if r.get("speedup") is not None), None)

    def to_json(self) -> dict:
        return {"points": self.points, "max_points": self.max_points, "status": self.status,
                "message": self.message, "speed": self.speed, "seconds": self.seconds, "output": self.output,
                "requires_failed": self.requires_failed, **({"retry": self.retry} if self.retry else {}),
                **({"by_hand": self.by_hand} if self.by_hand else {}), **self.extra}

    @classmethod
    def from_json(cls, data: dict) -> "CellResult":
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in data.items() if k in known},
                   extra={k: v for k, v in data.items() if k not in known})


@dataclass
class SubmissionResult:
    """One student's graded lab. The field names are result.json's keys, in its order."""
    student: str
    lab: str
    cells: dict = field(default_factory=dict)            # grade_id → CellResult
    total: float = 0.0
    max_total: float = 0.0
    manual_cells: list = field(default_factory=list)     # graded by hand in nbgrader (written answers)
    flags: list = field(default_factory=list)            # the clean recheck's: what looks like tampering
    notes: list = field(default_factory=list)
    restarts: int = 0
    clean_seconds: float | None = None
    gpu_wait_seconds: float | None = None
    gpu_held_seconds: float | None = None
    gpu_holds: list = field(default_factory=list)        # [start, end] each time a timing had the GPU alone
    clean_timeline: dict = field(default_factory=dict)
    clean_cpu: dict = field(default_factory=dict)         # the same steps → {process: CPU seconds}, sampled
    # set by pipeline.grade_submission once the runs are combined
    device: object = None
    seconds: float | None = None
    notebook_sha: str | None = None
    notebook: str | None = None
    origin: str | None = None
    sandbox: bool | None = None
    hand_graded: dict = field(default_factory=dict)      # set by ``handgrading.apply``: the written answers' grades
    late_penalty: float = 0.0                            # set by ``handgrading.apply``: nbgrader's, for late work
    lms_late: bool = False                               # set by ``pipeline.write_outputs``: the LMS marked it late
    extra: dict = field(default_factory=dict)            # keys of a result.json this grader does not know

    @property
    def points(self) -> dict:
        """grade_id → the points that count."""
        return {k: c.points for k, c in self.cells.items()}

    @property
    def attention(self) -> int:
        """How many things a teaching assistant should look at: the flags."""
        return len(self.flags)

    @property
    def full_marks(self) -> bool:
        return self.total == self.max_total

    def to_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        # written only when there is something to say, so a result.json of a run without them reads back the same
        # a TA's grades and nbgrader's late penalty applied; the CPU sampler's steps
        for optional in ("hand_graded", "late_penalty", "lms_late", "clean_cpu"):
            if not data[optional]:
                del data[optional]
        data["cells"] = {k: c.to_json() if isinstance(c, CellResult) else c for k, c in self.cells.items()}
        return {**data, **self.extra}

    @classmethod
    def from_json(cls, data: dict) -> "SubmissionResult":
        """A saved result.json (or the dict of an older grader's run): missing keys take their defaults."""
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {k: v for k, v in data.items() if k in known}
        values["cells"] = {k: c if isinstance(c, CellResult) else CellResult.from_json(c)
                           for k, c in (data.get("cells") or {}).items()}
        values.setdefault("total", sum(c.points for c in values["cells"].values()))
        values.setdefault("max_total", sum(c.max_points for c in values["cells"].values()))
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})

    @classmethod
    def of(cls, result) -> "SubmissionResult":
        """``result`` itself, or the SubmissionResult a result dict holds."""
        return result if isinstance(result, cls) else cls.from_json(result)
