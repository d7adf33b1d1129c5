"""A student's kernels in the clean recheck run in the kernel worker: neither the checker nor the student's
Python (the solution worker) ever holds their library.

Launches cross the boundary with their tensors' whole storages, so a kernel is judged here exactly as in the
student's own process (guard bands catch a write past the end); a kernel that crashes its process costs its
own test, and the tests after it run in fresh processes."""

import fcntl
import json
import os
import time

import pytest
import torch

from fuselab.grading.sandbox import isolate
from fuselab.grading.recheck import kernels, transfer, clean as recheck

LAUNCHER = "void scale(const float* x, float* out, int64_t n, cudaStream_t stream)"
SCALE = ("__global__ void scale_kernel(const float* x, float* out, int64_t n) {{\n"
         "    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;\n    if (i < n{tail}) out[i] = 2.0f * x[i];\n}}\n"
         "void scale(const float* x, float* out, int64_t n, cudaStream_t stream) {{\n{crash}"
         "    if (n > 0) scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, out, n);\n}}\n")
HONEST = SCALE.format(tail="", crash="")


def _cell(source, grade_id, graded=False, solution=False, points=0):
    meta = {"nbgrader": {"grade_id": grade_id, "grade": graded, "solution": solution, "locked": not solution,
                         "schema_version": 3, **({"points": points} if graded else {})}}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [], "execution_count": None}


CHECKED = ("fuselab.check(lambda x, out: {mod}.scale(x, out, x.numel()), lambda x: 2 * x,\n"
           "              lambda s, seed: (torch.randn(s, generator=torch.Generator().manual_seed(seed)),),\n"
           "              [(1,), (255,), (1000,), (4097,)], name='scale')\n")
# the checker's own view of itself: no library from the builds folder is mapped into this process
NOT_HERE = ("assert type({mod}).__name__ == 'WorkerModule', type({mod})\n"
            "maps = open('/proc/self/maps').read()\n"
            "assert str(fuselab.config.builds_dir()) not in maps and '-process/cache' not in maps, maps\n")

INSTRUCTOR = [
    _cell("import torch\nimport fuselab\n", "setup"),
    _cell(f"FIRST = r'''{HONEST}'''", "sol_first", solution=True),
    _cell("first = fuselab.build(FIRST, [LAUNCHER], name='first', backend='emulate')", "build_first"),
    _cell(CHECKED.format(mod="first") + NOT_HERE.format(mod="first"), "test_first", graded=True, points=2),
    _cell(f"SECOND = r'''{HONEST}'''", "sol_second", solution=True),
    _cell("second = fuselab.build(SECOND, [LAUNCHER], name='second', backend='emulate')", "build_second"),
    _cell(CHECKED.format(mod="second") + NOT_HERE.format(mod="second"), "test_second", graded=True, points=3),
]


def _run(tmp_path, first=HONEST, second=HONEST, first_prefix=""):
    for cell in INSTRUCTOR:
        cell["source"] = cell["source"].replace("[LAUNCHER]", json.dumps([LAUNCHER]))
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": INSTRUCTOR}
    student = json.loads(json.dumps(nb))
    student["cells"][1]["source"] = first_prefix + f"FIRST = r'''{first}'''"
    student["cells"][4]["source"] = f"SECOND = r'''{second}'''"
    return recheck.run_clean(nb, student, tmp_path, cell_timeout=120, total_timeout=400,
                             limits=isolate.Limits(memory_bytes=4 * 2**30))


def test_kernels_run_in_the_kernel_worker_and_are_judged_as_in_the_students_own_process(tmp_path):
    result = _run(tmp_path)
    assert {k: (v.points, v.status) for k, v in result.cells.items()} == \
        {"test_first": (2.0, "passed"), "test_second": (3.0, "passed")}, result.cells
    assert result.restarts == 0


