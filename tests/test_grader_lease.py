"""Submissions sharing a GPU: each graded timing gets the GPU to itself (the others are stopped, then resumed),
and the idle check leaves sharing submissions alone.
Real child processes, no GPU: the NVML idle wait is replaced by its no-NVML path.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuselab.grading.sandbox import isolate
from fuselab.grading.gpus import lease, schedule
from fuselab.grading.run import pipeline
from fuselab.grading.recheck import clean as recheck

COUNTER = """
import os, sys, time
path, n = sys.argv[1], 0
while True:
    n += 1
    open(path + ".tmp", "w").write(str(n))
    os.replace(path + ".tmp", path)  # a reader never sees a half-written number
    time.sleep(0.01)
"""

TIMED = """
import sys, time
from fuselab.speed.lease import exclusive_gpu
counter, report = sys.argv[1], sys.argv[2]
def read():
    return int(open(counter).read() or 0)
seen = []
for _ in range(2):
    with exclusive_gpu():
        before = read(); time.sleep(0.4); during = read()
    time.sleep(0.3)
    seen.append([before, during, read()])
open(report, "w").write(repr(seen))
"""


def _limits():
    return isolate.Limits(wall_s=60, memory_bytes=None)


# what a checker does at its start where the grader shares the GPU (``cellrunner.main``): ask over its channel
ASKS_THE_GRADER = """
import os
from fuselab.grading.recheck import channel
from fuselab.speed import lease as _lease
_lease.talk_to_grader(channel.Asker(channel.Sender(int(os.environ["TEST_CHANNEL_FD"])),
                                         int(os.environ[channel.ANSWERS_FD_ENV])))
"""


def leased_child(script, args, shared, env=None, limits=None):
    """A child running ``script`` that asks ``shared`` for the GPU as a checker does, over a channel and a grant
    pipe the grader opened for it: ``(child, its LeaseServer, serve)``, where ``serve()`` hands its asks to the
    server and polls it once, as the clean recheck's loop does."""
    import os
    from fuselab.grading.recheck.channel import ANSWERS_FD_ENV, Receiver
    channel, channel_w = Receiver.open()
    grants = recheck._Grants()
    env = dict(env if env is not None else os.environ, TEST_CHANNEL_FD=str(channel_w),
               **{ANSWERS_FD_ENV: str(grants.read_fd)})
    child = isolate.Child([sys.executable, "-c", ASKS_THE_GRADER + script, *map(str, args)],
                          limits=limits or _limits(), env=env, registry=shared, pass_fds=(channel_w, grants.read_fd))
    os.close(channel_w)
    os.close(grants.read_fd)
    server = lease.LeaseServer(shared, child, grants)

    def serve():
        recheck._receive(channel, {}, None, server)
        server.poll()
    return child, server, serve


