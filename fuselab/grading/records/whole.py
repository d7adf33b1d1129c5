"""A record file written whole or not at all, replacing (never following) whatever stood at its path.

The course folder's records (results, the roster, the term's entries, markers) are each one JSON or text file that
a later run reads whole: one left half-written by a stopped run would be misread, so each is written beside its
path and renamed over it (``os.replace``, atomic on one file system). The temporary name carries the writer's pid
(two runs into one folder never share one) and is opened ``O_EXCL | O_NOFOLLOW`` after any leftover is removed:
a link planted at it is removed, never written through.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """``text`` (UTF-8) at ``path``, written whole or not at all."""
    path = Path(path)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
