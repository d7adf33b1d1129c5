"""The numbers the grader's throughput report rests on: the machine's load, GPU memory, each submission's steps."""

import os
import time
import types

import pytest

from fuselab import gpu_facts
from fuselab.grading.gpus import schedule
from fuselab.tools import load_sampler
from fuselab.tools.gpu_selfcheck import grading_runs
from fuselab.tools.load_sampler import LoadSampler


def test_the_load_sampler_sees_a_busy_cpu(monkeypatch):
    monkeypatch.setattr(load_sampler, "_gpu_memory_used_mib", lambda: None)  # only the CPU here
    with LoadSampler(every_s=0.05) as load:
        since = time.monotonic()
        deadline = since + 0.5
        while time.monotonic() < deadline:
            pass
        until = time.monotonic()
    summary = load.summary(since, until)
    if summary["cpu_busy"] is None:
        pytest.skip("this kernel's /proc/stat counts nothing (gVisor)")
    assert summary["samples"] >= 3 and summary["gpu_memory_peak_gib"] is None
    # one busy core of the machine's: at least that share shows (other work may add more)
    assert 0.5 / (os.cpu_count() or 1) <= summary["cpu_busy"] <= 1.0
    assert load.summary(until + 60, until + 61)["cpu_busy"] is None  # no samples there: no number


def test_the_load_sampler_sees_the_host_memory_a_run_adds(monkeypatch):
    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert 0 < load_sampler._host_memory_used_gib() < total_gib  # /proc/meminfo read as GiB
    monkeypatch.setattr(load_sampler, "_gpu_memory_used_mib", lambda: None)
    used = iter([1.0, 1.0, 2.5, 3.5, 2.0] + [1.0] * 1000)  # GiB in use, one value a sample
    monkeypatch.setattr(load_sampler, "_host_memory_used_gib", lambda: next(used))
    with LoadSampler(every_s=0.05) as load:
        while len(load.samples) < 6:
            time.sleep(0.01)
    summary = load.summary()
    assert summary["host_memory_before_gib"] == 1.0 and summary["host_memory_peak_gib"] == 3.5


def test_the_load_sampler_averages_the_gpus_utilisation_and_the_kernels_share(monkeypatch):
    read_busy = load_sampler._gpu_busy_percent
    monkeypatch.setattr(load_sampler, "_gpu_memory_used_mib", lambda: None)
    busy = iter([[0], [100], [50], [30]] + [[0]] * 1000)  # one GPU's NVML utilisation, one reading a sample
    monkeypatch.setattr(load_sampler, "_gpu_busy_percent", lambda gpus=None: next(busy))
    jiffies = iter([(100, 1000, 10), (300, 1400, 60), (500, 1800, 110), (700, 2200, 160)] + [(700, 2200, 160)] * 1000)
    monkeypatch.setattr(load_sampler, "_cpu_jiffies", lambda: next(jiffies))
    with LoadSampler(every_s=0.02) as load:
        while len(load.samples) < 4:
            time.sleep(0.01)
    first, last = load.samples[0][0], load.samples[3][0]
    summary = load.summary(first, last)
    assert summary["gpu_busy"] == 0.45  # (0 + 100 + 50 + 30) / 4 percent
    assert summary["cpu_busy"] == 0.5 and summary["cpu_kernel_share"] == 0.25  # 150 of 600 busy jiffies
    monkeypatch.setattr(gpu_facts, "_nvml", lambda: None)
    assert read_busy() is None  # no NVML: no number, never a 0


class _FakeNvml:
    """NVML as ``pynvml`` shows it, for ``cards``: index → (UUID, total memory in MiB, or None: not readable)."""

    class NVMLError(Exception):
        pass

    def __init__(self, cards):
        self.cards = cards

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index not in self.cards:
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for index, (card, _) in self.cards.items():
            if card == uuid:
                return index
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetMemoryInfo(self, handle):
        mib = self.cards[handle][1]
        if mib is None:
            raise self.NVMLError("Not Supported")
        return types.SimpleNamespace(total=mib * 2**20, used=mib * 2**19)