WRAPPER = """import fuselab, torch
_real = fuselab.build
def _honest_looking(*args, **kwargs):  # the student's Python wraps the build: its launcher fixes the output
    module = _real(*args, **kwargs)
    launch = module.scale
    def scale(x, out, n):
        launch(x, out, n)
        out.copy_(2 * x)
    module.scale = scale
    return module
fuselab.build = _honest_looking
"""


def test_the_students_python_cannot_wrap_the_kernel_the_checker_launches(tmp_path):
    zeros = HONEST.replace("out[i] = 2.0f * x[i];", "out[i] = 0.0f;")
    result = _run(tmp_path, first=zeros, first_prefix=WRAPPER)
    assert result.cells["test_first"].points == 0.0, result.cells["test_first"]
    assert result.cells["test_second"].points == 3.0


def test_a_write_past_the_end_lands_in_the_guard_bands_the_checker_sent(tmp_path):
    result = _run(tmp_path, first=SCALE.format(tail=" + 3", crash=""))
    first = result.cells["test_first"]
    assert first.points == 0.0 and "past the end" in first.message, first.message
    assert result.cells["test_second"].points == 3.0


def test_a_kernel_that_crashes_its_process_costs_only_its_own_test(tmp_path):
    crash = "    if (n == 255) { volatile int* nowhere = 0; *nowhere = 1; }\n"
    result = _run(tmp_path, first=SCALE.format(tail="", crash=crash))
    first = result.cells["test_first"]
    assert first.points == 0.0 and first.status == "crashed" and "ended" in first.message, first
    assert result.cells["test_second"].points == 3.0, result.cells["test_second"]
    assert result.restarts == 1


# the launcher opens the guard's pages again and computes the output in host code (the emulation gave it full
# marks): the kernel worker finds kernel memory changed outside a kernel, however it was done
HOST_WRITE = ("static void open_pages(const void* p, size_t bytes) {\n"
              "    uintptr_t s = (uintptr_t)p & ~(uintptr_t)4095;\n"
              "    uintptr_t e = ((uintptr_t)p + bytes + 4095) & ~(uintptr_t)4095;\n"
              "    mprotect((void*)s, e - s, PROT_READ | PROT_WRITE);\n}\n"
              "void scale(const float* x, float* out, int64_t n, cudaStream_t stream) {\n"
              "    open_pages(x, n * 4);\n    open_pages(out, n * 4);\n"
              "    for (int64_t i = 0; i < n; ++i) out[i] = 2.0f * x[i];\n}\n")


def test_host_code_that_writes_kernel_memory_fails_its_test_with_a_flag(tmp_path):
    result = _run(tmp_path, first=HOST_WRITE)
    first = result.cells["test_first"]
    assert first.points == 0.0 and "host code wrote kernel memory outside a kernel" in first.message, first
    assert "test_first: host code wrote kernel memory outside a kernel" in result.flags, result.flags
    assert result.cells["test_second"].points == 3.0, result.cells["test_second"]


CRASH = SCALE.format(tail="", crash="    { volatile int* nowhere = 0; *nowhere = 1; }\n")


@pytest.mark.parametrize("source, said", [(HOST_WRITE, "HostWroteKernelMemory"), (CRASH, "ended")],
                         ids=["host_write", "crash"])
def test_a_test_that_catches_the_error_of_a_host_write_or_a_crash_still_fails(tmp_path, source, said):
    """A test expecting some error from a launch (here: any) passed when the host write raised it, or when the
    kernel's crash ended its process (which the checker sees as an error of the launch)."""
    cells = [INSTRUCTOR[0], _cell("SRC = ''", "sol", solution=True),
             _cell(f"mod = fuselab.build(SRC, {json.dumps([LAUNCHER])}, name='caught', backend='emulate')", "build"),
             _cell("x = torch.randn(300)\nout = torch.empty_like(x)\ntry:\n    mod.scale(x, out, x.numel())\n"
                   "except Exception:\n    pass\n", "test_caught", graded=True, points=1)]
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}
    student = json.loads(json.dumps(nb))
    student["cells"][1]["source"] = f"SRC = r'''{source}'''"
    result = recheck.run_clean(nb, student, tmp_path, cell_timeout=120, total_timeout=300)
    caught = result.cells["test_caught"]
    assert caught.points == 0.0 and said in caught.message, caught
    if source is HOST_WRITE:  # and the TA sees the source that calls mprotect itself
        assert [f for f in result.flags if "`mprotect`" not in f] == [
            "test_caught: host code wrote kernel memory outside a kernel"], result.flags
        assert any(f.startswith("sol: line 1: its kernel source calls or names `mprotect`") for f in result.flags)


