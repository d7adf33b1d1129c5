"""The sandbox as it is used: the check runs what grading runs (as root and as a plain user the test creates), a
sandbox that fails mid-run grades nothing, the limits a submission meets inside (memory in its private tmpfs,
processes, disk), no secret of the grader's inside, native code that makes raw system calls stays inside, and no
orphan outlives grading without the sandbox. Small limits throughout: this runs on small CI machines."""

import base64
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from fuselab.grading.sandbox import isolate
from fuselab.grading.run import pipeline
from fuselab.grading.recheck import clean as recheck

from .conftest import REPO


def _sandbox_or_fail():
    problem = isolate.sandbox_problem()
    assert problem is None, f"the sandbox must work here (CI installs bubblewrap and runs as root): {problem}"


def _cell(source, grade_id=None, points=0):
    meta = {"nbgrader": {"grade_id": grade_id, "grade": bool(points), "solution": False, "locked": True,
                         "schema_version": 3, **({"points": points} if points else {})}} if grade_id else {}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [], "execution_count": None}


def _notebook(*cells):
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": list(cells)}


# --- the check is the use ----------------------------------------------------------------------------------------

def test_the_check_runs_the_graded_builder_with_the_runs_limits(tmp_path, monkeypatch):
    """No probe path of its own: the check's command comes from ``isolate.sandboxed`` and runs in ``isolate.Child``
    with ``pipeline._limits`` (what the recheck runs), so the two cannot diverge."""
    settings = pipeline.Settings(out=tmp_path / "out", memory_bytes=3 * 2**30, submission_timeout=77)
    built, started = [], []
    real_sandboxed, real_child = isolate.sandboxed, isolate.Child

    def sandboxed(*args, **kwargs):
        built.append(args)
        return real_sandboxed(*args, **kwargs)

    class Child(real_child):
        def __init__(self, command, **kwargs):
            started.append((command, kwargs["limits"]))
            super().__init__(command, **kwargs)

    monkeypatch.setattr(isolate, "sandboxed", sandboxed)
    monkeypatch.setattr(isolate, "Child", Child)
    monkeypatch.setenv("FUSELAB_TOKEN", "tok3n")
    pipeline.check_sandbox(settings)
    assert len(built) == 1 and len(started) == 1
    command, limits = started[0]
    assert isinstance(command, isolate.SandboxCommand)
    expected = pipeline._limits(settings)
    assert limits.memory_bytes == expected.memory_bytes and limits.no_network and limits.processes
    assert limits.cpu_s == expected.cpu_s and limits.disk_bytes == expected.disk_bytes


def test_a_sandboxed_child_makes_no_namespace_before_bubblewrap(tmp_path, monkeypatch):
    """With the recheck's limits (no network), the keeper of a sandboxed command unshares nothing (bubblewrap's
    own --unshare-net does it): a namespace made first leaves a plain user's bubblewrap unable to make its own."""
    _sandbox_or_fail()
    seen = []
    real_popen = subprocess.Popen

    def popen(args, **kwargs):
        seen.append(list(args))
        return real_popen(args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    limits = pipeline._limits(pipeline.Settings(out=tmp_path))
    command = isolate.sandboxed(["/bin/sh", "-c", "cat /proc/net/dev"], own=[tmp_path / "own"], hide=[])
    outcome = isolate.Child(command, limits=limits).wait()
    assert outcome.ok, outcome.stderr
    keeper = next(a for a in seen if str(isolate.KEEPER) in a)
    assert keeper[keeper.index(str(isolate.KEEPER)) + 1] == "--"  # no --net, no --pid
    assert "eth" not in outcome.stdout and "lo:" in outcome.stdout  # and the network is still only loopback
    plain = isolate.Child(["/bin/true"], limits=limits)
    plain.wait()
    keeper = seen[-1]
    assert {"--net", "--pid"} <= set(keeper[:keeper.index("--")])  # outside the sandbox the keeper makes them


def test_a_sandbox_that_fails_to_start_for_a_submission_grades_nothing(tmp_path, monkeypatch):
    """A sandbox that stops starting mid-run (here: bubblewrap that fails) gives no verdict at all, never zeros
    "earned" by the student; the pipeline saves nothing, so the next run grades the submission."""
    monkeypatch.setattr(isolate, "bubblewrap", lambda: "/bin/false")
    command = isolate.sandboxed([sys.executable, "-c", "print('graded')"], own=[tmp_path / "own"], hide=[])
    with pytest.raises(isolate.SandboxFailed, match="not graded"):
        isolate.Child(command, limits=isolate.Limits(wall_s=30)).wait()
    nb = _notebook(_cell("assert 1 + 1 == 2", "test_sum", points=1))
    with pytest.raises(isolate.SandboxFailed):
        recheck.run_clean(nb, nb, tmp_path / "work", cell_timeout=30, total_timeout=60, sandbox=True, hide=[],
                          limits=isolate.Limits(wall_s=60, memory_bytes=2**30))
    assert "bwrap" not in json.dumps(os.listdir(tmp_path / "work"))  # nothing that reads as a verdict
    # a worker whose sandbox failed by itself is not hidden by the grader stopping it afterwards
    worker = isolate.Child(command, limits=isolate.Limits(wall_s=30))
    worker.process.wait()
    worker.stop(timed_out=False)
    with pytest.raises(isolate.SandboxFailed):
        worker.wait()
    # the pipeline: the submission is not graded, nothing is saved for it (the next run grades it)
    from fuselab.grading.records import intake
    notebook = tmp_path / "lab0.ipynb"
    notebook.write_text(json.dumps(nb))
    sub = intake.Submission("alice", "lab0", notebook, "alice/lab0.ipynb")
    settings = pipeline.Settings(out=tmp_path / "out", shared_builds=tmp_path / "builds", submission_timeout=60)
    with pytest.raises(isolate.SandboxFailed, match="not graded"):
        pipeline.grade_submission(sub, None, settings, tmp_path)
    assert not (tmp_path / "out" / "work" / "alice" / "lab0" / "result.json").exists()
    # a child we stopped ourselves before its sandbox started is not a failed sandbox
    child = isolate.Child(isolate.SandboxCommand(["/bin/sleep", "30"], own=[], private=[]),
                          limits=isolate.Limits(wall_s=30))
    child.stop(timed_out=False)
    assert child.wait().returncode != 0


# --- a plain-user grader --------------------------------------------------------------------------------------------

PLAIN_USER = "fuselab-ci-grader"


def _plain_user() -> str:
    assert os.geteuid() == 0, "these tests create a user: run them as root (CI does)"
    try:
        pwd.getpwnam(PLAIN_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PLAIN_USER],
                       check=True)
    return PLAIN_USER


