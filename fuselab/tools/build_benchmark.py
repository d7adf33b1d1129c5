"""Build-time benchmark for a lab-sized kernel: the numbers a student feels while iterating.

- first build: a fresh cache, in a fresh process (what the first run of a lab's build cell costs);
- rebuild after an edit of the kernel only (the student's inner loop);
- reload of an unchanged source in a fresh process (reopening the notebook, or the grader's clean recheck).

Run ``python -m fuselab.tools.build_benchmark [--backend cuda|emulate]``; it prints JSON.
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, choices=["cuda", "emulate"])
    args = parser.parse_args(argv)
    from ..build import resolve_backend
    print(json.dumps(run(resolve_backend(args.backend)), indent=2))


if __name__ == "__main__":
    main()
