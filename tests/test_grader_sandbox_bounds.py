"""What a sandboxed submission can hold and see, tried as an attacker, as root and as a plain user the test creates:
no place inside is writable but its own folders and the bounded, counted private tmpfs (bubblewrap's own ``/``
and ``/dev`` are read-only); memory no process's resident size shows (memfd, shared mappings, files deleted but
held open, SysV shared memory) counts against the limit, by the kernel's memory cgroup where the grader can have
one and by the watchdog where not; the checkout shows only what a worker needs. Small limits: small CI machines."""

import contextlib
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from fuselab.grading.sandbox import cgroup, isolate

from .conftest import REPO
from .test_grader_sandbox_use import _as_plain_user, _plain_user, _sandbox_or_fail, _user_folder


def _run(tmp_path, script, *args, limits=None, own=None):
    own = Path(own or tmp_path / "own")
    command = isolate.sandboxed([sys.executable, "-c", script, *args], own=[own], hide=[])
    return isolate.Child(command, limits=limits or isolate.Limits(wall_s=120, memory_bytes=None),
                         cwd=str(own)).wait()


def _report(outcome) -> dict:
    assert outcome.returncode == 0, outcome
    return json.loads(outcome.stdout.strip().splitlines()[-1])


# --- nothing writable but its own folders and the private tmpfs ------------------------------------------------------

WRITABLE = textwrap.dedent(r'''
    import json, os, stat, sys
    own, nodes = sys.argv[1], json.loads(sys.argv[2])
    seen = {}
    def attempt(name, action):
        try:
            action()
            seen[name] = "done"
        except OSError as exc:
            seen[name] = "refused: " + os.strerror(exc.errno)
    attempt("file_at_root", lambda: open("/fuselab-x", "w").write("x"))
    attempt("folder_at_root", lambda: os.mkdir("/fuselab-y"))
    attempt("file_in_dev", lambda: open("/dev/fuselab-x", "w").write("x"))
    attempt("folder_in_dev", lambda: os.mkdir("/dev/fuselab-y"))
    # a folder bubblewrap made on its root for a mount point further down (the own folder's parent)
    attempt("beside_own", lambda: open(os.path.join(os.path.dirname(own), "fuselab-z"), "w").write("x"))
    attempt("own", lambda: open(os.path.join(own, "mine"), "w").write("x"))
    attempt("dev_shm", lambda: open("/dev/shm/mine", "w").write("x"))
    attempt("tmp", lambda: open("/tmp/mine", "w").write("x"))
    attempt("dev_null", lambda: open("/dev/null", "w").write("x"))
    for node in nodes:  # the GPU's device files are bound in like these: still opened for reading and writing
        attempt("node " + node, lambda: os.close(os.open(node, os.O_RDWR)))
    # every mount that can be written: device files, /proc, /dev/pts, or what the grader counts
    writable = []
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        point, options = fields[4].replace("\\040", " "), fields[5].split(",")
        if "rw" in options and not stat.S_ISCHR(os.stat(point).st_mode):
            writable.append(point)
    seen["writable_mounts"] = sorted(writable)
    print(json.dumps(seen))
''')


def _device_stand_ins() -> list:
    """Host device files bubblewrap's minimal /dev lacks, bound in as the GPU's are (``--dev-bind``; one nested,
    as /dev/nvidia-caps/nvidia-cap1 is): nothing here has an NVIDIA GPU."""
    return [node for node in ("/dev/fuse", "/dev/net/tun") if os.path.exists(node)] or ["/dev/null"]


def _check_writable(seen: dict, own: str, nodes) -> None:
    for name in ("file_at_root", "folder_at_root", "file_in_dev", "folder_in_dev", "beside_own"):
        assert seen[name].startswith("refused"), (name, seen)
    for name in ("own", "dev_shm", "tmp", "dev_null", *("node " + n for n in nodes)):
        assert seen[name] == "done", (name, seen)
    allowed = {own, *isolate.PRIVATE, "/proc", "/dev/pts"}
    assert set(seen["writable_mounts"]) <= allowed, seen["writable_mounts"]


def test_nothing_in_the_sandbox_is_writable_but_its_own_folders_and_the_counted_tmpfs(tmp_path, monkeypatch):
    """bubblewrap's own root and /dev are tmpfs that nothing bounds or counts: a submission filled them (files and
    folders at /x, /dev/x) without limit. Now they are read-only, while the device files (the GPU's included),
    /dev/shm, /tmp and the own folder stay usable."""
    _sandbox_or_fail()
    nodes = _device_stand_ins()
    monkeypatch.setattr(isolate, "gpu_device_nodes", lambda: nodes)
    own = Path("/var/lib") / f"fuselab-bounds-{os.getpid()}" / "work" / "own"  # outside every tmpfs inside
    try:
        seen = _report(_run(tmp_path, WRITABLE, str(own), json.dumps(nodes), own=own))
    finally:
        import shutil
        shutil.rmtree(own.parent.parent, ignore_errors=True)
    _check_writable(seen, str(own), nodes)