def _reachable(work: Path) -> list:
    """The shell lines that make this Python and the checkout reachable for ``user`` (run as root in a private
    mount namespace): a folder on their path that others may not enter (a Python under /root) is covered by an
    open tmpfs with just the needed entries bound back. Nothing changes for the rest of the machine."""
    lines = []
    for needed in dict.fromkeys([sys.base_prefix, sys.prefix, os.path.realpath(sys.executable), str(REPO),
                                 os.path.realpath(sys.prefix)]):
        path = Path(needed)
        closed = next((p for p in reversed(path.parents) if p != Path("/") and not os.stat(p).st_mode & 0o001),
                      None)
        if closed is None or any(f"tmpfs {closed}" in line for line in lines):
            continue
        child = path.relative_to(closed).parts[0]
        stash = tempfile.mkdtemp(prefix="stash-", dir=work)
        lines += [f"mount --bind {closed} {stash}", f"mount -t tmpfs -o mode=755 tmpfs {closed}",
                  f"mkdir -p {closed}/{child}", f"mount --bind {stash}/{child} {closed}/{child}",
                  f"umount -l {stash}"]
    return lines


@contextlib.contextmanager
def _user_folder():
    """A folder of the plain user's own, where it can reach it (pytest's are the root's only)."""
    work = Path(tempfile.mkdtemp(prefix="fuselab-plain-user-"))
    os.chmod(work, 0o755)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _as_plain_user(script: str, work: Path, *, wrap=()) -> subprocess.CompletedProcess:
    user = _plain_user()
    info = pwd.getpwnam(user)
    shutil.chown(work, info.pw_uid, info.pw_gid)
    (work / "script.py").write_text(script)
    os.chmod(work / "script.py", 0o644)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1",
           "HOME": str(work), "FUSELAB_CACHE_DIR": str(work / "cache"),
           "TORCH_EXTENSIONS_DIR": str(work / "torch_extensions"), "LANG": "C.UTF-8"}
    run = ["runuser", "-u", user, "--", *wrap, sys.executable, str(work / "script.py"), str(work)]
    shell = "\n".join([*_reachable(work), 'exec "$@"'])
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", shell, "sh", *run],
                          capture_output=True, text=True, env=env, cwd=work, timeout=500)


PLAIN_GRADING = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    from fuselab.grading.sandbox import isolate
    from fuselab.grading.run import pipeline
    from fuselab.grading.recheck import clean as recheck
    work = Path(sys.argv[1])
    settings = pipeline.Settings(out=work / "out", memory_bytes=2 * 2**30, submission_timeout=240,
                                 shared_builds=work / "shared")
    report = {"uid": os.getuid()}
    try:
        pipeline.check_sandbox(settings)
        report["refused"] = None
    except pipeline.GradingRefused as exc:
        report["refused"] = str(exc)
    if report["refused"] is None:
        # a small grading, the way the pipeline runs it: the instructor's notebook in the sandboxed checker, the
        # submission's code in its sandboxed workers, the pipeline's limits and environment
        submission = json.loads((work / "submission.ipynb").read_text())
        limits = pipeline._limits(settings)
        env = pipeline._base_env(settings, work / "clean", None)
        clean = recheck.run_clean(submission, submission, work / "clean", cell_timeout=120, total_timeout=240,
                                  limits=limits, env=env, sandbox=True, hide=[work / "class"])
        report["cells"] = {k: [v.points, v.max_points, v.status, v.message] for k, v in clean.cells.items()}
        # the limits hold for a plain user too: its sandbox's tmpfs is counted (read through /proc/PID/root)
        fill = "open('/dev/shm/fill', 'wb').write(b'x' * 120 * 2**20); import time; time.sleep(60)"
        command = isolate.sandboxed([sys.executable, "-c", fill], own=[work / "fill"], hide=[])
        filled = isolate.Child(command, limits=isolate.Limits(wall_s=60, memory_bytes=100 * 2**20)).wait()
        report["tmpfs_counted"] = filled.out_of_memory and not filled.timed_out
        # outside the sandbox, a PID namespace of its own for each graded process: no orphans (the attack of
        # test_no_orphan_outlives_its_child_without_the_sandbox, as this user)
        report["pid_namespace"] = isolate.namespaces_available()
        tag = f"fuselab-plain-orphan-{os.getpid()}"
        isolate.Child([sys.executable, "-c", (work / "orphan.py").read_text(), tag],
                      limits=isolate.Limits(wall_s=60, memory_bytes=None)).wait()
        import signal, time
        time.sleep(1)
        report["orphans"] = []
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                if open(f"/proc/{p}/cmdline", "rb").read().split(bytes(1))[0] == tag.encode():
                    report["orphans"].append(int(p))
            except OSError:
                continue
        for pid in report["orphans"]:
            os.kill(pid, signal.SIGKILL)
    print(json.dumps(report))
