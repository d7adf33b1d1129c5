"""The exception a failed check raises."""

from ..errors import FuselabError


class CheckFailed(FuselabError, AssertionError):
    """A candidate's output is wrong. The message is the student-readable report.

    It is an ``AssertionError`` so that an nbgrader test cell fails the way a plain ``assert`` would.
    ``result`` holds the ``CheckResult`` (from ``check``) or ``OutputComparison`` (from ``assert_close``).
    """

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result
