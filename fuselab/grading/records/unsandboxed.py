"""Which of a course folder's saved records a sandboxed run may believe after a ``--no-sandbox`` run.

Without the sandbox a submission runs with the grader's rights and can write anything in the course folder: a
saved result or a kept reference run that claims a sandboxed grading (``"sandbox": true``) included, and such a
forgery cannot be told from the real thing by its content. So every ``--no-sandbox`` run marks the folder
(``MARK``) when it starts and again when it ends, after its submissions' processes have ended, and a sandboxed
run believes a record's claim of a sandboxed grading only if the record was last changed after the mark.

The record's inode change time (``st_ctime``) is what is compared: a process can set a file's modification time
to anything, but not its change time (only by setting the system clock, which needs root; graded as root,
``--no-sandbox`` promises nothing, as ``docs/design.md`` says).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MARK = ".unsandboxed-run"


def mark(out: Path) -> None:
    """Record that a ``--no-sandbox`` run wrote into ``out`` (now): replaced, never followed or appended to."""
    out = Path(out)
    temporary = out / f"{MARK}.{os.getpid()}.tmp"
    temporary.unlink(missing_ok=True)
    temporary.write_text("a --no-sandbox run graded into this folder; see fuselab/grading/records/unsandboxed.py\n")
    os.replace(temporary, out / MARK)


def believed(record: Path, out: Path) -> bool:
    """Whether ``record``'s claim of a sandboxed grading may be believed: no ``--no-sandbox`` run ever marked
    ``out``, or the record changed after the last mark. A mark that is not a regular file (something put in its
    place) believes nothing."""
    try:
        marked = os.lstat(Path(out) / MARK)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISREG(marked.st_mode):
        return False
    try:
        return os.lstat(record).st_ctime_ns > marked.st_ctime_ns  # whole nanoseconds: no float rounding
    except OSError:
        return False
