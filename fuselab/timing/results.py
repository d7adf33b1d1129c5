"""Value objects for timing results, in the spirit of ``torch.utils.benchmark.Measurement``: they hold the raw
samples and how they were taken, print readably, plot themselves and export to dicts."""

import dataclasses
import functools
import math

from . import stats
from .modes import TimingModeError, parse_mode
from .units import format_time, time_unit


def _mode_name(mode) -> str:
    try:
        return parse_mode(mode).description
    except TimingModeError:
        return str(mode)


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6, 3.5))
    return ax


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Timing samples of one callable, in seconds, and how they were taken.

    ``clock`` names the timer (CUDA events, or a host clock when there was no GPU); ``on_gpu`` is False for host
    timings, which must never be read as GPU performance. ``stop_reason`` says why sampling stopped.
    """

    label: str
    mode: str
    times: tuple
    device: str
    clock: str
    on_gpu: bool
    flushed: bool
    target_rse: float = 0.01
    stop_reason: str = ""
    notes: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "times", tuple(float(t) for t in self.times))
        object.__setattr__(self, "notes", tuple(self.notes))

    @functools.cached_property
    def median(self) -> float:
        return stats.median(self.times)

    @functools.cached_property
    def quartiles(self) -> tuple:
        return stats.quartiles(self.times)

    @property
    def iqr(self) -> float:
        q1, q3 = self.quartiles
        return q3 - q1

    @property
    def n(self) -> int:
        return len(self.times)

    @functools.cached_property
    def rse(self) -> float:
        """Relative standard error of the median (0.01 = 1%)."""
        return stats.relative_standard_error(self.times)

    @property
    def mean(self) -> float:
        return sum(self.times) / self.n if self.n else math.nan

    @property
    def converged(self) -> bool:
        return self.rse <= self.target_rse

    def summary(self) -> dict:
        """The numbers without the samples."""
        q1, q3 = self.quartiles
        return {
            "label": self.label,
            "mode": self.mode,
            "median_s": self.median,
            "q1_s": q1,
            "q3_s": q3,
            "iqr_s": self.iqr,
            "n": self.n,
            "rse": self.rse,
            "converged": self.converged,
            "device": self.device,
            "clock": self.clock,
            "on_gpu": self.on_gpu,
            "flushed": self.flushed,
            "stop_reason": self.stop_reason,
        }

    def to_dict(self) -> dict:
        out = self.summary()
        out.update(times_s=list(self.times), target_rse=self.target_rse, notes=list(self.notes))
        return out

    def __repr__(self):
        q1, q3 = self.quartiles
        flushed = "L2 flushed" if self.flushed else "L2 not flushed"
        state = "converged" if self.converged else f"not converged: {self.stop_reason}"
        lines = [
            f"<Measurement {self.label!r}: {_mode_name(self.mode)}>",
            f"  median {format_time(self.median)}   IQR {format_time(self.iqr)} "
            f"({format_time(q1)} .. {format_time(q3)})   n={self.n}",
            f"  rse {self.rse:.2%} (target {self.target_rse:.2%}, {state})",
            f"  {self.device} | {self.clock} | {flushed}",
        ]
        if not self.on_gpu:
            lines.append("  host-clock timing: not a GPU measurement")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def plot(self, ax=None, color=None):
        """A bar at the median with the interquartile range as error bar; returns the Axes."""
        ax = _axes(ax)
        scale, unit = time_unit(self.median)
        q1, q3 = self.quartiles
        ax.bar([self.label], [self.median / scale], color=color,
               yerr=[[(self.median - q1) / scale], [(q3 - self.median) / scale]], capsize=6)
        ax.set_ylabel(f"median time ({unit}), IQR bars")
        ax.set_title(f"{_mode_name(self.mode)} on {self.device}" + ("" if self.on_gpu else " (host clock)"))
        return ax


@dataclasses.dataclass(frozen=True)
class Speedup:
    """How many times faster ``name`` ran than the baseline (baseline median / candidate median), with a
    bootstrap confidence interval over paired interleaved rounds."""

    name: str
    value: float
    low: float
    high: float
    confidence: float = 0.95

    @property
    def significant(self) -> bool:
        """True when the whole interval lies on one side of 1.0 (faster or slower, beyond noise)."""
        return self.low > 1.0 or self.high < 1.0

    def __repr__(self):
        return f"{self.name}: {self.value:.3f}x [{self.low:.3f}, {self.high:.3f}] ({self.confidence:.0%} CI)"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Interleaved measurements of several candidates and their speedups over one baseline.

    Speedups measured without a GPU (host clock, CPU emulation) are shown but never graded:
    :attr:`verdict_allowed` is then False and :meth:`graded_speedup` returns None.
    """

    measurements: dict
    baseline: str
    speedups: dict
    mode: str
    rounds: int
    confidence: float = 0.95
    notes: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "notes", tuple(self.notes))

    def __getitem__(self, name) -> Measurement:
        return self.measurements[name]

    @property
    def names(self) -> list:
        return list(self.measurements)

    @property
    def on_gpu(self) -> bool:
        return all(m.on_gpu for m in self.measurements.values())

    @property
    def verdict_allowed(self) -> bool:
        """Only GPU measurements may decide a grade."""
        return self.on_gpu

    @property
    def verdict_reason(self):
        """None when a verdict is allowed, else why not, e.g. ``"not measured (no GPU)"``."""
        if self.verdict_allowed:
            return None
        clocks = " ".join(m.clock for m in self.measurements.values())
        return "not measured (CPU emulation)" if "emulation" in clocks else "not measured (no GPU)"

    def speedup(self, name) -> Speedup:
        return self.speedups[name]

    def graded_speedup(self, name):
        """The speedup of ``name`` for grading, or None where it was not measured on a GPU
        (see :attr:`verdict_reason`). Feed it to :func:`fuselab.timing.speedup_points`."""
        if name not in self.speedups:
            raise KeyError(f"no candidate named {name!r}; candidates: {', '.join(self.names)}")
        if not self.verdict_allowed:
            return None
        return self.speedups[name].value

    def to_dict(self) -> dict:
        return {
            "baseline": self.baseline,
            "mode": self.mode,
            "rounds": self.rounds,
            "confidence": self.confidence,
            "verdict_allowed": self.verdict_allowed,
            "verdict_reason": self.verdict_reason,
            "notes": list(self.notes),
            "candidates": {
                name: {**m.to_dict(), "speedup": self.speedups[name].value,
                       "speedup_low": self.speedups[name].low, "speedup_high": self.speedups[name].high}
                for name, m in self.measurements.items()
            },
        }

    def __repr__(self):
        first = next(iter(self.measurements.values()))
        lines = [f"<Comparison: {_mode_name(self.mode)}, baseline {self.baseline!r}, {self.rounds} interleaved rounds>",
                 f"  {first.device} | {first.clock}"]
        width = max(len(n) for n in self.names)
        for name, m in self.measurements.items():
            s = self.speedups[name]
            interval = "" if math.isnan(s.low) else f" [{s.low:.3f}, {s.high:.3f}]"
            lines.append(f"  {name:<{width}}  median {format_time(m.median):>9}  IQR {format_time(m.iqr):>9}  "
                         f"n={m.n:<5} speedup {s.value:.3f}x{interval}")
        if not self.verdict_allowed:
            lines.append(f"  speedups are {self.verdict_reason}: shown, never graded")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def plot(self, ax=None, kind="time"):
        """``kind="time"``: median bars with IQR error bars, each labelled with its speedup;
        ``kind="speedup"``: speedup bars with their confidence intervals and a line at 1x. Returns the Axes."""
        if kind not in ("time", "speedup"):
            raise ValueError(f"kind must be 'time' or 'speedup', got {kind!r}")
        ax = _axes(ax)
        names = self.names
        positions = list(range(len(names)))
        if kind == "time":
            scale, unit = time_unit(max(m.median for m in self.measurements.values()))
            medians = [self.measurements[n].median / scale for n in names]
            lower = [(self.measurements[n].median - self.measurements[n].quartiles[0]) / scale for n in names]
            upper = [(self.measurements[n].quartiles[1] - self.measurements[n].median) / scale for n in names]
            bars = ax.bar(positions, medians, yerr=[lower, upper], capsize=6,
                          color=["0.6" if n == self.baseline else "C0" for n in names])
            labels = [f"{self.speedups[n].value:.2f}x" for n in names]
            ax.bar_label(bars, labels=labels, padding=3)
            ax.set_ylabel(f"median time ({unit}), IQR bars")
        else:
            values = [self.speedups[n].value for n in names]
            lows = [max(0.0, v - self.speedups[n].low) if not math.isnan(self.speedups[n].low) else 0.0
                    for n, v in zip(names, values)]
            highs = [max(0.0, self.speedups[n].high - v) if not math.isnan(self.speedups[n].high) else 0.0
                     for n, v in zip(names, values)]
            ax.bar(positions, values, yerr=[lows, highs], capsize=6,
                   color=["0.6" if n == self.baseline else "C1" for n in names])
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_ylabel(f"speedup over {self.baseline} ({self.confidence:.0%} CI)")
        ax.set_xticks(positions)
        ax.set_xticklabels(names)
        first = next(iter(self.measurements.values()))
        title = f"{_mode_name(self.mode)} on {first.device}"
        if not self.verdict_allowed:
            title += f"\n{self.verdict_reason}: host clock, not a GPU verdict"
        ax.set_title(title)
        return ax