def _wait_for_file(path, timeout=20):
    deadline = time.monotonic() + timeout
    while not (Path(path).exists() and Path(path).read_text()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_workers_share_each_gpu_and_cpu_workers_stay_as_given(monkeypatch):
    assert schedule.workers_for(["0", "1"], 3) == ["0", "1", "0", "1", "0", "1"]
    assert schedule.workers_for([None, None], 5) == [None, None]
    monkeypatch.setattr(schedule, "available_cores", lambda: 16)
    monkeypatch.setattr(schedule, "smallest_gpu_memory_gib", lambda gpus: 139.8)  # the H200
    assert schedule.workers_for(["0"]) == ["0"] * 10         # two per three cores
    assert schedule.workers_for(["0", "1", "2", "3"]) == ["0", "1", "2", "3"] * 2
    assert schedule.workers_for(list("01234567")) == list("01234567")  # at least one each
    monkeypatch.setattr(schedule, "smallest_gpu_memory_gib", lambda gpus: 23.6)  # a 24 GB card: memory decides
    assert schedule.workers_for(["0"]) == ["0"] * 3
    monkeypatch.setattr(schedule, "available_cores", lambda: 128)
    monkeypatch.setattr(schedule, "smallest_gpu_memory_gib", lambda gpus: 640)
    assert schedule.workers_for(["0"]) == ["0"] * schedule.MAX_JOBS_PER_GPU
    monkeypatch.setattr(schedule, "smallest_gpu_memory_gib", lambda gpus: None)  # unknown memory: few
    assert schedule.workers_for(["0"]) == ["0"] * schedule.UNKNOWN_MEMORY_JOBS
    with pytest.raises(ValueError, match="at least 1"):
        schedule.workers_for(["0"], 0)


def test_without_a_gpu_one_worker_per_core_as_memory_allows(monkeypatch):
    assert schedule.default_cpu_workers(cores=2, memory_gib=20) == 2      # the 2-core machine: both cores
    assert schedule.default_cpu_workers(cores=16, memory_gib=10) == 10 // schedule.CPU_MEMORY_PER_JOB_GIB
    assert schedule.default_cpu_workers(cores=4, memory_gib=0.5) == 1     # little memory: still one
    monkeypatch.setattr(schedule, "host_memory_available_gib", lambda: None)
    assert schedule.default_cpu_workers(cores=4) == 1                     # unknown memory: one
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(schedule, "available_cores", lambda: 3)
    monkeypatch.setattr(schedule, "host_memory_available_gib", lambda: 64.0)
    assert schedule.devices_for("auto") == [None] * 3                     # the grader's default
    assert schedule.devices_for("auto", cpu_workers=1) == [None]          # a teaching assistant's choice wins


def test_the_command_line_refuses_a_count_below_one(capsys):
    from fuselab import cli
    for option in ("--cpu-workers", "--jobs-per-gpu"):
        for bad in ("0", "-2", "two"):
            with pytest.raises(SystemExit) as stopped:
                cli.main(["grade", "class.zip", "--out", "run", option, bad])
            assert stopped.value.code == 2
            assert f"{option}: expected a whole number of at least 1" in capsys.readouterr().err


def test_a_timing_stops_the_other_submissions_on_its_gpu_and_resumes_them(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: None)
    shared = lease.DeviceLease("0")
    counter, report = tmp_path / "counter", tmp_path / "report"
    other = isolate.Child([sys.executable, "-c", COUNTER, str(counter)], limits=_limits(), registry=shared)
    try:
        _wait_for_file(counter)
        env = recheck.runner_env(dict(__import__("os").environ), tmp_path, None)
        timed, server, serve = leased_child(TIMED, [counter, report], shared, env=env)
        while timed.alive():
            serve()
            time.sleep(0.01)
        server.finish()
        assert timed.wait().ok
        seen = eval(report.read_text())  # noqa: S307 - our own child's repr of a list of ints
        for before, during, after in seen:
            assert during == before, "the other submission kept running during a timing"
            assert after > during, "the other submission was not resumed after the timing"
        assert shared.stopped_seconds(other) >= 0.7  # two timings of 0.4 s each (not held against its limits)
        assert server.waited_s >= 0.4  # the no-NVML settle (0.2 s) per timing
        assert server.held_s >= 0.8    # two blocks of 0.4 s with the GPU to itself
        # the log of its holds (what the multi-GPU self-check reads to show no two timings shared a GPU)
        assert len(server.holds) == 2 and all(end - start >= 0.4 for start, end in server.holds)
        assert server.holds[0][1] <= server.holds[1][0]
        assert not list(tmp_path.glob("lease-*")), "files in the child's folder: the lease needs none"
    finally:
        other.stop()
        other.wait()


def test_a_child_started_during_a_timing_waits_for_it(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: None)
    shared = lease.DeviceLease("0")
    holder = isolate.Child([sys.executable, "-c", "import time; time.sleep(30)"], limits=_limits(), registry=shared)
    counter = tmp_path / "counter"
    try:
        shared.acquire(holder)
        late = isolate.Child([sys.executable, "-c", COUNTER, str(counter)], limits=_limits(), registry=shared)
        time.sleep(0.5)
        assert not counter.exists(), "a child started during a timing ran before it ended"
        shared.release()
        _wait_for_file(counter)
        late.stop()
        late.wait()
    finally:
        holder.stop()
        holder.wait()


def test_busy_gpu_is_waited_for_and_reported(monkeypatch):
    readings = iter([35, 12, 0])
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: next(readings))
    assert lease.wait_until_idle("0", timeout_s=5, poll_s=0.01) == ""
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: 80)
    note = lease.wait_until_idle("0", timeout_s=0.1, poll_s=0.01)
    assert "stayed busy" in note and "80%" in note