PLAIN_WRITABLE = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from fuselab.grading.sandbox import isolate
    work = Path(sys.argv[1])
    own = Path((work / "own-path").read_text())
    command = isolate.sandboxed([sys.executable, "-c", (work / "attack.py").read_text(), str(own), "[]"],
                                own=[own], hide=[])
    outcome = isolate.Child(command, limits=isolate.Limits(wall_s=120, memory_bytes=None), cwd=str(own)).wait()
    print(outcome.stdout.strip().splitlines()[-1] if outcome.returncode == 0 else json.dumps({"failed": str(outcome)}))
''')


def test_nothing_is_writable_in_a_plain_users_sandbox_either(tmp_path):
    # as the root test's: outside every tmpfs inside (a folder bubblewrap makes for a mount point in the private
    # /tmp is the counted tmpfs's, and writable there)
    top = Path("/var/lib") / f"fuselab-bounds-plain-{os.getpid()}"
    own = top / "work" / "own"
    try:
        with _user_folder() as work:
            own.mkdir(parents=True)
            user = _plain_user()
            for folder in (top, own.parent, own):
                shutil.chown(folder, user, user)
            (work / "own-path").write_text(str(own))
            (work / "attack.py").write_text(WRITABLE)
            done = _as_plain_user(PLAIN_WRITABLE, work)
            assert done.returncode == 0, done.stderr[-3000:]
            seen = json.loads(done.stdout.strip().splitlines()[-1])
            assert "failed" not in seen, seen
            _check_writable(seen, str(own), [])
    finally:
        shutil.rmtree(top, ignore_errors=True)


# --- of the checkout, only what a worker needs ------------------------------------------------------------------------

CHECKOUT = textwrap.dedent(r'''
    import json, os, sys
    repo = sys.argv[1]
    seen = {"repo": sorted(os.listdir(repo))}
    for name in ("solutions", ".cache", "tests", "docs", "grader", "README.md", ".git"):
        seen[name] = os.path.exists(os.path.join(repo, name))
    seen["samples"] = {lab: os.path.getsize(os.path.join(repo, "fuselab", "labs", lab, "samples.py"))
                       for lab in sorted(os.listdir(os.path.join(repo, "fuselab", "labs"))) if lab.startswith("lab")}
    # what the checker and the workers import still imports
    import fuselab.grading.recheck.cellrunner, fuselab.grading.recheck.kernel_worker, fuselab.grading.recheck.solution_worker
    import fuselab.labs.lab3.samples
    seen["imports"] = not hasattr(fuselab.labs.lab3.samples, "SAMPLES")
    print(json.dumps(seen))
''')


def _check_checkout(seen: dict) -> None:
    assert set(seen["repo"]) <= {"fuselab", ".venv"}, seen["repo"]
    for name in ("solutions", ".cache", "tests", "docs", "grader", "README.md", ".git"):
        assert seen[name] is False, (name, seen)
    assert seen["samples"] and set(seen["samples"].values()) == {0}, seen["samples"]
    assert seen["imports"], seen


def test_the_sandbox_shows_of_the_checkout_only_the_package(tmp_path):
    """The whole checkout was visible read-only inside: the instructor's builds in .cache/, solutions/, old runs
    in grader/, tests/, docs/. Now an allow-list: the package alone; its sample submissions (correct kernels among
    them) are empty files. What the checker and the workers import still imports."""
    _sandbox_or_fail()
    (REPO / ".cache").mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    own = tmp_path / "own"
    command = isolate.sandboxed([sys.executable, "-c", CHECKOUT, str(REPO)], own=[own], hide=[])
    seen = _report(isolate.Child(command, limits=isolate.Limits(wall_s=120, memory_bytes=None), env=env,
                                 cwd=str(own)).wait())
    _check_checkout(seen)


PLAIN_CHECKOUT = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    from fuselab import course
    from fuselab.grading.sandbox import isolate
    work = Path(sys.argv[1])
    own = work / "own"
    command = isolate.sandboxed([sys.executable, "-c", (work / "attack.py").read_text(), str(course.REPO)],
                                own=[own], hide=[])
    outcome = isolate.Child(command, limits=isolate.Limits(wall_s=120, memory_bytes=None), cwd=str(own)).wait()
    print(outcome.stdout.strip().splitlines()[-1] if outcome.returncode == 0 else json.dumps({"failed": str(outcome)}))
''')


