"""Process trees from /proc: who descends from whom, and killing everything below a process.

The standard library only, and nothing of the course: ``grading/sandbox/keeper.py`` (run as ``python -I -S``) loads this
file by its path, the grader's ``isolate`` and the kernel builds (``build``) import it.
"""

import os
import signal
import time


def parents() -> dict:
    """pid → parent pid of every process (one scan of /proc)."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    stat = handle.read()
                found[int(name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return found


def descendants(pid: int, parent_of: dict | None = None) -> list:
    """Every descendant of ``pid``, deepest last (``parent_of``: one scan of ``parents()``, taken now if not
    given)."""
    parent_of = parents() if parent_of is None else parent_of
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [p for p, parent in parent_of.items() if parent == current]
        found += kids
        frontier += kids
    return found


def trees(roots) -> dict:
    """root → the set of it and its descendants, for several roots from one scan of /proc."""
    parent_of = parents()
    return {root: {root, *descendants(root, parent_of)} for root in roots}


def kill(pids) -> None:
    """SIGKILL each of ``pids`` that is still there and ours to kill."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_below(root: int, rounds: int = 200, pause_s: float = 0.005, after_round=None) -> None:
    """SIGKILL ``root``'s descendants, round after round until none is left (a fork bomb forks while it is being
    killed), at most ``rounds`` rounds; ``after_round()`` runs after each (a subreaper reaps there)."""
    for _ in range(rounds):
        victims = descendants(root)
        if not victims:
            return
        kill(victims)
        time.sleep(pause_s)
        if after_round is not None:
            after_round()