def test_idle_check_leaves_submissions_sharing_the_gpu_alone(monkeypatch):
    sharing = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setattr(isolate, "gpu_processes",
                            lambda device=None: [p.pid for p in (sharing, leftover) if p.poll() is None])
        idle, note = isolate.wait_for_idle_gpu("0", timeout_s=1.0, own_pids=[sharing.pid, leftover.pid],
                                               sharing=lambda: {sharing.pid})
        assert idle and note == ""
        assert leftover.wait(timeout=10) is not None  # a leftover of ours: killed
        assert sharing.poll() is None                  # a submission graded beside us: untouched
    finally:
        sharing.kill()
        leftover.kill()


def test_the_clean_recheck_gives_the_points_and_the_hand_graded_cells_wait_for_a_person():
    sub = type("Sub", (), {"student": "s", "lab": "lab0"})()
    speed = recheck.CellVerdict("test_speedup", 3.0, 4.0, "partial", speed=[{"status": "measured"}])
    check = recheck.CellVerdict("test_fused", 0.0, 2.0, "failed", message="wrong at the border")
    clean = recheck.CleanResult(cells={"test_speedup": speed, "test_fused": check})
    result = pipeline.combine(sub, clean, [], hand_graded=["answer", "test_fused"])
    assert result.total == 3.0 and result.max_total == 6.0
    assert result.manual_cells == ["answer"]  # a test the recheck scored is not also left to a person