def test_a_build_error_from_the_worker_keeps_its_type_and_the_students_line(tmp_path):
    cells = [INSTRUCTOR[0], _cell("SRC = ''", "sol", solution=True),
             _cell(f"try:\n    fuselab.build(SRC, {json.dumps([LAUNCHER])}, name='broken', backend='emulate')\n"
                   "except fuselab.BuildError as exc:\n    assert 'y[i]' in str(exc) and '^' in str(exc), str(exc)\n"
                   "else:\n    raise AssertionError('it built')", "test_build", graded=True, points=1)]
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}
    student = json.loads(json.dumps(nb))
    student["cells"][1]["source"] = "SRC = r\'\'\'" + HONEST.replace("2.0f * x[i]", "2.0f * y[i]") + "\'\'\'"
    result = recheck.run_clean(nb, student, tmp_path, cell_timeout=120, total_timeout=300)
    assert result.cells["test_build"].points == 1.0, result.cells


def test_a_kernel_stub_fails_the_tests_that_use_it(tmp_path):
    stub = HONEST.replace("if (i < n) out[i] = 2.0f * x[i];", "// YOUR CODE HERE\n    throw NotImplementedError();")
    result = _run(tmp_path, first=stub)
    assert result.cells["test_first"].points == 0.0 and "is not defined" in result.cells["test_first"].message
    assert result.cells["test_second"].points == 3.0


def test_storages_cross_whole_and_views_of_one_buffer_stay_one_buffer():
    base = torch.arange(12, dtype=torch.float32)
    a, b = base[2:5], base[6:]
    storages, args, _ = kernels._pack((a, b, 7, [torch.ones(3, dtype=torch.int64)]), {})
    assert [s.numel() for s in storages] == [48, 24]
    assert args[0] == ("tensor", 0, "float32", 2, (3,), (1,)) and args[1][3] == 6 and args[2] == 7
    assert args[3][0][:3] == ("tensor", 1, "int64")
    memory = transfer.make()
    assert fcntl.fcntl(memory, fcntl.F_GET_SEALS) == fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
    checker, worker = transfer.Transfer(memory), transfer.Transfer(memory)
    regions = checker.regions([s.numel() for s in storages])
    assert regions[1][0] % 256 == 0
    for storage, (offset, size) in zip(storages, regions):
        checker.region(offset, size).copy_(storage)
    worker.attach(regions[-1][0] + regions[-1][1])
    mine = torch.empty(48, dtype=torch.uint8).copy_(worker.region(*regions[0]))
    view = torch.empty(0, dtype=torch.float32).set_(mine.untyped_storage(), 6, (6,), (1,))  # b, in the worker
    assert torch.equal(view, b)
    view.fill_(-1.0)
    worker.region(*regions[0]).copy_(mine)
    storages[0].copy_(checker.region(*regions[0]))
    assert torch.equal(base[6:], torch.full((6,), -1.0)) and torch.equal(base[:6], torch.arange(6.0))
    with pytest.raises(OSError):  # the memory never shrinks: a worker cannot cut a page the checker maps
        os.ftruncate(memory, 0)
    with pytest.raises(OSError):  # nor seal it against the checker's growing it for its next launch
        fcntl.fcntl(memory, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW)
    with pytest.raises(ValueError):  # the worker maps what the checker grew, never more
        transfer.Transfer(memory).attach(os.fstat(memory).st_size + 1)
    for side in (checker, worker):
        side.unmap()
    os.close(memory)


