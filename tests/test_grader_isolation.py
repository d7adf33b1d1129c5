"""The grader's isolation paths on small synthetic notebooks: faults, hangs, poisoned demos, stderr, partial
credit, limits, and the scheduling over several (fake) GPUs. Nothing here builds a kernel: these run in seconds.
"""

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from fuselab.grading.sandbox import isolate
from fuselab.grading.recheck import clean as recheck
from fuselab.grading.gpus import schedule
from fuselab.grading.recheck.sanitize import sanitize_cell

from .conftest import REPO


def _cell(source, grade_id=None, graded=False, solution=False, points=0):
    meta = {}
    if grade_id:
        meta = {"nbgrader": {"grade_id": grade_id, "grade": graded, "solution": solution, "locked": not solution,
                             "schema_version": 3, **({"points": points} if graded else {})}}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [], "execution_count": None}


def _notebook(cells):
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}


CRASH = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"


def _instructor(middle):
    """setup, a solution cell, a passing test, ``middle`` cells, then a test that must not get full marks for free."""
    return _notebook([
        _cell("VALUE = 41", "setup"),
        _cell("def answer():\n    return VALUE + 1", "solution", solution=True),
        _cell("assert answer() == 42", "test_first", graded=True, points=2),
        *middle,
        _cell("assert answer() == 42", "test_last", graded=True, points=3),
    ])


def _run(instructor, student=None, tmp_path=None, timeout=5.0, total=60.0):
    return recheck.run_clean(instructor, student or instructor, tmp_path, cell_timeout=timeout, total_timeout=total,
                             limits=isolate.Limits(memory_bytes=2 * 2**30))


def test_a_crashing_test_costs_only_itself(tmp_path):
    nb = _instructor([_cell(CRASH, "test_crash", graded=True, points=1)])
    result = _run(nb, tmp_path=tmp_path)
    assert result.cells["test_first"].points == 2
    assert result.cells["test_crash"].points == 0 and result.cells["test_crash"].status == "crashed"
    assert "SIGSEGV" in result.cells["test_crash"].message
    assert result.cells["test_last"].points == 3  # resumed in a fresh process
    assert result.restarts == 1


def test_a_solution_function_that_ends_its_process_costs_only_its_own_test(tmp_path):
    # the student's Python runs in the solution worker: a function that ends that process (a crash in a library it
    # called, an os._exit) fails the test that called it; the next tests get fresh processes, like a checker's crash
    nb = _notebook([
        _cell("VALUE = 41", "setup"),
        _cell("import os\ndef answer():\n    return VALUE + 1\ndef quit_early():\n    os._exit(3)", "solution",
              solution=True),
        _cell("assert answer() == 42", "test_first", graded=True, points=2),
        _cell("quit_early()", "test_quits", graded=True, points=1),
        _cell("assert answer() == 42", "test_last", graded=True, points=3),
    ])
    result = _run(nb, tmp_path=tmp_path)
    assert result.cells["test_quits"].points == 0 and "solution cells ended" in result.cells["test_quits"].message
    assert result.cells["test_last"].points == 3, result.cells["test_last"].message
    assert result.restarts == 1


def test_a_hanging_test_times_out_and_grading_goes_on(tmp_path):
    nb = _instructor([_cell("while True:\n    pass", "test_hang", graded=True, points=1)])
    started = time.monotonic()
    result = _run(nb, tmp_path=tmp_path, timeout=2.0, total=600.0)
    # the 2 s cell limit ended it, not the run's total limit (the bound leaves room for a loaded machine's start-ups)
    assert time.monotonic() - started < 300
    assert result.cells["test_hang"].status == "timed out" and result.cells["test_hang"].points == 0
    assert result.cells["test_last"].points == 3


@pytest.mark.parametrize("demo, why", [(CRASH, "crashed"), ("while True:\n    pass", "timed out")])
def test_a_fault_or_hang_in_a_demo_cell_zeroes_the_tests_after_it(tmp_path, demo, why):
    nb = _instructor([_cell(demo, "demo")])
    result = _run(nb, tmp_path=tmp_path, timeout=2.0)
    assert result.cells["test_first"].points == 2
    last = result.cells["test_last"]
    assert last.points == 0 and last.status == "not run"
    assert "demo" in last.message and why in last.message


