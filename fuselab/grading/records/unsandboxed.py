"""Which of a course folder's saved records a sandboxed run may believe after a ``--no-sandbox`` run.

Without the sandbox a submission runs with the grader's rights and can write anything in the course folder: a
saved result or a kept reference run that claims a sandboxed grading (``"sandbox": true``) included, and such a
forgery cannot be told from the real thing by its content. So every ``--no-sandbox`` run marks the folder
(``MARK``) when it starts and again when it ends, after its submissions' processes have ended, and a sandboxed
run believes a record's claim of a sandboxed grading only if the record was last changed after the mark.

The instructor's shared builds are such a record too, read by the reference run with the grader's rights: a
``--no-sandbox`` submission could plant a library in ``<out>/shared-builds`` with a matching entry in its manifest,
and the next reference run would load it (a finished build is reused by name, its first digest kept). So a
sandboxed run keeps the shared builds only where it can believe them (``fresh_builds``): no mark, or a stamp
(``STAMP``) that a sandboxed run wrote after the last mark; else it removes them, manifest included, and the
reference runs build them again (their kept runs then name builds the new manifest does not hold: run again).

The record's inode change time (``st_ctime``) is what is compared: a process can set a file's modification time
to anything, but not its change time (only by setting the system clock, which needs root; graded as root,
``--no-sandbox`` promises nothing, as ``docs/design.md`` says).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..sandbox import untrusted
from .whole import write_whole

MARK = ".unsandboxed-run"
REBUILT = ("the instructor's shared builds were removed and built again: a --no-sandbox run had graded into this "
           "folder since a sandboxed run last checked them")
STAMP = ".sandboxed-builds"  # in the shared-builds folder: a sandboxed run found it (or made it) believable


def mark(out: Path) -> None:
    """Record that a ``--no-sandbox`` run wrote into ``out`` (now): replaced, never followed or appended to."""
    write_whole(Path(out) / MARK, "a --no-sandbox run graded into this folder; see "
                "fuselab/grading/records/unsandboxed.py\n")


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


def marked(folder: Path) -> bool:
    return os.path.lexists(Path(folder) / MARK)


def fresh_builds(shared_root: Path, out: Path) -> bool:
    """Before a sandboxed run's reference runs: keep the shared builds ``shared_root`` only if no ``--no-sandbox``
    run could have written them since a sandboxed run last found them clean, else remove them (a link in their
    place is removed, never followed) and start a fresh folder. A ``--no-sandbox`` run marks ``out`` and the
    shared-builds folder (one outside ``out`` too); the stamp must be a regular file changed after both marks.
    Nothing is removed in a folder no ``--no-sandbox`` run marked. Returns whether the builds were removed."""
    shared_root, out = Path(os.path.abspath(shared_root)), Path(out)
    stamp = shared_root / STAMP
    discard = False
    if marked(out) or marked(shared_root):
        try:
            regular = stat.S_ISREG(os.lstat(stamp).st_mode) and not os.path.islink(shared_root)
        except OSError:
            regular = False
        discard = not (regular and believed(stamp, out) and believed(stamp, shared_root))
    if discard:
        untrusted.remove_tree(shared_root)
    shared_root.mkdir(parents=True, exist_ok=True)
    if discard or not os.path.lexists(stamp):
        write_whole(stamp, "a sandboxed run found these builds believable; see "
                    "fuselab/grading/records/unsandboxed.py\n")
    return discard
