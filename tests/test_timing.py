"""Tests of fuselab.timing.

Everything that does not need a GPU is tested for real here, mostly with a fake clock so that results are
deterministic; the tests marked ``gpu`` run only where torch sees a CUDA device.
"""

import itertools
import json
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

import fuselab.timing as timing
from fuselab.timing import gpu, stats
from fuselab.timing.modes import Mode, TimingModeError, parse_mode
from fuselab.timing.progress import Progress, in_jupyter_kernel
from fuselab.timing.results import Measurement
from fuselab.timing.samplers import HostClockSampler
from fuselab.timing.units import format_time, time_unit

needs_gpu = pytest.mark.skipif(not gpu.cuda_ready(), reason="needs a CUDA device")


class FakeClock:
    """A host clock that only moves when a fake workload says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def fake_workload(clock, durations):
    """A callable whose n-th call 'takes' the n-th duration (cycling) on ``clock``."""
    source = itertools.cycle(durations)
    return lambda: clock.advance(next(source))


def fake_measure(durations, **kwargs):
    clock = FakeClock()
    fn = fake_workload(clock, durations)
    kwargs.setdefault("progress", False)
    return timing.measure(fn, sampler=HostClockSampler(fn, clock=clock), clock=clock, **kwargs)


@pytest.fixture
def no_gpu(monkeypatch):
    """Pretend there is no GPU, so the fallback is tested on GPU machines too."""
    monkeypatch.setattr(gpu, "cuda_ready", lambda: False)


# --- statistics ------------------------------------------------------------------------------------------


def test_median_and_iqr_of_known_samples():
    samples = [5, 1, 9, 3, 7, 2, 8, 4, 6]
    assert stats.median(samples) == 5
    assert stats.quartiles(samples) == (3.0, 7.0)
    assert stats.iqr(samples) == 4.0


def test_rse_of_the_median_follows_the_normal_theory():
    rng = np.random.default_rng(1)
    samples = rng.normal(100.0, 2.0, size=4000)
    expected = 1.2533 * 2.0 / math.sqrt(4000) / 100.0
    assert stats.relative_standard_error(samples) == pytest.approx(expected, rel=0.1)


def test_rse_is_robust_to_outliers():
    rng = np.random.default_rng(2)
    clean = rng.normal(10.0, 0.1, size=1000)
    dirty = clean.copy()
    dirty[::50] = 1000.0  # 2% of samples hit by e.g. a context switch
    assert stats.relative_standard_error(dirty) < 1.2 * stats.relative_standard_error(clean)


def test_rse_edge_cases():
    assert stats.relative_standard_error([1.0]) == math.inf
    assert stats.relative_standard_error([]) == math.inf
    assert stats.relative_standard_error([2.0] * 10) == 0.0
    # Coarse clock: IQR 0 but not all equal -> fall back to the standard deviation, not 0.
    quantised = [1.0] * 20 + [1.5, 0.5]
    assert stats.iqr(quantised) == 0.0
    assert stats.relative_standard_error(quantised) > 0.0


def test_bootstrap_speedup_recovers_ratio_and_pairing_cancels_drift():
    rng = np.random.default_rng(3)
    rounds = 40
    drift = np.linspace(1.0, 1.5, rounds)[:, None]  # the GPU slows down by 50% during the run
    baseline = 2.0 * drift * rng.normal(1.0, 0.01, size=(rounds, 5))
    candidate = 1.0 * drift * rng.normal(1.0, 0.01, size=(rounds, 5))
    value, low, high = stats.bootstrap_speedup(baseline, candidate)
    assert value == pytest.approx(2.0, rel=0.02)
    assert low <= 2.0 <= high or abs(value - 2.0) < 0.02
    assert low < value < high
    assert high - low < 0.1 * value


def test_bootstrap_speedup_interval_shrinks_with_more_rounds():
    rng = np.random.default_rng(4)

    def width(rounds):
        base = rng.normal(2.0, 0.2, size=(rounds, 1))
        cand = rng.normal(1.0, 0.1, size=(rounds, 1))
        _, low, high = stats.bootstrap_speedup(base, cand)
        return high - low

    assert width(400) < width(20)


def test_bootstrap_speedup_rejects_unpaired_and_handles_one_round():
    with pytest.raises(ValueError, match="same number of rounds"):
        stats.bootstrap_speedup(np.ones((3, 2)), np.ones((4, 2)))
    value, low, high = stats.bootstrap_speedup([[2.0, 2.0]], [[1.0, 1.0]])
    assert value == 2.0 and math.isnan(low) and math.isnan(high)


def test_time_units():
    assert time_unit(3e-6) == (1e-6, "us")
    assert format_time(1.5e-3) == "1.5 ms"
    assert format_time(2.0) == "2 s"
    assert format_time(float("nan")) == "nan"


# --- adaptive stopping -----------------------------------------------------------------------------------


def test_quiet_kernel_stops_as_soon_as_the_target_is_met():
    m = fake_measure([1.00e-3, 1.01e-3, 0.99e-3], target_rse=0.01, min_reps=10, budget_s=100.0)
    assert m.stop_reason == "converged"
    assert m.converged and m.rse <= 0.01
    assert m.median == pytest.approx(1.0e-3)
    assert m.n <= 100  # one batch of ~20 ms of calls is enough, the budget is nowhere near spent


def test_noisy_kernel_stops_when_the_budget_is_spent():
    rng = np.random.default_rng(5)
    durations = list(rng.lognormal(np.log(1e-3), 1.0, size=997))
    m = fake_measure(durations, target_rse=1e-6, budget_s=0.5, max_reps=10**9)
    assert m.stop_reason == "time budget spent"
    assert not m.converged
    assert m.n >= 10
    assert "not converged" in repr(m)


def test_max_reps_caps_the_sample_count():
    m = fake_measure([1e-3, 2e-3, 3e-3], target_rse=1e-9, min_reps=10, max_reps=50, budget_s=1e6)
    assert m.stop_reason == "max_reps reached"
    assert m.n == 50


def test_a_tighter_target_takes_more_samples():
    rng = np.random.default_rng(6)
    durations = list(rng.normal(1e-3, 1e-4, size=1009))
    loose = fake_measure(durations, target_rse=0.01, budget_s=1e3)
    tight = fake_measure(durations, target_rse=0.001, budget_s=1e3)
    assert loose.stop_reason == tight.stop_reason == "converged"
    assert tight.n > loose.n


def test_warm_up_calls_are_not_timed():
    clock = FakeClock()
    calls = []

    def fn():
        calls.append(clock())
        clock.advance(1.0 if len(calls) == 1 else 1e-3)  # the first call compiles: 1000x slower

    m = timing.measure(fn, sampler=HostClockSampler(fn, clock=clock), clock=clock, budget_s=100.0, progress=False)
    assert max(m.times) == pytest.approx(1e-3)
    assert len(calls) > m.n


# --- interleaving and speedups ---------------------------------------------------------------------------


def fake_compare(durations_by_name, **kwargs):
    clock = FakeClock()
    log = []

    def workload(name, durations):
        source = itertools.cycle(durations)

        def fn():
            log.append(name)
            clock.advance(next(source))

        return fn

    fns = {name: workload(name, d) for name, d in durations_by_name.items()}
    samplers = {name: HostClockSampler(fn, clock=clock) for name, fn in fns.items()}
    kwargs.setdefault("progress", False)
    result = timing.compare(fns, samplers=samplers, clock=clock, **kwargs)
    return result, log


def test_compare_interleaves_in_rotating_order():
    names = ["a", "b", "c"]
    result, log = fake_compare({n: [1e-3, 1.1e-3] for n in names}, block=1, min_rounds=7, target_rse=0.5,
                               budget_s=1e3)
    assert result.rounds >= 7
    timed = log[-3 * result.rounds:]  # the warm-up calls come first
    rounds = [timed[i:i + 3] for i in range(0, len(timed), 3)]
    for index, order in enumerate(rounds):
        assert order == names[index % 3:] + names[:index % 3]
    first_places = [order[0] for order in rounds[:6]]
    assert sorted(first_places) == ["a", "a", "b", "b", "c", "c"]  # each leads equally often


def test_compare_speedup_and_interval_on_synthetic_times():
    rng = np.random.default_rng(7)
    result, _ = fake_compare({"unfused": list(rng.normal(2e-3, 2e-5, size=101)),
                              "fused": list(rng.normal(1e-3, 1e-5, size=103))},
                             target_rse=0.002, budget_s=1e3)
    s = result.speedup("fused")
    assert s.value == pytest.approx(2.0, rel=0.01)
    assert s.low < s.value < s.high and s.low > 1.9 and s.high < 2.1
    assert s.significant
    assert result.speedup("unfused").value == 1.0
    assert result.baseline == "unfused"
    assert result["fused"].n > 0 and "interleaved" in result["fused"].notes[-1]


def test_compare_stops_on_budget_and_says_so():
    rng = np.random.default_rng(8)
    result, _ = fake_compare({"a": list(rng.lognormal(0, 1, 97) * 1e-3), "b": list(rng.lognormal(0, 1, 89) * 1e-3)},
                             target_rse=1e-6, budget_s=0.3, max_rounds=10**6)
    assert result["a"].stop_reason == "time budget spent"
    assert any("stopped before the target" in note for note in result.notes)


def test_compare_validates_its_arguments():
    with pytest.raises(ValueError, match="at least two"):
        timing.compare({"only": lambda: None})
    with pytest.raises(ValueError, match="baseline 'x'"):
        timing.compare({"a": lambda: None, "b": lambda: None}, baseline="x")
    with pytest.raises(TimingModeError):
        timing.compare({"a": lambda: None, "b": lambda: None}, mode="fastest")
    with pytest.raises(ValueError, match="min_rounds"):
        timing.compare({"a": lambda: None, "b": lambda: None}, min_rounds=1)
    with pytest.raises(ValueError, match="confidence"):
        timing.compare({"a": lambda: None, "b": lambda: None}, confidence=95)


# --- no GPU, emulation and verdicts ----------------------------------------------------------------------


def test_without_gpu_measure_falls_back_to_the_host_clock(no_gpu):
    m = timing.measure(lambda: sum(range(100)), budget_s=0.2, progress=False)
    assert m.on_gpu is False
    assert m.clock == "perf_counter (no GPU)"
    assert m.flushed is False
    assert m.median > 0
    assert "not a GPU measurement" in repr(m)


def test_without_gpu_other_modes_say_what_was_timed(no_gpu):
    m = timing.measure(lambda: None, mode="graph", budget_s=0.1, progress=False)
    assert m.mode == "graph" and not m.on_gpu
    assert any("needs a GPU" in note for note in m.notes)


def test_without_gpu_a_comparison_gets_no_verdict(no_gpu):
    result = timing.compare({"slow": lambda: sum(range(2000)), "fast": lambda: sum(range(100))}, budget_s=0.3,
                            progress=False)
    assert result.speedup("fast").value > 1.0  # shown ...
    assert result.verdict_allowed is False  # ... but never graded
    assert result.graded_speedup("fast") is None
    assert result.verdict_reason == "not measured (no GPU)"
    assert timing.speedup_points(result.graded_speedup("fast"), threshold=1.5, max_points=3) == 0.0
    assert "never graded" in repr(result)
    with pytest.raises(KeyError, match="no candidate named"):
        result.graded_speedup("missing")


def test_emulated_callables_are_never_gpu_measurements():
    def kernel():
        return None

    kernel.emulated = True  # how a module built by the CPU emulation marks its launchers
    m = timing.measure(kernel, budget_s=0.1, progress=False)
    assert not m.on_gpu and m.clock == "perf_counter (CPU emulation)"
    result = timing.compare({"ref": lambda: None, "student": kernel}, budget_s=0.2, progress=False)
    assert not result.verdict_allowed
    assert result.verdict_reason == "not measured (CPU emulation)"
    assert any("emulation" in note for note in result.notes)


def test_a_wrapper_around_an_emulated_launcher_counts_as_emulated():
    class EmulatedLauncher:
        emulated = True

        def __call__(self):
            return None

    launcher = EmulatedLauncher()
    assert gpu.is_emulated(lambda: launcher())
    assert not gpu.is_emulated(lambda: sum([1]))


def test_emulate_backend_marks_everything_emulated(monkeypatch):
    monkeypatch.setenv("FUSELAB_BACKEND", "emulate")
    assert gpu.is_emulated(lambda: None)
    monkeypatch.setenv("FUSELAB_BACKEND", "auto")
    assert not gpu.is_emulated(lambda: None)


def test_a_verdict_is_allowed_only_for_gpu_measurements():
    def made(on_gpu):
        m = {name: Measurement(name, "device", [t] * 5, "NVIDIA H200", "CUDA events", on_gpu, True)
             for name, t in (("ref", 2e-3), ("fused", 1e-3))}
        speedups = {"ref": timing.Speedup("ref", 1.0, 1.0, 1.0), "fused": timing.Speedup("fused", 2.0, 1.9, 2.1)}
        return timing.Comparison(m, "ref", speedups, "device", rounds=5)

    assert made(True).verdict_allowed and made(True).graded_speedup("fused") == 2.0
    assert made(True).verdict_reason is None
    assert made(False).graded_speedup("fused") is None


# --- points ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "speedup, points",
    [(None, 0.0), (float("nan"), 0.0), (0.5, 0.0), (1.0, 0.0), (1.25, 2.0), (1.5, 4.0), (3.0, 4.0),
     (float("inf"), 4.0)],
)
def test_speedup_points(speedup, points):
    assert timing.speedup_points(speedup, threshold=1.5, max_points=4) == pytest.approx(points)


def test_speedup_points_rejects_bad_policy():
    with pytest.raises(ValueError, match="threshold"):
        timing.speedup_points(2.0, threshold=1.0, max_points=1)
    with pytest.raises(ValueError, match="max_points"):
        timing.speedup_points(2.0, threshold=1.5, max_points=-1)


def test_full_points_threshold_follows_the_design_rule():
    assert timing.full_points_threshold(2.0) == pytest.approx(1.6)
    with pytest.raises(ValueError, match="don't grade"):
        timing.full_points_threshold(1.2)


# --- results: repr, export, plots ------------------------------------------------------------------------


@pytest.fixture
def comparison():
    result, _ = fake_compare({"unfused": [2e-3, 2.1e-3, 1.9e-3], "fused": [1e-3, 1.05e-3, 0.95e-3]},
                             budget_s=1e3, target_rse=0.005)
    return result


def test_measurement_repr_and_dict():
    m = fake_measure([1e-3, 1.02e-3, 0.98e-3], label="fused add-relu-mul", budget_s=100.0)
    text = repr(m)
    assert "fused add-relu-mul" in text and "device time" in text and "median 1 ms" in text and "n=" in text
    record = m.to_dict()
    json.dumps(record)  # plain data only
    assert record["median_s"] == pytest.approx(1e-3) and record["n"] == m.n == len(record["times_s"])
    assert record["mode"] == "device" and record["on_gpu"] is False


def test_comparison_repr_and_dict(comparison):
    text = repr(comparison)
    assert "baseline 'unfused'" in text and "speedup 2" in text
    record = comparison.to_dict()
    json.dumps(record)
    assert record["candidates"]["fused"]["speedup"] == pytest.approx(2.0, rel=0.05)
    assert record["verdict_allowed"] is False and record["verdict_reason"] == "not measured (no GPU)"


def test_plots_return_their_axes(comparison):
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3)
    assert comparison.plot(ax=left) is left
    assert len(left.patches) == 2
    assert comparison.plot(ax=middle, kind="speedup") is middle
    assert comparison["fused"].plot(ax=right) is right
    assert "not measured (no GPU)" in left.get_title()
    with pytest.raises(ValueError, match="kind"):
        comparison.plot(kind="pie")
    own = comparison["fused"].plot()  # makes its own figure
    assert own.figure is not fig
    plt.close("all")


def test_achieved_rates_and_fractions():
    limits = timing.Ceilings("NVIDIA H200", "2.11", copy_bytes_per_s=4e12, fp32_flops_per_s=5e13,
                             fp16_flops_per_s=7e14)
    on_gpu = Measurement("k", "device", [1e-3] * 5, "NVIDIA H200", "CUDA events", True, True)
    result = timing.achieved(on_gpu, bytes=2e9, flops=1e10, limits=limits)
    assert result.bytes_per_s == pytest.approx(2e12) and result.bandwidth_fraction == pytest.approx(0.5)
    assert result.compute_fraction == pytest.approx(1e13 / 5e13)
    assert "50% of copy" in repr(result)
    assert timing.achieved(1e-3, flops=1e10, dtype="fp16", limits=limits).compute_fraction == pytest.approx(1e13 / 7e14)
    on_host = Measurement("k", "device", [1e-3] * 5, "CPU", "perf_counter (no GPU)", False, False)
    host = timing.achieved(on_host, bytes=2e9)
    assert host.bytes_per_s == pytest.approx(2e12) and host.bandwidth_fraction is None and "host clock" in host.note
    with pytest.raises(ValueError, match="bytes=... or flops="):
        timing.achieved(on_host)
    with pytest.raises(ValueError, match="dtype"):
        limits.flops_per_s("int8")


def test_ceilings_cache_round_trip(monkeypatch, tmp_path):
    from fuselab.timing import roofline

    monkeypatch.setenv("FUSELAB_CACHE_DIR", str(tmp_path))
    entry = {"device": "GPU X", "torch_version": "2.11", "copy_bytes_per_s": 1.0, "fp32_flops_per_s": 2.0,
             "fp16_flops_per_s": 3.0, "measured_at": "now"}
    roofline._write_cache({"GPU X | torch 2.11": entry})
    assert roofline.cache_path().parent == tmp_path
    assert timing.Ceilings(**roofline._read_cache()["GPU X | torch 2.11"]).fp16_flops_per_s == 3.0
    assert "torch" in roofline.cache_key()


def test_gpu_only_helpers_refuse_clearly_without_gpu(no_gpu):
    with pytest.raises(timing.NoGPUError, match="no GPU|none"):
        timing.ceilings()
    with pytest.raises(timing.NoGPUError):
        timing.launch_overhead()
    with pytest.raises(timing.NoGPUError):
        timing.selfcheck()


# --- progress and modes ----------------------------------------------------------------------------------


def test_progress_bar_draws_on_stdout_never_stderr(capsys):
    rng = np.random.default_rng(9)
    fake_measure(list(rng.lognormal(np.log(1e-3), 1.0, 101)), target_rse=1e-6, budget_s=3.0, max_reps=10**9,
                 progress=True)
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "timing" in captured.out  # the bar was drawn, on stdout


def test_progress_is_off_for_short_runs_and_when_disabled(capsys):
    fake_measure([1e-3, 1.01e-3], budget_s=0.5, progress=None)
    fake_measure([1e-3, 1.01e-3], target_rse=1e-9, budget_s=5.0, progress=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    assert not Progress(0.2, "x").enabled and not Progress(1.0, "x").enabled and Progress(5.0, "x").enabled
    assert not in_jupyter_kernel()


def test_modes_parse_and_reject_unknown_names():
    assert parse_mode("device") is Mode.DEVICE
    assert parse_mode(" Latency ") is Mode.LATENCY
    assert parse_mode(Mode.GRAPH) is Mode.GRAPH
    with pytest.raises(TimingModeError, match="'device', 'latency', 'graph'"):
        parse_mode("wall")
    with pytest.raises(ValueError):  # TimingModeError is a ValueError too
        timing.measure(lambda: None, mode="events")


def test_measure_validates_its_arguments():
    with pytest.raises(ValueError, match="target_rse"):
        timing.measure(lambda: None, target_rse=0)
    with pytest.raises(ValueError, match="min_reps"):
        timing.measure(lambda: None, min_reps=1)
    with pytest.raises(ValueError, match="max_reps"):
        timing.measure(lambda: None, min_reps=10, max_reps=5)
    with pytest.raises(ValueError, match="budget_s"):
        timing.measure(lambda: None, budget_s=0)
    with pytest.raises(TypeError, match="callable"):
        timing.measure(42)


# --- on a GPU --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
def test_gpu_measure_in_every_mode():
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    results = {mode: timing.measure(lambda: torch.mul(x, 2.0, out=y), mode=mode, budget_s=0.5, progress=False)
               for mode in ("device", "latency", "graph")}
    for mode, m in results.items():
        assert m.on_gpu and m.flushed and m.median > 0 and m.mode == mode
        assert "CUDA events" in m.clock
    # Latency includes the host launch that device time hides.
    assert results["latency"].median > results["device"].median


@pytest.mark.gpu
@needs_gpu
def test_gpu_flush_buffer_is_twice_the_l2():
    from fuselab.timing.l2 import L2Flush

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert L2Flush().nbytes >= 2 * l2


@pytest.mark.gpu
@needs_gpu
def test_gpu_compare_allows_a_verdict_and_finds_no_speedup_against_itself():
    x = torch.randn(1 << 22, device="cuda")
    y = torch.empty_like(x)

    def scale():
        torch.mul(x, 2.0, out=y)

    result = timing.compare({"a": scale, "b": scale}, budget_s=1.0, progress=False)
    assert result.verdict_allowed and result.graded_speedup("b") is not None
    assert result.speedup("b").low <= 1.02 and result.speedup("b").high >= 0.98


@pytest.mark.gpu
@needs_gpu
def test_gpu_launch_overhead_numbers_are_positive():
    overhead = timing.launch_overhead(budget_s=0.3)
    assert overhead.device_us > 0 and overhead.latency_us > 0 and overhead.graph_us > 0 and overhead.host_us > 0


@pytest.mark.gpu
@needs_gpu
def test_gpu_graph_capture_failure_is_one_clear_error():  # last: a failed capture may disturb the context
    def syncs():
        torch.cuda.synchronize()

    with pytest.raises(timing.GraphCaptureError, match="CUDA graph"):
        timing.measure(syncs, mode="graph", budget_s=0.2, progress=False)