def test_children_share_the_cpu_cores_and_name_their_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(pipeline.schedule, "available_cores", lambda: 16)
    assert pipeline._threads_per_child(5) == 3 and pipeline._threads_per_child(40) == 1
    settings = pipeline.Settings(out=tmp_path, shared_builds=tmp_path, cpu_threads=3)
    env = pipeline._base_env(settings, tmp_path, "0")
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # idle OpenMP threads sleep rather than spin on the cores the submission's other processes wait for, and the
    # setting reaches the sandboxed processes (their environment is cut to an allow-list)
    assert isolate.worker_env(env)["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # a teaching assistant's own setting wins
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    env = pipeline._base_env(settings, tmp_path, "0")
    assert env["OMP_NUM_THREADS"] == "7" and env.get("OMP_WAIT_POLICY", "ACTIVE") == "ACTIVE"


NEVER_READS = """
import os, sys, time
from fuselab.grading.recheck import channel
to_grader = channel.Sender(int(os.environ["TEST_CHANNEL_FD"]))
for number in range(1, int(sys.argv[1]) + 1):  # asks and gives back, never reading a grant
    to_grader.send(channel.Ask(sys.argv[2], number))
    time.sleep(0.003)
    to_grader.send(channel.GiveBack(sys.argv[2], number))
    time.sleep(0.003)
time.sleep(30)
"""


@pytest.mark.parametrize("what", ["gpu", "slot"], ids=["the-GPU-to-itself", "a-speed-test-slot"])
def test_a_child_that_floods_asks_and_reads_no_grant_is_stopped_and_gives_all_back(monkeypatch, what):
    # The grant pipe is the child's: one that asks without reading fills it. The grader never blocks on it (it
    # would hold every submission on the GPU): the grant that does not fit stops the child, and the GPU and the
    # slot come back.
    import fcntl
    monkeypatch.setattr(lease, "wait_until_idle", lambda device, timeout_s: "")  # no NVML settle wait
    shared = lease.DeviceLease("0", speed_slots=1)
    child, server, serve = leased_child(NEVER_READS, [20000, what], shared)
    fcntl.fcntl(server._answer_with.write_fd, 1031, 4096)  # F_SETPIPE_SZ: a page, full after ~400 grants
    try:
        deadline = time.monotonic() + 60
        while server.stop_reason is None and time.monotonic() < deadline:
            serve()
        assert server.stop_reason and "could not be answered" in server.stop_reason
        assert "could not be given" in server.notes[-1]
        server.close()
        assert shared._timing.acquire(timeout=1), "the GPU was not given back"
        shared._timing.release()
        assert shared.speed_slots.acquire(blocking=False), "the slot was not given back"
    finally:
        child.stop()
        child.wait()


def test_a_lease_held_too_long_is_taken_back(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: None)
    shared = lease.DeviceLease("0", max_hold_s=0.3)
    holder = isolate.Child([sys.executable, "-c", "import time; time.sleep(30)"], limits=_limits(), registry=shared)
    other = isolate.Child([sys.executable, "-c", "import time; time.sleep(30)"], limits=_limits(), registry=shared)
    try:
        server = lease.LeaseServer(shared, holder, lambda what, number: True)
        server.ask("gpu", 1)  # asked, never given back
        server.poll()
        assert server.holding is not None
        assert _state(other.process.pid) == "T"
        time.sleep(0.4)
        assert shared.stopped_seconds(other) >= 0.3  # the pause counts while it lasts
        server.poll()
        assert server.stop_reason and server.holding is None
        assert _state(other.process.pid) != "T"
    finally:
        for child in (holder, other):
            child.stop()
            child.wait()


def _state(pid):
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_hold_stops_every_other_tree_from_one_scan_and_resumes_them(tmp_path):
    import subprocess
    import sys
    from fuselab.grading.gpus import lease
    trees = [subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                               "print(child.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        children = [int(tree.stdout.readline()) for tree in trees]
        stopped = lease._signal_trees([tree.pid for tree in trees], lease.signal.SIGSTOP)
        assert all({tree.pid, child} <= set(stopped[tree.pid]) for tree, child in zip(trees, children))
        pids = [p for tree, child in zip(trees, children) for p in (tree.pid, child)]

        def states_become(wanted):  # a signal is delivered soon, not at once
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not all(wanted(_state(p)) for p in pids):
                time.sleep(0.05)
            return [_state(p) for p in pids]

        assert set(states_become(lambda state: state == "T")) == {"T"}
        lease._signal_trees([tree.pid for tree in trees], lease.signal.SIGCONT)
        assert "T" not in states_become(lambda state: state != "T")
    finally:
        for tree in trees:
            isolate.kill_tree(tree.pid)
            tree.wait()


class _PausedRegistry:
    """A registry that says its child was stopped for others' timings for ``seconds``."""

    def __init__(self, seconds):
        self.seconds = seconds

    def register(self, child):
        pass

    def unregister(self, child):
        pass

    def stopped_seconds(self, child):
        return self.seconds


def test_wall_limits_leave_out_pauses_and_a_late_wait_is_no_timeout():
    paused = isolate.run([sys.executable, "-c", "import time; time.sleep(2)"],
                         limits=isolate.Limits(wall_s=1, memory_bytes=None), registry=_PausedRegistry(5.0))
    assert paused.ok, paused.describe()
    slow = isolate.run([sys.executable, "-c", "import time; time.sleep(5)"],
                       limits=isolate.Limits(wall_s=1, memory_bytes=None))
    assert slow.timed_out and slow.seconds < 4
    crasher = isolate.Child([sys.executable, "-c", "import os, signal, time; time.sleep(1.5); "
                             "os.kill(os.getpid(), signal.SIGSEGV)"], limits=_limits())
    while crasher.alive():
        time.sleep(0.05)
    outcome = crasher.wait(timeout=1)  # the child is older than the timeout: it ended, it did not time out
    assert not outcome.timed_out and "SIGSEGV" in outcome.describe()


FORGE = r'''
import json, os, sys
if "cellrunner" in sys.argv[0]:  # the checker: its last argument is its pipe to the grader
    garbage = ["[1]", '"x"', '{"index": 0}', json.dumps({"kind": "start", "index": 99, "grade_id": None}),
               json.dumps({"kind": "end", "index": "0", "grade_id": None}),
               json.dumps({"kind": "start", "index": 0, "grade_id": None, "time": "soon"}),
               json.dumps({"kind": "done", "padding": "x" * (2**20 + 10)})]
    with open(int(sys.argv[2]), "wb", closefd=False) as channel:
        channel.write("".join(line + "\n" for line in garbage).encode())
'''


def test_garbage_on_the_checkers_channel_does_not_break_the_clean_recheck(tmp_path):
    from .test_grader_isolation import _cell, _notebook
    # on the checker's own pipe to the grader: lines that are not JSON, not objects, of no kind, of a cell not in
    # the plan, with a field of the wrong type, and a record past the size limit; the checker's own records
    # around them still count
    notebook = _notebook([_cell("VALUE = 41", "setup"), _cell(FORGE, "forge"),
                          _cell("def answer():\n    return VALUE + 1", "solution", solution=True),
                          _cell("assert answer() == 42", "test_one", graded=True, points=2),
                          _cell("assert answer() == 42", "test_two", graded=True, points=3)])
    result = recheck.run_clean(notebook, notebook, tmp_path, cell_timeout=20, total_timeout=60,
                               limits=isolate.Limits(memory_bytes=2 * 2**30))
    assert {k: v.points for k, v in result.cells.items()} == {"test_one": 2.0, "test_two": 3.0}


@pytest.mark.parametrize("waiting", [1, 3])
def test_an_endless_kernel_of_a_stopped_submission_is_waited_out_not_frozen(tmp_path, monkeypatch, waiting):
    # SIGSTOP stops a process, not its kernel: the GPU stays busy while its owner is stopped. The lease must let
    # the owner run between tries, however many timings wait, so that its own time limit comes (here: a watcher
    # ends it once it has run long enough after the first try stopped it).
    import threading
    shared = lease.DeviceLease("0", idle_timeout_s=1, own_busy_timeout_s=30, settle_s=0.3)
    counter = tmp_path / "counter"
    culprit = isolate.Child([sys.executable, "-c", COUNTER, str(counter)], limits=_limits(), registry=shared)
    holders = [isolate.Child([sys.executable, "-c", "import time; time.sleep(60)"], limits=_limits(),
                             registry=shared) for _ in range(waiting)]
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: 100 if culprit.alive() else 0)
    # the culprit is the sharing submission with a context on the GPU
    monkeypatch.setattr(lease, "gpu_processes", lambda device: [culprit.process.pid] if culprit.alive() else [])
    tries, spans, first_stop = [], [], threading.Event()
    settle = lease.wait_until_idle

    def counted_settle(device, timeout_s):
        if not tries:
            tries.append(int(counter.read_text() or 0))  # the culprit's count when it was first stopped
            first_stop.set()
        else:
            tries.append(None)
        started = time.monotonic()
        busy = settle(device, timeout_s)
        spans.append((started, time.monotonic(), busy))
        return busy
    monkeypatch.setattr(lease, "wait_until_idle", counted_settle)
    try:
        _wait_for_file(counter)

        def limit_reached():  # the culprit's own clock runs only while it is not stopped
            first_stop.wait(30)
            while culprit.alive():
                if int(counter.read_text() or 0) >= tries[0] + 40 * waiting:
                    culprit.stop()
                time.sleep(0.01)
        threading.Thread(target=limit_reached, daemon=True).start()
        outcomes = []

        def time_it(holder):
            waited, note = shared.acquire(holder)
            outcomes.append((waited, note, culprit.alive()))
            shared.release()
        threads = [threading.Thread(target=time_it, args=(h,)) for h in holders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(outcomes) == waiting and len(tries) >= 2  # the first try found the GPU busy
        # after every try that found it busy, everyone ran for the cool-down (twice the settle time) before the
        # next try, whichever timing made it
        for (_, ended, busy), (next_started, _, _) in zip(spans, spans[1:]):
            assert not busy or next_started - ended >= 2 * 0.3 * 0.95, spans
        for waited, note, culprit_alive in outcomes:
            assert note == "" and not culprit_alive and waited < 12  # the culprit ran 2/3 of the time
    finally:
        for child in [culprit, *holders]:
            child.stop()
            child.wait()


def test_how_long_a_timing_waits_for_a_busy_gpu_depends_on_whose_it_may_be(monkeypatch):
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: 100)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    holder = isolate.Child(sleeper, limits=_limits())
    try:
        # another program on the GPU: the short limit, and the note names it
        stranger = __import__("os").getppid()  # a live process the grader did not start
        monkeypatch.setattr(lease, "gpu_processes", lambda device: [stranger])
        shared = lease.DeviceLease("0", idle_timeout_s=0.5, own_busy_timeout_s=60, settle_s=0.2)
        waited, note = shared.acquire(holder)
        shared.release()
        assert waited < 10 and "another program" in note and str(stranger) in note
        # nobody visible on it (no nvidia-smi, or another PID namespace): the short limit too
        monkeypatch.setattr(lease, "gpu_processes", lambda device: [])
        waited, note = shared.acquire(holder)
        shared.release()
        assert waited < 10 and "no process of another submission" in note
        # a submission sharing the GPU has a context on it: the long limit (here short, to end the test)
        shared = lease.DeviceLease("0", idle_timeout_s=60, own_busy_timeout_s=0.8, settle_s=0.2)
        neighbour = isolate.Child(sleeper, limits=_limits(), registry=shared)
        monkeypatch.setattr(lease, "gpu_processes", lambda device: [neighbour.process.pid])
        try:
            waited, note = shared.acquire(holder)
            shared.release()
            assert 0.5 <= waited < 10 and "does not end" in note and "may be disturbed" in note
        finally:
            neighbour.stop()
            neighbour.wait()
    finally:
        holder.stop()
        holder.wait()


def test_a_timing_whose_process_dies_while_waiting_gives_up_the_gpu(monkeypatch):
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: 100)
    shared = lease.DeviceLease("0", idle_timeout_s=60, own_busy_timeout_s=60, settle_s=0.2)
    neighbour = isolate.Child([sys.executable, "-c", "import time; time.sleep(60)"], limits=_limits(),
                              registry=shared)
    holder = isolate.Child([sys.executable, "-c", "import time; time.sleep(0.5)"], limits=_limits(),
                           registry=shared)
    monkeypatch.setattr(lease, "gpu_processes", lambda device: [neighbour.process.pid])
    try:
        started = time.monotonic()
        assert shared.acquire(holder) is None
        assert time.monotonic() - started < 10
        assert shared._timing.acquire(blocking=False), "the lease was left held"
        shared._timing.release()
        assert shared.stopped_seconds(neighbour) > 0 and neighbour.alive()
        assert not shared._stopped, "a submission was left stopped"
    finally:
        for child in (neighbour, holder):
            child.stop()
            child.wait()


