"""The package's file locks (``fuselab.locks``) and their three users: the build, the grading run's ``--out`` and
the Slurm shards. A lock is dropped when its holder is killed, and something a submission could plant where a
lock goes (a link, a FIFO, a second name of another file) is refused, never opened through (CPU, seconds)."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from fuselab import errors, locks
from fuselab.grading.run import pipeline, slurm
from fuselab.kernelbuild import _exclusive

from .conftest import REPO


def _run_lock(folder):
    return contextlib.closing(type("Held", (), {"close": pipeline.lock_out(folder).release})())


USERS = {  # each user's way to take the lock at ``folder/name``, and what it raises when it refuses
    "build": ("k.lock", lambda folder: _exclusive(folder / "k.lock", 5.0), errors.BuildError),
    "run": (pipeline.LOCK_NAME, _run_lock, pipeline.GradingRefused),
    "slurm": ("jobs.lock", lambda folder: slurm.locked(folder / "jobs.lock"), OSError),
}

HOLD = """
import sys, time
from pathlib import Path
from fuselab.grading.run import pipeline, slurm
from fuselab.kernelbuild import _exclusive
user, folder = sys.argv[1], Path(sys.argv[2])
held = {"build": lambda: _exclusive(folder / "k.lock", 5.0), "slurm": lambda: slurm.locked(folder / "jobs.lock")}
kept = pipeline.lock_out(folder) if user == "run" else held[user]()  # kept: a lock let go of is released
if user != "run":
    kept.__enter__()
print("held", flush=True)
time.sleep(600)
"""


def _holder(user, folder):
    child = subprocess.Popen([sys.executable, "-c", HOLD, user, str(folder)], stdout=subprocess.PIPE, text=True,
                             cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert child.stdout.readline().strip() == "held"
    return child


@pytest.mark.parametrize("user", USERS)
def test_a_lock_whose_holder_was_killed_is_free_at_once(tmp_path, user):
    name, take, _ = USERS[user]
    child = _holder(user, tmp_path)
    try:
        if user == "run":  # held: the second run is refused, and told who holds it
            with pytest.raises(pipeline.GradingRefused, match=f"pid {child.pid}"):
                pipeline.lock_out(tmp_path)
        else:
            with pytest.raises(locks.Timeout):
                locks.file_lock(tmp_path / name).acquire(blocking=False)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    started = time.monotonic()
    with take(tmp_path):
        assert time.monotonic() - started < 2  # nothing left to wait for: the kernel dropped the killed one's lock


def _plant(kind, path, victim):
    if kind == "link":
        path.symlink_to(victim)
    elif kind == "dangling link":
        path.symlink_to(victim.with_name("created-through-the-link"))
    elif kind == "hard link":
        os.link(victim, path)
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("kind", ["link", "dangling link", "hard link", "fifo"])
@pytest.mark.parametrize("user", USERS)
def test_what_a_submission_plants_where_a_lock_goes_is_refused_not_opened(tmp_path, user, kind):
    name, take, refusal = USERS[user]
    victim = tmp_path / "grader-file"
    victim.write_text("the grader's own")
    _plant(kind, tmp_path / name, victim)
    started = time.monotonic()
    with pytest.raises(refusal, match="symbolic link|FIFO|another name"):
        with take(tmp_path):
            pass
    assert time.monotonic() - started < 2  # a FIFO is not waited on
    assert victim.read_text() == "the grader's own"
    assert not victim.with_name("created-through-the-link").exists()


def test_a_link_put_in_place_after_the_check_is_still_refused(tmp_path):
    victim = tmp_path / "grader-file"
    victim.write_text("the grader's own")
    lock = locks.file_lock(tmp_path / "late.lock", write_pid=True)  # checked here: nothing there yet
    (tmp_path / "late.lock").symlink_to(victim)
    with pytest.raises(OSError):
        lock.acquire()
    fifo = locks.file_lock(tmp_path / "late-fifo.lock", write_pid=True)
    os.mkfifo(tmp_path / "late-fifo.lock")
    with pytest.raises(locks.LockRefused, match="FIFO"):
        fifo.acquire()
    assert victim.read_text() == "the grader's own"


def test_the_holders_pid_is_read_without_following_a_link(tmp_path):
    (tmp_path / "pid").write_text("4242\n")
    (tmp_path / "link").symlink_to(tmp_path / "pid")
    os.mkfifo(tmp_path / "fifo")
    assert locks.holder(tmp_path / "pid") == "4242"
    assert locks.holder(tmp_path / "link") == locks.holder(tmp_path / "fifo") == "unknown"
    assert locks.holder(tmp_path / "missing") == "unknown"