''')


def _submission(work: Path) -> None:
    (work / "orphan.py").write_text(ORPHAN)
    nb = _notebook(
        _cell("import os\nVALUE = 41", "setup"),
        _cell("assert VALUE + 1 == 42", "test_sum", points=2),
        _cell("import os\nassert os.getuid() != 0 and os.access(os.environ['HOME'], os.W_OK)", "test_inside",
              points=1),
        _cell("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    raise SystemExit"
              "('network reached')\nexcept OSError:\n    pass", "test_no_network", points=1))
    (work / "class").mkdir()
    (work / "submission.ipynb").write_text(json.dumps(nb))


def test_a_plain_user_grader_checks_and_grades_in_the_sandbox(tmp_path):
    """As a user other than root (created here), the check passes where the kernel allows unprivileged user
    namespaces, and a grading under the run's limits (no network) gives the points the notebook earns."""
    with _user_folder() as work:
        _submission(work)
        done = _as_plain_user(PLAIN_GRADING, work)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["uid"] == pwd.getpwnam(PLAIN_USER).pw_uid
    assert report["refused"] is None
    assert {k: v[0] for k, v in report["cells"].items()} == {"test_sum": 2, "test_inside": 1,
                                                             "test_no_network": 1}, report["cells"]
    assert report["tmpfs_counted"] and report["pid_namespace"] and report["orphans"] == [], report


def test_a_plain_user_whose_kernel_refuses_user_namespaces_is_refused_clearly(tmp_path):
    """Where bubblewrap cannot make a user namespace (simulated: the grader runs in a user namespace that maps
    nobody, so the kernel refuses it a new one, with the message it gives when unprivileged user namespaces are
    off), grading is refused before anything runs, saying why and what to do."""
    with _user_folder() as work:
        _submission(work)
        done = _as_plain_user(PLAIN_GRADING, work, wrap=["unshare", "--user"])
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["refused"] and "nothing was graded" in report["refused"]
    assert "namespace" in report["refused"] and "--no-sandbox" in report["refused"]
    assert "cells" not in report


# --- resources --------------------------------------------------------------------------------------------------

def _sandboxed_run(tmp_path, script, limits, *args):
    own = tmp_path / "own"
    command = isolate.sandboxed([sys.executable, "-c", script, *args], own=[own], hide=[])
    return isolate.Child(command, limits=limits, cwd=str(own)).wait()


FILL_TMPFS = textwrap.dedent('''
    import sys, time
    chunk = b"x" * 2**20
    for folder in sys.argv[1:]:
        with open(folder + "/fill", "wb") as handle:
            for _ in range(100):
                handle.write(chunk)
        print("filled", folder, flush=True)
    time.sleep(60)
''')


def test_what_the_private_tmpfs_holds_counts_as_memory(tmp_path):
    """/tmp and /dev/shm hold memory no process's resident size shows: 200 MiB there under a 160 MiB limit is
    stopped (at scale: 3 GiB under --memory-gb 2)."""
    _sandbox_or_fail()
    outcome = _sandboxed_run(tmp_path, FILL_TMPFS, isolate.Limits(wall_s=60, memory_bytes=160 * 2**20),
                             "/tmp", "/dev/shm")
    assert outcome.out_of_memory and not outcome.timed_out, outcome
    assert "memory" in outcome.describe() and "/tmp" in outcome.describe()


def test_each_private_tmpfs_is_capped(tmp_path, monkeypatch):
    """Each of /tmp, /var/tmp and /dev/shm is a bounded tmpfs: writing past its size fails inside (between two
    looks of the watchdog nothing can grow past it)."""
    _sandbox_or_fail()
    monkeypatch.setattr(isolate, "TMPFS_BYTES", 32 * 2**20)
    script = textwrap.dedent('''
        import sys
        try:
            with open("/var/tmp/fill", "wb") as handle:
                for _ in range(64):
                    handle.write(b"x" * 2**20)
                    handle.flush()
            print("not capped")
        except OSError as exc:
            print("capped", exc.errno)
    ''')
    outcome = _sandboxed_run(tmp_path, script, isolate.Limits(wall_s=60, memory_bytes=None))
    assert "capped 28" in outcome.stdout, outcome  # ENOSPC


SPAWN = textwrap.dedent('''
    import subprocess, sys, time
    started = []
    for n in range(200):
        started.append(subprocess.Popen(["sleep", "60"]))
        print(n, flush=True)
        time.sleep(0.01)  # 2 s for all: the watchdog looks twice a second (an idle machine forks 200 in less)
    time.sleep(60)
''')


def test_a_submission_starting_200_processes_is_stopped(tmp_path):
    """The limit is per child (its tree), not per uid: every sandbox shares one uid when grading as root."""
    _sandbox_or_fail()
    outcome = _sandboxed_run(tmp_path, SPAWN, isolate.Limits(wall_s=60, memory_bytes=None, processes=40))
    assert outcome.limit and "processes" in outcome.limit and not outcome.timed_out, outcome
    assert "199" not in outcome.stdout.split()
    unsandboxed = isolate.Child([sys.executable, "-c", SPAWN],
                                limits=isolate.Limits(wall_s=60, memory_bytes=None, processes=40)).wait()
    assert unsandboxed.limit and "processes" in unsandboxed.limit


THREADS = textwrap.dedent('''
    import threading, time
    stop = threading.Event()
    for n in range(600):
        threading.Thread(target=stop.wait, daemon=True).start()
        if n % 10 == 0:
            print(n, flush=True)
            time.sleep(0.05)  # 3 s for all: the watchdog looks twice a second
    print("all 600 started", flush=True)
    time.sleep(60)