def test_nbgrader_rules_stderr_partial_and_out_of_range(tmp_path):
    nb = _instructor([
        _cell("import sys\nsys.stderr.write('warning\\n')", "test_stderr", graded=True, points=1),
        _cell("import os\nos.write(2, b'from C\\n')", "test_fd2", graded=True, points=1),
        _cell("points = 1.5\npoints", "test_partial", graded=True, points=4),
        _cell("7", "test_too_many", graded=True, points=4),
        _cell("'a string counts as full marks in nbgrader'", "test_string", graded=True, points=1),
        _cell("raise ValueError('wrong')", "test_error", graded=True, points=1),
    ])
    cells = _run(nb, tmp_path=tmp_path).cells
    assert cells["test_stderr"].points == 0 and "stderr" in cells["test_stderr"].message
    assert cells["test_fd2"].points == 0
    assert cells["test_partial"].points == 1.5 and cells["test_partial"].status == "partial"
    assert cells["test_too_many"].points == 0
    assert cells["test_string"].points == 1
    assert cells["test_error"].points == 0 and cells["test_error"].message == "ValueError: wrong"
    assert cells["test_last"].points == 3  # errors do not stop the notebook (nbgrader's allow_errors)


def test_the_clean_recheck_ignores_a_monkeypatching_solution_cell(tmp_path):
    nb = _instructor([])
    student = json.loads(json.dumps(nb))
    student["cells"][1]["source"] = ("def answer():\n    return 0\n\n"
                                     "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\n")
    result = _run(nb, student, tmp_path=tmp_path)
    assert result.cells["test_first"].points == 0 and result.cells["test_last"].points == 0
    assert any("builtins" in flag for flag in result.flags)


def test_a_student_cell_that_does_not_parse_defines_nothing(tmp_path):
    nb = _instructor([])
    student = json.loads(json.dumps(nb))
    student["cells"][1]["source"] = "def answer(:\n    return 42"
    result = _run(nb, student, tmp_path=tmp_path)
    assert result.cells["test_first"].points == 0
    assert any("does not parse" in flag for flag in result.flags)


def test_sanitize_flags_tampering_and_keeps_the_cell_as_written():
    source = ("FUSED_SOURCE = r'''__global__ void k() {}'''\nEPS = 1e-5\nimport math\n"
              "def fold(w, b):\n    return w * math.sqrt(EPS) + b\n"
              "print('experiment')\n"
              "import fuselab as fl\nfl.check = lambda *a, **k: None\n"
              "def sneaky():\n    import sys\n    sys.modules['fuselab'].check = None\n")
    clean = sanitize_cell(source)
    assert clean.source == source  # it runs as written, in the solution worker: the sanitizer decides nothing
    flags = " ".join(clean.flags)
    assert "fuselab" in flags and "sneaky" in flags and "'sys'" in flags
    assert "print" not in flags and "fold:" not in flags  # harmless code is not flagged


def test_kill_tree_reaches_a_grandchild_in_its_own_session(tmp_path):
    marker = tmp_path / "grandchild.pid"
    tag = f"fuselab-grandchild-{os.getpid()}"  # found by name: the child's pids are its own PID namespace's
    script = (f"import subprocess, sys, time\n"
              f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {tag!r}], "
              f"start_new_session=True)\n"
              f"open({str(marker)!r}, 'w').write(str(p.pid))\ntime.sleep(300)\n")
    child = isolate.Child([sys.executable, "-c", script], limits=isolate.Limits(wall_s=60, memory_bytes=None))
    for _ in range(100):
        if marker.exists() and marker.read_text():
            break
        time.sleep(0.05)

    def running():
        found = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and tag.encode() in open(f"/proc/{entry}/cmdline", "rb").read():
                    found.append(open(f"/proc/{entry}/stat").read().split()[2])
            except OSError:
                continue
        return [state for state in found if state != "Z"]
    assert running()
    outcome = child.wait(timeout=1.0)
    assert outcome.timed_out
    time.sleep(0.2)
    assert not running()


def test_memory_watchdog_and_cpu_limit():
    hog = isolate.run([sys.executable, "-c", "x = bytearray(1500 * 2**20); import time; time.sleep(30)"],
                      limits=isolate.Limits(wall_s=30, memory_bytes=400 * 2**20))
    assert hog.out_of_memory and "memory" in hog.describe()
    spin = isolate.run([sys.executable, "-c", "while True: pass"],
                       limits=isolate.Limits(wall_s=30, cpu_s=1, memory_bytes=None))
    assert not spin.ok and spin.seconds < 20 and spin.signal is not None


