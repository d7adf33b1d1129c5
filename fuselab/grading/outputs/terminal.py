"""Text from a submission, as the grader prints it on a terminal.

A student's folder or zip name, a lab folder's name, a problem's message: any of it may hold a newline (a fake
"ALL SUBMISSIONS PASSED" line in the summary), a carriage return or an escape sequence (a line rewritten, a
title changed), or a right-to-left override (a name shown backwards). ``shown`` makes such text one line that
shows as written; the command line's summary, its errors and the progress bar print only through it.
"""

from __future__ import annotations

import re

from ..records.intake import printable

# C0 and C1 controls (newlines, tabs, ESC), DEL, the line and paragraph separators, and the bidirectional marks,
# embeddings, overrides and isolates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def shown(text) -> str:
    """``text`` as one printable line: each unsafe character as its Python escape (``\\n``, ``\\x1b``,
    ``\\u202e``); bytes a file name held that are not UTF-8 as ``\\xNN`` (``intake.printable``)."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), printable(text))