def test_gpu_memory_is_read_from_nvml_by_index_or_uuid(monkeypatch):
    monkeypatch.setattr(gpu_facts, "_nvml", lambda: _FakeNvml({0: ("GPU-aaaa", 143771), 1: ("GPU-bbbb", 81559),
                                                                2: ("GPU-cccc", None)}))
    assert round(schedule.smallest_gpu_memory_gib(["0"]), 1) == 140.4
    assert round(schedule.smallest_gpu_memory_gib(["0", "GPU-bbbb"]), 1) == 79.6
    # unreadable or unknown (a MIG slice is neither an index nor a GPU UUID): no number, never the whole card's
    assert schedule.smallest_gpu_memory_gib(["2"]) is None
    assert schedule.smallest_gpu_memory_gib(["MIG-dddd"]) is None
    assert schedule.smallest_gpu_memory_gib(["0", "MIG-dddd"]) is None
    assert schedule.default_jobs_per_gpu(["1"], cores=16) == 10
    assert schedule.default_jobs_per_gpu(["0", "1"], cores=16) == 5
    assert schedule.default_jobs_per_gpu(["MIG-dddd"], cores=16) == schedule.UNKNOWN_MEMORY_JOBS
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert schedule.visible_gpus() == ["0", "1", "2"]
    assert load_sampler._gpu_memory_used_mib() is None  # one card unreadable: no sum that leaves it out


def test_the_load_sampler_says_which_processes_held_the_gpus_memory(monkeypatch):
    # Who held the GPU's memory limits how many submissions share it: NVML's per-process view of the visible GPUs,
    # by kind of process as the CPU scan names it, at the sample where they held the most together, and the most
    # one process of each kind held. A PID the scan did not see is said apart: still there (started meanwhile),
    # or of another PID namespace (NVML gives the driver's PIDs); a use NVML does not know is never a 0.
    import os
    gone = 2**22 + 7  # above any pid_max: no such process here
    cards = _FakeNvml({0: ("GPU-aaaa", 81559), 1: ("GPU-bbbb", 81559), 2: ("GPU-cccc", 81559)})
    on_cards = iter([{0: [(11, 500 * 2**20), (12, 2**30)]},
                     {0: [(11, 512 * 2**20), (12, 4 * 2**30), (gone, 100 * 2**20), (os.getpid(), 2**29)],
                      1: [(13, 2 * 2**30), (os.getppid(), 2**28), (14, None)], 2: [(15, 50 * 2**30)]},
                     {0: [(12, 2**30)]}] + [{}] * 1000)
    now: dict = {}

    def processes(handle):
        if handle == 0:
            now.clear()
            now.update(next(on_cards))
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in now.get(handle, [])]
    cards.nvmlDeviceGetComputeRunningProcesses = processes
    monkeypatch.setattr(gpu_facts, "_nvml", lambda: cards)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # card 2 is another program's: never counted
    monkeypatch.setattr(load_sampler, "_process_cpu", lambda: {
        11: ("checker", 1.0, 0.1), 12: ("kernel worker", 1.0, 0.1), 13: ("kernel worker", 1.0, 0.1),
        14: ("solution worker", 1.0, 0.1)})
    monkeypatch.setattr(load_sampler, "_gpu_busy_percent", lambda gpus=None: None)  # only the memory here
    with LoadSampler(every_s=0.02, processes=True) as load:
        deadline = time.monotonic() + 30
        while len(load.process_gpu_memory) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    held = load.gpu_memory_by_kind()
    assert held["at_peak"] == {
        "kernel worker": {"gib": 6.0, "processes": 2}, "checker": {"gib": 0.5, "processes": 1},
        load_sampler.OWN_PROCESS: {"gib": 0.5, "processes": 1}, load_sampler.NOT_SCANNED: {"gib": 0.25, "processes": 1},
        load_sampler.OTHER_NAMESPACE: {"gib": 0.1, "processes": 1},
        "solution worker": {"gib": 0.0, "processes": 1, "unknown": 1}}
    assert held["one_process_peak_gib"]["kernel worker"] == 4.0 and held["one_process_peak_gib"]["checker"] == 0.5
    assert load.gpu_memory_by_kind(time.monotonic() + 60) == {}  # no samples there: nothing said
    line = grading_runs.by_process({"phases": {"submissions": {"count": 2}}, "gpu_memory_by_process": held})
    assert ("GPU memory at its peak by process (GiB in processes): kernel worker 6.00 in 2, checker 0.50 in 1"
            in line and "solution worker 0.00 in 1 (1 of them unknown to NVML)" in line)
    assert "the most one process held (GiB): kernel worker 4.00" in line

    def broken(handle):
        raise RuntimeError("a binding's surprise")
    cards.nvmlDeviceGetComputeRunningProcesses = broken
    with LoadSampler(every_s=0.02, processes=True) as load:  # a sample's memory view is lost, not the sampling
        deadline = time.monotonic() + 30
        while len(load.process_cpu) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(load.process_cpu) >= 3 and load.process_gpu_memory == []
    monkeypatch.setattr(gpu_facts, "_nvml", lambda: None)
    assert gpu_facts.compute_memory_mib() == {}


