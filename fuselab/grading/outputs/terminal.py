"""Text from a submission, as the grader prints it on a terminal.

A student's folder or zip name, a lab folder's name, a problem's message: any of it may hold a newline (a fake
"ALL SUBMISSIONS PASSED" line in the summary), a carriage return or an escape sequence (a line rewritten, a
title changed), or a right-to-left override (a name shown backwards). ``shown`` makes such text one line that
shows as written; the command line's summary, its errors and the progress bar print only through it.
A spreadsheet reads a cell that starts with ``=``, ``+``, ``-`` or ``@`` as a formula (a link out, a command):
``spreadsheet_cell`` makes such text a cell of text, as every CSV the grader writes takes it.
"""

from __future__ import annotations

import csv
import os
import re

from ..records.intake import printable

# C0 and C1 controls (newlines, tabs, ESC), DEL, the line and paragraph separators, and the bidirectional marks,
# embeddings, overrides and isolates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def shown(text) -> str:
    """``text`` as one printable line: each unsafe character as its Python escape (``\\n``, ``\\x1b``,
    ``\\u202e``); bytes a file name held that are not UTF-8 as ``\\xNN`` (``intake.printable``)."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), printable(text))


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")  # and full-width


def spreadsheet_cell(value):
    """``value`` as a CSV cell a spreadsheet shows as written: text that a spreadsheet would read as a formula (a
    student's name from the LMS, ``=HYPERLINK(...)``, after spaces too) gets a leading ``'``; numbers, and text
    that is a number (``-1.5``), stay as they are."""
    if not isinstance(value, str) or not value.lstrip(" \u00a0\u3000").startswith(_FORMULA_START):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def defuse_csv_file(path) -> None:
    """Rewrite the CSV at ``path`` (one the grader wrote, nbgrader's export) with every cell ``spreadsheet_cell``
    makes safe; untouched where none needs it."""
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as handle:
        rows = list(csv.reader(handle))
    safe = [[spreadsheet_cell(cell) for cell in row] for row in rows]
    if safe == rows:
        return
    temporary = f"{path}.tmp"
    with open(temporary, "w", newline="", encoding="utf-8", errors="surrogateescape") as handle:
        csv.writer(handle).writerows(safe)
    os.replace(temporary, path)