def test_a_plain_users_sandbox_shows_the_same_of_the_checkout(tmp_path):
    with _user_folder() as work:
        (work / "attack.py").write_text(CHECKOUT)
        done = _as_plain_user(PLAIN_CHECKOUT, work)
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert "failed" not in seen, seen
        _check_checkout(seen)


# --- memory no resident size shows --------------------------------------------------------------------------------

HOLD = textwrap.dedent(r'''
    import ctypes, mmap, os, sys, time
    kind, size = sys.argv[1], int(sys.argv[2]) * 2**20
    chunk, held = b"x" * 2**20, []

    def fill(fd):
        for _ in range(size // 2**20):
            os.write(fd, chunk)

    try:
        if kind == "memfd":  # written, never mapped
            fd = os.memfd_create("held")
            fill(fd)
            held.append(fd)
        elif kind == "memfd_mapped_only":  # written, one page mapped, its descriptor closed
            fd = os.memfd_create("held")
            fill(fd)
            held.append(mmap.mmap(fd, 4096))
            os.close(fd)
        elif kind == "shared_dropped":  # a shared mapping touched, then its pages dropped from the page tables
            area = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
            for offset in range(0, size, 4096):
                area[offset] = 1
            area.madvise(mmap.MADV_DONTNEED)
            held.append(area)
        elif kind == "deleted_tmpfs":  # a file of /dev/shm deleted but held open
            handle = open("/dev/shm/held", "wb")
            fill(handle.fileno())
            os.unlink("/dev/shm/held")
            held.append(handle)
        elif kind == "sysv":  # SysV shared memory of the sandbox's IPC namespace, written, then detached
            libc = ctypes.CDLL(None, use_errno=True)
            libc.shmat.restype = ctypes.c_void_p
            segment = libc.shmget(0, size, 0o1600)
            if segment < 0:
                raise OSError(ctypes.get_errno(), "shmget")
            address = libc.shmat(segment, None, 0)
            ctypes.memset(address, 1, size)
            libc.shmdt(ctypes.c_void_p(address))
        elif kind == "sysv_messages":  # SysV message queues: kernel memory of the namespace
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.msgget(0, 0o1600) < 0:
                raise OSError(ctypes.get_errno(), "msgget")
        elif kind == "sysv_semaphores":  # sets of 32000 semaphores: kernel memory of the namespace, 2 MiB each
            libc = ctypes.CDLL(None, use_errno=True)
            for _ in range(size // (32000 * 64) + 1):
                if libc.semget(0, 32000, 0o1600) < 0:
                    raise OSError(ctypes.get_errno(), "semget")
        elif kind == "memfd_secret":  # pages of secretmem's own file system, held by the descriptor once unmapped
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            fd = libc.syscall(447, 0)  # memfd_secret, x86_64's and aarch64's number
            if fd < 0:
                raise OSError(ctypes.get_errno(), "memfd_secret")
            os.ftruncate(fd, size + 2**22)
            for offset in range(0, size, 2**22):  # a few MiB at a time: each mapping counts as locked memory
                area = mmap.mmap(fd, 2**22, offset=offset)
                for page in range(0, 2**22, 4096):
                    area[page] = 1
                area.close()
            held.append(fd)
    except OSError as exc:
        print("refused", exc.errno, flush=True)
        sys.exit(0)
    print("holding", flush=True)
    time.sleep(40)
''')
KINDS = ("memfd", "memfd_mapped_only", "shared_dropped", "deleted_tmpfs", "sysv", "sysv_messages", "sysv_semaphores",
         "memfd_secret")
ENOSYS = 38


def _held(outcome) -> str:
    """How the limit held against one kind: stopped for memory, or the call refused inside."""
    if outcome.out_of_memory and not outcome.timed_out and "memory" in outcome.describe():
        return "stopped"
    if f"refused {ENOSYS}" in outcome.stdout:
        return "refused"
    return f"not held: {outcome}"


def _hold(tmp_path, kind, mib, limit_mib):
    return _run(tmp_path, HOLD, kind, str(mib), limits=isolate.Limits(wall_s=90, memory_bytes=limit_mib * 2**20))


