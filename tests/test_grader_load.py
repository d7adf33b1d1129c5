"""Grades that do not depend on how busy the machine is.

A test's limit counts its own time (the CPU time of the checker and its workers); only a wall-clock backstop
stops a test that waits, and a test it stopped is run again alone before it scores 0 (``recheck.retry_overruns``,
``pipeline.retry_overruns``). The small synthetic notebooks here run in seconds; the sample class graded beside
CPU hogs is ``test_a_busy_machine_gives_every_sample_its_grade``.
"""

import contextlib
import os
import subprocess
import sys
import threading
import time

import pytest

from fuselab.grading.sandbox import isolate
from fuselab.grading.run import pipeline, samplecheck
from fuselab.grading.recheck import clean as recheck

from .test_grader_isolation import _cell, _notebook


def _instructor(middle):
    return _notebook([
        _cell("import time\nVALUE = 41", "setup"),
        _cell("def answer():\n    return VALUE + 1", "solution", solution=True),
        _cell("assert answer() == 42", "test_first", graded=True, points=2),
        *middle,
        _cell("assert answer() == 42", "test_last", graded=True, points=3),
    ])


def _run(nb, workdir, **limits):
    return recheck.run_clean(nb, nb, workdir, limits=isolate.Limits(memory_bytes=2 * 2**30), **limits)


# 2 s of its own time per test; 2 s by the clock on the first try (a retry gets 2 x 5 x 2 s = 20 s by the clock)
LIMITS = dict(cell_timeout=2.0, wall_timeout=2.0, total_timeout=60.0)


def _starved(monkeypatch):
    # a busy machine, as the grader sees it: the test's processes are runnable all along (state R) but get no
    # CPU time, and no CPU is idle, so its clock runs and its own time does not
    monkeypatch.setattr(recheck, "_running", lambda pid: True)
    monkeypatch.setattr(recheck, "_idle_ticks", lambda: 0)


def _retry(first, nb, tmp_path):
    return recheck.retry_overruns(first, nb, nb, tmp_path / "retry", **LIMITS,
                                  limits=isolate.Limits(memory_bytes=2 * 2**30))


def test_a_test_starved_of_the_cpu_is_retried_and_keeps_its_points(tmp_path, monkeypatch):
    _starved(monkeypatch)
    nb = _instructor([_cell("time.sleep(4)\nassert answer() == 42", "test_slow", graded=True, points=1)])
    first = _run(nb, tmp_path / "first", **LIMITS)
    slow = first.cells["test_slow"]
    assert slow.points == 0 and slow.status == "timed out" and "wall-clock" in slow.message
    assert first.retries_due == ["test_slow"]
    assert first.cells["test_first"].points == 2 and first.cells["test_last"].points == 3  # grading went on
    result = _retry(first, nb, tmp_path)
    slow = result.cells["test_slow"]
    assert slow.points == 1 and slow.status == "passed"
    assert "wall-clock" in slow.retry["first_try"] and slow.retry["retry"].startswith("passed, 1 of 1 points")
    assert result.retries_due == []
    assert result.cells["test_first"].points == 2 and result.cells["test_last"].points == 3
    assert result.timeline[recheck.RETRIED] > 0


def test_a_starved_hang_still_scores_zero_in_bounded_time(tmp_path, monkeypatch):
    _starved(monkeypatch)
    nb = _instructor([_cell("time.sleep(10_000)", "test_hang", graded=True, points=1)])
    started = time.monotonic()
    result = _retry(_run(nb, tmp_path / "first", **LIMITS), nb, tmp_path)
    hang = result.cells["test_hang"]
    assert hang.points == 0 and hang.status == "timed out"
    assert "wall-clock" in hang.retry["first_try"] and hang.retry["retry"].startswith("timed out, 0 of 1 points")
    assert result.cells["test_last"].points == 3
    assert time.monotonic() - started < 240  # backstops of 2 s and 20 s, plus process starts on a loaded machine


