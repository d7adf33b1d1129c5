"""The course's figures: data flow through DRAM, bytes moved, speedup sweeps, rooflines.

Every function draws on a matplotlib Axes (made if not given) and returns it, so notebooks can compose them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch


def _axes(ax, size=(8, 3.5)):
    if ax is None:
        _, ax = plt.subplots(figsize=size)
    return ax


def _box(ax, x, y, text, color, w=1.3, h=0.55):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04", fc=color, ec="black",
                                lw=1))
    ax.text(x, y, text, ha="center", va="center", fontsize=9)


def _arrow(ax, start, end, color="black"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=10, color=color, lw=1.2))


def plot_dataflow(stages, inputs_per_stage, title, outputs=None, ax=None):
    """Kernels as a row of boxes under a DRAM bar; arrows for every tensor read from or written to DRAM.

    stages: kernel names, e.g. ["add", "relu", "mul"]; inputs_per_stage: for each kernel, the tensors it
    reads from DRAM; each kernel writes one tensor back (named by ``outputs``).
    """
    outputs = outputs or ["out"] * len(stages)
    ax = _axes(ax, size=(2.2 * len(stages) + 1, 3))
    ax.add_patch(FancyBboxPatch((-0.9, 1.6), 2.2 * len(stages) - 0.4, 0.5, boxstyle="round,pad=0.02",
                                fc="#f4d6a0", ec="black"))
    ax.text(-0.8, 1.85, "DRAM (HBM)", va="center", fontsize=9, weight="bold")
    reads = writes = 0
    for i, (stage, reads_here) in enumerate(zip(stages, inputs_per_stage)):
        x = 2.2 * i
        _box(ax, x, 0, stage, "#b9d7f0")
        for j, name in enumerate(reads_here):
            dx = (j - (len(reads_here) - 1) / 2) * 0.35
            _arrow(ax, (x + dx - 0.25, 1.55), (x + dx - 0.25, 0.3), "#1f77b4")
            ax.text(x + dx - 0.2, 0.95, name, fontsize=8, color="#1f77b4")
            reads += 1
        _arrow(ax, (x + 0.45, 0.3), (x + 0.45, 1.55), "#d62728")
        writes += 1
        ax.text(x + 0.5, 0.95, outputs[i], fontsize=8, color="#d62728")
    ax.set_xlim(-1.2, 2.2 * len(stages) - 0.8)
    ax.set_ylim(-0.5, 2.3)
    ax.axis("off")
    ax.set_title(f"{title}: {len(stages)} launch(es), {reads} tensor reads + {writes} writes")
    return ax


def plot_bytes(named_bytes: dict, ax=None, unit=1e6, unit_name="MB"):
    """Bars of bytes moved per version, in MB as the labs' text gives tensor sizes (caches are in MiB)."""
    ax = _axes(ax, size=(5, 3))
    names = list(named_bytes)
    values = [named_bytes[n] / unit for n in names]
    bars = ax.bar(names, values, color=["#d62728", "#2ca02c", "#1f77b4", "#9467bd"][: len(names)])
    for bar, value in zip(bars, values):
        ax.text(bar.get_x() + bar.get_width() / 2, value, f"{value:,.0f}", ha="center", va="bottom")
    ax.set_ylabel(f"DRAM traffic ({unit_name})")
    return ax


def plot_sweep(sizes, series: dict, ylabel, ax=None, l2_bytes=None, bytes_per_size=None, logy=False,
               hline=None, hline_label=None):
    """Lines of ``series`` (name → values) over ``sizes`` on a log x axis, with the L2 capacity marked.

    l2_bytes and bytes_per_size (bytes the working set has per element) place a vertical line where the
    working set stops fitting in L2.
    """
    ax = _axes(ax, size=(7, 4))
    for name, values in series.items():
        ax.plot(sizes, values, marker="o", label=name)
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if l2_bytes and bytes_per_size:
        ax.axvline(l2_bytes / bytes_per_size, color="gray", ls="--", lw=1)
        ax.text(l2_bytes / bytes_per_size, ax.get_ylim()[1], " one tensor = L2", va="top", fontsize=8,
                color="gray")
    if hline is not None:
        ax.axhline(hline, color="black", ls=":", lw=1, label=hline_label)
    ax.set_xlabel("elements")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


