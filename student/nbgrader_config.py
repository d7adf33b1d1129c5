# The students' nbgrader settings, read where JUPYTER_CONFIG_PATH=student (the README's `jupyter lab labs/`, and
# `nbgrader validate` run with it): JupyterLab's Validate button and the command.
import os

from nbgrader.validator import Validator, strip_ansi

c = get_config()  # noqa: F821 - nbgrader's config loader defines it

# Validate starts a kernel of its own; over TCP, ipykernel warns on every start that the channel is not encrypted,
# and the command printed that warning to the student above the result. A local socket (IPC, POSIX only) is what a
# kernel on the student's own machine needs, and ipykernel says nothing about it.
if os.name == "posix":
    c.KernelManager.transport = "ipc"

# Validate cuts each line of a failed test's output at Validator.width (90 by default), and draws its dividers
# that wide. fuselab's reports explain a failure in lines of up to several hundred characters, and what the cut
# removed was the explanation: lines are cut at CUT_WIDTH instead, and the dividers keep nbgrader's width.
CUT_WIDTH = 1000


def _indent_uncut(self, val):
    lines = []
    for line in strip_ansi(val).split("\n"):
        line = self.indent + line
        lines.append(line if len(line) <= CUT_WIDTH - 3 else line[:CUT_WIDTH - 3] + "...")
    return "\n".join(lines)


if not getattr(Validator, "fuselab_configured", False):  # nbgrader may read this file more than once
    Validator._indent = _indent_uncut

# Without a GPU a speed test cell passes under Validate (it measures nothing, so it may not score 0), and a bare
# "Success!" read as if every point were in. Say how many points the course still measures on its GPU: the command
# prints it, and the server's reply carries it under NOT_MEASURED_KEY for the students' Validate button
# (labextension/: nbgrader's own dialog ignores keys it does not know, so its client is unaffected).
NOT_MEASURED = "the speed is not measured on this machine (no GPU)"
NOT_MEASURED_KEY = "fuselab_not_measured"
_validate = Validator.validate
_get_failed_cells = Validator._get_failed_cells
_print_num_failed = Validator._print_num_failed


def _remember_unmeasured(self, nb):
    self.unmeasured = []
    for cell in nb.cells:
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        grading = cell.get("metadata", {}).get("nbgrader", {})
        if NOT_MEASURED in text and grading.get("grade"):
            self.unmeasured.append((grading.get("grade_id", "?"), grading.get("points", 0)))
    return _get_failed_cells(self, nb)


def _unmeasured_note(self):
    unmeasured = getattr(self, "unmeasured", [])
    if not unmeasured:
        return None
    points = sum(p for _, p in unmeasured)
    return (f"{points:g} points not measured here (no GPU): " + ", ".join(cell for cell, _ in unmeasured)
            + ", measured when the course grades your notebook on its GPU.")


def _validate_with_note(self, filename):
    self.unmeasured = []  # a validator may check several notebooks
    results = _validate(self, filename)
    note = _unmeasured_note(self)
    if note:
        results[NOT_MEASURED_KEY] = note
    return results


def _say_unmeasured(self, num_failed):
    _print_num_failed(self, num_failed)
    note = _unmeasured_note(self)
    if note:
        self.stream.write(note + "\n")


if not getattr(Validator, "fuselab_configured", False):
    Validator.validate = _validate_with_note
    Validator._get_failed_cells = _remember_unmeasured
    Validator._print_num_failed = _say_unmeasured
    Validator.fuselab_configured = True