@pytest.mark.parametrize("source", ["while True:\n    pass", "time.sleep(10_000)"])
def test_an_endless_loop_or_a_hang_is_stopped_by_its_own_time_and_not_retried(tmp_path, source):
    nb = _instructor([_cell(source, "test_stuck", graded=True, points=1)])
    # a backstop far away: what stops it is the CPU time it burns, or the time it waits, whatever the load
    result = _run(nb, tmp_path, cell_timeout=2.0, wall_timeout=600.0, total_timeout=600.0)
    stuck = result.cells["test_stuck"]
    assert stuck.points == 0 and stuck.status == "timed out" and "own time" in stuck.message
    assert stuck.retry == {} and result.retries_due == []
    assert result.cells["test_last"].points == 3


# a loop on one of 8 threads a child may use: its CPU time is divided by 8, so it reaches its limit of own time
# after 8 times it by the clock, and the backstop is further still (``wall_backstop``)
ONE_OF_EIGHT = ("while True:\n    pass", "8")
# children of a process that ignores SIGCHLD are reaped by the kernel: their CPU time reaches no parent's count.
# One spinning after another, a thread of the tree is runnable all along while CPUs are idle: that time is its own
REAPED = ("import os, signal\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\nwhile True:\n"
          "    if os.fork() == 0:\n        end = time.monotonic() + 0.3\n"
          "        while time.monotonic() < end:\n            pass\n        os._exit(0)\n    time.sleep(0.15)", "2")


@pytest.mark.parametrize("loop, threads", [ONE_OF_EIGHT, REAPED], ids=["one-of-eight-threads", "reaped-children"])
def test_a_loop_that_could_look_starved_is_stopped_by_its_own_limit_not_the_backstop(tmp_path, loop, threads):
    # a backstop's stop would be retried alone, with every other submission held: these score 0 "timed out"
    assert recheck.wall_backstop(8) >= 2 * 8 and recheck.wall_backstop(1) == recheck.WALL_BACKSTOP
    nb = _instructor([_cell(loop, "test_loop", graded=True, points=1)])
    result = recheck.run_clean(nb, nb, tmp_path, limits=isolate.Limits(memory_bytes=2 * 2**30),
                               env=dict(os.environ, OMP_NUM_THREADS=threads), cell_timeout=1.0, total_timeout=60.0)
    stopped = result.cells["test_loop"]
    assert stopped.points == 0 and stopped.status == "timed out" and "own time" in stopped.message, stopped.message
    assert stopped.retry == {} and result.retries_due == []
    assert result.cells["test_last"].points == 3


def _oom_on_first_try(marker):
    # the shared GPU full on the first try, free on the retry: the error torch raises when an allocation fails
    return (f"import os\nif os.path.exists({str(marker)!r}):\n    os.unlink({str(marker)!r})\n"
            "    import torch\n    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 512.00 MiB. "
            "GPU 0 has a total capacity of 79.18 GiB of which 76.56 MiB is free.')\nassert answer() == 42")


def _oom_in_a_hidden_test(marker):
    # as a kernel worker's launch meets it: a RuntimeError carrying torch's words, raised inside a hidden test,
    # whose message the student never sees (on an H100 with 14 sharing, a correct Lab 0 lost 3 points so)
    return ("### BEGIN HIDDEN TESTS\n" + _oom_on_first_try(marker).replace("torch.OutOfMemoryError", "RuntimeError")
            + "\n### END HIDDEN TESTS")


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_a_test_that_ran_out_of_the_shared_gpus_memory_is_retried_alone(tmp_path, hidden):
    marker = tmp_path / "gpu-full"
    marker.write_text("")
    source = (_oom_in_a_hidden_test if hidden else _oom_on_first_try)(marker)
    nb = _instructor([_cell(source, "test_big", graded=True, points=2)])
    first = _run(nb, tmp_path / "first", **LIMITS)
    big = first.cells["test_big"]
    assert big.points == 0 and big.status == "failed"
    assert "The GPU ran out of memory." in big.message and "512.00 MiB" not in big.message if hidden else \
        "OutOfMemoryError" in big.message, big.message
    assert first.retries_due == ["test_big"] and big.retry["first_try"] == recheck.GPU_MEMORY_RAN_OUT
    result = _retry(first, nb, tmp_path)
    big = result.cells["test_big"]
    assert big.points == 2 and big.status == "passed"
    assert big.retry["first_try"] == recheck.GPU_MEMORY_RAN_OUT and big.retry["retry"].startswith("passed, 2 of 2")
    assert result.retries_due == [] and result.cells["test_last"].points == 3