def test_a_launch_of_empty_tensors_crosses_too():
    """Storages of no bytes (a test's ``torch.empty(0)``), as the worker's first launch: nothing to copy, and no
    error in the copying."""
    memory = transfer.make()
    checker, worker = transfer.Transfer(memory), transfer.Transfer(memory)
    regions = checker.regions([0, 0], pin=True)  # no GPU here: not pinned, and no error for it
    assert regions == [(0, 0), (0, 0)] and not checker.pinned
    worker.attach(0)
    empty = torch.empty(0, dtype=torch.float32)
    worker.region(*regions[0]).copy_(transfer.as_bytes(empty))
    assert worker.region(*regions[1]).numel() == 0
    for side in (checker, worker):
        side.unmap()
    os.close(memory)


def test_the_kernel_worker_is_handed_the_memory_the_checker_counts(tmp_path, monkeypatch):
    """The grader makes the transfer memory for the kernel worker alone (the solution worker gets none) and tells
    the worker's watch that another child counts it: the checker, which holds it all its life. A worker that
    wrote it full and closed its descriptor leaves it counted there."""
    from fuselab.grading.recheck import clean
    from fuselab.grading.sandbox.untrusted import Folder
    made = {}

    class Seen:
        def __init__(self, command, **kwargs):
            made[kwargs["env"].get(transfer.ENV, "none")] = kwargs

    monkeypatch.setattr(isolate, "Child", Seen)
    (tmp_path / "clean").mkdir()
    box = Folder(tmp_path / "clean")
    _, solution_fds = clean._start_worker("solution", box, {}, isolate.Limits(), False, (), None)
    _, kernel_fds = clean._start_worker("kernel", box, {}, isolate.Limits(), False, (), None)
    try:
        assert len(solution_fds) == 4 and len(kernel_fds) == 5 and made["none"]["counted_elsewhere"] == set()
        memory = kernel_fds[4]
        key = (os.fstat(memory).st_dev, os.fstat(memory).st_ino)
        worker = made[str(memory)]
        assert memory in worker["pass_fds"] and worker["counted_elsewhere"] == {key}
        os.ftruncate(memory, 2**20)
        os.pwrite(memory, b"x" * 2**20, 0)
        here = [os.getpid()]  # this process stands for the checker: it holds the memory, the worker let it go
        assert isolate.shmem_bytes(here) - isolate.shmem_bytes(here, counted_elsewhere={key}) == 2**20
    finally:
        for fd in (*solution_fds, *kernel_fds):
            os.close(fd)


def test_the_transfer_memory_counts_once_in_the_submissions_memory():
    """The checker and its kernel worker both hold the transfer memory: a tree told that another counts it
    (``counted_elsewhere``) leaves it out, by descriptor and by mapping, so the budget's sum holds it once; any
    other memory file the same tree holds still counts."""
    memory, other = transfer.make(), transfer.make()
    try:
        for fd in (memory, other):
            os.ftruncate(fd, 2**20)
            os.pwrite(fd, b"x" * 2**20, 0)
        here = [os.getpid()]
        whole = isolate.shmem_bytes(here)
        assert whole >= 2 * 2**20
        key = (os.fstat(memory).st_dev, os.fstat(memory).st_ino)
        assert whole - isolate.shmem_bytes(here, counted_elsewhere={key}) == 2**20
        mapped = transfer.Transfer(memory)
        try:
            mapped.regions([2**20])  # mapped too: found by its mapping as well as by its descriptor
            assert whole - isolate.shmem_bytes(here, counted_elsewhere={key}) == 2**20
        finally:
            mapped.unmap()
    finally:
        os.close(memory)
        os.close(other)


