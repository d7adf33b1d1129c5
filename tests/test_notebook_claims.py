"""What the labs' text says about measurements agrees with the measurements saved beside it (CPU, about a second).

Every comparative or quantitative statement of the lab notebooks' markdown (``solutions/``, answers included) and
of the README's lab table and measurement sentences is a *claim* here: the exact words, and a check of them
against the saved data they speak of (``fuselab/labs/results/*.json``, the speed policy, the saved build
benchmark). "A few percent" is not a claim anyone can check, so the text states a bound ("under 2 %"), and the
bound is checked; "passes the byte ratio" is a relation, and the relation is checked. When the course GPU is
measured again and a number moves, the claim that no longer holds fails here, naming the words to change.

A sentence of the notebooks that uses the vocabulary of comparison (faster, speedup, share, byte ratio, bound,
…) must contain a claim's words, or words listed in ``NOT_MEASURED`` with why they speak of no measurement (a
definition, an instruction, a count that follows from the shapes). ``tests/test_notebook_text.py`` lets markdown
state a literal measured number only inside a claim's words.
"""

import json
import math
import re
from pathlib import Path

import pytest

from .conftest import REPO as ROOT

LABS = ("lab0", "lab1", "lab2", "lab3")
RESULTS = ROOT / "fuselab" / "labs" / "results"
# the edit-rebuild times of every lab's kernels under the CPU emulation, measured on a 2-core CPU machine with
# ``python -m fuselab.tools.build_benchmark --backend emulate --labs``
EMULATION_BUILD = ROOT / "docs" / "results" / "build-emulation-labs-cpu2.json"
# the GPU self-check on the H200 machine whose build times and timing accuracy the README and Lab 0 quote
# (docs/RESULTS.md, "Build times" and "Timing accuracy")
H200_SELFCHECK = ROOT / "docs" / "results" / "selfcheck-h200-59d27bd.json"


def load_data() -> dict:
    data = {path.stem: json.loads(path.read_text()) for path in RESULTS.glob("*.json")}
    data["policy"] = json.loads((ROOT / "fuselab" / "speed" / "policy.json").read_text())
    data["emulation_build"] = json.loads(EMULATION_BUILD.read_text())
    data["h200_selfcheck"] = json.loads(H200_SELFCHECK.read_text())
    return data


# ------------------------------------------------------------------------------------------- readings of the data
def lab2_network_saved_runs(d):
    """(batch, timing, model) of every time the saved whole-network file holds: a run at another batch, or of
    another model (torch.compile), would be a key of its own, or a list of rows per batch."""
    saved = d["lab2_network"]
    if "rows" in saved or not isinstance(saved.get("batch"), int):
        return {(row.get("batch"), timing, model) for row in saved.get("rows", [])
                for timing, models in row.get("median_ms", {}).items() for model in models}
    return {(saved["batch"], timing, model) for timing, models in saved["median_ms"].items() for model in models}


def lab0_ratio(d):
    from fuselab.labs import lab0
    moved = lab0.bytes_moved(1)
    return moved["unfused"] / moved["fused"]


def lab0_rows(d, inside):
    sweep = d["lab0_sweep"]
    return [r for r in sweep["rows"] if (4 * r["n"] <= sweep["l2_bytes"]) == inside]


def counter_rows(d, inside):
    """Lab 0's hardware-counter rows where all five tensors of the unfused chain fit in L2 at once (inside), or
    where each tensor is at least half of L2 (beyond)."""
    saved = d["lab0_counters"]
    l2 = saved["l2_bytes"]
    return [r for r in saved["rows"] if (5 * r["tensor_bytes"] <= l2 if inside else 2 * r["tensor_bytes"] >= l2)]


def counter_sum(row, side, key):
    return sum(k[key] for k in row[side]["kernels"])


def cache_hit_pairs(d):
    """(fused, unfused) hit rates of Lab 0's counters, per size: the L2 read hit rate of all of each version's
    sectors, and the L1 hit rate of its best kernel (the saved file has no L1 sector counts to pool)."""
    return [pair for r in d["lab0_counters"]["rows"] for pair in (
        (r["fused"]["l2_read_hit_pct"], r["unfused"]["l2_read_hit_pct"]),
        (max(k["l1_hit_pct"] for k in r["fused"]["kernels"]), max(k["l1_hit_pct"] for k in r["unfused"]["kernels"])))]


def lab1_conv_rate(d, name):
    return d["lab1_conv"]["flops"] / (d["lab1_conv"]["times_us"][name] * 1e-6)


def lab1_graded(d):
    return d["lab1_depthwise"]["rows"][0]


def fractions(unfused_us, fused_us, ratio):
    """(f_unfused, f_fused) relative to each other's yardstick: f_fused / f_unfused = speedup / ratio."""
    return ratio * 1.0 / unfused_us, 1.0 / fused_us


def lab1_shortfall(d):
    row = lab1_graded(d)
    t = row["times_us"]
    f_unfused, f_fused = fractions(t[row["baseline"]], t["plain fused"], 2.0)
    return row["speedups"]["plain fused"], f_unfused, f_fused


def lab2_graded(d):
    from fuselab.labs import lab2
    return next(r for r in d["lab2_context"]["rows"] if tuple(r["shape"]) == tuple(lab2.TIMED_SHAPE))


def bytes_share(d, lab, shape):
    """The share of the lab's unfused reference's time, at ``shape``, that its minimum bytes take at the saved copy
    bandwidth: near 1 for a kernel its bytes limit; small where launches and ramp-up set the time."""
    from fuselab.labs import lab1, lab2
    if lab == "lab1":
        row = next(r for r in d["lab1_depthwise"]["rows"] if tuple(r["shape"][:4]) == tuple(shape))
        moved, seconds = lab1.depthwise_bytes(*shape)["unfused"], row["times_us"][row["baseline"]] * 1e-6
        copy = d["lab1_depthwise"]["copy_GBps"]
    else:
        row = next(r for r in d["lab2_context"]["rows"] if tuple(r["shape"]) == tuple(shape))
        moved, seconds = lab2.bytes_moved(shape)["unfused"], row["median_us"]["lab reference (3 kernels)"] * 1e-6
        copy = d["lab2_context"]["copy_GBps"]
    return moved / (copy * 1e9) / seconds


def launch_bound(d, lab, small, big):
    """"Launch-bound" at ``small``: the reference's bytes take under a fifth of its time there, and under half the
    share they take at ``big``, where the bytes set more of it."""
    return bytes_share(d, lab, small) < 0.2 and bytes_share(d, lab, big) > 2 * bytes_share(d, lab, small)


def lab2_timed_network_blocks():
    """The depthwise-separable blocks of the network Lab 2 times (224×224 inputs: lab2.gpu_timing's default)."""
    import inspect

    from fuselab.labs import lab2
    from fuselab.labs.lab2 import gpu_timing
    assert inspect.signature(gpu_timing.time_networks).parameters["image"].default == 224
    return len(lab2.mobilenet(**lab2.TIMED_MOBILENET).blocks)


def lab2_shortfall(d):
    t = lab2_graded(d)["median_us"]
    f_unfused, f_fused = fractions(t["lab reference (3 kernels)"], t["plain fused (folded)"], 3.0)
    return t["lab reference (3 kernels)"] / t["plain fused (folded)"], f_unfused, f_fused


def lab3_skinny(d, mode=None):
    return [r for r in d["lab3_sweep"]["rows"] if r["M"] <= 64 and mode in (None, r["mode"])]


def lab3_k(d, low=0, high=10**9):
    return [r for r in d["lab3_sweep"]["k_rows"] if low <= r["K"] <= high]


def lab3_small_k_ratio(k):
    from fuselab.labs import lab3
    moved = lab3.traffic(4096, 4096, k)
    return (moved["gemm"] + moved["epilogue"]) / (moved["gemm"] + 4096 * 4)


def lab3_small_k_row(d, name, dtype):
    return next(r for r in d["lab3_sweep"]["small_k"]["rows"] if r["name"] == name and r["dtype"] == dtype)


def lab3_shortfall(d, dtype):
    from fuselab.labs import lab3
    m, n, k = lab3.SMALL_K
    size = 4 if dtype == "float32" else 2
    moved = lab3.traffic(m, n, k, size)
    ratio = (moved["gemm"] + moved["epilogue"]) / (moved["gemm"] + n * size)
    ref, plain = (lab3_small_k_row(d, name, dtype)["median_us"] for name in ("lab reference", "plain fused"))
    f_unfused, f_fused = fractions(ref, plain, ratio)
    return ref / plain, ratio, f_unfused, f_fused


def policy(d, lab_test, key):
    return d["policy"]["tests"][lab_test]["gpus"]["NVIDIA H200"][key]


def rebuilds(d):
    return [t for lab in d["emulation_build"]["labs"].values() for t in lab["rebuild_after_edit"]]


def ridge(d):
    """The fp32 ridge point (FLOP/byte) that Lab 1's roofline prints without a GPU: the H200's saved ceilings."""
    from fuselab.labs import lab1
    return lab1.H200_CEILINGS["fp32_flops_per_s"] / lab1.H200_CEILINGS["copy_bytes_per_s"]


def lab3_intensity(k):
    """FLOP per fused byte of the fp32 GEMM at M = N = 4096 and this K: the last column of Lab 3's traffic table."""
    from fuselab.labs import lab3
    moved = lab3.traffic(4096, 4096, k)
    return 2 * 4096 * 4096 * k / (moved["gemm"] + 4096 * 4)


def lab3_k_fp32(d, low=0, high=10**9):
    return sorted((r for r in lab3_k(d, low, high) if r["dtype"] == "float32"), key=lambda r: r["K"])


def x(value):  # how the README writes a speedup
    return f"{value:.2f}×"