@pytest.mark.parametrize("sandbox", [False, True], ids=["unsandboxed", "sandboxed"])
def test_a_long_wait_for_the_gpu_is_not_held_against_the_test_that_waits(tmp_path, monkeypatch, sandbox):
    # Another submission's timing holds the GPU longer than this test's time limit. The test asks for the GPU as
    # soon as it starts, so the grader meets its start only after the wait: the wait must still be a pause.
    # Sandboxed too: the checker asks over the pipes the grader opened for it, which the sandbox passes on.
    import threading
    if sandbox:
        assert isolate.sandbox_problem() is None, "the sandbox must work here (CI installs bubblewrap)"
    from .test_grader_isolation import _cell, _notebook
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: None)
    shared = lease.DeviceLease("0", settle_s=0.05)
    shared._timing.acquire()  # the other submission's timing (everyone else runs meanwhile, as in a cool-down)
    threading.Timer(15.0, shared._timing.release).start()
    timed = ("from fuselab.speed.lease import exclusive_gpu\nwith exclusive_gpu():\n    pass\n"
             "assert answer() == 42")
    notebook = _notebook([_cell("VALUE = 41", "setup"),
                          _cell("def answer():\n    return VALUE + 1", "solution", solution=True),
                          _cell(timed, "test_timed", graded=True, points=4)])
    result = recheck.run_clean(notebook, notebook, tmp_path / "clean", cell_timeout=4, total_timeout=60,
                               limits=isolate.Limits(memory_bytes=2 * 2**30), lease=shared, sandbox=sandbox)
    verdict = result.cells["test_timed"]
    assert verdict.status == "passed" and verdict.points == 4, verdict.message
    assert result.gpu_wait_s > 4  # it did wait past its time limit, and the wait was not its own time
    # and the timeline says where the speed test's time went (the throughput report's medians read it)
    assert result.timeline[recheck.LEASE_WAIT] > 4 and recheck.SLOT_WAIT not in result.timeline
    assert result.gpu_holds and not list((tmp_path / "clean").rglob("lease-*")), "the lease needs no files"


