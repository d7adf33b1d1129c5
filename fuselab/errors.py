"""The exceptions fuselab raises. Each one carries a message written for a student."""


class FuselabError(Exception):
    """Base class of every error fuselab raises on purpose."""


class ShownWithoutInternals:
    """An error about the student's own source: in IPython (JupyterLab, nbclient, nbgrader) its traceback shows the
    student's frames (the cell line that called ``fuselab.build``) and the message, not fuselab's and torch's
    frames that found it. IPython asks ``_render_traceback_``; plain Python never does."""

    def _render_traceback_(self):
        from .cell_hints import student_traceback
        return student_traceback(self)


class BuildError(ShownWithoutInternals, FuselabError):
    """The student's source did not compile or link.

    ``diagnostics`` holds the compiler's messages with line numbers of the student's own text;
    ``log`` holds the full build log for whoever needs it.
    """

    def __init__(self, message, diagnostics="", log=""):
        super().__init__(message)
        self.diagnostics = diagnostics
        self.log = log


class UnsupportedConstruct(BuildError):
    """The CPU emulation cannot run a construct the source uses (textures, inline PTX, ...)."""

    def __init__(self, construct, line, filename="kernel.cu", hint=""):
        message = f"{filename}:{line}: the CPU emulation does not support {construct}"
        if hint:
            message += f" ({hint})"
        super().__init__(message, diagnostics=message)
        self.construct = construct
        self.line = line
        self.filename = filename


class BuildTimeout(BuildError):
    """The compiler ran past the configured time limit and was stopped."""


class NotWrittenError(ShownWithoutInternals, FuselabError, NotImplementedError):
    """The source still holds nbgrader's stub: the student has not written this kernel yet."""


class LaunchError(FuselabError, RuntimeError):
    """A launcher recorded a CUDA error (for example an invalid launch configuration)."""


class StaleModule(ShownWithoutInternals, FuselabError, RuntimeError):
    """A launcher of a module whose name was built again since, and that build failed: the module is the kernel as
    it was before the edit, so calling it would test old code (``kernelbuild.build``)."""


class HostWroteKernelMemory(LaunchError):
    """Under the CPU emulation while the course grades: a launcher's host code changed kernel memory outside every
    kernel and runtime copy, which a GPU does not allow (``fuselab/kernel_memory.py``)."""


# In a notebook, a NameError for a name that a failed cell assigns says which cell failed (fuselab/cell_hints.py).
from .cell_hints import install as _install_cell_hints  # noqa: E402

_install_cell_hints()
