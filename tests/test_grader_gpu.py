"""Anti-cheat checks that only a GPU can run (the GPU self-check runs this file; skipped elsewhere)."""

import json
import os
import sys
import time

import pytest
import torch

import fuselab
from fuselab import speed
from fuselab.grading.sandbox import isolate
from fuselab.grading.gpus import lease
from fuselab.grading.recheck import clean as recheck
from fuselab.labs import lab0

from .conftest import requires_gpu

pytestmark = requires_gpu

KERNEL = """
__global__ void k(const float* a, const float* b, const float* e, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(a[i] + b[i], 0.0f) * e[i];
}
void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, cudaStream_t stream) {
    %s
    if (n > 0) k<<<(unsigned)((n + 255) / 256), 256, 0, %s>>>(a, b, e, out, n);
}
"""


@pytest.mark.parametrize("setup, stream, escapes", [
    ("", "stream", False),
    ("static cudaStream_t side = nullptr; if (!side) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);",
     "side", True),
])
def test_side_stream_launches_are_caught_by_graph_replay(setup, stream, escapes):
    module = fuselab.build(KERNEL % (setup, stream), [lab0.FUSED], name=f"stream_{stream}")
    inputs = lab0.make_inputs((1 << 20,), seed=3, device="cuda")
    out = torch.empty_like(inputs[0])
    op = lab0.fused(module)
    op(*inputs, out)  # first call outside the capture (a launcher may set itself up)
    torch.cuda.synchronize()
    fresh = lab0.make_inputs((1 << 20,), seed=4, device="cuda")
    verdict = speed.graded._escapes_stream(op, inputs, out, lab0.reference, fresh)
    assert (verdict is not None) == escapes, verdict


NEIGHBOUR = """
import sys, torch
x = torch.randn(8192, 8192, device="cuda")
open(sys.argv[1], "w").write("ready")
while True:  # another submission's heavy GPU work, synchronizing as checks do
    torch.mm(x, x)
    torch.cuda.synchronize()
"""

TIMER = """
import json, sys, torch
import fuselab
from fuselab.speed.lease import exclusive_gpu
a = torch.randn(4096, 4096, device="cuda")
op = lambda: torch.mm(a, a)
shared = fuselab.measure(op, mode="device", budget_s=1.0).median
with exclusive_gpu():
    leased = fuselab.measure(op, mode="device", budget_s=1.0).median
json.dump({"shared": shared, "leased": leased}, open(sys.argv[1], "w"))
"""


def test_a_leased_timing_is_not_slowed_by_a_busy_neighbour(tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(4096, 4096, device="cuda")
    alone = fuselab.measure(lambda: torch.mm(a, a), mode="device", budget_s=1.0).median
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    shared_gpu = lease.DeviceLease(device)
    limits = isolate.Limits(wall_s=120, memory_bytes=None)
    ready = tmp_path / "ready"
    neighbour = isolate.Child([sys.executable, "-c", NEIGHBOUR, str(ready)], limits=limits, registry=shared_gpu)
    try:
        while not ready.exists():
            assert neighbour.alive(), neighbour.wait().stderr
            time.sleep(0.05)
        from .test_grader_lease import leased_child
        env = recheck.runner_env(dict(os.environ), tmp_path, None)
        timer, server, serve = leased_child(TIMER, [tmp_path / "times.json"], shared_gpu, env=env, limits=limits)
        while timer.alive():
            serve()
            time.sleep(0.01)
        server.finish()
        outcome = timer.wait()
        assert outcome.ok, outcome.stderr[-2000:]
    finally:
        neighbour.stop()
        neighbour.wait()
    times = json.loads((tmp_path / "times.json").read_text())
    assert times["shared"] > 1.3 * alone, f"the neighbour did not share the GPU at all: {times}, alone {alone}"
    assert times["leased"] < 1.05 * alone, f"the leased timing was disturbed: {times}, alone {alone}"
    assert not server.notes, server.notes


def test_gpu_sized_inputs_are_drawn_on_the_gpu_reproducibly():
    from fuselab.labs import lab1
    first, again = lab0.make_inputs((1 << 20,), seed=5, device="cuda"), lab0.make_inputs((1 << 20,), seed=5,
                                                                                          device="cuda")
    assert all(t.is_cuda for t in first) and all(torch.equal(x, y) for x, y in zip(first, again))
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    assert (first[0] < 0).any() and (first[0] > 0).any()
    x = lab1.make_depthwise_inputs((2, 3, 9, 9), seed=5, device="cuda")[0]
    assert x.is_cuda and torch.equal(x, lab1.make_depthwise_inputs((2, 3, 9, 9), seed=5, device="cuda")[0])
