"""Keep a build off stderr entirely.

nbgrader gives 0 points to a test cell that writes anything to stderr, and during a build stderr is written from
many places: Python warnings (a missing ``TORCH_CUDA_ARCH_LIST``), torch's logger ("No CUDA runtime is found",
which falls back to ``sys.stderr``), and subprocesses writing straight to file descriptor 2, which ipykernel
forwards to the notebook as a stderr stream. So the capture works at all three levels at once, and the
captured text goes into the build log instead.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import threading
import warnings

_lock = threading.RLock()  # the file descriptors are process-wide: one capture at a time


class Captured:
    def __init__(self):
        self.text = ""


@contextlib.contextmanager
def captured_output():
    """Capture fd 1/2, ``sys.stdout``/``sys.stderr``, warnings and log records; yields a ``Captured``."""
    result = Captured()
    with _lock:
        python_text = io.StringIO()
        fd_file = tempfile.TemporaryFile(mode="w+b")
        saved_fds = []
        for fd in (1, 2):
            try:
                saved_fds.append((fd, os.dup(fd)))
            except OSError:  # no such descriptor (some embedded interpreters)
                continue
        handler = logging.StreamHandler(python_text)
        root = logging.getLogger()
        old_stdout, old_stderr = sys.stdout, sys.stderr
        try:
            for stream in (old_stdout, old_stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, _ in saved_fds:
                os.dup2(fd_file.fileno(), fd)
            sys.stdout = sys.stderr = python_text
            root.addHandler(handler)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    yield result
                finally:
                    for w in caught:
                        python_text.write(f"{w.category.__name__}: {w.message}\n")
        finally:
            root.removeHandler(handler)
            sys.stdout, sys.stderr = old_stdout, old_stderr
            for fd, saved in saved_fds:
                os.dup2(saved, fd)
                os.close(saved)
            fd_file.seek(0)
            result.text = python_text.getvalue() + fd_file.read().decode(errors="replace")
            fd_file.close()
