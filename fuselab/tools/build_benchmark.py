"""Build-time benchmark for a lab-sized kernel: the numbers a student feels while iterating.

- first build: a fresh cache, in a fresh process (what the first run of a lab's build cell costs);
- rebuild after an edit of the kernel only (the student's inner loop);
- reload of an unchanged source in a fresh process (reopening the notebook, or the grader's clean recheck).

With ``--labs``, the edit-rebuild of every kernel source of the four labs' solutions instead (what a student
waits for after editing a Lab 1 conv or Lab 3 GEMM, larger than Lab 0's kernel): the README's range for the
emulation comes from that run, saved in ``docs/results/``.

Run ``python -m fuselab.tools.build_benchmark [--backend cuda|emulate] [--labs]``; it prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from ..labs import lab0

TARGETS = {  # seconds, from the core issue
    "cuda": {"first_build": 20.0, "rebuild_after_edit": 3.0, "reload_fresh_process": 1.0},
    "emulate": {"rebuild_after_edit": 5.0},
}

KERNEL = lab0.REFERENCE_UNFUSED_SOURCE + r"""
__global__ void add_relu_mul_kernel(const float* a, const float* b, const float* e, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(a[i] + b[i], 0.0f) * e[i] * SCALE;
}
void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) add_relu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, e, out, n);
}
"""


def _source(scale: str) -> str:
    return KERNEL.replace("SCALE", scale)


def _timed_build_in_subprocess(source: str, backend: str, env) -> float:
    code = ("import time, sys, fuselab\n"
            "from fuselab.labs import lab0\n"
            f"t = time.perf_counter(); fuselab.build({source!r}, lab0.LAUNCHERS, backend={backend!r})\n"
            "print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def run(backend: str) -> dict:
    import fuselab
    with tempfile.TemporaryDirectory(prefix="fuselab-bench-") as cache:
        env = dict(os.environ, FUSELAB_CACHE_DIR=cache)
        results = {"backend": backend}
        results["first_build"] = _timed_build_in_subprocess(_source("1.0f"), backend, env)
        saved = os.environ.get("FUSELAB_CACHE_DIR")
        os.environ["FUSELAB_CACHE_DIR"] = cache
        try:
            fuselab.build(_source("1.0f"), lab0.LAUNCHERS, backend=backend)  # warm this process's imports
            edits = []
            for k in range(3):  # each edit is a new kernel text, as in a student's inner loop
                started = time.perf_counter()
                fuselab.build(_source(f"{2 + k}.0f"), lab0.LAUNCHERS, backend=backend)
                edits.append(time.perf_counter() - started)
            results["rebuild_after_edit"] = sorted(edits)[len(edits) // 2]
            results["rebuild_after_edit_all"] = edits
        finally:
            if saved is None:
                os.environ.pop("FUSELAB_CACHE_DIR", None)
            else:
                os.environ["FUSELAB_CACHE_DIR"] = saved
        results["reload_fresh_process"] = _timed_build_in_subprocess(_source("1.0f"), backend, env)
    results["targets"] = TARGETS.get(backend, {})
    results["met"] = {k: results[k] <= v for k, v in results["targets"].items()}
    return results


def run_labs(backend: str, edits: int = 3) -> dict:
    """Median edit-rebuild time of each lab solution's kernel sources (a comment appended: a new hash)."""
    import fuselab
    from ..course import REPO
    from ..labs import registry
    from ..notebook_sources import string_assignments
    results = {"backend": backend, "cores": os.cpu_count(), "labs": {}}
    with tempfile.TemporaryDirectory(prefix="fuselab-bench-") as cache:
        saved = os.environ.get("FUSELAB_CACHE_DIR")
        os.environ["FUSELAB_CACHE_DIR"] = cache
        try:
            for lab in registry.all_labs().values():
                sources = string_assignments(REPO / "solutions" / lab.notebook)
                for name, launchers in lab.launchers.items():
                    source = sources[name]
                    started = time.perf_counter()
                    fuselab.build(source, launchers, backend=backend)
                    first = time.perf_counter() - started
                    times = []
                    for k in range(edits):
                        started = time.perf_counter()
                        fuselab.build(source + f"\n// edit {k}\n", launchers, backend=backend)
                        times.append(time.perf_counter() - started)
                    results["labs"][f"{lab.name}.{name}"] = {"first_build": first, "rebuild_after_edit": times}
        finally:
            if saved is None:
                os.environ.pop("FUSELAB_CACHE_DIR", None)
            else:
                os.environ["FUSELAB_CACHE_DIR"] = saved
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, choices=["cuda", "emulate"])
    parser.add_argument("--labs", action="store_true", help="time every lab solution's kernels instead")
    args = parser.parse_args(argv)
    from ..kernelbuild import resolve_backend
    backend = resolve_backend(args.backend)
    print(json.dumps(run_labs(backend) if args.labs else run(backend), indent=2))


if __name__ == "__main__":
    main()
