"""load_inline (as fuselab.build did it) against one direct nvcc call, for every lab solution's kernels.

Run at commit 7b367ea (its kernelbuild/cuda.py gives the load_inline flags; later commits build with nvcc):
``python docs/results/build-compiler-call.py 5 > result.json``. Wall seconds and CPU seconds (this process and
its children) of each build.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

def kernels():
    from fuselab.course import REPO
    from fuselab.labs import registry
    from fuselab.notebook_sources import string_assignments
    out = []
    for lab in registry.all_labs().values():
        sources = string_assignments(REPO / "solutions" / lab.notebook)
        for name, launchers in lab.launchers.items():
            out.append((f"{lab.name}.{name}", sources[name], launchers))
    return out

def job_for(source, launchers, salt):
    from fuselab import prototypes, toolchain
    from fuselab.kernelbuild.cuda import job
    toolchain.prepare_cuda_environment()
    return job(source + f"\n// {salt}\n", prototypes.parse_all(launchers), "kernel.cu", ())

def build_load_inline(j, d):
    from fuselab.kernelbuild import _run_load_inline
    d.mkdir(parents=True, exist_ok=True)
    _run_load_inline(j, d, 600, False)
    assert (d / f"{j.name}.so").exists()

def direct_flags(j):
    from fuselab import toolchain
    flags = [f for f in j.cuda_cflags if not f.startswith("-U__CUDA_NO_")]
    return ["-shared", "-Xcompiler", "-fPIC", "--cudart", "shared", "-std=c++20", "--expt-relaxed-constexpr",
            *flags, *toolchain.cuda_link_flags(toolchain.find_cuda_home())]

def build_direct(j, d):
    from fuselab import toolchain
    d.mkdir(parents=True, exist_ok=True)
    (d / "kernel.cu").write_text(j.cuda_source)
    nvcc = str(Path(toolchain.find_cuda_home()) / "bin" / "nvcc")
    subprocess.run([nvcc, *direct_flags(j), "-o", str(d / f"{j.name}.so"), str(d / "kernel.cu")],
                   check=True, capture_output=True, timeout=600)

def one(method, index, salt):
    """In a fresh process: a cold build then a warm one (new hash, new folder each)."""
    import fuselab  # noqa: F401  (torch imported by Job either way; not timed)
    import torch  # noqa: F401
    name, source, launchers = kernels()[index]
    build = build_load_inline if method == "load_inline" else build_direct
    import resource
    def cpu():
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
    times, cpus = [], []
    with tempfile.TemporaryDirectory(prefix="cc-bench-") as tmp:
        for k in ("cold", "warm"):
            j = job_for(source, launchers, f"{salt}-{k}")
            started, c0 = time.perf_counter(), cpu()
            build(j, Path(tmp) / k)
            times.append(time.perf_counter() - started)
            cpus.append(cpu() - c0)
    print(json.dumps(times + cpus))

def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    names = [k[0] for k in kernels()]
    raw = {n: {m: {"cold": [], "warm": [], "cold_cpu": [], "warm_cpu": []} for m in ("load_inline", "nvcc")}
           for n in names}
    loads = [open("/proc/loadavg").read().split()[:3]]
    for rep in range(repeats):
        for i, n in enumerate(names):
            order = ["load_inline", "nvcc"] if (rep + i) % 2 == 0 else ["nvcc", "load_inline"]
            for method in order:
                out = subprocess.run([sys.executable, __file__, "one", method, str(i), f"{rep}-{os.getpid()}"],
                                     capture_output=True, text=True, check=True)
                values = json.loads(out.stdout.strip().splitlines()[-1])
                for key, value in zip(("cold", "warm", "cold_cpu", "warm_cpu"), values):
                    raw[n][method][key].append(value)
        loads.append(open("/proc/loadavg").read().split()[:3])
        print(f"repeat {rep} done", file=sys.stderr, flush=True)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    j = job_for(*kernels()[0][1:], "flags")
    print(json.dumps({"raw": raw, "loadavg_per_repeat": loads,
                      "median": {n: {m: {k: med(v) for k, v in r.items()} for m, r in d.items()} for n, d in raw.items()},
                      "direct_flags": direct_flags(j)}, indent=1))

if __name__ == "__main__":
    if sys.argv[1:2] == ["one"]:
        one(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        main()