def test_running_out_of_gpu_memory_alone_too_scores_zero_and_other_failures_are_not_retried(tmp_path):
    always = ("import torch\nraise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 80.00 GiB.')")
    nb = _instructor([_cell(always, "test_huge", graded=True, points=1),
                      _cell("assert answer() == 41, 'off by one'", "test_wrong", graded=True, points=1)])
    first = _run(nb, tmp_path / "first", **LIMITS)
    assert first.retries_due == ["test_huge"] and first.cells["test_wrong"].retry == {}
    huge = _retry(first, nb, tmp_path).cells["test_huge"]
    assert huge.points == 0 and huge.retry["retry"].startswith("failed, 0 of 1 points")


def test_a_retry_only_a_failures_words_asked_for_holds_the_others_only_briefly():
    # "out of memory" is text a submission can write: its function can raise it, then wait out a retry with the
    # machine to itself. Such a hold ends after its bound; the retry goes on, and the others start again beside it.
    alone = pipeline._Alone()
    retrying, started_beside = threading.Event(), []

    def retry(hold_s):
        with alone.alone(hold_s):
            retrying.set()
            time.sleep(3.0)

    def other():
        with alone.sharing():
            started_beside.append(time.monotonic())

    for hold_s, within in ((0.5, (0.3, 2.5)), (None, (2.8, 30.0))):
        started_beside.clear()
        retrying.clear()
        holder = threading.Thread(target=retry, args=(hold_s,))
        holder.start()
        retrying.wait(10)
        began = time.monotonic()
        sharer = threading.Thread(target=other)
        sharer.start()
        sharer.join(30)
        holder.join(30)
        assert within[0] <= started_beside[0] - began <= within[1], (hold_s, started_beside[0] - began)
    with alone.alone():  # a hold let go early leaves the machine free for the next retry, and to its end
        pass


def test_a_retry_waiting_for_a_long_run_to_end_holds_the_others_back_only_for_a_while():
    # a submission running long (a second one of the same student's, say) must not hold the whole class back
    # through another's retry: new runs wait for the drain only DRAIN_HOLD_S, then start beside the long one
    alone = pipeline._Alone()
    alone.DRAIN_HOLD_S = 0.5
    events, long_started = [], threading.Event()

    def long_run():
        with alone.sharing():
            long_started.set()
            time.sleep(3.0)
            events.append(("long ends", time.monotonic()))

    def retry():
        with alone.alone():
            events.append(("retry starts", time.monotonic()))

    def new_run():
        with alone.sharing():
            events.append(("new starts", time.monotonic()))
            time.sleep(0.5)

    threads = [threading.Thread(target=long_run)]
    threads[0].start()
    long_started.wait(10)
    began = time.monotonic()
    threads.append(threading.Thread(target=retry))
    threads[-1].start()
    time.sleep(0.1)
    threads.append(threading.Thread(target=new_run))
    threads[-1].start()
    for thread in threads:
        thread.join(30)
    when = {what: at - began for what, at in events}
    assert 0.4 <= when["new starts"] < 2.5, when  # after the drain's hold, while the long run still runs
    assert when["retry starts"] >= when["long ends"], when  # the retry still has the machine alone, later