class _Host:
    """A kernel host whose worker takes ``per_call`` seconds a call, whatever speed it reports."""

    def __init__(self, per_call):
        self.per_call, self.launches, self.batches = per_call, 0, []
        self.process, self.holding = self, False

    def request(self, message):
        assert message[0] == "speed_batch"
        self.batches.append(message[1])
        time.sleep(message[1] * self.per_call)
        return ["ok", ["v", None]]

    def result(self, reply):
        return None


def _side(per_call):
    def reference_op(x, out):
        time.sleep(per_call)
        out.copy_(x)
    return dict(reference_op=reference_op, make_inputs=lambda shape, seed: (torch.randn(shape),),
                reference=lambda x: x, shape=[8], threshold=1.3, mode="device", gpu="NVIDIA H200")


def _worker_record(speedup, reference_s, student_s):
    return kernels._record({"status": "measured", "speedup": speedup, "reference_s": reference_s,
                            "student_s": student_s, "shape": [1], "mode": "host", "points": 4.0,
                            "extra": object.__name__})


def test_a_speedup_the_checkers_clock_cannot_see_is_capped_and_flagged(monkeypatch):
    monkeypatch.setattr(kernels, "WALL_BATCH_S", 0.2)
    # the worker claims 6x; from outside its calls take twice as long as the reference's: graded at the bound
    check = kernels.SpeedCheck(_Host(per_call=0.008), _side(0.004), 3)
    check.prepare()
    record = check.verdict("lab0.add_relu_mul", 4, _worker_record(6.0, 0.004, 0.004 / 6))
    assert 0.35 < record["wall_speedup"] < 0.65, record
    assert record["graded_speedup"] == pytest.approx(record["wall_speedup"] * (1 + kernels.WALL_TOLERANCE))
    assert "grader's own clock" in record["flag"] and record["points"] == 0.0
    assert "extra" not in record and record["shape"] == [8] and record["mode"] == "device"  # the checker's own


def test_an_honest_speedup_the_clock_confirms_is_graded_as_measured(monkeypatch):
    monkeypatch.setattr(kernels, "WALL_BATCH_S", 0.2)
    check = kernels.SpeedCheck(_Host(per_call=0.002), _side(0.004), 3)
    check.prepare()
    record = check.verdict("lab0.add_relu_mul", 4, _worker_record(1.9, 0.004, 0.0021))
    assert record["graded_speedup"] == record["speedup"] == record["worker_speedup"] == 1.9
    assert "flag" not in record and record["points"] == 4.0
    assert record["wall_speedup"] > 1.5


def test_a_record_that_was_not_measured_or_cannot_be_verified_earns_nothing():
    check = kernels.SpeedCheck(_Host(0.0), _side(0.0), 3)
    check.prepare()
    record = check.verdict("lab0.add_relu_mul", 4, kernels._record({"status": "not measured (no GPU)", "points": 4.0}))
    assert record["points"] == 0.0 and record["status"] == "not measured (no GPU)"
    # a measured speedup the checker cannot bound by its own clock (no reference of its own) fails closed
    side = dict(_side(0.0), reference_op=None)
    unbounded = kernels.SpeedCheck(_Host(0.0), side, 3)
    unbounded.prepare()
    record = unbounded.verdict("t", 4, _worker_record(50.0, 1e-3, 2e-5))
    assert record["points"] == 0.0 and record["status"].startswith("not verified") and record["flag"]
    # a NaN, or no number at all, is not a speedup
    record = kernels.SpeedCheck(_Host(0.0), _side(0.0), 3).verdict(
        "t", 4, kernels._record({"status": "measured", "speedup": float("nan")}))
    assert record["points"] == 0.0 and "no speedup" in record["status"]


