"""The first step into the sandbox (``isolate.sandboxed``): an allow-listed environment (``isolate.WORKER_ENV``,
by name), then a user without rights, then bubblewrap.

``python -I -S enter_sandbox.py UID GID ALLOWED_NAMES_REGEX -- bwrap ...``

- The environment is cut down to the names the regular expression allows *before* bubblewrap starts: bubblewrap's
  own ``--clearenv`` would leave the grader's environment in its pid 1, which the sandbox could read.
- ``--fuselab-empty DEST`` lays an empty read-only file over DEST (bubblewrap's ``--ro-bind-data`` from a pipe
  already at its end): a file that must not be read inside a folder the sandbox shows.
- ``--fuselab-refuse NAME,NAME`` makes those system calls fail inside with ``ENOSYS`` (bubblewrap's
  ``--seccomp``, a filter written here): what the kernel's accounting or the watchdog could not count otherwise.
  A process of another architecture than the machine's own (a 32-bit one) is killed: it would call them by other
  numbers.
- The folders bubblewrap binds (``--fuselab-bind SRC DEST``, ``--fuselab-ro-bind SRC DEST``) are first shown, as
  root, in a private mount namespace under ``/run/fuselab-sandbox/N`` (a fresh tmpfs over ``/run``), and bubblewrap
  binds them from there: the user without rights could not reach a Python that lives under ``/root``, or a run
  folder under a private one. (bubblewrap hides ``/run`` again inside.)
- Run as root, it drops to ``UID``/``GID`` with no supplementary groups (which also drops every capability), so
  bubblewrap runs unprivileged: its user namespace then maps to that uid, not to root, and files the host's root
  owns stay the host root's. Run as another user, it stays that user.

Standard library only, run with ``-I -S``: nothing from the environment it is filtering decides how it runs.
"""

import ctypes
import os
import platform
import re
import struct
import sys


STAGE = "/run/fuselab-sandbox"
_libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
CLONE_NEWNS = 0x00020000


# seccomp: the architecture as the kernel names it, and the numbers of the calls that can be refused
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SYSCALLS = {"x86_64": {"shmget": 29, "msgget": 68, "semget": 64, "memfd_create": 319, "memfd_secret": 447,
                       "sched_setaffinity": 203},
            "aarch64": {"shmget": 194, "msgget": 186, "semget": 190, "memfd_create": 279, "memfd_secret": 447,
                        "sched_setaffinity": 122}}
X32_BIT = 0x40000000  # x86_64's x32 calls: the same calls under other numbers
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS, ENOSYS = 0x7FFF0000, 0x00050000, 0x80000000, 38
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06


# calls that succeed and do nothing: OpenMP's thread binding (OMP_PROC_BIND, GOMP_CPU_AFFINITY) aborts on an error
PRETENDED = frozenset({"sched_setaffinity"})


def seccomp_filter(names, machine: str | None = None) -> bytes:
    """A classic BPF program (``struct sock_filter``s, as bubblewrap's ``--seccomp`` reads them) that makes the
    system calls ``names`` fail with ENOSYS (those in ``PRETENDED``: return 0, doing nothing) and kills a process
    of another architecture."""
    machine = machine or platform.machine()
    numbers = [(SYSCALLS[machine][name], 0 if name in PRETENDED else ENOSYS) for name in names]
    program = [(LD_W_ABS, 0, 0, 4), (JEQ_K, 1, 0, AUDIT_ARCH[machine]), (RET_K, 0, 0, RET_KILL_PROCESS),
               (LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":
        program += [(JGE_K, 0, 1, X32_BIT), (RET_K, 0, 0, RET_KILL_PROCESS)]
    for number, errno in numbers:
        program += [(JEQ_K, 0, 1, number), (RET_K, 0, 0, RET_ERRNO | errno)]
    program.append((RET_K, 0, 0, RET_ALLOW))
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _private_mounts() -> None:
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(_libc.mount(b"tmpfs", b"/run", b"tmpfs", 0, b"mode=0755"), "mount tmpfs /run")
    os.mkdir(STAGE, 0o755)


def _stage(source: str, number: int) -> str:
    staged = f"{STAGE}/{number}"
    if os.path.isdir(source):
        os.mkdir(staged, 0o755)
    else:
        open(staged, "w").close()
    _check(_libc.mount(source.encode(), staged.encode(), None, MS_BIND | MS_REC, None), f"bind {source}")
    return staged


def main(argv) -> int:
    uid, gid, allowed = int(argv[0]), int(argv[1]), re.compile(argv[2])
    command = argv[argv.index("--") + 1:]
    bind = {"--fuselab-bind": "--bind", "--fuselab-ro-bind": "--ro-bind"}
    as_root = os.geteuid() == 0
    if as_root:
        _private_mounts()
    args, i = [], 0
    while i < len(command):
        if command[i] == "--":
            args += command[i:]
            break
        if command[i] == "--fuselab-empty":  # an empty read-only file over DEST (a file the sandbox must not read)
            empty, done = os.pipe()
            os.close(done)  # read to its end at once: bubblewrap copies nothing
            os.set_inheritable(empty, True)
            args += ["--ro-bind-data", str(empty), command[i + 1]]
            i += 2
            continue
        if command[i] == "--fuselab-refuse":  # a seccomp filter, read by bubblewrap from a pipe
            program = seccomp_filter([name for name in command[i + 1].split(",") if name])
            filtered, feed = os.pipe()
            os.write(feed, program)  # a few hundred bytes: the pipe holds them
            os.close(feed)
            os.set_inheritable(filtered, True)
            args += ["--seccomp", str(filtered)]
            i += 2
            continue
        if command[i] in bind:
            source = command[i + 1]
            if as_root:
                source = _stage(source, len(args))
            args += [bind[command[i]], source, command[i + 2]]
            i += 3
            continue
        args.append(command[i])
        i += 1
    command = args
    env = {name: value for name, value in os.environ.items() if allowed.fullmatch(name)}
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        # a change of user makes a process undumpable, which hides its /proc/self/fd from itself: bubblewrap
        # reads the folders handed over there
        ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
        if os.geteuid() == 0 or os.getegid() == 0:
            print("enter_sandbox: could not give up root", file=sys.stderr)
            return 126
    os.execve(command[0], command, env)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
