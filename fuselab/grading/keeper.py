"""The parent of every process a submission starts: when its command ends (or the grader dies), so does the rest.

``isolate.Child`` starts ``python -I -S keeper.py -- command ...``. The keeper

- is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process the command double-forks is reparented to the
  keeper, not to init, so it stays below the keeper, where the grader's tree kill and memory watchdog find it;
- asks for ``SIGTERM`` when the grader's thread that started it dies (``PR_SET_PDEATHSIG``, which a ``kill -9``
  of the grader triggers too);
- when the command ends, or on ``SIGTERM``/``SIGINT``/``SIGHUP``, kills everything left below it, round after
  round until nothing is left (a fork bomb forks while it is being killed), then exits with the command's status
  (a command killed by a signal: the keeper kills itself with it).

Run as a script with the standard library only: it must start fast and import nothing of the course but
``fuselab/proctree.py`` (the standard library only too), loaded by its path before the command starts.
"""

import ctypes
import importlib.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


def _load_proctree():
    """``fuselab/proctree.py``, by its path (``-I`` puts no folder of the course on ``sys.path``)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "proctree.py")
    spec = importlib.util.spec_from_file_location("fuselab_keeper_proctree", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


proctree = _load_proctree()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_everything_below() -> None:
    proctree.kill_below(os.getpid(), after_round=_reap)


def main(argv) -> int:
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        print("usage: keeper.py -- command [args...]", file=sys.stderr)
        return 2
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the grader died before the line above: nothing to run for
        return 1

    def on_signal(number, _frame):
        kill_everything_below()
        os._exit(128 + number)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, on_signal)
    child = os.fork()
    if child == 0:
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"cannot start {command[0]}: {exc}", file=sys.stderr)
        os._exit(127)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # also reaps the orphans reparented here
        except ChildProcessError:
            status = 1 << 8
            break
        if pid == child:
            break
    kill_everything_below()
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            signal.signal(number, signal.SIG_DFL)  # SIGKILL's cannot be set (nor needs to be)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), number)
        return 128 + number
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