def test_the_kernel_worker_sends_numbers_and_the_courses_own_words_only():
    from fuselab import speed
    from fuselab.grading.recheck import kernel_worker, wire
    worker = kernel_worker.KernelWorker(transfer.make())
    forged = ("import fuselab.speed.graded as g\n"
              "g._finish({'test': 't', 'status': 'launched 1 kernel(s) [hidden shape (77777,)]', 'speedup': 9.0,"
              " 'points': 4.0, 'max_points': 4, 'shape': [77777], 'gpu': 'x' * 300})")
    reply = worker.speed(forged, "t")
    record = wire.decode(reply[1])
    assert record == {"status": "launched other kernels than its own (a fused op must launch exactly its own "
                                "kernel)", "speedup": 9.0}
    assert wire.decode(worker.speed("pass", "t")[1])["status"] == "error"
    speed.graded.LAST_RECORD = None


def test_a_speed_test_that_ran_out_of_the_shared_gpus_memory_in_the_worker_is_run_again_alone():
    """An allocation that failed in the kernel worker's speed test (the others' tensors filled the shared GPU)
    reaches the verdict in the course's own words, which the grader reads as a reason to run the test again alone;
    any other error does not."""
    from fuselab.grading.recheck import clean, kernel_worker, wire
    worker = kernel_worker.KernelWorker(transfer.make())
    full = ("import torch\nraise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 "
            "has a total capacity of 79.18 GiB of which 52.06 MiB is free.')")
    verdicts = {}
    for name, source in (("full", full), ("broken", "raise ValueError('no')")):
        sent = wire.decode(worker.speed(source, "t")[1])
        record = kernels.SpeedCheck(_Host(0.0), _side(0.0), 3).verdict("t", 4, kernels._record(sent))
        assert record["points"] == 0.0
        verdicts[name] = clean.CellVerdict(grade_id="test_speedup", points=0.0, max_points=4.0, status="failed",
                                           speed=[record])
    assert wire.decode(worker.speed(full, "t")[1])["status"] == kernel_worker.OUT_OF_GPU_MEMORY
    assert clean.ran_out_of_gpu_memory(verdicts["full"]) and not clean.ran_out_of_gpu_memory(verdicts["broken"])


def test_fuselab_errors_cross_with_their_type_whatever_their_constructor():
    from fuselab import errors
    error = kernels._kernel_error("UnsupportedConstruct", "k.cu:3: the CPU emulation does not support textures")
    assert isinstance(error, errors.BuildError) and "textures" in str(error) and error.log == ""
    assert type(kernels._kernel_error("NotWrittenError", "stub")) is errors.NotWrittenError
    assert type(kernels._kernel_error("SystemExit", "no")) is RuntimeError


def test_the_self_check_summarises_how_worker_speedups_compare_with_the_wall_clock(tmp_path):
    from fuselab.tools.gpu_selfcheck.grading_runs import wall_bound_summary
    for name, worker, wall, flag in [("a", 1.5, 1.4, None), ("b", 3.0, 1.0, "capped")]:
        folder = tmp_path / "work" / name / "lab0"
        folder.mkdir(parents=True)
        record = {"test": "lab0.add_relu_mul", "worker_speedup": worker, "wall_speedup": wall, "flag": flag}
        (folder / "result.json").write_text(json.dumps({"cells": {"test_speedup": {"speed": [record]}}}))
    summary = wall_bound_summary(tmp_path)
    assert [r["submission"] for r in summary["rows"]] == ["a/lab0", "b/lab0"]
    assert summary["line"] == "worker/wall speedup ratio 1.07-3.00 over 2 speed tests, 1 capped"
    assert wall_bound_summary(tmp_path / "none")["line"] == "no speed test bounded by the wall clock"


def test_hidden_tests_outside_a_test_cell_are_refused_they_would_reach_the_kernel_worker():
    hidden = _cell("### BEGIN HIDDEN TESTS\nassert True\n### END HIDDEN TESTS", "helper")
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [INSTRUCTOR[0], hidden, INSTRUCTOR[3]]}
    with pytest.raises(ValueError, match="cell helper .* holds hidden tests but is not a graded test cell"):
        recheck.clean_plan(nb, nb)