def test_the_pause_log_gives_the_pause_total_when_a_test_started():
    log = recheck.PauseLog()
    assert log.at(time.time()) == 0.0
    log.sample(1.0)
    started = time.time()
    time.sleep(0.01)
    log.sample(131.0)  # a wait of 130 s ended after the test had started
    assert log.at(started) == 1.0 and log.at(time.time()) == 131.0


KERNEL_WORKER_TIMING = """
import io, os, pickle, sys
from fuselab.grading.recheck import kernel_worker, wire
from fuselab.speed import lease
in_fd, out_fd, marker = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
lease.ask_through(lambda: kernel_worker._lease_from_checker(in_fd, out_fd))
while True:
    try:
        label, timings = pickle.load(io.BytesIO(wire.receive(in_fd)))
    except EOFError:
        break
    seen = []
    for _ in range(timings):  # each timing: did the checker hold the GPU while it ran?
        with lease.exclusive_gpu():
            seen.append(os.path.exists(marker))
    wire.send(out_fd, wire.dump_tree(["ok", wire.encode([label, seen])]))
"""


def test_the_kernel_worker_holds_the_gpu_only_while_it_times_through_its_checker(tmp_path, monkeypatch):
    # The kernel worker never talks to the grader: its timing asks its checker, which takes the grader's lease for
    # it at the ask and gives it back after its own batches (the checks before a timing share the GPU). A second
    # ask in one speed test, or an ask in a request that is no speed test, is refused: that timing runs unheld.
    import contextlib
    import os
    from fuselab.grading.recheck import kernels, remote
    marker = tmp_path / "held"
    holds = []

    @contextlib.contextmanager
    def checker_lease():
        marker.write_text("")
        holds.append("taken")
        try:
            yield
        finally:
            marker.unlink()
            holds.append("given back")
    monkeypatch.setattr("fuselab.speed.lease.exclusive_gpu", checker_lease)
    to_worker_r, to_worker_w = os.pipe()
    from_worker_r, from_worker_w = os.pipe()
    worker = subprocess.Popen([sys.executable, "-c", KERNEL_WORKER_TIMING, str(to_worker_r), str(from_worker_w),
                               str(marker)], pass_fds=(to_worker_r, from_worker_w))
    os.close(to_worker_r)
    os.close(from_worker_w)
    host = kernels.KernelHost.__new__(kernels.KernelHost)
    host.process, host.holding = remote.SolutionProcess(to_worker_w, from_worker_r), False
    try:
        with contextlib.ExitStack() as hold:
            assert host.process.result(host.request(("speed", 1), hold=hold)) == ["speed", [True]]
            assert holds == ["taken"] and host.holding  # the checker's own batches follow in the same hold
        assert holds == ["taken", "given back"] and not host.holding and not marker.exists()
        with contextlib.ExitStack() as hold:  # asked twice: one hold, the second ask refused (and seen inside it)
            assert host.process.result(host.request(("speed twice", 2), hold=hold)) == ["speed twice", [True, True]]
        assert host.process.result(host.request(("cell", 1))) == ["cell", [False]]  # no hold offered: refused
        assert holds == ["taken", "given back"] * 2
    finally:
        os.close(to_worker_w)
        worker.wait(timeout=30)
        os.close(from_worker_r)