def test_a_retry_let_go_early_still_keeps_the_next_retry_waiting_for_its_end():
    alone = pipeline._Alone()
    events, holding = [], threading.Event()

    def first():
        with alone.alone(0.3):  # let go after 0.3 s, goes on 2 s
            holding.set()
            time.sleep(2.0)
            events.append(("first ends", time.monotonic()))

    def second():
        with alone.alone():
            events.append(("second starts", time.monotonic()))

    threads = [threading.Thread(target=first)]
    threads[0].start()
    holding.wait(10)
    time.sleep(0.6)  # past the first's hold
    threads.append(threading.Thread(target=second))
    threads[1].start()
    for thread in threads:
        thread.join(30)
    when = dict(events)
    assert when["second starts"] >= when["first ends"], events
    assert alone._running == 0 and alone._holder is None and not alone._waiting


def test_only_a_retry_the_grader_saw_the_need_for_holds_the_others_to_its_end(tmp_path, monkeypatch):
    holds = []

    @contextlib.contextmanager
    def alone(hold_s=None):
        holds.append(hold_s)
        yield

    (tmp_path / "nb.ipynb").write_text("{}")
    monkeypatch.setattr(pipeline.ALONE, "alone", alone)
    monkeypatch.setattr(pipeline.recheck, "retry_overruns", lambda *a, **k: None)
    monkeypatch.setattr(pipeline, "_base_env", lambda *a: {})
    memory = recheck.CellVerdict("test_a", 0, 1, "failed", retry={"first_try": recheck.GPU_MEMORY_RAN_OUT})
    wall = recheck.CellVerdict("test_b", 0, 1, "timed out", retry={"first_try": "timed out: still running after"})
    least = pipeline.MEMORY_RETRY_MIN_S
    for cells, reference_s, hold in (({"test_a": memory}, 400.0, 400.0 * pipeline.MEMORY_RETRY_HOLD),
                                     ({"test_a": memory}, 1.0, least), ({"test_a": memory}, None, least),
                                     ({"test_a": memory}, float("nan"), least), ({"test_a": memory}, True, least),
                                     ({"test_a": memory, "test_b": wall}, 40.0, None), ({"test_b": wall}, 40.0, None)):
        run = pipeline.SubmissionRun(sub=type("Sub", (), {"notebook": tmp_path / "nb.ipynb"})(), device=None,
                                     settings=pipeline.Settings(out=tmp_path), source=None, workdir=tmp_path,
                                     reference_s=reference_s, clean=recheck.CleanResult(cells=dict(cells)))
        pipeline.retry_overruns(run)
        assert holds.pop() == hold, (cells, reference_s)


def test_the_cpu_of_a_tree_counts_its_descendants():
    code = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass']); "
            "import time; time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        meter = recheck.TreeMeter([child.pid], every_s=0.0)
        deadline = time.monotonic() + 120
        while meter.read()[0] < 1.0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert meter.read()[0] >= 1.0  # the grandchild's second, while it ran and after its parent reaped it
        blocked = meter.read()[1]
        time.sleep(1.5)
        assert meter.read()[1] - blocked >= 1.0  # now it sleeps: none of its threads runs
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("lowered", ["os.nice(5)", "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))",
                                     "os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))"])
def test_a_thread_that_lowered_its_own_priority_counts_as_waiting_by_choice(lowered):
    """Waiting for a CPU does not count as a test's own time; a thread that lowered its own priority (starved on a
    loaded machine, yet runnable) would have kept a hanging test looking busy until the wall-clock backstop. Such a
    thread counts as not running, so its tree's waiting is its own time; a thread at its first priority counts as
    running."""
    spin = "import os, threading, time\n{}\nwhile True: pass"
    for code, counted in ((spin.format(lowered), False), (spin.format("pass"), True)):
        child = subprocess.Popen([sys.executable, "-c", code])
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not _spun(child.pid):
                time.sleep(0.05)
            seen = [recheck._running(child.pid) for _ in range(20) if not time.sleep(0.01)]
            assert any(seen) is counted and all(seen) is counted, (code, seen)
        finally:
            child.kill()
            child.wait()