''')


@pytest.mark.parametrize("pids_group", [True, False], ids=["kernel", "watchdog"])
def test_a_submission_starting_600_threads_is_stopped(tmp_path, monkeypatch, pids_group):
    """Threads take the host's PIDs as processes do, and /proc lists processes only: 600 waiting threads in one
    process got past a count of processes (an attack pass found it). With a pids cgroup the kernel refuses the
    101st; without one (a machine that gives the grader none) the watchdog's count of threads stops the tree."""
    _sandbox_or_fail()
    if not pids_group:
        from fuselab.grading.sandbox import cgroup
        monkeypatch.setattr(cgroup.PidsGroup, "make", classmethod(lambda cls, limit: None))
    outcome = _sandboxed_run(tmp_path, THREADS, isolate.Limits(wall_s=60, memory_bytes=None, processes=100))
    assert outcome.limit and "threads" in outcome.limit and not outcome.timed_out, outcome
    assert "all 600 started" not in outcome.stdout


DISK_HOG = textwrap.dedent('''
    import os, time
    chunk = b"x" * 2**20
    for n in range(400):
        with open(f"hog-{n}", "wb") as handle:
            handle.write(chunk)
        time.sleep(0.01)
    print("wrote it all", flush=True)
    time.sleep(60)
''')


def test_a_disk_hog_is_stopped_at_the_budget(tmp_path):
    _sandbox_or_fail()
    outcome = _sandboxed_run(tmp_path, DISK_HOG, isolate.Limits(wall_s=60, memory_bytes=None,
                                                                disk_bytes=50 * 2**20))
    assert outcome.limit and "disk budget" in outcome.limit and not outcome.timed_out, outcome
    assert isolate.folders_bytes([tmp_path / "own"], 10**12) < 400 * 2**20


def test_a_tree_of_many_files_counts_as_over_the_budget(tmp_path):
    for n in range(50):
        (tmp_path / f"f{n}").touch()
    (tmp_path / "link").symlink_to("/usr")  # never followed
    assert isolate.folders_bytes([tmp_path], 10**9, max_entries=40) > 10**9
    assert isolate.folders_bytes([tmp_path], 10**9) < 10**6
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "big").write_bytes(b"x" * 2**20)
    hidden.chmod(0)
    try:
        if os.geteuid() == 0:  # root reads it anyway; a plain user's grader counts a hidden folder as over
            assert isolate.folders_bytes([tmp_path], 2**19) > 2**19
        else:
            assert isolate.folders_bytes([tmp_path], 10**9) > 10**9
    finally:
        hidden.chmod(0o755)


SWAPPER = textwrap.dedent('''
    import os, sys, time
    live, outside = sys.argv[1], sys.argv[2]
    stop = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < stop:  # the folder "a" for a link to a folder outside, and back
        os.rename(os.path.join(live, "a"), os.path.join(live, "a-real"))
        os.symlink(outside, os.path.join(live, "a"))
        os.unlink(os.path.join(live, "a"))
        os.rename(os.path.join(live, "a-real"), os.path.join(live, "a"))
''')


def test_a_folder_swapped_for_a_link_mid_walk_is_never_followed(tmp_path):
    """A sandbox swaps a folder of its own for a link to a folder outside while the grader walks its folders for
    the disk budget, again and again: no walk counts what is outside (a walk by path followed it about once in
    300 walks, into ``/usr/share``; here into a folder holding 32 MiB)."""
    live, outside = tmp_path / "live", tmp_path / "outside"
    (live / "a" / "b").mkdir(parents=True)
    (live / "a" / "b" / "small").write_bytes(b"x" * 4096)
    (outside / "b").mkdir(parents=True)
    big = outside / "b" / "big"
    with open(big, "wb") as handle:
        for _ in range(32):
            handle.write(os.urandom(2**20))
    assert isolate.folders_bytes([outside], 10**12) >= 32 * 2**20
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(live), str(outside), "6"])
    try:
        walks, most = 0, 0
        started = time.monotonic()
        while time.monotonic() - started < 5 and swapper.poll() is None:
            most = max(most, isolate.folders_bytes([live], 10**12))
            walks += 1
    finally:
        swapper.kill()
        swapper.wait()
    assert walks > 200, walks
    assert most < 2**20, f"a walk counted {most} bytes: it followed the link out of the folder"


# --- secrets ----------------------------------------------------------------------------------------------------

SECRETS = {"FUSELAB_TOKEN": "q7Zk2", "CUDA_API_KEY": "Wm4xR9", "TA_PASSWORD": "p4ssW0d", "GITHUB_TOKEN": "gh8Tq2Lx",
           "FUSELAB_GRADING_KEY": "k3yK3Y"}

# what the files it can read hold first, then the environments: the grader keeps only the tail of a child's output
# (``isolate.OUTPUT_TAIL_BYTES``), and the environments must all be in it. The marker between them is made at run
# time, so that the program's own text (its /proc/PID/cmdline) does not hold it.
DUMP = textwrap.dedent('''
    import glob, os, sys
    found = []
    for folder in (os.environ.get("HOME", "/"), "/tmp", "/dev/shm"):
        for path in glob.glob(folder + "/**", recursive=True):
            try:
                found.append(open(path, "rb").read(1 << 20))
            except OSError:
                pass
    found.append(b"=" * 5 + b"ENVIRONMENTS" + b"=" * 5)  # above: what files it could read; below: environments
    found.append(repr(dict(os.environ)).encode())
    for pattern in ("/proc/*/environ", "/proc/*/cmdline", "/proc/self/auxv"):
        for path in glob.glob(pattern):
            try:
                found.append(open(path, "rb").read())
            except OSError:
                pass
    sys.stdout.buffer.write(b"\\n".join(found))