def plot_counters(saved, axes=None):
    """Lab 0's hardware counters (``saved``: ``lab0_counters.json``): left, DRAM bytes of the unfused chain and of the fused
    kernel beside the bytes counted by hand, per size; right, the L2 hit rate of each one's reads (all
    its kernels' sectors together), titled with the span of every kernel's L1 hit rate. ``axes``: two Axes (made if not given)."""
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(12, 3.5))
    rows = saved["rows"]
    labels = [f"{row['tensor_bytes'] / 2**20:,.0f} MiB" for row in rows]
    x = range(len(rows))
    width = 0.2
    left, right = axes
    for k, (name, values, color) in enumerate((
            ("unfused, measured", [r["unfused"]["dram_bytes"] for r in rows], "#d62728"),
            ("unfused, counted", [r["computed_bytes"]["unfused"] for r in rows], "#f4a6a6"),
            ("fused, measured", [r["fused"]["dram_bytes"] for r in rows], "#2ca02c"),
            ("fused, counted", [r["computed_bytes"]["fused"] for r in rows], "#a6dba6"))):
        left.bar([i + (k - 1.5) * width for i in x], [v / 1e6 for v in values], width, label=name, color=color)
    left.set_yscale("log")
    left.set_xticks(list(x), labels)
    left.set_xlabel(f"size of one tensor (L2: {saved['l2_bytes'] / 2**20:.0f} MiB, {saved['gpu']})")
    left.set_ylabel("DRAM bytes (MB)")
    left.legend(fontsize=8)
    for k, side in enumerate(("unfused", "fused")):
        rates = [r[side]["l2_read_hit_pct"] for r in rows]
        bars = right.bar([i + (k - 0.5) * 0.35 for i in x], rates, 0.35, label=side, color=["#d62728", "#2ca02c"][k])
        for bar, rate in zip(bars, rates):
            right.text(bar.get_x() + bar.get_width() / 2, rate, f"{rate:.1f}%", ha="center", va="bottom", fontsize=8)
    right.set_xticks(list(x), labels)
    right.set_ylabel("L2 hit rate of reads (%)")
    right.legend(fontsize=8)
    # the L1 hit rates, per kernel: each kernel reads every sector once, so there is little to draw
    l1 = [k["l1_hit_pct"] for r in rows for side in ("unfused", "fused") for k in r[side]["kernels"]]
    low, high = f"{min(l1):.1f}", f"{max(l1):.1f}"
    right.set_title(f"L1 hit rate, every kernel at every size: {low if low == high else low + '–' + high} %",
                    fontsize=9)
    return axes


def plot_roofline(peak_flops, peak_bytes_per_s, points: dict, ax=None):
    """A roofline: attainable FLOP/s against arithmetic intensity, with measured points (name → (AI, FLOP/s))."""
    import numpy as np
    ax = _axes(ax, size=(6, 4))
    intensity = np.logspace(-2, 3, 200)
    ax.plot(intensity, np.minimum(peak_flops, intensity * peak_bytes_per_s), color="black", lw=1.5,
            label="roof (measured ceilings)")
    for name, (ai, flops) in points.items():
        ax.scatter([ai], [flops], zorder=3, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of DRAM traffic)")
    ax.set_ylabel("FLOP/s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return ax


def plot_standing(kernels: dict, threshold, floor=None, ax=None):
    """Where one graded kernel stands: bars of speedup over the lab's unfused reference (``kernels``: label →
    speedup, drawn top to bottom; the label ``"your kernel"`` is highlighted), the full-marks ``threshold`` as a
    line with the partial-credit range shaded from 1.0x, and ``floor`` (the speedup of a kernel moving only its
    minimum bytes at the copy bandwidth) as a line no kernel crosses. The feedback page draws it from one
    grading run's numbers only."""
    ax = _axes(ax, size=(7, 0.5 * len(kernels) + 1.4))
    names = list(kernels)[::-1]
    values = [kernels[name] for name in names]
    colors = ["#d62728" if name == "your kernel" else "#9e9e9e" if "reference" in name else "#1f77b4"
              for name in names]
    bars = ax.barh(names, values, color=colors, height=0.6)
    for bar, value in zip(bars, values):
        ax.text(value, bar.get_y() + bar.get_height() / 2, f" {value:.2f}x", va="center", fontsize=9)
    top = max(values + [threshold] + ([floor] if floor else []))
    ax.axvspan(1.0, threshold, color="#fff4e0", zorder=0, label="partial credit")
    ax.axvline(threshold, color="#2a7a2a", ls="--", lw=1.5, label=f"full marks from {threshold:.2f}x")
    if floor:
        ax.axvline(floor, color="black", ls=":", lw=1.5, label=f"floor: minimum bytes at copy bandwidth, {floor:.2f}x")
    ax.set_xlim(0, top * 1.18)
    ax.set_xlabel("speedup over the lab's unfused reference (higher is faster)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, frameon=False)
    ax.grid(alpha=0.3, axis="x")
    return ax