@pytest.mark.parametrize("counter", ["cgroup", "watchdog"])
def test_memory_no_process_shows_counts_against_the_limit(tmp_path, monkeypatch, counter):
    """250 MiB held where no resident size shows it (a memfd written and not mapped, or mapped by one page; a shared
    mapping whose pages were dropped; a tmpfs file deleted but held open; SysV shared memory, semaphores;
    memfd_secret) under a 120 MiB limit: the tree is stopped for memory, or the call is refused inside (SysV and
    memfd_secret, which nothing the course runs uses). With the kernel's memory cgroup (this machine's, as root)
    and with the watchdog alone (where the grader can have none)."""
    _sandbox_or_fail()
    if counter == "cgroup":
        assert cgroup.available(), "a writable memory cgroup is expected here (CI runs as root)"
    else:
        monkeypatch.setattr(cgroup.MemoryGroup, "make", classmethod(lambda cls, limit: None))
        monkeypatch.setattr(cgroup, "available", lambda: False)
    held = {kind: _held(_hold(tmp_path, kind, 250, 120)) for kind in KINDS}
    assert held == {"memfd": "stopped", "memfd_mapped_only": "stopped", "shared_dropped": "stopped",
                    "deleted_tmpfs": "stopped", "sysv": "refused", "sysv_messages": "refused",
                    "sysv_semaphores": "refused", "memfd_secret": "refused"}, held
    # and what stays under the limit runs on (nothing counted twice)
    for kind in ("memfd", "memfd_mapped_only", "shared_dropped"):
        outcome = _run(tmp_path, HOLD.replace("time.sleep(40)", "time.sleep(2)"), kind, "40",
                       limits=isolate.Limits(wall_s=90, memory_bytes=120 * 2**20))
        assert outcome.ok and "holding" in outcome.stdout, (kind, outcome)


def test_the_kernel_counts_where_the_grader_has_a_memory_cgroup(tmp_path):
    """As root here, each child gets a group of its own, limited, removed after it."""
    assert cgroup.available()
    child = isolate.Child([sys.executable, "-c", "import time; time.sleep(30)"],
                          limits=isolate.Limits(wall_s=60, memory_bytes=300 * 2**20))
    group = child.group
    assert group is not None and group.holds(child.process.pid)
    child.stop(timed_out=False)
    child.wait()
    assert not group.folder.exists()


PLAIN_HOLD = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from fuselab.grading.sandbox import cgroup, isolate
    work = Path(sys.argv[1])
    held = {"cgroup": cgroup.available()}
    for kind in json.loads((work / "kinds.json").read_text()):
        own = work / "own"
        command = isolate.sandboxed([sys.executable, "-c", (work / "hold.py").read_text(), kind, "250"], own=[own],
                                    hide=[])
        o = isolate.Child(command, limits=isolate.Limits(wall_s=90, memory_bytes=120 * 2**20), cwd=str(own)).wait()
        held[kind] = [o.out_of_memory, o.timed_out, o.describe(), o.stdout]
    print(json.dumps(held))
''')


def test_memory_no_process_shows_counts_for_a_plain_user_too(tmp_path):
    """A plain user has no memory cgroup here: the watchdog counts, and where it could not size a memfd that is
    only mapped (``map_files`` is root's), ``memfd_create`` is refused inside."""
    with _user_folder() as work:
        (work / "hold.py").write_text(HOLD)
        (work / "kinds.json").write_text(json.dumps(KINDS))
        done = _as_plain_user(PLAIN_HOLD, work)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report.pop("cgroup") is False
    held = {}
    for kind, (out_of_memory, timed_out, described, stdout) in report.items():
        held[kind] = "stopped" if out_of_memory and not timed_out and "memory" in described else \
            "refused" if f"refused {ENOSYS}" in stdout else f"not held: {described} {stdout}"
    assert held == {"memfd": "refused", "memfd_mapped_only": "refused", "shared_dropped": "stopped",
                    "deleted_tmpfs": "stopped", "sysv": "refused", "sysv_messages": "refused",
                    "sysv_semaphores": "refused", "memfd_secret": "refused"}, held


def test_an_installed_copy_of_the_package_shows_no_sample_submissions_either(tmp_path, monkeypatch):
    """The package installed in the Python environment (its site-packages deep inside the environment's folder,
    which the sandbox shows whole) held the sample submissions readable."""
    _sandbox_or_fail()
    prefix = Path("/var/lib") / f"fuselab-env-{os.getpid()}"
    site = prefix / "lib" / "site-packages"
    samples = site / "fuselab" / "labs" / "lab0" / "samples.py"
    samples.parent.mkdir(parents=True)
    (site / "fuselab" / "__init__.py").write_text("")
    samples.write_text("SAMPLES = {'correct': 'a right kernel'}")
    try:
        monkeypatch.syspath_prepend(str(site))
        monkeypatch.syspath_prepend(str(prefix))
        assert prefix in isolate.runtime_folders()
        outcome = _run(tmp_path, f"import os; print(os.path.getsize({str(samples)!r}))")
    finally:
        import shutil
        shutil.rmtree(prefix, ignore_errors=True)
    assert outcome.ok and outcome.stdout.split() == ["0"], outcome


DELETED_BUT_HELD = textwrap.dedent(r'''
    import os, sys, time
    handle = open("held", "wb")
    for _ in range(int(sys.argv[1])):
        handle.write(b"x" * 2**20)
        handle.flush()
    os.unlink("held")  # no folder walk finds it now; its blocks stay taken while it is open
    print("holding", flush=True)
    time.sleep(40)