def test_no_nvml_or_a_failing_one_gives_no_gpu_facts(monkeypatch):
    gpu_facts._nvml.cache_clear()
    real = gpu_facts._nvml()  # this machine's: None without a GPU, a driver or pynvml
    assert real is None or hasattr(real, "nvmlDeviceGetCount")
    monkeypatch.setattr(gpu_facts, "_nvml", lambda: None)
    assert schedule.smallest_gpu_memory_gib(["0"]) is None
    assert gpu_facts.indices() == [] and gpu_facts.compute_pids() == [] and gpu_facts.busy_percent("0") is None
    assert gpu_facts.model("0") is None and load_sampler._gpu_memory_used_mib() is None
    broken = _FakeNvml({0: ("GPU-aaaa", 143771)})
    broken.nvmlDeviceGetMemoryInfo = broken.nvmlDeviceGetCount = lambda *a: (_ for _ in ()).throw(
        _FakeNvml.NVMLError("GPU is lost"))
    monkeypatch.setattr(gpu_facts, "_nvml", lambda: broken)
    assert schedule.smallest_gpu_memory_gib(["0"]) is None and gpu_facts.indices() == []


def test_available_cores_follow_the_affinity(monkeypatch):
    monkeypatch.setattr(schedule.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert 1 <= schedule.available_cores() <= 3


def test_the_class_report_says_the_pace_and_where_each_submission_spent_its_time(tmp_path):
    from fuselab.grading.outputs import report
    from fuselab.grading.run.pipeline import ClassResult

    def result(student, seconds, build):
        return {"student": student, "lab": "lab0", "total": 4.0, "max_total": 4.0, "seconds": seconds,
                "cells": {"test_fused": {"points": 4.0, "max_points": 4.0, "status": "passed", "message": "",
                                         "speed": []}},
                "flags": [], "clean_seconds": seconds / 2,
                "clean_timeline": {"process start": 1.0, "build_fused": build, "test_fused": 0.5, "setup": 0.2}}
    graded = ClassResult(out=tmp_path, results=[result("ann", 20.0, 2.0), result("bob", 30.0, 4.0),
                                                result("cy", 40.0, 6.0)], problems=[],
                         phase_seconds={"submissions": 45.0}, graded_now=3, workers=["0", "0"])
    text = report.markdown(graded)
    section = text[text.index("## Throughput"):]
    assert "graded 3 submission(s) in 45 s, 15.0 s per submission, 2 at a time (2 sharing GPU 0)" in section
    assert "30.0 s on average (slowest 40 s)" in section
    # medians: clean 15.0 s, build 4.0 s the slowest step, then the process start
    assert "| lab0 | 15.0 s | build_fused 4.0 s, process start 1.0 s, test_fused 0.5 s |" in section
    assert schedule.describe([None]) == "1 CPU worker, no GPU"
    assert schedule.describe(["0", "1", "0", "1"]) == "2 sharing each of GPUs 0, 1"


def test_the_class_report_lists_what_the_grader_noted_about_a_run(tmp_path):
    from fuselab.grading.outputs import report
    from fuselab.grading.run.pipeline import ClassResult

    def result(student, notes):
        return {"student": student, "lab": "lab0", "total": 1.0, "max_total": 1.0, "seconds": 10.0,
                "cells": {"test_fused": {"points": 1.0, "max_points": 1.0, "status": "passed", "message": "",
                                         "speed": []}},
                "flags": [], "notes": notes}
    busy = "GPU 0 busy with process(es) [4242]: timings may be disturbed"
    # a note may quote what a run left (a file's name): a submission could put a heading into the TA's report
    unfinished = "could not remove clean: ...\n## Grades\n| forged | 10 |" + "x" * 1000
    graded = ClassResult(out=tmp_path, results=[result("ann", [busy, unfinished]), result("bob", [])], problems=[])
    section = report.markdown(graded).split("## To look at")[1].split("\n## ")[0]  # to the next section
    assert f"- ann/lab0: note: {report._md(busy)}" in section  # as written, markdown's punctuation escaped
    assert "- ann/lab0: note: could not remove clean: ... ## Grades \\| forged \\| 10 \\|" in section
    assert "\n## Grades" not in section and "x" * 400 not in section
    assert "bob" not in section
    quiet = ClassResult(out=tmp_path, results=[result("bob", [])], problems=[])
    assert "Nothing." in report.markdown(quiet).split("## To look at")[1]


def test_the_load_sampler_counts_cpu_by_the_kind_of_process(monkeypatch):
    import subprocess
    import sys
    monkeypatch.setattr(load_sampler, "_gpu_memory_used_mib", lambda: None)
    # a busy child whose command line names it as a checker (``cellrunner``) would
    busy = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass\n# cellrunner"
    with LoadSampler(every_s=0.1, processes=True) as load:
        since = time.monotonic()
        subprocess.run([sys.executable, "-c", busy], check=True)
        time.sleep(0.3)
        until = time.monotonic()
    kinds = load.cpu_by_kind(since, until)
    if load.summary(since, until)["cpu_busy"] is None:
        pytest.skip("this kernel's /proc/stat counts nothing (gVisor)")
    assert 0.5 <= kinds.get("checker", 0.0) <= 1.5, kinds
    assert "missed" in kinds and kinds["missed"] >= 0


def test_the_load_sampler_counts_the_kernels_part_by_the_kind_of_process(monkeypatch):
    """A child that spends its time in system calls: most of its CPU is counted as the kernel's, under its kind;
    one that only computes: next to none."""
    import subprocess
    import sys
    monkeypatch.setattr(load_sampler, "_gpu_memory_used_mib", lambda: None)
    calls = ("import os, time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end:\n"
             "    os.stat('/')\n# kernel_worker")
    computes = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass\n# cellrunner"
    with LoadSampler(every_s=0.1, processes=True) as load:
        since = time.monotonic()
        for source in (calls, computes):
            subprocess.run([sys.executable, "-c", source], check=True)
        time.sleep(0.3)
        until = time.monotonic()
    if load.summary(since, until)["cpu_busy"] is None:
        pytest.skip("this kernel's /proc/stat counts nothing (gVisor)")
    total, kernel = load.cpu_by_kind(since, until), load.cpu_by_kind(since, until, kernel=True)
    assert kernel.get("kernel worker", 0.0) >= 0.3 and kernel["kernel worker"] <= total["kernel worker"], kernel
    assert kernel.get("checker", 0.0) <= 0.2 < total.get("checker", 0.0), (kernel, total)
    assert "missed" in kernel and kernel["missed"] >= 0


def test_the_load_sampler_splits_the_graders_own_cpu_by_what_its_threads_do(monkeypatch):
    """The grader runs in the sampler's process: its CPU is split by thread (a submission's thread, the limit
    watchers, the sampler itself), and a thread that ended is counted once, not again at its end."""
    import threading
    monkeypatch.setattr(load_sampler, "_gpu_memory_used_mib", lambda: None)

    def busy(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            time.sleep(0)  # lets the sampler's thread take the GIL in between

    with LoadSampler(every_s=0.05, processes=True) as load:
        since = time.monotonic()
        time.sleep(0.2)
        worker = threading.Thread(target=busy, args=(0.6,), name="grader-0")
        worker.start()
        worker.join()
        time.sleep(0.3)
        until = time.monotonic()
    kinds = load.cpu_by_kind(since, until)
    if load.summary(since, until)["cpu_busy"] is None:
        pytest.skip("this kernel's /proc/stat counts nothing (gVisor)")
    assert "grader" not in kinds, kinds  # no single line for the whole process
    counted = kinds.get("grader: submissions' threads", 0.0) + kinds.get("grader: ended threads", 0.0)
    assert 0.4 <= counted <= 0.9, kinds  # 0.6 s of work, counted once (0.1 s ticks each way)
    assert kinds.get("grader: submissions' threads", 0.0) >= 0.3, kinds  # seen while it ran


def test_a_speed_record_keeps_only_the_phases_the_course_names():
    from fuselab.grading.recheck.kernels import _record
    from fuselab.speed.graded import PHASES
    record = _record({"status": "measured", "speedup": 1.5,
                      "phases": {PHASES[0]: 0.25, "timing": float("nan"), "made up": 1.0, "refreshed check": -1.0,
                                 "check at the timed shape": 3}})
    assert record["phases"] == {PHASES[0]: 0.25}  # finite, non-negative floats of the course's own labels only
    assert "phases" not in _record({"status": "measured", "phases": ["timing", 1.0]})


def test_the_throughput_stage_runs_its_whole_flow_on_the_cpu_at_a_tiny_size(tmp_path, capsys, monkeypatch):
    """One copy of one lab: the class, then one student's regrade in the same course folder, which reuses the
    reference runs; the output says where the time and the CPU went, fixed and per submission. (Without a GPU a
    speed test scores 0, so the stage itself says MISS here: the flow is what is checked.)"""
    from fuselab.tools.gpu_selfcheck import grading_runs
    monkeypatch.setenv("FUSELAB_THROUGHPUT_REGRADE_BEFORE_S", "100000")  # a busy test machine still regrades
    result = grading_runs.stage_throughput(tmp_path, copies=1, labs=["lab0"], regrade=True)
    printed = capsys.readouterr().out
    run, again = result["runs"][0], result["one_student_regrade"]
    for summary in (run, again):
        phases = summary["phases"]
        assert set(phases["per_submission_median"]) == {"start", "build", "tests", "timing waits", "GPU held",
                                                        "other"}
        assert phases["submissions"]["count"] == 1 and phases["submissions"]["cpu_seconds"] > 0
        assert phases["fixed"]["cpu_seconds"] >= 0 and phases["per_submission_median"]["start"] > 0
        # every correctness test of the correct sample passed: only the speed test, unmeasured here, lost points
        assert all("not measured" in why for why in summary["submissions"][0]["lost"].values()), summary
        assert summary["submissions"][0]["retried"] == {}  # no test was run again alone; why, where one was
        from fuselab.grading.sandbox import cgroup  # who counted the children's memory, as the grader chose
        assert summary["memory_counted_by"] == ("memory cgroup" if cgroup.available() else
                                                "the watchers' scans of /proc")
    assert not run["phases"]["references_reused"] and again["phases"]["references_reused"]
    assert run["phases"]["fixed"]["cpu_seconds"] > 0  # the references ran; a regrade's set-up may round to 0.0 s
    # the regrade's fixed cost is set-up and intake alone: less than the first run's, which ran the references
    # (beside the course set-up: their CPU falls in whichever of the two fixed phases they ended in)
    assert again["phases"]["fixed"]["cpu_seconds"] < run["phases"]["fixed"]["cpu_seconds"]
    assert "fixed:" in printed and "GPU held): start" in printed and "s CPU each" in run["headline"]
    # where the CPU went, measured: the three processes' starts (each imports torch) and the kernel worker's builds
    cpu = run["phases"]["cpu_per_submission_mean"]
    assert all(cpu.get(f"start, {role}", 0) > 0 for role in ("checker", "solution worker", "kernel worker")), cpu
    assert cpu.get("build, kernel worker", 0) > 0 and "CPU per submission (mean core-s" in printed, cpu
    # the sampler's view too, the grader's own process split by its threads (how much each used is
    # test_the_load_sampler_splits_the_graders_own_cpu_by_what_its_threads_do's: one submission's thread mostly
    # waits, and may use less than the 0.05 s that the split's rounding keeps)
    line = next(line for line in printed.splitlines() if "CPU per submission by process" in line)
    kinds = run["cpu_by_process"]
    assert "checker" in line and "grader" not in kinds and "grader: submissions' threads" in kinds, (line, kinds)
    assert "one student's regrade" in result["headline"] and "references reused" in result["headline"]


def test_the_throughput_phases_sum_a_runs_time_and_cpu_by_kind(tmp_path):
    from fuselab.grading.run.pipeline import ClassResult
    from fuselab.grading.records.results import SubmissionResult
    from fuselab.tools.gpu_selfcheck import grading_runs

    def result(student, start):
        return SubmissionResult.from_json({
            "student": student, "lab": "lab0", "total": 4.0, "max_total": 4.0, "seconds": 10.0, "cells": {},
            "flags": [], "clean_timeline": {
                "process start": start, "setup": 0.5, "build_fused": 2.0, "test_fused": 3.0, "test_speedup": 1.0,
                "waiting for the GPU alone": 0.4, "stopped for others' timings": 0.1, "the GPU held alone": 0.2},
            "clean_cpu": {"process start": {"checker": start, "kernel worker": 1.0},
                          "build_fused": {"kernel worker": 2.5}, "test_fused": {"checker": 0.5}}})
    run = ClassResult(out=tmp_path, results=[result("ann", 1.0), result("bob", 3.0)], problems=[],
                      reference={"lab0": {"reused": True}}, graded_now=2,
                      phase_seconds={"intake and course": 2.0, "reference runs": 0.1, "submissions": 20.0,
                                     "gradebook": 0.5, "feedback": 1.0, "export and report": 1.5},
                      phase_cpu={"intake and course": 1.5, "reference runs": 0.05, "submissions": 30.0,
                                 "gradebook": 0.25, "feedback": 0.5, "export and report": 0.75})
    phases = grading_runs.phases_of(run, wall=25.3)
    assert phases["fixed"]["seconds"] == 2.1 and phases["fixed"]["cpu_seconds"] == 1.6
    assert phases["submissions"] == {"seconds": 20.0, "cpu_seconds": 30.0, "count": 2, "seconds_each": 10.0,
                                     "cpu_seconds_each": 15.0}
    assert phases["per_submission_median"] == {"start": 2.0, "build": 2.0, "tests": 4.0, "timing waits": 0.5,
                                               "GPU held": 0.2, "other": 0.5}
    assert phases["references_reused"] and phases["outputs"] == {
        "seconds": 3.0, "cpu_seconds": 1.5, "gradebook": {"seconds": 0.5, "cpu_seconds": 0.2},
        "feedback": {"seconds": 1.0, "cpu_seconds": 0.5}, "export and report": {"seconds": 1.5, "cpu_seconds": 0.8}}
    # the CPU by step and process: means over the two, the largest first
    assert list(phases["cpu_per_submission_mean"].items()) == [
        ("build, kernel worker", 2.5), ("start, checker", 2.0), ("start, kernel worker", 1.0), ("tests, checker", 0.5)]
    table = grading_runs.phase_table(phases)
    assert "fixed: 2.1 s wall, 1.6 s CPU" in table and "references' rest 0.1 s / 0.1 s CPU, reused" in table
    assert "2 in 20.0 s = 10.00 s each, 15.00 s CPU each" in table
    assert ("outputs: 3.0 s, 1.5 s CPU (gradebook 0.5 s / 0.2 s CPU; feedback 1.0 s / 0.5 s CPU; export and report "
            "1.5 s / 0.8 s CPU)") in table


def _run(jobs, count, seconds_each, cpu_each, fixed, wall):
    phases = {"wall_seconds": wall, "fixed": {"seconds": fixed},
              "submissions": {"count": count, "seconds_each": seconds_each, "cpu_seconds_each": cpu_each}}
    return {"jobs": jobs, "submission_phase_per_submission": seconds_each, "phases": phases, "wall_seconds": wall}


def test_the_stage_never_reads_a_smaller_run_as_the_targets_met():
    """A class of 60 at one number of jobs measures only the rates: the 120-class and the 10-against-16 targets
    are 'not measured', never met, and a rate over its limit is missed."""
    from fuselab.tools.gpu_selfcheck import grading_runs
    rows = {r["target"]: r for r in grading_runs.targets([_run(10, 60, 3.13, 14.4, 45.5, 253.0)],
                                                          _run(10, 4, 5.6, 10.7, 0.2, 40.6))}
    met = {name: row["met"] for name, row in rows.items()}
    assert met == {"class of 120 all-in, s": None, "submissions phase per submission-lab, s": False,
                   "CPU per submission-lab, core-s": True, "fixed cost of the class's run, s": False,
                   "one student's regrade all-in, s": False,
                   "16 sharing the GPU over 10 sharing it, time ratio": None}
    assert "not measured" in grading_runs.targets_table(list(rows.values()))


def test_the_cpu_target_counts_every_process_the_sampler_saw_not_only_what_the_grader_reaped():
    """The grader's own count misses processes its waits never reap (a sandbox's, ended with its namespace): the
    sampler's per-process CPU over the phase decides the target where the run has it (the H200 run at 3717e62:
    14.4 core-s reaped, 30.0 seen)."""
    from fuselab.tools.gpu_selfcheck import grading_runs
    run = _run(10, 60, 3.13, 14.4, 45.5, 253.0)
    run["cpu_by_process"] = {"checker": 630.2, "kernel worker": 434.9, "solution worker": 284.2, "missed": 280.6,
                             "grader": 120.1, "compiler": 32.2, "other": 16.0, "sandbox": 3.6, "keeper": 0.2}
    row = next(r for r in grading_runs.targets([run], None) if r["target"].startswith("CPU"))
    assert row["measured"] == sum(run["cpu_by_process"].values()) / 60 and row["met"] is False


def test_a_class_of_120_at_10_and_16_jobs_is_held_to_every_target():
    from fuselab.tools.gpu_selfcheck import grading_runs
    runs = [_run(10, 120, 1.4, 12.0, 12.0, 290.0), _run(16, 120, 1.5, 12.5, 0.3, 299.0)]
    rows = grading_runs.targets(runs, _run(16, 4, 3.0, 9.0, 0.2, 25.0))
    assert all(row["met"] is True for row in rows[:-1]), rows
    ratio = rows[-1]
    assert ratio["measured"] == 1.5 / 1.4 and ratio["met"] is False  # 16 jobs slower than 10: missed


def test_the_gpus_utilisation_is_read_on_the_visible_gpus_only(monkeypatch):
    """A Slurm shard on one card of eight: its card's utilisation, not a mean over cards it does not use."""
    readings = {"0": 0, "1": 0, "2": 90, "3": 0}
    monkeypatch.setattr(gpu_facts, "indices", lambda: list(readings))
    monkeypatch.setattr(gpu_facts, "busy_percent", lambda device: readings[str(device)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert load_sampler._gpu_busy_percent() == [90]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert load_sampler._gpu_busy_percent() == [0, 0, 90, 0]


def test_the_throughput_stage_keeps_why_a_cell_lost_points_and_why_one_ran_again_alone():
    """Per submission the stage keeps each cell's seconds, the speed tests' phases, why a cell lost points and what
    stopped a test's first try before it ran again alone (a run with retries said only how many)."""
    from fuselab.grading.records.results import CellResult, SubmissionResult
    from fuselab.tools.gpu_selfcheck import grading_runs
    result = SubmissionResult(student="ann", lab="lab0", cells={
        "test_fused": CellResult(points=2.0, max_points=2.0, status="passed", seconds=3.456,
                                 retry={"first_try": "ran past the test's wall-clock limit", "seconds": 4.0}),
        "test_speedup": CellResult(points=0.0, max_points=4.0, status="failed", message="x" * 400, seconds=1.0,
                                   speed=[{"phases": {"timing": 0.4}}, "not a record"]),
        "test_dram_bytes": CellResult(points=1.0, max_points=1.0, status="passed")}, total=3.0, max_total=7.0)
    told = grading_runs.cells_told(result)
    assert told["cell_seconds"] == {"test_fused": 3.46, "test_speedup": 1.0, "test_dram_bytes": 0.0}
    assert told["speed_phases"] == {"test_speedup": {"timing": 0.4}}
    assert told["lost"] == {"test_speedup": "failed: " + "x" * 300}
    assert told["retried"] == {"test_fused": "ran past the test's wall-clock limit"}