def test_a_students_run_never_inherits_the_instructors_mode(tmp_path, monkeypatch):
    """A student's run starts a kernel worker and never tells its checker it is the instructor's, whatever the
    grader's own environment holds (a shell that kept a reference run's settings, a Slurm job's export)."""
    import json
    import os
    from fuselab import course
    from fuselab.grading.recheck import clean
    from fuselab.runmode import INSTRUCTORS_RUN_ENV
    started = []

    class Stop(Exception):
        pass

    def pipe_end():
        read, write = os.pipe()
        os.close(write)
        return read

    def fake_worker(kind, *args, **kwargs):
        started.append(kind)
        memory = (transfer.make(),) if kind == "kernel" else ()  # the kernel worker's: its transfer memory
        return object(), (pipe_end(), pipe_end(), pipe_end(), pipe_end(), *memory)

    class FakeChild:
        def __init__(self, *args, env=None, **kwargs):
            started.append(("checker", env.get(INSTRUCTORS_RUN_ENV)))
            raise Stop
    monkeypatch.setattr(clean, "_start_worker", fake_worker)
    monkeypatch.setattr(clean.isolate, "Child", FakeChild)
    nb = json.loads((course.SOLUTIONS / "lab1" / "lab1.ipynb").read_text())
    with pytest.raises(Stop):
        clean.run_clean(nb, nb, tmp_path / "sub", env={"PATH": "/usr/bin:/bin", INSTRUCTORS_RUN_ENV: "1"},
                        kernels_in_worker=True)
    assert started == ["solution", "kernel", ("checker", None)]


def test_the_checker_takes_only_the_courses_speed_statuses():
    """The kernel worker runs the student's native code: a status it sends that is not one of the course's own
    sentences (text a kernel shaped: inputs it saw, or words that buy a rerun alone) is read as an error."""
    for forged in ("hidden inputs: x[0]=0.8231 (alloc_failed)", "measured ", "out of memory", 7):
        assert kernels._record({"status": forged})["status"] == "error", forged
    for status in kernels.WORKER_STATUSES:
        assert kernels._record({"status": status})["status"] == status


def test_a_refusal_is_flagged_from_the_checkers_own_error_and_a_hidden_test_never_shows_its_reasons(tmp_path):
    # a kernel source that names /proc is refused; a student's function that raises a refusal's words is not one
    refused = HONEST.replace("int64_t i =", 'const char* where = "/proc/self/maps";\n    int64_t i =')
    forged = ("def forged():\n    raise RuntimeError('first.so was refused by the grader\\'s check of native code: "
              "its library calls `dlopen`')")
    cells = [INSTRUCTOR[0], _cell(f"FIRST = r'''{HONEST}'''", "sol_first", solution=True),
             _cell("first = fuselab.build(FIRST, " + json.dumps([LAUNCHER]) + ", name='first', backend='emulate')",
                   "build_first"),
             _cell(CHECKED.format(mod="first"), "test_visible", graded=True, points=1),
             _cell("# BEGIN HIDDEN TESTS\n" + CHECKED.format(mod="first") + "# END HIDDEN TESTS", "test_hidden",
                   graded=True, points=1),
             _cell("def forged():\n    pass", "sol_forged", solution=True),
             _cell("forged()", "test_forged", graded=True, points=1)]
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}
    student = json.loads(json.dumps(nb))
    student["cells"][1]["source"] = f"FIRST = r'''{refused}'''"
    student["cells"][5]["source"] = forged
    result = recheck.run_clean(nb, student, tmp_path, cell_timeout=120, total_timeout=400,
                               limits=isolate.Limits(memory_bytes=4 * 2**30))
    visible, hidden, said = (result.cells[k] for k in ("test_visible", "test_hidden", "test_forged"))
    assert visible.points == hidden.points == said.points == 0, result.cells
    assert "refused by the grader's check of native code" in visible.message and "/proc" in visible.message
    assert hidden.message.startswith("NativeCodeRefused: a kernel library this test uses was refused")
    assert "/proc" not in hidden.message, hidden.message
    assert "refused by the grader's check" in said.message  # the student's own words, shown as theirs
    flags = [f for f in result.flags if "kernel library" in f]
    assert flags == ["a kernel library was refused by the grader's check of native code (see the message of "
                     "test_hidden, test_visible)"], result.flags


