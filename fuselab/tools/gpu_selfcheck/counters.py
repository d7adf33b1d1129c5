"""The ``counters`` stage: Lab 0's unfused chain and fused kernel read through the GPU's hardware counters.

Timings say *that* fusion pays; the counters say where the bytes went. Nsight Compute (``ncu``) profiles a child
Python that runs the lab's fixed unfused reference (add, relu, mul) and the plain fused kernel at sizes inside and
far beyond the L2 cache, each after an L2 flush, and reads per kernel: DRAM bytes read and written, the L2 read sectors and
hits, the hit rates of reads and of writes, the L1 hit rate and the kernel's duration. ``--replay-mode application`` reruns the whole
child once per pass, so that every pass sees the caches as the pipeline left them (kernel replay would show the
second pass a cache the first pass warmed), and ``--cache-control none`` keeps ncu from flushing between kernels:
an intermediate that stays in L2 from ``add`` to ``relu`` is seen as it is.

The result, ``lab0_counters.json``, is what Lab 0 shows students without a GPU (copied to fuselab/labs/results/).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

SIZES = [2**20, 2**23, 2**26]  # 4 MB, 32 MB and 256 MB per tensor; the H200's L2 is 60 MB
METRICS = {
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "l2_read_sectors": "lts__t_sectors_op_read.sum",
    "l2_read_hit_sectors": "lts__t_sectors_op_read_lookup_hit.sum",
    "l2_read_hit_pct": "lts__t_sector_op_read_hit_rate.pct",
    "l2_write_hit_pct": "lts__t_sector_op_write_hit_rate.pct",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "l1_hit_pct": "l1tex__t_sector_hit_rate.pct",
    "duration_ns": "gpu__time_duration.sum",
}
UNFUSED_KERNELS = ("add_kernel", "relu_kernel", "mul_kernel")
FUSED_KERNEL = "add_relu_mul_kernel"


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    candidates = sorted(Path("/opt/nvidia/nsight-compute").glob("*/ncu")) + sorted(Path("/usr/local").glob("cuda*/bin/ncu"))
    return str(candidates[-1]) if candidates else None


def target() -> None:
    """The profiled child: each size, flush L2, the unfused reference; flush L2, the plain fused kernel."""
    import torch
    from ... import build
    from ...course import REPO
    from ...labs import lab0
    from ...notebook_sources import string_assignments
    sources = string_assignments(REPO / "solutions" / lab0.NOTEBOOK)
    reference = lab0.unfused(build(lab0.REFERENCE_UNFUSED_SOURCE, lab0.UNFUSED_LAUNCHERS, name="lab0_reference"))
    fused = lab0.fused(build(sources["FUSED_SOURCE"], [lab0.FUSED], name="fused"))
    # the flush reads a buffer written once, before anything is measured: a flush that writes would leave dirty
    # lines in L2 whose write-back the next kernel's DRAM counters would count as its own
    flush = torch.ones(4 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device="cuda")
    for n in SIZES:
        a, b, e = lab0.make_inputs((n,), seed=1, device="cuda")
        out = torch.empty_like(a)
        for op in (reference, fused):
            flush.sum()
            torch.cuda.synchronize()
            op(a, b, e, out)
        torch.cuda.synchronize()
        del a, b, e, out


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse(csv_text: str) -> list:
    """ncu's ``--csv --page raw`` rows of the lab's kernels, in launch order: ``{"kernel", metric: value}``."""
    lines = [line for line in csv_text.splitlines() if line.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    kernels = []
    for row in rows:
        name = row.get("Kernel Name", "")
        base = name.split("(")[0].split()[-1] if name else ""
        if base not in (*UNFUSED_KERNELS, FUSED_KERNEL):
            continue  # the L2 flush's fill kernel
        kernels.append({"kernel": base, **{key: _number(row.get(metric, "")) for key, metric in METRICS.items()}})
    return kernels


def summarize(kernels: list, sizes=SIZES) -> list:
    """Per size: the unfused chain's three kernels summed (bytes) or byte-weighted (hit rates) against the fused one,
    and the lab's computed minimum traffic beside the measured bytes."""
    per_size = 4  # add, relu, mul, fused
    if len(kernels) != per_size * len(sizes):
        raise ValueError(f"expected {per_size * len(sizes)} profiled kernels, got {len(kernels)}: "
                         f"{[k['kernel'] for k in kernels]}")
    rows = []
    for i, n in enumerate(sizes):
        chain, fused = kernels[per_size * i: per_size * i + 3], kernels[per_size * i + 3]
        if [k["kernel"] for k in chain] != list(UNFUSED_KERNELS) or fused["kernel"] != FUSED_KERNEL:
            raise ValueError(f"unexpected kernel order at n={n}: {[k['kernel'] for k in kernels]}")
        dram = lambda k: k["dram_read_bytes"] + k["dram_write_bytes"]  # noqa: E731
        unfused_dram = sum(dram(k) for k in chain)
        rows.append({
            "n": n, "tensor_bytes": 4 * n,
            "unfused": {"kernels": chain, "dram_bytes": unfused_dram,
                        "l2_read_hit_pct": _hit_rate(chain),
                        "duration_ns": sum(k["duration_ns"] for k in chain)},
            "fused": {"kernels": [fused], "dram_bytes": dram(fused), "l2_read_hit_pct": _hit_rate([fused]),
                      "duration_ns": fused["duration_ns"]},
            "computed_bytes": {"unfused": 8 * 4 * n, "fused": 4 * 4 * n},
            "dram_ratio": unfused_dram / dram(fused) if dram(fused) else None,
        })
    return rows


def _hit_rate(kernels) -> float:
    """The L2 read hit rate of several kernels together: their hit sectors over their read sectors (a mean of
    per-kernel rates would let a small kernel count as much as a large one)."""
    sectors = sum(k["l2_read_sectors"] for k in kernels)
    return 100.0 * sum(k["l2_read_hit_sectors"] for k in kernels) / sectors if sectors else 0.0


def stage_counters(out):
    import torch
    from ...labs import lab0
    ncu = find_ncu()
    if ncu is None:
        return {"status": "skipped", "headline": "no ncu (Nsight Compute) on this machine"}
    command = [ncu, "--csv", "--page", "raw", "--replay-mode", "application", "--cache-control", "none",
               "--clock-control", "none", "--print-units", "base", "--metrics", ",".join(METRICS.values()),
               sys.executable, "-m", "fuselab.tools.gpu_selfcheck.counters", "--target"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=480)
    (Path(out) / "ncu.csv").write_text(done.stdout[-4_000_000:])
    if done.returncode != 0:
        return {"status": "FAIL", "headline": f"ncu exited {done.returncode}",
                "error_tail": (done.stderr or done.stdout)[-2000:]}
    rows = summarize(parse(done.stdout))
    saved = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
             "l2_bytes": torch.cuda.get_device_properties(0).L2_cache_size, "rows": rows,
             "note": "Nsight Compute, application replay, no cache control between kernels, L2 flushed before each "
                     "pipeline; the lab's unfused reference (add, relu, mul) and the plain fused kernel"}
    (Path(out) / lab0.COUNTER_RESULTS).write_text(json.dumps(saved, indent=2))
    big = rows[-1]
    return {"status": "ok", "rows": rows,
            "headline": f"n={big['n']}: DRAM unfused/fused {big['dram_ratio']:.2f}x; L2 read hit unfused "
                        f"{big['unfused']['l2_read_hit_pct']:.0f}% fused {big['fused']['l2_read_hit_pct']:.0f}%"}


if __name__ == "__main__" and sys.argv[1:] == ["--target"]:
    target()