''')


def test_a_file_deleted_but_held_open_counts_against_the_disk_budget(tmp_path):
    _sandbox_or_fail()
    limits = isolate.Limits(wall_s=90, memory_bytes=None, disk_bytes=100 * 2**20)
    outcome = _run(tmp_path, DELETED_BUT_HELD, "200", limits=limits)
    assert outcome.limit and "disk budget" in outcome.limit and not outcome.timed_out, outcome
    small = _run(tmp_path, DELETED_BUT_HELD.replace("time.sleep(40)", "time.sleep(3)"), "20", limits=limits)
    assert small.ok, small


# --- kernel memory of sockets: buffers no process, descriptor or file shows --------------------------------------

SOCKETS = textwrap.dedent(r'''
    import array, os, socket, sys, time
    kind, size = sys.argv[1], int(sys.argv[2]) * 2**20
    chunk, held, total = b"x" * 65536, [], 0
    carrier = socket.socketpair() if kind == "unix_in_flight" else None
    if kind == "tcp_loopback":
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(100)
    while total < size:  # unread bytes in socket pairs, as big as each socket's buffer lets them be
        if kind == "tcp_loopback":
            pair = (socket.create_connection(server.getsockname()), server.accept()[0])
        else:
            pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in pair:
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
            end.setblocking(False)
        for end in pair:
            try:
                while True:
                    total += end.send(chunk)
            except BlockingIOError:
                pass
        if carrier:  # handed to another socket and closed: in flight, in no process's /proc/PID/fd
            fds = array.array("i", [end.fileno() for end in pair])
            carrier[0].sendmsg([b"f"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            for end in pair:
                end.close()
        else:
            held += pair
    print("holding", total >> 20, flush=True)
    time.sleep(40)
''')
SOCKET_KINDS = ("unix_sockets", "unix_in_flight", "tcp_loopback")


def _sockets_held(outcome) -> str:
    if outcome.out_of_memory and not outcome.timed_out and "memory" in outcome.describe():
        return "stopped"
    return f"not held: {outcome.describe()} {outcome.stdout[-300:]}"


@pytest.mark.parametrize("counter", ["cgroup", "watchdog"])
def test_memory_held_in_sockets_buffers_counts_against_the_limit(tmp_path, monkeypatch, counter):
    """Unread bytes in Unix socket pairs are kernel memory: no resident size, descriptor or file shows them. Under
    a 120 MiB limit 300 MiB were held for as long as the submission liked (and with each descriptor's socket
    holding megabytes, a hundred gigabytes fit in the descriptors one process may have), also with the sockets
    closed while in flight in another socket's queue, and over TCP on the sandbox's loopback (which a cgroup v1
    does not charge: 300 MiB past its limit too). The watchdog now asks the kernel what the sockets of the
    sandbox's network namespace hold, with or without a memory cgroup."""
    _sandbox_or_fail()
    if counter == "cgroup":
        assert cgroup.available(), "a writable memory cgroup is expected here (CI runs as root)"
    else:
        monkeypatch.setattr(cgroup.MemoryGroup, "make", classmethod(lambda cls, limit: None))
        monkeypatch.setattr(cgroup, "available", lambda: False)
    held = {kind: _sockets_held(_run(tmp_path, SOCKETS, kind, "300",
                                     limits=isolate.Limits(wall_s=90, memory_bytes=120 * 2**20)))
            for kind in SOCKET_KINDS}
    assert held == {kind: "stopped" for kind in SOCKET_KINDS}, held
    # and a few sockets with little in them run on
    outcome = _run(tmp_path, SOCKETS.replace("time.sleep(40)", "time.sleep(3)"), "unix_sockets", "20",
                   limits=isolate.Limits(wall_s=90, memory_bytes=120 * 2**20))
    assert outcome.ok and "holding" in outcome.stdout, outcome


def test_the_sockets_are_asked_through_one_helper_per_child(tmp_path, monkeypatch):
    """Each ask of a sandbox's sockets started a helper Python (about 30 ms of CPU each), once a second for each of
    a submission's three processes: a third of the grader's short processes. The helper now opens one
    ``sock_diag`` socket in the sandbox's namespace per child; every later ask goes through it, and it is closed
    with the child."""
    _sandbox_or_fail()
    from fuselab.grading.sandbox import socket_memory
    opened, kept = [], []
    real = socket_memory.diag_socket

    def counted(pid, *args, **kwargs):
        nl = real(pid, *args, **kwargs)
        opened.append(pid)
        kept.append(nl)
        return nl

    monkeypatch.setattr(socket_memory, "diag_socket", counted)
    monkeypatch.setattr(cgroup.MemoryGroup, "make", classmethod(lambda cls, limit: None))
    asks = []
    monkeypatch.setattr(socket_memory, "socket_bytes", lambda nl=None: asks.append(nl) or 0)
    outcome = _run(tmp_path, SOCKETS.replace("time.sleep(40)", "time.sleep(4)"), "unix_sockets", "1",
                   limits=isolate.Limits(wall_s=90, memory_bytes=120 * 2**20))
    assert outcome.ok and "holding" in outcome.stdout, outcome
    assert len(asks) >= 3 and len(opened) == 1, (asks, opened)
    assert kept[0] is not None and kept[0].fileno() == -1  # closed when the child ended
    monkeypatch.undo()
    assert isolate.own_network_socket_bytes([os.getpid()]) == 0  # the grader's own namespace is never asked


PLAIN_SOCKETS = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from fuselab.grading.sandbox import cgroup, isolate
    work = Path(sys.argv[1])
    held = {"cgroup": cgroup.available()}
    for kind, (script, mib, limit) in json.loads((work / "kinds.json").read_text()).items():
        own = work / "own"
        command = isolate.sandboxed([sys.executable, "-c", (work / script).read_text(), kind, str(mib)], own=[own],
                                    hide=[])
        o = isolate.Child(command, limits=isolate.Limits(wall_s=90, memory_bytes=limit * 2**20), cwd=str(own)).wait()
        held[kind] = [o.out_of_memory, o.timed_out, o.describe(), o.stdout]
    print(json.dumps(held))
''')


def test_memory_held_in_sockets_and_pipes_counts_for_a_plain_user_too(tmp_path):
    """A plain user has no memory cgroup here: the watchdog joins the sandbox's namespaces (the grader's user
    made them) to ask what its sockets hold, and reopens its pipes through /proc to ask what they hold."""
    with _user_folder() as work:
        (work / "sockets.py").write_text(SOCKETS)
        (work / "pipes.py").write_text(PIPES)
        kinds = {**{kind: ["sockets.py", 300, 120] for kind in SOCKET_KINDS}, "pipes": ["pipes.py", 60, 40]}
        (work / "kinds.json").write_text(json.dumps(kinds))
        done = _as_plain_user(PLAIN_SOCKETS, work)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report.pop("cgroup") is False
    held = {kind: "stopped" if oom and not timed_out and "memory" in described else f"not held: {described} {out}"
            for kind, (oom, timed_out, described, out) in report.items()}
    assert held == {kind: "stopped" for kind in kinds}, held


PIPES = textwrap.dedent(r'''
    import fcntl, os, sys, time
    size, held, total = int(sys.argv[-1]) * 2**20, [], 0
    while total < size:  # pipes of a megabyte each (the most a user may ask), filled and never read
        read, write = os.pipe()
        try:
            fcntl.fcntl(write, 1031, 2**20)  # F_SETPIPE_SZ
        except OSError:
            pass
        os.set_blocking(write, False)
        try:
            while True:
                total += os.write(write, b"x" * 65536)
        except BlockingIOError:
            pass
        held += [read, write]
    print("holding", total >> 20, flush=True)
    time.sleep(40)
''')


@pytest.mark.parametrize("counter", ["cgroup", "watchdog"])
def test_memory_held_in_pipes_counts_against_the_limit(tmp_path, monkeypatch, counter):
    """Bytes written to pipes and never read are kernel memory no resident size shows: 60 MiB in pipes ran on under
    a 40 MiB limit (and thousands of small pipes per process, in each of its processes, hold gigabytes)."""
    _sandbox_or_fail()
    if counter == "watchdog":
        monkeypatch.setattr(cgroup.MemoryGroup, "make", classmethod(lambda cls, limit: None))
        monkeypatch.setattr(cgroup, "available", lambda: False)
    outcome = _run(tmp_path, PIPES, "60", limits=isolate.Limits(wall_s=90, memory_bytes=40 * 2**20))
    assert _sockets_held(outcome) == "stopped", outcome
    outcome = _run(tmp_path, PIPES.replace("time.sleep(40)", "time.sleep(3)"), "2",
                   limits=isolate.Limits(wall_s=90, memory_bytes=40 * 2**20))
    assert outcome.ok and "holding" in outcome.stdout, outcome


# --- what the counters open and follow ----------------------------------------------------------------------------

RENAMED_MAPPING = textwrap.dedent(r'''
    import ctypes, os, sys, time
    name = sys.argv[1]
    with open(name, "wb") as handle:
        handle.write(b"x" * 8 * 2**20)
    fd = os.open(name, os.O_RDWR)
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    area = libc.mmap(None, 8 * 2**20, 3, 1, fd, 0)  # read and write, shared; Python's mmap would keep a descriptor
    os.close(fd)  # only the mapping holds it
    os.unlink(name)  # the mapping now shows as "NAME (deleted)": a name the process can make a link
    os.symlink(sys.argv[2], name + " (deleted)")
    print("mapped", flush=True)
    time.sleep(30)
''')


def test_a_mappings_name_made_a_link_is_never_followed(tmp_path, monkeypatch):
    """A process maps 8 MiB of a tmpfs file, deletes it and puts a link to a folder on disk at the name its
    mapping now shows (``NAME (deleted)``). The memory count follows no such name: it used to ask the file
    system of that path, through the link, and took the tmpfs memory for disk. As a plain user (no
    ``map_files``, root's: emulated here) that was all it asked."""
    import subprocess
    import uuid
    assert not isolate._is_shmem_fs(str(tmp_path)) and isolate._is_shmem_fs("/dev/shm"), \
        "this needs a temporary folder on disk and a tmpfs at /dev/shm"
    real = isolate._is_shmem_fs
    monkeypatch.setattr(isolate, "_is_shmem_fs", lambda path: "/map_files/" not in path and real(path))
    name = f"/dev/shm/fuselab-test-{uuid.uuid4().hex}"
    child = subprocess.Popen([sys.executable, "-c", RENAMED_MAPPING, name, str(tmp_path)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "mapped"
        assert os.path.islink(name + " (deleted)")
        assert isolate.shmem_bytes([child.pid]) >= 8 * 2**20
    finally:
        child.kill()
        child.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name + " (deleted)")


def test_an_object_mapped_many_times_is_sized_once_a_scan(monkeypatch):
    """A CUDA process maps each of the driver's device files hundreds of times. The memory count sizes a mapped
    object once a scan, whichever mapping shows it: a memory file mapped 200 times costs the scan as many stats of
    its magic links as one mapping does, and counts once."""
    import mmap
    if os.geteuid() != 0:
        pytest.skip("map_files, which sizes a mapping by its object, is root's")
    real_stat, asked = os.stat, []

    def stat(path, *args, **kwargs):
        if isinstance(path, str) and "/map_files/" in path:
            asked.append(path)
        return real_stat(path, *args, **kwargs)

    fd = os.memfd_create("fuselab-test-many")
    key = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
    os.ftruncate(fd, 2**20)
    os.pwrite(fd, b"x" * 2**20, 0)
    mapped = [mmap.mmap(fd, 2**20)]
    here = [os.getpid()]
    try:
        monkeypatch.setattr(os, "stat", stat)
        isolate.shmem_bytes(here)
        stats_for_one = len(asked)
        mapped += [mmap.mmap(fd, 2**20) for _ in range(199)]
        asked.clear()
        whole = isolate.shmem_bytes(here)
        assert len(asked) == stats_for_one, "each mapping of the object was sized again"
        assert whole - isolate.shmem_bytes(here, counted_elsewhere={key}) == 2**20
    finally:
        for each in mapped:
            each.close()
        os.close(fd)


HELD_ENDS = textwrap.dedent(r'''
    import os, sys, time
    read_end, write_end = os.pipe()
    os.write(write_end, b"x" * 1000)
    os.mkfifo(sys.argv[1])
    fifo = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
    null = os.open("/dev/null", os.O_RDONLY)
    print("holding", flush=True)
    time.sleep(30)
''')


def test_a_held_pipe_is_opened_only_through_the_graders_own_descriptor(tmp_path, monkeypatch):
    """The process may swap a descriptor between the count's look at it and its open: nothing it holds is opened
    through ``/proc/PID/fd`` (only taken with ``O_PATH``, checked, then opened through ``/proc/self/fd``)."""
    import subprocess
    opened = []
    real_open = os.open

    def recording(path, flags, *args, **kwargs):
        opened.append((str(path), flags))
        return real_open(path, flags, *args, **kwargs)

    child = subprocess.Popen([sys.executable, "-c", HELD_ENDS, str(tmp_path / "fifo")], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "holding"
        monkeypatch.setattr(isolate.os, "open", recording)
        assert isolate.pipe_bytes([child.pid]) >= 4096  # the pipe holding 1000 bytes: counted, once
    finally:
        monkeypatch.undo()
        child.kill()
        child.wait()
    theirs = [(path, flags) for path, flags in opened if path.startswith(f"/proc/{child.pid}/")]
    assert theirs and all(flags & os.O_PATH for _, flags in theirs), opened
    assert all(path.startswith("/proc/self/fd/") for path, flags in opened if not flags & os.O_PATH), opened


# --- processes ----------------------------------------------------------------------------------------------------

FORK_BOMB = textwrap.dedent(r'''
    import os, sys, time
    # never a bomb before the test saw the tree in a pids group with its limit (it writes "go"): the test must not
    # take the machine down where the group is missing
    for _ in range(1000):
        if os.path.exists("go"):
            break
        time.sleep(0.01)
    else:
        print("no pids group", flush=True)
        sys.exit(3)
    while True:
        try:
            os.fork()  # parent and child fork on, as fast as they can
        except OSError:
            try:
                os.close(os.open("refused", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except OSError:
                pass
            time.sleep(0.01)
''')


def _pids_group_or_fail():
    if cgroup.PidsGroup.make(10) is None:  # made and at once removed: only whether one can be had
        if os.environ.get("FUSELAB_CI") == "1":
            pytest.fail("CI runs as root with the kernel's pids cgroup: the grader must be able to make one")
        pytest.skip("no pids cgroup for this user here (the watchdog's sample is the fallback)")
    for folder in list(cgroup._made):
        folder.rmdir()
        cgroup._made.discard(folder)


@pytest.mark.parametrize("sandboxed", [False, True], ids=["keeper", "sandbox"])
def test_a_fork_bomb_is_stopped_by_the_kernel_at_the_process_limit(tmp_path, sandboxed):
    """A fork bomb (every process forks again at once) under a limit of 30 processes: the kernel refuses the
    forks past it (``pids.max``), the tree is stopped for its processes, and its group is removed after."""
    _pids_group_or_fail()
    if sandboxed:
        _sandbox_or_fail()
    own = tmp_path / "own"
    own.mkdir()
    limits = isolate.Limits(wall_s=60, memory_bytes=None, processes=30)
    command = [sys.executable, "-c", FORK_BOMB]
    child = isolate.Child(isolate.sandboxed(command, own=[own], hide=[]) if sandboxed else command, limits=limits,
                          cwd=str(own))
    group = child.pids
    assert group is not None and group.holds(child.process.pid)
    assert int((group.folder / "pids.max").read_text()) == 30
    (own / "go").touch()
    outcome = child.wait()
    assert "no pids group" not in outcome.stdout, outcome
    assert (own / "refused").exists(), outcome  # the kernel refused a fork
    assert outcome.limit and "processes" in outcome.limit and not outcome.timed_out, outcome
    assert not group.folder.exists()


def test_a_child_cannot_pin_its_threads_to_fewer_cpus(tmp_path):
    """Threads pinned to one CPU keep each other waiting for it, and waiting for a CPU is no test's own time: a loop
    so pinned would run past its own limit to the wall-clock backstop, and be retried alone. Inside the sandbox
    the call does nothing (and says it succeeded: OpenMP's thread binding aborts on an error); asking for the
    CPUs it may use still works, and so does OpenMP's binding."""
    _sandbox_or_fail()
    script = ("import json, os\ncpus = sorted(os.sched_getaffinity(0))\ntry:\n    os.sched_setaffinity(0, cpus[:1])\n"
              "    said = 'pinned'\nexcept OSError as exc:\n    said = exc.errno\n"
              "print(json.dumps({'cpus': len(cpus), 'said': said, 'after': len(os.sched_getaffinity(0))}))")
    report = _report(_run(tmp_path, script))
    assert report["said"] == "pinned" and report["after"] == report["cpus"] >= 1, report
    # set inside: the sandbox passes only the variables a worker reads; libgomp reads them as torch loads it
    bound = ("import os\nos.environ.update(OMP_PROC_BIND='true', OMP_NUM_THREADS='2')\nimport torch\n"
             "print(float((torch.ones(256, 256) @ torch.ones(256, 256)).sum()))")
    outcome = _run(tmp_path, bound)
    assert outcome.returncode == 0 and "16777216.0" in outcome.stdout, outcome
