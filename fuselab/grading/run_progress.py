"""What a grading run is doing, phase by phase, on the grader's own stderr.

A run spends its first minutes before any submission (the course set-up: nbgrader's release of each lab; the
instructor's reference runs) and its last ones after them (the gradebook, the feedback pages, the report): each
phase gets its own tqdm bar, kept ticking by a thread, so a TA sees the run moving and the seconds it has
taken, a one-student regrade included. Only the grader's process draws them: its children's output is captured,
and inside a Jupyter kernel (where stderr would land in a notebook, and where nbgrader scores a cell that
writes there 0) nothing is drawn.
"""

from __future__ import annotations

import contextlib
import sys
import threading

from ..timing.progress import in_jupyter_kernel


class _Silent:
    def update(self, n=1):
        pass

    def set_postfix_str(self, text):
        pass


@contextlib.contextmanager
def phase(name: str, total: int, unit: str, enabled: bool = True):
    """A bar for one phase of ``total`` steps; yields an object with tqdm's ``update`` and ``set_postfix_str``."""
    if not enabled or in_jupyter_kernel():
        yield _Silent()
        return
    from tqdm import tqdm
    bar = tqdm(total=total, desc=name, unit=unit, file=sys.stderr, leave=True, dynamic_ncols=True)
    stop = threading.Event()

    def tick():  # the elapsed time moves while a long step (a reference run: minutes) has not ended
        while not stop.wait(1.0):
            bar.refresh()

    ticker = threading.Thread(target=tick, name=f"progress {name}", daemon=True)
    ticker.start()
    try:
        yield bar
    finally:
        stop.set()
        ticker.join()
        bar.close()