# ------------------------------------------------------------------------------------------------------ the claims
# (where, the exact words (whitespace-insensitive), the check over the saved data). ``where`` is a lab (its
# solution notebook's markdown) or "README" (its lab table and measurement sentences).
CLAIMS = [
    # Lab 0
    # Lab 0's hardware counters (section 5.2)
    ("lab0", "one where every tensor fits in L2 at once, and two where they do not",
     lambda d: len(counter_rows(d, True)) == 1 and len(counter_rows(d, False)) == 2),
    # beyond L2 the measured DRAM bytes against section 2's count: never over it, short of it by the writes that
    # are still in L2 when the profiled kernel ends (the fused kernel reads its three inputs whole)
    ("lab0", "Beyond L2, the DRAM bytes come within a tenth of the ones you counted",
     lambda d: all(0.9 <= r[side]["dram_bytes"] / r["computed_bytes"][side] <= 1.01
                   for r in counter_rows(d, False) for side in ("unfused", "fused"))),
    ("lab0", "a little under them where some of the last writes are still in L2 when the kernel ends",
     lambda d: all(r["fused"]["dram_bytes"] < r["computed_bytes"]["fused"]
                   and abs(counter_sum(r, "fused", "dram_read_bytes") / (3 * r["tensor_bytes"]) - 1) < 0.02
                   and counter_sum(r, "fused", "dram_write_bytes") < r["tensor_bytes"] for r in counter_rows(d, False))),
    ("lab0", "the unfused chain moves about twice the fused kernel's bytes, as your count says",
     lambda d: all(1.8 <= r["dram_ratio"] <= 2.2 for r in counter_rows(d, False))),
    ("lab0", "Both versions read the three inputs from DRAM once and write nothing back while they run",
     lambda d: all(abs(counter_sum(r, side, "dram_read_bytes") - 3 * r["tensor_bytes"]) <= 0.05 * r["tensor_bytes"]
                   and counter_sum(r, side, "dram_write_bytes") <= 0.05 * r["tensor_bytes"]
                   for r in counter_rows(d, True) for side in ("unfused", "fused"))),
    ("lab0", "relu finds most of its reads there",
     lambda d: all(r["unfused"]["kernels"][1]["l2_read_hit_pct"] > 50 for r in counter_rows(d, True))),
    ("lab0", "The DRAM bytes are about equal",
     lambda d: all(0.95 <= r["dram_ratio"] <= 1.05 for r in counter_rows(d, True))),
    ("lab0", "what fusion saves here is two launches and the round trips through L2",
     lambda d: all(counter_sum(r, "fused", "l2_read_sectors") < 0.8 * counter_sum(r, "unfused", "l2_read_sectors")
                   and r["fused"]["duration_ns"] < r["unfused"]["duration_ns"] for r in counter_rows(d, True))),
    ("lab0", "The fused kernel's L2 hit rate is about zero",
     lambda d: all(r["fused"]["l2_read_hit_pct"] < 1.0 for r in d["lab0_counters"]["rows"])),
    ("lab0", "The unfused chain's is higher inside L2",
     lambda d: all(r["unfused"]["l2_read_hit_pct"] > 10 * max(r["fused"]["l2_read_hit_pct"], 0.1)
                   for r in counter_rows(d, True))),
    ("lab0", "The L1 hit rate is 0 % in every kernel, fused or not, at every size",
     lambda d: all(f"{k['l1_hit_pct']:.1f}" == "0.0" for r in d["lab0_counters"]["rows"]
                   for side in ("unfused", "fused") for k in r[side]["kernels"])),
    ("lab0", "at 4 MiB a tensor relu finds most of its reads in L2 and none in L1",
     lambda d: [r["tensor_bytes"] for r in counter_rows(d, True)] == [4 * 2**20]
     and all(r["unfused"]["kernels"][1]["kernel"] == "relu_kernel" and r["unfused"]["kernels"][1]["l2_read_hit_pct"] > 50
             and r["unfused"]["kernels"][1]["l1_hit_pct"] < 0.05 for r in counter_rows(d, True))),
    ("lab0", 'It promises fusion "2-5x better cache hit rates"; for this chain the counters say that does not hold: '
             "the fused kernel's hit rate is nowhere twice the unfused chain's, in L2 or in L1",
     lambda d: not any(fused >= 2 * unfused and fused >= 1.0 for fused, unfused in cache_hit_pairs(d))),
    ("lab0", "because every launch costs GPU time even when queued back to back and host time to issue it",
     lambda d: d["lab0_launch"]["launch"]["queued_device_us"] > 0.5 and d["lab0_launch"]["launch"]["host_issue_us"] > 0.5),
    ("lab0", "Thousands of tiny launches add up to milliseconds",
     lambda d: 1000 * d["lab0_launch"]["launch"]["queued_device_us"] >= 1000),
    ("lab0", "inside the L2 the speedup stays within a tenth of the byte ratio",
     lambda d: all(abs(r["speedup"] / lab0_ratio(d) - 1) <= 0.1 for r in lab0_rows(d, inside=True))),
    ("lab0", "and below what it reaches beyond the L2",
     lambda d: max(r["speedup"] for r in lab0_rows(d, True)) < min(r["speedup"] for r in lab0_rows(d, False))),
    ("lab0", "yet the speedup is still about the byte ratio",
     lambda d: abs(lab0_rows(d, True)[0]["speedup"] / lab0_ratio(d) - 1) <= 0.1),
    ("lab0", "each kernel lasts only a few microseconds",
     lambda d: lab0_rows(d, True)[0]["unfused_s"] / 3 < 10e-6 and lab0_rows(d, True)[0]["fused_s"] < 10e-6),
    ("lab0", "the speedup, within a tenth of the byte ratio, is a ratio of fixed costs",
     lambda d: all(abs(r["speedup"] / lab0_ratio(d) - 1) <= 0.1 for r in lab0_rows(d, inside=True))),
    ("lab0", "the speedup passes the byte ratio",
     lambda d: all(r["speedup"] > lab0_ratio(d) for r in lab0_rows(d, inside=False))),
    ("lab0", "the fused kernel sustains a larger fraction of the copy ceiling than the three unfused kernels",
     lambda d: all(r["fused_GBps"] > r["unfused_GBps"] for r in lab0_rows(d, inside=False))),
    ("lab0", "Beyond the L2 it passes the byte ratio, because one fused kernel reaches a larger fraction of the copy "
             "ceiling than a chain of short kernels",
     lambda d: all(r["speedup"] > lab0_ratio(d) and r["fused_GBps"] > r["unfused_GBps"]
                   for r in lab0_rows(d, inside=False))),
    ("lab0", "inside the L2 it stays near the byte ratio",
     lambda d: all(abs(r["speedup"] / lab0_ratio(d) - 1) <= 0.1 for r in lab0_rows(d, inside=True))),
    ("lab0", "at 64M elements it is hundreds of microseconds, far more than the few microseconds it takes to queue it",
     lambda d: 100e-6 <= next(r for r in d["lab0_sweep"]["rows"] if r["n"] == 2**26)["fused_s"] < 1e-3
     and d["lab0_launch"]["launch"]["host_issue_us"] < 10),
    ("lab0", "60 MiB on an H200", lambda d: d["lab0_sweep"]["l2_bytes"] == 60 * 2**20),
    ("lab0", "The sweep shows *that* the fused kernel wins inside L2 and beyond it",
     lambda d: lab0_rows(d, True) and lab0_rows(d, False) and all(r["low"] > 1.0 for r in d["lab0_sweep"]["rows"])),
    ("lab0", "launches recorded once and replayed by the GPU, which removes most host work",
     lambda d: d["lab0_launch"]["launch"]["graph_per_kernel_us"] < d["lab0_launch"]["launch"]["host_issue_us"] / 2),
    # Lab 1, Part A
    ("lab1", "the epilogue pass is a small share of the time",
     lambda d: d["lab1_conv"]["times_us"]["activation alone"] / d["lab1_conv"]["times_us"]["unfused pair"] < 0.02),
    ("lab1", "that is a small share of the time, under two percent of it",
     lambda d: d["lab1_conv"]["times_us"]["activation alone"] / d["lab1_conv"]["times_us"]["unfused pair"] < 0.02),
    ("lab1", "the kernel is **compute-bound**",
     lambda d: d["lab1_conv"]["flops"] / d["lab1_conv"]["bytes"]["conv"]
     > d["lab1_conv"]["fp32_TFLOPs"] * 1e12 / (d["lab1_conv"]["copy_GBps"] * 1e9)),
    ("lab1", "about **140 FLOP/byte**, far right of the ridge",
     lambda d: 120 <= d["lab1_conv"]["flops"] / d["lab1_conv"]["bytes"]["conv"] <= 160
     and d["lab1_conv"]["flops"] / d["lab1_conv"]["bytes"]["conv"]
     > 10 * d["lab1_conv"]["fp32_TFLOPs"] * 1e12 / (d["lab1_conv"]["copy_GBps"] * 1e9)),
    ("lab1", "**0.125 FLOP/byte**, far left", lambda d: 0.125 < ridge(d) / 10),
    ("lab1", "about **2 FLOP/byte**, far left of the ridge",
     lambda d: 1.5 <= 18 / 8 <= 2.5 and 18 / 8 < ridge(d) / 4),
    ("lab1", "at under a tenth of the fp32 roof",
     lambda d: lab1_conv_rate(d, "conv alone") < 0.1 * d["lab1_conv"]["fp32_TFLOPs"] * 1e12),
    ("lab1", "its point lies above that roof",
     lambda d: lab1_conv_rate(d, "cuDNN conv + relu (eager)") > d["lab1_conv"]["fp32_TFLOPs"] * 1e12),
    ("lab1", "gain nothing, the fused kernel even measuring a little slower than the pair",
     lambda d: 0.95 < d["lab1_conv"]["speedups"]["fused"] < 1.0),
    ("lab1", "the naive kernel reaches under a tenth of peak FLOP/s, so it takes milliseconds",
     lambda d: lab1_conv_rate(d, "conv alone") < 0.1 * d["lab1_conv"]["fp32_TFLOPs"] * 1e12
     and 1000 <= d["lab1_conv"]["times_us"]["conv alone"] < 10000),
    ("lab1", "moves 8 bytes per output in under 20 µs",
     lambda d: d["lab1_conv"]["times_us"]["activation alone"] < 20),
    ("lab1", "the fused kernel measured slower than the conv alone by more than the whole activation pass",
     lambda d: d["lab1_conv"]["times_us"]["fused"] - d["lab1_conv"]["times_us"]["conv alone"]
     > d["lab1_conv"]["times_us"]["activation alone"]),
    ("lab1", "so the fused kernel measures a little slower than the pair",
     lambda d: 0.95 < d["lab1_conv"]["speedups"]["fused"] < 1.0),
    ("lab1", "With a conv many times faster (cuDNN)",
     lambda d: d["lab1_conv"]["speedups"]["cuDNN conv + relu (eager)"] >= 10),
    ("lab1", "the fused kernel measured a little slower, by under 5 %",
     lambda d: 0.95 < d["lab1_conv"]["speedups"]["fused"] < 1.0),
    # Lab 1, Part B
    ("lab1", "Then the same at a launch-bound size",
     lambda d: launch_bound(d, "lab1", (1, 32, 112, 112), (64, 96, 112, 112))),
    ("lab1", "Here fusion pays", lambda d: lab1_graded(d)["speedups"]["plain fused"] > 1.3),
    ("lab1", "a large share for a memory-bound depthwise conv, though less than its byte ratio",
     lambda d: 1.3 < lab1_graded(d)["speedups"]["plain fused"] < 2.0),
    ("lab1", "a plain fused kernel reaches a smaller fraction of the copy bandwidth than the simple kernels it "
             "replaces",
     lambda d: lab1_shortfall(d)[2] < lab1_shortfall(d)[1]),
    ("lab1", "the plain fused kernel gains less than the byte ratio",
     lambda d: lab1_graded(d)["speedups"]["plain fused"] < 2.0),
    ("lab1", "reaches a smaller fraction of the copy bandwidth than the reference's two simple kernels",
     lambda d: lab1_shortfall(d)[2] < lab1_shortfall(d)[1]),
    ("lab1", "each tensor 308 MB, beyond the L2",
     lambda d: 64 * 96 * 112 * 112 * 4 // 10**6 == 308 and 308e6 > d["lab0_sweep"]["l2_bytes"]),
    # Lab 2
    # the whole network (Part B): at batch 1 the host's issuing sets the pace of a stream of passes, four times the
    # GPU time of one
    ("lab2", "at batch 1 (launch-bound) and batch 64",
     lambda d: d["lab2_network"]["batch"] == 1
     and d["lab2_network"]["median_ms"]["stream"]["unfolded"] > 2 * d["lab2_network"]["median_ms"]["device"]["unfolded"]),
    # what a student without a GPU sees of that cell: the saved file holds batch 1 alone, eager only (unfolded and
    # folded), timed both ways; the words said batch 64 beside it as if saved too
    ("lab2", "what the course saved from its H200: the eager network at batch 1 alone, timed both ways, with no "
             "batch-64 run and no compiled one",
     lambda d: lab2_network_saved_runs(d) == {(1, "device", "unfolded"), (1, "device", "folded"),
                                              (1, "stream", "unfolded"), (1, "stream", "folded")}
     and d["lab2_network"]["gpu"] == "NVIDIA H200"),
    ("lab2", "a stem and 7 depthwise-separable blocks, 224×224 images", lambda d: lab2_timed_network_blocks() == 7),
    # Part C's kernels, at the context cell's small shape
    ("lab2", "one small and launch-bound", lambda d: launch_bound(d, "lab2", (1, 32, 112, 112), (64, 96, 112, 112))),
    ("lab2", "moves a third of the unfused bytes", lambda d: True),  # a count (lab2.bytes_moved), tested in test_lab2
    ("lab2", "Its speedup falls short of that byte ratio",
     lambda d: lab2_shortfall(d)[0] < 3.0),
    ("lab2", "the plain fused kernel reaches a smaller fraction of the copy bandwidth than the reference's three "
             "simple kernels", lambda d: lab2_shortfall(d)[2] < lab2_shortfall(d)[1]),
    ("lab2", "the plain fused kernel gains less than that byte ratio", lambda d: lab2_shortfall(d)[0] < 3.0),
    ("lab2", "applying BN in registers was slower than folding, by much less than either was faster than the unfused "
             "pipeline",
     lambda d: all(0 < r["median_us"]["BN in registers"] / r["median_us"]["plain fused (folded)"] - 1
                   < (r["median_us"]["lab reference (3 kernels)"] / r["median_us"]["BN in registers"] - 1) / 3
                   for r in d["lab2_context"]["rows"])),
    ("lab2", "the extra arithmetic per output shows as a clear slowdown",
     lambda d: lab2_graded(d)["median_us"]["BN in registers"] / lab2_graded(d)["median_us"]["plain fused (folded)"]
     > 1.05),
    ("lab2", "It is still small next to the two extra DRAM round trips",
     lambda d: all(r["median_us"]["BN in registers"] < r["median_us"]["lab reference (3 kernels)"]
                   for r in d["lab2_context"]["rows"])),
    ("lab2", "The plain kernels are far from the copy ceiling",
     lambda d: all(lab2_graded(d)["effective_GBps"][name] / d["lab2_context"]["copy_GBps"] < 0.5
                   for name in ("plain fused (folded)", "BN in registers"))),
    ("lab2", "at batch 1 an eager pass costs the host more time to issue than the GPU needs to run it",
     lambda d: d["lab2_network"]["median_ms"]["stream"]["unfolded"]
     > d["lab2_network"]["median_ms"]["device"]["unfolded"]),
    ("lab2", "every BN module call that folding removed counts in full",
     lambda d: d["lab2_network"]["speedup"]["stream"] > d["lab2_network"]["speedup"]["device"]),
    ("lab2", "308 MB per activation, far beyond the H200's L2",
     lambda d: 308e6 > 4 * d["lab0_sweep"]["l2_bytes"]),
    # Lab 3
    ("lab3", "Next to a 4096³ GEMM (137 GFLOP) that is under 2 % of the time",
     lambda d: round(2 * 4096**3 / 1e9) == 137 and lab3_k(d, low=4096)
     and all(r["speedup"] < 1.02 for r in lab3_k(d, low=4096))),
    # fp32 with TF32 off, as C.2 says: near the fp32 roof, and not above it, as tensor cores would take it
    ("lab3", "cuBLAS's lead at 4096³ in fp32 (TF32 off: no tensor cores) is register blocking and deep pipelining, "
             "which take it near the fp32 roof",
     lambda d: all(0.9 <= r["tflops"] / d["lab1_conv"]["fp32_TFLOPs"] <= 1.0 for r in d["lab3_sweep"]["cublas"]
                   if r["shape"] == [4096] * 3 and r["name"] in ("torch.addmm + relu", "F.linear + relu"))),
    ("lab3", "fusion saves a large share of the *bytes*", lambda d: 1 - 3 / 5 >= 0.3),  # 4096³: 2 of 5 passes, a count
    ("lab3", "fused, it gains under 2 % (the K sweep below, at $K$ = 1024 and 4096)",
     lambda d: all(r["speedup"] < 1.02 for r in lab3_k(d, low=1024))),
    ("lab3", "the bytes saved are a small share, at most 3 %",
     lambda d: all(r["saved_share"] <= 0.03 for r in lab3_skinny(d))),
    ("lab3", "it streams all of $B$ in about two hundred microseconds",
     lambda d: all(150 <= r["unfused_us"] <= 300 for r in lab3_skinny(d) if r["M"] == 1)),
    ("lab3", "the speedup stays under 3 % in every timing mode",
     lambda d: all(0.99 <= r["speedup"] < 1.03 for r in lab3_skinny(d))),
    # the fp32 GEMM's FLOP per byte (the traffic table's last column) against the ridge Lab 1's roofline prints
    ("lab3", "At $K$ = 8 and 16 the fp32 GEMM does only a few FLOP per byte (the table's last column), under the fp32 "
             "ridge point of Lab 1's roofline (about 12 FLOP/byte on the H200)",
     lambda d: 11 <= ridge(d) <= 13
     and abs(ridge(d) / (d["lab1_conv"]["fp32_TFLOPs"] * 1e3 / d["lab1_conv"]["copy_GBps"]) - 1) < 0.02
     and all(lab3_intensity(k) <= 10 and lab3_intensity(k) < ridge(d) for k in (8, 16))),
    # the H200's ridge: an H100's, as Lab 1's roofline prints it there, puts K = 32 under it
    ("lab3", "From $K$ = 32 on, the fp32 GEMM's FLOP per byte are past the H200's ridge and the gain falls as "
             "arithmetic takes over (the K sweep below)",
     lambda d: all(lab3_intensity(r["K"]) > ridge(d) for r in lab3_k_fp32(d, low=32))
     and all(a["speedup"] > b["speedup"] for a, b in zip(lab3_k_fp32(d, low=16), lab3_k_fp32(d, low=32)))),
    ("lab3", "C-bound small K (8 and 16 here): C is nearly all the traffic and the fp32 GEMM, under the ridge",
     lambda d: all(lab3_intensity(k) < ridge(d) for k in (8, 16)) and lab3_intensity(32) > ridge(d)),
    ("lab3", "replayed from a CUDA graph: launches cost almost nothing",
     lambda d: d["lab0_launch"]["launch"]["graph_per_kernel_us"] < 0.01 * min(r["unfused_us"] for r in lab3_skinny(d))),
    ("lab3", "about triples the bytes", lambda d: all(2.9 <= lab3_small_k_ratio(k) <= 3.0 for k in (8, 16, 32, 64))),
    ("lab3", "that extra pass is two thirds of the unfused bytes",
     lambda d: all(0.64 <= r["saved_share"] <= 2 / 3 for r in lab3_k(d, high=64))),
    ("lab3", "This is where fusing the epilogue pays, though less than that byte ratio",
     lambda d: all(1.3 < r["speedup"] < lab3_small_k_ratio(r["K"]) for r in lab3_k(d, high=16))
     and min(r["speedup"] for r in lab3_k(d, high=16)) > max(r["speedup"] for r in lab3_skinny(d))),
    ("lab3", "the plain kernel writes $C$ at a smaller fraction of the C-write floor's rate than the reference's two "
             "kernels do",
     lambda d: all(lab3_shortfall(d, t)[3] < lab3_shortfall(d, t)[2] for t in ("float32", "float16"))),
    ("lab3", "cuBLAS several times faster than your tiled kernel",
     lambda d: all(next(r["median_us"] for r in d["lab3_sweep"]["cublas"] if r["shape"] == [4096] * 3
                        and r["name"] == "plain fused") >= 3 * r["median_us"] for r in d["lab3_sweep"]["cublas"]
                   if r["shape"] == [4096] * 3 and r["name"] in ("torch.addmm + relu", "F.linear + relu"))),
    ("lab3", "no version can do better",
     lambda d: all(r["fraction_of_floor"] <= 1.0 for r in d["lab3_sweep"]["small_k"]["rows"])),
    ("lab3", "so fusing gains under 2 %", lambda d: all(r["speedup"] < 1.02 for r in lab3_k(d, low=1024))),
    ("lab3", "(the table's, at most 3 %)", lambda d: all(r["saved_share"] <= 0.03 for r in lab3_skinny(d))),
    # what fusing saves at skinny M, the reference's time less the fused kernel's, in every mode and dtype
    ("lab3", "What fusing saves is the second kernel's **launch**, ramp-up and tail: a fixed few microseconds",
     lambda d: all(0 < r["unfused_us"] - r["fused_us"] < 10 for r in lab3_skinny(d))),
    ("lab3", "the second kernel's launch, ramp-up and tail, a fixed few microseconds next to",
     lambda d: all(0 < r["unfused_us"] - r["fused_us"] < 10 for r in lab3_skinny(d))),
    ("lab3", "a GEMM of hundreds of microseconds",
     lambda d: all(100 <= r["unfused_us"] < 1000 for r in lab3_skinny(d))),
    ("lab3", "a small gain, under 3 % here in every timing mode",
     lambda d: all(r["speedup"] < 1.03 for r in lab3_skinny(d))),
    # the reference's extra pass over C against the fused kernel's time (the GEMM with its epilogue in registers)
    ("lab3", "the unfused epilogue's extra read and write of C costs more than half as much as the GEMM itself",
     lambda d: all(0.5 < r["unfused_us"] / r["fused_us"] - 1 < 1.0 for r in lab3_k(d, high=16))),
    ("lab3", "the measured speedup is largest at the smallest K (8 and 16) and falls as K grows past that",
     lambda d: all(
         min(r["speedup"] for r in lab3_k(d, high=16) if r["dtype"] == t)
         > max(r["speedup"] for r in lab3_k(d, low=17) if r["dtype"] == t)
         and all(a["speedup"] > b["speedup"] for a, b in zip(
             [r for r in lab3_k(d, low=16) if r["dtype"] == t], [r for r in lab3_k(d, low=17) if r["dtype"] == t]))
         for t in ("float32", "float16"))),
    ("lab3", "gain under 2 %; skinny inference GEMMs gain only the second launch, under 3 % here in every timing mode",
     lambda d: all(r["speedup"] < 1.02 for r in lab3_k(d, low=1024))
     and all(r["speedup"] < 1.03 for r in lab3_skinny(d))),
    ("lab3", "there fusing removes a whole read and write of C: the big gain",
     lambda d: min(r["speedup"] for r in lab3_k(d, high=16)) > 1.3),
    ("lab3", "a kernel written like an elementwise one (wide contiguous stores, inputs on chip) gets near it",
     lambda d: all(s["tuned_fraction_of_floor"] >= 0.8 for s in d["lab3_sweep"]["small_k"]["summary"].values())),
]  # the README's numbers are built from the data's own formatting: readme_claims below


def readme_claims():
    """The README's lab table and measurement sentences: each number, as the data formats it."""
    def k16(d):
        ks = [r["speedup"] for r in lab3_k(d, high=16) if r["dtype"] == "float32"]
        return f"{min(ks):.2f}–{max(ks):.2f}×"

    def skinny(d):
        s = [r["speedup"] for r in lab3_skinny(d)]
        return f"{min(s):.2f}–{max(s):.2f}× skinny M"

    def bn_cost(d):
        t = lab2_graded(d)["median_us"]
        return f"({t['BN in registers'] / t['plain fused (folded)'] - 1:.1%})".replace("%", " %")

    def rebuild(d):  # a range to a tenth of a second that holds every saved edit
        times = rebuilds(d)
        return f"an edit rebuilds in {math.floor(min(times) * 10) / 10:.1f}–{math.ceil(max(times) * 10) / 10:.1f} s"

    return [
        ("README", lambda d: f"full points from {x(policy(d, 'lab0.add_relu_mul', 'threshold'))} "
                             f"(plain: {x(policy(d, 'lab0.add_relu_mul', 'plain_speedup'))})"),
        ("README", lambda d: f"gains nothing (fused: {x(d['lab1_conv']['speedups']['fused'])}"
                             + (", a little slower)" if 0.95 < d["lab1_conv"]["speedups"]["fused"] < 1 else ")")),
        ("README", lambda d: f"gains {x(lab1_graded(d)['speedups']['plain fused'])}"),
        ("README", lambda d: f"full points from {x(policy(d, 'lab1.depthwise_relu', 'threshold'))} "
                             f"(plain: {x(policy(d, 'lab1.depthwise_relu', 'plain_speedup'))})"),
        ("README", lambda d: f"folded vs in-register BN {bn_cost(d)}"),
        ("README", lambda d: f"{x(d['lab2_network']['speedup']['device'])} per call"),
        ("README", lambda d: f"{x(d['lab2_network']['speedup']['stream'])} for back-to-back calls"),
        ("README", lambda d: f"full points from {x(policy(d, 'lab2.conv_bn_relu', 'threshold'))} "
                             f"(plain: {x(policy(d, 'lab2.conv_bn_relu', 'plain_speedup'))})"),
        ("README", lambda d: f"{x(next(r['speedup'] for r in lab3_k(d, low=4096) if r['dtype'] == 'float32'))} "
                             "compute-bound (4096³)"),
        ("README", skinny),
        ("README", lambda d: f"{k16(d)} at small K"),
        ("README", lambda d: "at {:.0f} % (fp32) and {:.0f} % (fp16, tensor cores) of the C-write floor".format(
            *(100 * d["lab3_sweep"]["small_k"]["summary"][t]["tuned_fraction_of_floor"]
              for t in ("float32", "float16")))),
        ("README", lambda d: f"full points from {x(policy(d, 'lab3.gemm_bias_relu', 'threshold'))} at "
                             "16384×4096×16, fp16"),
        # the plain solution's speedup beside a threshold is the calibration's that set it, in every lab
        ("README", lambda d: f"fp16 (plain: {x(policy(d, 'lab3.gemm_bias_relu', 'plain_speedup'))})"),
        ("README", rebuild),
        # the H200 self-check's build and timing stages (docs/RESULTS.md, "Build times" and "Timing accuracy")
        ("README", lambda d: "builds in {first_build:.1f} s cold, {rebuild_after_edit:.1f} s after an edit, "
                             "{reload_fresh_process:.2f} s from cache".format(**d["h200_selfcheck"]["build"])),
        ("README", lambda d: f"spread {d['h200_selfcheck']['timing']['spread_pct']:.2f} %"),
        ("README", lambda d: "within {:.1f} %".format(
            math.ceil(abs(d["h200_selfcheck"]["timing"]["vs_do_bench_pct"]) * 10) / 10)),
        # the emulation's own benchmark (docs/emulation.md, "Measured"): a barrier is a fiber switch
        ("README", lambda d: f"A barrier costs about {emulation_measured('one context switch')} ns"),
        ("README", lambda d: f"a 16×16-tiled 512³ GEMM runs in {emulation_measured('GEMM, 512³')} s on 2 cores"),
    ]


def markdown(lab) -> str:
    cells = json.loads((ROOT / "solutions" / lab / f"{lab}.ipynb").read_text(encoding="utf-8"))["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def _cpu_per_submission_lab(stage) -> float:
    """The throughput stage's CPU per submission-lab, as its targets measured it."""
    return next(x["measured"] for x in stage["targets"] if x["target"].startswith("CPU per submission-lab"))


def squash(text) -> str:
    return re.sub(r"\s+", " ", text)


def emulation_measured(row: str) -> str:
    """The hand-written switch's number in docs/emulation.md's table of measurements, on the row that says ``row``."""
    for line in (ROOT / "docs" / "emulation.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("|") and row in line:
            return re.search(r"\*\*([\d.]+)\s*(?:ns|s)\*\*", line).group(1)
    raise AssertionError(f"docs/emulation.md has no measured row {row!r}")


def readme_measurements() -> str:
    """The README's lab table and its paragraphs of measured numbers: the H200's and the emulation's (all above
    "Grading a class")."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = "\n".join(line for line in text.splitlines() if re.match(r"\| [0-3] ", line))
    measured = re.search(r"Measured on the H200.*?(?:\n\n|$)", text, re.S)
    emulation = re.search(r"Platforms: .*?(?:\n\n|$)", text, re.S)
    assert table and measured and emulation, \
        "the README's lab table or its measurement paragraphs moved: update this test"
    return table + "\n" + measured.group(0) + emulation.group(0)


# ------------------------------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("where,phrase,check", CLAIMS, ids=[f"{w}: {p[:50]}" for w, p, _ in CLAIMS])
def test_the_claim_is_in_the_text_and_the_data_agree(where, phrase, check):
    assert squash(phrase) in squash(markdown(where)), f"{where} no longer says {phrase!r}: remove or update the claim"
    assert check(load_data()), f"{where} says {phrase!r}, and the saved measurements contradict it"


@pytest.mark.parametrize("index", range(len(readme_claims())))
def test_the_readme_states_the_saved_numbers(index):
    _, expected = readme_claims()[index]
    wanted = expected(load_data())
    assert squash(wanted) in squash(readme_measurements()), \
        f"the README should say {wanted!r}, from the saved measurements:\n{readme_measurements()}"


def test_every_number_the_readme_measures_is_checked():
    data, text = load_data(), squash(readme_measurements())
    covered = [(m.start(), m.end()) for _, expected in readme_claims()
               for m in re.finditer(re.escape(squash(expected(data))), text)]
    numbers = re.finditer(r"\d+(?:\.\d+)?\s*(?:×(?!\s*\d)|%|s\b|ns\b|µs\b|ms\b)", text)
    loose = [text[max(0, m.start() - 40):m.end() + 5] for m in numbers
             if not any(a <= m.start() and m.end() <= b for a, b in covered)]
    assert not loose, "the README states numbers no test ties to the saved data:\n" + "\n".join(loose)


# Sentences that use the vocabulary of comparison without speaking of a saved measurement: (lab, words) -> why.
NOT_MEASURED = {
    ("lab0", "Every fused kernel in this course wins"): "the course's thesis, shown by the labs that follow",
    ("lab0", "every later lab grades a measured speedup"): "what the course does",
    ("lab0", "so its line should stay near one launch's cost"): "what to expect on a GPU: the saved data has the cost "
        "of one launch, not this line, and the text says so",
    ("lab0", "so much faster when fused"): "the launch count: n - 1 launches fewer, shown by the cell above it",
    ("lab0", "relative standard error is under 1 %"): "fuselab.measure's precision target, a setting",
    ("lab0", "Describe the speedup curve"): "a question",
    ("lab0", "Compare the speedup at the largest sizes"): "a question",
    ("lab0", "(Look at the fraction of the copy ceiling each version reaches.)"): "a hint to a question",
    ("lab0", "the graded speedup is measured against it"): "what the speed test does",
    ("lab0", "Graded: the speedup of your fused kernel"): "a heading and what the test does",
    ("lab0", "partial credit between 1.0× and the threshold"): "the grading rule",
    ("lab0", "how close to the hardware?"): "a heading",
    ("lab0", "the speedup is the byte ratio times the ratio of the two versions' fractions"): "an identity "
        "(fuselab/labs/shortfall.py), true of any measurement",
    ("lab1", "It is **memory-bound**, and the activation pass is a large share of all the bytes moved"): "a count: "
        "the pass moves 2 of the pair's 4 tensors",
    ("lab1", "below the *ridge point*"): "a definition",
    ("lab1", "Its time is set by bytes, and it has very few of them"): "the roofline's reading of 0.125 FLOP/byte",
    ("lab1", "Would it gain more with a *faster* conv"): "a question",
    ("lab1", "the faster the main kernel, the more its epilogue's memory traffic matters"): "the arithmetic of shares",
    ("lab1", "with as many bytes as the conv itself, is no longer small"): "a count: 2 tensors each",
    ("lab1", "a grid's z dimension is at most 65535"): "a CUDA limit",
    ("lab1", "within a few units in the last place"): "floating-point error of 9 products, not a measurement",
    ("lab1", "each as a speedup over the graded reference"): "what the cell shows",
    ("lab1", "then prints both fractions, which give the speedup"): "the identity of fuselab/labs/shortfall.py; "
        "tests/test_student_walk.py checks that the list above prints times and the line the fractions",
    ("lab1", "Graded: the speedup of your fused depthwise kernel"): "a heading and what the test does",
    ("lab1", "partial credit between 1.0× and the threshold"): "the grading rule",
    ("lab1", "how close to the copy bandwidth?"): "a heading",
    ("lab2", "the graded speedup."): "the lab's outline",
    ("lab2", "the speedup is the GPU time folding removed"): "what device mode measures (fuselab.timing.modes)",
    ("lab2", "a speedup means little without saying which"): "advice",
    ("lab2", "it is **memory-bound**, like an elementwise op"): "9 multiply-adds per 8 bytes: a count",
    ("lab2", "On a GPU, the cell below times"): "what the cell times",
    ("lab2", "the speedup is the byte ratio times the fused kernel's fraction"): "the identity of "
        "fuselab/labs/shortfall.py",
    ("lab2", "Graded: the speedup of your fused kernel"): "a heading and what the test does",
    ("lab2", "partial credit between 1.0× and it"): "the grading rule",
    ("lab2", "how close to the hardware?"): "a heading",
    ("lab2", "pays for five 64-bit divisions and remainders"): "a count of the starter kernel's code "
        "(tests/test_student_walk.py counts them)",
    ("lab2", "where the epilogue meets a compute-bound operator"): "the next lab's outline",
    ("lab3", "where fusing the epilogue pays A fully connected layer"): "the title",
    ("lab3", "the **graded speedup** at a small-$K$ shape"): "the lab's outline",
    ("lab3", "16× less traffic"): "16×16 tiles: a count",
    ("lab3", "loses about three decimal digits"): "fp16's 11-bit significand against 4096 terms: arithmetic",
    ("lab3", "it is *less* accurate than the fused kernel, not just slower"): "the rounding count, shown by the "
        "rounding cell, which tests/test_lab3.py runs under the emulation",
    ("lab3", "the unfused epilogue kernel reads $C$ and the bias"): "the exercise's definition",
    ("lab3", "It pays for low-rank (LoRA) projections"): "where small-K shapes occur",
    ("lab3", "so it runs at a fraction of the fp32 peak"): "what two shared loads per FMA imply; C.2's table "
        "prints the rate",
    ("lab3", "Every version pays at least that"): "the C-write floor's definition",
    ("lab3", "A kernel gets close to the floor by writing C"): "how to approach it (Part D measures it)",
    ("lab3", "the speedup along $M$ in each timing mode"): "a question",
    ("lab3", "The graded speedup: a small-K layer"): "a heading and what the test does",
    ("lab3", "partial credit below it and 0 at 1.0×"): "the grading rule",
    ("lab3", "**Large shapes** (compute-bound)."): "Part D's outline",
    ("lab3", "cut load instructions by 4×"): "a float4 carries 4 floats: a count",
    ("lab3", "**Skinny shapes** (M ≤ 16, memory-bound)."): "Part D's outline",
    ("lab3", "16 rows used at most"): "a count",
    ("lab3", "**Small K** (M > 16, K ≤ 16: C-bound)."): "Part D's outline",
    ("lab3", "The goals, on the course's H200"): "Part D's targets (the cell prints what was measured)",
}

VOCABULARY = re.compile(
    r"\b(?:faster|slower|speedups?|gains?|gained|loses?|pays|byte ratio|percent|measurable|set by|triples?|a third|"
    r"two thirds|fractions?|share|near|close to|compute-bound|memory-bound|C-bound|launch-bound|above the|below the|"
    r"at most|under \d|within|much less|much more|several times|many times|hundreds of|few microseconds|"
    r"milliseconds)\b|%|\d\s*×(?!\s*\d)|\dx\b(?!\s*\d)", re.IGNORECASE)


def sentences(text):
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*(`$#])|\s(?=- )", squash(text)) if s.strip()]


@pytest.mark.parametrize("lab", LABS)
def test_every_comparative_sentence_is_checked_or_says_why_not(lab):
    words = [squash(p) for w, p, _ in CLAIMS if w == lab] + [squash(p) for (w, p) in NOT_MEASURED if w == lab]
    loose = [s for s in sentences(markdown(lab)) if VOCABULARY.search(s) and not any(p in s for p in words)]
    assert not loose, (f"{lab}'s markdown compares or quantifies without a check against the saved data: add a "
                       "claim to CLAIMS (or, for a definition or a count, to NOT_MEASURED with why):\n"
                       + "\n".join(loose))


def test_not_measured_entries_are_used():
    unused = [(lab, p) for (lab, p) in NOT_MEASURED if squash(p) not in squash(markdown(lab))]
    assert not unused, f"NOT_MEASURED entries match no markdown any more: remove them: {unused}"


# A claim that cannot fail protects nothing: the saved data, bent the way a re-measurement could, must break them.
def bend(data, path, factor):
    node = data
    for key in path[:-1]:
        node = node[key]
    if isinstance(node, list):
        for row in node:
            row[path[-1]] *= factor
    else:
        node[path[-1]] *= factor


@pytest.mark.parametrize("lab,phrase,path,factor", [
    ("lab0", "inside the L2 the speedup stays within a tenth of the byte ratio",
     ("lab0_sweep", "rows", "speedup"), 1.2),
    ("lab0", "the speedup passes the byte ratio", ("lab0_sweep", "rows", "speedup"), 0.8),
    ("lab1", "its point lies above that roof", ("lab1_conv", "times_us", "cuDNN conv + relu (eager)"), 1.2),
    ("lab1", "gain nothing, the fused kernel even measuring a little slower than the pair",
     ("lab1_conv", "speedups", "fused"), 1.03),
    ("lab3", "the speedup stays under 3 % in every timing mode", ("lab3_sweep", "rows", "speedup"), 1.05),
    ("lab0", "The sweep shows *that* the fused kernel wins inside L2 and beyond it", ("lab0_sweep", "rows", "low"), 0.45),
    ("lab1", "moves 8 bytes per output in under 20 µs", ("lab1_conv", "times_us", "activation alone"), 1.5),
    ("lab3", "the unfused epilogue's extra read and write of C costs more than half as much as the GEMM itself",
     ("lab3_sweep", "k_rows", "fused_us"), 1.1),
    ("lab3", "What fusing saves is the second kernel's **launch**, ramp-up and tail: a fixed few microseconds",
     ("lab3_sweep", "rows", "unfused_us"), 1.1),
    ("lab3", "fused, it gains under 2 % (the K sweep below, at $K$ = 1024 and 4096)",
     ("lab3_sweep", "k_rows", "speedup"), 1.03),
    ("lab3", "Next to a 4096³ GEMM (137 GFLOP) that is under 2 % of the time", ("lab3_sweep", "k_rows", "speedup"), 1.03),
    # cuBLAS above the fp32 roof would be TF32 or tensor cores, which the words rule out
    ("lab3", "cuBLAS's lead at 4096³ in fp32 (TF32 off: no tensor cores) is register blocking and deep pipelining, "
             "which take it near the fp32 roof", ("lab3_sweep", "cublas", "tflops"), 1.1),
])
def test_a_claim_fails_when_the_data_move(lab, phrase, path, factor):
    check = next(c for w, p, c in CLAIMS if w == lab and p == phrase)
    data = load_data()
    assert check(data)
    bend(data, path, factor)
    assert not check(data), f"{phrase!r} still holds with {path} × {factor}: the check checks nothing"


LAB3_RIDGE_CLAIMS = [
    "At $K$ = 8 and 16 the fp32 GEMM does only a few FLOP per byte (the table's last column), under the fp32 ridge point "
    "of Lab 1's roofline (about 12 FLOP/byte on the H200)",
    "From $K$ = 32 on, the fp32 GEMM's FLOP per byte are past the H200's ridge and the gain falls as arithmetic takes "
    "over (the K sweep below)",
    "C-bound small K (8 and 16 here): C is nearly all the traffic and the fp32 GEMM, under the ridge"]


def test_lab3s_small_k_regimes_follow_the_ridge_and_the_k_sweep(monkeypatch):
    """Lab 3 called every K of 8…64 "only a few FLOP per byte … as memory-bound as an elementwise kernel" while its
    own traffic table prints 31 FLOP per byte at K = 64, past the fp32 ridge (about 12 on the H200), and the K sweep
    gains 1.57× at K = 16 but 1.19× at K = 64. The regimes are now split at the ridge: on a GPU with another ridge
    (an H100's copy bandwidth) or a sweep whose gain no longer falls past K = 16, the words fail."""
    from fuselab.labs import lab1
    checks = [next(c for w, p, c in CLAIMS if w == "lab3" and p == words) for words in LAB3_RIDGE_CLAIMS]
    data = load_data()
    assert all(check(data) for check in checks)
    monkeypatch.setitem(lab1.H200_CEILINGS, "copy_bytes_per_s", 3.0e12)  # ridge 17 FLOP/byte: K = 32 under it
    assert not any(check(data) for check in checks)
    monkeypatch.undo()
    for row in data["lab3_sweep"]["k_rows"]:
        if row["K"] == 64:
            row["speedup"] = 1.6
    assert not checks[1](data)


def test_the_cache_hit_verdict_fails_when_fusion_would_hit_twice_as_often():
    """The course material's "2-5x better cache hit rates", checked against Lab 0's counters: were the fused kernel's
    L2 read hits (or its L1 hits) twice the unfused chain's at any size, the verdict must fail."""
    words = ('It promises fusion "2-5x better cache hit rates"; for this chain the counters say that does not hold: '
             "the fused kernel's hit rate is nowhere twice the unfused chain's, in L2 or in L1")
    check = next(c for w, p, c in CLAIMS if w == "lab0" and p == words)
    assert check(load_data())
    for level in ("l2", "l1"):
        data = load_data()
        row = data["lab0_counters"]["rows"][0]
        if level == "l2":
            row["fused"]["l2_read_hit_pct"] = 2.5 * row["unfused"]["l2_read_hit_pct"]
        else:
            row["fused"]["kernels"][0]["l1_hit_pct"] = 40.0
        assert not check(data), level


def test_the_counted_bytes_words_fail_when_dram_moves_more_or_much_less_than_the_count():
    """Lab 0 said "Beyond L2, the DRAM bytes are the ones you counted" beside a printout of 123.0 MB measured against
    134.2 MB counted (the fused kernel at 32 MiB a tensor): the words now give the bound the counters keep, and say
    why the bytes come out under the count. Were a kernel to move more than it must, or far less, they fail."""
    words = ["Beyond L2, the DRAM bytes come within a tenth of the ones you counted",
             "a little under them where some of the last writes are still in L2 when the kernel ends"]
    checks = [next(c for w, p, c in CLAIMS if w == "lab0" and p == phrase) for phrase in words]
    assert all(check(load_data()) for check in checks)
    for factor in (0.85, 1.05):
        data = load_data()
        row = counter_rows(data, False)[0]
        row["fused"]["dram_bytes"] = factor * row["computed_bytes"]["fused"]
        assert not checks[0](data), factor
    data = load_data()
    kernel = counter_rows(data, False)[0]["fused"]["kernels"][0]
    kernel["dram_write_bytes"] = 1.02 * counter_rows(data, False)[0]["tensor_bytes"]
    assert not checks[1](data)


def test_results_md_states_the_counters_l1_hit_rate_and_the_verdict_of_the_saved_file():
    """docs/RESULTS.md's counters paragraph gives the L1 hit rate and the verdict on "2-5x better cache hit rates"
    that Lab 0 states: the span of every kernel's L1 hit rate in the saved file, and the verdict's own check."""
    d = load_data()
    l1 = [f"{k['l1_hit_pct']:.1f}" for r in d["lab0_counters"]["rows"] for side in ("unfused", "fused")
          for k in r[side]["kernels"]]
    span = l1[0] if min(l1) == max(l1) else f"{min(l1)}–{max(l1)}"
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    assert f"L1 hit rate (`l1tex__t_sector_hit_rate.pct`): {span} % in every kernel at every size" in results
    verdict = ("\"2-5x better cache hit rates\": it does not hold for this chain, the fused kernel's hit rate is "
               "nowhere twice the unfused chain's, in L2 or in L1")
    assert verdict in results
    assert not any(fused >= 2 * unfused and fused >= 1.0 for fused, unfused in cache_hit_pairs(d))


def test_the_l1_metric_lab0_names_is_the_one_the_counters_stage_reads():
    from fuselab.tools.gpu_selfcheck import counters
    metric = counters.METRICS["l1_hit_pct"]
    assert f"`{metric}`" in markdown("lab0"), metric
    assert metric == "l1tex__t_sector_hit_rate.pct"


def test_the_readme_check_fails_when_the_data_move():
    data = load_data()
    before = [expected(data) for _, expected in readme_claims()]
    bend(data, ("lab3_sweep", "k_rows", "speedup"), 1.02)
    bend(data, ("lab1_conv", "speedups", "fused"), 1.01)
    after = [expected(data) for _, expected in readme_claims()]
    assert sum(a != b for a, b in zip(before, after)) >= 2


def test_the_emulation_rebuild_measurement_is_saved():
    saved = load_data()["emulation_build"]
    assert saved["backend"] == "emulate" and saved["labs"] and all(rebuilds({"emulation_build": saved}))
    assert {name.split(".")[0] for name in saved["labs"]} == set(LABS), "every lab's kernels are timed"


def test_readme_claims_path_exists():
    assert Path(EMULATION_BUILD).is_file()


# ------------------------------------------------------------------ numbers in the code comments a student reads
def student_comments(lab, notebooks="labs") -> str:
    """The comments of the student's notebook's code cells (``labs/``: what is left once the solutions are cut),
    whitespace squashed, comment markers gone; with ``notebooks="solutions"``, those of the solution notebook, the
    instructor's comments inside the solutions included."""
    cells = json.loads((ROOT / notebooks / lab / f"{lab}.ipynb").read_text(encoding="utf-8"))["cells"]
    found = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        for line in "".join(cell["source"]).splitlines():
            match = re.search(r"(?://|#(?!define|include|if|endif|else|pragma))\s?(.*)$", line)
            if match:
                found.append(match.group(1))
    return squash(" ".join(found))


def skinny_tuned_us(d, name):
    return [r["median_us"] for r in d["lab3_sweep"]["cublas"] if r["name"] == name and r["shape"][0] <= 16]


# (lab, the words built from the saved data): the measured numbers of comments a student reads in a code cell
CODE_COMMENT_CLAIMS = [
    ("lab3", lambda d: "On the H200, split-K took {:.0f}-{:.0f} us at M = 1-16 (N = K = 4096), the strips {:.0f}-{:.0f} us"
     .format(min(skinny_tuned_us(d, "tuned fused")), max(skinny_tuned_us(d, "tuned fused")),
             min(skinny_tuned_us(d, "tuned fused, column strips")), max(skinny_tuned_us(d, "tuned fused, column strips")))),
]
COMMENT_NUMBER = re.compile(r"\d+(?:\.\d+)?\s*(?:us|µs|ms|%|GB/s)(?!\w)|\d\.\d+\s*x\b")


@pytest.mark.parametrize("index", range(len(CODE_COMMENT_CLAIMS)))
def test_student_visible_comments_state_the_saved_numbers(index):
    lab, expected = CODE_COMMENT_CLAIMS[index]
    wanted = expected(load_data())
    assert squash(wanted) in student_comments(lab), f"{lab}'s code comments should say {wanted!r} (saved data)"


@pytest.mark.parametrize("notebooks", ["labs", "solutions"])
@pytest.mark.parametrize("lab", LABS)
def test_every_measured_number_in_a_student_visible_comment_is_checked(lab, notebooks):
    """Lab 3's tuned source told students the split-K and column-strip times on the H200 in a comment, which no test
    tied to the saved sweep. Every measured number in a comment that ``labs/`` keeps is a CODE_COMMENT_CLAIMS entry.
    So is every one in the solutions' own comments, which instructors read and the solutions are the source of:
    Lab 3's small-K launcher gave block-height times (the fp16 CUDA-core path, 64-row blocks) that no saved file
    holds."""
    data, text = load_data(), student_comments(lab, notebooks)
    covered = [(m.start(), m.end()) for where, expected in CODE_COMMENT_CLAIMS if where == lab
               for m in re.finditer(re.escape(squash(expected(data))), text)]
    loose = [text[max(0, m.start() - 60):m.end() + 5] for m in COMMENT_NUMBER.finditer(text)
             if not any(a <= m.start() and m.end() <= b for a, b in covered)]
    assert not loose, f"{lab}'s code comments state numbers no test ties to the saved data:\n" + "\n".join(loose)


def test_the_comment_check_fails_when_the_sweep_moves():
    data = load_data()
    before = CODE_COMMENT_CLAIMS[0][1](data)
    bend(data, ("lab3_sweep", "cublas", "median_us"), 1.1)
    assert CODE_COMMENT_CLAIMS[0][1](data) != before


# ------------------------------------------------------------------------- the plain speedup a speed cell prints
PLAIN_SPEEDUP = re.compile(r"plain[^:\n]*?(?:\bat |: )(\d+\.\d\d)x")


def _run_speed_settings(lab) -> str:
    """What the lab's ``speed_settings`` cell prints (CPU: it reads only saved data)."""
    import contextlib
    import io
    cell = next(c for c in json.loads((ROOT / "solutions" / lab / f"{lab}.ipynb").read_text())["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == "speed_settings")
    import torch

    import fuselab
    from fuselab.labs import shortfall
    namespace = {"fuselab": fuselab, "torch": torch, "shortfall": shortfall,
                 lab: __import__(f"fuselab.labs.{lab}", fromlist=["LAB"])}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec("".join(cell["source"]), namespace)
    return printed.getvalue()


def test_lab3_prints_one_plain_speedup_or_names_each_apart():
    """Lab 3 printed the plain solution's speedup twice, 1.62x (the saved sweep) above the speed test and 1.60x (the
    calibration that set the threshold) in it, as if one measurement. The number beside the threshold is the
    calibration's in both cells; any other plain speedup printed names the run it comes from, and is that run's."""
    from fuselab.labs import lab3
    from fuselab.speed.graded import would_grade
    d = load_data()
    calibrated = f"{policy(d, lab3.GRADED_TEST, 'plain_speedup'):.2f}"
    sweep = f"{lab3_small_k_row(d, 'plain fused', 'float16')['speedup_vs_reference']:.2f}"
    settings, graded = _run_speed_settings("lab3"), would_grade(lab3.GRADED_TEST, 4)
    found = [(m.group(0), m.group(1)) for text in (settings, graded) for m in PLAIN_SPEEDUP.finditer(text)]
    assert len(found) >= 3, (settings, graded)
    for words, value in found:
        if "sweep" in words:
            assert value == sweep, f"{words!r}: the saved sweep's plain speedup is {sweep}x"
        else:
            assert value == calibrated, f"{words!r} is not the calibration's {calibrated}x, and names no other run"
    assert calibrated in "".join(v for w, v in found if "sweep" not in w and w in settings)
    assert calibrated in "".join(v for w, v in found if w in graded)


def test_lab2_prints_one_plain_speedup_or_names_each_apart():
    """Lab 2 printed the plain solution's speedup at the graded shape twice without a GPU, 1.82x in the context cell
    (the saved context run) and 1.80x in the speed test (the calibration that set the threshold), as if one
    measurement. As in Lab 3, a plain speedup that is not the calibration's names the run it comes from, and is
    that run's."""
    from fuselab.speed.graded import would_grade

    from .test_notebook_text import run_saved_result_cells
    d = load_data()
    calibrated = f"{policy(d, 'lab2.conv_bn_relu', 'plain_speedup'):.2f}"
    t = lab2_graded(d)["median_us"]
    saved = f"{t['lab reference (3 kernels)'] / t['plain fused (folded)']:.2f}"
    printed, graded = run_saved_result_cells("lab2"), would_grade("lab2.conv_bn_relu", 4)
    found = [(m.group(0), m.group(1)) for text in (printed, graded) for m in PLAIN_SPEEDUP.finditer(text)]
    assert len(found) >= 2, (printed, graded)
    for words, value in found:
        if "another run than the calibration's" in words:
            assert value == saved and d["lab2_context"]["date"] in words, f"{words!r}: the saved run's is {saved}x"
        else:
            assert value == calibrated, f"{words!r} is not the calibration's {calibrated}x, and names no other run"
    assert any("another run" in w for w, _ in found) and calibrated in "".join(v for w, v in found if w in graded)


@pytest.mark.parametrize("lab,row", [("lab1", 3), ("lab2", 2)])
def test_launch_bound_fails_when_the_small_size_is_bytes_bound(lab, row):
    """Called "what the cell times" before, "launch-bound" is a claim about the saved times: were the batch-1
    reference as fast as its bytes allow, the check must fail."""
    phrase = {"lab1": "Then the same at a launch-bound size", "lab2": "one small and launch-bound"}[lab]
    check = next(c for w, p, c in CLAIMS if w == lab and p == phrase)
    data = load_data()
    assert check(data)
    if lab == "lab1":
        saved = data["lab1_depthwise"]["rows"][row]
        assert saved["shape"][:2] == [1, 32]
        saved["times_us"][saved["baseline"]] /= 6
    else:
        saved = data["lab2_context"]["rows"][row]
        assert saved["shape"][:2] == [1, 32]
        saved["median_us"]["lab reference (3 kernels)"] /= 6
    assert not check(data)


def test_the_networks_saved_batches_words_fail_when_a_batch_64_or_compiled_run_is_saved():
    """Lab 2 said its whole network was timed "at batch 1 (launch-bound) and batch 64", and a student without a GPU
    saw batch 1 alone: the words now say what the saved file holds, and must fail once it holds more."""
    phrase = next(p for w, p, _ in CLAIMS if w == "lab2" and "at batch 1 alone" in p)
    check = next(c for w, p, c in CLAIMS if w == "lab2" and p == phrase)
    assert check(load_data())
    data = load_data()
    data["lab2_network"]["median_ms"]["device"]["torch.compile, unfolded"] = 1.0
    assert not check(data)
    data = load_data()
    saved = data["lab2_network"]
    data["lab2_network"] = {"gpu": saved["gpu"], "rows": [dict(saved), dict(saved, batch=64)]}
    assert not check(data)


def test_the_networks_launch_bound_words_fail_when_the_gpu_keeps_up_with_the_host():
    """"at batch 1 (launch-bound)" is said of the whole network's timing, and was checked against Part C's kernel
    shapes instead. It is now the network's saved times: were a stream of passes as fast as one pass's GPU time,
    the host would not be setting the pace, and the words must fail."""
    check = next(c for w, p, c in CLAIMS if w == "lab2" and p == "at batch 1 (launch-bound) and batch 64")
    data = load_data()
    assert check(data)
    data["lab2_network"]["median_ms"]["stream"]["unfolded"] = data["lab2_network"]["median_ms"]["device"]["unfolded"]
    assert not check(data)


def test_the_docs_emulated_build_times_are_the_saved_ones():
    """docs/design.md's table and docs/RESULTS.md quote the emulation's build times after its runtime was compiled
    once per cache: Lab 0's kernel (``build-emulation-lab0-cpu2.json``) and every lab's edits (the saved labs run)."""
    lab0 = json.loads((ROOT / "docs" / "results" / "build-emulation-lab0-cpu2.json").read_text())
    quoted = f"{lab0['first_build']:.1f} s / {lab0['rebuild_after_edit']:.2f} s / {lab0['reload_fresh_process']:.3f} s"
    assert quoted in (ROOT / "docs" / "design.md").read_text(encoding="utf-8"), quoted
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    assert quoted in results, quoted
    edits = sorted(lab0["rebuild_after_edit_all"])
    assert f"an edit {edits[0]:.2f}–{edits[-1]:.2f} s" in results
    times = rebuilds(load_data())
    span = f"{math.floor(min(times) * 10) / 10:.1f}–{math.ceil(max(times) * 10) / 10:.1f} s"
    assert f"an edit rebuilds in {span}" in results and f"{span} an edit across every lab's kernels" in results


def test_results_mds_lab0_sweep_is_the_shipped_file():
    """docs/RESULTS.md quoted the 59d27bd run's sweep (2.34×, 2.20×, …) while the notebooks show the shipped
    ``lab0_sweep.json`` (2.12×, 2.09×, …), measured at 9df6469: its copy bandwidth is that run's raw file's, which
    keeps only the sweep's row count. RESULTS.md's sweep line is the shipped file's speedups, size by size."""
    sweep = load_data()["lab0_sweep"]

    def size(n):
        return f"{n // 2**20}M" if n >= 2**20 else f"{n // 2**10}K"
    quoted = ", ".join(f"{size(r['n'])} {r['speedup']:.2f}×" for r in sweep["rows"])
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    assert "`../fuselab/labs/results/lab0_sweep.json`, the numbers the notebooks show" in results
    assert quoted in results, quoted
    raw = json.loads((ROOT / "docs" / "results" / "selfcheck-h200-labs-9df6469.json").read_text())["lab0"]
    assert raw["copy_GBps"] == sweep["copy_GBps"] and raw["sweep_rows"] == len(sweep["rows"])


def test_the_ta_guides_time_without_a_gpu_is_the_saved_throughput_run():
    """docs/ta-guide.md and docs/RESULTS.md quote the 2-core throughput run: the numbers must be that file's."""
    root = Path(__file__).resolve().parents[1]
    saved = json.loads((root / "docs" / "results" / "throughput-cpu2-2f55c78.json").read_text())
    phases = saved["phases"]
    each, fixed = f"{phases['submissions']['seconds_each']:.2f} s", f"{phases['fixed']['seconds']:.1f} s"
    regrade = f"{saved['one_student_regrade']['phases']['wall_seconds']:.1f} s"
    cpu = next(t["measured"] for t in saved["targets"] if t["target"].startswith("CPU per submission-lab"))
    guide = (root / "docs" / "ta-guide.md").read_text()
    results = (root / "docs" / "RESULTS.md").read_text()
    for text in (guide, results):
        assert each in text and fixed in text and regrade in text, (each, fixed, regrade)
    assert f"{cpu:.1f} core-s" in results and "2 CPU workers" in saved["headline"]
    design = squash((root / "docs" / "design.md").read_text())
    assert f"{each} each on the CPU emulation of an idle 2-core machine" in design, each


def test_results_quotes_who_held_the_gpus_memory_at_b88b1fb():
    """The earlier finding of who held the H100's memory at its peak, 10 sharing (what ``cellrunner.py``'s letting
    go of each test's memory cites): each number is the raw file's."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    saved = json.loads((ROOT / "docs" / "results" / "throughput-h100-b88b1fb-memory.json").read_text())
    assert saved["env"]["gpu"] == "NVIDIA H100 80GB HBM3" and saved["env"]["commit"] == "019c0d1"
    assert "`results/throughput-h100-b88b1fb-memory.json`, which names 019c0d1" in results
    [run] = [run for run in saved["throughput"]["runs"] if run["jobs"] == 10]
    count = len(run["submissions"])
    assert count == 32 and f"{count} submission-labs, 10 sharing" in results
    assert f"at the {run['load_while_grading']['gpu_memory_peak_gib']} GiB peak the checkers held" in results
    at_peak = run["gpu_memory_by_process"]["at_peak"]
    for kind, row in at_peak.items():
        assert f"{row['gib']:.2f} GiB in {row['processes']}" in results, kind
    share = at_peak["checker"]["gib"] / sum(row["gib"] for row in at_peak.values())
    assert 0.7 <= share <= 0.8 and "**about three quarters**" in results
    assert f"{at_peak['checker']['gib'] / at_peak['checker']['processes']:.1f} GiB each on average" in results


def test_results_sets_the_2_core_run_against_the_one_before():
    """docs/RESULTS.md compares the 2-core run with 31d47a5's: both files' numbers, and reference runs slower on the
    later machine (what makes part of the difference the machine's)."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    runs = {commit: json.loads((ROOT / "docs" / "results" / f"throughput-cpu2-{commit}.json").read_text())
            for commit in ("31d47a5", "2f55c78")}
    before, now = runs["31d47a5"], runs["2f55c78"]
    cpu = next(t["measured"] for t in before["targets"] if t["target"].startswith("CPU per submission-lab"))
    assert (f"took {before['phases']['submissions']['seconds_each']:.2f} s, "
            f"{before['phases']['fixed']['seconds']:.1f} s and {cpu:.1f} core-s") in results
    spans = {commit: (min(run["reference_seconds"].values()), max(run["reference_seconds"].values()))
             for commit, run in runs.items()}
    assert (f"took {spans['31d47a5'][0]:.1f}-{spans['31d47a5'][1]:.1f} s against "
            f"{spans['2f55c78'][0]:.1f}-{spans['2f55c78'][1]:.1f} s here") in results
    assert spans["2f55c78"][0] > spans["31d47a5"][1]  # every reference run slower here than any before
    mean = now["phases"]["cpu_per_submission_mean"]
    starts = [v for k, v in mean.items() if k.startswith("start, ")]
    steps = {step: sum(v for k, v in mean.items() if k.startswith(f"{step}, ")) for step in ("tests", "build")}
    assert (f"the three processes' starts, {min(starts):.2f}-{max(starts):.2f} each (each imports torch), the tests "
            f"{steps['tests']:.1f}, the builds {steps['build']:.1f}") in results


def test_results_quotes_the_sample_class_at_5798945_on_the_h200():
    """docs/RESULTS.md's last sample class on the H200: 40/40 as deserved, its seconds and ratios."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    samples = json.loads((ROOT / "docs" / "results" / "selfcheck-h200-samples-5798945.json").read_text())
    assert samples["env"]["gpu"] == "NVIDIA H200" and samples["env"]["commit"] == "5798945"
    samples = samples["samples"]
    ratios = [row["ratio"] for row in samples["wall_bound"]["rows"]]
    assert samples["headline"].startswith("40/40 samples graded as they deserve") and samples["problems"] == []
    assert all(row["ok"] for row in samples["rows"]) and len(samples["rows"]) == 40
    assert f"**40/40 samples got the grade they deserve**, {samples['seconds']:.0f} s" in results
    assert f"{min(ratios):.2f}–{max(ratios):.2f} over {len(ratios)} speed tests, none capped" in results
    assert not any(row["capped"] for row in samples["wall_bound"]["rows"])


def test_results_quotes_the_sample_class_graded_beside_a_second_grading():
    """docs/RESULTS.md says the sample class got its grades while a second grading shared the 2 cores: the saved
    tables must hold 40 rows graded as deserved in each grading, none run again, and the seconds quoted."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    saved = (ROOT / "docs" / "results" / "beside-cpu2-b3d75e7.txt").read_text(encoding="utf-8")
    gradings = saved.split("\n## grading ")[1:]
    assert len(gradings) == 2
    seconds = []
    for grading in gradings:
        rows = [line for line in grading.splitlines() if re.match(r"(ok  |MISS) ", line)]
        assert len(rows) == 40 and all(row.startswith("ok  ") for row in rows), grading
        assert "ran past a wall-clock limit and run again alone: 0" in grading
        seconds.append(int(re.search(r"40 submission\(s\) in (\d+) s", grading).group(1)))
    assert "**40/40 samples got the grade they deserve in each**" in results
    assert f"{seconds[0]} s and {seconds[1]} s" in results and "(0 run again alone)" in results


def test_results_quotes_the_h200_class_of_148b874():
    """docs/RESULTS.md's "Today" table on the H200 and its lines are the saved run's numbers, and the NVML
    sampling it explains the idle wait with is the saved probe's."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    saved = json.loads((ROOT / "docs" / "results" / "throughput-h200-148b874.json").read_text())
    assert saved["env"]["gpu"] == "NVIDIA H200" and saved["env"]["commit"] == "148b874"
    run = saved["throughput"]
    phases, regrade, load = run["phases"], run["one_student_regrade"]["phases"], run["load_while_grading"]
    count = phases["submissions"]["count"]
    cpu = next(t["measured"] for t in run["targets"] if t["target"].startswith("CPU per submission-lab"))
    median, steps = phases["per_submission_median"], phases["cpu_per_submission_mean"]
    assert count == 120 and run["jobs"] == 10 and run["full_marks"] == count and regrade["references_reused"]
    quoted = [f"| **{phases['wall_seconds']:.1f} s** | ≤ 300 s: missed",
              f"| **{phases['submissions']['seconds_each']:.2f} s** | ≤ 1.5 s: missed",
              f"| **{cpu:.1f} core-s** | ≤ 15: missed",
              f"| **{phases['fixed']['seconds']:.1f} s** ({phases['fixed']['intake and course']['seconds']:.1f} s; "
              f"{phases['fixed']['reference runs']['seconds']:.1f} s) | ≤ 15 s: missed",
              f"| **{run['phase_seconds']['feedback']:.1f} s** |",
              f"| **{regrade['wall_seconds']:.1f} s** | < 30 s: met", f"| **{count}/{count}** | every one",
              f"start {median['start']:.2f} s, build {median['build']:.2f} s, tests {median['tests']:.2f} s",
              f"timing waits {median['timing waits']:.2f} s and the GPU held {median['GPU held']:.2f} s",
              f"the kernel worker's tests {steps['tests, kernel worker']:.2f}, the checker's {steps['tests, checker']:.2f}",
              " + ".join(f"{steps[f'start, {p}']:.2f}" for p in ("checker", "solution worker", "kernel worker")),
              f"CPU **{load['cpu_busy'] * 100:.0f} %** busy, of it **{load['cpu_kernel_share'] * 100:.0f} %** in the kernel",
              f"**{load['gpu_busy'] * 100:.0f} %** on average; GPU memory peak {load['gpu_memory_peak_gib']:.1f} GiB"]
    for text in quoted:
        assert text in results, text
    met = {t["target"]: t["met"] for t in run["targets"]}
    assert met["one student's regrade all-in, s"] and not met["class of 120 all-in, s"]
    before = json.loads((ROOT / "docs" / "results" / "throughput-h200-5798945.json").read_text())["throughput"]
    assert f"| {before['phases']['wall_seconds']:.1f} s | **{phases['wall_seconds']:.1f} s**" in results
    assert f"| {before['phase_seconds']['feedback']:.1f} s | **{run['phase_seconds']['feedback']:.1f} s**" in results
    probe = (ROOT / "docs" / "results" / "nvml-idle-h200.txt").read_text()
    stamps = [[float(t) for t in re.findall(r"\((-?[0-9.]+), \d+\)", line)]
              for line in probe.splitlines() if "samples (t - end" in line]
    gaps = [b - a for row in stamps for a, b in zip(row, row[1:])]
    assert gaps and all(0.19 <= gap <= 0.21 for gap in gaps)  # "every 0.2 s"
    after_20 = [float(x) for x in re.findall(r"^20 gemms: .* reads 0 after ([0-9.]+) s", probe, re.M)]
    assert after_20 and all(f"{x:.2f}" == "0.27" for x in after_20)
    assert "NVML samples the utilisation every 0.2 s, and after the last of 20 GEMMs it read 0 only 0.27 s" in results


def test_results_quotes_the_transfer_memory_runs_of_750f1ab_and_8fdc366():
    """The earlier finding of the launch buffers in pinned memory (what ``transfer.py`` cites): the transfer stage's
    round trip and the CPU the tests saved against 8fdc366 are the saved runs'."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    folder = ROOT / "docs" / "results"
    runs = [json.loads((folder / name).read_text()) for name in (
        "throughput-h100-8fdc366-beside-750f1ab.json", "throughput-h100-750f1ab.json")]
    assert [r["env"]["commit"] for r in runs] == ["8fdc366", "750f1ab"]
    assert {r["env"]["gpu"] for r in runs} == {"NVIDIA H100 80GB HBM3"}
    stages = [r["throughput"] for r in runs]
    assert all(t["jobs"] == 10 and t["phases"]["submissions"]["count"] == 120 for t in stages)
    assert "(750f1ab against 8fdc366, 2026-12-06, one H100 machine, 120 submission-labs, 10 sharing" in results
    before, after = (t["phases"]["cpu_per_submission_mean"] for t in stages)
    assert -0.65 <= after["tests, kernel worker"] - before["tests, kernel worker"] <= -0.55
    assert 0.4 <= before["tests, checker"] - after["tests, checker"] <= 0.5
    assert "about 0.6 core-s less of the kernel worker's tests and 0.45 of the checker's" in results
    transfer = runs[1]["transfer"]
    assert transfer["pinned_registered"] and not transfer["pageable_registered"]
    assert (f"**{transfer['pageable_wall_s']:.3f} s unpinned, {transfer['pinned_wall_s']:.3f} s pinned**"
            in results)


def test_results_and_the_design_quote_the_findings_the_code_cites():
    """The earlier findings the code's comments cite (16 sharing an H100; ``import torch`` without bytecode) are
    their saved files', and docs/design.md's cost of a Slurm shard is 148b874's H200 run, its sums included."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    folder = ROOT / "docs" / "results"
    sixteen = json.loads((folder / "throughput-h100-9fb4d1b.json").read_text())
    assert sixteen["env"]["commit"] == "9fb4d1b" and sixteen["env"]["gpu"] == "NVIDIA H100 80GB HBM3"
    run = sixteen["throughput"]
    lost = [s for s in run["submissions"] if s["total"] < s["max_total"]]
    count = run["phases"]["submissions"]["count"]
    assert run["jobs"] == 16 and run["full_marks"] == count - len(lost)
    memory = [s for s in lost if any("OutOfMemoryError" in why or "ALLOC_FAILED" in why for why in s["lost"].values())]
    silent = [s for s in lost if s not in memory]
    assert all(set(s["lost"].values()) == {"failed: "} and all("speedup" in t for t in s["lost"]) for s in silent)
    assert (f"{count} submission-labs, **{run['full_marks']}/{count} full marks**; of the {len(lost)} others, "
            f"{len(memory)} lost a test to `OutOfMemoryError` or cuBLAS's `ALLOC_FAILED` and {len(silent)} a speed "
            "test with no message saved" in results)
    assert f"GPU memory peaking at {run['load_while_grading']['gpu_memory_peak_gib']:.1f} GiB" in results
    probe = (folder / "import-torch-h100-4e44193.txt").read_text()
    user, system, wall = (float(x) for x in re.search(r"^nobytecode: ([0-9.]+) user ([0-9.]+) sys ([0-9.]+) wall",
                                                      probe, re.M).groups())
    assert (f"**{user + system:.1f} core-s** ({user:.2f} user, {system:.2f} system; {wall:.2f} s wall)"
            in results)
    for cited in (ROOT / ".ci" / "gpu-selfcheck", ROOT / "fuselab" / "doctor.py"):
        assert f"{user + system:.1f} core-s" in squash(cited.read_text()), cited
    today = json.loads((folder / "throughput-h200-148b874.json").read_text())["throughput"]
    phases = today["phases"]
    course, references = phases["fixed"]["intake and course"]["seconds"], phases["fixed"]["reference runs"]["seconds"]
    each, feedback = phases["submissions"]["seconds_each"], today["phase_seconds"]["feedback"]
    design = squash((ROOT / "docs" / "design.md").read_text())
    for text in (f"{course:.1f} s for all four on the H200 machine", f"{each:.2f} s each with 10 sharing an H200",
                 f"({references:.1f} s beyond the course set-up", f"{phases['submissions']['count']} pages took "
                 f"{feedback:.1f} s on the H200 machine"):
        assert text in design, text
    shard = 40 * each + course + references
    assert 90 <= shard <= 150 and "shard of 40 submissions is about 2 minutes on one H200" in design
    course_hours = 4000 / 40 * (40 * each + course) / 3600
    assert 2.5 <= course_hours <= 3.5 and "~3 GPU-hours all told" in design
    low, high = 300 * 4 * each / 3600, 1000 * 4 * each / 3600
    assert 0.5 <= low <= 1.5 and 2.5 <= high <= 3.5 and "at ~2.5 s per submission-lab on an H200 is 1–3" in design


def test_results_quotes_the_runs_of_ad58618():
    """The H100 runs at ad58618: the sample class as deserved, and the class of 120's numbers and verdicts are the
    saved files'."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    folder = ROOT / "docs" / "results"
    saved = json.loads((folder / "selfcheck-h100-samples-ad58618.json").read_text())
    assert saved["env"]["commit"] == "ad58618" and saved["env"]["gpu"] == "NVIDIA H100 80GB HBM3"
    samples = saved["samples"]
    ratios = [row["ratio"] for row in samples["wall_bound"]["rows"]]
    assert all(row["ok"] for row in samples["rows"]) and len(samples["rows"]) == 40 and samples["problems"] == []
    assert not any(row["capped"] for row in samples["wall_bound"]["rows"])
    assert (f"**40/40 samples got the grade they deserve at ad58618 on the H100**, {samples['seconds']:.0f} s"
            in results)
    assert f"{min(ratios):.3f}–{max(ratios):.3f} over {len(ratios)} speed tests, none capped" in results

    run = json.loads((folder / "throughput-h100-ad58618.json").read_text())
    assert run["env"]["commit"] == "ad58618" and run["env"]["gpu"] == "NVIDIA H100 80GB HBM3"
    t = run["throughput"]
    phases, count = t["phases"], t["phases"]["submissions"]["count"]
    assert t["jobs"] == 10 and count == 120
    assert t["load_while_grading"]["cores"] == 16 and "one_student_regrade" not in run  # "16 cores", "no regrade"
    met = {x["target"].split(",")[0]: x["met"] for x in t["targets"]}
    assert met["class of 120 all-in"] and met["fixed cost of the class's run"]
    assert not met["submissions phase per submission-lab"] and not met["CPU per submission-lab"]
    retried = sum("retried alone" in s["clean_timeline"] for s in t["submissions"])
    assert retried == 0 and "no test run again alone" in results
    median = phases["per_submission_median"]
    for text in (f"**{phases['wall_seconds']:.1f} s all-in** (the 300 s target met on the H100)",
                 f"**{t['full_marks']}/{count} full marks**",
                 f"Submissions phase **{phases['submissions']['seconds_each']:.2f} s** per submission-lab "
                 "(target 1.5 s: missed)",
                 f"CPU **{_cpu_per_submission_lab(t):.1f} core-s** per submission-lab (target 15: missed)",
                 f"fixed cost **{phases['fixed']['seconds']:.1f} s** (target 15 s: met)",
                 f"start {median['start']:.2f} s, build {median['build']:.2f} s, tests {median['tests']:.2f} s, of "
                 f"them {median['timing waits']:.2f} s stopped for others' timings and {median['GPU held']:.2f} s "
                 "with the GPU held",
                 f"GPU memory peak {t['load_while_grading']['gpu_memory_peak_gib']:.1f} GiB"):
        assert text in results, text


def test_results_quotes_the_16_sharing_run_of_d7c7a9e():
    """The H100 run at d7c7a9e, 16 sharing: the memory, the marks, the turns' share of the submissions phase and the
    comparison with ad58618's 10 and b88b1fb's memory are the saved files' numbers."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    folder = ROOT / "docs" / "results"
    run = json.loads((folder / "throughput-h100-d7c7a9e-16.json").read_text())
    assert run["env"]["commit"] == "d7c7a9e" and run["env"]["gpu"] == "NVIDIA H100 80GB HBM3"
    t = run["throughput"]
    phases, count = t["phases"], t["phases"]["submissions"]["count"]
    assert t["jobs"] == 16 and count == 120 and "one_student_regrade" not in run
    assert f"**{t['full_marks']}/{count} full marks with 16 sharing an H100**" in results
    retried = [s for s in t["submissions"] if s["retried"]]
    assert all(s["total"] == s["max_total"] for s in retried)
    assert f"{len(retried)} speed tests ran out of the shared memory and were run again alone" in results
    assert all(set(s["retried"]) == {"test_speedup"} for s in retried)
    memory = t["gpu_memory_by_process"]
    at_peak, one = memory["at_peak"], memory["one_process_peak_gib"]
    assert f"GPU memory at the peak ({t['load_while_grading']['gpu_memory_peak_gib']} GiB)" in results
    for kind in ("checker", "kernel worker", "solution worker"):
        assert f"{at_peak[kind]['gib']:.2f} GiB in {at_peak[kind]['processes']}" in results, kind
    before = json.loads((folder / "throughput-h100-b88b1fb-memory.json").read_text())
    [ten] = [r for r in before["throughput"]["runs"] if r["jobs"] == 10]
    each = {name: r["gpu_memory_by_process"]["at_peak"]["checker"] for name, r in (("now", t), ("then", ten))}
    each = {name: row["gib"] / row["processes"] for name, row in each.items()}
    assert each["now"] < each["then"]
    assert f"**{each['now']:.1f} GiB a checker on average**, against {each['then']:.1f} at b88b1fb" in results
    assert (f"kernel worker {one['kernel worker']:.2f} GiB, checker {one['checker']:.2f} GiB): that is one hidden "
            "test's own inputs") in results
    then_one = ten["gpu_memory_by_process"]["one_process_peak_gib"]
    assert abs(then_one["checker"] - one["checker"]) < 0.2 and abs(then_one["kernel worker"] - one["kernel worker"]) < 0.2

    ad = json.loads((folder / "throughput-h100-ad58618.json").read_text())["throughput"]
    assert ad["jobs"] == 10
    each_now, each_ad = phases["submissions"]["seconds_each"], ad["phases"]["submissions"]["seconds_each"]
    assert each_now > each_ad  # "16 sharing is slower"
    assert (f"{phases['wall_seconds']:.0f} s all-in, submissions phase **{each_now:.2f} s** per submission-lab, "
            f"against {ad['phases']['wall_seconds']:.1f} s and {each_ad:.2f} s for 10 sharing at ad58618") in results
    load = t["load_while_grading"]
    assert f"The CPU was {load['cpu_busy']:.0%} busy and the GPU {load['gpu_busy']:.0%}" in results.replace(" %", "%")
    waits = [s["clean_timeline"].get("waiting for the GPU alone", 0.0) for s in t["submissions"]]
    held = t["gpu_held_seconds_total"]
    turns = sum(waits) + held
    assert (f"({sum(waits) / len(waits):.2f} s on average, {sum(waits):.0f} s in all) and then holds it "
            f"({held:.0f} s in all)") in results
    assert f"for **{turns:.0f} s of the {phases['submissions']['seconds']:.0f} s** no other submission ran" in results
    stopped = sorted(s["clean_timeline"].get("stopped for others' timings", 0.0) for s in t["submissions"])
    median = (stopped[59] + stopped[60]) / 2
    assert f"a median {median:.1f} s of its wall time stopped for others' timings" in results


def test_results_quotes_the_sample_class_at_d762de5():
    """The last sample class on an H100, at d762de5: the saved file's numbers, its ratios the widest of every saved
    sample class, and Lab 1's ratios at ad58618, the H100 class before it, are that file's."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    folder = ROOT / "docs" / "results"
    saved = json.loads((folder / "selfcheck-h100-samples-d762de5.json").read_text())
    assert saved["env"]["commit"] == "d762de5" and saved["env"]["gpu"] == "NVIDIA H100 80GB HBM3"
    samples = saved["samples"]
    assert all(row["ok"] for row in samples["rows"]) and len(samples["rows"]) == 40 and samples["problems"] == []
    assert (f"**40/40 samples got the grade they deserve on the H100**, {samples['seconds']:.0f} s. "
            in results)
    rows = samples["wall_bound"]["rows"]
    ratios = [row["ratio"] for row in rows]
    assert f"{min(ratios):.3f}–{max(ratios):.3f} over {len(ratios)} speed tests: the widest yet" in results
    others = [r["ratio"] for path in folder.glob("selfcheck-*samples*.json") if "d762de5" not in path.name
              for r in json.loads(path.read_text())["samples"]["wall_bound"]["rows"]]
    assert others and max(ratios) > max(others)  # "the widest yet": above every other saved sample class
    [capped] = [row for row in rows if row["capped"]]
    assert capped["submission"] == "correct/lab1" and capped["ratio"] == max(ratios)
    assert f"correct {capped['ratio']:.3f}, capped at the outside clock's {capped['wall']:.3f}×" in results
    [correct] = [r for r in samples["rows"] if (r["sample"], r["lab"]) == ("correct", "lab1")]
    assert correct["total"] == correct["max"] and correct["flags"] == 1  # "flagged for the TA, points unchanged"
    [lying] = [row for row in rows if row["submission"] == "lying_int/lab1"]
    assert f"lying_int {lying['ratio']:.3f}" in results
    before = json.loads((folder / "selfcheck-h100-samples-ad58618.json").read_text())
    assert before["env"]["commit"] == "ad58618" and before["env"]["gpu"] == saved["env"]["gpu"]
    lab1 = [r["ratio"] for r in before["samples"]["wall_bound"]["rows"] if "lab1" in r["test"]]
    assert lab1 and max(ratios) > max(lab1)
    assert "At ad58618, the H100 sample class before it" in results
    assert f"Lab 1's ratios were at most {max(lab1):.3f}." in results




def test_results_quotes_the_sample_class_at_1e814f5():
    """The H100 sample class at 1e814f5: the saved file's grades, seconds and ratios, and "d762de5's 1.054 did not
    come again": Lab 1's ratios here all below d762de5's widest."""
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    folder = ROOT / "docs" / "results"
    saved = json.loads((folder / "selfcheck-h100-samples-1e814f5.json").read_text())
    assert saved["env"]["commit"] == "1e814f5" and saved["env"]["gpu"] == "NVIDIA H100 80GB HBM3"
    samples = saved["samples"]
    assert all(row["ok"] for row in samples["rows"]) and len(samples["rows"]) == 40 and samples["problems"] == []
    assert f"**40/40 samples got the grade they deserve on the H100**, {samples['seconds']:.0f} s; " in results
    rows = samples["wall_bound"]["rows"]
    ratios = [row["ratio"] for row in rows]
    lab1 = [row["ratio"] for row in rows if "lab1" in row["test"]]
    assert not any(row["capped"] for row in rows)
    assert (f"{min(ratios):.3f}–{max(ratios):.3f} over {len(ratios)} speed tests, none capped, Lab 1's at most "
            f"{max(lab1):.3f}" in results)
    before = json.loads((folder / "selfcheck-h100-samples-d762de5.json").read_text())["samples"]["wall_bound"]
    assert max(lab1) < max(r["ratio"] for r in before["rows"]) and "1.054 did not come again" in results


def test_results_quotes_the_one_element_check_runs_of_1e814f5_and_9ddb5ba():
    """The table of the two 16-sharing runs: each cell is its raw file's (the submissions phase per submission-lab,
    the median of the GPU held alone, the range of the refreshed-check phase, full marks)."""
    import statistics
    results = squash((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    runs = {name: json.loads((ROOT / "docs" / "results" / f"throughput-h100-{name}-24.json").read_text())["throughput"]
            for name in ("9ddb5ba", "1e814f5")}
    assert all(run["jobs"] == 16 and len(run["submissions"]) == 24 for run in runs.values())

    def refreshed(run):
        phases = [next(iter(s["speed_phases"].values()))["refreshed check"] for s in run["submissions"]]
        return f"{min(phases):.2f}–{max(phases):.2f} s"
    cells = {"submissions phase per submission-lab": [f"{r['submission_phase_per_submission']:.2f} s"
                                                      for r in runs.values()],
             "the GPU held alone, median per submission": [
                 f"{statistics.median(s['gpu_held_seconds'] for s in r['submissions']):.2f} s" for r in runs.values()],
             'the speed test\'s "refreshed check" phase': [refreshed(r) for r in runs.values()],
             "full marks": [f"{r['full_marks']}/{len(r['submissions'])}" for r in runs.values()]}
    for label, (before, after) in cells.items():
        assert f"| {label} | {before} | {after} |" in results, (label, before, after)
    assert runs["1e814f5"]["submission_phase_per_submission"] > 1.4 * runs["9ddb5ba"]["submission_phase_per_submission"]
    assert "the submissions phase grew by half" in results
