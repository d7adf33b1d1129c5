"""The parent of every process a submission starts: when its command ends (or the grader dies), so does the rest.

``isolate.Child`` starts ``python -I -S keeper.py -- command ...``. The keeper

- is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process the command double-forks is reparented to the
  keeper, not to init, so it stays below the keeper, where the grader's tree kill and memory watchdog find it;
- asks for ``SIGTERM`` when the grader's thread that started it dies (``PR_SET_PDEATHSIG``, which a ``kill -9``
  of the grader triggers too);
- when the command ends, or on ``SIGTERM``/``SIGINT``/``SIGHUP``, kills everything left below it, round after
  round until nothing is left (a fork bomb forks while it is being killed), then exits with the command's status
  (a command killed by a signal: the keeper kills itself with it);
- with ``--pid`` (what ``isolate.Child`` asks for a command outside the sandbox: bubblewrap gives a sandboxed one
  its own), runs the command in a PID namespace of its own, below a small init (pid 1 there, with a fresh
  ``/proc``): a process that double-forks, calls ``setsid``, drops its environment and kills what it can see
  still dies with that init, which dies with the command or with the keeper, and the keeper is not in its
  namespace to be killed. ``--net``: a network namespace of its own too (loopback only). As a user other than
  root, both come with a user namespace mapping that user to itself; where the kernel allows neither, the command
  runs without them (``docs/grading.md``, trust model, says what that leaves);

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
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
_libc = ctypes.CDLL(None, use_errno=True)


def _load_proctree():
    """``fuselab/proctree.py``, by its path (``-I`` puts no folder of the course on ``sys.path``)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "proctree.py")
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


def _map_self(uid: int, gid: int) -> None:
    """In a fresh user namespace: this user (and group) is itself there, so what it writes is still its own."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)


def contain(pid: bool, net: bool) -> bool:
    """Unshare the namespaces asked for; whether a PID namespace was made. Falls back to less where the kernel
    refuses (a container, no unprivileged user namespaces)."""
    wanted = (CLONE_NEWPID if pid else 0) | (CLONE_NEWNET if net else 0)
    uid, gid = os.geteuid(), os.getegid()
    for flags in (wanted, wanted & ~CLONE_NEWPID):
        if not flags:
            return False
        user = 0 if uid == 0 else CLONE_NEWUSER  # without root, a user namespace gives the right to the others
        if _libc.unshare(flags | user) != 0:
            continue
        if user:
            _map_self(uid, gid)
        return bool(flags & CLONE_NEWPID)
    return False


def _run(command) -> None:
    """The command in this (forked) process: the signals back to their defaults, then exec."""
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"cannot start {command[0]}: {exc}", file=sys.stderr)
    os._exit(127)


def init(command, status_fd: int) -> None:
    """pid 1 of the command's PID namespace: a fresh ``/proc`` (its pids are the namespace's), the command, every
    orphan reaped; when the command ends it writes the command's wait status to ``status_fd`` and exits, and the
    kernel kills everything left in the namespace. Killed with the keeper (the signal comes from outside the
    namespace, so even pid 1 cannot ignore it)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # the kernel then keeps them from pid 1
        signal.signal(number, signal.SIG_DFL)
    # best effort, in a mount namespace of its own (the keeper keeps reading the host's /proc)
    if _libc.unshare(CLONE_NEWNS) == 0 and _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0:
        _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    child = os.fork()
    if child == 0:
        os.close(status_fd)
        _run(command)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            status = 1 << 8
            break
        if pid == child:
            break
    os.write(status_fd, status.to_bytes(4, "little"))
    os._exit(0)


def main(argv) -> int:
    options = argv[:argv.index("--")] if "--" in argv else []
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        print("usage: keeper.py [--pid] [--net] -- command [args...]", file=sys.stderr)
        return 2
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the grader died before the line above: nothing to run for
        return 1
    own_pids = contain(pid="--pid" in options, net="--net" in options)

    def on_signal(number, _frame):
        kill_everything_below()
        os._exit(128 + number)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, on_signal)
    status_r, status_w = os.pipe() if own_pids else (-1, -1)
    child = os.fork()
    if child == 0:
        if own_pids:
            os.close(status_r)
            init(command, status_w)
        _run(command)
    if own_pids:
        os.close(status_w)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # also reaps the orphans reparented here
        except ChildProcessError:
            status = 1 << 8
            break
        if pid == child:
            break
    if own_pids:  # the command's own status, as its init saw it (none: the init was killed, and so was it)
        told = os.read(status_r, 4)
        status = int.from_bytes(told, "little") if len(told) == 4 else status
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