def test_one_worker_per_fake_gpu_and_never_two_jobs_on_one(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,3")
    assert schedule.visible_gpus() == ["0", "1", "3"]
    assert schedule.devices_for("auto") == ["0", "1", "3"]
    assert schedule.devices_for(2) == ["0", "1"]
    assert schedule.devices_for("1,3") == ["1", "3"]
    with pytest.raises(ValueError):
        schedule.devices_for(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert schedule.devices_for("auto", cpu_workers=2) == [None, None]

    busy, used, lock = set(), {}, threading.Lock()
    # the first three jobs wait for each other: they can only meet if three workers run at once, one per GPU
    # (on a loaded machine one fast worker could otherwise take every job before the others start)
    together = threading.Barrier(3, timeout=60)

    def work(job, device):
        with lock:
            assert device not in busy, "two jobs on one GPU at once"
            busy.add(device)
        if job < 3:
            together.wait()
        time.sleep(0.02)
        with lock:
            busy.discard(device)
            used[job] = device
        if job == 5:
            raise RuntimeError("one student's disaster")
        return job * 10

    results = schedule.run_jobs(list(range(12)), ["0", "1", "3"], work)
    assert results[:5] == [0, 10, 20, 30, 40] and isinstance(results[5], RuntimeError)
    assert set(used.values()) == {"0", "1", "3"} and len(used) == 12


def test_bubblewrap_sandbox_sees_only_its_own_folder(tmp_path):
    own, other = tmp_path / "alice", tmp_path / "bob"
    own.mkdir()
    other.mkdir()
    (other / "secret.txt").write_text("bob's kernel")
    script = ("import os, socket\n"
              f"print(os.path.exists({str(other / 'secret.txt')!r}))\n"
              f"open({str(own / 'out.txt')!r}, 'w').write('mine')\n"
              "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); print('net')\n"
              "except OSError:\n    print('no net')\n")
    command = isolate.sandboxed([sys.executable, "-c", script], own=[own], hide=[tmp_path])
    outcome = isolate.run(command, limits=isolate.Limits(wall_s=60, memory_bytes=None))
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout.split() == ["False", "no", "net"]
    assert (own / "out.txt").read_text() == "mine"


def test_a_user_site_a_sandbox_wrote_in_its_own_folder_is_never_read_inside(tmp_path):
    # HOME inside is the child's own folder: a worker started again there (after a crash) would run at its start,
    # before its first request, a .pth its predecessor left in a user site there. (A virtual environment reads no
    # user site anyway; the GPU machine's Python, no venv, would: the flag is what every Python obeys.)
    own = tmp_path / "kernel-process"
    site = own / ".local" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True)
    (site / "planted.pth").write_text("import os; os.write(1, b'planted ran\\n')\n")
    probe = "import sys; print('no user site:', sys.flags.no_user_site)"
    command = isolate.sandboxed([sys.executable, "-P", "-c", probe], own=[own], hide=[])
    outcome = isolate.run(command, limits=isolate.Limits(wall_s=60, memory_bytes=None))
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout.split() == ["no", "user", "site:", "1"]


def test_command_line_entry_points():
    import subprocess
    repo = REPO
    fuselab_command = str(Path(sys.executable).parent / "fuselab")
    for command in ([sys.executable, "-m", "grader", "--help"], [fuselab_command, "grade", "--help"],
                    [fuselab_command, "calibrate", "--help"], [fuselab_command, "samples", "--help"]):
        result = subprocess.run(command, capture_output=True, text=True, cwd=repo)
        assert result.returncode == 0 and "usage" in result.stdout, result.stderr


def test_grading_mode_follows_the_environment(monkeypatch):
    import fuselab
    monkeypatch.delenv("FUSELAB_GRADING", raising=False)
    assert not fuselab.grading_mode()
    monkeypatch.setenv("FUSELAB_GRADING", "1")
    assert fuselab.grading_mode()


def test_calibrate_writes_this_gpus_entry_from_the_median(tmp_path, monkeypatch):
    from fuselab.grading.run import calibrate
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"tests": {"lab0.add_relu_mul": {"mode": "device", "gpus": {}},
                                            "lab3.matmul_bias": {"mode": "device", "gpus": {}}}}))
    monkeypatch.setattr(calibrate, "measure", lambda labs, repeats: {
        "lab0.add_relu_mul": {"speedups": [2.0, 2.5, 2.2], "gpu": "Test GPU", "lab": "lab0"},
        "lab3.matmul_bias": {"speedups": [1.02, 1.05, 1.03], "gpu": "Test GPU", "lab": "lab3"}})
    lines = calibrate.calibrate(policy_path=policy)
    entry = json.loads(policy.read_text())["tests"]["lab0.add_relu_mul"]["gpus"]["Test GPU"]
    assert entry["plain_speedup"] == 2.2 and entry["threshold"] == pytest.approx(1 + 0.6 * 1.2)
    too_small = json.loads(policy.read_text())["tests"]["lab3.matmul_bias"]["gpus"]["Test GPU"]
    assert too_small["gradable"] is False and "threshold" not in too_small  # grading falls back to the H200's
    assert any("lab3.matmul_bias" in line and "not gradable" in line for line in lines)