SLOT_USER = """
import os, sys, time
from fuselab.speed.lease import speed_test_slot
# all three ask for a slot together, however slowly each started on a busy machine: else the last to start may
# find the others done and never wait, and the test would measure the machine's load, not the slots
open(os.path.join(sys.argv[3], os.path.basename(os.path.dirname(sys.argv[1]))), "w").close()
deadline = time.time() + 60
while len(os.listdir(sys.argv[3])) < 3 and time.time() < deadline:
    time.sleep(0.01)
with speed_test_slot():
    started = time.time()
    if sys.argv[2] == "dies":
        os._exit(1)  # killed inside its speed test: never says it is done
    time.sleep(0.6)
open(sys.argv[1], "w").write(repr([started, time.time()]))
"""


@pytest.mark.parametrize("slots, dies", [(2, False), (1, True)])
def test_speed_tests_take_turns_for_the_gpus_memory_as_many_at_once_as_it_has_slots(tmp_path, slots, dies):
    # Speed tests at GPU size, in every submission sharing the GPU at once, ran it out of memory (every Lab 0 speed
    # test of the first round failed at 10 sharing an H200). They take slots: the GPU stays shared, at most
    # `slots` of them at once, and a child that dies in its speed test gives its slot back.
    import threading
    shared = lease.DeviceLease("0", speed_slots=slots)
    servers, reports = [], []
    ready = tmp_path / "ready"
    ready.mkdir()
    for k in range(3):
        folder = tmp_path / f"submission{k}"
        folder.mkdir()
        reports.append(folder / "span")
        child, server, serve = leased_child(SLOT_USER, [reports[-1], "dies" if dies and k == 0 else "", ready],
                                            shared)
        servers.append((server, serve))

    def loop(server, serve):  # as each submission's recheck loop does, in a thread of its own
        while server.child.alive():
            serve()
            time.sleep(0.01)
        serve()
        server.close()
    threads = [threading.Thread(target=loop, args=pair) for pair in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    spans = [eval(r.read_text()) for r in reports if r.exists()]  # noqa: S307 - our own child's repr
    assert len(spans) == (2 if dies else 3)
    most_at_once = max(sum(start <= t < end for start, end in spans) for t, _ in spans)
    assert most_at_once == (1 if dies else 2)
    # the wait for a slot is a pause (not held against the test's time limit), however long it lasts
    servers = [server for server, _ in servers]
    assert max(server.waited_s for server in servers) > 0.3
    assert all(server.slot_waited_s == server.waited_s for server in servers)  # none waited for the GPU alone
    # every slot came back, the dead child's too
    assert all(shared.speed_slots.acquire(blocking=False) for _ in range(slots))
    assert not shared.speed_slots.acquire(blocking=False)


def test_a_child_that_ended_is_never_signalled_by_its_pid(monkeypatch):
    # A child whose process ended and was reaped (the grader's loop and its watch ``poll`` it) stays registered until
    # its ``wait``: its pid is free meanwhile, for any process or a thread of the grader's own. A timing then must
    # not stop (or continue) that pid.
    import signal
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: None)
    shared = lease.DeviceLease("0")
    ended = isolate.Child([sys.executable, "-c", "pass"], limits=_limits(), registry=shared)
    while ended.alive():  # poll() reaps it
        time.sleep(0.05)
    assert ended.process.returncode is not None and ended in shared._children
    running = isolate.Child([sys.executable, "-c", "import time; time.sleep(30)"], limits=_limits(), registry=shared)
    holder = isolate.Child([sys.executable, "-c", "import time; time.sleep(30)"], limits=_limits(), registry=shared)
    signalled = []
    real = lease._signal_trees
    monkeypatch.setattr(lease, "_signal_trees", lambda roots, sig: signalled.append((list(roots), sig)) or real(roots, sig))
    try:
        shared.acquire(holder)
        shared.release()
    finally:
        for child in (holder, running, ended):
            child.stop()
            child.wait()
    assert signalled == [([running.process.pid], signal.SIGSTOP), ([running.process.pid], signal.SIGCONT)]


