"""The counters stage's reading of Nsight Compute's CSV (the GPU run itself is the self-check's ``counters``)."""

import pytest

from fuselab.tools.gpu_selfcheck import counters


def _csv(kernels):
    """ncu ``--csv --page raw --print-units base`` as it prints it: a header, a units row, one row a kernel."""
    metrics = list(counters.METRICS.values())
    lines = ['"ID","Kernel Name",' + ",".join(f'"{m}"' for m in metrics),
             '"","",' + ",".join('"byte"' for _ in metrics)]
    for i, (name, values) in enumerate(kernels):
        lines.append(f'"{i}","{name}",' + ",".join(f'"{values.get(key, 0):,}"' for key in counters.METRICS))
    return "==PROF== Connected to process\n" + "\n".join(lines) + "\n"


def _kernel(read, write, hit=50.0, ns=1000, sectors=1000):
    return {"dram_read_bytes": read, "dram_write_bytes": write, "l2_read_sectors": sectors,
            "l2_read_hit_sectors": int(sectors * hit / 100), "l2_read_hit_pct": hit, "l2_write_hit_pct": 100.0,
            "l2_hit_pct": hit, "l1_hit_pct": 0.0, "duration_ns": ns}


def test_parse_keeps_the_labs_kernels_in_order_and_drops_the_flush():
    text = _csv([("void at::native::vectorized_elementwise_kernel<4, FillFunctor<unsigned char>>(int, T1, T2)",
                  _kernel(0, 240_000_000)),
                 ("add_kernel(const float *, const float *, float *, long)", _kernel(8000, 4000)),
                 ("relu_kernel(const float *, float *, long)", _kernel(100, 4000, hit=90.0))])
    kernels = counters.parse(text)
    assert [k["kernel"] for k in kernels] == ["add_kernel", "relu_kernel"]
    assert kernels[0]["dram_read_bytes"] == 8000 and kernels[1]["l2_read_hit_pct"] == 90.0


def test_summary_sums_the_chain_and_pools_its_sectors_for_the_hit_rate():
    n = 1000
    chain = [("add_kernel", _kernel(8 * n, 4 * n, hit=0.0, sectors=2000)),
             ("relu_kernel", _kernel(0, 4 * n, hit=100.0, sectors=1000)),
             ("mul_kernel", _kernel(4 * n, 4 * n, hit=50.0, sectors=2000)),
             ("add_relu_mul_kernel", _kernel(12 * n, 4 * n, hit=0.0, sectors=3000))]
    rows = counters.summarize(counters.parse(_csv(chain)), sizes=[n])
    row = rows[0]
    assert row["unfused"]["dram_bytes"] == 24 * n and row["fused"]["dram_bytes"] == 16 * n
    assert row["dram_ratio"] == pytest.approx(1.5)
    # hits 0 + 1000 + 1000 of 5000 sectors read: 40 %, not the mean of the three rates (50 %)
    assert row["unfused"]["l2_read_hit_pct"] == pytest.approx(40.0)
    assert row["fused"]["l2_read_hit_pct"] == 0.0
    assert row["computed_bytes"] == {"unfused": 32 * n, "fused": 16 * n}


def test_summary_refuses_a_profile_that_is_not_the_expected_kernels():
    kernels = counters.parse(_csv([("add_kernel", _kernel(1, 1)), ("mul_kernel", _kernel(1, 1)),
                                   ("relu_kernel", _kernel(1, 1)), ("add_relu_mul_kernel", _kernel(1, 1))]))
    with pytest.raises(ValueError, match="order"):
        counters.summarize(kernels, sizes=[1])
    with pytest.raises(ValueError, match="expected 8"):
        counters.summarize(kernels, sizes=[1, 2])