def test_the_clean_recheck_runs_inside_the_sandbox(tmp_path):
    secret = tmp_path / "other-student" / "lab0.ipynb"
    secret.parent.mkdir()
    secret.write_text("{}")
    nb = _instructor([_cell(f"import os\nassert not os.path.exists({str(secret)!r})", "test_hidden", graded=True,
                            points=1),
                      _cell(f"open({str(tmp_path / 'planted')!r}, 'w')", "test_write", graded=True, points=1)])
    result = recheck.run_clean(nb, nb, tmp_path / "work", cell_timeout=20, total_timeout=120, sandbox=True,
                               hide=[tmp_path], limits=isolate.Limits(memory_bytes=2 * 2**30))
    assert result.cells["test_hidden"].points == 1
    assert not (tmp_path / "planted").exists()  # written into a throwaway tmpfs, never the real folder
    assert result.cells["test_last"].points == 3


def test_idle_gpu_check_kills_our_leftovers_and_waits_for_others(monkeypatch):
    import subprocess
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        def on_gpu(device=None):
            return [p.pid for p in (leftover, stranger) if p.poll() is None]
        monkeypatch.setattr(isolate, "gpu_processes", on_gpu)
        idle, note = isolate.wait_for_idle_gpu("0", timeout_s=1.0, own_pids=[leftover.pid])
        assert leftover.wait(timeout=10) is not None  # our leftover was killed
        assert not idle and str(stranger.pid) in note  # someone else's process is reported, never killed
        assert stranger.poll() is None
    finally:
        stranger.kill()
        leftover.kill()


def test_the_timeline_says_where_each_process_spent_its_time(tmp_path):
    nb = _instructor([_cell("import time\ntime.sleep(0.3)", "demo_sleep"),
                      _cell(CRASH, "test_crash", graded=True, points=1)])
    result = _run(nb, tmp_path=tmp_path)
    timeline = result.timeline
    assert {"process start", "setup", "solution", "test_first", "demo_sleep", "test_crash", "test_last"} <= set(timeline)
    # the crash restarts the process from test_last: the demo before it (setup, not graded) ran in both
    assert result.restarts == 1 and timeline["demo_sleep"] >= 0.6
    assert timeline["process start"] > 0 and all(seconds >= 0 for seconds in timeline.values())


def test_the_recheck_says_which_cell_the_checker_starts_and_leaves_demo_cells_out(tmp_path):
    demo = _cell("shown = answer()\nprint('a figure of', shown)", "figure")
    demo["metadata"]["tags"] = ["demo"]
    nb = _instructor([demo, _cell("import time\ntime.sleep(0.3)\nassert answer() == 42", "test_middle",
                                  graded=True, points=1)])
    started = []
    result = recheck.run_clean(nb, nb, tmp_path, cell_timeout=30, total_timeout=120,
                               limits=isolate.Limits(memory_bytes=2 * 2**30), on_cell=started.append)
    assert started == ["setup", "solution", "test_first", "test_middle", "test_last"]  # never the demo
    assert all(v.points == v.max_points for v in result.cells.values())
    timeline = result.timeline
    assert "figure" not in timeline and "test_middle" in timeline