def test_at_a_tests_end_the_kernel_worker_lets_go_of_its_launches_copies():
    """The worker keeps a launch's copies for the next call of the same sizes (a kernel meets the addresses it saw,
    as in a student's own loop) until the test ends; then they go, with the caching allocator's blocks, for the
    other submissions sharing the GPU. The checker asks only when the worker launched since it last let go, and
    never asks a worker that is gone or poisoned."""
    from fuselab.grading.recheck import kernel_worker
    memory = transfer.make()
    worker = kernel_worker.KernelWorker(memory)
    first = worker.buffer(0, 64, "cpu")
    assert worker.buffer(0, 64, "cpu").data_ptr() == first.data_ptr()  # within a test: the same memory
    assert kernel_worker.REQUESTS["release"](worker) == ["ok", ["v", None]]
    assert worker.buffers == {}

    class Process:
        gone = False

        def __init__(self):
            self.sent = []

        def request(self, message):
            self.sent.append(message)
            return ["ok", ["v", None]]

        def result(self, reply):
            return None

    host = kernels.KernelHost(Process(), memory)
    host.release()
    assert host.process.sent == []  # nothing launched: nothing to let go of
    host.launches = 3
    host.release()
    host.release()
    assert host.process.sent == [("release",)]
    host.launches = 4
    host.poisoned = True
    host.release()
    host.poisoned, host.process.gone = False, True
    host.release()
    assert host.process.sent == [("release",)]
    host.transfer.unmap()
    os.close(memory)


def test_the_checker_lets_go_of_each_tests_gpu_memory_and_collects_a_failures_cycles(monkeypatch, tmp_path):
    """After each graded cell (and only those), the checker has the kernel worker let go and returns its own
    allocator's blocks; after a failed one it first collects the cycles a caught exception's frames make."""
    import contextlib
    import warnings
    from fuselab.grading.recheck import cellrunner, cuda_waits, lazy_plots
    monkeypatch.setattr(lazy_plots, "defer", lambda: None)
    monkeypatch.setattr(cuda_waits, "sleep_in_waits", lambda: "")
    monkeypatch.setattr(cellrunner, "_solution_process", lambda: None)
    monkeypatch.setattr(cellrunner, "_cuda_poisoned", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as on a GPU, where the tests made CUDA's state
    freed = []
    monkeypatch.setattr(kernels, "_free_gpu_memory", lambda collect=True: freed.append(collect))

    class Host:
        ahead, current_source, host_writes, poisoned = (), "", [], False
        process = type("Process", (), {"gone": False})()
        released = 0

        def release(self):
            self.released += 1
    host = Host()
    monkeypatch.setattr(cellrunner, "_kernel_host", lambda: host)
    cells = [{"index": 0, "grade_id": "setup", "source": "x = 1", "graded": False},
             {"index": 1, "grade_id": "test_passes", "source": "assert x == 1", "graded": True},
             {"index": 2, "grade_id": "helper", "source": "y = 2", "graded": False},
             {"index": 3, "grade_id": "test_fails", "source": "assert x == 2", "graded": True}]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"cells": cells}))
    read, write = os.pipe()
    try:
        with warnings.catch_warnings():  # the filters the checker sets for its process
            assert cellrunner.main(str(plan), write) == 0
    finally:
        os.close(read)
        with contextlib.suppress(OSError):
            os.close(write)
    assert host.released == 2 and freed == [False, True]
