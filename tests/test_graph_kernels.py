"""The speed test's kernel list from a CUDA graph capture (``fuselab/speed/graph_kernels.py``): the same names the
profiler gives, and the profiler's list wherever a capture cannot tell what really ran."""

import pytest
import torch

from fuselab import diagnostics
from fuselab.speed import graded, graph_kernels
from fuselab.timing.capture import capture

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_names_are_demangled_as_the_profiler_shows_them():
    # the one demangler, diagnostics.demangled: the kernel list's names and the build's undefined symbols
    assert diagnostics.demangled("_Z10fused_reluPKfPfi") == "fused_relu(float const*, float*, int)"
    assert diagnostics.demangled("relu_kernel") == "relu_kernel"        # extern "C": no mangling
    assert diagnostics.demangled("_Znot a name") == "_Znot a name"      # what cannot be demangled stays


def test_a_kernel_is_foreign_unless_named_after_one_of_the_students_own():
    own = {"fused_relu", "tail"}
    kernels = ["fused_relu(float const*, float*, int)", "void at::native::vectorized_elementwise_kernel<4>()"]
    assert graded._foreign(kernels, own) == kernels[1:]


@pytest.mark.parametrize("name", ["fused(float const*, float*, int)", "void ns::fused<128>(float*)",
                                  "(anonymous namespace)::fused(float*)", "fused", "_Z5fusedPKfPfi",
                                  "_ZN2ns5fusedEPf", "_Z5fusedILi128EEvPf", "void fused<(int)128, float>(float*)",
                                  "_ZL5fusedPf", "_ZN2nsL5fusedEPf"])
def test_a_kernel_is_the_students_own_by_its_function_name_however_it_is_written(name):
    assert graded.kernel_identifier(name) == "fused" and graded._foreign([name], {"fused"}) == []


def test_a_kernel_whose_name_only_holds_the_students_is_foreign():
    """A ``__global__ void gemm`` the student never launches must not vouch for cuBLAS's one fused kernel, nor a
    ``relu`` for PyTorch's ``relu_kernel``: the function's name itself, not a name that holds it."""
    kernels = ["sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_bias_relu_kernel__5x_cublas",
               "void at::native::relu_kernel<float>(float*)", "gemm2(float*)", "_Z7my_gemmPf"]
    assert graded._foreign(kernels, {"gemm", "relu"}) == kernels


@gpu
def test_a_capture_lists_what_the_profiler_lists():
    x = torch.randn(1000, 1001, device="cuda")
    y = torch.empty_like(x)

    def two_kernels():
        torch.clamp_min(x, 0, out=y)
        y.add_(1)
    captured = graph_kernels.captured_kernels(two_kernels)
    assert captured is not None and len(captured) == 2
    assert captured == graded.profiled_kernels(two_kernels)
    assert graph_kernels.captured_kernels(lambda: y.copy_(x)) == []   # a copy is not a kernel


@gpu
def test_what_a_capture_cannot_see_is_asked_of_the_profiler():
    y = torch.randn(1000, 1001, device="cuda")

    def on_its_own_stream():   # escapes the capture: the graph is empty, the profiler sees the kernel
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            y.add_(1)
        torch.cuda.current_stream().wait_stream(stream)

    def synchronizes():        # cannot be captured at all
        y.add_(1)
        torch.cuda.synchronize()
    assert graph_kernels.captured_kernels(synchronizes) is None
    assert len(graded.launched_kernels(synchronizes)) == 1
    assert graded.launched_kernels(on_its_own_stream, accept=lambda kernels: len(kernels) == 1) == \
        graded.profiled_kernels(on_its_own_stream)
    assert len(graded.profiled_kernels(on_its_own_stream)) == 1


@gpu
def test_work_on_a_stream_of_its_own_is_not_in_the_capture_and_fails_its_replay_on_new_inputs():
    """A kernel launched on a side stream runs at capture time and never becomes a node: the kernel list misses it
    (the profiler would not), so the stream check replays the capture on new inputs, which such work misses."""
    side = torch.cuda.Stream()

    def split(x, out):  # half the work on a stream of its own, the other half on the stream it is given
        with torch.cuda.stream(side):
            doubled = x * 2
        torch.mul(doubled, 1, out=out)

    def honest(x, out):
        torch.mul(x, 2, out=out)
    x = torch.randn(1000, device="cuda")
    out = torch.empty_like(x)
    split(x, out)  # the side stream's memory is in the caching allocator: a capture may not allocate any
    torch.cuda.synchronize()
    assert len(graph_kernels.captured_kernels(lambda: split(x, out))) == 1
    assert len(graded.profiled_kernels(lambda: split(x, out))) == 2
    assert "not all on the stream" in graded._escapes_stream(split, (x,), out, lambda x: 2 * x,
                                                              (torch.randn_like(x),))
    assert graded._escapes_stream(honest, (x,), out, lambda x: 2 * x, (torch.randn_like(x),)) is None


@gpu
def test_a_failed_capture_leaves_random_inputs_working():
    """A capture that fails leaves PyTorch's CUDA generator mid-capture: every later random tensor on the GPU would
    fail, and with it every later test of the submission. The capture puts the generator back."""
    y = torch.randn(1000, device="cuda")

    def synchronizes():
        y.add_(1)
        torch.cuda.synchronize()
    torch.manual_seed(5)
    expected = torch.randn(3, device="cuda")
    torch.manual_seed(5)
    assert capture(torch.cuda.CUDAGraph(), synchronizes) is not None
    assert torch.equal(torch.randn(3, device="cuda"), expected)  # works, and from the same state


def test_a_cache_keyed_by_a_few_sampled_values_fails_the_one_element_check(monkeypatch):
    """The timed calls repeat unchanged inputs, and the refreshed check changes every value: a launcher that skips
    its work while a few sampled values (and the pointers) stay the same passes both. A few elements changed at
    random places, which no such sample sees, leave it returning the last output; an honest op passes. On the CPU
    (the check is device-agnostic), the place drawn fixed (the first input's last element: past the cache's
    sample; raised by 8 each time, the ReLU passes it on)."""
    import secrets
    monkeypatch.setattr(secrets, "randbelow", lambda n: n - 1)  # the first input's last element
    torch.manual_seed(0)
    a, b, e = (torch.randn(64, 1000) for _ in range(3))
    out = torch.empty(64, 1000)

    def reference(a, b, e):
        return torch.relu(a + b) * e

    def honest(a, b, e, out):
        out.copy_(reference(a, b, e))

    def sample(*tensors):
        return tuple((t.data_ptr(), tuple(t.reshape(-1)[:16].tolist())) for t in tensors)
    last = {}

    def sampled_cache(a, b, e, out):
        if last.get("key") == sample(a, b, e, out):
            return  # "nothing changed": the last output stands
        honest(a, b, e, out)
        last["key"] = sample(a, b, e, out)

    graded.one_element_check(honest, reference, [a.clone(), b.clone(), e.clone()], out)
    sets = [a.clone(), b.clone(), e.clone()]
    sampled_cache(*sets, out)
    sampled_cache(*sets, out)  # as the timing calls it: unchanged, skipped
    with pytest.raises(AssertionError, match="bad"):
        graded.one_element_check(sampled_cache, reference, sets, out)
