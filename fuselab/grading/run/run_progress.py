"""What a grading run is doing, phase by phase, on the grader's own stderr.

A run spends its first minutes before any submission (the course set-up: nbgrader's release of each lab; the
instructor's reference runs) and its last ones after them (the gradebook, the feedback pages, the report): each
phase gets its own tqdm bar, kept ticking by a thread, so a TA sees the run moving and the seconds it has
taken, a one-student regrade included. Only the grader's process draws them: its children's output is captured,
and inside a Jupyter kernel (where stderr would land in a notebook, and where nbgrader scores a cell that
writes there 0) nothing is drawn.
"""

from __future__ import annotations

import sys
import threading

from ...timing.progress import in_jupyter_kernel


class Phase:
    """A bar for one phase of ``total`` steps (tqdm's ``update`` and ``set_postfix_str``); ``close`` ends it.
    Also a context manager. Silent where ``enabled`` is false or inside a Jupyter kernel."""

    def __init__(self, name: str, total: int, unit: str, enabled: bool = True):
        self.bar = None
        if not enabled or in_jupyter_kernel():
            return
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc=name, unit=unit, file=sys.stderr, leave=True, dynamic_ncols=True)
        self._stop = threading.Event()
        # the elapsed time moves while a long step (a reference run: minutes) has not ended
        self._ticker = threading.Thread(target=self._tick, name=f"progress {name}", daemon=True)
        self._ticker.start()

    def _tick(self):
        while not self._stop.wait(1.0):
            self.bar.refresh()

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def set_postfix_str(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def close(self) -> None:
        if self.bar is not None:
            self._stop.set()
            self._ticker.join()
            self.bar.close()
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def phase(name: str, total: int, unit: str, enabled: bool = True) -> Phase:
    return Phase(name, total, unit, enabled)
