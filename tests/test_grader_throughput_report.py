"""The numbers the grader's throughput report rests on: nbgrader's phases, the machine's load, GPU memory."""

import os
import stat
import time

from fuselab.grading import nbgrader_run, schedule
from fuselab.load_sampler import LoadSampler


def _executed(*spans):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "x"}]
    for start, end in spans:
        cells.append({"cell_type": "code", "source": "", "outputs": [], "metadata": {"execution": {
            "iopub.execute_input": start, "shell.execute_reply": end}}})
    return {"cells": cells}


def test_nbgrader_phases_come_from_the_cells_execution_times():
    from datetime import datetime, timezone
    t0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc).timestamp()
    nb = _executed(("2026-11-29T12:00:03.000000Z", "2026-11-29T12:00:04.500000Z"),
                   ("2026-11-29T12:00:04.600000Z", "2026-11-29T12:00:07.000000Z"))
    assert nbgrader_run.phases(nb, t0, t0 + 9) == {"start": 3.0, "cells": 4.0, "finish": 2.0}
    # a notebook without timing metadata (or with garbage in it) gives no phases rather than wrong ones
    assert nbgrader_run.phases(_executed(), t0, t0 + 9) == {}
    assert nbgrader_run.phases(_executed(("soon", None)), t0, t0 + 9) == {}


def test_the_load_sampler_sees_a_busy_cpu():
    with LoadSampler(every_s=0.05) as load:
        since = time.monotonic()
        deadline = since + 0.5
        while time.monotonic() < deadline:
            pass
        until = time.monotonic()
    summary = load.summary(since, until)
    assert summary["samples"] >= 3
    # one busy core of os.cpu_count(): at least a share of it shows (other work may add more)
    assert 0.5 / (os.cpu_count() or 1) <= summary["cpu_busy"] <= 1.0


def test_gpu_memory_is_read_from_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, 143771'\necho '1, 81559'\necho 'garbage'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert round(schedule.smallest_gpu_memory_gib(["0"]), 1) == 140.4
    assert round(schedule.smallest_gpu_memory_gib(["0", "1"]), 1) == 79.6
    assert schedule.default_jobs_per_gpu(["1"], cores=16) == 10 and \
        schedule.default_jobs_per_gpu(["0", "1"], cores=16) == 5
