"""The exception a failed check raises."""

from ..errors import FuselabError, ShownWithoutInternals


class CheckFailed(ShownWithoutInternals, FuselabError, AssertionError):
    """A candidate's output is wrong. The message is the student-readable report.

    It is an ``AssertionError`` so that an nbgrader test cell fails the way a plain ``assert`` would.
    ``result`` holds the ``CheckResult`` (from ``check``) or ``OutputComparison`` (from ``assert_close``).
    In IPython its traceback shows the student's cell and the report, and the candidate's first error only where
    the student's own Python raised it (``cell_hints.student_traceback``).
    """

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result
