"""The self-check's stages about the machine and the package: ``env`` (versions), ``tests`` (the pytest suite, GPU
tests included), ``build`` (build-time targets), ``timing`` (timing accuracy against itself and triton's
do_bench), ``emulation`` (emulated and real results of the test kernels agree), ``transfer`` (a launch's buffers
between the grader's checker and kernel worker, pinned against pageable).

Each ``stage_*`` is ``run(out) -> dict``; each ``*_rows`` gives the stage's rows of the closing table."""

from __future__ import annotations

import datetime
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from ...course import REPO


def stage_env(out):
    from ... import doctor, toolchain
    info = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "capability": ".".join(map(str, torch.cuda.get_device_capability())) if torch.cuda.is_available() else None,
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "python": sys.version.split()[0],
            "nvcc": toolchain.nvcc_version(toolchain.find_cuda_home()),
            "commit": git_commit(), "date": datetime.date.today().isoformat()}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info["doctor"] = [f"{f.status}: {f.topic}: {f.detail}" for f in doctor.run_checks()]
    return info


def env_rows(name, res):
    return [(name, "ok", f"{res['gpu']} cc {res['capability']}, torch {res['torch']}, commit {res['commit']}")]


def stage_tests(out):
    files = ["tests/test_prototypes.py", "tests/test_build.py", "tests/test_check.py", "tests/test_timing.py",
             "tests/test_emulation.py", "tests/test_grader_gpu.py", "tests/test_graph_kernels.py"]
    try:
        import nbclient  # noqa: F401 - the notebook tests need it (carried in the wheelhouse)
        files += ["tests/test_stderr_silence.py"]
    except ImportError:
        pass
    return _pytest(files, Path(out) / "pytest.txt", timeout=300)


def tests_rows(name, res):
    return [(name, "ok" if res["returncode"] == 0 else "FAIL", res["summary"][:90])]


def _pytest(files, log, timeout):
    """The repository's tests run by pytest in a child process (the package never imports ``tests/``)."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-rs"],
                            cwd=REPO, capture_output=True, text=True, timeout=timeout)
    log.write_text(result.stdout + result.stderr)
    summary = [line for line in result.stdout.splitlines() if " passed" in line or " failed" in line]
    return {"returncode": result.returncode, "summary": summary[-1] if summary else result.stdout[-500:],
            "seconds": time.perf_counter() - started}


def stage_build(out):
    from .. import build_benchmark
    return build_benchmark.run("cuda")


def build_rows(name, res):
    return [(name, "ok" if all(res["met"].values()) else "MISS",
             f"first {res['first_build']:.2f}s, edit {res['rebuild_after_edit']:.2f}s, "
             f"reload {res['reload_fresh_process']:.3f}s")]


def stage_timing(out):
    from ... import timing
    return timing.selfcheck()


def timing_rows(name, res):
    return [(name, "ok" if res.get("goal_spread_ok") and res.get("goal_do_bench_ok") else "MISS",
             f"spread {res.get('spread_pct', float('nan')):.2f}%, vs do_bench "
             f"{res.get('vs_do_bench_pct', float('nan')):+.2f}%")]


def stage_emulation(out):
    """The emulated and the real build of each test kernel agree (``tests/test_emulation_agreement.py``)."""
    result = _pytest(["tests/test_emulation_agreement.py"], Path(out) / "pytest-emulation.txt", timeout=300)
    agree = result["returncode"] == 0 and " passed" in result["summary"] and "skipped" not in result["summary"]
    return {**result, "status": "ok" if agree else "DISAGREE",
            "headline": f"emulated vs real builds of the test kernels: {result['summary']}"}


def stage_transfer(out, gib: int = 1, repeats: int = 5):
    """One launch's worth of buffers (``gib`` GiB) through the checker's transfer memory (``grading.recheck.
    transfer``) and back, as each side copies it: the GPU to the memory, the memory to the GPU. Pageable (the
    memory unpinned) against pinned: median wall seconds and this process's CPU seconds of a round trip."""
    from ...grading.recheck import transfer
    data = torch.randn(gib * 2**28, device="cuda")  # gib GiB of float32
    back = torch.empty_like(data)
    raw = data.view(torch.uint8)
    result = {"gib": gib, "repeats": repeats}
    for label, pin in (("pageable", False), ("pinned", True)):
        memory = transfer.Transfer(transfer.make())
        (offset, size), = memory.regions([raw.numel()], pin=pin)
        result[f"{label}_registered"] = memory.pinned
        walls, cpus = [], []
        for _ in range(repeats):
            torch.cuda.synchronize()
            wall, cpu = time.perf_counter(), time.process_time()
            memory.region(offset, size).copy_(raw)
            back.view(torch.uint8).copy_(memory.region(offset, size))
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        assert torch.equal(back, data), "the round trip changed the data"
        result[f"{label}_wall_s"], result[f"{label}_cpu_s"] = statistics.median(walls), statistics.median(cpus)
        memory.unmap()
        os.close(memory.fd)
    result["headline"] = (f"{gib} GiB there and back: pageable {result['pageable_wall_s']:.3f} s "
                          f"({result['pageable_cpu_s']:.3f} CPU s), pinned {result['pinned_wall_s']:.3f} s "
                          f"({result['pinned_cpu_s']:.3f} CPU s; registered: {result['pinned_registered']})")
    result["status"] = "ok" if result["pinned_registered"] else "NOT PINNED"
    return result


def git_commit():
    try:
        # the GPU machine's copy of the tree may carry an older .git: the commit named by the caller wins
        return os.environ.get("FUSELAB_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
        ).stdout.strip() or "unknown"
    except OSError:
        return os.environ.get("FUSELAB_COMMIT", "unknown")
