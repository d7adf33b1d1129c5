"""The course's tuned solution of a graded speed test, for the feedback pages' picture.

The grader's run of the instructor's notebook (the reference run) times it beside the plain solution
(``graded.speedup_test``): ``course_tuned`` builds the instructor notebook's ``TUNED_SOURCE`` through its lab's
declared ``tuned_op`` and checks it on the timed inputs. Its build (seconds: Lab 3's tensor-core path) would add
to the reference run's time, so the grader builds it beside the run (``build``, from
``grading/run/build_ahead.py``); the run's build then finds it done, or waits for it under the build's lock.

The tuned solution is the course's own code (inline PTX and all): the native-code check that refuses ``asm`` in a
student's library does not apply to its build (``native_check.course_code``).
"""

from __future__ import annotations

import torch

from ..check import assert_close
from ..native_check import course_code
from ..quiet import captured_output


def _op(test_id: str):
    """The course's tuned solution of ``test_id`` as the speed test's op, built from the instructor's notebook by its
    lab's ``tuned_op`` (the course's own code: not refused for its PTX); None where the lab declares none or this
    checkout has no instructor's notebook."""
    from ..labs import registry
    from ..notebook_sources import string_assignments
    lab = registry.lab(test_id.partition(".")[0])
    name, notebook = lab.graded_test(test_id).tuned_op, lab.solution_notebook()
    source = string_assignments(notebook).get("TUNED_SOURCE") if name and notebook.is_file() else None
    if not source:
        return None
    with course_code():
        return getattr(lab.module(), name)(source)


def course_tuned(test_id, inputs, out, reference):
    """``(op, "")``: the course's tuned solution of ``test_id``, right on ``inputs`` (written into ``out``); or
    ``(None, why not)``. Nothing it raises reaches the speed test: the plain solution's record stands whatever
    happens here."""
    try:
        with captured_output():  # a build's or a check's words must not reach the run's stderr
            op = _op(test_id)
            if op is None:
                return None, "the lab has no tuned solution here"
            op(*inputs, out)
            assert_close(out, reference(*[x.double() if torch.is_tensor(x) else x for x in inputs]))
        return op, ""
    except Exception as exc:  # noqa: BLE001 - a broken tuned solution is said in the record, never a verdict
        return None, f"not measured ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"


def build(test_id: str) -> bool:
    """Build (and load, as the run does) the course's tuned solution of ``test_id``; False where it failed or the
    lab has none (the run builds it again and says why)."""
    try:
        return _op(test_id) is not None
    except Exception:  # noqa: BLE001 - the run builds it again and says why
        return False