''')
ENVIRONMENTS = b"=====ENVIRONMENTS====="


def _encodings(secret: str) -> list:
    raw = secret.encode()
    return [raw, raw[::-1], base64.b64encode(raw), raw.hex().encode(), " ".join(secret).encode(),
            secret.encode("utf-16-le")]


def test_no_secret_of_the_graders_environment_is_inside_the_sandbox(tmp_path, monkeypatch):
    """Short secrets (3-8 characters, which no scrub of feedback can match) in the grader's environment, under
    names a prefix allow-list would pass: nothing of them inside, in any encoding, whatever the submission reads;
    nor in a graded child's environment outside the sandbox."""
    _sandbox_or_fail()
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    settings = pipeline.Settings(out=tmp_path / "out", shared_builds=tmp_path / "shared")
    env = pipeline._base_env(settings, tmp_path / "work", None)
    assert not set(SECRETS) & set(env)
    own = tmp_path / "own"
    command = isolate.sandboxed([sys.executable, "-c", DUMP], own=[own], hide=[])
    outcome = isolate.Child(command, limits=pipeline._limits(settings), env=dict(os.environ), cwd=str(own))
    result = outcome.wait()
    assert result.ok and len(result.stdout) > 1000, result.stderr
    inside = result.stdout.encode("utf-8", "surrogateescape")
    assert inside.count(ENVIRONMENTS) == 1, "the environments are not all in the output's tail"
    environments = inside.split(ENVIRONMENTS)[1]
    assert b"PATH=" in environments  # what it read of them is there
    for name, value in SECRETS.items():
        for encoded in _encodings(value):
            assert encoded not in inside, f"{name} reached the sandbox ({encoded!r})"
        # a name may stand in the course's own files it can read (this test, isolate.py's comments): never in an
        # environment
        assert name.encode() not in environments, f"{name} is set inside the sandbox"


def test_a_compiler_the_grader_names_outside_the_sandbox_never_breaks_a_build_inside(tmp_path, monkeypatch):
    """The grader's own compiler settings (CXX, CC, CUDAHOSTCXX, NVCC flags) name programs of its machine that the
    sandbox need not show: on the H200 machine CXX named such a compiler, and every build inside the sandbox failed
    ("not found"), so every kernel test of every submission scored 0. A build inside finds its compiler as a
    student's does."""
    _sandbox_or_fail()
    hidden = tmp_path / "toolchain"  # a folder the sandbox does not show
    hidden.mkdir()
    for name in ("g++", "gcc"):
        wrapper = hidden / name
        wrapper.write_text(f"#!/bin/sh\nexec {shutil.which(name)} \"$@\"\n")
        wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(hidden / "g++"))
    monkeypatch.setenv("CC", str(hidden / "gcc"))
    monkeypatch.setenv("CUDAHOSTCXX", str(hidden / "g++"))
    monkeypatch.setenv("NVCC_PREPEND_FLAGS", f"-ccbin {hidden / 'g++'}")
    settings = pipeline.Settings(out=tmp_path / "out", shared_builds=tmp_path / "shared")
    own = tmp_path / "own"
    env = pipeline._base_env(settings, own, None)
    assert not {"CXX", "CC", "CUDAHOSTCXX", "NVCC_PREPEND_FLAGS"} & set(env)
    env = dict(os.environ, FUSELAB_CACHE_DIR=str(own / "cache"), FUSELAB_BACKEND="emulate",
               PYTHONPATH=str(REPO))
    build = ("import fuselab\n"
             "src = '__global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\\n'"
             " 'void launch(float* x, cudaStream_t s) { k<<<1, 4, 0, s>>>(x); }\\n'\n"
             "mod = fuselab.build(src, ['void launch(float* x /*[4]*/, cudaStream_t s)'], name='cxx_probe')\n"
             "print('built', mod.backend)\n")
    command = isolate.sandboxed([sys.executable, "-c", build], own=[own], hide=[])
    result = isolate.Child(command, limits=pipeline._limits(settings), env=env, cwd=str(own)).wait()
    assert result.ok and "built" in result.stdout, (result.stdout + result.stderr)[-2000:]


# --- native code --------------------------------------------------------------------------------------------------

RAW_SYSCALLS = textwrap.dedent('''
    # what native code can do in the kernel worker, whatever the filter of its imports saw: raw system calls
    # (here through libc's syscall(), as machine code copied into executable memory would make them)
    import ctypes, json, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    SYS_openat, SYS_write, SYS_kill, SYS_getuid, SYS_symlinkat = 257, 1, 62, 102, 266
    AT_FDCWD = -100
    target = json.loads(sys.argv[1])
    seen = {"uid": libc.syscall(SYS_getuid)}
    for name, path in target["write"].items():
        fd = libc.syscall(SYS_openat, AT_FDCWD, path.encode(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        seen[name] = "written" if fd >= 0 and libc.syscall(SYS_write, fd, b"pwned", 5) == 5 else "refused"
    for name, path in target["read"].items():
        fd = libc.syscall(SYS_openat, AT_FDCWD, path.encode(), os.O_RDONLY, 0)
        seen[name] = "read" if fd >= 0 else "refused"
    seen["link"] = libc.syscall(SYS_symlinkat, target["write"]["checker_events"].encode(), AT_FDCWD,
                                b"output-1.txt")
    seen["kill_grader"] = libc.syscall(SYS_kill, target["grader"], 9)
    seen["kill_everyone"] = libc.syscall(SYS_kill, -1, 9) if target["kill_all"] else None
    print(json.dumps(seen), flush=True)
''')


def test_native_code_making_raw_system_calls_stays_in_the_kernel_workers_sandbox(tmp_path):
    """The kernel worker is contained by the sandbox alone (a static filter of imports cannot see machine code
    made at run time): what raw system calls do there reaches no grade, no other student and not the host."""
    _sandbox_or_fail()
    out = tmp_path / "out"
    workdir = out / "work" / "alice" / "lab0" / "clean"
    folder = workdir / "kernel-process"
    folder.mkdir(parents=True)
    events = workdir / "clean-events-0.jsonl"
    events.write_text('{"event": "done"}\n')
    result = out / "work" / "alice" / "lab0" / "result.json"
    result.write_text("{}")
    other = out / "work" / "bob" / "lab0" / "result.json"
    other.parent.mkdir(parents=True)
    other.write_text('{"total": 7}')
    shared = out / "shared-builds" / "builds" / "lab0.so"
    shared.parent.mkdir(parents=True)
    shared.write_bytes(b"\x7fELF instructor")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    host_file = Path("/var/tmp") / f"fuselab-raw-{os.getpid()}"
    target = {"write": {"checker_events": str(events), "result": str(result), "other_student": str(other),
                        "shared_build": str(shared), "host": str(host_file)},
              "read": {"other_student_read": str(other), "solutions": str(next((REPO / "solutions" / "lab0").glob("*.ipynb")))},
              "grader": os.getpid(), "kill_all": True}
    try:
        # the kernel worker's sandbox, as the recheck builds it
        command = isolate.sandboxed([sys.executable, "-c", RAW_SYSCALLS, json.dumps(target)], own=[folder],
                                    hide=[out, workdir], readonly=[str(shared.parent)])
        outcome = isolate.Child(command, limits=isolate.Limits(wall_s=60, memory_bytes=None)).wait()
        seen = json.loads(outcome.stdout.strip().splitlines()[0])
        assert seen["uid"] != 0
        # writes land, at most, in the sandbox's throwaway folders: every real file below is unchanged
        assert seen["other_student_read"] == "refused" and seen["solutions"] == "refused", seen
        assert seen["kill_grader"] == -1  # not even visible from inside
        assert bystander.poll() is None  # kill(-1) reached only the sandbox's own processes
        assert events.read_text() == '{"event": "done"}\n' and result.read_text() == "{}"
        assert other.read_text() == '{"total": 7}' and shared.read_bytes() == b"\x7fELF instructor"
        assert not host_file.exists()
        assert not (folder / "output-1.txt").is_symlink() or os.readlink(folder / "output-1.txt") == str(events)
    finally:
        bystander.kill()
        host_file.unlink(missing_ok=True)


def test_kernel_source_that_maps_or_protects_memory_itself_is_flagged_for_the_ta():
    """Not refused (the emulation's own runtime imports mmap/mprotect, and protection flags are values at run
    time), but the TA sees it: the sandbox is what contains it."""
    from fuselab.grading.recheck.sanitize import sanitize_cell
    attack = ("FUSED_SOURCE = r\'\'\'\n#include <cstring>\nstatic const unsigned char code[] = {0x0f, 0x05, 0xc3};\n"
              "extern \"C\" void* mmap(void*, unsigned long, int, int, int, long);\n"
              "static int run = [] { void* p = mmap(0, 4096, 7, 0x22, -1, 0); memcpy(p, code, 3); "
              "return ((int(*)())p)(); }();\n\'\'\'\n")
    flags = sanitize_cell(attack).flags
    assert any("`mmap`" in f and "sandbox" in f for f in flags), flags
    honest = "FUSED_SOURCE = r\'\'\'__global__ void k(float* x) { x[0] = 1.0f; }\'\'\'\n"
    assert sanitize_cell(honest).flags == []


# --- no orphans without the sandbox -----------------------------------------------------------------------------------

ORPHAN = textwrap.dedent('''
    import os, signal, sys, time
    tag = sys.argv[1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            # no marker variable, a new session, a name of its own
            os.execve("/bin/sleep", [tag, "300"], {})
        os._exit(0)
    time.sleep(0.5)
    # kill the keeper, and everything else it can name that is not itself
    for victim in (os.getppid(), 1):
        try:
            os.kill(victim, signal.SIGKILL)
        except OSError:
            pass
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if b"keeper.py" in open(f"/proc/{entry}/cmdline", "rb").read():
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
    print("planted", flush=True)
''')


def _running(tag: str) -> list:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().split(b"\0")[0] == tag.encode():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_no_orphan_outlives_its_child_without_the_sandbox(tmp_path):
    """``--no-sandbox``: a double fork, setsid, execve with an empty environment (no marker to find it by) and the
    keeper killed: the command still runs in a PID namespace of its own, and nothing of it outlives the child."""
    assert isolate.namespaces_available(), "root (as CI runs) can always make a PID namespace"
    tag = f"fuselab-orphan-{os.getpid()}"
    try:
        outcome = isolate.Child([sys.executable, "-c", ORPHAN, tag],
                                limits=isolate.Limits(wall_s=60, memory_bytes=None)).wait()
        assert "planted" in outcome.stdout, outcome
        deadline = time.monotonic() + 10
        while _running(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(tag), "an orphan outlived its grading"
    finally:
        for pid in _running(tag):
            os.kill(pid, signal.SIGKILL)


def test_the_keepers_pid_namespace_keeps_what_the_command_exits_with(tmp_path):
    ok = isolate.Child([sys.executable, "-c", "import os; print(os.getpid()); raise SystemExit(3)"],
                       limits=isolate.Limits(wall_s=30, memory_bytes=None)).wait()
    assert ok.returncode == 3 and ok.stdout.split() == ["2"]  # pid 2: below the namespace's init
    crashed = isolate.Child([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
                            limits=isolate.Limits(wall_s=30, memory_bytes=None)).wait()
    assert crashed.signal == signal.SIGSEGV


def test_a_class_zip_inside_the_checkout_is_hidden_and_the_checkout_still_shown(tmp_path):
    """A TA who downloads the LMS zip into the course's checkout (the guide's commands run from there): the
    sandbox hid the zip's folder, the whole checkout, and then could not show solutions/ to hide it: every
    submission was "not graded". The zip alone is hidden (empty inside); the checkout is shown as always."""
    _sandbox_or_fail()
    zipped = REPO / f".test-class-{os.getpid()}.zip"
    zipped.write_bytes(b"PK\x05\x06" + b"\0" * 18 + b"a student's notebook")
    try:
        settings = pipeline.Settings(out=tmp_path / "out", shared_builds=tmp_path / "shared")
        hide = pipeline._hidden_folders(settings, zipped)
        assert zipped.resolve() in hide and REPO.resolve() not in hide
        own = tmp_path / "own"
        # not in the checkout's allow-list: absent inside (a zip in a folder that is shown would be an empty file)
        probe = (f"import os; p = {str(zipped)!r}; print(len(open(p, 'rb').read()) if os.path.exists(p) else 0); "
                 "import fuselab; print('shown')")
        command = isolate.sandboxed([sys.executable, "-c", probe], own=[own], hide=hide)
        result = isolate.Child(command, limits=pipeline._limits(settings), env=dict(os.environ, PYTHONPATH=str(REPO)),
                               cwd=str(own)).wait()
        assert result.ok and result.stdout.split() == ["0", "shown"], (result.stdout + result.stderr)[-2000:]
    finally:
        zipped.unlink()


def test_a_submissions_folder_holding_the_course_is_refused_before_grading(tmp_path):
    settings = pipeline.Settings(out=tmp_path / "out", shared_builds=tmp_path / "shared")
    with pytest.raises(pipeline.GradingRefused, match="outside it"):
        pipeline.check_source(REPO, settings)
    pipeline.check_source(tmp_path, settings)  # a folder of its own: fine
    pipeline.check_source(REPO / "grader" / "examples", settings)  # inside the checkout, holding none of it: fine


def test_a_run_folder_under_a_system_folder_the_sandbox_shows_is_hidden_too(tmp_path):
    """``--out`` or the submissions under a system folder every sandbox shows read-only (``/usr/local/share``,
    ``/etc``): the run folder was hidden only where a runtime folder (the venv, the checkout) showed it, so every
    submission could read the others' notebooks, results and feedback there. Each is hidden wherever it lies."""
    _sandbox_or_fail()
    system = Path(tempfile.mkdtemp(prefix="fuselab-test-run-", dir="/usr/local/share"))
    os.chmod(system, 0o755)  # as a course's folder would be: readable by the machine's users
    try:
        out, source = system / "out", system / "class"
        for folder, name in ((out / "submissions" / "alice" / "lab0", "lab0.ipynb"),
                             (out / "work" / "alice" / "lab0", "result.json"), (source / "alice", "lab0.ipynb")):
            folder.mkdir(parents=True)
            (folder / name).write_text("alice's work")
        settings = pipeline.Settings(out=out, shared_builds=tmp_path / "shared")
        own = tmp_path / "own"
        probe = ("import os, sys\nfor top in sys.argv[1:]:\n    for folder, _, files in os.walk(top):\n"
                 "        for name in files:\n            print(open(os.path.join(folder, name)).read())\n"
                 "print('looked')")
        command = isolate.sandboxed([sys.executable, "-c", probe, str(out), str(source)], own=[own],
                                    hide=pipeline._hidden_folders(settings, source))
        result = isolate.Child(command, limits=pipeline._limits(settings), cwd=str(own)).wait()
        assert result.ok and result.stdout.split() == ["looked"], (result.stdout + result.stderr)[-2000:]
    finally:
        shutil.rmtree(system)


def test_the_folder_the_grader_was_started_in_is_not_shown(tmp_path):
    """``python -m fuselab.cli grade`` (or ``python -m grader``) puts the working folder first on the grader's path,
    and the sandbox showed every folder of that path, read-only: a TA grading from a Downloads folder or a project
    showed each submission what lies there (tokens, other files). No graded child has it on its path; it is shown
    only where ``PYTHONPATH`` names it."""
    _sandbox_or_fail()
    start = tmp_path / "downloads"
    start.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(start, 0o755)
    (start / "token.txt").write_text("the TA's token")
    os.chmod(start / "token.txt", 0o644)
    script = textwrap.dedent(f"""\
        import os, sys
        sys.path.insert(0, os.getcwd())  # what ``python -m`` puts first
        from fuselab.grading.sandbox import isolate
        command = isolate.sandboxed(["/bin/cat", {str(start / "token.txt")!r}], own=[{str(tmp_path / "own")!r}],
                                    hide=[])
        print("read:", isolate.Child(command, limits=isolate.Limits(wall_s=30)).wait().stdout)
        """)
    for pythonpath, shown in ((str(REPO), False), (os.pathsep.join([str(REPO), str(start)]), True)):
        done = subprocess.run([sys.executable, "-c", script], cwd=start, capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=pythonpath))
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("the TA's token" in done.stdout) == shown, (pythonpath, done.stdout)


def test_the_memory_limit_is_the_submissions_not_each_processs(tmp_path, monkeypatch):
    """``--memory-gb`` is per submission, but each of its three processes (the checker, the solution worker, the
    kernel worker) had the whole limit: a solution cell holding 600 MiB and a kernel library whose static
    initialiser holds 600 MiB more kept full marks under a 1.5 GiB limit. They share it now.

    And the same on every run: the watches' half-second looks alone missed a kernel worker that held its 600 MiB
    for less than that (full marks on one run, none on the next). The check every test's end asks for reads all
    three at once; with the watches' reports made blind here, it alone must stop the submission."""
    _sandbox_or_fail()
    monkeypatch.setattr(isolate.MemoryBudget, "report", lambda self, child, used: self.over)
    from .test_grader_untrusted_paths import INSTRUCTOR, SOLUTION, _student
    kernel = SOLUTION.split("SOURCE = r'''")[1].split("'''")[0]
    hog = ("#include <cstring>\nstatic char* volatile held = [] { char* p = new char[600ull << 20]; "
           "memset(p, 1, 600ull << 20); return p; }();\n" + kernel)
    student = f"KEEP = b'\\x01' * (600 << 20)\ndef double(x):\n    return 2 * x\nSOURCE = {hog!r}\n"
    env = dict(os.environ, FUSELAB_GRADING="1", MPLBACKEND="Agg")
    result = recheck.run_clean(INSTRUCTOR, _student(student), tmp_path / "clean", cell_timeout=120, total_timeout=300,
                               sandbox=True, hide=[], env=env, limits=isolate.Limits(memory_bytes=3 * 2**29))
    points = {k: v.points for k, v in result.cells.items()}
    assert points["test_kernel"] == 0, (points, {k: v.message for k, v in result.cells.items()})
    assert any("processes grading it together" in v.message for v in result.cells.values()), \
        {k: v.message for k, v in result.cells.items()}


# --- what a child's working folder holds is never loaded outside ------------------------------------------------

def test_search_paths_keep_only_absolute_entries():
    env = {"PATH": ":/usr/bin:bin:", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64:", "PYTHONPATH": ".",
           "LD_PRELOAD": "libfoo.so ./evil.so:/opt/lib/ok.so", "HOME": "/home/ta"}
    assert isolate.absolute_search_paths(env) == {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
                                                  "LD_PRELOAD": "libfoo.so:/opt/lib/ok.so", "HOME": "/home/ta"}


PLANTED_LIBM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
/* a libm.so.6 a worker leaves in its own folder: its constructor says which process loaded it, and as whom */
__attribute__((constructor)) static void planted(void) {
    dlopen("libm.so.6", RTLD_NOW | RTLD_GLOBAL);  /* the system's, found past this folder: the process runs on */
    char name[64];
    snprintf(name, sizeof name, "planted-uid%d-pid%d", (int)getuid(), (int)getpid());
    FILE *f = fopen(name, "w");
    if (f) fclose(f);
}
"""


def test_a_library_a_worker_left_in_its_folder_is_not_loaded_when_it_starts_again(tmp_path):
    # The grader's LD_LIBRARY_PATH ends in ':' (``export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH``
    # onto an unset variable), which the loader reads as the working folder. A solution cell writes a libm.so.6
    # into its worker's folder and runs past its time limit: the next test's processes start in the same folders.
    _sandbox_or_fail()
    source = tmp_path / "planted.c"
    source.write_text(PLANTED_LIBM)
    library = tmp_path / "libm.so.6"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl"], check=True)
    blob = base64.b64encode(library.read_bytes()).decode()
    solution = (f"import base64\nBLOB = {blob!r}\n"
                "def answer():\n"
                "    open('libm.so.6', 'wb').write(base64.b64decode(BLOB))\n"
                "    while True:\n"
                "        pass\n")
    solution_cell = _cell(solution, "solution")
    solution_cell["metadata"]["nbgrader"]["solution"] = True
    notebook = _notebook(_cell("VALUE = 41", "setup"), solution_cell, _cell("answer()", "test_planting", points=1),
                         _cell("assert VALUE == 41", "test_after", points=1))
    env = dict(os.environ, LD_LIBRARY_PATH="/usr/local/cuda/lib64:", PATH=":" + os.environ["PATH"])
    result = recheck.run_clean(notebook, notebook, tmp_path / "work", cell_timeout=5, total_timeout=300,
                               sandbox=True, hide=[tmp_path], env=env, limits=isolate.Limits(memory_bytes=2 * 2**30))
    assert (tmp_path / "work" / "solution-process" / "libm.so.6").exists(), "the planting cell never ran"
    assert result.restarts == 1 and result.cells["test_after"].status == "passed", result.cells
    loaded = sorted(p.name for p in (tmp_path / "work").rglob("planted-*"))
    assert loaded == [], f"started processes loaded the planted library: {loaded}"
