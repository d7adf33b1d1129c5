import pytest
import torch

from fuselab.prototypes import PrototypeError, parse, parse_all


def test_parse_pointers_scalars_stream_and_shapes():
    p = parse("void conv(const float* __restrict__ x /*[N, C, H, W]*/, const float* w /*[C, 3, 3]*/, "
              "float* out /*[N, C, H, W]*/, int64_t n, float slope, cudaStream_t stream)")
    assert p.name == "conv"
    assert [q.name for q in p.call_params] == ["x", "w", "out", "n", "slope"]
    x, w, out, n, slope, stream = p.params
    assert x.is_tensor and x.const and x.dtype == torch.float32 and x.dims == ("N", "C", "H", "W")
    assert w.dims == ("C", 3, 3)
    assert out.is_tensor and not out.const
    assert not n.is_tensor and n.base_type == "int64_t"
    assert stream.is_stream
    assert p.declaration.endswith(";")


@pytest.mark.parametrize("text", [
    "void f(float** x)",             # pointer to pointer
    "void f(std::vector<float> v)",  # not C
    "float f(const float* x)",       # launchers return void/int/cudaError_t
    "void f(int n /*[3]*/)",         # a number has no shape
    "not a prototype",
    "void f(const float* a, int a)",  # duplicate names
])
def test_rejects_what_the_glue_cannot_call(text):
    with pytest.raises(PrototypeError):
        parse(text)


def test_half_and_void_pointers():
    p = parse("void f(const __half* a, void* scratch, cudaStream_t s)")
    assert p.params[0].dtype == torch.float16
    assert p.params[1].dtype is None


def test_launcher_names_must_be_unique():
    with pytest.raises(PrototypeError):
        parse_all(["void f(int n)", "void f(float x)"])


def test_shape_rules_parse_and_compute_in_c_integer_arithmetic():
    from fuselab.prototypes import evaluate
    p = parse("void conv(const float* x /*[N, C, H, W]*/, const float* w /*[K, C, R, S]*/, "
              "float* y /*[N, K, P = (H + 2*pad - R)/stride + 1, W - S + 1]*/, int stride, int pad, cudaStream_t s)")
    y = p.params[2]
    assert y.dims == ("N", "K", "P", "W - S + 1")
    assert y.rules == (("P", "(H + 2*pad - R)/stride + 1"), ("W - S + 1", "W - S + 1"))
    assert evaluate("(H + 2*pad - R)/stride + 1", {"H": 5, "pad": 1, "R": 3, "stride": 2}) == 3
    assert evaluate("-7 / 2", {}) == -3 and evaluate("-7 % 2", {}) == -1  # C truncates toward zero


@pytest.mark.parametrize("annotation, why", [
    ("P = H ** 2", "only + - * / %"),
    ("P = H + missing", "uses missing, which is neither a dimension nor an integer parameter"),
    ("P = H + slope", "uses slope"),  # a float parameter is not a size
    ("P = H + 0.5", "only integer constants"),
])
def test_a_shape_rule_that_is_not_integer_arithmetic_on_known_names_is_refused(annotation, why):
    with pytest.raises(PrototypeError, match=why.replace("*", r"\*").replace("+", r"\+")):
        parse(f"void f(const float* x /*[H]*/, float* y /*[{annotation}]*/, float slope, cudaStream_t s)")
