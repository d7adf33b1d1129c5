"""Per-student feedback: nbgrader's ``generate_feedback``, from notebooks with the hidden tests taken out.

nbgrader's feedback is the autograded notebook as HTML, and autograding puts the hidden tests back into the test
cells, so the feedback would show them. Before nbgrader converts it, each notebook is copied with:

- every ``### BEGIN HIDDEN TESTS`` … ``### END HIDDEN TESTS`` block replaced by one comment line;
- the tracebacks of test cells' errors cut to the exception's type and message (a traceback quotes the line
  of the hidden test that failed);
- a first cell with the grader's summary: each test's final points, what the clean recheck found, and flags.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

from ..course import nbgrader
from .nbgrader_run import course_args, notebook_name

_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*\n?", re.S | re.M)
HIDDEN_NOTE = "# (hidden tests: not shown)\n"


def strip_hidden(nb: dict) -> dict:
    """A copy of ``nb`` with the hidden tests' source, and the tracebacks that would quote it, removed."""
    nb = json.loads(json.dumps(nb))
    for cell in nb["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        had_hidden = "BEGIN HIDDEN TESTS" in source
        cell["source"] = _HIDDEN.sub(HIDDEN_NOTE, source)
        graded = (cell.get("metadata", {}).get("nbgrader") or {}).get("grade")
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error" and (had_hidden or graded):
                output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
    return nb


def summary_markdown(student: str, lab: str, result: dict) -> str:
    lines = [f"## Grader's summary: {lab}, {student}", "",
             f"**Total: {result['total']:g} of {result['max_total']:g} automatically graded points**"
             + (" (written answers are graded by hand)" if result.get("manual_cells") else ""), "",
             "| test | points | result |", "| --- | --- | --- |"]
    for grade_id, cell in result["cells"].items():
        message = cell["message"].splitlines()[0][:300] if cell["message"] else ""
        speed = next((r for r in cell.get("speed", []) if r.get("speedup") is not None), None)
        if speed:
            message = f"{speed['speedup']:.2f}x (full points from {speed.get('threshold', 0):.2f}x)" + \
                (f"; {message}" if message else "")
        lines.append(f"| {grade_id} | {cell['points']:g} / {cell['max_points']:g} | {cell['status']}"
                     f"{': ' + html.escape(message).replace('|', '/') if message else ''} |")
    if result.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {html.escape(n)}" for n in result["notes"]]
    ran = "as nbgrader ran it" if result.get("notebook_autograded") else \
        "as you submitted it (nbgrader could not run it to the end)"
    lines += ["", "Each test was run again by the grader outside your notebook, from your kernel sources; "
              f"those results are the ones above. The notebook below is your submission {ran}."]
    return "\n".join(lines)


def prepare(course_root: Path, student: str, lab: str, result: dict) -> Path:
    """Write the stripped notebook with its summary into ``course/feedback-source`` and return its path."""
    source = course_root / "autograded" / student / lab / notebook_name(lab)
    nb = strip_hidden(json.loads(source.read_text()))
    nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": summary_markdown(student, lab, result)})
    target = course_root / "feedback-source" / student / lab / notebook_name(lab)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(nb, indent=1, ensure_ascii=False))
    return target


def generate(course_root: Path, lab: str, out_dir: Path) -> dict:
    """nbgrader generate_feedback for every prepared submission of ``lab``; copies to ``out_dir/<student>/``.

    Returns ``{student: html path}``.
    """
    log = nbgrader("generate_feedback", lab, "--force", *course_args(course_root, autograded="feedback-source"),
                   check=False)
    if log.returncode != 0:
        raise RuntimeError(f"nbgrader generate_feedback {lab} failed: {(log.stdout + log.stderr)[-1500:]}")
    written = {}
    for page in sorted((course_root / "feedback").glob(f"*/{lab}/*.html")):
        student = page.parent.parent.name
        target = out_dir / student / f"{lab}.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, target)
        written[student] = target
    return written
