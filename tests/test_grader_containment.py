"""Containment, tried as an attacker would: from inside the sandbox (grading as root, as CI does), a submission
reads, writes and connects where it must not; processes it starts outlive it; the grader is killed under it.
Nothing here builds a kernel. The sandbox tests fail, never skip, where bubblewrap does not work."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fuselab import course
from fuselab.grading.sandbox import isolate
from fuselab.grading.run import pipeline

from .conftest import REPO

ATTACK = textwrap.dedent(r'''
    import ctypes, json, os, socket, subprocess, sys
    target = json.loads(sys.argv[1])
    seen = {}

    def attempt(name, action):
        try:
            seen[name] = repr(action())
        except BaseException as exc:  # noqa: BLE001 - every failure counts as held
            seen[name] = "refused: " + type(exc).__name__

    def write(path):
        with open(path, "a") as handle:
            handle.write("tampered")
        return "written"

    def connect(family, address):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect(address)
            return s.recv(100).decode()

    def own_loopback():
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            with socket.create_connection(server.getsockname(), timeout=3):
                return "loopback works"

    attempt("read_home", lambda: open(target["home_secret"]).read())
    attempt("list_home", lambda: os.listdir(os.path.dirname(target["home_secret"])))
    attempt("read_other_student", lambda: open(target["other_student"]).read())
    attempt("read_earlier_run", lambda: open(target["earlier_run"]).read())
    attempt("read_other_checkouts_solutions", lambda: open(target["other_checkout_solution"]).read())
    attempt("read_other_checkouts_package", lambda: open(target["other_checkout_package"]).read())
    attempt("write_result", lambda: write(target["result"]))
    attempt("write_solutions", lambda: write(target["solutions"]))
    attempt("read_solutions", lambda: os.listdir(os.path.dirname(target["solutions"])))
    attempt("write_own", lambda: write(os.path.join(target["own"], "mine.txt")))
    attempt("remount_rw", lambda: subprocess.run(["mount", "-o", "remount,rw", "/"], capture_output=True).returncode)
    attempt("remount_bind_rw", lambda: subprocess.run(["mount", "-o", "remount,bind,rw", target["own"] + "/.."],
                                                        capture_output=True).returncode)
    attempt("unshare_mount", lambda: subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode)
    attempt("unshare_user", lambda: ctypes.CDLL(None).unshare(0x10000000))
    attempt("unix_socket", lambda: connect(socket.AF_UNIX, target["unix_socket"]))
    attempt("abstract_socket", lambda: connect(socket.AF_UNIX, "\0" + target["abstract_socket"]))
    attempt("tcp_host_loopback", lambda: connect(socket.AF_INET, ("127.0.0.1", target["tcp_port"])))
    attempt("own_loopback", own_loopback)
    attempt("write_shm", lambda: write("/dev/shm/" + target["shm_name"]))
    attempt("secret_env", lambda: os.environ.get("GITHUB_TOKEN") or os.environ.get("AWS_SECRET_ACCESS_KEY"))
    attempt("secret_env_of_pid1", lambda: b"s3cr3t" in open("/proc/1/environ", "rb").read())
    attempt("host_processes", lambda: os.path.exists("/proc/%d" % target["grader_pid"]))
    status = open("/proc/self/status").read().split("\n")
    seen["cap_eff"] = next(l.split()[1] for l in status if l.startswith("CapEff"))
    seen["uid"] = os.getuid()
    seen["dev"] = sorted(os.listdir("/dev"))
    print(json.dumps(seen))
''')


def _sandbox_or_fail():
    problem = isolate.sandbox_problem()
    assert problem is None, f"the sandbox must work here (CI installs bubblewrap and runs as root): {problem}"


def _listen(family, address):
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind(address)
    server.listen()

    def answer():
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            connection.sendall(b"host socket reached")
            connection.close()
    threading.Thread(target=answer, daemon=True).start()
    return server


def test_the_sandbox_holds_against_a_submission_that_attacks_it(tmp_path, monkeypatch):
    _sandbox_or_fail()
    tag = f"fuselab-test-{os.getpid()}"
    classroom, out = tmp_path / "class", tmp_path / "out"
    other = classroom / "bob" / "lab0.ipynb"
    other.parent.mkdir(parents=True)
    other.write_text("bob's work")
    result = out / "work" / "alice" / "lab0" / "result.json"
    own = result.parent / "clean"
    own.mkdir(parents=True)
    result.write_text("{}")
    home_secret = Path.home() / f".{tag}-secret"
    home_secret.write_text("the TA's token")
    unix_path = Path("/run") / f"{tag}.sock" if os.access("/run", os.W_OK) else tmp_path / "host.sock"
    servers = [_listen(socket.AF_UNIX, str(unix_path)), _listen(socket.AF_UNIX, "\0" + tag),
               _listen(socket.AF_INET, ("127.0.0.1", 0))]
    solutions_file = course.SOLUTIONS / "lab0" / f"{tag}.txt"
    # an earlier run's grades, written world-readable where nobody thought to hide anything; and a second
    # checkout of the course that is on sys.path (an editable install): its package shows, its solutions do not
    scratch = Path("/var/lib") / tag
    earlier = scratch / "grading-lab0" / "grades.csv"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("alice,10")
    checkout = scratch / "checkout"
    (checkout / "solutions" / "lab0").mkdir(parents=True)
    (checkout / "solutions" / "lab0" / "lab0.ipynb").write_text("the instructor's notebook")
    (checkout / "fuselab_extra.py").write_text("A = 1")
    os.chmod(scratch, 0o755)
    monkeypatch.syspath_prepend(str(checkout))
    target = {"home_secret": str(home_secret), "other_student": str(other), "result": str(result),
              "earlier_run": str(earlier), "other_checkout_solution": str(checkout / "solutions/lab0/lab0.ipynb"),
              "other_checkout_package": str(checkout / "fuselab_extra.py"),
              "solutions": str(solutions_file), "own": str(own), "unix_socket": str(unix_path),
              "abstract_socket": tag, "tcp_port": servers[2].getsockname()[1], "shm_name": tag,
              "grader_pid": os.getpid()}
    env = dict(os.environ, GITHUB_TOKEN="s3cr3t", AWS_SECRET_ACCESS_KEY="s3cr3t")
    try:
        command = isolate.sandboxed([sys.executable, "-c", ATTACK, json.dumps(target)], own=[own],
                                    hide=[classroom, out])
        outcome = isolate.run(command, env=env, limits=isolate.Limits(wall_s=60, memory_bytes=None))
        assert outcome.returncode == 0, outcome.stderr
        seen = json.loads(outcome.stdout.strip().splitlines()[-1])
    finally:
        for server in servers:
            server.close()
        for path in (home_secret, unix_path, solutions_file, Path("/dev/shm") / tag):
            path.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
    def refused(name):  # an exception, a failing exit status or -1 from a system call, or nothing found
        return seen[name].startswith("refused") or seen[name] in ("False", "-1") or \
            (seen[name].isdigit() and seen[name] != "0")
    for name in ("read_home", "read_other_student", "read_earlier_run", "read_other_checkouts_solutions",
                 "read_solutions", "remount_rw", "remount_bind_rw",
                 "unshare_mount", "unshare_user", "unix_socket", "abstract_socket", "tcp_host_loopback",
                 "host_processes", "secret_env_of_pid1"):
        assert refused(name), f"{name}: {seen[name]}"
    assert seen["secret_env"] == "None"
    assert home_secret.name not in seen["list_home"]  # an empty home (where the Python lives there, only that)
    assert seen["write_own"] == "'written'" and seen["own_loopback"] == "'loopback works'"  # what it may do
    assert seen["read_other_checkouts_package"] == "'A = 1'"  # the runtime it needs
    assert seen["write_shm"] == "'written'" and not (Path("/dev/shm") / tag).exists()  # a private /dev/shm
    assert int(seen["cap_eff"], 16) == 0 and seen["uid"] != 0
    basic = {"core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty",
             "urandom", "zero"}
    assert set(seen["dev"]) <= basic | {Path(n).name for n in isolate.gpu_device_nodes()}
    # writes to result.json and solutions/ land, at most, in the sandbox's empty throwaway folders
    assert result.read_text() == "{}" and other.read_text() == "bob's work" and not solutions_file.exists()


DAEMON = textwrap.dedent('''
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)   # a daemon holding a copy of stdout and stderr
        os._exit(0)
    print("launched", flush=True)
''')

ESCAPEE = textwrap.dedent('''
    import os, time
    if os.fork() == 0:
        while True:   # a new pid every moment: a kill that lists the tree once misses it
            if os.fork():
                os._exit(0)
    print("running", flush=True)
    time.sleep(600)
''')


def _ended(marker, within_s=30.0):
    deadline = time.monotonic() + within_s
    while isolate.marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not isolate.marked(marker)


@pytest.mark.parametrize("sandbox", [False, True], ids=["plain", "sandbox"])
def test_a_double_forked_daemon_ends_with_its_submission_and_never_holds_the_grader(tmp_path, sandbox):
    command = [sys.executable, "-c", DAEMON]
    if sandbox:
        _sandbox_or_fail()
        command = isolate.sandboxed(command, own=[tmp_path], hide=[])
    child = isolate.Child(command, limits=isolate.Limits(wall_s=300, memory_bytes=None))
    outcome = child.wait()
    assert not outcome.timed_out and outcome.returncode == 0 and "launched" in outcome.stdout, outcome.stderr
    assert not isolate.marked(child.marker)


@pytest.mark.parametrize("sandbox", [False, True], ids=["plain", "sandbox"])
def test_a_forking_escapee_is_caught_when_its_time_is_up(tmp_path, sandbox):
    command = [sys.executable, "-c", ESCAPEE]
    if sandbox:
        _sandbox_or_fail()
        command = isolate.sandboxed(command, own=[tmp_path], hide=[])
    child = isolate.Child(command, limits=isolate.Limits(wall_s=2, memory_bytes=None))
    outcome = child.wait()
    assert outcome.timed_out and "running" in outcome.stdout
    assert _ended(child.marker)


GRADER = textwrap.dedent('''
    import sys, time
    from fuselab.grading.sandbox import isolate
    command = [sys.executable, "-c", sys.argv[1]]
    if sys.argv[2] == "sandbox":
        command = isolate.sandboxed(command, own=[sys.argv[3]], hide=[])
    child = isolate.Child(command, limits=isolate.Limits(wall_s=600, memory_bytes=None))
    print(child.marker, flush=True)
    child.wait()
''')

KERNEL = textwrap.dedent('''
    import subprocess, sys, time
    # a kernel in a session of its own, as Jupyter starts it
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    time.sleep(600)
''')


@pytest.mark.parametrize("sandbox", [False, True], ids=["plain", "sandbox"])
def test_kill_9_of_the_grader_ends_what_its_submission_started(tmp_path, sandbox):
    if sandbox:
        _sandbox_or_fail()
    grader = subprocess.Popen([sys.executable, "-c", GRADER, KERNEL, "sandbox" if sandbox else "plain",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO)
    marker = grader.stdout.readline().strip()
    deadline = time.monotonic() + 30
    while len(isolate.marked(marker)) < 3 and time.monotonic() < deadline:  # keeper, its command, the kernel
        time.sleep(0.1)
    assert len(isolate.marked(marker)) >= 3
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    assert _ended(marker), f"still running after the grader's kill -9: {isolate.marked(marker)}"


def test_one_run_per_out_and_never_inside_the_course(tmp_path):
    held = pipeline.lock_out(tmp_path)
    try:
        with pytest.raises(pipeline.GradingRefused, match=f"pid {os.getpid()}"):
            pipeline.lock_out(tmp_path)
    finally:
        held.release()
    pipeline.lock_out(tmp_path).release()  # free again once the first run ended
    submissions = tmp_path / "class"
    submissions.mkdir()
    for inside in (course.SOLUTIONS / "lab0" / "run", course.LABS / "run", submissions / "run"):
        with pytest.raises(pipeline.GradingRefused, match="inside"):
            pipeline.check_out(inside, submissions)
    pipeline.check_out(tmp_path / "run", submissions)


def test_a_broken_sandbox_refuses_to_grade_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from fuselab.grading.run import cli
    monkeypatch.setattr(isolate, "bubblewrap", lambda: "/bin/false")
    submissions = tmp_path / "class" / "alice" / "lab0.ipynb"
    submissions.parent.mkdir(parents=True)
    submissions.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}))
    out = tmp_path / "out"
    code = cli.main(["grade", str(tmp_path / "class"), "--out", str(out), "--no-feedback"])
    assert code != 0 and "sandbox does not work" in capsys.readouterr().err
    assert not out.exists()


def test_resume_keeps_only_results_graded_with_this_runs_containment(tmp_path):
    notebook = tmp_path / "lab0.ipynb"
    notebook.write_text("{}")
    sub = type("Sub", (), {"notebook": notebook})()
    sha = pipeline._sha(notebook)
    sandboxed = pipeline.Settings(out=tmp_path)
    plain = pipeline.Settings(out=tmp_path, sandbox=False)
    saved = tmp_path / "result.json"
    saved.write_text("{}")
    assert sandboxed.sandbox  # the default
    assert pipeline._kept({"notebook_sha": sha, "sandbox": True}, saved, sub, sandboxed)
    assert not pipeline._kept({"notebook_sha": sha, "sandbox": False}, saved, sub, sandboxed)
    assert not pipeline._kept({"notebook_sha": sha}, saved, sub, sandboxed)  # graded before the sandbox was the default
    assert pipeline._kept({"notebook_sha": sha, "sandbox": True}, saved, sub, plain)
    assert not pipeline._kept({"notebook_sha": "0" * 64, "sandbox": True}, saved, sub, sandboxed)


def test_a_claim_of_the_sandbox_written_during_a_run_without_it_is_not_believed(tmp_path):
    """A ``--no-sandbox`` run lets submissions write the course folder: a result they wrote claiming a sandboxed
    grading (back-dated as they like) is graded again by the next sandboxed run; one saved after that run is kept."""
    from fuselab.grading.records import unsandboxed
    notebook = tmp_path / "lab0.ipynb"
    notebook.write_text("{}")
    sub = type("Sub", (), {"notebook": notebook})()
    claim = {"notebook_sha": pipeline._sha(notebook), "sandbox": True}
    sandboxed = pipeline.Settings(out=tmp_path)
    unsandboxed.mark(tmp_path)  # the --no-sandbox run starts
    forged = tmp_path / "work" / "bob" / "lab0" / "result.json"
    forged.parent.mkdir(parents=True)
    forged.write_text(json.dumps(claim))
    os.utime(forged, (1e9, 2e9))  # its modification time set ahead: the change time is what counts
    unsandboxed.mark(tmp_path)  # ... and ends
    assert not pipeline._kept(claim, forged, sub, sandboxed)
    assert pipeline._kept(claim, forged, sub, pipeline.Settings(out=tmp_path, sandbox=False))
    forged.write_text(json.dumps(claim))  # as the sandboxed run saves its own result, after the mark
    assert pipeline._kept(claim, forged, sub, sandboxed)
    mark = tmp_path / unsandboxed.MARK
    mark.unlink()
    mark.mkdir()  # a mark that is not a regular file believes nothing
    assert not pipeline._kept(claim, forged, sub, sandboxed)


def test_a_sandbox_that_breaks_mid_run_saves_nothing(tmp_path, monkeypatch):
    from fuselab.grading.records import intake
    from fuselab.grading.recheck import clean as recheck
    notebook = tmp_path / "lab0.ipynb"
    notebook.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}))
    sub = intake.Submission("alice", "lab0", notebook, "alice/lab0.ipynb")
    # every test failed "because of the student": in truth bubblewrap stopped starting
    monkeypatch.setattr(recheck, "run_clean", lambda *a, **k: recheck.CleanResult(cells={
        "test": recheck.CellVerdict("test", 0.0, 1.0, "not run", "bwrap: cannot start")}))
    monkeypatch.setattr(isolate, "sandbox_problem", lambda *a, **k: "bubblewrap cannot start a sandbox here")
    settings = pipeline.Settings(out=tmp_path / "out", shared_builds=tmp_path / "builds")
    with pytest.raises(pipeline.GradingRefused, match="stopped working while alice/lab0"):
        pipeline.grade_submission(sub, None, settings, tmp_path)
    assert not (tmp_path / "out" / "work" / "alice" / "lab0" / "result.json").exists()