def _spun(pid) -> bool:
    """Whether ``pid`` has used a tenth of a second of CPU (it is past its start and spinning)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK") >= 0.1


def test_a_retry_runs_with_no_other_submission_running():
    gate, log = pipeline._Alone(), []
    first_in, release = threading.Event(), threading.Event()

    def submission(name, hold):
        with gate.sharing():
            log.append(f"{name} in")
            first_in.set()
            hold.wait(30)
            log.append(f"{name} out")

    def retry():
        with gate.alone():
            log.append("retry in")
            time.sleep(0.2)
            log.append("retry out")

    running = threading.Thread(target=submission, args=("a", release))
    running.start()
    first_in.wait(30)
    retrying = threading.Thread(target=retry)
    retrying.start()
    time.sleep(0.2)
    done = threading.Event()
    done.set()
    later = threading.Thread(target=submission, args=("b", done))
    later.start()  # waits: a retry is waiting for the machine
    time.sleep(0.2)
    assert log == ["a in"]
    release.set()
    for thread in (running, retrying, later):
        thread.join(30)
    assert log[:4] == ["a in", "a out", "retry in", "retry out"] and log[4] == "b in"


# --- the sample class on a busy machine ---------------------------------------------------------------------------

# Lab 0's correct sample and its endless one, beside a CPU hog per core. Each test's own limit is CI's (30 s; the
# slowest of these tests needs about half of it), its first try's clock limit so tight that the correct sample's
# tests run past it: they are retried alone, beside the hogs still, with a backstop of 2 x 5 x 30 s.
BUSY_CLASS = [("correct", "lab0"), ("endless", "lab0")]
BUSY_LIMITS = dict(cell_timeout=30.0, cell_wall_timeout=5.0, submission_timeout=400.0)


@pytest.fixture(scope="module")
def busy(tmp_path_factory, instructor_references):
    out = tmp_path_factory.mktemp("busy")
    examples = samplecheck.stage(out / "examples", BUSY_CLASS)
    instructor_references.into(out / "run", ["lab0"])  # the submissions, not the reference run, meet the hogs
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(max(1, len(os.sched_getaffinity(0))))]
    try:
        started = time.monotonic()
        result = pipeline.grade(examples, pipeline.Settings(out=out / "run", progress=False, feedback=False,
                                                            cpu_workers=2, **BUSY_LIMITS))
        seconds = time.monotonic() - started
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return {"result": result, "seconds": seconds}


def test_a_busy_machine_gives_every_sample_its_grade(busy):
    result = busy["result"]
    rows = samplecheck.compare(result.results, on_gpu=False)
    assert sorted((r["sample"], r["lab"]) for r in rows) == sorted(BUSY_CLASS)
    assert all(r["ok"] for r in rows), "\n" + samplecheck.table(rows)
    by = {(r.student, r.lab): r for r in result.results}
    retried = {(r.student, r.lab, test): cell.retry for r in result.results
               for test, cell in r.cells.items() if cell.retry}
    assert retried, "no test ran past its first try's clock limit: the limits no longer make the machine busy"
    for (student, lab, test), retry in retried.items():
        assert "wall-clock" in retry["first_try"] and "retry" in retry
    report = (result.out / "report.md").read_text()
    assert "run again alone" in report
    student, lab, test = next(iter(retried))
    assert f"{student}/{lab}: {test} ran past a wall-clock limit" in report
    # the endless kernel: 0, "timed out", by its own time (on the first try or on the retry)
    endless = by[("endless", "lab0")].cells["test_fused"]
    assert endless.points == 0 and endless.status == "timed out" and "own time" in endless.message