def test_a_timing_waiting_takes_the_gpu_straight_on_and_the_others_stay_stopped(tmp_path, monkeypatch):
    # Resumed between two timings, the others would queue GPU work the next idle wait must drain: the GPU passes
    # from one timing to the next waiting with the others stopped throughout, the first holder stopped in its turn.
    import signal
    import threading
    monkeypatch.setattr(lease, "gpu_busy_percent", lambda device: None)
    shared = lease.DeviceLease("0")
    counters = {name: tmp_path / name for name in ("first", "second", "other")}
    children = {name: isolate.Child([sys.executable, "-c", COUNTER, str(path)], limits=_limits(), registry=shared)
                for name, path in counters.items()}
    signalled = []
    real = lease._signal_trees
    monkeypatch.setattr(lease, "_signal_trees",
                        lambda roots, sig: signalled.append((sorted(roots), sig)) or real(roots, sig))

    def read(name):
        return int(counters[name].read_text() or 0)

    def runs(name):  # its counter moves within half a second
        before = read(name)
        time.sleep(0.5)
        return read(name) > before
    try:
        for path in counters.values():
            _wait_for_file(path)
        assert shared.acquire(children["first"]) is not None
        second = threading.Thread(target=shared.acquire, args=(children["second"],))
        second.start()
        deadline = time.monotonic() + 10
        while shared._waiting == 0:
            assert time.monotonic() < deadline, "the second timing never waited"
            time.sleep(0.01)
        assert runs("first") and not runs("second") and not runs("other")
        shared.release()          # handed on: the second timing takes the GPU
        second.join(timeout=10)
        assert not second.is_alive()
        assert runs("second") and not runs("first") and not runs("other")
        shared.release()          # nobody waits: everyone runs again
        assert all(runs(name) for name in counters)
        paused = {name: shared.stopped_seconds(child) for name, child in children.items()}
    finally:
        for child in children.values():
            child.stop()
            child.wait()
    pid = {name: child.process.pid for name, child in children.items()}
    # the other submission: stopped once, resumed once, its pause the two timings together
    assert [sig for roots, sig in signalled if pid["other"] in roots] == [signal.SIGSTOP, signal.SIGCONT]
    assert [sig for roots, sig in signalled if pid["first"] in roots] == [signal.SIGSTOP, signal.SIGCONT]
    assert [sig for roots, sig in signalled if pid["second"] in roots] == [signal.SIGSTOP, signal.SIGCONT]
    assert paused["other"] >= 2.0 and paused["first"] >= 1.0 and 1.0 <= paused["second"] < paused["other"]
